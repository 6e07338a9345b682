//! Writes the seed inputs of the fuzz targets (`fuzz/README.md`): real encodings of what the
//! decoders read, so that the fuzzers start past the magic numbers and version checks. Run
//! `QUOTIENT_WRITE_FUZZ_SEEDS=1 cargo test -p quotient-coordinator --test fuzz_seeds` after a
//! change of a format; without the variable it only checks that the seeds can be made.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use openraft::{Entry, EntryPayload, LogId, Membership, Vote};
use quotient_common::agent_api::{
    AgentRequest, AgentResponse, DesiredState, Fence, LeaderRequest, LeaderResponse,
    WireAllocation, WireGang, WireIntent,
};
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::frame::encode_frame;
use quotient_common::{
    ClusterId, GpuClass, GpuDevice, HostInfo, JobId, JobSpec, NodeInventory, ShareSpec, ShareState,
    Strategy,
};
use quotient_coordinator::network::{RaftEnvelope, RaftRequest};
use quotient_coordinator::store::codec::encode_value;
use quotient_coordinator::store::{Request, TypeConfig};
use quotient_core::{ApplyCtx, Caller, Command, State};

fn class() -> GpuClass {
    GpuClass::parse("a10g").unwrap()
}

fn commands() -> Vec<Command> {
    let mut gang = JobSpec::new("vision", 3, 2, vec!["train".into()]);
    gang.nodes = 2;
    gang.same = Some("rack".into());
    let mut host = HostInfo::process_only();
    host.labels.insert("rack".into(), "r1".into());
    let node = |name: &str| {
        Command::RegisterNode(NodeInventory {
            name: name.into(),
            host: host.clone(),
            gpus: (0..2)
                .map(|index| GpuDevice {
                    index,
                    uuid: format!("GPU-{name}-{index}"),
                    class: class(),
                    healthy: true,
                    nvlink_peers: 1 << (1 - index),
                })
                .collect(),
        })
    };
    let admin = Caller {
        name: "root".into(),
        admin: true,
    };
    vec![
        node("n1"),
        node("n2"),
        Command::As {
            caller: admin.clone(),
            command: Box::new(Command::CreateShare(ShareSpec {
                name: "vision".into(),
                limits: BTreeMap::from([(class(), 4)]),
                strategy: Strategy::LendAndBorrow,
                borrow_limit_percent: Some(50),
                in_share_preemption: true,
                state: ShareState::Enabled,
                members: vec!["alice".into(), "group:cv".into()],
                max_jobs_per_user: Some(3),
            })),
        },
        Command::As {
            caller: admin.clone(),
            command: Box::new(Command::CreateGroup {
                name: "cv".into(),
                users: vec!["bob".into()],
            }),
        },
        Command::As {
            caller: Caller {
                name: "alice".into(),
                admin: false,
            },
            command: Box::new(Command::SubmitJob(gang)),
        },
        Command::As {
            caller: admin,
            command: Box::new(Command::Revoke {
                name: "mallory".into(),
                serial: Some("0a1b".into()),
            }),
        },
    ]
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn tagged(tag: u8, bytes: Vec<u8>) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend(bytes);
    out
}

#[test]
fn write_fuzz_seeds() {
    let corpus = std::env::var_os("QUOTIENT_WRITE_FUZZ_SEEDS")
        .map(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus"));
    let scratch = tempfile::tempdir().unwrap();
    let root = corpus.unwrap_or_else(|| scratch.path().to_path_buf());

    // The state, through the commands, then planned and placed.
    let mut state = State::new();
    let mut index = 0;
    let mut apply = |state: &mut State, command: Command| {
        index += 1;
        quotient_core::apply(
            state,
            command,
            ApplyCtx {
                log_index: index,
                time_ms: 1_000 * index,
            },
        )
    };
    for command in commands() {
        assert!(!apply(&mut state, command).is_rejected());
    }
    let plan = quotient_core::plan(&state);
    apply(&mut state, Command::ApplyPlan(plan.clone()));
    write(
        &root.join("snapshot_state"),
        "state",
        &state.to_snapshot_bytes(),
    );

    // Log entries of this version: the record's version (u16 LE), then the entry.
    let version = quotient_common::version::RAFT_LOG.current.to_le_bytes();
    let entries: Vec<Entry<TypeConfig>> = vec![
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), 1),
            payload: EntryPayload::Membership(Membership::from(BTreeMap::from([(
                1u64,
                openraft::BasicNode::new("127.0.0.1:7001"),
            )]))),
        },
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), 2),
            payload: EntryPayload::Normal(Request {
                commands: commands(),
                time_ms: 7,
            }),
        },
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), 3),
            payload: EntryPayload::Normal(Request {
                commands: vec![Command::ApplyPlan(plan)],
                time_ms: 8,
            }),
        },
    ];
    for (i, entry) in entries.iter().enumerate() {
        let mut bytes = version.to_vec();
        bytes.extend(encode_value(entry).unwrap());
        write(&root.join("log_entries"), &format!("entry-{i}"), &bytes);
    }

    // Frames of the client API and the agent protocol (the first byte picks the type).
    let frames = root.join("wire_frames");
    let spec = JobSpec::new("vision", 1, 1, vec!["train".into()]);
    write(
        &frames,
        "api-submit",
        &tagged(
            0,
            encode_frame(&ApiRequest::SubmitJob(spec.clone())).unwrap(),
        ),
    );
    write(
        &frames,
        "api-list",
        &tagged(
            0,
            encode_frame(&ApiRequest::ListJobs {
                share: Some("vision".into()),
                state: None,
                mine: true,
                name_prefix: Some("train".into()),
                limit: 50,
                page_token: Some(quotient_common::api::job_page_token(
                    quotient_common::JobId(9),
                )),
            })
            .unwrap(),
        ),
    );
    write(
        &frames,
        "api-answer",
        &tagged(1, encode_frame(&ApiResponse::Done).unwrap()),
    );
    let allocation = WireAllocation {
        job: JobId(1),
        attempt: 1,
        gpu_indices: vec![0, 1],
        gpu_uuids: vec!["GPU-n1-0".into(), "GPU-n1-1".into()],
        spec,
        intent: WireIntent::Run,
        cpu_millis: 1_000,
        memory_bytes: 1 << 30,
        gang: Some(WireGang {
            rank: 0,
            hosts: vec!["10.0.0.1".into(), "10.0.0.2".into()],
            master_port: 23_456,
        }),
    };
    write(
        &frames,
        "agent-heartbeat",
        &tagged(
            2,
            encode_frame(&AgentRequest::Heartbeat {
                node: "n1".into(),
                gpus: Vec::new(),
                actual: Vec::new(),
            })
            .unwrap(),
        ),
    );
    write(
        &frames,
        "agent-desired",
        &tagged(
            3,
            encode_frame(&AgentResponse::Desired(DesiredState {
                node: "n1".into(),
                fence: Fence { term: 2, index: 9 },
                allocations: vec![allocation],
            }))
            .unwrap(),
        ),
    );
    write(
        &frames,
        "leader-logs",
        &tagged(
            4,
            encode_frame(&LeaderRequest::ReadLogs {
                node: "n1".into(),
                job: JobId(1),
                attempt: 1,
                offset: 0,
                max_bytes: 4096,
            })
            .unwrap(),
        ),
    );
    write(
        &frames,
        "leader-answer",
        &tagged(
            5,
            encode_frame(&LeaderResponse::Logs {
                data: b"hello".to_vec(),
                next_offset: 5,
                end: true,
            })
            .unwrap(),
        ),
    );

    // Raft between coordinators.
    let envelope = RaftEnvelope {
        cluster: ClusterId::from_bytes([7; 16]),
        to: 2,
        to_voter: true,
        request: RaftRequest::AppendEntries(openraft::raft::AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            entries,
            leader_commit: None,
        }),
    };
    write(
        &root.join("raft_messages"),
        "append",
        &tagged(0, encode_frame(&envelope).unwrap()),
    );

    // A log segment as the store writes it: the fixture of this version's.
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let segment = fixtures.join("data-dir-log3-snapshot2-state3/raft-wal/seg-0000000000000001.wal");
    write(
        &root.join("wal_segment"),
        "fixture",
        &std::fs::read(segment).unwrap(),
    );

    // Configs and the agent's journal.
    let configs = root.join("configs");
    let client = "coordinators = [\"127.0.0.1:7401\", \"gpu-2:7401\"]\nca = \"ca.pem\"\ncert = \"alice.pem\"\nkey = \"alice-key.pem\"\ncluster_id = \"328af24de107e480e7cafa10539d44f8\"\n";
    write(&configs, "client", &tagged(0, client.as_bytes().to_vec()));
    let coordinator = "id = 1\nlisten = \"0.0.0.0:7401\"\ndata_dir = \"/var/lib/quotient\"\npeers = \"1=a:7401,2=b:7401,3=c:7401\"\nca = \"ca.pem\"\ncert = \"c.pem\"\nkey = \"c-key.pem\"\n\n[scheduling]\ntopology_key = \"rack\"\ngang_start_timeout_ms = 300000\n";
    write(
        &configs,
        "coordinator",
        &tagged(1, coordinator.as_bytes().to_vec()),
    );
    let journal = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/tests/fixtures/agent-journal-v3.json");
    write(
        &configs,
        "journal",
        &tagged(2, std::fs::read(journal).unwrap()),
    );
}
