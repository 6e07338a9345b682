//! Which cluster this agent belongs to: learnt from its first registration (or given with
//! `--cluster-id`), kept in `STATE_DIR/cluster-id`, and sent with every registration after,
//! so that a coordinator of another cluster refuses the agent instead of taking its node and
//! jobs (the coordinators check it; the agent checks the cluster named in `Registered`).
//!
//! Moving a host to another cluster on purpose: stop the agent, remove `cluster-id` from its
//! state directory (or start it with the new `--cluster-id`), start it again.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use quotient_common::bounded_read::read_text_at_most;
use quotient_common::ClusterId;

/// The file's name in the state directory.
pub const CLUSTER_FILE_NAME: &str = "cluster-id";
/// The largest `cluster-id` file read (it holds one id and a newline).
pub const CLUSTER_FILE_BYTES_MAX: u64 = 256;

/// Why the agent's cluster cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClusterFileError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} does not hold a cluster id ({reason}); remove it to let the agent learn its cluster at the next registration", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("{} names cluster {recorded}, but --cluster-id names {configured}: remove the file if this host moved to another cluster, or correct --cluster-id", path.display())]
    Conflict {
        path: PathBuf,
        recorded: ClusterId,
        configured: ClusterId,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The agent's cluster, as its state directory records it.
#[derive(Debug)]
pub struct AgentCluster {
    path: PathBuf,
    cluster: Mutex<Option<ClusterId>>,
}

impl AgentCluster {
    /// Reads `state_dir/cluster-id`; with `configured` (`--cluster-id`) the two must agree, and
    /// the configured one is recorded when there is no file yet.
    pub fn open(
        state_dir: &Path,
        configured: Option<ClusterId>,
    ) -> Result<AgentCluster, ClusterFileError> {
        let path = state_dir.join(CLUSTER_FILE_NAME);
        let recorded = read(&path)?;
        let agent = AgentCluster {
            path: path.clone(),
            cluster: Mutex::new(recorded),
        };
        match (recorded, configured) {
            (Some(recorded), Some(configured)) if recorded != configured => {
                return Err(ClusterFileError::Conflict {
                    path,
                    recorded,
                    configured,
                })
            }
            (None, Some(configured)) => agent.learn(configured)?,
            _ => {}
        }
        Ok(agent)
    }

    /// The cluster this agent belongs to, once known.
    pub fn get(&self) -> Option<ClusterId> {
        *self.cluster.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `cluster` as this agent's (a leader's `Registered` named it): recorded when none
    /// was, an error naming both when it differs from the one recorded.
    pub fn learn(&self, cluster: ClusterId) -> Result<(), ClusterFileError> {
        let mut current = self.cluster.lock().unwrap_or_else(PoisonError::into_inner);
        match *current {
            Some(recorded) if recorded == cluster => Ok(()),
            Some(recorded) => Err(ClusterFileError::Conflict {
                path: self.path.clone(),
                recorded,
                configured: cluster,
            }),
            None => {
                write(&self.path, cluster)?;
                tracing::info!(%cluster, "registered with the cluster; its id is kept in the state directory");
                *current = Some(cluster);
                Ok(())
            }
        }
    }
}

fn read(path: &Path) -> Result<Option<ClusterId>, ClusterFileError> {
    let file = match quotient_common::bounded_read::open_regular(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ClusterFileError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let text = read_text_at_most(file, CLUSTER_FILE_BYTES_MAX)
        .map_err(|source| ClusterFileError::Read {
            path: path.to_path_buf(),
            source,
        })?
        .ok_or_else(|| ClusterFileError::Invalid {
            path: path.to_path_buf(),
            reason: format!("over {CLUSTER_FILE_BYTES_MAX} bytes"),
        })?;
    text.parse()
        .map(Some)
        .map_err(
            |error: quotient_common::cluster_id::ClusterIdError| ClusterFileError::Invalid {
                path: path.to_path_buf(),
                reason: error.to_string(),
            },
        )
}

/// Writes the file atomically (temporary file, synced, renamed).
fn write(path: &Path, cluster: ClusterId) -> Result<(), ClusterFileError> {
    let tmp = path.with_extension("tmp");
    let attempt = || -> std::io::Result<()> {
        let mut file = File::create(&tmp)?;
        file.write_all(format!("{cluster}\n").as_bytes())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)
    };
    attempt().map_err(|source| ClusterFileError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(byte: u8) -> ClusterId {
        ClusterId::from_bytes([byte; 16])
    }

    #[test]
    fn the_first_cluster_is_kept_and_another_refused() {
        // Proves the cluster learnt at the first registration survives a restart and that a
        // different one, learnt or configured, is refused naming both.
        let dir = tempfile::tempdir().expect("a directory");
        let agent = AgentCluster::open(dir.path(), None).expect("opens");
        assert_eq!(agent.get(), None);
        agent.learn(id(1)).expect("learns");
        let error = agent.learn(id(2)).expect_err("another cluster");
        let text = error.to_string();
        assert!(text.contains(&id(1).to_string()) && text.contains(&id(2).to_string()));
        let reopened = AgentCluster::open(dir.path(), None).expect("reopens");
        assert_eq!(reopened.get(), Some(id(1)));
        assert!(AgentCluster::open(dir.path(), Some(id(2))).is_err());
        std::fs::write(dir.path().join(CLUSTER_FILE_NAME), "garbage").expect("write");
        let error = AgentCluster::open(dir.path(), None).expect_err("garbage");
        assert!(error.to_string().contains("remove it"), "{error}");
    }

    #[test]
    fn a_configured_cluster_is_recorded() {
        // Proves --cluster-id on a fresh state directory is recorded as the agent's cluster.
        let dir = tempfile::tempdir().expect("a directory");
        let agent = AgentCluster::open(dir.path(), Some(id(7))).expect("opens");
        assert_eq!(agent.get(), Some(id(7)));
        assert_eq!(
            AgentCluster::open(dir.path(), None).expect("reopens").get(),
            Some(id(7))
        );
    }
}
