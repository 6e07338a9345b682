//! The server side of the Raft network: answers [`RaftRequest`]s that arrive on ALPN
//! `quotient-raft/1` by handing them to the local Raft.
//!
//! Only a peer whose certificate names the `coordinator` role may speak Raft: any other
//! certificate (agent, admin, user) has its connection closed with
//! `CLOSE_CODE_UNAUTHORISED`, and the attempt is logged. Each request is one stream, read
//! within [`RAFT_REQUEST_READ_TIMEOUT_MS`] and answered within [`RAFT_HANDLE_TIMEOUT_MS`];
//! a bad frame costs only its stream.
//!
//! Before its Raft sees a request, [`admit`] checks the [`RaftEnvelope`] around it against
//! this coordinator's cluster identity (see `identity`): another cluster's request, one meant
//! for another member, a vote request while this coordinator has joined no cluster, and
//! entries it would take as a voter while its data directory is empty are refused with
//! [`RaftRefusal`], logged, and shown in its health. The first entries or snapshot a leader
//! sends it as a learner make it join that leader's cluster.
//!
//! An AppendEntries is answered with success only once the entries it reports are on this
//! node's disk: the log store lets openraft go on before its writes are synced (see
//! `store::log_writer`), and the leader counts this answer towards a commit. When a
//! truncation replaced those entries meanwhile, the stream is dropped instead, and the leader
//! sends again.

use std::time::Duration;

use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use quotient_common::certs::Role;
use quotient_common::transport::{
    PeerConnection, RequestStream, RESPONSE_WRITE_TIMEOUT_MS, STREAM_CODE_TIMEOUT,
};

use crate::context::Context;
use crate::identity::ClusterIdentity;
use crate::network::{RaftEnvelope, RaftRefusal, RaftRequest, RaftResponse};
use crate::store::log_store::LogDurability;
use crate::store::type_config::Raft;
use crate::store::{MemberId, TypeConfig};

/// Deadline for a peer to deliver a Raft request once it opened the stream (milliseconds).
pub const RAFT_REQUEST_READ_TIMEOUT_MS: u64 = 30_000;
/// Deadline for the local Raft to handle one request (milliseconds); beyond it the stream is
/// dropped and the sender's own deadline turns it into a retry.
pub const RAFT_HANDLE_TIMEOUT_MS: u64 = 30_000;

/// Serves one connection on the Raft ALPN until it closes.
pub async fn serve_connection(ctx: Context, connection: PeerConnection) {
    let Context {
        raft,
        durability,
        identity,
        state_machine,
        ..
    } = ctx;
    let peer = connection.peer().clone();
    let address = connection.remote_address();
    if let Err(error) = connection.require_role(&[Role::Coordinator]) {
        tracing::warn!(%peer, %address, error = %error, "refused a raft connection: not a coordinator");
        return;
    }
    let serial = connection.serial().map(str::to_string);
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
        // A coordinator whose certificate is revoked (its key leaked) may neither lead, nor
        // vote, nor send entries: each of its requests is refused, from the entry that
        // commits the revocation on (found by probing: a revoked coordinator went on in Raft
        // unchanged).
        if state_machine.is_revoked(&peer, serial.as_deref()) {
            identity.refused(
                REVOKED_RAFT_PEER,
                format!(
                    "refused the Raft requests of {peer} at {address}: its certificate is revoked (quotient certs revoked); remove that member (quotient cluster remove-member --id N) and add one with a certificate of a new name (quotient cluster add-member)"
                ),
            );
            drop(stream);
            // Told why, so that its log says it (found by checking the fix: it read only
            // "closed by peer: shutdown").
            connection.close_unauthorised(&format!("the certificate of {peer} is revoked"));
            break;
        }
        let raft = raft.clone();
        let durability = durability.clone();
        let identity = identity.clone();
        let peer = peer.clone();
        tokio::spawn(async move {
            if let Err(error) = serve_request(&raft, &durability, &identity, stream).await {
                tracing::debug!(%peer, error = %error, "raft request failed");
            }
        });
    }
}

/// The refusal kind ([`ClusterIdentity::refused`]) of a Raft request of a coordinator whose
/// certificate is revoked.
pub const REVOKED_RAFT_PEER: &str = "revoked coordinator";

/// The refusal kind ([`ClusterIdentity::refused`]) of a Raft request this build cannot decode.
pub const UNREADABLE_RAFT_REQUEST: &str = "unreadable raft request";

async fn serve_request(
    raft: &Raft,
    durability: &LogDurability<MemberId>,
    identity: &ClusterIdentity,
    mut stream: RequestStream,
) -> Result<(), quotient_common::transport::RequestError> {
    let envelope: RaftEnvelope = match stream
        .read_request(Duration::from_millis(RAFT_REQUEST_READ_TIMEOUT_MS))
        .await
    {
        Ok(envelope) => envelope,
        Err(error) => {
            // A coordinator of this cluster (the connection's certificate says so) sent a
            // request this build cannot decode: most likely a leader of a newer release, whose
            // entries carry what this one does not know. Said once per interval, not for every
            // retry, and this member stops campaigning meanwhile: unable to take the leader's
            // entries, it would otherwise time out, campaign in ever higher terms and make the
            // leader step down again and again (found by probing an upgrade: an older member
            // logged ~550 lines a second and unsettled a newer leader).
            if matches!(
                &error,
                quotient_common::transport::RequestError::Frame(
                    quotient_common::frame::FrameError::Undecodable(_)
                        | quotient_common::frame::FrameError::TrailingBytes { .. }
                )
            ) {
                identity.refused(
                    UNREADABLE_RAFT_REQUEST,
                    format!(
                        "cannot read a Raft request of another coordinator ({error}): it is most likely of a newer release, whose entries this one cannot decode; upgrade this coordinator (it does not campaign meanwhile)"
                    ),
                );
            } else {
                tracing::warn!(error = %error, "refused a bad raft request");
            }
            return Err(error);
        }
    };
    if let Err(refusal) = admit(identity, &envelope).await {
        identity.refused(refusal.kind(), format!("refused a Raft request: {refusal}"));
        return stream
            .respond(
                &RaftResponse::Refused(refusal),
                Duration::from_millis(RESPONSE_WRITE_TIMEOUT_MS),
            )
            .await;
    }
    let request = envelope.request;
    let handled = tokio::time::timeout(
        Duration::from_millis(RAFT_HANDLE_TIMEOUT_MS),
        handle(raft, durability, request),
    )
    .await;
    let Ok(Some(response)) = handled else {
        stream.refuse(STREAM_CODE_TIMEOUT);
        return Ok(());
    };
    stream
        .respond(&response, Duration::from_millis(RESPONSE_WRITE_TIMEOUT_MS))
        .await
}

/// Whether this coordinator's Raft may see `envelope`'s request. An unjoined coordinator
/// joins the sender's cluster here, when the sender replicates to it as a learner.
pub async fn admit(identity: &ClusterIdentity, envelope: &RaftEnvelope) -> Result<(), RaftRefusal> {
    let member = identity.member();
    if envelope.to != member {
        return Err(RaftRefusal::OtherMember {
            member,
            addressed: envelope.to,
        });
    }
    let offered = envelope.cluster;
    if let Some(current) = identity.cluster().or(identity.configured()) {
        if current != offered {
            return Err(RaftRefusal::OtherCluster {
                member,
                member_cluster: current,
                sender_cluster: offered,
            });
        }
    }
    if identity.cluster().is_some() {
        return Ok(());
    }
    match envelope.request {
        RaftRequest::Vote(_) => Err(RaftRefusal::NotJoined { member }),
        _ if envelope.to_voter => Err(RaftRefusal::EmptyVoter {
            member,
            cluster: offered,
        }),
        RaftRequest::AppendEntries(_) | RaftRequest::InstallSnapshot(_) => {
            let joining = identity.clone();
            match tokio::task::spawn_blocking(move || joining.join(offered)).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(error)) => {
                    tracing::error!(error = %error, "cannot join the cluster");
                    Err(RaftRefusal::NotJoined { member })
                }
                Err(error) => {
                    tracing::error!(error = %error, "cannot join the cluster");
                    Err(RaftRefusal::NotJoined { member })
                }
            }
        }
    }
}

/// The local Raft's answer to `request`; `None` when it must not be sent (see
/// [`append_entries`]).
async fn handle(
    raft: &Raft,
    durability: &LogDurability<MemberId>,
    request: RaftRequest,
) -> Option<RaftResponse> {
    let response = match request {
        RaftRequest::AppendEntries(rpc) => {
            RaftResponse::AppendEntries(append_entries(raft, durability, rpc).await?)
        }
        RaftRequest::Vote(rpc) => RaftResponse::Vote(raft.vote(rpc).await),
        RaftRequest::InstallSnapshot(rpc) => {
            RaftResponse::InstallSnapshot(raft.install_snapshot(rpc).await)
        }
    };
    Some(response)
}

/// Hands an AppendEntries to the local Raft and, when it accepted entries, waits until they
/// are durable in the log generation they were written in. `None` when a truncation
/// replaced them first or the store stopped writing: no answer is better than a false one.
pub async fn append_entries(
    raft: &Raft,
    durability: &LogDurability<MemberId>,
    rpc: AppendEntriesRequest<TypeConfig>,
) -> Option<Result<AppendEntriesResponse<MemberId>, RaftError<MemberId>>> {
    let generation = durability.generation();
    let last_sent = crate::network::last_log_id_sent(&rpc);
    let result = raft.append_entries(rpc).await;
    let matching = match &result {
        Ok(AppendEntriesResponse::Success) => last_sent,
        Ok(AppendEntriesResponse::PartialSuccess(matching)) => *matching,
        _ => None,
    };
    if let Some(matching) = matching {
        if let Err(error) = durability.wait_log(generation, matching.index).await {
            tracing::debug!(%matching, error = %error, "not answering an append: its entries are not durable");
            return None;
        }
    }
    Some(result)
}
