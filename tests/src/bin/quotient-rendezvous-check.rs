//! A stand-in for the rendezvous of a distributed training job, run as a job of several nodes
//! by the end-to-end tests. Rank 0 (`QUOTIENT_NODE_RANK`) listens on `MASTER_PORT`; every
//! other rank connects to `MASTER_ADDR:MASTER_PORT` and sends its rank; once rank 0 has heard
//! from all `QUOTIENT_NUM_NODES - 1` others it answers each with the ranks it met. Each
//! prints what it saw and exits 0 only if the rendezvous completed and the variables agree
//! (`NODE_RANK`, `NNODES`, `WORLD_SIZE`, `QUOTIENT_HOSTS`), 1 otherwise.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// How long a rank waits for the others.
const DEADLINE: Duration = Duration::from_secs(60);

fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

fn number(name: &str) -> Result<u32, String> {
    var(name)?
        .parse()
        .map_err(|_| format!("{name} is not a number"))
}

fn run() -> Result<String, String> {
    let rank = number("QUOTIENT_NODE_RANK")?;
    let nodes = number("QUOTIENT_NUM_NODES")?;
    let gpus = var("CUDA_VISIBLE_DEVICES")?.split(',').count() as u32;
    let hosts: Vec<String> = var("QUOTIENT_HOSTS")?
        .split(',')
        .map(str::to_string)
        .collect();
    let master_addr = var("MASTER_ADDR")?;
    let master_port: u16 = var("MASTER_PORT")?
        .parse()
        .map_err(|_| "MASTER_PORT is not a port".to_string())?;
    if number("NODE_RANK")? != rank || number("NNODES")? != nodes {
        return Err(
            "NODE_RANK or NNODES disagree with QUOTIENT_NODE_RANK, QUOTIENT_NUM_NODES".into(),
        );
    }
    if number("WORLD_SIZE")? != nodes * gpus {
        return Err(format!("WORLD_SIZE is not {nodes} x {gpus}"));
    }
    if hosts.len() != nodes as usize || hosts[0] != master_addr {
        return Err(format!(
            "QUOTIENT_HOSTS {hosts:?} and MASTER_ADDR {master_addr} disagree"
        ));
    }
    if rank == 0 {
        let listener = TcpListener::bind(("0.0.0.0", master_port))
            .map_err(|e| format!("rank 0 cannot listen on port {master_port}: {e}"))?;
        let mut peers = Vec::new();
        while peers.len() + 1 < nodes as usize {
            let (stream, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
            stream
                .set_read_timeout(Some(DEADLINE))
                .map_err(|e| e.to_string())?;
            let mut line = String::new();
            BufReader::new(&stream)
                .read_line(&mut line)
                .map_err(|e| format!("read a peer's rank: {e}"))?;
            let peer: u32 = line
                .trim()
                .strip_prefix("rank ")
                .and_then(|r| r.parse().ok())
                .ok_or_else(|| format!("a peer said {line:?}"))?;
            peers.push((peer, stream));
        }
        let mut met: Vec<u32> = peers.iter().map(|(r, _)| *r).collect();
        met.sort_unstable();
        for (_, stream) in &mut peers {
            writeln!(stream, "met {met:?}").map_err(|e| format!("answer a peer: {e}"))?;
        }
        Ok(format!(
            "rank 0 of {nodes}: met ranks {met:?} on port {master_port}"
        ))
    } else {
        let started = Instant::now();
        let mut stream = loop {
            match TcpStream::connect((master_addr.as_str(), master_port)) {
                Ok(stream) => break stream,
                Err(e) if started.elapsed() > DEADLINE => {
                    return Err(format!(
                        "cannot reach rank 0 at {master_addr}:{master_port}: {e}"
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        stream
            .set_read_timeout(Some(DEADLINE))
            .map_err(|e| e.to_string())?;
        writeln!(stream, "rank {rank}").map_err(|e| format!("send my rank: {e}"))?;
        let mut line = String::new();
        BufReader::new(&stream)
            .read_line(&mut line)
            .map_err(|e| format!("read rank 0's answer: {e}"))?;
        Ok(format!(
            "rank {rank} of {nodes}: rank 0 at {master_addr}:{master_port} answered {}",
            line.trim()
        ))
    }
}

fn main() {
    match run() {
        Ok(seen) => println!("{seen}"),
        Err(problem) => {
            println!("rendezvous failed: {problem}");
            std::process::exit(1);
        }
    }
}
