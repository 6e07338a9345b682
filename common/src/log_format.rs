//! How coordinators and agents write their logs (`--log-format text|json`).

use std::fmt;
use std::str::FromStr;

/// Text for people, or one JSON object per line for log collectors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    /// `--log-format`, else `--log-json` (kept for older units and scripts).
    pub fn chosen(format: Option<LogFormat>, json: bool) -> LogFormat {
        format.unwrap_or(if json {
            LogFormat::Json
        } else {
            LogFormat::Text
        })
    }
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(text: &str) -> Result<LogFormat, String> {
        match text {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("unknown log format {other:?}: write text or json")),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_flag_wins_over_the_json_switch() {
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert!("yaml"
            .parse::<LogFormat>()
            .unwrap_err()
            .contains("text or json"));
        assert_eq!(LogFormat::chosen(None, true), LogFormat::Json);
        assert_eq!(
            LogFormat::chosen(Some(LogFormat::Text), true),
            LogFormat::Text
        );
        assert_eq!(LogFormat::chosen(None, false), LogFormat::Text);
    }
}
