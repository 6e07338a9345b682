//! The client over real QUIC on loopback against a leader that was just killed: a silent
//! address (a UDP socket that never answers, as a SIGKILLed coordinator's port does not) and
//! a follower that keeps naming it as the leader for a while, as followers do until their
//! election timeout runs out, then serves.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quotient_client::{ApiClient, RetryPolicy};
use quotient_common::api::{ApiError, ApiRequest, ApiResponse};
use quotient_common::certs::{self, Role};
use quotient_common::tls::{TlsFiles, TlsIdentity};
use quotient_common::transport::{Server, ALPN_API};
use quotient_common::JobId;

/// How long the follower keeps naming the dead leader: about one election timeout.
const ELECTION: Duration = Duration::from_millis(800);
/// A connect deadline no call here may wait out: far longer than the bound below.
const CONNECT_DEADLINE: Duration = Duration::from_secs(30);
/// A generous bound on the whole call; waiting out the connect deadline once breaks it.
const ANSWERED_WITHIN: Duration = Duration::from_secs(10);

/// Starts a follower on loopback that answers `NotLeader` naming `leader` until [`ELECTION`]
/// after its first request, then `Done`; records every request it is sent.
fn start_follower(
    dir: &std::path::Path,
    leader: String,
) -> (Arc<Server>, SocketAddr, Arc<Mutex<Vec<ApiRequest>>>) {
    let identity = TlsIdentity::load(&TlsFiles::in_dir(dir, "coord-2")).expect("TLS files");
    let server = Arc::new(
        Server::bind(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            &identity,
            &[ALPN_API],
        )
        .expect("a bound server"),
    );
    let address = server.local_addr().expect("its address");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let first_request: Arc<Mutex<Option<Instant>>> = Arc::default();
    let accepting = Arc::clone(&server);
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            let Ok(connection) = incoming.handshake().await else {
                continue;
            };
            let record = Arc::clone(&record);
            let first_request = Arc::clone(&first_request);
            let leader = leader.clone();
            tokio::spawn(async move {
                while let Ok(Some(mut stream)) = connection.accept_request().await {
                    let Ok(request) = stream
                        .read_request::<ApiRequest>(Duration::from_secs(5))
                        .await
                    else {
                        continue;
                    };
                    record.lock().unwrap().push(request);
                    let since = *first_request
                        .lock()
                        .unwrap()
                        .get_or_insert_with(Instant::now);
                    let answer = if since.elapsed() < ELECTION {
                        ApiResponse::Error(ApiError::NotLeader {
                            leader_id: Some(1),
                            leader_address: Some(leader.clone()),
                        })
                    } else {
                        ApiResponse::Done
                    };
                    let _ = stream.respond(&answer, Duration::from_secs(5)).await;
                }
            });
        }
    });
    (server, address, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_a_moment_ago_costs_a_call_no_connect_deadline() {
    // Proves the fast failover: the dead leader first in the client's list and named by the
    // follower is neither waited on at first contact nor after the redirect (the call would
    // take the 30 s connect deadline), nor forwarded to through the follower; the call is
    // answered once the follower serves.
    let dir = tempfile::tempdir().expect("a temporary directory");
    certs::init_ca(dir.path()).expect("a CA");
    certs::issue(dir.path(), Role::Coordinator, "coord-2", &[]).expect("a coordinator cert");
    certs::issue(dir.path(), Role::Admin, "alice", &[]).expect("an admin cert");
    // Bound and never read: a handshake sent there is never answered, as with a SIGKILLed
    // coordinator whose port the kernel may not even refuse.
    let dead = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("a silent socket");
    let dead_address = format!("127.0.0.1:{}", dead.local_addr().expect("its port").port());
    let (server, follower, seen) = start_follower(dir.path(), dead_address.clone());

    let policy = RetryPolicy {
        connect_deadline: CONNECT_DEADLINE,
        call_deadline: Duration::from_secs(60),
        ..RetryPolicy::default()
    };
    let client = ApiClient::connect(
        vec![
            dead_address.clone(),
            format!("127.0.0.1:{}", follower.port()),
        ],
        &TlsFiles::in_dir(dir.path(), "alice"),
    )
    .expect("a client")
    .with_policy(policy);
    let cancel = ApiRequest::CancelJob { job: JobId(1) };
    let started = Instant::now();
    let answer = client.call(cancel.clone()).await;
    let took = started.elapsed();
    eprintln!("answered after {took:?}: {answer:?}");
    assert_eq!(
        answer.expect("the follower serves after its election"),
        ApiResponse::Done
    );
    assert!(
        took >= ELECTION,
        "answered before the election ended: {took:?}"
    );
    assert!(
        took < ANSWERED_WITHIN,
        "the call waited on the dead leader: {took:?}"
    );
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 2, "the follower was asked again: {seen:?}");
    assert!(
        seen.iter().all(|request| *request == seen[0]
            && matches!(request, ApiRequest::InSession { request, .. } if **request == cancel)),
        "nothing was forwarded through the follower to the dead leader: {seen:?}"
    );
    client.close();
    server.close();
}
