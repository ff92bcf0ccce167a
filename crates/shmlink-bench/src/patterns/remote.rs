//! `shmlink-bench --pattern remote`: topics across two "hosts", two network namespaces
//! joined by a veth pair, each with its own rendezvous directory (so no shared memory
//! crosses). Needs root (`ip netns`).
//!
//! Rows, all in the same run and interleaved over the rounds:
//! - **bridged**: a shmlink publisher on A, the `shmlink-zenoh` bridge on A exporting
//!   the topic, the bridge on B importing it, a shmlink subscriber on B;
//! - **zenoh**: pure Zenoh pub/sub between the same namespaces, `shmlink-zenoh-perf`
//!   (a peer-mode session with explicit endpoints, as Zenoh's `z_pub_thr`/`z_ping`
//!   examples drive it);
//! - **tcp**: shmlink's own fan-out: the publisher bound at `tcp:` on A, a remote
//!   subscriber on B;
//! - **redis**, **rabbitmq**: a private broker in B (`scripts/brokers.sh start` run in
//!   the namespace, bound to every address), the publisher on A.
//!
//! Measured for each: 64 B one-way p50 (paced, one message every `GAP_US`), 64 B,
//! 64 KiB and 1 MiB throughput (back to back), CPU per message of the processes on
//! each side (`/proc/PID/stat`, bridges and brokers included) and the bytes the veth
//! carried from A to B per message. Then three more tables: 8 subscribers on B (the
//! bytes crossing per message, B's CPU), and the local traffic of each host (a
//! publisher and a subscriber on A, the same on B) without bridges, with both bridges
//! running, and with A's bridge SIGKILLed mid-stream. The ends are
//! [`ends`]' child processes and `shmlink-zenoh-perf`; the two Zenoh programs are found
//! next to this one (`cargo build --release -p shmlink-zenoh`) or in
//! `$SHMLINK_ZENOH_BIN_DIR`, and their rows are skipped without them.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cli::{positive, Cli, UsageError};
use crate::pattern::{run_child, write_json, Pattern, ReportHead};
use shmlink_measure::stats::median_f64;

pub mod ends;

use ends::{Carrier, EndSpec, Role, END_CMD};

/// `--pattern remote`.
pub struct Remote;

impl Pattern for Remote {
    fn name(&self) -> &'static str {
        "remote"
    }

    fn help(&self) -> &'static str {
        "topics across two network namespaces joined by a veth pair (root; each with its
own rendezvous directory): shmlink -> shmlink-zenoh bridge -> Zenoh -> bridge ->
shmlink, pure Zenoh pub/sub (shmlink-zenoh-perf, peer mode), shmlink's tcp: remote
subscriber, Redis and RabbitMQ (a broker started in B by scripts/brokers.sh). 64 B
one-way p50, 64 B / 64 KiB / 1 MiB throughput, CPU per message on each side, veth bytes
per message; 8 subscribers on B; local p50 on each host without a bridge, with bridges,
with a bridge SIGKILLed mid-stream. Needs cargo build --release -p shmlink-zenoh (or
$SHMLINK_ZENOH_BIN_DIR) for the Zenoh rows. Options: --rounds [default: 3; --quick:
1], --quick, --json."
    }

    fn flags(&self) -> &'static [&'static str] {
        &["rounds", "quick", "json"]
    }

    fn child(&self, argv: &[String]) -> Option<ExitCode> {
        run_child(argv, &[(END_CMD, ends::main)])
    }

    fn run(&self, cli: &Cli) -> Result<ExitCode, UsageError> {
        let rounds: u32 = match &cli.rounds {
            Some(t) => positive(t, "--rounds")?,
            None if cli.quick => 1,
            None => 3,
        };
        Ok(run(
            &Counts::new(cli.quick),
            cli.quick,
            rounds,
            cli.json.as_deref(),
        ))
    }
}

/// Pause between the paced (latency) messages.
const GAP_US: u64 = 500;

/// Measured messages per run.
struct Counts {
    latency: u64,
    small: u64,
    medium: u64,
    large: u64,
    local: u64,
}

impl Counts {
    fn new(quick: bool) -> Counts {
        if quick {
            Counts {
                latency: 300,
                small: 3000,
                medium: 300,
                large: 30,
                local: 400,
            }
        } else {
            Counts {
                latency: 2000,
                small: 20_000,
                medium: 2000,
                large: 200,
                local: 3000,
            }
        }
    }
}

// ------------------------------------------------------------------------- the hosts

/// Prefix of the namespaces and the run's directory, followed by the bench's pid.
const PREFIX: &str = "shbr-";

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two network namespaces `a` and `b` joined by a veth pair, with their rendezvous
/// directories; removed on drop.
struct Net {
    ns: [String; 2],
    addr: [String; 2],
    veth: [String; 2],
    dir: [PathBuf; 2],
    root: PathBuf,
}

impl Net {
    fn new() -> Result<Net, String> {
        remove_stale();
        let pid = std::process::id();
        let id = format!("{PREFIX}{pid}");
        let root = std::env::temp_dir().join(&id);
        let subnet = 1 + pid % 250;
        let net = Net {
            ns: [format!("{id}-a"), format!("{id}-b")],
            addr: [format!("10.252.{subnet}.1"), format!("10.252.{subnet}.2")],
            veth: [
                format!("shbr{}a", pid % 1_000_000),
                format!("shbr{}b", pid % 1_000_000),
            ],
            dir: [root.join("a"), root.join("b")],
            root,
        };
        for i in 0..2 {
            std::fs::create_dir_all(&net.dir[i]).map_err(|e| e.to_string())?;
            ip(&["netns", "add", &net.ns[i]])?;
            ip(&["-n", &net.ns[i], "link", "set", "lo", "up"])?;
        }
        ip(&[
            "link",
            "add",
            &net.veth[0],
            "type",
            "veth",
            "peer",
            "name",
            &net.veth[1],
        ])?;
        for i in 0..2 {
            ip(&["link", "set", &net.veth[i], "netns", &net.ns[i]])?;
            let cidr = format!("{}/24", net.addr[i]);
            ip(&["-n", &net.ns[i], "addr", "add", &cidr, "dev", &net.veth[i]])?;
            ip(&["-n", &net.ns[i], "link", "set", &net.veth[i], "up"])?;
        }
        Ok(net)
    }

    /// Bytes sent by A's end of the veth (A to B).
    fn bytes_a_to_b(&self) -> Result<u64, String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns[0], "cat"])
            .arg(format!(
                "/sys/class/net/{}/statistics/tx_bytes",
                self.veth[0]
            ))
            .output()
            .map_err(|e| format!("ip netns exec: {e}"))?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| format!("veth counter: {}", String::from_utf8_lossy(&out.stderr)))
    }

    /// A command run in host `h`'s namespace with its rendezvous directory.
    fn command(&self, h: usize, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns[h], "env"])
            .arg(format!("SHMLINK_DIR={}", self.dir[h].display()))
            .arg(program);
        c
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = ip(&["netns", "delete", ns]);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Removes the namespaces and directories of runs whose process is gone.
fn remove_stale() {
    let stale = |name: &str| {
        name.strip_prefix(PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    if let Ok(dir) = std::fs::read_dir("/run/netns") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if stale(&name) {
                let _ = ip(&["netns", "delete", &name]);
            }
        }
    }
    if let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) {
        for e in dir.flatten() {
            if stale(&e.file_name().to_string_lossy()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// The CPU time of a process so far: each thread's (`/proc/PID/task/TID/schedstat`, in
/// ns) and the whole process's (`/proc/PID/stat`, user + system in 10 ms ticks, which
/// keeps the time of threads that ended).
#[derive(Clone, Default)]
struct CpuSample {
    threads: BTreeMap<String, u64>,
    stat_ns: u64,
}

fn cpu_sample(pid: u32) -> CpuSample {
    let mut s = CpuSample::default();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let text = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            if let Some(ns) = text.split_whitespace().next().and_then(|x| x.parse().ok()) {
                s.threads
                    .insert(t.file_name().to_string_lossy().into_owned(), ns);
            }
        }
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // utime and stime: the 12th and 13th fields after the command name, which is in
    // parentheses and may hold spaces.
    if let Some(rest) = stat.rfind(')').and_then(|i| stat.get(i + 2..)) {
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        if f.len() > 12 {
            s.stat_ns = (f[11] + f[12]) * 10_000_000;
        }
    }
    s
}

/// The CPU time between two samples of one process, in µs: the threads' (a thread that
/// ended in between loses its part), or the process's ticks if they say more.
fn cpu_delta_us(a: &CpuSample, b: &CpuSample) -> f64 {
    let threads: u64 = b
        .threads
        .iter()
        .map(|(tid, ns)| ns.saturating_sub(a.threads.get(tid).copied().unwrap_or(0)))
        .sum();
    threads.max(b.stat_ns.saturating_sub(a.stat_ns)) as f64 / 1e3
}

// ------------------------------------------------------------------------ processes

/// A child process in a host: its stdout lines on a channel; killed on drop.
struct Proc {
    name: String,
    host: usize,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    log: PathBuf,
}

impl Proc {
    fn start(name: &str, host: usize, mut cmd: Command, log: PathBuf) -> Result<Proc, String> {
        let err = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("{name}: {e}"))?;
        let out = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Ok(Proc {
            name: name.to_string(),
            host,
            stdin: child.stdin.take(),
            child,
            lines,
            log,
        })
    }

    /// The next line starting with `prefix`, within `timeout`.
    fn expect(&mut self, prefix: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Ok(l),
                Ok(_) => {}
                Err(_) => {
                    let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                    let tail: Vec<&str> = log.lines().rev().take(3).collect();
                    return Err(format!(
                        "{}: no {prefix:?} within {timeout:?} (exit {:?}; stderr: {})",
                        self.name,
                        self.child.try_wait().ok().flatten(),
                        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                    ));
                }
            }
        }
    }

    fn tell(&mut self, line: &str) {
        if let Some(s) = &mut self.stdin {
            let _ = writeln!(s, "{line}");
        }
    }

    /// Closes stdin (the ends exit) or sends SIGTERM (the bridges), then waits, killing
    /// after 5 s.
    fn stop(&mut self, term: bool) {
        self.stdin = None;
        if term {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Parses `key=value` fields of a line.
fn fields(line: &str) -> BTreeMap<&str, f64> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
        .collect()
}

// ---------------------------------------------------------------------- one transfer

/// What a row sends through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Way {
    Bridged,
    Zenoh,
    Tcp,
    Redis,
    Rabbitmq,
}

impl Way {
    const ALL: [Way; 5] = [
        Way::Bridged,
        Way::Zenoh,
        Way::Tcp,
        Way::Redis,
        Way::Rabbitmq,
    ];

    fn label(self) -> &'static str {
        match self {
            Way::Bridged => "shmlink > bridge > Zenoh > bridge > shmlink",
            Way::Zenoh => "Zenoh pub/sub (peer, z_pub_thr-style)",
            Way::Tcp => "shmlink tcp: remote subscriber",
            Way::Redis => "Redis pub/sub (broker on B)",
            Way::Rabbitmq => "RabbitMQ fanout (broker on B)",
        }
    }
}

/// One end to start: in host `host`, a bench end or `shmlink-zenoh-perf` with `args`.
struct End {
    host: usize,
    name: String,
    program: PathBuf,
    args: Vec<String>,
    role: Role,
}

/// A run: its ends, the bridges' arguments (A's, B's) if any, and whether A's bridge is
/// SIGKILLed halfway through the measured messages.
struct Run {
    ends: Vec<End>,
    bridges: Option<[Vec<String>; 2]>,
    kill_bridge_a: Option<Duration>,
    /// Broker processes in B whose CPU counts for B.
    broker_pids: Vec<u32>,
}

/// What a receiver reported.
#[derive(Clone, Debug, Serialize)]
struct Received {
    name: String,
    host: usize,
    count: u64,
    lost: u64,
    p50_ns: u64,
    p99_ns: u64,
    max_ns: u64,
    first_ns: u64,
    last_ns: u64,
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
struct Outcome {
    received: Vec<Received>,
    /// The first sender's start and end (ns, CLOCK_MONOTONIC).
    start_ns: u64,
    /// Measured messages each sender sent.
    sent: u64,
    /// CPU of the processes of each host over the measured part, µs.
    cpu_us: [f64; 2],
    /// Bytes A's veth sent during the measured part.
    bytes_a_to_b: u64,
}

impl Outcome {
    /// Messages/s of the slowest receiver: its count over the time from the first send
    /// to its last receive.
    fn msgs_per_s(&self) -> f64 {
        self.received
            .iter()
            .map(|r| r.count as f64 / ((r.last_ns.saturating_sub(self.start_ns)) as f64 / 1e9))
            .fold(f64::INFINITY, f64::min)
    }
}

/// Runs `run` in `net`.
fn measure(net: &Net, run: &Run, log_dir: &Path, timeout: Duration) -> Result<Outcome, String> {
    let mut bridges = Vec::new();
    if let Some(args) = &run.bridges {
        let exe = zenoh_program("shmlink-zenoh")?;
        for (h, a) in args.iter().enumerate() {
            let mut c = net.command(h, &exe);
            c.args(a);
            let name = format!("bridge-{}", ["a", "b"][h]);
            let mut p = Proc::start(&name, h, c, log_dir.join(format!("{name}.log")))?;
            p.expect("ready", Duration::from_secs(30))?;
            bridges.push(p);
        }
    }
    let mut procs = Vec::new();
    for e in &run.ends {
        let mut c = net.command(e.host, &e.program);
        c.args(&e.args);
        let p = Proc::start(&e.name, e.host, c, log_dir.join(format!("{}.log", e.name)))?;
        procs.push((p, e.role));
    }
    for (p, role) in procs.iter_mut() {
        if *role == Role::Send {
            p.expect("ready", Duration::from_secs(30))?;
        }
    }
    for (p, role) in procs.iter_mut() {
        if *role == Role::Recv {
            p.expect("ready", Duration::from_secs(60))?;
        }
    }
    if bridges.len() == 2 {
        // Both bridges have found every topic they export (they look every 500 ms).
        std::thread::sleep(Duration::from_millis(1200));
    }
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
    for (p, role) in procs.iter_mut() {
        if *role == Role::Send {
            p.tell("go");
        }
    }
    if let Some(after) = run.kill_bridge_a {
        std::thread::sleep(after);
        if let Some(b) = bridges.first_mut() {
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
                let line = p.expect("sent", timeout)?;
                let f = fields(&line);
                start_ns = start_ns.min(f.get("start_ns").copied().unwrap_or(0.0) as u64);
                sent = f.get("count").copied().unwrap_or(0.0) as u64;
            }
            Role::Recv => {
                let line = p.expect("result", timeout)?;
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

/// The Zenoh programs: `$SHMLINK_ZENOH_BIN_DIR/NAME`, else next to this program.
fn zenoh_program(name: &str) -> Result<PathBuf, String> {
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

/// The brokers in B: their addresses and processes, stopped on drop.
struct Brokers {
    ns: String,
    dir: PathBuf,
    redis: Result<String, String>,
    rabbitmq: Result<String, String>,
    pids: Vec<u32>,
}

impl Brokers {
    /// Starts them in namespace `ns` (host B, address `b`), state in `dir`.
    fn start(ns: String, dir: PathBuf, b: String) -> Brokers {
        let script = super::containers::root().join("scripts/brokers.sh");
        let out = Command::new("ip")
            .args(["netns", "exec", &ns])
            .arg(&script)
            .arg("start")
            .env("SHMLINK_BROKERS_DIR", &dir)
            .env("SHMLINK_BROKERS_BIND", "0.0.0.0")
            .stdin(Stdio::null())
            .output();
        let why = match &out {
            Ok(o) => format!(
                "scripts/brokers.sh start in B failed: {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ),
            Err(e) => format!("scripts/brokers.sh: {e}"),
        };
        let pid = |f: &str| -> Option<u32> {
            std::fs::read_to_string(dir.join(f))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let redis_pid = pid("redis/redis.pid");
        let rabbit_pid = pid("rabbitmq/rabbitmq.pid");
        Brokers {
            ns,
            redis: redis_pid
                .map(|_| format!("{b}:16379"))
                .ok_or_else(|| why.clone()),
            rabbitmq: rabbit_pid
                .filter(|_| out.as_ref().is_ok_and(|o| o.status.success()))
                .map(|_| format!("{b}:15673"))
                .ok_or(why),
            pids: redis_pid.into_iter().chain(rabbit_pid).collect(),
            dir,
        }
    }
}

impl Drop for Brokers {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(super::containers::root().join("scripts/brokers.sh"))
            .arg("stop")
            .env("SHMLINK_BROKERS_DIR", &self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The pieces a run is made of.
struct Ctx<'a> {
    net: &'a Net,
    /// The brokers, once started (by a thread with `--quick`).
    brokers: std::cell::OnceCell<Brokers>,
    starting: std::cell::Cell<Option<std::thread::JoinHandle<Brokers>>>,
    exe: PathBuf,
    /// A fresh port per run.
    port: std::cell::Cell<u16>,
}

impl Drop for Ctx<'_> {
    fn drop(&mut self) {
        // Brokers started but never used are stopped too.
        if let Some(h) = self.starting.take() {
            let _ = h.join();
        }
    }
}

impl Ctx<'_> {
    fn brokers(&self) -> &Brokers {
        self.brokers.get_or_init(|| {
            let h = self.starting.take().expect("started once");
            let b = h.join().expect("the brokers' thread does not panic");
            eprintln!("brokers started");
            b
        })
    }

    fn port(&self) -> u16 {
        let p = self.port.get();
        self.port.set(p + 1);
        p
    }

    fn bench_end(&self, host: usize, name: String, spec: EndSpec) -> End {
        End {
            host,
            name,
            program: self.exe.clone(),
            args: vec![
                END_CMD.to_string(),
                serde_json::to_string(&spec).expect("serializable"),
            ],
            role: spec.role,
        }
    }

    /// A transfer from A to `subs` receivers on B through `way`.
    fn transfer(
        &self,
        way: Way,
        size: usize,
        throughput: bool,
        count: u64,
        subs: usize,
    ) -> Result<Run, String> {
        let spec = |role, carrier, addr: &str| EndSpec {
            role,
            carrier,
            addr: addr.to_string(),
            channel: format!("shmlink-bench-remote-{}", std::process::id()),
            size,
            count,
            gap_us: GAP_US,
            throughput,
        };
        let topic = format!("bench-remote-{}", self.port.get());
        let a = &self.net.addr[0];
        let mut run = Run {
            ends: Vec::new(),
            bridges: None,
            kill_bridge_a: None,
            broker_pids: Vec::new(),
        };
        let (send_spec, recv_spec) = match way {
            Way::Bridged => {
                zenoh_program("shmlink-zenoh")?;
                let port = self.port();
                run.bridges = Some([
                    vec![
                        "--export".into(),
                        topic.clone(),
                        "--listen".into(),
                        format!("tcp/{a}:{port}"),
                    ],
                    vec![
                        "--import".into(),
                        topic.clone(),
                        "--connect".into(),
                        format!("tcp/{a}:{port}"),
                    ],
                ]);
                let addr = format!("shm:{topic}");
                (
                    spec(Role::Send, Carrier::Shmlink, &addr),
                    spec(Role::Recv, Carrier::Shmlink, &addr),
                )
            }
            Way::Tcp => {
                let addr = format!("tcp:{a}:{}", self.port());
                (
                    spec(Role::Send, Carrier::Shmlink, &addr),
                    spec(Role::Recv, Carrier::Shmlink, &addr),
                )
            }
            Way::Redis | Way::Rabbitmq => {
                let (carrier, addr) = match way {
                    Way::Redis => (Carrier::Redis, &self.brokers().redis),
                    _ => (Carrier::Rabbitmq, &self.brokers().rabbitmq),
                };
                let addr = addr.as_ref().map_err(Clone::clone)?;
                run.broker_pids = self.brokers().pids.clone();
                (
                    spec(Role::Send, carrier, addr),
                    spec(Role::Recv, carrier, addr),
                )
            }
            Way::Zenoh => {
                let exe = zenoh_program("shmlink-zenoh-perf")?;
                let endpoint = format!("tcp/{a}:{}", self.port());
                let common = |role: &str, ep: &str| {
                    let mut v: Vec<String> = [
                        role,
                        "--key",
                        &format!("shmlink-bench/{topic}"),
                        "--size",
                        &size.to_string(),
                        "--count",
                        &count.to_string(),
                        "--gap-us",
                        &GAP_US.to_string(),
                        ep,
                        &endpoint,
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                    if throughput {
                        v.push("--throughput".into());
                    }
                    v
                };
                run.ends.push(End {
                    host: 0,
                    name: "zenoh-send".into(),
                    program: exe.clone(),
                    args: common("send", "--listen"),
                    role: Role::Send,
                });
                for i in 0..subs {
                    run.ends.push(End {
                        host: 1,
                        name: format!("zenoh-recv-{i}"),
                        program: exe.clone(),
                        args: common("recv", "--connect"),
                        role: Role::Recv,
                    });
                }
                return Ok(run);
            }
        };
        run.ends.push(self.bench_end(0, "send".into(), send_spec));
        for i in 0..subs {
            run.ends
                .push(self.bench_end(1, format!("recv-{i}"), recv_spec.clone()));
        }
        Ok(run)
    }

    /// Local traffic on each host (a publisher and a subscriber of topic `local-a` on
    /// A, of `local-b` on B), 64 B paced; with `bridges`, A's bridge exports `local-a`
    /// and imports `local-b`, B's the other way round; with `kill`, A's bridge is
    /// SIGKILLed halfway through.
    fn local(&self, count: u64, bridges: bool, kill: bool) -> Run {
        let serial = self.port();
        let spec = |role, h: usize| EndSpec {
            role,
            carrier: Carrier::Shmlink,
            addr: format!("shm:local-{}-{serial}", ["a", "b"][h]),
            channel: String::new(),
            size: 64,
            count,
            gap_us: GAP_US,
            throughput: false,
        };
        let mut ends = Vec::new();
        for h in 0..2 {
            ends.push(self.bench_end(h, format!("local-send-{h}"), spec(Role::Send, h)));
            ends.push(self.bench_end(h, format!("local-recv-{h}"), spec(Role::Recv, h)));
        }
        let a = &self.net.addr[0];
        let port = self.port();
        let t = |h: usize| format!("local-{}-{serial}", ["a", "b"][h]);
        Run {
            ends,
            bridges: bridges.then(|| {
                [
                    vec![
                        "--export".into(),
                        t(0),
                        "--import".into(),
                        t(1),
                        "--listen".into(),
                        format!("tcp/{a}:{port}"),
                    ],
                    vec![
                        "--export".into(),
                        t(1),
                        "--import".into(),
                        t(0),
                        "--connect".into(),
                        format!("tcp/{a}:{port}"),
                    ],
                ]
            }),
            kill_bridge_a: kill.then(|| Duration::from_micros(count * (GAP_US + 60) / 2)),
            broker_pids: Vec::new(),
        }
    }
}

// --------------------------------------------------------------------------- the suite

/// A measurement of the suite: its table, row and column.
#[derive(Clone, Debug, Serialize)]
struct Cell {
    table: &'static str,
    row: String,
    column: &'static str,
    /// `ok`, `skipped` or `failed`.
    status: &'static str,
    note: Option<String>,
    runs: Vec<Outcome>,
}

/// How a cell's run is made.
#[derive(Clone, Copy)]
enum Kind {
    Transfer {
        way: Way,
        size: usize,
        throughput: bool,
        subs: usize,
    },
    Local {
        bridges: bool,
        kill: bool,
    },
}

const MAIN: &str = "main";
const FANOUT: &str = "fanout";
const LOCAL: &str = "local";

fn plan() -> Vec<(Cell, Kind)> {
    let cell = |table, row: String, column| Cell {
        table,
        row,
        column,
        status: "ok",
        note: None,
        runs: Vec::new(),
    };
    let mut v = Vec::new();
    for way in Way::ALL {
        for (column, size, throughput) in [
            ("64 B latency", 64, false),
            ("64 B throughput", 64, true),
            ("64 KiB throughput", 64 << 10, true),
            ("1 MiB throughput", 1 << 20, true),
        ] {
            v.push((
                cell(MAIN, way.label().into(), column),
                Kind::Transfer {
                    way,
                    size,
                    throughput,
                    subs: 1,
                },
            ));
        }
    }
    for way in [Way::Bridged, Way::Zenoh, Way::Tcp] {
        v.push((
            cell(
                FANOUT,
                way.label().into(),
                "64 KiB throughput, 8 subscribers on B",
            ),
            Kind::Transfer {
                way,
                size: 64 << 10,
                throughput: true,
                subs: 8,
            },
        ));
    }
    for (row, bridges, kill) in [
        ("no bridge", false, false),
        ("both bridges running", true, false),
        ("A's bridge SIGKILLed mid-stream", true, true),
    ] {
        v.push((
            cell(LOCAL, row.into(), "64 B latency"),
            Kind::Local { bridges, kill },
        ));
    }
    v
}

fn run(counts: &Counts, quick: bool, rounds: u32, json: Option<&Path>) -> ExitCode {
    if !crate::sys::is_root() {
        eprintln!("shmlink-bench: --pattern remote needs root (ip netns); skipped");
        println!("# remote: skipped [root]: needs root for ip netns");
        return ExitCode::SUCCESS;
    }
    let t0 = Instant::now();
    let net = match Net::new() {
        Ok(n) => n,
        Err(e) => {
            eprintln!("shmlink-bench: remote: {e}");
            return ExitCode::from(1);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("shmlink-bench: find this program: {e}");
            return ExitCode::from(1);
        }
    };
    let logs = net.root.join("logs");
    let _ = std::fs::create_dir_all(&logs);
    // scripts/brokers.sh start takes ~25 s here (RabbitMQ); --quick starts them while the
    // other rows run (their first round shares the CPUs with it), a full run first.
    eprintln!("starting the brokers in B (scripts/brokers.sh start)");
    let (ns, dir, b) = (
        net.ns[1].clone(),
        net.root.join("brokers"),
        net.addr[1].clone(),
    );
    let starting = std::thread::spawn(move || Brokers::start(ns, dir, b));
    let ctx = Ctx {
        net: &net,
        brokers: std::cell::OnceCell::new(),
        starting: std::cell::Cell::new(Some(starting)),
        exe,
        port: std::cell::Cell::new(17000),
    };
    if !quick {
        ctx.brokers();
    }
    println!(
        "# shmlink-bench --pattern remote: hosts A ({}) and B ({}), network namespaces joined \
         by a veth pair, each with its own rendezvous directory; {rounds} round(s), medians",
        net.addr[0], net.addr[1]
    );
    let mut cells = plan();
    let total = cells.len() * rounds as usize;
    let mut done = 0;
    for round in 0..rounds {
        for (cell, kind) in cells.iter_mut() {
            done += 1;
            if cell.status != "ok" {
                continue;
            }
            let (run, count) = match *kind {
                Kind::Transfer {
                    way,
                    size,
                    throughput,
                    subs,
                } => {
                    let count = match (size, throughput) {
                        (_, false) => counts.latency,
                        (64, true) => counts.small,
                        (s, true) if s <= 64 << 10 => counts.medium,
                        _ => counts.large,
                    };
                    (ctx.transfer(way, size, throughput, count, subs), count)
                }
                Kind::Local { bridges, kill } => {
                    let run = match bridges {
                        true => zenoh_program("shmlink-zenoh").map(|_| ()),
                        false => Ok(()),
                    };
                    (
                        run.map(|()| ctx.local(counts.local, bridges, kill)),
                        counts.local,
                    )
                }
            };
            let run = match run {
                Ok(r) => r,
                Err(why) => {
                    cell.status = "skipped";
                    cell.note = Some(why);
                    continue;
                }
            };
            let timeout = Duration::from_secs(60 + count / 100);
            let t = Instant::now();
            let dir = logs.join(format!("{done}"));
            let _ = std::fs::create_dir_all(&dir);
            match measure(&net, &run, &dir, timeout) {
                Ok(o) => cell.runs.push(o),
                Err(e) => {
                    eprintln!("shmlink-bench: remote: {} / {}: {e}", cell.row, cell.column);
                    cell.status = "failed";
                    cell.note = Some(format!("round {}: {e}", round + 1));
                }
            }
            eprintln!(
                "[{done}/{total}] round {}: {} / {}: {:.1} s",
                round + 1,
                cell.row,
                cell.column,
                t.elapsed().as_secs_f64()
            );
        }
    }
    let cells: Vec<Cell> = cells.into_iter().map(|(c, _)| c).collect();
    print!("{}", table(&cells));
    println!("\n# {:.1} s", t0.elapsed().as_secs_f64());
    let failed = cells.iter().filter(|c| c.status == "failed").count();
    #[derive(Serialize)]
    struct Report<'a> {
        #[serde(flatten)]
        head: ReportHead,
        rounds: u32,
        cells: &'a [Cell],
    }
    let written = write_json(
        json,
        &Report {
            head: ReportHead::new("shmlink-bench/remote/1", "remote"),
            rounds,
            cells: &cells,
        },
    );
    drop(ctx);
    drop(net);
    if failed > 0 || !written {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

// ---------------------------------------------------------------------------- the table

/// The median over a cell's runs of `f`.
fn med(c: &Cell, f: impl Fn(&Outcome) -> f64) -> Option<f64> {
    median_f64(&c.runs.iter().map(f).collect::<Vec<_>>())
}

fn p50_us(o: &Outcome, host: usize) -> f64 {
    o.received
        .iter()
        .filter(|r| r.host == host)
        .map(|r| r.p50_ns as f64 / 1e3)
        .fold(0.0, f64::max)
}

fn p99_us(o: &Outcome, host: usize) -> f64 {
    o.received
        .iter()
        .filter(|r| r.host == host)
        .map(|r| r.p99_ns as f64 / 1e3)
        .fold(0.0, f64::max)
}

fn per_msg(o: &Outcome, total: f64) -> f64 {
    total / o.sent.max(1) as f64
}

/// A figure, or the cell's status.
fn fig(c: Option<&Cell>, f: impl Fn(&Cell) -> Option<f64>, prec: usize) -> String {
    match c {
        None => "-".into(),
        Some(c) if c.status != "ok" || c.runs.is_empty() => c.status.into(),
        Some(c) => f(c).map_or("-".into(), |x| format!("{x:.prec$}")),
    }
}

/// The suite's tables, and the notes of the cells not measured.
fn table(cells: &[Cell]) -> String {
    let find = |t: &str, row: &str, col: &str| {
        cells
            .iter()
            .find(|c| c.table == t && c.row == row && c.column == col)
    };
    let mut s = String::new();
    s += &format!(
        "\n{:<44} {:>9} {:>10} {:>9} {:>9} {:>8} {:>8} {:>9}\n",
        "A -> B, 1 subscriber on B",
        "64B p50us",
        "64B msg/s",
        "64KiB MB/s",
        "1MiB MB/s",
        "cpuA us",
        "cpuB us",
        "B/msg"
    );
    for way in Way::ALL {
        let row = way.label();
        let lat = find(MAIN, row, "64 B latency");
        let small = find(MAIN, row, "64 B throughput");
        let mb = |col| {
            fig(
                find(MAIN, row, col),
                |c| {
                    let size = if col == "1 MiB throughput" {
                        1 << 20
                    } else {
                        64 << 10
                    };
                    med(c, |o| o.msgs_per_s() * size as f64 / 1e6)
                },
                1,
            )
        };
        s += &format!(
            "{:<44} {:>9} {:>10} {:>9} {:>9} {:>8} {:>8} {:>9}\n",
            row,
            fig(lat, |c| med(c, |o| p50_us(o, 1)), 1),
            fig(small, |c| med(c, Outcome::msgs_per_s), 0),
            mb("64 KiB throughput"),
            mb("1 MiB throughput"),
            fig(small, |c| med(c, |o| per_msg(o, o.cpu_us[0])), 2),
            fig(small, |c| med(c, |o| per_msg(o, o.cpu_us[1])), 2),
            fig(small, |c| med(c, |o| per_msg(o, o.bytes_a_to_b as f64)), 0),
        );
    }
    s += "  (p50: one-way, paced; cpu: us per message of every process on that side, bridges \
          and brokers included, 64 B throughput run; B/msg: bytes A's veth sent per 64 B message)\n";
    let col = "64 KiB throughput, 8 subscribers on B";
    s += &format!(
        "\n{:<44} {:>10} {:>12} {:>9} {:>9}\n",
        "A -> B, 8 subscribers on B, 64 KiB", "msg/s", "veth B/msg", "cpuA us", "cpuB us"
    );
    for way in [Way::Bridged, Way::Zenoh, Way::Tcp] {
        let c = find(FANOUT, way.label(), col);
        s += &format!(
            "{:<44} {:>10} {:>12} {:>9} {:>9}\n",
            way.label(),
            fig(c, |c| med(c, Outcome::msgs_per_s), 0),
            fig(c, |c| med(c, |o| per_msg(o, o.bytes_a_to_b as f64)), 0),
            fig(c, |c| med(c, |o| per_msg(o, o.cpu_us[0])), 1),
            fig(c, |c| med(c, |o| per_msg(o, o.cpu_us[1])), 1),
        );
    }
    s += "  (veth B/msg: bytes A's veth sent per message; cpuB: B's subscribers + bridge, \
          per message)\n";
    s += &format!(
        "\n{:<44} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}\n",
        "local 64 B, publisher + subscriber per host",
        "A p50 us",
        "A p99 us",
        "B p50 us",
        "B p99 us",
        "A x",
        "B x"
    );
    let base = find(LOCAL, "no bridge", "64 B latency");
    for row in [
        "no bridge",
        "both bridges running",
        "A's bridge SIGKILLed mid-stream",
    ] {
        let c = find(LOCAL, row, "64 B latency");
        let ratio = |h: usize| {
            fig(
                c,
                |c| {
                    let b = base
                        .filter(|b| b.status == "ok")
                        .and_then(|b| med(b, |o| p50_us(o, h)))?;
                    Some(med(c, |o| p50_us(o, h))? / b)
                },
                2,
            )
        };
        s += &format!(
            "{:<44} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7}\n",
            row,
            fig(c, |c| med(c, |o| p50_us(o, 0)), 1),
            fig(c, |c| med(c, |o| p99_us(o, 0)), 1),
            fig(c, |c| med(c, |o| p50_us(o, 1)), 1),
            fig(c, |c| med(c, |o| p99_us(o, 1)), 1),
            ratio(0),
            ratio(1),
        );
    }
    s += "  (x: p50 over the no-bridge run's)\n";
    for c in cells.iter().filter(|c| c.status != "ok") {
        s += &format!(
            "# {} / {}: {}: {}\n",
            c.row,
            c.column,
            c.status,
            c.note.as_deref().unwrap_or("")
        );
    }
    s
}
