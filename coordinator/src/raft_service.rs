//! The server side of the Raft network: answers [`RaftRequest`]s that arrive on ALPN
//! `quotient-raft/1` by handing them to the local Raft.
//!
//! Only a peer whose certificate names the `coordinator` role may speak Raft: any other
//! certificate (agent, admin, user) has its connection closed with
//! `CLOSE_CODE_UNAUTHORISED`, and the attempt is logged. Each request is one stream, read
//! within [`RAFT_REQUEST_READ_TIMEOUT_MS`] and answered within [`RAFT_HANDLE_TIMEOUT_MS`];
//! a bad frame costs only its stream.

use std::time::Duration;

use quotient_common::certs::Role;
use quotient_common::transport::{PeerConnection, RequestStream, RESPONSE_WRITE_TIMEOUT_MS};

use crate::network::{RaftRequest, RaftResponse};
use crate::store::type_config::Raft;

/// Deadline for a peer to deliver a Raft request once it opened the stream (milliseconds).
pub const RAFT_REQUEST_READ_TIMEOUT_MS: u64 = 30_000;
/// Deadline for the local Raft to handle one request (milliseconds); beyond it the stream is
/// dropped and the sender's own deadline turns it into a retry.
pub const RAFT_HANDLE_TIMEOUT_MS: u64 = 30_000;

/// Serves one connection on the Raft ALPN until it closes.
pub async fn serve_connection(raft: Raft, connection: PeerConnection) {
    let peer = connection.peer().clone();
    let address = connection.remote_address();
    if let Err(error) = connection.require_role(&[Role::Coordinator]) {
        tracing::warn!(%peer, %address, error = %error, "refused a raft connection: not a coordinator");
        return;
    }
    tracing::debug!(%peer, %address, "raft peer connected");
    loop {
        let stream = match connection.accept_request().await {
            Ok(Some(stream)) => stream,
            Ok(None) => break,
            Err(error) => {
                tracing::debug!(%peer, %address, error = %error, "raft connection ended");
                break;
            }
        };
        let raft = raft.clone();
        let peer = peer.clone();
        tokio::spawn(async move {
            if let Err(error) = serve_request(&raft, stream).await {
                tracing::debug!(%peer, error = %error, "raft request failed");
            }
        });
    }
}

async fn serve_request(
    raft: &Raft,
    mut stream: RequestStream,
) -> Result<(), quotient_common::transport::RequestError> {
    let request: RaftRequest = match stream
        .read_request(Duration::from_millis(RAFT_REQUEST_READ_TIMEOUT_MS))
        .await
    {
        Ok(request) => request,
        Err(error) => {
            tracing::warn!(error = %error, "refused a bad raft request");
            return Err(error);
        }
    };
    let handled = tokio::time::timeout(
        Duration::from_millis(RAFT_HANDLE_TIMEOUT_MS),
        handle(raft, request),
    )
    .await;
    let Ok(response) = handled else {
        stream.refuse(quotient_common::transport::STREAM_CODE_TIMEOUT);
        return Ok(());
    };
    stream
        .respond(&response, Duration::from_millis(RESPONSE_WRITE_TIMEOUT_MS))
        .await
}

async fn handle(raft: &Raft, request: RaftRequest) -> RaftResponse {
    match request {
        RaftRequest::AppendEntries(rpc) => {
            RaftResponse::AppendEntries(raft.append_entries(rpc).await)
        }
        RaftRequest::Vote(rpc) => RaftResponse::Vote(raft.vote(rpc).await),
        RaftRequest::InstallSnapshot(rpc) => {
            RaftResponse::InstallSnapshot(raft.install_snapshot(rpc).await)
        }
    }
}
