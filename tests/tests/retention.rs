//! Retention and lists in pages, through real processes (docs/retention.md, docs/cli.md):
//! finished jobs leave every replica alike once their retention is over, `job get` of one
//! says it was removed, and a submit retried with its idempotency key after the removal gets
//! the removed job back, never a second run; `job list` pages, walked while jobs are submitted,
//! run, end and are removed, list every job that stays exactly once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quotient_client::ApiClient;
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::{JobId, JobSpec};
use quotient_tests::{poll_until, DevCluster};

const SETTLE: Duration = Duration::from_secs(60);

#[test]
fn finished_jobs_leave_every_replica_alike_and_a_retried_submit_does_not_run_twice() {
    let cluster = DevCluster::up(&[
        "--coordinators",
        "3",
        "--nodes",
        "2",
        "--retain-finished",
        "2s",
    ]);
    cluster.create_share("team", 2, "lend", &[]);
    let keyed = [
        "job",
        "submit",
        "--share",
        "team",
        "--gpus",
        "1",
        "--idempotency-key",
        "run-1",
        "--",
        "true",
    ];
    let id = cluster.ok(&keyed).trim().to_string();
    cluster.wait_for_state(&id, "SUCCEEDED", SETTLE);
    let stays = cluster.submit("team", &[], &["sleep", "600"]);
    cluster.wait_for_state(&stays, "RUNNING", SETTLE);

    eprintln!("--- {id} is removed once its retention is over");
    let refusal = poll_until(&format!("{id} removed"), SETTLE, || {
        let output = cluster.run(&["job", "get", &id, "-o", "json"]);
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        if !output.status.success() && stderr.contains("removed") {
            Ok(stderr)
        } else {
            Err(format!(
                "{stderr}{}",
                String::from_utf8_lossy(&output.stdout)
            ))
        }
    });
    let refusal: serde_json::Value = serde_json::from_str(&refusal).expect("a JSON error");
    assert_eq!(refusal["error"]["code"], "NotFound", "{refusal}");
    let message = refusal["error"]["message"].as_str().expect("a message");
    assert!(
        message.contains("removed from the live state") && message.contains("job history"),
        "{message}"
    );
    let listed: Vec<String> = cluster
        .jobs(&[])
        .iter()
        .map(|job| job["id"].as_str().expect("an id").to_string())
        .collect();
    assert_eq!(listed, vec![stays.clone()], "the running job stays");

    eprintln!("--- the submit retried with its key gets {id} back and runs nothing");
    let again = cluster.ok(&keyed).trim().to_string();
    assert_eq!(again, id);
    assert_eq!(cluster.jobs(&[]).len(), 1, "no second job");

    eprintln!("--- every replica removed the same jobs");
    cluster.wait_replicas_agree(3, SETTLE);
}

/// Submits `spec` through `client`, which must succeed; the job's id.
async fn submit(client: &ApiClient, spec: JobSpec) -> JobId {
    match client.call(ApiRequest::SubmitJob(spec)).await {
        Ok(ApiResponse::JobSubmitted { job, .. }) => job,
        other => panic!("a submit failed: {other:?}"),
    }
}

/// Every job id the pages of `limit` list, in the order listed.
async fn walk(client: &ApiClient, limit: u32) -> Vec<JobId> {
    let mut ids = Vec::new();
    let mut page_token = None;
    loop {
        let request = ApiRequest::ListJobs {
            share: None,
            state: None,
            mine: false,
            name_prefix: None,
            limit,
            page_token: page_token.take(),
        };
        let page = match client.call(request).await {
            Ok(ApiResponse::Jobs(page)) => page,
            other => panic!("a page failed: {other:?}"),
        };
        assert!(page.jobs.len() <= limit as usize, "a page over its limit");
        ids.extend(
            page.jobs
                .iter()
                .map(|job| job.id.parse::<JobId>().expect("a job id")),
        );
        match page.next_page_token {
            Some(token) => page_token = Some(token),
            None => return ids,
        }
    }
}

#[test]
fn pages_list_every_job_that_stays_exactly_once_while_others_come_and_go() {
    let cluster = DevCluster::up(&[
        "--coordinators",
        "1",
        "--nodes",
        "1",
        "--gpus-per-node",
        "4",
        "--retain-finished",
        "1s",
    ]);
    cluster.create_share("team", 4, "lend", &[]);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let (addresses, tls) = cluster.admin_tls();
    let client = {
        let _entered = runtime.enter();
        ApiClient::connect(addresses, &tls).expect("an API client")
    };

    // Jobs that stay: more GPUs than the share may ever hold, so they wait for good.
    let staying: Vec<JobId> = runtime.block_on(async {
        let mut ids = Vec::new();
        for n in 0..250 {
            let mut spec = JobSpec::new("team", 1, 8, vec!["true".into()]);
            spec.name = Some(format!("stay-{n}"));
            ids.push(submit(&client, spec).await);
        }
        ids
    });

    eprintln!("--- pages walked while short jobs are submitted, run, end and are removed");
    let churning = Arc::new(AtomicBool::new(true));
    let (walks, churned) = runtime.block_on(async {
        let churner = {
            let client = client.clone();
            let churning = Arc::clone(&churning);
            tokio::spawn(async move {
                let mut count = 0u32;
                while churning.load(Ordering::Relaxed) {
                    let mut spec = JobSpec::new("team", 1, 1, vec!["true".into()]);
                    spec.name = Some(format!("short-{count}"));
                    submit(&client, spec).await;
                    count += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                count
            })
        };
        let mut walks = Vec::new();
        for limit in [7, 50, 100, 7, 33, 1_000] {
            walks.push((limit, walk(&client, limit).await));
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        churning.store(false, Ordering::Relaxed);
        (walks, churner.await.expect("the churner"))
    });
    eprintln!(
        "{churned} short jobs submitted during {} walks",
        walks.len()
    );
    assert!(churned > 20, "jobs came and went during the walks");
    for (limit, ids) in &walks {
        let mut seen: BTreeMap<JobId, usize> = BTreeMap::new();
        for id in ids {
            *seen.entry(*id).or_default() += 1;
        }
        let twice: Vec<&JobId> = seen
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(id, _)| id)
            .collect();
        assert!(twice.is_empty(), "pages of {limit} listed {twice:?} twice");
        let missing: Vec<&JobId> = staying.iter().filter(|id| !seen.contains_key(id)).collect();
        assert!(missing.is_empty(), "pages of {limit} missed {missing:?}");
        let mut newest_first = ids.clone();
        newest_first.sort_by(|a, b| b.cmp(a));
        assert_eq!(ids, &newest_first, "pages of {limit} are newest first");
    }

    eprintln!("--- once the short jobs are removed, only the staying ones are listed");
    let ids = poll_until("the short jobs removed", SETTLE, || {
        let ids = runtime.block_on(walk(&client, 100));
        if ids.len() == staying.len() {
            Ok(ids)
        } else {
            Err(format!("{} listed", ids.len()))
        }
    });
    let mut expected = staying.clone();
    expected.reverse();
    assert_eq!(ids, expected);
    let names = cluster.jobs(&["--name", "stay-1"]);
    // stay-1, stay-10 to stay-19, stay-100 to stay-199.
    assert_eq!(names.len(), 1 + 10 + 100);
    client.close();
}
