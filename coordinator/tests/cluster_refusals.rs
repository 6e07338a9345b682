//! What a running cluster refuses, and that refusing costs nothing: bad certificates, roles
//! that overreach, Raft messages from non-coordinators, malformed frames, frames of a version
//! of the API or of Raft it does not read, and commands the state machine rejects. After
//! each, the cluster still serves and its state is unchanged.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::raft::VoteRequest;
use openraft::Vote;
use quotient_client::ClientError;
use quotient_common::api::{ApiError, ApiRequest, ApiResponse};
use quotient_common::certs::{self, PeerIdentity, Role};
use quotient_common::frame::{self, FrameError, FRAME_MAGIC, MAX_FRAME_BYTES};
use quotient_common::job::LAUNCH_BYTES_MAX;
use quotient_common::tls::{crypto_provider, TlsFiles, TlsIdentity, PROTOCOL_VERSIONS};
use quotient_common::transport::{
    self, quinn, rustls, Client, RequestError, ALPN_API, ALPN_RAFT, CLOSE_CODE_UNAUTHORISED,
    STREAM_CODE_BAD_FRAME, STREAM_CODE_FRAME_TOO_LARGE, STREAM_CODE_UNSUPPORTED_VERSION,
};
use quotient_common::version::{API_WIRE, RAFT_WIRE};
use quotient_common::{ErrorCode, JobId, ShareUpdate};
use quotient_coordinator::network::{RaftRequest, RaftResponse};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use support::{create_share, job, jobs, poll_until, share, shares, submit, Cluster, CONVERGE};

/// How long anything that should happen promptly on loopback may take.
const PROMPT: Duration = Duration::from_secs(5);

/// A rustls client config made by hand, for clients `TlsIdentity` would refuse to build.
fn raw_client_config(ca: &Path, certificate: Option<(&Path, &Path)>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).expect("a CA PEM"))
        .expect("a usable CA");
    let builder = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(PROTOCOL_VERSIONS)
        .expect("TLS 1.3")
        .with_root_certificates(roots);
    let mut config = match certificate {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_file(cert).expect("a cert PEM")],
                PrivateKeyDer::from_pem_file(key).expect("a key PEM"),
            )
            .expect("a matching key"),
    };
    config.alpn_protocols = vec![ALPN_API.to_vec()];
    config
}

/// Connects with a hand-made config and asks for the share list; the first error.
async fn raw_list_shares(address: SocketAddr, config: rustls::ClientConfig) -> Result<(), String> {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(config)
        .map_err(|error| error.to_string())?;
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().expect("an address"))
        .map_err(|error| error.to_string())?;
    let connecting = endpoint
        .connect_with(
            quinn::ClientConfig::new(Arc::new(crypto)),
            address,
            "localhost",
        )
        .map_err(|error| error.to_string())?;
    // In TLS 1.3 the client may finish its handshake before the server judges its
    // certificate, so the refusal shows at connect or at the first request.
    let connection = tokio::time::timeout(PROMPT, connecting)
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|error| error.to_string())?;
    let answer: ApiResponse = transport::request(&connection, &ApiRequest::ListShares, PROMPT)
        .await
        .map_err(|error| error.to_string())?;
    Err(format!(
        "an unauthenticated client got an answer: {answer:?}"
    ))
}

/// Writes `bytes` on a fresh stream of an admin connection and returns the reset code.
async fn raw_stream(client: &Client, address: &str, bytes: &[u8]) -> u64 {
    match raw_exchange(client, address, ALPN_API, bytes).await {
        Err(code) => code,
        Ok(answer) => panic!("expected a reset stream, got an answer of {answer:?}"),
    }
}

/// Writes `bytes` on a new stream of `alpn` and reads what comes back: the answer's bytes, or
/// the code the server reset the stream with.
async fn raw_exchange(
    client: &Client,
    address: &str,
    alpn: &[u8],
    bytes: &[u8],
) -> Result<Vec<u8>, u64> {
    let connection = client
        .connect_to(address, alpn)
        .await
        .expect("a connection");
    let (mut send, mut recv) = connection.connection().open_bi().await.expect("a stream");
    // The server may reset the stream before everything is written; that is the point.
    let _ = send.write_all(bytes).await;
    let _ = send.finish();
    let read = tokio::time::timeout(PROMPT, recv.read_to_end(1024))
        .await
        .expect("the server answers within its deadline");
    match read {
        Ok(answer) => Ok(answer),
        Err(quinn::ReadToEndError::Read(quinn::ReadError::Reset(code))) => Err(code.into_inner()),
        Err(other) => panic!("expected an answer or a reset stream, got {other:?}"),
    }
}

/// A frame header of `version` announcing a body of `length` bytes.
fn header(version: u16, length: u32) -> Vec<u8> {
    let mut header = FRAME_MAGIC.to_vec();
    header.extend_from_slice(&version.to_be_bytes());
    header.extend_from_slice(&length.to_be_bytes());
    header
}

/// The text of the rejection `result` must be, which must carry `code`.
fn rejected(result: Result<ApiResponse, ClientError>, code: ErrorCode) -> String {
    match result {
        Err(ClientError::Api(error @ ApiError::Rejected(_))) => {
            assert_eq!(error.code(), code, "{error}");
            error.to_string()
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_clients_and_bad_frames_are_refused_and_change_nothing() {
    // Proves authentication, per-request authorisation and frame checks on a live cluster.
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    let admin = cluster.admin();
    create_share(&admin, "team").await;
    cluster.wait_converged(&[1, 2, 3]).await;
    let before = (shares(&admin).await, jobs(&admin).await);
    let term_before = cluster.health(leader).await.expect("health").term;
    let leader_address = cluster.address(leader);
    let socket: SocketAddr = leader_address.parse().expect("a socket address");
    let ca = cluster.certs.dir.join(certs::CA_CERT_FILE);

    eprintln!("--- a client with no certificate");
    let error = raw_list_shares(socket, raw_client_config(&ca, None))
        .await
        .expect_err("refused");
    eprintln!("refused: {error}");

    eprintln!("--- a client with a certificate from another CA");
    let mallory = certs::issued_files(&cluster.certs.other_dir, "mallory");
    let error = raw_list_shares(
        socket,
        raw_client_config(&ca, Some((&mallory.cert, &mallory.key))),
    )
    .await
    .expect_err("refused");
    eprintln!("refused: {error}");

    eprintln!("--- a user certificate trying admin commands");
    let user = cluster.client_of("bob", cluster.addresses());
    for request in [
        ApiRequest::CreateShare(share("sneaky")),
        ApiRequest::UpdateShare {
            name: "team".to_string(),
            update: ShareUpdate::default(),
        },
        ApiRequest::DeleteShare {
            name: "team".to_string(),
        },
        ApiRequest::CordonNode {
            node: "node-1".to_string(),
        },
        ApiRequest::RemoveNode {
            node: "node-1".to_string(),
        },
        ApiRequest::AddMember {
            id: 7,
            address: "127.0.0.1:1".to_string(),
        },
        ApiRequest::RemoveMember { id: 1 },
    ] {
        match user.call(request.clone()).await {
            Err(ClientError::Api(ApiError::Unauthorized(text))) => {
                assert!(text.contains("bob") && text.contains("admin"), "{text}")
            }
            other => panic!("{request:?} by a user: expected a refusal, got {other:?}"),
        }
    }
    // A user may read and submit, though.
    assert_eq!(shares(&user).await.len(), 1);

    eprintln!("--- a user wrapping an admin command, or posing as an admin in a forwarded one");
    let sneaky = ApiRequest::CreateShare(share("sneaky"));
    let follower = cluster.ids_except(&[leader])[0];
    for address in [cluster.address(leader), cluster.address(follower)] {
        let user = cluster.client_of("bob", vec![address]);
        for wrapped in [
            ApiRequest::ViaLeader(Box::new(sneaky.clone())),
            ApiRequest::Forwarded {
                caller: "quotient://admin/alice".to_string(),
                request: Box::new(sneaky.clone()),
            },
        ] {
            match user.call(wrapped.clone()).await {
                Err(ClientError::Api(ApiError::Unauthorized(text))) => {
                    assert!(text.contains("bob"), "{text}")
                }
                other => panic!("{wrapped:?} by a user: expected a refusal, got {other:?}"),
            }
        }
    }
    let coordinator = cluster.client_of("coord-1", vec![leader_address.clone()]);
    let as_bob = ApiRequest::Forwarded {
        caller: "quotient://user/bob".to_string(),
        request: Box::new(sneaky.clone()),
    };
    match coordinator.call(as_bob).await {
        Err(ClientError::Api(ApiError::Unauthorized(text))) => {
            assert!(
                text.contains("bob"),
                "authorised as the caller it names: {text}"
            )
        }
        other => panic!("an admin command forwarded for a user: {other:?}"),
    }
    for malformed in [
        ApiRequest::Forwarded {
            caller: "alice".to_string(),
            request: Box::new(ApiRequest::ListShares),
        },
        ApiRequest::Forwarded {
            caller: "quotient://admin/alice".to_string(),
            request: Box::new(ApiRequest::ViaLeader(Box::new(sneaky.clone()))),
        },
    ] {
        match coordinator.call(malformed.clone()).await {
            Err(ClientError::Api(ApiError::BadRequest(_))) => {}
            other => panic!("{malformed:?}: expected a bad request, got {other:?}"),
        }
    }
    match admin
        .call(ApiRequest::ViaLeader(Box::new(ApiRequest::ViaLeader(
            Box::new(sneaky.clone()),
        ))))
        .await
    {
        Err(ClientError::Api(ApiError::BadRequest(_))) => {}
        other => panic!("a request wrapped twice: expected a bad request, got {other:?}"),
    }

    eprintln!("--- an agent certificate on the API and on Raft");
    let agent = cluster.client_of("node-1", cluster.addresses());
    match agent.call(ApiRequest::ListShares).await {
        Err(ClientError::Api(ApiError::Unauthorized(_))) => {}
        other => panic!("an agent listed shares: {other:?}"),
    }
    for name in ["node-1", "bob", "alice"] {
        let identity = TlsIdentity::load(&TlsFiles::in_dir(&cluster.certs.dir, name))
            .expect("loadable TLS files");
        let client = Client::new(identity);
        let vote = RaftRequest::Vote(VoteRequest::new(Vote::new(term_before + 100, 9), None));
        let outcome = match client.connect_to(&leader_address, ALPN_RAFT).await {
            Ok(connection) => connection.request::<_, RaftResponse>(&vote, PROMPT).await,
            Err(error) => panic!("{name}: the handshake itself should succeed: {error:#}"),
        };
        match outcome {
            Err(RequestError::ConnectionLost(quinn::ConnectionError::ApplicationClosed(close))) => {
                assert_eq!(
                    close.error_code.into_inner(),
                    u64::from(CLOSE_CODE_UNAUTHORISED)
                );
            }
            other => panic!("{name} sent a raft vote and got {other:?}"),
        }
    }

    eprintln!("--- a frame over the size limit, garbage bytes, a truncated frame");
    let identity = TlsIdentity::load(&cluster.certs.files("alice")).expect("alice's files");
    let raw = Client::new(identity);
    let announced = u32::try_from(MAX_FRAME_BYTES + 1).expect("fits");
    let mut oversized = header(API_WIRE.current, announced);
    oversized.extend_from_slice(&[0u8; 1024]);
    assert_eq!(
        raw_stream(&raw, &leader_address, &oversized).await,
        u64::from(STREAM_CODE_FRAME_TOO_LARGE)
    );
    let mut garbage = header(API_WIRE.current, 16);
    garbage.extend_from_slice(&[0xff; 16]);
    assert_eq!(
        raw_stream(&raw, &leader_address, &garbage).await,
        u64::from(STREAM_CODE_BAD_FRAME)
    );
    let mut truncated = header(API_WIRE.current, 100);
    truncated.extend_from_slice(&[0u8; 10]);
    assert_eq!(
        raw_stream(&raw, &leader_address, &truncated).await,
        u64::from(STREAM_CODE_BAD_FRAME)
    );
    assert_eq!(
        raw_stream(&raw, &leader_address, &FRAME_MAGIC).await,
        u64::from(STREAM_CODE_BAD_FRAME)
    );

    eprintln!("--- a request of a build from before frames carried a version, and of a newer API");
    let list = frame::encode_body(&ApiRequest::ListShares).expect("encodes");
    let mut unversioned = (list.len() as u32).to_be_bytes().to_vec();
    unversioned.extend_from_slice(&list);
    assert_eq!(
        raw_stream(&raw, &leader_address, &unversioned).await,
        u64::from(STREAM_CODE_UNSUPPORTED_VERSION)
    );
    let mut newer = header(API_WIRE.current + 1, list.len() as u32);
    newer.extend_from_slice(&list);
    let refusal = raw_exchange(&raw, &leader_address, ALPN_API, &newer)
        .await
        .expect("a newer request is answered with a refusal frame");
    match frame::read_answer_frame::<ApiResponse>(&mut refusal.as_slice(), MAX_FRAME_BYTES).await {
        Err(FrameError::Version(mismatch)) => {
            assert_eq!(mismatch.theirs, (API_WIRE.oldest, API_WIRE.current));
        }
        other => panic!("expected a refusal naming the versions the leader reads, got {other:?}"),
    }
    // On Raft too: a coordinator of a newer release is told which versions this one reads.
    let peer = Client::new(TlsIdentity::load(&cluster.certs.files("coord-1")).expect("files"));
    let vote = frame::encode_body(&RaftRequest::Vote(VoteRequest::new(
        Vote::new(term_before + 100, 9),
        None,
    )))
    .expect("encodes");
    let mut newer = header(RAFT_WIRE.current + 1, vote.len() as u32);
    newer.extend_from_slice(&vote);
    let refusal = raw_exchange(&peer, &leader_address, ALPN_RAFT, &newer)
        .await
        .expect("a newer Raft request is answered with a refusal frame");
    match frame::read_answer_frame::<RaftResponse>(&mut refusal.as_slice(), MAX_FRAME_BYTES).await {
        Err(FrameError::Version(mismatch)) => {
            assert_eq!(mismatch.theirs, (RAFT_WIRE.oldest, RAFT_WIRE.current));
            assert!(
                mismatch.to_string().contains("the Raft protocol"),
                "{mismatch}"
            );
        }
        other => panic!("expected a refusal naming the versions the leader reads, got {other:?}"),
    }

    eprintln!("--- the cluster still serves, under the same leader and term, with the same state");
    assert_eq!(shares(&admin).await.len(), 1);
    // A refusal for lack of rights is recorded in the audit log (docs/tenancy.md); nothing
    // else changes.
    cluster.wait_converged(&[1, 2, 3]).await;
    let after = (shares(&admin).await, jobs(&admin).await);
    assert_eq!(after, before, "a refused request changed the state");
    let audit = match admin
        .call(ApiRequest::Audit {
            since_ms: None,
            user: None,
        })
        .await
    {
        Ok(ApiResponse::Audit(entries)) => entries,
        other => panic!("the audit log: {other:?}"),
    };
    for entry in audit
        .iter()
        .filter(|e| !e.who.starts_with("quotient://admin/"))
    {
        assert!(entry.outcome.starts_with("refused"), "{entry:?}");
    }
    let health = cluster.health(leader).await.expect("health");
    assert_eq!(
        health.term, term_before,
        "a refused vote disturbed the leader"
    );
    assert_eq!(health.leader, Some(leader));
    let identity_seen: PeerIdentity = raw.identity().clone();
    assert_eq!(identity_seen.name, "alice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_commands_are_rejected_with_clear_errors_and_change_nothing() {
    // Proves the state machine's rejections reach the client in words and leave the state.
    let cluster = Cluster::start(3, &[]);
    cluster.wait_for_leader(&[1, 2, 3]).await;
    let admin = cluster.admin();
    create_share(&admin, "team").await;
    let kept = submit(&admin, job("team", 5)).await;
    // The leader's scheduling loop records why the job waits (there are no nodes); take the
    // state once it has.
    poll_until(
        "the scheduler to record why the job waits",
        CONVERGE,
        || async {
            jobs(&admin)
                .await
                .iter()
                .all(|job| job.reason.is_some())
                .then_some(())
        },
    )
    .await;
    let before = (shares(&admin).await, jobs(&admin).await);

    eprintln!("--- unknown share");
    let text = rejected(
        admin.call(ApiRequest::SubmitJob(job("nobody", 5))).await,
        ErrorCode::NotFound,
    );
    assert!(text.contains("no share named nobody"), "{text}");
    let text = rejected(
        admin
            .call(ApiRequest::UpdateShare {
                name: "nobody".to_string(),
                update: ShareUpdate::default(),
            })
            .await,
        ErrorCode::NotFound,
    );
    assert!(text.contains("no share named nobody"), "{text}");

    eprintln!("--- priority out of range");
    let text = rejected(
        admin.call(ApiRequest::SubmitJob(job("team", 10_000))).await,
        ErrorCode::InvalidArgument,
    );
    assert!(text.contains("priority"), "{text}");
    let text = rejected(
        admin
            .call(ApiRequest::UpdateJobPriority {
                job: kept,
                priority: 10_000,
            })
            .await,
        ErrorCode::InvalidArgument,
    );
    assert!(text.contains("priority"), "{text}");

    eprintln!("--- duplicate share name");
    let text = rejected(
        admin.call(ApiRequest::CreateShare(share("team"))).await,
        ErrorCode::Conflict,
    );
    assert!(text.contains("already exists"), "{text}");

    eprintln!("--- deleting an enabled share");
    let text = rejected(
        admin
            .call(ApiRequest::DeleteShare {
                name: "team".to_string(),
            })
            .await,
        ErrorCode::FailedPrecondition,
    );
    assert!(
        text.contains("is enabled") && text.contains("disable it"),
        "{text}"
    );

    eprintln!("--- unknown node");
    for request in [
        ApiRequest::CordonNode {
            node: "node-9".to_string(),
        },
        ApiRequest::UncordonNode {
            node: "node-9".to_string(),
        },
        ApiRequest::DrainNode {
            node: "node-9".to_string(),
        },
        ApiRequest::RemoveNode {
            node: "node-9".to_string(),
        },
    ] {
        let text = rejected(admin.call(request).await, ErrorCode::NotFound);
        assert!(text.contains("no node named node-9"), "{text}");
    }
    match admin.call(ApiRequest::list_nodes()).await {
        Ok(ApiResponse::Nodes(page)) => assert!(page.nodes.is_empty(), "{page:?}"),
        other => panic!("listing nodes failed: {other:?}"),
    }

    eprintln!("--- unknown job");
    let text = rejected(
        admin.call(ApiRequest::GetJob { job: JobId(999) }).await,
        ErrorCode::NotFound,
    );
    assert!(text.contains("j-999"), "{text}");

    eprintln!("--- a command and environment too large to launch");
    // The issue's job: 256 values of 16,000 bytes pass every per-field limit, but execve
    // would refuse them at every launch.
    let mut large = job("team", 5);
    for index in 0..256 {
        large
            .env
            .insert(format!("VALUE_{index}"), "x".repeat(16_000));
    }
    let text = rejected(
        admin.call(ApiRequest::SubmitJob(large)).await,
        ErrorCode::InvalidArgument,
    );
    assert!(
        text.contains(&format!("over the limit of {LAUNCH_BYTES_MAX} bytes"))
            && text.contains("through a file"),
        "{text}"
    );

    eprintln!("--- nothing changed, and the cluster still takes writes");
    let after = (shares(&admin).await, jobs(&admin).await);
    assert_eq!(after, before);
    submit(&admin, job("team", 1)).await;
}

/// A coordinator's certificate revoked by its name (its key leaked) is cut off: the other
/// members send it no entries and refuse its Raft requests, so it neither follows, votes nor
/// leads, and a request it forwards in any caller's name is refused (found by probing: the
/// revocation was acknowledged and changed nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_coordinator_is_cut_off_from_raft_and_forwards_nothing() {
    let cluster = Cluster::start(3, &[]);
    let leader = cluster.wait_for_leader(&[1, 2, 3]).await;
    let admin = cluster.admin();
    create_share(&admin, "before").await;
    cluster.wait_converged(&[1, 2, 3]).await;
    let revoked = cluster.ids_except(&[leader])[0];
    let others = cluster.ids_except(&[revoked]);
    let name = format!("coord-{revoked}");
    match admin
        .call(ApiRequest::Revoke {
            name: name.clone(),
            serial: None,
        })
        .await
    {
        Ok(_) => {}
        other => panic!("revoking {name}: {other:?}"),
    }
    let term = cluster.health(leader).await.expect("health").term;

    eprintln!("--- the revoked coordinator forwards a request in an admin's name");
    let forger = cluster.client_of(&name, vec![cluster.address(leader)]);
    let forged = ApiRequest::Forwarded {
        caller: "quotient://admin/alice".to_string(),
        request: Box::new(ApiRequest::CreateShare(share("forged"))),
    };
    let text = rejected(forger.call(forged).await, ErrorCode::Forbidden);
    assert!(text.contains("revoked"), "{text}");

    eprintln!("--- the others go on without it; it gets nothing more, and wins nothing");
    create_share(&admin, "after").await;
    cluster.wait_converged(&others).await;
    // Long enough for it to time out and campaign a few times.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let leader_health = cluster.health(leader).await.expect("health");
    let revoked_health = cluster.health(revoked).await.expect("health");
    assert!(
        revoked_health.last_applied < leader_health.last_applied,
        "the revoked member applied {} of the leader's {}",
        revoked_health.last_applied,
        leader_health.last_applied
    );
    assert_eq!(cluster.wait_for_leader(&others).await, leader);
    assert_eq!(
        leader_health.term, term,
        "the revoked member's campaigns reached the others"
    );
    let names: Vec<String> = shares(&admin).await.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"after".to_string()) && !names.contains(&"forged".to_string()),
        "{names:?}"
    );
    assert!(
        cluster
            .log_text(leader)
            .contains("its certificate is revoked")
            || others
                .iter()
                .any(|id| cluster.log_text(*id).contains("its certificate is revoked")),
        "a refusal is logged"
    );
    // The revoked member is told why its connections end.
    let told = format!("the certificate of coordinator {name} is revoked");
    assert!(
        cluster.log_text(revoked).contains(&told),
        "coordinator {revoked}'s log does not say {told:?}"
    );
}

/// Restarts every coordinator in turn, each back in the cluster before the next goes.
async fn restart_each(cluster: &mut Cluster) {
    for id in cluster.ids() {
        cluster.kill(id);
        cluster.start_member(id);
        cluster.wait_for_leader(&cluster.ids()).await;
        cluster.wait_converged(&cluster.ids()).await;
    }
}

/// Moving a running cluster to a new CA, as docs/operations.md ("Rotating the CA") says:
/// every process trusts both CAs, then every certificate is issued again by the new one,
/// then the old CA is dropped; each step a restart of one coordinator at a time. The cluster
/// serves throughout, keeps its state, and a certificate of the old CA is refused at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_moves_to_a_new_ca_one_coordinator_at_a_time() {
    let mut cluster = Cluster::start(3, &[]);
    cluster.wait_for_leader(&[1, 2, 3]).await;
    create_share(&cluster.admin(), "before").await;
    cluster.wait_converged(&[1, 2, 3]).await;
    let dir = cluster.certs.dir.clone();
    let new_ca = cluster.certs.dir.parent().unwrap().join("new-ca");
    certs::init_ca(&new_ca).expect("a new CA");
    let old_ca = std::fs::read_to_string(dir.join(certs::CA_CERT_FILE)).unwrap();
    let new_ca_pem = std::fs::read_to_string(new_ca.join(certs::CA_CERT_FILE)).unwrap();
    let kept = cluster.certs.dir.parent().unwrap().join("old-alice");
    std::fs::create_dir_all(&kept).unwrap();
    for file in ["alice.pem", "alice-key.pem"] {
        std::fs::copy(dir.join(file), kept.join(file)).unwrap();
    }

    eprintln!("--- 1: every process trusts both CAs");
    std::fs::write(
        dir.join(certs::CA_CERT_FILE),
        format!("{old_ca}{new_ca_pem}"),
    )
    .unwrap();
    restart_each(&mut cluster).await;
    create_share(&cluster.admin(), "trusting-both").await;

    eprintln!("--- 2: every certificate issued again by the new CA");
    for name in ["coord-1", "coord-2", "coord-3", "alice"] {
        let role = if name == "alice" {
            Role::Admin
        } else {
            Role::Coordinator
        };
        let issued = certs::issue(&new_ca, role, name, &[]).expect("a certificate of the new CA");
        std::fs::copy(&issued.cert, dir.join(format!("{name}.pem"))).unwrap();
        std::fs::copy(&issued.key, dir.join(format!("{name}-key.pem"))).unwrap();
    }
    restart_each(&mut cluster).await;
    create_share(&cluster.admin(), "new-certificates").await;

    eprintln!("--- 3: the old CA dropped");
    std::fs::write(dir.join(certs::CA_CERT_FILE), &new_ca_pem).unwrap();
    restart_each(&mut cluster).await;
    let admin = cluster.admin();
    create_share(&admin, "after").await;
    let names: Vec<String> = shares(&admin).await.into_iter().map(|s| s.name).collect();
    for name in ["before", "trusting-both", "new-certificates", "after"] {
        assert!(
            names.contains(&name.to_string()),
            "{name} is kept: {names:?}"
        );
    }
    // A client of the old CA (trusting both, to be sure it is the server that refuses).
    let bundle = kept.join("bundle.pem");
    std::fs::write(&bundle, format!("{old_ca}{new_ca_pem}")).unwrap();
    let leader = cluster.wait_for_leader(&cluster.ids()).await;
    let socket: SocketAddr = cluster.address(leader).parse().unwrap();
    let error = raw_list_shares(
        socket,
        raw_client_config(
            &bundle,
            Some((&kept.join("alice.pem"), &kept.join("alice-key.pem"))),
        ),
    )
    .await
    .expect_err("a certificate of the old CA is refused");
    eprintln!("refused: {error}");
}
