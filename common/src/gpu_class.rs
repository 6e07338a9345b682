//! GPU classes: the normalised model names that share limits and jobs are written in.
//!
//! NVML reports marketing names such as "NVIDIA H100 80GB HBM3"; shares are written against
//! short, stable classes such as `h100-80gb`. [`GpuClass::from_nvml_name`] is the one mapping.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::SpecError;

/// The longest GPU class name, in bytes.
pub const GPU_CLASS_BYTES_MAX: usize = 64;

/// A normalised GPU class, e.g. `a10g`, `h100-80gb`: lowercase `[a-z0-9-]`, 1-64 bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GpuClass(Box<str>);

impl GpuClass {
    /// Parses a class written by a user or a config file; it must already be normalised.
    pub fn parse(text: &str) -> Result<GpuClass, SpecError> {
        let ok = !text.is_empty()
            && text.len() <= GPU_CLASS_BYTES_MAX
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !text.starts_with('-')
            && !text.ends_with('-');
        if ok {
            Ok(GpuClass(text.into()))
        } else {
            Err(SpecError::GpuClass(text.chars().take(80).collect()))
        }
    }

    /// Maps an NVML model name to its class.
    ///
    /// The vendor prefix ("NVIDIA", "Tesla", "GeForce", "Quadro") is dropped, the model is
    /// lowercased, and a memory size that follows it is kept ("80GB" -> `80gb`) because
    /// the 40 GB and 80 GB parts of one model are different classes to a scheduler. Memory
    /// technology and form factor words ("HBM3", "PCIe", "SXM4") are dropped: they do not change
    /// what a job can run. Falls back to a cleaned form of the whole string, so an unknown
    /// model still gets a stable class.
    pub fn from_nvml_name(model: &str) -> GpuClass {
        const VENDOR_WORDS: [&str; 5] = ["nvidia", "tesla", "geforce", "quadro", "rtx"];
        const DROPPED_WORDS: [&str; 5] = ["hbm", "pcie", "sxm", "nvl", "mig"];
        let mut parts: Vec<String> = Vec::new();
        for word in model.split(|c: char| c.is_whitespace() || c == '_' || c == '/' || c == '-') {
            let word: String = word
                .chars()
                .filter(|c| c.is_ascii_alphanumeric())
                .collect::<String>()
                .to_ascii_lowercase();
            if word.is_empty() {
                continue;
            }
            let is_vendor = VENDOR_WORDS.contains(&word.as_str()) && parts.is_empty();
            let is_dropped = DROPPED_WORDS.iter().any(|d| word.starts_with(d));
            if is_vendor || is_dropped {
                continue;
            }
            // "RTX A6000" keeps "a6000"; "RTX 4090" keeps "4090" after the dropped vendor word,
            // so prefix it again to avoid a bare number.
            if parts.is_empty()
                && word.bytes().all(|b| b.is_ascii_digit())
                && model.to_ascii_lowercase().contains("rtx")
            {
                parts.push(format!("rtx{word}"));
                continue;
            }
            parts.push(word);
        }
        let mut class = parts.join("-");
        class.truncate(GPU_CLASS_BYTES_MAX);
        let class = class.trim_matches('-').to_string();
        if class.is_empty() {
            GpuClass("unknown".into())
        } else {
            GpuClass(class.into())
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for GpuClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for GpuClass {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GpuClass::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_names_map_to_classes() {
        let cases = [
            ("NVIDIA A10G", "a10g"),
            ("NVIDIA H100 80GB HBM3", "h100-80gb"),
            ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
            ("NVIDIA A100 80GB PCIe", "a100-80gb"),
            ("Tesla T4", "t4"),
            ("Tesla V100-SXM2-16GB", "v100-16gb"),
            ("NVIDIA L4", "l4"),
            ("NVIDIA GeForce RTX 4090", "rtx4090"),
            ("NVIDIA RTX A6000", "a6000"),
            ("NVIDIA H200", "h200"),
            ("NVIDIA H100 NVL", "h100"),
            ("", "unknown"),
        ];
        for (model, class) in cases {
            assert_eq!(
                GpuClass::from_nvml_name(model).as_str(),
                class,
                "model {model:?}"
            );
            assert!(GpuClass::parse(class).is_ok(), "{class} must parse");
        }
    }

    #[test]
    fn user_classes_must_be_normalised() {
        assert!(GpuClass::parse("a10g").is_ok());
        assert!(GpuClass::parse("h100-80gb").is_ok());
        assert!(GpuClass::parse("A10G").is_err());
        assert!(GpuClass::parse("").is_err());
        assert!(GpuClass::parse("-x").is_err());
        assert!(GpuClass::parse(&"a".repeat(65)).is_err());
    }
}
