//! SageMaker instance types as Quotient sees them: a GPU class and GPUs per instance. Quota
//! shares' `capacityLimits` and a training job's `ResourceConfig` name instance types; the
//! cluster schedules GPUs. The defaults cover the common SageMaker GPU types; a coordinator's
//! `--aws-instance-type NAME=CLASS:GPUS` adds a type or changes one (docs/aws-batch.md).

use std::collections::BTreeMap;

use quotient_common::GpuClass;

/// One instance type: its GPUs' class and how many it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceType {
    pub class: GpuClass,
    pub gpus: u32,
}

/// Instance types by name (`ml.g5.xlarge`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceTypes(BTreeMap<String, InstanceType>);

/// Sizes of an instance family and their GPUs.
type Sizes = &'static [(&'static str, u32)];

/// The sizes of the g5, g6 and g6e families.
const G_SIZES: Sizes = &[
    ("xlarge", 1),
    ("2xlarge", 1),
    ("4xlarge", 1),
    ("8xlarge", 1),
    ("16xlarge", 1),
    ("12xlarge", 4),
    ("24xlarge", 4),
    ("48xlarge", 8),
];

/// (family, class, sizes) of SageMaker's GPU instance families.
const DEFAULTS: &[(&str, &str, Sizes)] = &[
    (
        "ml.g4dn",
        "t4",
        &[
            ("xlarge", 1),
            ("2xlarge", 1),
            ("4xlarge", 1),
            ("8xlarge", 1),
            ("16xlarge", 1),
            ("12xlarge", 4),
        ],
    ),
    ("ml.g5", "a10g", G_SIZES),
    ("ml.g6", "l4", G_SIZES),
    ("ml.g6e", "l40s", G_SIZES),
    (
        "ml.p3",
        "v100",
        &[("2xlarge", 1), ("8xlarge", 4), ("16xlarge", 8)],
    ),
    ("ml.p3dn", "v100", &[("24xlarge", 8)]),
    ("ml.p4d", "a100", &[("24xlarge", 8)]),
    ("ml.p4de", "a100-80gb", &[("24xlarge", 8)]),
    ("ml.p5", "h100", &[("48xlarge", 8)]),
    ("ml.p5e", "h200", &[("48xlarge", 8)]),
    ("ml.p5en", "h200", &[("48xlarge", 8)]),
    ("ml.p6-b200", "b200", &[("48xlarge", 8)]),
];

impl Default for InstanceTypes {
    fn default() -> Self {
        let mut types = BTreeMap::new();
        for (family, class, sizes) in DEFAULTS {
            let class = GpuClass::parse(class).expect("the default classes are valid");
            for (size, gpus) in *sizes {
                types.insert(
                    format!("{family}.{size}"),
                    InstanceType {
                        class: class.clone(),
                        gpus: *gpus,
                    },
                );
            }
        }
        InstanceTypes(types)
    }
}

impl InstanceTypes {
    /// The defaults with `overrides` (`NAME=CLASS:GPUS`) added or replacing them.
    pub fn with_overrides(overrides: &[String]) -> Result<InstanceTypes, String> {
        let mut types = InstanceTypes::default();
        for text in overrides {
            let (name, rest) = text.split_once('=').ok_or_else(|| {
                format!(
                    "instance type {text:?} must read NAME=CLASS:GPUS, e.g. ml.g5.xlarge=a10g:1"
                )
            })?;
            let (class, gpus) = rest.split_once(':').ok_or_else(|| {
                format!(
                    "instance type {text:?} must read NAME=CLASS:GPUS, e.g. ml.g5.xlarge=a10g:1"
                )
            })?;
            let class = GpuClass::parse(class).map_err(|error| error.to_string())?;
            let max = quotient_common::node::GPUS_PER_NODE_MAX;
            let gpus: u32 = gpus
                .parse::<u32>()
                .ok()
                .filter(|gpus| (1..=max).contains(&(*gpus as usize)))
                .ok_or_else(|| format!("instance type {text:?}: GPUS must be 1 to {max}"))?;
            if name.is_empty() || name.len() > 64 {
                return Err(format!(
                    "instance type name {name:?} must be 1 to 64 characters"
                ));
            }
            types
                .0
                .insert(name.to_string(), InstanceType { class, gpus });
        }
        Ok(types)
    }

    /// The type `name`, or an error that says what is known.
    pub fn get(&self, name: &str) -> Result<&InstanceType, String> {
        self.0.get(name).ok_or_else(|| {
            format!(
                "unknown instance type {name:?}: use one of the GPU types this cluster maps \
                 (ml.g5.xlarge, ml.p4d.24xlarge...), or have the coordinators map it with \
                 --aws-instance-type {name}=CLASS:GPUS"
            )
        })
    }

    /// The type with the fewest GPUs of `class` (the first by name among equals): the unit a
    /// limit in GPUs of that class is shown in when no other was given.
    pub fn smallest_of(&self, class: &GpuClass) -> Option<(&str, &InstanceType)> {
        self.0
            .iter()
            .filter(|(_, t)| &t.class == class)
            .min_by_key(|(name, t)| (t.gpus, name.len(), name.as_str()))
            .map(|(name, t)| (name.as_str(), t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let types = InstanceTypes::with_overrides(&[
            "ml.x.large=h100:2".into(),
            "ml.g5.xlarge=l4:1".into(),
        ])
        .unwrap();
        assert_eq!(types.get("ml.p4d.24xlarge").unwrap().gpus, 8);
        assert_eq!(types.get("ml.x.large").unwrap().gpus, 2);
        assert_eq!(types.get("ml.g5.xlarge").unwrap().class.as_str(), "l4");
        assert!(types
            .get("ml.m5.large")
            .unwrap_err()
            .contains("--aws-instance-type"));
        let a10g = GpuClass::parse("a10g").unwrap();
        assert_eq!(types.smallest_of(&a10g).unwrap().0, "ml.g5.2xlarge");
        assert!(InstanceTypes::with_overrides(&["bad".into()]).is_err());
        assert!(InstanceTypes::with_overrides(&["ml.y=a10g:0".into()]).is_err());
    }
}
