//! The transport over real QUIC on loopback: who gets in, what each side learns about the
//! other, how requests fail (deadline, oversized frame) without taking the server down, and
//! how peers of different versions of a protocol refuse each other by name.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quotient_common::certs::{self, PeerIdentity, Role};
use quotient_common::frame::{WireMessage, FRAME_MAGIC, MAX_FRAME_BYTES};
use quotient_common::tls::{crypto_provider, TlsFiles, TlsIdentity, PROTOCOL_VERSIONS};
use quotient_common::transport::{
    self, quinn, rustls, Client, PeerConnection, RequestError, Server, TransportError, ALPN_AGENT,
    ALPN_API, ALPN_RAFT, STREAM_CODE_FRAME_TOO_LARGE, STREAM_CODE_UNSUPPORTED_VERSION,
};
use quotient_common::version::Encoding;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// How long a test waits for anything that should happen promptly on loopback.
const PROMPT: Duration = Duration::from_secs(5);
/// Capacity of the channel on which the test server reports what it saw.
const EVENTS_MAX: usize = 64;

#[derive(Debug, Serialize, Deserialize)]
enum TestRequest {
    Echo(String),
    NeverAnswer,
    Big(Vec<u8>),
    /// Dropped unanswered, as a server does whose answer it could not encode.
    DropTheAnswer,
    /// Refused as too large, as a build from before frames carried a version refuses every
    /// versioned frame (it takes the header for a length).
    ActUnversioned,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum TestResponse {
    Echo(String),
}

/// The test server's protocol: version 1 only.
const TEST_WIRE: Encoding = Encoding {
    name: "the test protocol",
    current: 1,
    oldest: 1,
};

impl WireMessage for TestRequest {
    const ENCODING: Encoding = TEST_WIRE;
}

impl WireMessage for TestResponse {
    const ENCODING: Encoding = TEST_WIRE;
}

/// A request of the next release of the test protocol, which writes version 2.
#[derive(Debug, Serialize, Deserialize)]
enum NextRequest {
    Echo(String),
}

/// Its answer: the next release reads versions 1 and 2.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum NextResponse {
    Echo(String),
}

const NEXT_WIRE: Encoding = Encoding {
    name: "the test protocol",
    current: 2,
    oldest: 2,
};

impl WireMessage for NextRequest {
    const ENCODING: Encoding = NEXT_WIRE;
}

impl WireMessage for NextResponse {
    const ENCODING: Encoding = NEXT_WIRE;
}

/// What the test server observed.
#[derive(Debug)]
enum Event {
    Connected { peer: PeerIdentity, alpn: Vec<u8> },
    Refused(String),
    BadRequest(String),
}

/// A certificate directory with a CA, a coordinator `coord-1` and an admin `alice`.
fn cluster() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    certs::init_ca(dir.path()).expect("a CA");
    certs::issue(dir.path(), Role::Coordinator, "coord-1", &[]).expect("a coordinator cert");
    certs::issue(dir.path(), Role::Admin, "alice", &[]).expect("an admin cert");
    dir
}

fn identity(dir: &Path, name: &str) -> TlsIdentity {
    TlsIdentity::load(&TlsFiles::in_dir(dir, name)).expect("loadable TLS files")
}

fn loopback() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

/// Starts a server that answers `Echo`, sits on `NeverAnswer`, and reports every handshake
/// and bad request on the returned channel.
fn start_server(tls: &TlsIdentity, alpns: &[&[u8]]) -> (Arc<Server>, mpsc::Receiver<Event>) {
    let server = Arc::new(Server::bind(loopback(), tls, alpns).expect("a bound server"));
    let (events, receiver) = mpsc::channel(EVENTS_MAX);
    let accepting = server.clone();
    tokio::spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            let events = events.clone();
            tokio::spawn(async move {
                let connection = match incoming.handshake().await {
                    Ok(connection) => connection,
                    Err(error) => {
                        let _ = events.send(Event::Refused(format!("{error:#}"))).await;
                        return;
                    }
                };
                let _ = events
                    .send(Event::Connected {
                        peer: connection.peer().clone(),
                        alpn: connection.alpn().to_vec(),
                    })
                    .await;
                serve_connection(connection, events).await;
            });
        }
    });
    (server, receiver)
}

async fn serve_connection(connection: PeerConnection, events: mpsc::Sender<Event>) {
    while let Ok(Some(mut stream)) = connection.accept_request().await {
        let events = events.clone();
        tokio::spawn(async move {
            match stream.read_request::<TestRequest>(PROMPT).await {
                Ok(TestRequest::Echo(text)) => {
                    let _ = stream.respond(&TestResponse::Echo(text), PROMPT).await;
                }
                Ok(TestRequest::NeverAnswer) => {
                    // Hold the stream open without answering, past any client deadline.
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    drop(stream);
                }
                Ok(TestRequest::Big(_)) => stream.refuse(transport::STREAM_CODE_REFUSED),
                Ok(TestRequest::DropTheAnswer) => drop(stream),
                Ok(TestRequest::ActUnversioned) => stream.refuse(STREAM_CODE_FRAME_TOO_LARGE),
                Err(error) => {
                    let _ = events.send(Event::BadRequest(error.to_string())).await;
                }
            }
        });
    }
}

async fn next_event(events: &mut mpsc::Receiver<Event>) -> Event {
    tokio::time::timeout(PROMPT, events.recv())
        .await
        .expect("the server reports within the deadline")
        .expect("the server is running")
}

/// A test server with the certificates in `dir` and an admin's connection to it, its
/// handshake already reported.
async fn serve_and_connect(
    dir: &Path,
) -> (Arc<Server>, mpsc::Receiver<Event>, Client, PeerConnection) {
    let (server, mut events) = start_server(&identity(dir, "coord-1"), &[ALPN_API]);
    let client = Client::new(identity(dir, "alice"));
    let connection = client
        .connect(server.local_addr().unwrap(), "localhost", ALPN_API)
        .await
        .unwrap();
    assert!(matches!(
        next_event(&mut events).await,
        Event::Connected { .. }
    ));
    (server, events, client, connection)
}

async fn echo(connection: &PeerConnection, text: &str) -> Result<TestResponse, RequestError> {
    connection
        .request(&TestRequest::Echo(text.to_string()), PROMPT)
        .await
}

/// A rustls client config built by hand, to play clients that `TlsIdentity` would refuse
/// to build: one with no certificate, one with a certificate from another CA.
fn raw_client_config(
    trusted_ca: &Path,
    certificate: Option<(&Path, &Path)>,
) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(trusted_ca).expect("a CA PEM"))
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

/// Connects with a hand-made config and sends one request; the error of whichever step failed.
async fn raw_connect_and_request(
    address: SocketAddr,
    config: rustls::ClientConfig,
) -> Result<(), String> {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(config)
        .map_err(|error| error.to_string())?;
    let endpoint = quinn::Endpoint::client(loopback()).map_err(|error| error.to_string())?;
    let connecting = endpoint
        .connect_with(
            quinn::ClientConfig::new(Arc::new(crypto)),
            address,
            "localhost",
        )
        .map_err(|error| error.to_string())?;
    // In TLS 1.3 a client may finish its handshake before the server has judged its
    // certificate, so a refusal can surface at connect or at the first request.
    let connection = tokio::time::timeout(PROMPT, connecting)
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|error| error.to_string())?;
    transport::request::<_, TestResponse>(
        &connection,
        &TestRequest::Echo("hello".to_string()),
        PROMPT,
    )
    .await
    .map(|_| ())
    .map_err(|error| error.to_string())
}

#[tokio::test]
async fn a_client_with_a_valid_certificate_is_seen_by_its_role_and_name() {
    // Proves mutual TLS works end to end and each side learns the other's identity and ALPN.
    let dir = cluster();
    let (server, mut events) =
        start_server(&identity(dir.path(), "coord-1"), &[ALPN_API, ALPN_RAFT]);
    let address = server.local_addr().unwrap();
    let client = Client::new(identity(dir.path(), "alice"));

    let connection = client
        .connect(address, "localhost", ALPN_API)
        .await
        .unwrap();
    assert_eq!(
        connection.peer(),
        &PeerIdentity {
            role: Role::Coordinator,
            name: "coord-1".to_string()
        }
    );
    assert_eq!(connection.alpn(), ALPN_API);
    match next_event(&mut events).await {
        Event::Connected { peer, alpn } => {
            assert_eq!(
                peer,
                PeerIdentity {
                    role: Role::Admin,
                    name: "alice".to_string()
                }
            );
            assert_eq!(alpn, ALPN_API);
        }
        other => panic!("expected a connection, got {other:?}"),
    }
    assert_eq!(
        echo(&connection, "hello").await.unwrap(),
        TestResponse::Echo("hello".to_string())
    );

    // The same server, another of its ALPNs, reached by IP address and by HOST:PORT.
    let raft = client
        .connect_to(&format!("127.0.0.1:{}", address.port()), ALPN_RAFT)
        .await
        .unwrap();
    assert_eq!(raft.alpn(), ALPN_RAFT);
    match next_event(&mut events).await {
        Event::Connected { alpn, .. } => assert_eq!(alpn, ALPN_RAFT),
        other => panic!("expected a connection, got {other:?}"),
    }

    // An ALPN the server does not speak is refused.
    let error = client
        .connect(address, "localhost", ALPN_AGENT)
        .await
        .unwrap_err();
    assert!(
        matches!(error, TransportError::Handshake { .. }),
        "{error:?}"
    );

    // A role check passes the right peer and closes the connection of any other.
    raft.require_role(&[Role::Coordinator]).unwrap();
    let error = raft.require_role(&[Role::Agent]).unwrap_err();
    assert!(error.to_string().contains("only agent"), "{error}");
    let after_close: Result<TestResponse, _> = raft
        .request(&TestRequest::Echo("x".to_string()), PROMPT)
        .await;
    assert!(
        matches!(after_close, Err(RequestError::ConnectionLost(_))),
        "{after_close:?}"
    );
}

#[tokio::test]
async fn a_server_with_its_handshakes_in_hand_refuses_more_at_once_and_serves_again_after() {
    // Proves the admission of handshakes: beyond its limit a server refuses a connection
    // attempt before any cryptography, the client is told to try again, and once a handshake
    // ends the server takes new ones.
    let dir = cluster();
    let server = Arc::new(
        Server::bind(loopback(), &identity(dir.path(), "coord-1"), &[ALPN_API])
            .expect("a bound server")
            .with_handshakes_in_flight_max(1),
    );
    let address = server.local_addr().unwrap();
    let client = Arc::new(Client::new(identity(dir.path(), "alice")));

    // The first attempt is taken and held, its handshake not begun.
    let first = tokio::spawn({
        let client = client.clone();
        async move { client.connect(address, "localhost", ALPN_API).await }
    });
    let held = tokio::time::timeout(PROMPT, server.accept())
        .await
        .expect("the first attempt arrives")
        .expect("the server is open");

    // Meanwhile the server accepts as usual, and refuses while the first is in hand.
    let (events, mut receiver) = mpsc::channel(EVENTS_MAX);
    let accepting = server.clone();
    tokio::spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            let events = events.clone();
            tokio::spawn(async move {
                if let Ok(connection) = incoming.handshake().await {
                    serve_connection(connection, events).await;
                }
            });
        }
    });
    let began = Instant::now();
    let refused = client
        .connect(address, "localhost", ALPN_API)
        .await
        .expect_err("a second handshake while the first is in hand");
    assert!(
        began.elapsed() < PROMPT,
        "refused at once, not at a deadline: {:?}",
        began.elapsed()
    );
    let said = refused.to_string();
    assert!(
        said.contains("busy") && said.contains("try again") && !said.contains("CA"),
        "{said}"
    );
    assert_eq!(server.handshakes_refused(), 1);

    // The first attempt's turn ends (dropped without a handshake, so it is refused too);
    // then a new attempt gets its handshake, and an answer.
    drop(held);
    let first = tokio::time::timeout(PROMPT, first)
        .await
        .expect("the first attempt ends")
        .expect("the task ran");
    assert!(first.is_err(), "the held attempt was never handshaken");
    let connection = client
        .connect(address, "localhost", ALPN_API)
        .await
        .expect("a handshake once none is in hand");
    assert!(matches!(
        echo(&connection, "again").await,
        Ok(TestResponse::Echo(text)) if text == "again"
    ));
    assert!(receiver.try_recv().is_err(), "no bad request was seen");
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    // Proves there is no anonymous access: the server's handshake fails and so does the client.
    let dir = cluster();
    let (server, mut events) = start_server(&identity(dir.path(), "coord-1"), &[ALPN_API]);
    let address = server.local_addr().unwrap();

    let config = raw_client_config(&dir.path().join(certs::CA_CERT_FILE), None);
    let result = raw_connect_and_request(address, config).await;
    assert!(result.is_err(), "an anonymous client got an answer");
    match next_event(&mut events).await {
        Event::Refused(reason) => assert!(reason.contains("no certificates"), "{reason}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused() {
    // Proves a certificate from another cluster's CA does not open this cluster's servers.
    let dir = cluster();
    let other = cluster();
    let (server, mut events) = start_server(&identity(dir.path(), "coord-1"), &[ALPN_API]);
    let address = server.local_addr().unwrap();

    let other_alice = certs::issued_files(other.path(), "alice");
    let config = raw_client_config(
        &dir.path().join(certs::CA_CERT_FILE),
        Some((&other_alice.cert, &other_alice.key)),
    );
    let result = raw_connect_and_request(address, config).await;
    assert!(result.is_err(), "a foreign client got an answer");
    match next_event(&mut events).await {
        Event::Refused(reason) => assert!(reason.contains("UnknownIssuer"), "{reason}"),
        other => panic!("expected a refusal, got {other:?}"),
    }

    // And TlsIdentity refuses to even load such a mix of files.
    let mixed = TlsFiles {
        ca: dir.path().join(certs::CA_CERT_FILE),
        cert: other_alice.cert.clone(),
        key: other_alice.key.clone(),
    };
    let error = TlsIdentity::load(&mixed).unwrap_err();
    assert!(
        error.to_string().contains("is not valid under the CA"),
        "{error}"
    );
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused_by_the_client() {
    // Proves a client does not talk to an impostor server, whatever name it claims.
    let dir = cluster();
    let other = cluster();
    let (server, _events) = start_server(&identity(other.path(), "coord-1"), &[ALPN_API]);
    let address = server.local_addr().unwrap();
    let client = Client::new(identity(dir.path(), "alice"));

    let error = client
        .connect(address, "localhost", ALPN_API)
        .await
        .unwrap_err();
    assert!(
        matches!(error, TransportError::Handshake { .. }),
        "{error:?}"
    );
    let message = format!("{error:#}");
    assert!(message.contains("UnknownIssuer"), "{message}");
    assert!(message.contains("same cluster CA"), "{message}");
}

#[tokio::test]
async fn a_request_times_out_at_its_deadline_when_the_server_never_answers() {
    // Proves `request` returns at its deadline, not whenever the server gets round to it.
    let dir = cluster();
    let (server, _events) = start_server(&identity(dir.path(), "coord-1"), &[ALPN_API]);
    let address = server.local_addr().unwrap();
    let client = Client::new(identity(dir.path(), "alice"));
    let connection = client
        .connect(address, "localhost", ALPN_API)
        .await
        .unwrap();

    let deadline = Duration::from_millis(300);
    let started = Instant::now();
    let result: Result<TestResponse, _> = connection
        .request(&TestRequest::NeverAnswer, deadline)
        .await;
    let elapsed = started.elapsed();
    assert!(
        matches!(result, Err(RequestError::Timeout { after }) if after == deadline),
        "{result:?}"
    );
    assert!(elapsed >= deadline, "returned early after {elapsed:?}");
    assert!(
        elapsed < deadline + Duration::from_secs(2),
        "returned late after {elapsed:?}"
    );

    // The connection is still good for the next request.
    assert_eq!(
        echo(&connection, "after").await.unwrap(),
        TestResponse::Echo("after".to_string())
    );
}

#[tokio::test]
async fn an_oversized_frame_is_refused_and_the_server_keeps_serving() {
    // Proves a frame over the limit costs its sender an error and nobody else anything.
    let dir = cluster();
    let (server, mut events) = start_server(&identity(dir.path(), "coord-1"), &[ALPN_API]);
    let address = server.local_addr().unwrap();
    let client = Client::new(identity(dir.path(), "alice"));
    let connection = client
        .connect(address, "localhost", ALPN_API)
        .await
        .unwrap();
    assert!(matches!(
        next_event(&mut events).await,
        Event::Connected { .. }
    ));

    // The helper refuses to send an oversized request at all.
    let huge = TestRequest::Big(vec![0; MAX_FRAME_BYTES + 1]);
    let result: Result<TestResponse, _> = connection.request(&huge, PROMPT).await;
    assert!(
        matches!(
            result,
            Err(RequestError::Frame(
                quotient_common::frame::FrameError::TooLarge { .. }
            ))
        ),
        "{result:?}"
    );

    // A hand-written header announcing a body over the limit reaches the server, which
    // resets the stream.
    let (mut send, mut recv) = connection.connection().open_bi().await.unwrap();
    let announced = u32::try_from(MAX_FRAME_BYTES + 1).unwrap();
    send.write_all(&FRAME_MAGIC).await.unwrap();
    send.write_all(&TEST_WIRE.current.to_be_bytes())
        .await
        .unwrap();
    send.write_all(&announced.to_be_bytes()).await.unwrap();
    send.write_all(&[0; 1024]).await.unwrap();
    let read = tokio::time::timeout(PROMPT, recv.read_to_end(1024))
        .await
        .expect("the server answers within the deadline");
    match read {
        Err(quinn::ReadToEndError::Read(quinn::ReadError::Reset(code))) => {
            assert_eq!(code.into_inner(), u64::from(STREAM_CODE_FRAME_TOO_LARGE));
        }
        other => panic!("expected a reset stream, got {other:?}"),
    }
    match next_event(&mut events).await {
        Event::BadRequest(reason) => assert!(reason.contains("over the limit"), "{reason}"),
        other => panic!("expected a bad request, got {other:?}"),
    }

    // The same connection and a new one are both still served.
    assert_eq!(
        echo(&connection, "same").await.unwrap(),
        TestResponse::Echo("same".to_string())
    );
    let fresh = Client::new(identity(dir.path(), "alice"));
    let second = fresh.connect(address, "localhost", ALPN_API).await.unwrap();
    assert_eq!(
        echo(&second, "next").await.unwrap(),
        TestResponse::Echo("next".to_string())
    );
}

#[tokio::test]
async fn an_answer_cut_short_is_told_apart_from_a_bad_request() {
    // Proves that a stream the server finishes without a whole answer (what a server whose
    // answer was over the frame limit used to do) is reported as the answer's fault, cut
    // short, not as the request's.
    let dir = cluster();
    let (server, _events) = start_server(&identity(dir.path(), "coord-1"), &[ALPN_API]);
    let address = server.local_addr().unwrap();
    let client = Client::new(identity(dir.path(), "alice"));
    let connection = client
        .connect(address, "localhost", ALPN_API)
        .await
        .unwrap();
    let result: Result<TestResponse, _> = connection
        .request(&TestRequest::DropTheAnswer, PROMPT)
        .await;
    assert!(
        matches!(
            result,
            Err(RequestError::Answer(
                quotient_common::frame::FrameError::Truncated { received: 0, .. }
            ))
        ),
        "{result:?}"
    );
    assert_eq!(
        echo(&connection, "after").await.unwrap(),
        TestResponse::Echo("after".to_string())
    );
}

#[tokio::test]
async fn tls_files_that_are_missing_say_which_file_and_what_to_do() {
    // Proves a missing file names itself and the command that makes it.
    let dir = tempfile::tempdir().unwrap();
    let error = TlsIdentity::load(&TlsFiles::in_dir(dir.path(), "alice")).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("ca.pem"), "{message}");
    assert!(message.contains("quotient certs init"), "{message}");

    certs::init_ca(dir.path()).unwrap();
    let message = TlsIdentity::load(&TlsFiles::in_dir(dir.path(), "alice"))
        .unwrap_err()
        .to_string();
    assert!(message.contains("alice.pem"), "{message}");
    assert!(message.contains("quotient certs issue"), "{message}");
}

#[tokio::test]
async fn a_peer_of_another_version_is_refused_naming_both_versions() {
    // Proves that a request in a version the server does not read is not carried out, and
    // that both sides say which versions each speaks and which side to upgrade; the
    // connection goes on serving requests of the version the server reads.
    let dir = cluster();
    let (server, mut events, _client, connection) = serve_and_connect(dir.path()).await;
    let address = server.local_addr().unwrap();

    let result: Result<NextResponse, _> = connection
        .request(&NextRequest::Echo("from the future".into()), PROMPT)
        .await;
    let Err(RequestError::Version(mismatch)) = result else {
        panic!("expected a version refusal, got {result:?}");
    };
    assert_eq!(mismatch.theirs, (1, 1), "the versions the server reads");
    let said = mismatch.to_string();
    assert!(
        said.contains(&format!(
            "the peer at {address} speaks version 1 of the test protocol"
        )),
        "{said}"
    );
    assert!(said.contains("version 2"), "{said}");
    assert!(
        said.contains(&format!("upgrade the peer at {address}")),
        "{said}"
    );
    match next_event(&mut events).await {
        Event::BadRequest(reason) => {
            assert!(
                reason.contains("speaks version 2 of the test protocol")
                    && reason.contains("(version 1)")
                    && reason.contains("upgrade this program"),
                "{reason}"
            );
        }
        other => panic!("expected a bad request, got {other:?}"),
    }
    assert_eq!(
        echo(&connection, "same").await.unwrap(),
        TestResponse::Echo("same".to_string())
    );
}

#[tokio::test]
async fn a_peer_from_before_frames_carried_a_version_is_told_apart_both_ways() {
    // Proves that an unversioned request (a bare length prefix, as builds before versions
    // sent) is refused with the version reset code, and that such a server's refusal of a
    // versioned request (too large: it took the header for a length) reads as its version.
    let dir = cluster();
    let (server, mut events, _client, connection) = serve_and_connect(dir.path()).await;
    let address = server.local_addr().unwrap();

    let body = quotient_common::frame::encode_body(&TestRequest::Echo("old".into())).unwrap();
    let (mut send, mut recv) = connection.connection().open_bi().await.unwrap();
    send.write_all(&(body.len() as u32).to_be_bytes())
        .await
        .unwrap();
    send.write_all(&body).await.unwrap();
    send.finish().unwrap();
    let read = tokio::time::timeout(PROMPT, recv.read_to_end(1024))
        .await
        .expect("the server answers within the deadline");
    match read {
        Err(quinn::ReadToEndError::Read(quinn::ReadError::Reset(code))) => {
            assert_eq!(
                code.into_inner(),
                u64::from(STREAM_CODE_UNSUPPORTED_VERSION)
            );
        }
        other => panic!("expected a reset stream, got {other:?}"),
    }
    match next_event(&mut events).await {
        Event::BadRequest(reason) => {
            assert!(
                reason.contains("no version") && reason.contains("upgrade the peer"),
                "{reason}"
            )
        }
        other => panic!("expected a bad request, got {other:?}"),
    }

    let result: Result<TestResponse, _> = connection
        .request(&TestRequest::ActUnversioned, PROMPT)
        .await;
    let Err(RequestError::Version(mismatch)) = result else {
        panic!("expected a version error, got {result:?}");
    };
    assert_eq!(mismatch.theirs, (0, 0));
    let said = mismatch.to_string();
    assert!(
        said.contains(&format!("upgrade the peer at {address}")),
        "{said}"
    );
}

/// A server run on a runtime of its own, on another thread, until `kill` is sent: then the
/// runtime is dropped without letting a task run, so the server's connections end as a
/// killed process's do, without a word to their peers.
fn start_killable_server(
    dir: &Path,
    address: SocketAddr,
) -> (SocketAddr, std::sync::mpsc::Sender<()>) {
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let (kill_tx, kill_rx) = std::sync::mpsc::channel::<()>();
    let tls = identity(dir, "coord-1");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let deadline = Instant::now() + PROMPT;
        let server = loop {
            // The port of the run before may take a moment to be let go.
            match runtime.block_on(async { Server::bind(address, &tls, &[ALPN_API]) }) {
                Ok(server) => break Arc::new(server),
                Err(error) if Instant::now() > deadline => panic!("{error}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        bound_tx.send(server.local_addr().unwrap()).unwrap();
        runtime.spawn(async move {
            while let Some(incoming) = server.accept().await {
                tokio::spawn(async move {
                    if let Ok(connection) = incoming.handshake().await {
                        let (events, _ignored) = mpsc::channel(EVENTS_MAX);
                        serve_connection(connection, events).await;
                    }
                });
            }
        });
        let _ = kill_rx.recv();
        runtime.shutdown_background();
    });
    (bound_rx.recv().unwrap(), kill_tx)
}

#[tokio::test]
async fn a_server_restarted_on_its_address_resets_its_old_connections_at_once() {
    let dir = cluster();
    let (address, kill) = start_killable_server(dir.path(), loopback());
    let client = Client::new(identity(dir.path(), "alice"));
    let connection = connected_and_echoing(&client, address).await;
    kill.send(()).unwrap();
    // The same identity on the same address, as a restarted coordinator: a request on the
    // old connection is answered with a stateless reset its peer can check (the key comes
    // from the identity), not left to time out or to wait for the idle timeout (30 s).
    let (again, _kill_later) = start_killable_server(dir.path(), address);
    assert_eq!(again, address);
    let started = Instant::now();
    match echo(&connection, "after").await {
        Err(RequestError::ConnectionLost(quinn::ConnectionError::Reset)) => {}
        other => panic!("expected the connection reset, got {other:?}"),
    }
    assert!(started.elapsed() < PROMPT, "{:?}", started.elapsed());
    // A new connection works at once.
    connected_and_echoing(&client, address).await;
}

/// A new connection of `client` to `address`, checked with one echo.
async fn connected_and_echoing(client: &Client, address: SocketAddr) -> PeerConnection {
    let connection = client
        .connect(address, "localhost", ALPN_API)
        .await
        .unwrap();
    assert_eq!(
        echo(&connection, "hello").await.unwrap(),
        TestResponse::Echo("hello".into())
    );
    connection
}

/// A client certificate that expires while its connection is open serves no more requests
/// there, and a connection resumed from a TLS session of before the expiry (TLS does not
/// check a resumed peer's certificate again) is refused too, saying why (found by probing:
/// an agent whose certificate had expired registered again with a coordinator that had run
/// since before, and was given a job).
#[tokio::test]
async fn a_certificate_that_expires_is_refused_on_open_and_resumed_connections() {
    let dir = cluster();
    let (server, mut events) = start_server(&identity(dir.path(), "coord-1"), &[ALPN_API]);
    let address = server.local_addr().unwrap();
    let issuer = certs::CaIssuer::load(&certs::ca_files(dir.path())).unwrap();
    let brief = issuer
        .issue_valid_for(Role::Admin, "brief", Duration::from_secs(3))
        .unwrap();
    let tls = TlsIdentity::from_pem(
        &TlsFiles::in_dir(dir.path(), "brief"),
        issuer.ca_pem().as_bytes(),
        brief.cert_pem.as_bytes(),
        brief.key_pem.as_bytes(),
    )
    .unwrap();
    let client = Client::new(tls);
    let connection = connected_and_echoing(&client, address).await;
    // A second connection in time: the client then holds the server's tickets to resume.
    let second = connected_and_echoing(&client, address).await;
    second.close();
    for _ in 0..2 {
        assert!(matches!(
            next_event(&mut events).await,
            Event::Connected { .. }
        ));
    }
    tokio::time::sleep(Duration::from_millis(4_500)).await;

    let late = echo(&connection, "late").await.unwrap_err();
    assert!(
        matches!(late, RequestError::ConnectionLost(_)),
        "the open connection serves no more: {late:?}"
    );
    assert!(
        late.to_string().contains("expired"),
        "the client is told why: {late}"
    );
    let resumed = match client.connect(address, "localhost", ALPN_API).await {
        Ok(resumed) => echo(&resumed, "resumed").await.unwrap_err().to_string(),
        Err(error) => error.to_string(),
    };
    assert!(resumed.contains("expired"), "{resumed}");
    match next_event(&mut events).await {
        Event::Refused(why) => assert!(
            why.contains("brief") && why.contains("expired"),
            "the server says whose and why: {why}"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A process's certificate within 30 days of its end is warned of, naming its file and when;
/// the CA, years away, is not.
#[test]
fn a_certificate_near_its_end_is_warned_of_and_the_ca_far_from_it_is_not() {
    let dir = cluster();
    let issuer = certs::CaIssuer::load(&certs::ca_files(dir.path())).unwrap();
    let soon = issuer
        .issue_valid_for(Role::Agent, "node-9", Duration::from_secs(10 * 86_400))
        .unwrap();
    let tls = TlsIdentity::from_pem(
        &TlsFiles::in_dir(dir.path(), "node-9"),
        issuer.ca_pem().as_bytes(),
        soon.cert_pem.as_bytes(),
        soon.key_pem.as_bytes(),
    )
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let notices = tls.expiry_notices(now);
    assert_eq!(notices.len(), 1, "{notices:?}");
    let (expired, text) = &notices[0];
    assert!(!expired);
    assert!(
        text.contains("node-9.pem") && text.contains("(in 10 days)"),
        "{text}"
    );
    assert!(tls.ca_not_after().unwrap() > now + 9 * 365 * 86_400);
    // Past its end both are said, the CA's with what it means.
    let later = tls.ca_not_after().unwrap() + 1;
    let notices = tls.expiry_notices(later);
    assert_eq!(notices.len(), 2, "{notices:?}");
    assert!(notices.iter().all(|(expired, _)| *expired));
    assert!(notices[1].1.contains("ca.pem"), "{notices:?}");
}
