//! A real Prometheus server (Debian's `prometheus` package) scraping a dev cluster, for the
//! tests that check what operators see: it is started on a free port with a scrape interval
//! of a second, queried over its HTTP API, and killed when dropped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The Prometheus binary the tests run.
pub const PROMETHEUS: &str = "prometheus";

/// A running Prometheus; killed when dropped.
pub struct Prometheus {
    child: Child,
    address: String,
}

impl Prometheus {
    /// Whether the binary is installed. When it is not, a test fails under `CI=true`
    /// (`.ci/run` installs it) and is skipped with a word otherwise.
    pub fn available() -> bool {
        let found = Command::new(PROMETHEUS)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !found {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "the prometheus binary is missing: `apt-get install prometheus` (.ci/run does)"
            );
            eprintln!("skipped: the prometheus binary is missing (apt-get install prometheus)");
        }
        found
    }

    /// Starts Prometheus in `dir` scraping `jobs` (job name, `HOST:PORT` targets) every second.
    pub fn start(dir: &Path, jobs: &[(&str, Vec<String>)]) -> Prometheus {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free TCP port")
            .port();
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n",
        );
        for (job, targets) in jobs {
            let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ));
        }
        let config_file = dir.join("prometheus.yml");
        std::fs::write(&config_file, config).expect("the prometheus config is written");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("a log file");
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().expect("a log file"))
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        Prometheus {
            child,
            address: format!("127.0.0.1:{port}"),
        }
    }

    /// The result of an instant query (`data.result`), or why there is none yet.
    pub fn query(&self, promql: &str) -> Result<Vec<Value>, String> {
        let path = format!("/api/v1/query?query={}", percent_encode(promql));
        let body = http_get(&self.address, &path)?;
        let answer: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if answer["status"] != "success" {
            return Err(format!("the query failed: {answer}"));
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// The single value of an instant query that gives one series (a `sum(...)`, say).
    pub fn scalar(&self, promql: &str) -> Result<f64, String> {
        let result = self.query(promql)?;
        let [series] = result.as_slice() else {
            return Err(format!("{promql}: {} series, not one", result.len()));
        };
        series["value"][1]
            .as_str()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| format!("{promql}: no value in {series}"))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `text` with everything but unreserved characters percent-encoded, for a query string.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// The body of `GET path` from `address` over HTTP/1.0; an error for a refused connection or
/// a status other than 200.
pub fn http_get(address: &str, path: &str) -> Result<String, String> {
    let mut stream = TcpStream::connect(address).map_err(|e| format!("{address}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| format!("{address}{path}: {e}"))?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{address}{path}: no HTTP header in {response:?}"))?;
    let status_line = head.lines().next().unwrap_or_default();
    if !status_line.contains(" 200 ") {
        return Err(format!("{address}{path}: {status_line}: {body}"));
    }
    Ok(body.to_string())
}
