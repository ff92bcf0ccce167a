//! `--pattern remote`'s one transfer: the ends of a run, started in their hosts, and what
//! they measured.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::ends::Role;
use serde::Serialize;

use super::hosts::*;

// ---------------------------------------------------------------------- one transfer

/// What a row sends through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Way {
    Bridged,
    Exporting,
    Importing,
    Zenoh,
    ZenohAttached,
    Tcp,
    Redis,
    Rabbitmq,
}

impl Way {
    pub(super) const ALL: [Way; 8] = [
        Way::Bridged,
        Way::Exporting,
        Way::Importing,
        Way::Zenoh,
        Way::ZenohAttached,
        Way::Tcp,
        Way::Redis,
        Way::Rabbitmq,
    ];

    pub(super) fn label(self) -> &'static str {
        match self {
            Way::Bridged => "shmlink > bridge > Zenoh > bridge > shmlink",
            Way::Exporting => "exporting pub > Zenoh > bridge > shmlink",
            Way::Importing => "exporting pub > Zenoh > importing sub",
            Way::Zenoh => "Zenoh pub/sub (peer, z_pub_thr-style)",
            Way::ZenohAttached => "Zenoh pub/sub, 37-byte attachment",
            Way::Tcp => "shmlink tcp: remote subscriber",
            Way::Redis => "Redis pub/sub (broker on B)",
            Way::Rabbitmq => "RabbitMQ fanout (broker on B)",
        }
    }
}

/// One end to start: in host `host`, a bench end or `shmlink-zenoh-perf` with `args`.
pub(super) struct End {
    pub(super) host: usize,
    pub(super) name: String,
    pub(super) program: PathBuf,
    pub(super) args: Vec<String>,
    pub(super) role: Role,
}

/// A run: its ends, the arguments of A's and B's bridge (none where `None`), and whether
/// A's bridge is SIGKILLed halfway through the measured messages.
pub(super) struct Run {
    pub(super) ends: Vec<End>,
    pub(super) bridges: [Option<Vec<String>>; 2],
    pub(super) kill_bridge_a: Option<Duration>,
    /// Start the receiving ends only once the bridges subscribed to the senders' topics.
    pub(super) late_subscribers: bool,
    /// Broker processes in B whose CPU counts for B.
    pub(super) broker_pids: Vec<u32>,
}

/// What a receiver reported.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Received {
    pub(super) name: String,
    pub(super) host: usize,
    pub(super) count: u64,
    pub(super) lost: u64,
    pub(super) p50_ns: u64,
    pub(super) p99_ns: u64,
    pub(super) max_ns: u64,
    pub(super) first_ns: u64,
    pub(super) last_ns: u64,
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Outcome {
    pub(super) received: Vec<Received>,
    /// The first sender's start and end (ns, CLOCK_MONOTONIC).
    pub(super) start_ns: u64,
    /// Measured messages each sender sent.
    pub(super) sent: u64,
    /// CPU of the processes of each host over the measured part, µs.
    pub(super) cpu_us: [f64; 2],
    /// Bytes A's veth sent during the measured part.
    pub(super) bytes_a_to_b: u64,
}

impl Outcome {
    /// Messages/s of the slowest receiver: its count over the time from the first send
    /// to its last receive.
    pub(super) fn msgs_per_s(&self) -> f64 {
        self.received
            .iter()
            .map(|r| r.count as f64 / ((r.last_ns.saturating_sub(self.start_ns)) as f64 / 1e9))
            .fold(f64::INFINITY, f64::min)
    }
}

/// Runs `run` in `net`; fails if its sender and receivers have not all reported within
/// `budget` of `go`.
pub(super) fn measure(
    net: &Net,
    run: &Run,
    log_dir: &Path,
    budget: Duration,
) -> Result<Outcome, String> {
    let mut bridges = Vec::new();
    for (h, a) in run.bridges.iter().enumerate() {
        if let Some(a) = a {
            let exe = zenoh_program("shmlink-zenoh")?;
            let mut c = net.command(h, &exe);
            c.args(a);
            let name = format!("bridge-{}", ["a", "b"][h]);
            let mut p = Proc::start(&name, h, c, log_dir.join(format!("{name}.log")))?;
            p.expect("ready", Duration::from_secs(30))?;
            bridges.push(p);
        }
    }
    let late = |e: &End| run.late_subscribers && e.role == Role::Recv;
    let mut procs = Vec::new();
    start_ends(net, run, log_dir, &mut procs, |e| !late(e))?;
    if !bridges.is_empty() {
        // The bridges have found every topic they export (they look every 500 ms).
        std::thread::sleep(Duration::from_millis(1200));
    }
    start_ends(net, run, log_dir, &mut procs, late)?;
    // Every process of each side: the ends, the bridges (A's first), the brokers on B.
    let pids: Vec<(usize, u32)> = procs
        .iter()
        .map(|(p, _)| (p.host, p.child.id()))
        .chain(bridges.iter().map(|b| (b.host, b.child.id())))
        .chain(run.broker_pids.iter().map(|&pid| (1, pid)))
        .collect();
    let cpu0: Vec<CpuSample> = pids.iter().map(|&(_, pid)| cpu_sample(pid)).collect();
    let mut cpu1: Vec<Option<CpuSample>> = vec![None; pids.len()];
    let bytes0 = net.bytes_a_to_b()?;
    let deadline = Instant::now() + budget;
    let left = || deadline.saturating_duration_since(Instant::now());
    for (p, role) in procs.iter_mut() {
        if *role == Role::Send {
            p.tell("go");
        }
    }
    if let Some(after) = run.kill_bridge_a {
        std::thread::sleep(after);
        if let Some(b) = bridges.iter_mut().find(|b| b.host == 0) {
            cpu1[procs.len()] = Some(cpu_sample(b.child.id()));
            let _ = b.child.kill();
            let _ = b.child.wait();
        }
    }
    let mut start_ns = u64::MAX;
    let mut sent = 0;
    let mut received = Vec::new();
    for (p, role) in procs.iter_mut() {
        match role {
            Role::Send => {
                let line = p.expect("sent", left())?;
                let f = fields(&line);
                start_ns = start_ns.min(f.get("start_ns").copied().unwrap_or(0.0) as u64);
                sent = f.get("count").copied().unwrap_or(0.0) as u64;
            }
            Role::Recv => {
                let line = p.expect("result", left())?;
                let f = fields(&line);
                let g = |k: &str| f.get(k).copied().unwrap_or(0.0) as u64;
                received.push(Received {
                    name: p.name.clone(),
                    host: p.host,
                    count: g("count"),
                    lost: g("lost"),
                    p50_ns: g("p50_ns"),
                    p99_ns: g("p99_ns"),
                    max_ns: g("max_ns"),
                    first_ns: g("first_ns"),
                    last_ns: g("last_ns"),
                });
            }
        }
    }
    let mut cpu_us = [0.0f64; 2];
    for (i, &(host, pid)) in pids.iter().enumerate() {
        let end = cpu1[i].take().unwrap_or_else(|| cpu_sample(pid));
        cpu_us[host] += cpu_delta_us(&cpu0[i], &end);
    }
    let bytes1 = net.bytes_a_to_b()?;
    for (p, _) in procs.iter_mut() {
        p.stop(false);
    }
    for b in bridges.iter_mut() {
        b.stop(true);
    }
    for r in &received {
        if r.count == 0 {
            return Err(format!("{} received no measured message", r.name));
        }
    }
    Ok(Outcome {
        received,
        start_ns,
        sent,
        cpu_us,
        bytes_a_to_b: bytes1.saturating_sub(bytes0),
    })
}

/// Starts the ends `which` picks and waits until each is ready (senders first).
fn start_ends(
    net: &Net,
    run: &Run,
    log_dir: &Path,
    procs: &mut Vec<(Proc, Role)>,
    which: impl Fn(&End) -> bool,
) -> Result<(), String> {
    let first = procs.len();
    for e in run.ends.iter().filter(|e| which(e)) {
        let mut c = net.command(e.host, &e.program);
        c.args(&e.args);
        let p = Proc::start(&e.name, e.host, c, log_dir.join(format!("{}.log", e.name)))?;
        procs.push((p, e.role));
    }
    for (role, wait) in [(Role::Send, 30), (Role::Recv, 60)] {
        for (p, r) in procs[first..].iter_mut() {
            if *r == role {
                p.expect("ready", Duration::from_secs(wait))?;
            }
        }
    }
    Ok(())
}

/// The Zenoh programs: `$SHMLINK_ZENOH_BIN_DIR/NAME`, else next to this program.
pub(super) fn zenoh_program(name: &str) -> Result<PathBuf, String> {
    let dir = match std::env::var_os("SHMLINK_ZENOH_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
    };
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "no {} (cargo build --release -p shmlink-zenoh, or set SHMLINK_ZENOH_BIN_DIR)",
            p.display()
        ))
    }
}
