//! `cargo bench -p quotient-coordinator --bench submit`: job submits per second and their
//! acknowledgement latency on a three-coordinator cluster of real processes on loopback
//! (every log write synced with `fdatasync`), at 1, 16 and 256 concurrent clients, each
//! client with its own QUIC connection (the clients share one UDP socket) and one request in
//! flight. Side by side, the same load of puts on a three-member etcd cluster (the `etcd`
//! binary, 3.4 from Debian's etcd-server), sent through etcd's own gRPC API (`KV/Put`) by a
//! minimal HTTP/2 client, each client with its own connection; skipped with a message when
//! `etcd` is not installed. Both clusters run at once, and each concurrency is measured on
//! one system right after the other.
//!
//! Prints one JSON line on stdout:
//! `{"bench":"submit","seconds":S,"quotient":[{"clients","submits_per_sec","p50_ms","p99_ms","p999_ms","max_ms","errors","leader_cpu_us","members_cpu_us","clients_cpu_us"}],"etcd":[...]|null,"etcd_note":...}`.
//! The `*_cpu_us` figures are CPU time (user and system, from `/proc/PID/stat`) per write within
//! the measured window: of the busiest member, which is the leader, of the three members
//! together, and of this process's clients. On a machine whose speed moves from minute to
//! minute they vary less than the rates, so changes are compared by them too.
//! `QUOTIENT_BENCH_SECONDS` sets the measured seconds per concurrency (default 5);
//! `QUOTIENT_BENCH_LOG` the coordinators' `RUST_LOG` (default `warn`); `QUOTIENT_BENCH_KEEP`
//! keeps the cluster's directory (logs, data) and prints where it is.
//! `QUOTIENT_BENCH_CLIENTS` replaces the concurrencies (`1,256`), and `QUOTIENT_BENCH_ONLY`
//! measures one system (`quotient` or `etcd`). `QUOTIENT_BENCH_MEMBER_THREADS` (default 1) sets
//! each member's worker threads, for both systems (see [`member_threads`]).
//! `QUOTIENT_BENCH_ETCD_API=gateway` sends etcd's puts through its HTTP/JSON gateway instead
//! (one more loopback hop inside etcd; BENCHMARKS.md says which figures used it).

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quotient_client::ApiClient;
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::certs::{self, Role};
use quotient_common::tls::{TlsFiles, TlsIdentity};
use quotient_common::{GpuClass, JobSpec, ShareSpec, ShareState, Strategy};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The concurrencies measured.
const CONCURRENCIES: [usize; 3] = [1, 16, 256];
/// The concurrencies to measure: [`CONCURRENCIES`], or the comma-separated list in
/// `QUOTIENT_BENCH_CLIENTS` (for example `1,256`).
fn concurrencies() -> Vec<usize> {
    match std::env::var("QUOTIENT_BENCH_CLIENTS") {
        Ok(list) => list
            .split(',')
            .map(|n| {
                n.trim()
                    .parse()
                    .expect("QUOTIENT_BENCH_CLIENTS is a comma-separated list of counts")
            })
            .collect(),
        Err(_) => CONCURRENCIES.to_vec(),
    }
}

/// Threads each cluster member runs its work on: tokio's `TOKIO_WORKER_THREADS` for a
/// coordinator, Go's `GOMAXPROCS` for an etcd member. `QUOTIENT_BENCH_MEMBER_THREADS`, by
/// default 1: three members share the machine, so each gets about one CPU's worth, as
/// colocated members would be configured, and both systems are treated alike.
fn member_threads() -> String {
    let threads = std::env::var("QUOTIENT_BENCH_MEMBER_THREADS").unwrap_or_else(|_| "1".into());
    match threads.parse::<usize>() {
        Ok(n) if n > 0 => n.to_string(),
        _ => panic!("QUOTIENT_BENCH_MEMBER_THREADS is a positive count, not {threads:?}"),
    }
}

/// Which systems to measure: `QUOTIENT_BENCH_ONLY` names one (`quotient` or `etcd`).
fn measures(system: &str) -> bool {
    std::env::var("QUOTIENT_BENCH_ONLY").map_or(true, |only| only == system)
}

/// Measured seconds per concurrency, unless `QUOTIENT_BENCH_SECONDS` says otherwise.
const SECONDS_DEFAULT: u64 = 5;
/// Unmeasured seconds before each measurement.
const WARMUP: Duration = Duration::from_secs(1);
/// How long a cluster may take to come up.
const STARTUP: Duration = Duration::from_secs(60);
/// Size of each etcd value: about a submit's size on the wire.
const ETCD_VALUE_BYTES: usize = 160;
/// Longest HTTP header line or body the etcd client accepts.
const HTTP_BYTES_MAX: usize = 1 << 20;

/// Kills its processes when dropped.
struct Processes(Vec<Child>);

impl Processes {
    fn pids(&self) -> Vec<u32> {
        self.0.iter().map(Child::id).collect()
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What one concurrency level measured.
#[derive(Debug, Clone, serde::Serialize)]
struct Measurement {
    clients: usize,
    submits_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// The tail beyond p99, to tell a few long stalls from a spread-out slowness.
    p999_ms: f64,
    max_ms: f64,
    errors: u64,
    /// CPU time per write of the busiest member (the leader), in microseconds.
    leader_cpu_us: f64,
    /// CPU time per write of all members together.
    members_cpu_us: f64,
    /// CPU time per write of the bench's clients.
    clients_cpu_us: f64,
}

/// Clock ticks a second of `/proc/PID/stat` (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
const TICKS_PER_SEC: f64 = 100.0;

/// User plus system CPU time of `pid` so far, in clock ticks; 0 when it cannot be read.
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // The command name (field 2) may hold spaces; the fields after its ')' are fixed.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| {
        fields
            .get(n)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    field(11) + field(12)
}

/// CPU ticks of each member and of this process.
fn cpu_sample(members: &[u32]) -> (Vec<u64>, u64) {
    (
        members.iter().map(|pid| cpu_ticks(*pid)).collect(),
        cpu_ticks(std::process::id()),
    )
}

fn measurement(
    clients: usize,
    elapsed: Duration,
    mut latencies: Vec<Duration>,
    errors: u64,
    cpu: ((Vec<u64>, u64), (Vec<u64>, u64)),
) -> Measurement {
    latencies.sort_unstable();
    let percentile = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let rank = ((latencies.len() as f64) * p).ceil() as usize;
        latencies[rank.clamp(1, latencies.len()) - 1].as_secs_f64() * 1_000.0
    };
    let ((members_before, client_before), (members_after, client_after)) = cpu;
    let writes = latencies.len().max(1) as f64;
    let per_write = |ticks: u64| ticks as f64 / TICKS_PER_SEC * 1e6 / writes;
    let members: Vec<u64> = members_after
        .iter()
        .zip(&members_before)
        .map(|(after, before)| after.saturating_sub(*before))
        .collect();
    Measurement {
        clients,
        submits_per_sec: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50_ms: percentile(0.50),
        p99_ms: percentile(0.99),
        p999_ms: percentile(0.999),
        max_ms: percentile(1.0),
        errors,
        leader_cpu_us: per_write(members.iter().copied().max().unwrap_or(0)),
        members_cpu_us: per_write(members.iter().sum()),
        clients_cpu_us: per_write(client_after.saturating_sub(client_before)),
    }
}

/// Runs `clients` loops of `operation` for warm-up plus `seconds`; the latencies of the
/// operations that started within the measured window, and the CPU time that `members` and
/// this process spent in it.
async fn drive<F, Fut>(clients: usize, seconds: u64, members: &[u32], operation: F) -> Measurement
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let operation = Arc::new(operation);
    let start = Instant::now() + WARMUP;
    let end = start + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for client in 0..clients {
        let operation = operation.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut sequence = 0u64;
            loop {
                let began = Instant::now();
                if began >= end {
                    break;
                }
                sequence += 1;
                let ok = operation(client, sequence).await;
                if began >= start {
                    if ok {
                        latencies.push(began.elapsed());
                    } else {
                        errors += 1;
                    }
                }
            }
            (latencies, errors)
        }));
    }
    tokio::time::sleep_until(start.into()).await;
    let cpu_before = cpu_sample(members);
    tokio::time::sleep_until(end.into()).await;
    let cpu_after = cpu_sample(members);
    let mut latencies = Vec::new();
    let mut errors = 0;
    for task in tasks {
        if let Ok((mut task_latencies, task_errors)) = task.await {
            latencies.append(&mut task_latencies);
            errors += task_errors;
        }
    }
    measurement(
        clients,
        Duration::from_secs(seconds),
        latencies,
        errors,
        (cpu_before, cpu_after),
    )
}

fn free_udp_ports(count: usize) -> Vec<u16> {
    let sockets: Vec<UdpSocket> = (0..count)
        .map(|_| UdpSocket::bind("127.0.0.1:0").expect("a free UDP port"))
        .collect();
    sockets
        .iter()
        .map(|s| s.local_addr().expect("bound").port())
        .collect()
}

fn free_tcp_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free TCP port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("bound").port())
        .collect()
}

fn class() -> GpuClass {
    GpuClass::parse("a10g").expect("a GPU class")
}

/// Starts three coordinators; returns them and their addresses.
fn start_quotient(root: &Path) -> (Processes, Vec<String>) {
    let certs_dir = root.join("certs");
    certs::init_ca(&certs_dir).expect("a CA");
    for id in 1..=3 {
        certs::issue(&certs_dir, Role::Coordinator, &format!("coord-{id}"), &[]).expect("a cert");
    }
    certs::issue(&certs_dir, Role::Admin, "bench", &[]).expect("an admin cert");
    let addresses: Vec<String> = free_udp_ports(3)
        .into_iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    let peers = addresses
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut children = Vec::new();
    for (index, address) in addresses.iter().enumerate() {
        let id = index + 1;
        let files = TlsFiles::in_dir(&certs_dir, &format!("coord-{id}"));
        let log = File::create(root.join(format!("coord-{id}.log"))).expect("a log file");
        let child = Command::new(env!("CARGO_BIN_EXE_quotient-coordinator"))
            .args([
                "--id",
                &id.to_string(),
                "--listen",
                address,
                "--peers",
                &peers,
            ])
            .arg("--data-dir")
            .arg(root.join(format!("data-{id}")))
            .args(files.flags())
            .env(
                "RUST_LOG",
                std::env::var("QUOTIENT_BENCH_LOG").unwrap_or_else(|_| "warn".to_string()),
            )
            .env("TOKIO_WORKER_THREADS", member_threads())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the coordinator starts");
        children.push(child);
    }
    (Processes(children), addresses)
}

/// A running three-coordinator cluster with the bench's share created.
struct QuotientCluster {
    _processes: Processes,
    members: Vec<u32>,
    admin: ApiClient,
}

impl QuotientCluster {
    async fn start(root: &Path) -> QuotientCluster {
        let (processes, addresses) = start_quotient(root);
        let members = processes.pids();
        let tls = TlsIdentity::load(&TlsFiles::in_dir(&root.join("certs"), "bench")).expect("tls");
        let admin = ApiClient::with_identity(addresses.clone(), tls.clone()).expect("a client");
        let first = ApiClient::with_identity(vec![addresses[0].clone()], tls.clone())
            .expect("a client")
            .with_call_timeout(STARTUP);
        match first.call(ApiRequest::InitCluster).await {
            Ok(ApiResponse::ClusterInitialised(view)) => {
                assert!(view.pending.is_empty(), "{view:?}")
            }
            other => panic!("cluster init failed: {other:?}"),
        }
        first.close();
        let share = ShareSpec {
            name: "bench".to_string(),
            limits: BTreeMap::from([(class(), 1_000)]),
            strategy: Strategy::Reserve,
            borrow_limit_percent: None,
            in_share_preemption: false,
            state: ShareState::Enabled,
            members: Vec::new(),
            max_jobs_per_user: None,
        };
        let started = Instant::now();
        loop {
            match admin.call(ApiRequest::CreateShare(share.clone())).await {
                Ok(ApiResponse::Done) => break,
                other if started.elapsed() > STARTUP => {
                    panic!("the cluster did not start: {other:?}")
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        QuotientCluster {
            _processes: processes,
            members,
            admin,
        }
    }

    async fn measure(&self, clients: usize, seconds: u64) -> Measurement {
        // Each client has its own QUIC connection (its own TLS session and flow control);
        // they share the process's UDP socket, as etcd's clients share its runtime.
        let pool: Arc<Vec<ApiClient>> =
            Arc::new((0..clients).map(|_| self.admin.sibling()).collect());
        let result = drive(clients, seconds, &self.members, move |client, _sequence| {
            let pool = pool.clone();
            async move {
                let spec = JobSpec::new(
                    "bench",
                    5,
                    1,
                    vec!["train".to_string(), "--epochs=10".to_string()],
                );
                matches!(
                    pool[client].call(ApiRequest::SubmitJob(spec)).await,
                    Ok(ApiResponse::JobSubmitted { .. })
                )
            }
        })
        .await;
        eprintln!("quotient {clients:>3} clients: {result:?}");
        result
    }
}

/// A keep-alive HTTP/1.1 connection to etcd's JSON gateway.
struct Http {
    reader: BufReader<TcpStream>,
    host: String,
}

impl Http {
    async fn connect(host: &str) -> std::io::Result<Http> {
        let stream = TcpStream::connect(host).await?;
        stream.set_nodelay(true)?;
        Ok(Http {
            reader: BufReader::new(stream),
            host: host.to_string(),
        })
    }

    /// POSTs `body` to `path`; the status code and the response body.
    async fn post(&mut self, path: &str, body: &str) -> std::io::Result<(u16, String)> {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        );
        self.reader.get_mut().write_all(request.as_bytes()).await?;
        let invalid =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let mut line = String::new();
        self.reader.read_line(&mut line).await?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| invalid("no HTTP status"))?;
        let mut length = None;
        let mut chunked = false;
        loop {
            line.clear();
            if self.reader.read_line(&mut line).await? == 0 {
                return Err(invalid("connection closed in the headers"));
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let lower = header.to_ascii_lowercase();
            if let Some(value) = lower.strip_prefix("content-length:") {
                length = value.trim().parse::<usize>().ok();
            } else if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                chunked = true;
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.reader.read_line(&mut line).await?;
                let size =
                    usize::from_str_radix(line.trim(), 16).map_err(|_| invalid("bad chunk"))?;
                if size > HTTP_BYTES_MAX {
                    return Err(invalid("chunk too large"));
                }
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk).await?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else {
            let length = length.ok_or_else(|| invalid("no content length"))?;
            if length > HTTP_BYTES_MAX {
                return Err(invalid("body too large"));
            }
            body.resize(length, 0);
            self.reader.read_exact(&mut body).await?;
        }
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// Which of etcd's client APIs the puts go through: `QUOTIENT_BENCH_ETCD_API`, `grpc` (the
/// default: etcd's own API, as its clients and its `benchmark` tool use it) or `gateway` (the
/// HTTP/JSON gateway, which relays each request to the gRPC server over one more loopback hop).
#[derive(Clone, Copy)]
enum EtcdApi {
    Grpc,
    Gateway,
}

fn etcd_api() -> EtcdApi {
    match std::env::var("QUOTIENT_BENCH_ETCD_API").as_deref() {
        Err(_) | Ok("grpc") => EtcdApi::Grpc,
        Ok("gateway") => EtcdApi::Gateway,
        Ok(other) => panic!("QUOTIENT_BENCH_ETCD_API is grpc or gateway, not {other:?}"),
    }
}

/// etcd's KV.Put method.
const ETCD_PUT: &str = "/etcdserverpb.KV/Put";
/// Longest gRPC response message the etcd client accepts.
const GRPC_BYTES_MAX: usize = 1 << 20;

/// A protobuf `etcdserverpb.PutRequest { key = 1, value = 2 }`.
fn put_request(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(key.len() + value.len() + 8);
    for (tag, bytes) in [(0x0a_u8, key), (0x12, value)] {
        message.push(tag);
        let mut length = bytes.len();
        while length >= 0x80 {
            message.push((length as u8 & 0x7f) | 0x80);
            length >>= 7;
        }
        message.push(length as u8);
        message.extend_from_slice(bytes);
    }
    message
}

/// A minimal gRPC client: unary calls over one HTTP/2 connection (h2).
#[derive(Clone)]
struct Grpc {
    send: h2::client::SendRequest<bytes::Bytes>,
    authority: String,
}

impl Grpc {
    async fn connect(address: &str) -> Result<Grpc, String> {
        let stream = TcpStream::connect(address)
            .await
            .map_err(|e| e.to_string())?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (send, connection) = h2::client::handshake(stream)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Grpc {
            send,
            authority: address.to_string(),
        })
    }

    /// Calls `method` with `message`; the response message once the server says `grpc-status` 0.
    async fn unary(&self, method: &str, message: Vec<u8>) -> Result<Vec<u8>, String> {
        let mut send = self.send.clone().ready().await.map_err(|e| e.to_string())?;
        let request = http::Request::post(format!("http://{}{method}", self.authority))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .map_err(|e| e.to_string())?;
        let (response, mut body) = send
            .send_request(request, false)
            .map_err(|e| e.to_string())?;
        let length = u32::try_from(message.len()).map_err(|_| "message too long")?;
        let mut frame = Vec::with_capacity(5 + message.len());
        frame.push(0); // not compressed
        frame.extend_from_slice(&length.to_be_bytes());
        frame.extend_from_slice(&message);
        body.send_data(frame.into(), true)
            .map_err(|e| e.to_string())?;
        let response = response.await.map_err(|e| e.to_string())?;
        if response.status() != http::StatusCode::OK {
            return Err(format!("HTTP status {}", response.status()));
        }
        let (head, mut body) = response.into_parts();
        let mut received = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| e.to_string())?;
            if received.len() + chunk.len() > GRPC_BYTES_MAX + 5 {
                return Err("response too large".into());
            }
            let _ = body.flow_control().release_capacity(chunk.len());
            received.extend_from_slice(&chunk);
        }
        let trailers = body.trailers().await.map_err(|e| e.to_string())?;
        let status = trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| head.headers.get("grpc-status"))
            .ok_or("no grpc-status")?;
        if status != "0" {
            return Err(format!("grpc-status {status:?}"));
        }
        // One uncompressed message: flag 0, its length (big-endian), then exactly that much.
        match received.split_first_chunk::<5>() {
            Some(([0, length @ ..], message))
                if u32::from_be_bytes(*length) as usize == message.len() =>
            {
                Ok(message.to_vec())
            }
            _ => Err("a malformed or compressed gRPC message".into()),
        }
    }
}

/// Standard base64 without a crate: enough for keys and values.
fn base64(bytes: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn etcd_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcd"))
        .find(|candidate| candidate.is_file())
}

/// Starts three etcd members; returns them and their client addresses.
fn start_etcd(binary: &Path, root: &Path) -> (Processes, Vec<String>) {
    std::fs::create_dir_all(root).expect("a directory for etcd");
    let ports = free_tcp_ports(6);
    let peer_url = |i: usize| format!("http://127.0.0.1:{}", ports[3 + i]);
    let cluster = (0..3)
        .map(|i| format!("e{i}={}", peer_url(i)))
        .collect::<Vec<_>>()
        .join(",");
    let mut children = Vec::new();
    let mut addresses = Vec::new();
    for (i, client_port) in ports.iter().take(3).enumerate() {
        let client_url = format!("http://127.0.0.1:{client_port}");
        let log = File::create(root.join(format!("etcd-{i}.log"))).expect("a log file");
        let child = Command::new(binary)
            .args(["--name", &format!("e{i}")])
            .arg("--data-dir")
            .arg(root.join(format!("etcd-{i}")))
            .args([
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url(i),
                "--initial-advertise-peer-urls",
                &peer_url(i),
            ])
            .args([
                "--initial-cluster",
                &cluster,
                "--initial-cluster-state",
                "new",
            ])
            .args([
                "--initial-cluster-token",
                "quotient-bench",
                "--log-level",
                "warn",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .env("GOMAXPROCS", member_threads())
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        children.push(child);
        addresses.push(format!("127.0.0.1:{client_port}"));
    }
    (Processes(children), addresses)
}

/// The client address of the etcd leader, once there is one.
async fn etcd_leader(addresses: &[String]) -> String {
    let started = Instant::now();
    loop {
        for address in addresses {
            let Ok(mut http) = Http::connect(address).await else {
                continue;
            };
            let Ok((200, body)) = http.post("/v3/maintenance/status", "{}").await else {
                continue;
            };
            let Ok(status) = serde_json::from_str::<serde_json::Value>(&body) else {
                continue;
            };
            let member = status["header"]["member_id"].as_str().map(str::to_string);
            let leader = status["leader"].as_str().map(str::to_string);
            if member.is_some() && member == leader {
                return address.clone();
            }
        }
        assert!(started.elapsed() < STARTUP, "etcd elected no leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A running three-member etcd cluster and its leader's client address.
struct EtcdCluster {
    _processes: Processes,
    members: Vec<u32>,
    leader: String,
}

impl EtcdCluster {
    async fn start(binary: &Path, root: &Path) -> EtcdCluster {
        let (processes, addresses) = start_etcd(binary, root);
        let members = processes.pids();
        let leader = etcd_leader(&addresses).await;
        EtcdCluster {
            _processes: processes,
            members,
            leader,
        }
    }

    async fn measure(&self, clients: usize, seconds: u64) -> Measurement {
        let result = match etcd_api() {
            EtcdApi::Grpc => self.measure_grpc(clients, seconds).await,
            EtcdApi::Gateway => self.measure_gateway(clients, seconds).await,
        };
        eprintln!("etcd     {clients:>3} clients: {result:?}");
        result
    }
}

impl EtcdCluster {
    /// Puts through etcd's own gRPC API, each client with its own HTTP/2 connection.
    async fn measure_grpc(&self, clients: usize, seconds: u64) -> Measurement {
        let mut connections = Vec::new();
        for _ in 0..clients {
            connections.push(
                Grpc::connect(&self.leader)
                    .await
                    .expect("an etcd connection"),
            );
        }
        let connections = Arc::new(connections);
        let value = vec![b'x'; ETCD_VALUE_BYTES];
        drive(clients, seconds, &self.members, move |client, sequence| {
            let connection = connections[client].clone();
            let key = format!("job/{clients}/{client}/{sequence}");
            let message = put_request(key.as_bytes(), &value);
            async move { connection.unary(ETCD_PUT, message).await.is_ok() }
        })
        .await
    }

    /// Puts through etcd's HTTP/JSON gateway, each client with its own keep-alive connection.
    async fn measure_gateway(&self, clients: usize, seconds: u64) -> Measurement {
        let value = base64(&[b'x'; ETCD_VALUE_BYTES]);
        let mut connections = Vec::new();
        for _ in 0..clients {
            connections.push(tokio::sync::Mutex::new(
                Http::connect(&self.leader)
                    .await
                    .expect("an etcd connection"),
            ));
        }
        let connections = Arc::new(connections);
        drive(clients, seconds, &self.members, move |client, sequence| {
            let connections = connections.clone();
            let body = format!(
                "{{\"key\":\"{}\",\"value\":\"{value}\"}}",
                base64(format!("job/{clients}/{client}/{sequence}").as_bytes())
            );
            async move {
                let mut http = connections[client].lock().await;
                matches!(http.post("/v3/kv/put", &body).await, Ok((200, _)))
            }
        })
        .await
    }
}

fn main() {
    let seconds = std::env::var("QUOTIENT_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SECONDS_DEFAULT);
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let root = tempfile::tempdir().expect("a temporary directory");
    if std::env::var_os("QUOTIENT_BENCH_KEEP").is_some() {
        eprintln!("keeping {}", root.path().display());
    }
    let etcd_binary = etcd_binary();
    let etcd_note = match &etcd_binary {
        _ if !measures("etcd") => "skipped: QUOTIENT_BENCH_ONLY".to_string(),
        Some(binary) => match etcd_api() {
            EtcdApi::Grpc => format!("{} via its gRPC API", binary.display()),
            EtcdApi::Gateway => format!("{} via the HTTP/JSON gateway", binary.display()),
        },
        None => {
            eprintln!("etcd not found on PATH: skipping the etcd side (apt-get install -y etcd-server etcd-client)");
            "skipped: etcd not installed".to_string()
        }
    };
    // Both clusters run at once and each concurrency is measured on one right after the
    // other, so that the two figures of a row come from the same minute of a machine whose
    // speed drifts.
    let (quotient, etcd) = runtime.block_on(async {
        let quotient_cluster = if measures("quotient") {
            Some(QuotientCluster::start(&root.path().join("quotient")).await)
        } else {
            None
        };
        let etcd_cluster = match &etcd_binary {
            Some(binary) if measures("etcd") => {
                Some(EtcdCluster::start(binary, &root.path().join("etcd")).await)
            }
            _ => None,
        };
        let mut quotient = Vec::new();
        let mut etcd = Vec::new();
        for clients in concurrencies() {
            if let Some(cluster) = &quotient_cluster {
                quotient.push(cluster.measure(clients, seconds).await);
            }
            if let Some(cluster) = &etcd_cluster {
                etcd.push(cluster.measure(clients, seconds).await);
            }
        }
        (quotient, etcd_cluster.map(|_| etcd))
    });
    let line = serde_json::json!({
        "bench": "submit",
        "seconds": seconds,
        "member_threads": member_threads(),
        "quotient": quotient,
        "etcd": etcd,
        "etcd_note": etcd_note,
    });
    println!("{line}");
    if std::env::var_os("QUOTIENT_BENCH_KEEP").is_some() {
        let _ = root.keep();
    }
}
