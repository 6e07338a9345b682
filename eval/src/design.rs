//! A quota design to try: the shares (`shares.toml`) and the fleet (`fleet.toml`), in the
//! formats docs/what-if.md documents.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use quotient_common::share::{BORROW_LIMIT_PERCENT_MAX, SHARE_LIMIT_GPUS_MAX};
use quotient_common::{
    GpuClass, GpuDevice, HostInfo, NodeInventory, ShareSpec, ShareState, Strategy,
    GPUS_PER_NODE_MAX,
};
use serde::{Deserialize, Serialize};

use crate::EvalError;

/// The largest `shares.toml` or `fleet.toml` read.
pub const DESIGN_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// The most nodes a fleet file makes.
pub const FLEET_NODES_MAX: u32 = 100_000;

/// `shares.toml`: one `[[share]]` table per share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharesFile {
    pub share: Vec<ShareEntry>,
}

/// One share, as `quotient share create` takes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareEntry {
    pub name: String,
    /// `reserve`, `lend` or `lend-and-borrow`.
    pub strategy: Strategy,
    /// GPUs of each class it is entitled to, e.g. `{ h100 = 64 }`.
    pub limits: BTreeMap<String, u32>,
    /// With `lend-and-borrow`: how much it may borrow, in percent of its own limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrow_limit_percent: Option<u32>,
    /// Whether its high-priority jobs preempt its own low-priority ones.
    #[serde(default)]
    pub in_share_preemption: bool,
}

/// `fleet.toml`: one `[[pool]]` table per kind of node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetFile {
    pub pool: Vec<PoolEntry>,
}

/// `nodes` alike nodes, each with `gpus_per_node` GPUs of one class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolEntry {
    pub class: String,
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// The nodes' names are this followed by a number; default: the class and a dash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// A checked design: share specs and node inventories the state machine takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Design {
    pub shares: Vec<ShareSpec>,
    pub nodes: Vec<NodeInventory>,
}

impl Design {
    /// GPUs in the fleet, all classes.
    pub fn gpus(&self) -> u64 {
        self.nodes.iter().map(|node| node.gpus.len() as u64).sum()
    }

    /// The trace's jobs that no placement could ever start on this fleet (a class it lacks,
    /// more GPUs than any node of the class has, or more such nodes than there are), and a
    /// sentence on the first of them. They wait to the end of a replay, counted as never
    /// started; `what-if` says so before it runs, so that a typo in a class or a size is not
    /// read as a verdict on the design.
    pub fn never_fit(&self, jobs: &[crate::Job]) -> (usize, Option<String>) {
        let mut count = 0;
        let mut first = None;
        for job in jobs {
            let class = job.class.clone().or_else(|| {
                let share = self.shares.iter().find(|share| share.name == job.share)?;
                (share.limits.len() == 1).then(|| share.limits.keys().next().cloned())?
            });
            let Some(class) = class else { continue };
            let sizes: Vec<usize> = self
                .nodes
                .iter()
                .map(|node| node.gpus.iter().filter(|gpu| gpu.class == class).count())
                .filter(|gpus| *gpus > 0)
                .collect();
            let fitting = sizes
                .iter()
                .filter(|gpus| **gpus >= job.gpus as usize)
                .count();
            if fitting >= job.nodes as usize {
                continue;
            }
            count += 1;
            first.get_or_insert_with(|| {
                let why = match sizes.iter().max() {
                    None => format!("the fleet has no {class} GPUs"),
                    Some(largest) if *largest < job.gpus as usize => {
                        format!("the largest {class} node has {largest} GPUs")
                    }
                    Some(_) => format!("{fitting} {class} nodes have that many"),
                };
                format!(
                    "line {}: {} GPUs on each of {} nodes, but {why}",
                    job.line, job.gpus, job.nodes
                )
            });
        }
        (count, first)
    }

    /// The same design with every share turned to `reserve`: static partitioning, where no
    /// share lends or borrows.
    pub fn partitioned(&self) -> Design {
        let mut design = self.clone();
        for share in &mut design.shares {
            share.strategy = Strategy::Reserve;
            share.borrow_limit_percent = None;
        }
        design
    }
}

impl SharesFile {
    pub fn parse(text: &str) -> Result<SharesFile, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a shares file renders as TOML")
    }

    /// The share specs, each checked as `share create` checks it.
    pub fn specs(&self) -> Result<Vec<ShareSpec>, String> {
        let mut names = BTreeSet::new();
        let mut specs = Vec::new();
        for entry in &self.share {
            if !names.insert(entry.name.as_str()) {
                return Err(format!("share {:?} is named twice", entry.name));
            }
            let mut limits = BTreeMap::new();
            for (class, gpus) in &entry.limits {
                let class =
                    GpuClass::parse(class).map_err(|e| format!("share {:?}: {e}", entry.name))?;
                if *gpus > SHARE_LIMIT_GPUS_MAX {
                    return Err(format!(
                        "share {:?}: the limit for {class} is {gpus} GPUs; give at most {SHARE_LIMIT_GPUS_MAX}",
                        entry.name
                    ));
                }
                limits.insert(class, *gpus);
            }
            if let Some(percent) = entry
                .borrow_limit_percent
                .filter(|percent| *percent > BORROW_LIMIT_PERCENT_MAX)
            {
                return Err(format!(
                    "share {:?}: borrow_limit_percent is {percent}; give at most {BORROW_LIMIT_PERCENT_MAX}",
                    entry.name
                ));
            }
            let spec = ShareSpec {
                name: entry.name.clone(),
                limits,
                strategy: entry.strategy,
                borrow_limit_percent: entry.borrow_limit_percent,
                in_share_preemption: entry.in_share_preemption,
                state: ShareState::Enabled,
                members: Vec::new(),
                max_jobs_per_user: None,
            };
            spec.validate()
                .map_err(|e| format!("share {:?}: {e}", entry.name))?;
            specs.push(spec);
        }
        if specs.is_empty() {
            return Err("no [[share]] is given; add one table per share".into());
        }
        Ok(specs)
    }
}

impl FleetFile {
    pub fn parse(text: &str) -> Result<FleetFile, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a fleet file renders as TOML")
    }

    /// The nodes, named `PREFIX1`, `PREFIX2`, ... per pool.
    pub fn nodes(&self) -> Result<Vec<NodeInventory>, String> {
        let total: u64 = self.pool.iter().map(|pool| u64::from(pool.nodes)).sum();
        if total == 0 {
            return Err("the fleet has no node; add a [[pool]] with nodes = N".into());
        }
        if total > u64::from(FLEET_NODES_MAX) {
            return Err(format!(
                "the fleet has {total} nodes, more than {FLEET_NODES_MAX}"
            ));
        }
        let mut names = BTreeSet::new();
        let mut nodes = Vec::new();
        for pool in &self.pool {
            let class = GpuClass::parse(&pool.class).map_err(|e| e.to_string())?;
            if pool.gpus_per_node == 0 || pool.gpus_per_node as usize > GPUS_PER_NODE_MAX {
                return Err(format!(
                    "pool {}: gpus_per_node is {}; give 1 to {GPUS_PER_NODE_MAX}",
                    pool.class, pool.gpus_per_node
                ));
            }
            let prefix = pool
                .prefix
                .clone()
                .unwrap_or_else(|| format!("{}-", class.as_str()));
            for n in 1..=pool.nodes {
                let name = format!("{prefix}{n}");
                if !names.insert(name.clone()) {
                    return Err(format!(
                        "two pools make a node named {name}; give them different prefixes"
                    ));
                }
                let node = NodeInventory {
                    gpus: (0..pool.gpus_per_node)
                        .map(|index| GpuDevice {
                            index,
                            uuid: format!("GPU-{name}-{index}"),
                            class: class.clone(),
                            healthy: true,
                            nvlink_peers: 0,
                        })
                        .collect(),
                    name,
                    host: HostInfo::process_only(),
                };
                node.validate().map_err(|e| e.to_string())?;
                nodes.push(node);
            }
        }
        Ok(nodes)
    }
}

/// Reads and checks a design from its two files.
pub fn read_design(shares: &Path, fleet: &Path) -> Result<Design, EvalError> {
    let bad = |path: &Path, message: String| EvalError::Design {
        path: path.display().to_string(),
        message,
    };
    let shares_text = crate::read_limited(shares, DESIGN_BYTES_MAX)?;
    let fleet_text = crate::read_limited(fleet, DESIGN_BYTES_MAX)?;
    let shares_file = SharesFile::parse(&shares_text).map_err(|m| bad(shares, m))?;
    let fleet_file = FleetFile::parse(&fleet_text).map_err(|m| bad(fleet, m))?;
    Ok(Design {
        shares: shares_file.specs().map_err(|m| bad(shares, m))?,
        nodes: fleet_file.nodes().map_err(|m| bad(fleet, m))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_design_reads_and_checks() {
        let shares = SharesFile::parse(
            "[[share]]\nname = \"vision\"\nstrategy = \"lend-and-borrow\"\nlimits = { h100 = 16 }\n\
             in_share_preemption = true\n\n[[share]]\nname = \"nlp\"\nstrategy = \"reserve\"\n\
             limits = { h100 = 8 }\n",
        )
        .unwrap();
        let specs = shares.specs().unwrap();
        assert_eq!(specs.len(), 2);
        assert!(specs[0].in_share_preemption);
        assert_eq!(specs[1].strategy, Strategy::Reserve);
        let fleet =
            FleetFile::parse("[[pool]]\nclass = \"h100\"\nnodes = 3\ngpus_per_node = 8\n").unwrap();
        let nodes = fleet.nodes().unwrap();
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[2].name, "h100-3");
        let design = Design {
            shares: specs,
            nodes,
        };
        assert_eq!(design.gpus(), 24);
        assert!(design
            .partitioned()
            .shares
            .iter()
            .all(|s| s.strategy == Strategy::Reserve));
    }

    #[test]
    fn bad_designs_say_what_to_fix() {
        let twice = SharesFile::parse(
            "[[share]]\nname = \"a\"\nstrategy = \"lend\"\nlimits = { h100 = 1 }\n\
             [[share]]\nname = \"a\"\nstrategy = \"lend\"\nlimits = { h100 = 1 }\n",
        )
        .unwrap();
        assert!(twice.specs().unwrap_err().contains("twice"));
        let zero = SharesFile::parse(
            "[[share]]\nname = \"a\"\nstrategy = \"lend\"\nlimits = { h100 = 0 }\n",
        )
        .unwrap();
        assert!(zero.specs().is_err());
        let huge = SharesFile::parse(
            "[[share]]\nname = \"a\"\nstrategy = \"lend-and-borrow\"\nlimits = { h100 = 1000001 }\n",
        )
        .unwrap();
        let said = huge.specs().unwrap_err();
        assert!(
            said.contains("1000001 GPUs; give at most 1000000"),
            "{said}"
        );
        let greedy = SharesFile::parse(
            "[[share]]\nname = \"a\"\nstrategy = \"lend-and-borrow\"\nlimits = { h100 = 8 }\nborrow_limit_percent = 10001\n",
        )
        .unwrap();
        let said = greedy.specs().unwrap_err();
        assert!(said.contains("borrow_limit_percent is 10001"), "{said}");
        assert!(SharesFile::parse(
            "[[share]]\nname = \"a\"\nstrategy = \"share-all\"\nlimits = {}\n"
        )
        .is_err());
        let big = FleetFile::parse("[[pool]]\nclass = \"h100\"\nnodes = 1\ngpus_per_node = 65\n")
            .unwrap();
        assert!(big.nodes().unwrap_err().contains("gpus_per_node"));
        let clash = FleetFile::parse(
            "[[pool]]\nclass = \"h100\"\nnodes = 1\ngpus_per_node = 8\n\
             [[pool]]\nclass = \"a10g\"\nnodes = 1\ngpus_per_node = 8\nprefix = \"h100-\"\n",
        )
        .unwrap();
        assert!(clash.nodes().unwrap_err().contains("prefixes"));
    }
}
