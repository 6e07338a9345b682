//! A coordinator restarting from a large state: `cargo bench -p quotient-coordinator --bench
//! restart`.
//!
//! Writes, with the coordinator's own store, the data directory a coordinator of a one-member
//! cluster would hold after 1,000,000 submits: their entries (1,000 jobs an entry), a snapshot
//! of the state they made, and the most log a coordinator leaves after its snapshot by default
//! (`SNAPSHOT_LOGS_DEFAULT`, 10,000 entries of one submit each, committed). Then starts the
//! real `quotient-coordinator` on it and times, from the spawn, until it answers a linearizable
//! read (a page of `job list` through the API, over QUIC with mTLS): loading the snapshot,
//! replaying the log after it, an election, serving. Also reports the process's resident
//! memory once it serves, per job.
//!
//! `BENCH_JOBS` changes the job count, `BENCH_TAIL` the entries after the snapshot. The last
//! line printed is one JSON object.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{
    BasicNode, CommittedLeaderId, EntryPayload, LogId, Membership, RaftSnapshotBuilder, Vote,
};
use quotient_client::{ApiClient, RetryPolicy};
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::certs::{self, Role};
use quotient_common::tls::{TlsFiles, TlsIdentity};
use quotient_common::ClusterId;
use quotient_coordinator::config::SNAPSHOT_LOGS_DEFAULT;
use quotient_coordinator::identity::ClusterIdentity;
use quotient_coordinator::store::type_config::Entry;
use quotient_coordinator::store::{self, Request};
use quotient_core::Command;

mod support;

/// Jobs in one entry before the snapshot, as a busy leader batches submits.
const JOBS_PER_ENTRY: usize = 1_000;
/// How long the coordinator may take to serve before the bench gives up.
const SERVE_TIMEOUT: Duration = Duration::from_secs(120);

fn log_id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn time_ms(index: u64) -> u64 {
    1_750_000_000_000 + index
}

fn entry(index: u64, commands: Vec<Command>) -> Entry {
    Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(Request {
            commands,
            time_ms: time_ms(index),
        }),
    }
}

/// Writes the data directory; the index of its last entry.
async fn write_data_dir(dir: &Path, address: &str, jobs: usize, tail: usize) -> u64 {
    let cluster = ClusterId::from_bytes(*b"restart-bench-01");
    std::fs::create_dir_all(dir).expect("the data directory");
    ClusterIdentity::open(dir, 1, false, None)
        .and_then(|identity| identity.join(cluster))
        .expect("the data directory joins the cluster");
    let (mut log, mut state_machine) = store::open(dir).expect("open the store");
    log.save_vote(&Vote::new_committed(1, 1))
        .await
        .expect("vote");
    let membership = Membership::from(BTreeMap::from([(1u64, BasicNode::new(address))]));
    let mut head = vec![
        Entry {
            log_id: log_id(1),
            payload: EntryPayload::Membership(membership),
        },
        Entry {
            log_id: log_id(2),
            payload: EntryPayload::Blank,
        },
    ];
    head.push(entry(3, support::create_shares()));
    log.blocking_append(head.clone()).await.expect("append");
    state_machine.apply(head).await.expect("apply");
    let mut index = 3;
    let began = Instant::now();
    for first in (0..jobs).step_by(JOBS_PER_ENTRY) {
        index += 1;
        let batch = (first..(first + JOBS_PER_ENTRY).min(jobs))
            .map(support::submit)
            .collect();
        let entry = entry(index, batch);
        log.blocking_append(vec![entry.clone()])
            .await
            .expect("append");
        state_machine.apply(vec![entry]).await.expect("apply");
    }
    eprintln!(
        "{jobs} jobs in {} entries, applied in {:.1} s",
        index - 3,
        began.elapsed().as_secs_f64()
    );
    let snapshot_index = index;
    let began = Instant::now();
    state_machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("snapshot");
    eprintln!("snapshot built in {:.1} s", began.elapsed().as_secs_f64());
    let tail: Vec<Entry> = (0..tail)
        .map(|n| {
            index += 1;
            entry(index, vec![support::submit(jobs + n)])
        })
        .collect();
    for chunk in tail.chunks(1_000) {
        log.blocking_append(chunk.to_vec()).await.expect("append");
    }
    log.save_committed(Some(log_id(index)))
        .await
        .expect("committed");
    log.purge(log_id(snapshot_index)).await.expect("purge");
    index
}

fn main() {
    let jobs: usize = std::env::var("BENCH_JOBS")
        .map(|v| v.parse().expect("BENCH_JOBS is a count"))
        .unwrap_or(1_000_000);
    let tail: usize = std::env::var("BENCH_TAIL")
        .map(|v| v.parse().expect("BENCH_TAIL is a count"))
        .unwrap_or(SNAPSHOT_LOGS_DEFAULT as usize);
    let root = tempfile::tempdir().expect("a temporary directory");
    let certs_dir = root.path().join("certs");
    certs::init_ca(&certs_dir).expect("a CA");
    certs::issue(&certs_dir, Role::Coordinator, "coord-1", &[]).expect("a cert");
    certs::issue(&certs_dir, Role::Admin, "bench", &[]).expect("an admin cert");
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|socket| socket.local_addr())
        .expect("a free port")
        .port();
    let address = format!("127.0.0.1:{port}");
    let data = root.path().join("data-1");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let last = runtime.block_on(write_data_dir(&data, &address, jobs, tail));
    let bytes_on_disk: u64 = walk_bytes(&data);
    eprintln!(
        "data directory: {} MiB; starting the coordinator",
        bytes_on_disk >> 20
    );

    // QUOTIENT_BENCH_COORD_LOG=FILE keeps the coordinator's log (QUOTIENT_BENCH_LOG=info).
    let log_path = std::env::var_os("QUOTIENT_BENCH_COORD_LOG")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.path().join("coord-1.log"));
    let log = std::fs::File::create(&log_path).expect("a log file");
    let began = Instant::now();
    let mut child = Process::new(env!("CARGO_BIN_EXE_quotient-coordinator"))
        .args([
            "--id",
            "1",
            "--listen",
            &address,
            "--peers",
            &format!("1={address}"),
        ])
        .arg("--data-dir")
        .arg(&data)
        .args(TlsFiles::in_dir(&certs_dir, "coord-1").flags())
        .env(
            "RUST_LOG",
            std::env::var("QUOTIENT_BENCH_LOG").unwrap_or_else(|_| "warn".to_string()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("the coordinator starts");
    let pid = child.id();
    let tls = TlsIdentity::load(&TlsFiles::in_dir(&certs_dir, "bench")).expect("tls");
    let served = runtime.block_on(async {
        // Handshakes given up after 100 ms: the first ones go to a port no one listens on
        // yet, and QUIC hears nothing back; with the default 2 s, when the coordinator starts
        // listening matters less than when the handshake under way is resent.
        let client = ApiClient::with_identity(vec![address.clone()], tls)
            .expect("a client")
            .with_policy(RetryPolicy {
                connect_deadline: Duration::from_millis(100),
                ..RetryPolicy::default()
            });
        loop {
            match client.call(ApiRequest::list_jobs(1)).await {
                Ok(ApiResponse::Jobs(page)) => {
                    assert_eq!(page.jobs.len(), 1);
                    break began.elapsed();
                }
                other if began.elapsed() > SERVE_TIMEOUT => {
                    panic!("the coordinator did not serve in {SERVE_TIMEOUT:?}: {other:?}")
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    });
    let rss = support::rss_bytes(&pid.to_string());
    let _ = child.kill();
    let _ = child.wait();
    let total_jobs = jobs + tail;
    eprintln!(
        "served after {:.2} s (log to index {last}); RSS {} MiB, {:.0} bytes per job",
        served.as_secs_f64(),
        rss >> 20,
        rss as f64 / total_jobs as f64
    );
    println!(
        "{{\"bench\":\"restart\",\"jobs\":{total_jobs},\"entries_after_snapshot\":{tail},\"data_dir_bytes\":{bytes_on_disk},\"serve_s\":{:.2},\"rss_bytes\":{rss},\"rss_bytes_per_job\":{:.0}}}",
        served.as_secs_f64(),
        rss as f64 / total_jobs as f64
    );
}

/// Bytes of every file under `dir`.
fn walk_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("a directory")
        .map(|item| {
            let item = item.expect("an item");
            let meta = item.metadata().expect("metadata");
            if meta.is_dir() {
                walk_bytes(&item.path())
            } else {
                meta.len()
            }
        })
        .sum()
}
