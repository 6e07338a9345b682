//! Files people and programs write: the client config, the coordinator's config and the
//! agent's journal (its text as `Journal::open` reads it). The first byte picks which.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    match kind % 3 {
        0 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                let _ = quotient_cli::client_config::ClientConfig::parse(
                    text,
                    std::path::Path::new("/etc/quotient"),
                );
            }
        }
        1 => {
            if let Ok(text) = std::str::from_utf8(rest) {
                if let Ok(config) =
                    toml::from_str::<quotient_coordinator::config::CoordinatorConfig>(text)
                {
                    let _ = config.validate();
                }
            }
        }
        _ => {
            if let Ok(text) = std::str::from_utf8(rest) {
                let _ = quotient_agent::journal::Journal::from_text(
                    text,
                    "node-1",
                    std::path::PathBuf::from("/var/lib/quotient-agent/journal"),
                );
            }
        }
    }
});
