//! Limits that hold on a running cluster: submits of the largest jobs the API accepts, sent
//! at once so that the leader's proposer batches them, are all acknowledged, and the leader
//! keeps serving. Batched by count alone, a handful of them made one log entry larger than
//! the log's entry limit, the log store refused to write it, and Raft stopped on the leader.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::gpu_class::GPU_CLASS_BYTES_MAX;
use quotient_common::job::{
    FIELD_BYTES_MAX, IDEMPOTENCY_KEY_BYTES_MAX, LAUNCH_BYTES_MAX, LAUNCH_STRING_OVERHEAD_BYTES,
};
use quotient_common::name::NAME_BYTES_MAX;
use quotient_common::{GpuClass, JobSpec, ShareSpec, ShareState, Strategy};
use support::{job, jobs, submit, Cluster};

/// How many of the largest jobs are submitted at once: about 6 MiB, three times what one
/// entry's proposal carries (`proposer::PROPOSAL_BYTES_MAX`, under 2 MiB).
const LARGE_SUBMITS: usize = 48;

/// Environment variables of a largest job, each with the longest name and value.
const LARGE_ENV_ENTRIES: usize = 4;

/// A GPU class with the longest name.
fn long_class() -> GpuClass {
    GpuClass::parse(&"c".repeat(GPU_CLASS_BYTES_MAX)).expect("a class of the longest name")
}

/// A job at every per-field limit (names, image, key, environment entries and arguments at
/// their longest), its arguments and environment just under what can be launched.
fn largest_job(share: &str, index: usize) -> JobSpec {
    let mut spec = JobSpec::new(share, 1, 1, Vec::new());
    let tag = format!("{index:04}");
    spec.name = Some(format!("{tag}{}", "n".repeat(NAME_BYTES_MAX - tag.len())));
    spec.gpu_class = Some(long_class());
    // The longest reference Docker reads: a name of 255, a tag of 128 and a digest.
    spec.payload.image = Some(format!(
        "{}:{}@sha256:{}",
        "i".repeat(quotient_common::job::IMAGE_NAME_BYTES_MAX),
        "t".repeat(128),
        "0".repeat(64)
    ));
    spec.idempotency_key = Some(format!(
        "{tag}{}",
        "k".repeat(IDEMPOTENCY_KEY_BYTES_MAX - tag.len())
    ));
    for entry in 0..LARGE_ENV_ENTRIES {
        let key = format!("E{entry}_{}", "K".repeat(256 - 3));
        spec.env.insert(key, "v".repeat(FIELD_BYTES_MAX));
    }
    let argument = FIELD_BYTES_MAX + LAUNCH_STRING_OVERHEAD_BYTES;
    while spec.launch_bytes() + argument <= LAUNCH_BYTES_MAX {
        spec.payload.command.push("a".repeat(FIELD_BYTES_MAX));
    }
    // The last argument fills what is left, less one byte: just under the launch limit.
    let rest = LAUNCH_BYTES_MAX - spec.launch_bytes() - LAUNCH_STRING_OVERHEAD_BYTES - 1;
    spec.payload.command.push("b".repeat(rest));
    assert_eq!(spec.launch_bytes(), LAUNCH_BYTES_MAX - 1);
    spec.validate_new().expect("the largest job is valid");
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_largest_submits_at_once_are_all_acknowledged_and_the_leader_keeps_serving() {
    // Proves the proposer bounds an entry by bytes: largest submits sent together are all
    // committed (over several entries), every replica applies them, and the same leader
    // goes on taking writes.
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    let term = cluster.health(leader).await.expect("health").term;
    let client = cluster.client_of_ids("alice", &[leader]);
    let share_name = "s".repeat(NAME_BYTES_MAX);
    let share = ShareSpec {
        name: share_name.clone(),
        limits: BTreeMap::from([(long_class(), 4)]),
        strategy: Strategy::Lend,
        borrow_limit_percent: None,
        in_share_preemption: false,
        state: ShareState::Enabled,
        members: Vec::new(),
        max_jobs_per_user: None,
    };
    match client.call(ApiRequest::CreateShare(share)).await {
        Ok(ApiResponse::Done) => {}
        other => panic!("creating the share failed: {other:?}"),
    }

    eprintln!("--- {LARGE_SUBMITS} of the largest jobs are submitted at once");
    let specs: Vec<JobSpec> = (0..LARGE_SUBMITS)
        .map(|index| largest_job(&share_name, index))
        .collect();
    let started = std::time::Instant::now();
    let answers = futures_util::future::join_all(
        specs
            .iter()
            .map(|spec| client.call(ApiRequest::SubmitJob(spec.clone()))),
    )
    .await;
    eprintln!("--- answered after {:?}", started.elapsed());
    // A client that gave up waiting on an attempt sends its submit again, with the same
    // idempotency key: the answer is then the job the first one made.
    let mut ids = BTreeSet::new();
    for (index, answer) in answers.into_iter().enumerate() {
        match answer {
            Ok(ApiResponse::JobSubmitted { job, .. }) => {
                ids.insert(job);
            }
            other => panic!("submit {index} was not acknowledged: {other:?}"),
        }
    }
    assert_eq!(ids.len(), LARGE_SUBMITS, "one job each");

    eprintln!("--- every replica holds them, and the same leader takes more writes");
    cluster.wait_converged(&[1, 2, 3]).await;
    let health = cluster.health(leader).await.expect("the leader answers");
    assert_eq!(
        (health.leader, health.term),
        (Some(leader), term),
        "the same leader in the same term"
    );
    assert!(health.problems.is_empty(), "{:?}", health.problems);
    match client
        .call(ApiRequest::CreateShare(support::share("team")))
        .await
    {
        Ok(ApiResponse::Done) => {}
        other => panic!("a write after the large ones failed: {other:?}"),
    }
    let after = submit(&client, job("team", 1)).await;
    let listed = jobs(&client).await;
    assert_eq!(listed.len(), LARGE_SUBMITS + 1);
    assert!(listed.iter().any(|view| view.id == after.to_string()));
    client.close();
}
