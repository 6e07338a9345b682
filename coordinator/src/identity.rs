//! Which cluster this coordinator belongs to, kept in its data directory, and what it has
//! refused for belonging to none or to another.
//!
//! A data directory is *joined* once `cluster-identity.toml` in it names a cluster id and this
//! coordinator's id. That happens exactly twice in a data directory's life, never because it is
//! empty: when `quotient cluster init` bootstraps a new cluster on this coordinator
//! (`cluster_init`), or when a leader first replicates to it as a *learner*
//! (`raft_service::admit`), which is how `cluster add-member` and `cluster init` bring in the
//! other members. An empty data directory therefore never votes: a voter that lost its data
//! (a wiped or replaced disk) could otherwise vote twice in one term, or help elect a leader
//! that lacks entries it had acknowledged, and Raft's safety survives neither. It has to be
//! removed from the cluster and added back, as a learner that copies the log first.
//!
//! Opening refuses a data directory of another member or another cluster than configured,
//! and one that holds Raft state but no identity (written before identities existed, or whose
//! file was removed), each with what to do.
//!
//! The health report ([`ClusterIdentity::problems`]) includes, for a while after the last
//! occurrence, every refusal this coordinator made or met, and for good a divergence of its
//! state from the leader's (`digest_check`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use quotient_common::bounded_read::read_text_at_most;
use quotient_common::ClusterId;
use serde::{Deserialize, Serialize};

use crate::store::MemberId;

/// The identity file's name in the data directory.
pub const IDENTITY_FILE_NAME: &str = "cluster-identity.toml";
/// The largest identity file read; it holds two short lines.
pub const IDENTITY_FILE_BYTES_MAX: u64 = 4_096;
/// How long a refusal keeps counting as a health problem after it was last seen
/// (milliseconds): long enough for `quotient cluster health` to see one that repeats with
/// every heartbeat or election, short enough to clear soon after the operator fixed it.
pub const REFUSAL_HEALTH_WINDOW_MS: u64 = 10_000;
/// At most one log line per kind of refusal this often (milliseconds); a refused leader
/// retries with every heartbeat.
pub const REFUSAL_LOG_INTERVAL_MS: u64 = 10_000;

/// Why the data directory's identity cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is over {IDENTITY_FILE_BYTES_MAX} bytes: it is not a cluster identity file", path.display())]
    TooLarge { path: PathBuf },
    #[error("{} is not a valid cluster identity file ({reason}): restore it from a member of the same cluster, or move the data directory away and add this coordinator back as a new member", path.display())]
    Parse { path: PathBuf, reason: String },
    #[error("the data directory {} belongs to coordinator {file_member} of cluster {cluster}, but this coordinator is configured as {configured}: point --data-dir at its own directory", dir.display())]
    OtherMember {
        dir: PathBuf,
        cluster: ClusterId,
        file_member: MemberId,
        configured: MemberId,
    },
    #[error("the data directory {} belongs to cluster {in_directory}, but --cluster-id names cluster {configured}: point --data-dir at this cluster's directory, or correct --cluster-id", dir.display())]
    OtherCluster {
        dir: PathBuf,
        in_directory: ClusterId,
        configured: ClusterId,
    },
    #[error("the data directory {} holds Raft state but no {IDENTITY_FILE_NAME}: it was written before clusters had ids, or the file was removed. Start this coordinator once with --cluster-id ID: the id the other members report (`quotient cluster status`), or, when every member predates cluster ids, one new id for all of them (32 hexadecimal digits, e.g. from `openssl rand -hex 16`)", dir.display())]
    Unidentified { dir: PathBuf },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("coordinator {member} already belongs to cluster {current}; it cannot join cluster {offered}")]
    AlreadyJoined {
        member: MemberId,
        current: ClusterId,
        offered: ClusterId,
    },
}

/// The file's contents.
#[derive(Debug, Serialize, Deserialize)]
struct IdentityFile {
    cluster_id: String,
    member_id: MemberId,
}

/// A refusal, as the health report and the log rate limit see it.
#[derive(Debug)]
struct Refusal {
    text: String,
    seen: Instant,
    logged: Option<Instant>,
}

#[derive(Debug, Default)]
struct Inner {
    cluster: Option<ClusterId>,
    /// The latest refusal of each kind.
    refusals: BTreeMap<&'static str, Refusal>,
    /// Set for good once this coordinator's state was found to differ from the leader's.
    diverged: Option<String>,
}

/// This coordinator's cluster membership as its data directory records it; cheap to clone.
#[derive(Debug, Clone)]
pub struct ClusterIdentity {
    member: MemberId,
    dir: PathBuf,
    /// `--cluster-id`: the only cluster this coordinator may join.
    configured: Option<ClusterId>,
    inner: Arc<Mutex<Inner>>,
}

impl ClusterIdentity {
    /// Reads the identity of the data directory `dir` for coordinator `member`.
    /// `raft_state_present`: whether the directory holds a vote, log entries or a snapshot.
    /// `configured` is `--cluster-id`. Blocks on file I/O: call it at startup.
    pub fn open(
        dir: &Path,
        member: MemberId,
        raft_state_present: bool,
        configured: Option<ClusterId>,
    ) -> Result<ClusterIdentity, IdentityError> {
        let identity = ClusterIdentity {
            member,
            dir: dir.to_path_buf(),
            configured,
            inner: Arc::new(Mutex::new(Inner::default())),
        };
        match read_identity_file(&identity.path())? {
            Some(file) => {
                let cluster =
                    file.cluster_id
                        .parse::<ClusterId>()
                        .map_err(|error| IdentityError::Parse {
                            path: identity.path(),
                            reason: error.to_string(),
                        })?;
                if file.member_id != member {
                    return Err(IdentityError::OtherMember {
                        dir: dir.to_path_buf(),
                        cluster,
                        file_member: file.member_id,
                        configured: member,
                    });
                }
                if let Some(configured) = configured.filter(|configured| *configured != cluster) {
                    return Err(IdentityError::OtherCluster {
                        dir: dir.to_path_buf(),
                        in_directory: cluster,
                        configured,
                    });
                }
                identity.lock().cluster = Some(cluster);
            }
            None if raft_state_present => match configured {
                Some(cluster) => {
                    tracing::warn!(%cluster, dir = %dir.display(), "a data directory without a cluster identity: recording the one --cluster-id names");
                    identity.write(cluster)?;
                    identity.lock().cluster = Some(cluster);
                }
                None => {
                    return Err(IdentityError::Unidentified {
                        dir: dir.to_path_buf(),
                    })
                }
            },
            None => {}
        }
        Ok(identity)
    }

    fn path(&self) -> PathBuf {
        self.dir.join(IDENTITY_FILE_NAME)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Plain data, left consistent by every critical section.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This coordinator's id.
    pub fn member(&self) -> MemberId {
        self.member
    }

    /// The cluster this coordinator belongs to; `None` while its data directory is empty.
    pub fn cluster(&self) -> Option<ClusterId> {
        self.lock().cluster
    }

    /// `--cluster-id`, the only cluster this coordinator may join.
    pub fn configured(&self) -> Option<ClusterId> {
        self.configured
    }

    /// Joins `cluster`: writes the identity file (synced) unless it already names it.
    /// Refuses another cluster than the one already joined. Blocks on file I/O.
    pub fn join(&self, cluster: ClusterId) -> Result<(), IdentityError> {
        let mut inner = self.lock();
        match inner.cluster {
            Some(current) if current == cluster => Ok(()),
            Some(current) => Err(IdentityError::AlreadyJoined {
                member: self.member,
                current,
                offered: cluster,
            }),
            None => {
                self.write(cluster)?;
                inner.cluster = Some(cluster);
                // What it refused for having joined no cluster no longer holds.
                inner.refusals.clear();
                tracing::info!(%cluster, member = self.member, "joined the cluster; its id is kept in the data directory");
                Ok(())
            }
        }
    }

    /// Writes the identity file atomically: a temporary file, synced, renamed, the directory
    /// synced.
    fn write(&self, cluster: ClusterId) -> Result<(), IdentityError> {
        let path = self.path();
        let text = toml::to_string(&IdentityFile {
            cluster_id: cluster.to_string(),
            member_id: self.member,
        })
        .expect("two plain fields always serialise");
        let text = format!(
            "# This coordinator's cluster. Written once; never edit or copy it to another member.\n{text}"
        );
        let tmp = self.dir.join(format!("{IDENTITY_FILE_NAME}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut file = File::create(&tmp)?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            drop(file);
            std::fs::rename(&tmp, &path)?;
            crate::store::state_machine::sync_dir(&self.dir)
        };
        write().map_err(|source| IdentityError::Write { path, source })
    }

    /// Records a refusal of kind `kind` (one of a few fixed names) for the health report,
    /// and logs it at error level unless one of that kind was logged less than
    /// [`REFUSAL_LOG_INTERVAL_MS`] ago.
    pub fn refused(&self, kind: &'static str, text: String) {
        let now = Instant::now();
        let mut inner = self.lock();
        let previous = inner.refusals.get(kind).and_then(|refusal| refusal.logged);
        let log = previous.is_none_or(|at| {
            now.duration_since(at) >= Duration::from_millis(REFUSAL_LOG_INTERVAL_MS)
        });
        if log {
            tracing::error!(member = self.member, "{text}");
        }
        inner.refusals.insert(
            kind,
            Refusal {
                text,
                seen: now,
                logged: if log { Some(now) } else { previous },
            },
        );
    }

    /// Whether a refusal of kind `kind` was recorded within the health window
    /// ([`REFUSAL_HEALTH_WINDOW_MS`]).
    pub fn refused_recently(&self, kind: &str) -> bool {
        let window = Duration::from_millis(REFUSAL_HEALTH_WINDOW_MS);
        self.lock()
            .refusals
            .get(kind)
            .is_some_and(|refusal| refusal.seen.elapsed() < window)
    }

    /// Marks this coordinator's state as diverged from the leader's, for good.
    pub fn diverged(&self, text: String) {
        tracing::error!(member = self.member, "{text}");
        self.lock().diverged = Some(text);
    }

    /// What keeps this coordinator from being healthy, each saying what to do; empty when
    /// nothing does.
    pub fn problems(&self) -> Vec<String> {
        let inner = self.lock();
        let mut problems = Vec::new();
        if inner.cluster.is_none() {
            problems.push(format!(
                "coordinator {} has joined no cluster: its data directory holds no Raft state. Bootstrap a new cluster with `quotient cluster init`, or add it to a running one with `quotient cluster add-member --id {} --address ADDR`",
                self.member, self.member
            ));
        }
        let window = Duration::from_millis(REFUSAL_HEALTH_WINDOW_MS);
        problems.extend(
            inner
                .refusals
                .values()
                .filter(|refusal| refusal.seen.elapsed() < window)
                .map(|refusal| refusal.text.clone()),
        );
        problems.extend(inner.diverged.clone());
        problems
    }
}

/// The identity file's contents, or `None` when there is none.
fn read_identity_file(path: &Path) -> Result<Option<IdentityFile>, IdentityError> {
    let file = match quotient_common::bounded_read::open_regular(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(IdentityError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let text = read_text_at_most(file, IDENTITY_FILE_BYTES_MAX)
        .map_err(|source| IdentityError::Read {
            path: path.to_path_buf(),
            source,
        })?
        .ok_or_else(|| IdentityError::TooLarge {
            path: path.to_path_buf(),
        })?;
    toml::from_str(&text)
        .map(Some)
        .map_err(|error| IdentityError::Parse {
            path: path.to_path_buf(),
            reason: error.message().to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(byte: u8) -> ClusterId {
        ClusterId::from_bytes([byte; 16])
    }

    #[test]
    fn an_empty_directory_joins_once_and_keeps_its_cluster() {
        // Proves the join is written, read back on reopen, and that another cluster or member
        // is refused naming both.
        let dir = tempfile::tempdir().expect("a directory");
        let identity = ClusterIdentity::open(dir.path(), 2, false, None).expect("opens empty");
        assert_eq!(identity.cluster(), None);
        assert_eq!(identity.problems().len(), 1, "{:?}", identity.problems());
        identity.join(id(1)).expect("joins");
        identity
            .join(id(1))
            .expect("joining the same cluster again is a no-op");
        let error = identity.join(id(2)).expect_err("another cluster");
        assert!(error.to_string().contains(&id(2).to_string()), "{error}");

        let reopened = ClusterIdentity::open(dir.path(), 2, true, None).expect("reopens");
        assert_eq!(reopened.cluster(), Some(id(1)));
        assert!(reopened.problems().is_empty());

        let error = ClusterIdentity::open(dir.path(), 3, true, None).expect_err("another member");
        let text = error.to_string();
        assert!(
            text.contains("coordinator 2") && text.contains("as 3"),
            "{text}"
        );
        let error =
            ClusterIdentity::open(dir.path(), 2, true, Some(id(9))).expect_err("another cluster");
        let text = error.to_string();
        assert!(
            text.contains(&id(1).to_string()) && text.contains(&id(9).to_string()),
            "{text}"
        );
    }

    #[test]
    fn raft_state_without_an_identity_needs_the_cluster_id_given() {
        // Proves an unidentified data directory is refused with what to do, and adopted once
        // --cluster-id names its cluster.
        let dir = tempfile::tempdir().expect("a directory");
        let error = ClusterIdentity::open(dir.path(), 1, true, None).expect_err("unidentified");
        assert!(error.to_string().contains("--cluster-id"), "{error}");
        let identity =
            ClusterIdentity::open(dir.path(), 1, true, Some(id(4))).expect("adopts the id");
        assert_eq!(identity.cluster(), Some(id(4)));
        let reopened = ClusterIdentity::open(dir.path(), 1, true, None).expect("kept");
        assert_eq!(reopened.cluster(), Some(id(4)));
    }

    #[test]
    fn a_damaged_or_huge_identity_file_is_refused() {
        // Proves the size limit is checked before parsing, and a garbled file is refused.
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join(IDENTITY_FILE_NAME);
        std::fs::write(&path, "cluster_id = \"nothex\"\nmember_id = 1\n").expect("write");
        let error = ClusterIdentity::open(dir.path(), 1, true, None).expect_err("garbled");
        assert!(matches!(error, IdentityError::Parse { .. }), "{error}");
        std::fs::write(&path, vec![b'#'; IDENTITY_FILE_BYTES_MAX as usize + 1]).expect("write");
        let error = ClusterIdentity::open(dir.path(), 1, true, None).expect_err("huge");
        assert!(matches!(error, IdentityError::TooLarge { .. }), "{error}");
    }

    #[test]
    fn refusals_are_health_problems_for_a_while() {
        // Proves a refusal shows in the health report, and a divergence stays.
        let dir = tempfile::tempdir().expect("a directory");
        let identity = ClusterIdentity::open(dir.path(), 1, false, None).expect("opens");
        identity.join(id(1)).expect("joins");
        identity.refused("other-cluster", "refused cluster X".into());
        identity.refused("other-cluster", "refused cluster X again".into());
        assert_eq!(
            identity.problems(),
            vec!["refused cluster X again".to_string()]
        );
        identity.diverged("diverged".into());
        assert_eq!(identity.problems().len(), 2);
        // What keeps a member from campaigning (a Raft request it cannot read) is asked by
        // kind.
        assert!(identity.refused_recently("other-cluster"));
        assert!(!identity.refused_recently(crate::raft_service::UNREADABLE_RAFT_REQUEST));
    }
}
