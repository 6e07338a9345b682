//! The client config of docs/cli.md: which coordinators to call and which certificate to
//! present, read from a small TOML file.
//!
//! The file is found by `--config FILE`, else `$QUOTIENT_CONFIG`, else
//! `~/.config/quotient/config.toml` ([`locate`] is pure, so the order is unit-tested). Relative
//! certificate paths are read relative to the config file's folder, so a cluster directory can
//! be moved as a whole. The read is size-limited: a config is a few hundred bytes, and a
//! mistyped path to a large file should fail at once rather than fill memory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use quotient_common::bounded_read::read_text_at_most;
use quotient_common::tls::TlsFiles;
use quotient_common::ClusterId;
use serde::{Deserialize, Serialize};

/// The environment variable naming the config file when `--config` is not given.
pub const CONFIG_ENV: &str = "QUOTIENT_CONFIG";
/// Where the config is looked for last, relative to `$HOME`.
pub const CONFIG_HOME_RELATIVE: &str = ".config/quotient/config.toml";
/// The largest config file read; a real one is well under a kilobyte.
pub const CONFIG_BYTES_MAX: u64 = 64 * 1024;
/// Most coordinator addresses one config may list (a cluster has 3 or 5; learners join later).
pub const COORDINATORS_MAX: usize = 16;

/// The client config file (docs/cli.md, "Connecting").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    /// `HOST:PORT` of any subset of the coordinators; the client finds the leader itself.
    pub coordinators: Vec<String>,
    /// The cluster CA certificate.
    pub ca: PathBuf,
    /// The client's certificate.
    pub cert: PathBuf,
    /// The client's private key.
    pub key: PathBuf,
    /// The cluster the coordinators must belong to (32 hexadecimal digits, from
    /// `quotient cluster init` or `quotient cluster status`). Optional; when set, a
    /// coordinator of another cluster refuses every request instead of serving it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<ClusterId>,
}

impl ClientConfig {
    /// The TLS files the config names.
    pub fn tls_files(&self) -> TlsFiles {
        TlsFiles {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }

    /// Parses a config's text; `base` is the folder that relative paths are relative to.
    pub fn parse(text: &str, base: &Path) -> anyhow::Result<ClientConfig> {
        let mut config: ClientConfig = toml::from_str(text)?;
        if config.coordinators.is_empty() {
            bail!("`coordinators` is empty: list at least one coordinator as \"HOST:PORT\"");
        }
        if config.coordinators.len() > COORDINATORS_MAX {
            bail!(
                "`coordinators` lists {} addresses; at most {COORDINATORS_MAX} are allowed",
                config.coordinators.len()
            );
        }
        for path in [&mut config.ca, &mut config.cert, &mut config.key] {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        }
        Ok(config)
    }

    /// Renders the config as TOML (what `quotient dev up` writes).
    pub fn to_toml(&self) -> anyhow::Result<String> {
        toml::to_string(self).context("cannot render the client config as TOML")
    }
}

/// Where a config file was found, and by which rule (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigLocation {
    pub path: PathBuf,
    /// `--config`, `$QUOTIENT_CONFIG` or the default path.
    pub source: &'static str,
}

/// Picks the config path: `--config`, else `$QUOTIENT_CONFIG` (if set and not empty), else
/// `$HOME/.config/quotient/config.toml`. Pure: the caller passes the environment in.
pub fn locate(
    flag: Option<&Path>,
    env_value: Option<OsString>,
    home: Option<PathBuf>,
) -> anyhow::Result<ConfigLocation> {
    if let Some(path) = flag {
        return Ok(ConfigLocation {
            path: path.to_path_buf(),
            source: "--config",
        });
    }
    if let Some(value) = env_value.filter(|value| !value.is_empty()) {
        return Ok(ConfigLocation {
            path: PathBuf::from(value),
            source: "$QUOTIENT_CONFIG",
        });
    }
    match home.filter(|home| !home.as_os_str().is_empty()) {
        Some(home) => Ok(ConfigLocation {
            path: home.join(CONFIG_HOME_RELATIVE),
            source: "the default path",
        }),
        None => bail!(
            "no client config: --config is not given, $QUOTIENT_CONFIG is not set and $HOME is \
             not set; {}",
            MAKE_ONE_HINT
        ),
    }
}

/// What to do when there is no config.
const MAKE_ONE_HINT: &str =
    "pass --config FILE, or set QUOTIENT_CONFIG; `quotient dev up --dir DIR` \
     starts a local cluster and writes DIR/client.toml, and docs/cli.md shows the format \
     (coordinators, ca, cert, key)";

/// Finds and reads the config from the process's flag and environment.
pub fn load(flag: Option<&Path>) -> anyhow::Result<ClientConfig> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let location = locate(flag, std::env::var_os(CONFIG_ENV), home)?;
    load_from(&location)
}

/// Reads and parses the config at `location`, with errors that name the file, the rule that
/// chose it and how to make one.
pub fn load_from(location: &ConfigLocation) -> anyhow::Result<ClientConfig> {
    let path = &location.path;
    let file = match quotient_common::bounded_read::open_regular(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => bail!(
            "no client config at {} (from {}); {MAKE_ONE_HINT}",
            path.display(),
            location.source
        ),
        Err(error) => {
            return Err(error).with_context(|| {
                format!(
                    "cannot open the client config {} (from {})",
                    path.display(),
                    location.source
                )
            })
        }
    };
    let Some(text) = read_text_at_most(file, CONFIG_BYTES_MAX)
        .with_context(|| format!("cannot read the client config {}", path.display()))?
    else {
        bail!(
            "the client config {} is larger than {CONFIG_BYTES_MAX} bytes; is it the right file?",
            path.display()
        );
    };
    let base = path.parent().unwrap_or(Path::new("."));
    ClientConfig::parse(&text, base).with_context(|| {
        format!(
            "invalid client config {} (from {}); it needs coordinators, ca, cert and key as in \
             docs/cli.md",
            path.display(),
            location.source
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_over_the_environment_and_home() {
        // Proves the lookup order: --config, then $QUOTIENT_CONFIG, then ~/.config/quotient.
        let found = locate(
            Some(Path::new("/flag.toml")),
            Some("/env.toml".into()),
            Some("/home/a".into()),
        )
        .unwrap();
        assert_eq!(found.path, PathBuf::from("/flag.toml"));
        let found = locate(None, Some("/env.toml".into()), Some("/home/a".into())).unwrap();
        assert_eq!(found.path, PathBuf::from("/env.toml"));
        let found = locate(None, Some("".into()), Some("/home/a".into())).unwrap();
        assert_eq!(
            found.path,
            PathBuf::from("/home/a/.config/quotient/config.toml")
        );
        let error = locate(None, None, None).unwrap_err().to_string();
        assert!(error.contains("quotient dev up"), "{error}");
    }

    #[test]
    fn relative_paths_are_relative_to_the_config_file() {
        // Proves a moved cluster directory still finds its certificates.
        let text = r#"
            coordinators = ["127.0.0.1:7401"]
            ca = "certs/ca.pem"
            cert = "/abs/admin.pem"
            key = "certs/admin-key.pem"
        "#;
        let config = ClientConfig::parse(text, Path::new("/cluster")).unwrap();
        assert_eq!(config.ca, PathBuf::from("/cluster/certs/ca.pem"));
        assert_eq!(config.cert, PathBuf::from("/abs/admin.pem"));
        assert_eq!(config.key, PathBuf::from("/cluster/certs/admin-key.pem"));
        let again = ClientConfig::parse(&config.to_toml().unwrap(), Path::new("/x")).unwrap();
        assert_eq!(again, config);
    }

    #[test]
    fn a_config_without_coordinators_or_with_typos_is_refused() {
        // Proves an empty list and an unknown key are errors, not silent defaults.
        let empty = "coordinators = []\nca = \"a\"\ncert = \"b\"\nkey = \"c\"\n";
        assert!(ClientConfig::parse(empty, Path::new("/")).is_err());
        let typo = "coordinator = [\"x:1\"]\nca = \"a\"\ncert = \"b\"\nkey = \"c\"\n";
        assert!(ClientConfig::parse(typo, Path::new("/")).is_err());
    }

    #[test]
    fn a_missing_or_oversized_file_names_itself_and_the_fix() {
        // Proves the error says where it looked and how to make a config.
        let dir = tempfile::tempdir().unwrap();
        let location = ConfigLocation {
            path: dir.path().join("none.toml"),
            source: "$QUOTIENT_CONFIG",
        };
        let error = format!("{:#}", load_from(&location).unwrap_err());
        assert!(error.contains("none.toml"), "{error}");
        assert!(error.contains("$QUOTIENT_CONFIG"), "{error}");
        assert!(error.contains("quotient dev up"), "{error}");

        let big = dir.path().join("big.toml");
        std::fs::write(&big, vec![b'#'; CONFIG_BYTES_MAX as usize + 10]).unwrap();
        let location = ConfigLocation {
            path: big,
            source: "--config",
        };
        let error = format!("{:#}", load_from(&location).unwrap_err());
        assert!(error.contains("larger than"), "{error}");
    }
}
