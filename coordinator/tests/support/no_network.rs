//! A Raft network that reaches nobody, for tests of one node on the real stores: a cluster of
//! one, or a node that only answers the requests a test hands it.

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode};
use quotient_coordinator::store::{MemberId, TypeConfig};

/// Every peer is unreachable.
pub struct NoNetwork;

fn unreachable<E: std::error::Error>() -> RPCError<MemberId, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&AnyError::error(
        "this test's node has no network",
    )))
}

impl RaftNetworkFactory<TypeConfig> for NoNetwork {
    type Network = NoNetwork;

    async fn new_client(&mut self, _target: MemberId, _node: &BasicNode) -> Self::Network {
        NoNetwork
    }
}

impl RaftNetwork<TypeConfig> for NoNetwork {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<MemberId>, RPCError<MemberId, BasicNode, RaftError<MemberId>>>
    {
        Err(unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<MemberId>,
        RPCError<MemberId, BasicNode, RaftError<MemberId, InstallSnapshotError>>,
    > {
        Err(unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<MemberId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<MemberId>, RPCError<MemberId, BasicNode, RaftError<MemberId>>> {
        Err(unreachable())
    }
}
