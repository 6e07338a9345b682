//! The agents' open connections, by node name, so that the leader can ask an agent something
//! only its host knows (an attempt's log) on the connection the agent made: QUIC lets the
//! server open streams too, so no connection goes the other way and no agent listens.
//!
//! [`crate::agent_service::AgentService::serve_connection`] records each agent connection
//! once its certificate is checked and forgets it when it ends; a newer connection of the
//! same node replaces an older one. Only the leader asks ([`AgentLinks::ask`]); the agent answers only on
//! the connection it made to the coordinator it registered with.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use quotient_common::agent_api::{LeaderRequest, LeaderResponse, LEADER_REQUEST_TIMEOUT_MS};
use quotient_common::transport::{PeerConnection, RequestError};

/// Why the leader could not get an answer from an agent.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("the agent of node {node:?} is not connected to the leader; is it running? (`quotient node list`)")]
    NotConnected { node: String },
    #[error("the agent of node {node:?} did not answer ({source}); is it running? (`quotient node list`)")]
    Request {
        node: String,
        #[source]
        source: RequestError,
    },
    /// The agent refused the request: it serves a few at once (`REQUESTS_IN_FLIGHT_MAX`), and
    /// this one came while as many were under way.
    #[error(
        "the agent of node {node:?} is busy with other reads of its logs; try again in a moment"
    )]
    Busy { node: String },
}

/// The open agent connections, by node name. Cheap to clone.
#[derive(Clone, Default)]
pub struct AgentLinks {
    inner: Arc<Mutex<HashMap<String, PeerConnection>>>,
}

impl std::fmt::Debug for AgentLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentLinks").finish_non_exhaustive()
    }
}

impl AgentLinks {
    pub fn new() -> AgentLinks {
        AgentLinks::default()
    }

    fn links(&self) -> MutexGuard<'_, HashMap<String, PeerConnection>> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records `connection` as node `node`'s, replacing an older one.
    pub fn connected(&self, node: &str, connection: &PeerConnection) {
        self.links().insert(node.to_string(), connection.clone());
    }

    /// Forgets `connection` if it is still node `node`'s.
    pub fn disconnected(&self, node: &str, connection: &PeerConnection) {
        let mut links = self.links();
        let current = links
            .get(node)
            .is_some_and(|known| known.is_same(connection));
        if current {
            links.remove(node);
        }
    }

    /// The node's connection, if its agent is connected.
    pub fn get(&self, node: &str) -> Option<PeerConnection> {
        self.links()
            .get(node)
            .filter(|connection| connection.is_open())
            .cloned()
    }

    /// Sends `request` to node `node`'s agent and waits for its answer, within
    /// [`LEADER_REQUEST_TIMEOUT_MS`].
    pub async fn ask(
        &self,
        node: &str,
        request: &LeaderRequest,
    ) -> Result<LeaderResponse, AskError> {
        let connection = self.get(node).ok_or_else(|| AskError::NotConnected {
            node: node.to_string(),
        })?;
        connection
            .request(request, Duration::from_millis(LEADER_REQUEST_TIMEOUT_MS))
            .await
            .map_err(|source| match source {
                // Found by probing: 100 followers of one job's log were told the agent might
                // not be running, and 20 of them ended.
                RequestError::Refused { code }
                    if code == u64::from(quotient_common::transport::STREAM_CODE_REFUSED) =>
                {
                    AskError::Busy {
                        node: node.to_string(),
                    }
                }
                source => AskError::Request {
                    node: node.to_string(),
                    source,
                },
            })
    }
}
