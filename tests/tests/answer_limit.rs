//! A job list near and over the frame limit, through `quotient job list` on a local cluster of
//! real processes: within the limit it is read whole (though it claims more than the limit in
//! memory to decode); over it, the CLI says the answer is too large, how large, and how to
//! narrow it, never that the versions may differ, and the coordinator logs a warning.
//!
//! The jobs are as large as a job list allows, so that few are needed: names at their
//! longest, a 64-character GPU class, and a wait reason that names both (they ask for more
//! GPUs than their share may ever hold). One such job is about 660 bytes in the list, so
//! about 25,400 fill the 16 MiB frame; the test measures one and submits what it takes,
//! through the API, many at a time.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use quotient_client::ApiClient;
use quotient_common::api::{ApiRequest, ApiResponse, API_FRAME_BYTES_MAX};
use quotient_common::frame;
use quotient_common::tls::TlsFiles;
use quotient_common::JobSpec;
use quotient_tests::DevCluster;

/// Submissions in flight at once.
const SUBMITTERS: usize = 32;
/// How many bytes longer a job's id may be than the first one's in this test ("j-1" and
/// "j-99999").
const ID_GROWTH_BYTES_MAX: usize = 4;
/// Longest a whole batch of submissions may take (seconds).
const SUBMIT_DEADLINE: Duration = Duration::from_secs(600);

/// An admin API client of the local cluster, from its client config.
fn admin_client(cluster: &DevCluster) -> ApiClient {
    let config = std::fs::read_to_string(&cluster.config).expect("client.toml");
    let config: toml::Value = toml::from_str(&config).expect("client.toml is TOML");
    let addresses = config["coordinators"]
        .as_array()
        .expect("coordinators")
        .iter()
        .map(|address| address.as_str().expect("an address").to_string())
        .collect();
    let file = |key: &str| {
        let path = Path::new(config[key].as_str().expect("a path"));
        cluster.dir.join(path)
    };
    let tls = TlsFiles {
        ca: file("ca"),
        cert: file("cert"),
        key: file("key"),
    };
    ApiClient::connect(addresses, &tls).expect("an API client")
}

/// A job as large as a job list shows: see the module docs.
fn large_job(share: &str, n: usize) -> JobSpec {
    let mut spec = JobSpec::new(share, 1, 2, vec!["true".into()]);
    let prefix = format!("j{n}-");
    spec.name = Some(format!("{prefix}{}", "n".repeat(128 - prefix.len())));
    spec
}

/// Submits jobs `from..to` of `share`, [`SUBMITTERS`] at a time.
async fn submit_jobs(client: &ApiClient, share: &str, from: usize, to: usize) {
    let share: Arc<str> = share.into();
    let mut tasks = tokio::task::JoinSet::new();
    for submitter in 0..SUBMITTERS {
        let client = client.clone();
        let share = Arc::clone(&share);
        tasks.spawn(async move {
            for n in (from + submitter..to).step_by(SUBMITTERS) {
                match client
                    .call(ApiRequest::SubmitJob(large_job(&share, n)))
                    .await
                {
                    Ok(ApiResponse::JobSubmitted { .. }) => {}
                    other => panic!("submitting job {n} failed: {other:?}"),
                }
            }
        });
    }
    tokio::time::timeout(SUBMIT_DEADLINE, async {
        while let Some(done) = tasks.join_next().await {
            done.expect("a submitter");
        }
    })
    .await
    .expect("the jobs are submitted in time");
}

#[test]
fn a_job_list_over_the_frame_limit_says_so_and_a_filter_narrows_it() {
    // Proves that a job list just within the frame limit is read whole by the CLI, that one
    // over it fails saying the answer is too large (its size, the limit, the filters) and not
    // that the versions may differ, that the coordinator logs it with the request, size and
    // limit, and that a filter narrows the list back within the limit.
    let class = "c".repeat(64);
    let cluster = DevCluster::up(&[
        "--coordinators",
        "1",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--gpu-class",
        &class,
    ]);
    let share = "s".repeat(128);
    let limit = format!("{class}=1");
    cluster.ok(&[
        "share",
        "create",
        &share,
        "--limit",
        &limit,
        "--strategy",
        "lend",
    ]);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let client = admin_client(&cluster);

    eprintln!("--- one job, measured");
    runtime.block_on(submit_jobs(&client, &share, 0, 1));
    let view = match runtime.block_on(client.call(ApiRequest::GetJob {
        job: quotient_common::JobId(1),
    })) {
        Ok(ApiResponse::Job(view)) => *view,
        other => panic!("reading the job back failed: {other:?}"),
    };
    assert!(
        view.reason.as_deref().is_some_and(|r| r.contains(&share)),
        "the reason names the share: {view:?}"
    );
    // Later jobs have longer ids ("j-25000" against "j-1"): a few bytes more each.
    let per_job = frame::encode_body(&view).expect("encodes").len();
    let within = API_FRAME_BYTES_MAX / (per_job + ID_GROWTH_BYTES_MAX) - 10;
    let over = API_FRAME_BYTES_MAX / per_job + 10;
    eprintln!("the first job is {per_job} bytes in the list: {within} fit, {over} do not");

    eprintln!("--- just within the limit: read whole");
    runtime.block_on(submit_jobs(&client, &share, 1, within));
    let list = cluster.json(&["job", "list", "-o", "json"]);
    assert_eq!(list.as_array().map(Vec::len), Some(within));

    eprintln!("--- over the limit: too large, said so, logged");
    runtime.block_on(submit_jobs(&client, &share, within, over));
    let output = cluster.run(&["job", "list"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the list was printed");
    assert!(
        stderr.contains("the answer is too large (")
            && stderr.contains(&format!("limit {API_FRAME_BYTES_MAX})"))
            && stderr.contains("quotient job list --share NAME"),
        "{stderr}"
    );
    assert!(!stderr.contains("version"), "{stderr}");
    let log = std::fs::read_to_string(cluster.dir.join("coord-1").join("coordinator.log"))
        .expect("the coordinator's log");
    let warning = log
        .lines()
        .find(|line| line.contains("over the frame limit"))
        .unwrap_or_else(|| panic!("no warning in the coordinator's log:\n{log}"));
    assert!(
        warning.contains("WARN")
            && warning.contains("request=\"ListJobs\"")
            && warning.contains(&format!("limit_bytes={API_FRAME_BYTES_MAX}")),
        "{warning}"
    );

    eprintln!("--- a filter narrows it");
    let running = cluster.json(&["job", "list", "--state", "RUNNING", "-o", "json"]);
    assert_eq!(running.as_array().map(Vec::len), Some(0));
    client.close();
}
