//! `shmlink-bench --pattern async`: async Rust on tokio, in one run.
//!
//! - **Round trip**, 64 B (or `--sizes`): `shmlink::tokio::Connection` with the spin
//!   budget (20 µs) and with spinning off, against tokio's `UnixStream` and `TcpStream`
//!   with tokio-util's length-prefix codec (`LengthDelimitedCodec`). Each end is a
//!   current-thread runtime in its own process (the server is this program re-executed),
//!   pinned like the point-to-point bench: the client to the first allowed CPU, the
//!   server to the second (cross-core; one CPU only: both on it).
//! - **tonic unary**, 64 B echo (`shmlink.echo.Echo/Unary` of `shmlink-grpc`) over
//!   `shm:`, over a Unix socket and over TCP, with 1 and 16 concurrent callers on one
//!   channel: requests/s, p50, p99. Server and client are current-thread runtimes in two
//!   processes, pinned like the round trips (a multi-threaded runtime adds cross-worker
//!   wake-ups, which on this class of VM cost tens of µs each and drown the transport).
//!
//! Methods are interleaved over the rounds (A B C A B C …), each run with its own
//! warm-up; the table shows the median over the rounds of each figure.
//!
//! Every echo is compared with the message sent, byte for byte.
//! `SHMLINK_BENCH_FAULT=corrupt:N|scribble:N` makes the client send message #N (and on,
//! for scribble) damaged while it still expects the intact one back (for tests: the run
//! must fail). Messages are numbered from 0 over the warm-up and the measured part; in a
//! tonic run with C callers, caller k's call i is #(warm-up + i·C + k).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use shmlink::{Options, WaitPolicy};
use shmlink_grpc::echo::{EchoClient, EchoServer};
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use shmlink_bench::cli::{method_list, positive, size_list, usage, Cli, UsageError};
use shmlink_measure::protocol::Fault;

/// The hidden subcommand of the server process.
pub const PEER_CMD: &str = "__async-peer";

/// The round-trip methods.
const RTT_METHODS: &[(&str, &str)] = &[
    (
        "shmlink-async",
        "shmlink::tokio::Connection on shm:, 20 us spin budget before awaiting the reactor",
    ),
    (
        "shmlink-async-nospin",
        "shmlink::tokio::Connection on shm:, no spin (every wait through the reactor)",
    ),
    (
        "shmlink-async-stream",
        "shmlink::tokio::ByteStream (AsyncRead + AsyncWrite, what hyper/tonic use) on shm: + LengthDelimitedCodec",
    ),
    (
        "tokio-uds",
        "tokio UnixStream (stream socket) + tokio-util LengthDelimitedCodec",
    ),
    (
        "tokio-tcp",
        "tokio TcpStream on 127.0.0.1, TCP_NODELAY + LengthDelimitedCodec",
    ),
];

/// The tonic transports.
const TONIC_METHODS: &[(&str, &str)] = &[
    ("tonic-shm", "tonic over shmlink shm: (shmlink-grpc)"),
    ("tonic-uds", "tonic over a tokio UnixListener / UnixStream"),
    (
        "tonic-tcp",
        "tonic over TCP (tonic's own server and Endpoint)",
    ),
];

/// `--pattern async`'s options.
#[derive(Debug)]
struct Args {
    methods: Vec<String>,
    sizes: Vec<usize>,
    round_trips: u64,
    calls: u64,
    callers: Vec<usize>,
    rounds: u32,
    json: Option<PathBuf>,
}

/// The options `--pattern async` takes.
const FLAGS: &[&str] = &[
    "methods",
    "sizes",
    "callers",
    "iterations",
    "rounds",
    "quick",
    "json",
];

fn config(cli: &Cli) -> Result<Args, UsageError> {
    if let Some(flag) = cli.not_in(FLAGS) {
        return usage(format!(
            "{flag:?} does not apply to --pattern async (its options: --methods, \
             --sizes, --callers, --iterations, --rounds, --quick, --json)"
        ));
    }
    let mut a = Args {
        methods: RTT_METHODS
            .iter()
            .chain(TONIC_METHODS)
            .map(|m| m.0.to_string())
            .collect(),
        sizes: vec![64],
        round_trips: 20_000,
        calls: 4_000,
        callers: vec![1, 16],
        rounds: 3,
        json: cli.json.clone(),
    };
    if let Some(text) = &cli.methods {
        let all: Vec<&str> = RTT_METHODS
            .iter()
            .chain(TONIC_METHODS)
            .map(|m| m.0)
            .collect();
        let find = |m: &str| all.contains(&m).then(|| m.to_string());
        if let Some(ms) = method_list(text, "async", &all, find)? {
            a.methods = ms;
        }
    }
    if let Some(text) = &cli.sizes {
        a.sizes = size_list(text, "async", 1..=(1 << 20), "1 B to 1 MiB")?;
    }
    if let Some(text) = &cli.callers {
        let mut v = Vec::new();
        for s in text.split(',') {
            match s.trim().parse::<usize>() {
                Ok(n) if (1..=256).contains(&n) => v.push(n),
                _ => return usage(format!("invalid caller count {s:?} (1 to 256)")),
            }
        }
        a.callers = v;
    }
    if cli.quick {
        a.round_trips = 3_000;
        a.calls = 800;
        a.rounds = 1;
    }
    if let Some(text) = &cli.iterations {
        let n = positive(text, "--iterations")?;
        a.round_trips = n;
        a.calls = n;
    }
    if let Some(text) = &cli.rounds {
        a.rounds = positive(text, "--rounds")?;
    }
    Ok(a)
}

#[derive(Serialize, Clone, Debug)]
struct Row {
    kind: &'static str,
    method: String,
    size: usize,
    callers: usize,
    /// Round trips or calls measured per round.
    count: u64,
    rounds: u32,
    p50_us: f64,
    p99_us: f64,
    mean_us: f64,
    per_s: f64,
    error: Option<String>,
}

#[derive(Serialize)]
struct Report {
    schema: &'static str,
    pattern: &'static str,
    shmlink_version: &'static str,
    command: String,
    machine: shmlink_bench::report::Machine,
    results: Vec<Row>,
}

/// `shmlink-bench --pattern async ...`.
pub fn main(cli: &Cli) -> ExitCode {
    let a = match config(cli) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("shmlink-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("shmlink-bench: find this program: {e}");
            return ExitCode::from(1);
        }
    };
    println!(
        "# shmlink-bench --pattern async: {} round trips per run, {} tonic calls per caller \
         count and run, {} rounds (methods interleaved); each end its own process",
        a.round_trips, a.calls, a.rounds
    );
    let rtt: Vec<&str> = RTT_METHODS
        .iter()
        .map(|m| m.0)
        .filter(|m| a.methods.iter().any(|x| x == m))
        .collect();
    let tonic: Vec<&str> = TONIC_METHODS
        .iter()
        .map(|m| m.0)
        .filter(|m| a.methods.iter().any(|x| x == m))
        .collect();
    // Per cell, the samples of every round.
    let mut cells: Vec<(Row, Vec<Row>)> = Vec::new();
    for round in 0..a.rounds {
        for &size in &a.sizes {
            for m in &rtt {
                eprint!(
                    "\r# round {}/{}: {m} {size} B          ",
                    round + 1,
                    a.rounds
                );
                let r = run_rtt_pinned(&exe, m, size, a.round_trips);
                push(&mut cells, r);
            }
            for m in &tonic {
                for &callers in &a.callers {
                    eprint!(
                        "\r# round {}/{}: {m} {size} B x{callers}          ",
                        round + 1,
                        a.rounds
                    );
                    let r = run_tonic_pinned(&exe, m, size, callers, a.calls);
                    push(&mut cells, r);
                }
            }
        }
    }
    eprintln!();
    let results: Vec<Row> = cells.into_iter().map(|(_, v)| median(v)).collect();
    print!("{}", table(&results));
    let failed = results.iter().filter(|r| r.error.is_some()).count();
    let report = Report {
        schema: "shmlink-bench/async-1",
        pattern: "async",
        shmlink_version: env!("CARGO_PKG_VERSION"),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: shmlink_bench::report::Machine::this(),
        results,
    };
    if let Some(path) = &a.json {
        match serde_json::to_string_pretty(&report)
            .map_err(std::io::Error::other)
            .and_then(|j| std::fs::write(path, j + "\n"))
        {
            Ok(()) => println!("# wrote {}", path.display()),
            Err(e) => {
                eprintln!("shmlink-bench: write {}: {e}", path.display());
                return ExitCode::from(1);
            }
        }
    }
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn push(cells: &mut Vec<(Row, Vec<Row>)>, r: Row) {
    match cells
        .iter_mut()
        .find(|(k, _)| k.method == r.method && k.size == r.size && k.callers == r.callers)
    {
        Some((_, v)) => v.push(r),
        None => cells.push((r.clone(), vec![r])),
    }
}

/// The median of each figure over the rounds (an error in any round marks the cell).
fn median(mut v: Vec<Row>) -> Row {
    let mut out = v[0].clone();
    if let Some(e) = v.iter().find_map(|r| r.error.clone()) {
        out.error = Some(e);
        return out;
    }
    out.rounds = v.len() as u32;
    let med = |v: &mut Vec<Row>, f: fn(&Row) -> f64| {
        let mut xs: Vec<f64> = v.iter().map(f).collect();
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    out.p50_us = med(&mut v, |r| r.p50_us);
    out.p99_us = med(&mut v, |r| r.p99_us);
    out.mean_us = med(&mut v, |r| r.mean_us);
    out.per_s = med(&mut v, |r| r.per_s);
    out
}

fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let rtt: Vec<&Row> = rows.iter().filter(|r| r.kind == "round-trip").collect();
    for size in rtt
        .iter()
        .map(|r| r.size)
        .collect::<std::collections::BTreeSet<_>>()
    {
        let base = rtt
            .iter()
            .find(|r| r.method == "tokio-tcp" && r.size == size && r.error.is_none())
            .map(|r| r.p50_us);
        s += &format!(
            "\n## async round trip, {size} B (p50/p99 over the rounds' medians)\n{:<22} {:>9} {:>9} {:>9} {:>12} {:>14}\n",
            "method", "p50 us", "p99 us", "mean us", "round trips/s", "p50 vs tcp"
        );
        let mut mine: Vec<&&Row> = rtt.iter().filter(|r| r.size == size).collect();
        mine.sort_by(|a, b| a.p50_us.total_cmp(&b.p50_us));
        for r in mine {
            match &r.error {
                Some(e) => s += &format!("{:<22} failed: {e}\n", r.method),
                None => {
                    s += &format!(
                        "{:<22} {:>9.2} {:>9.2} {:>9.2} {:>12.0} {:>13.1}x\n",
                        r.method,
                        r.p50_us,
                        r.p99_us,
                        r.mean_us,
                        r.per_s,
                        base.map_or(f64::NAN, |b| b / r.p50_us)
                    )
                }
            }
        }
    }
    let tonic: Vec<&Row> = rows.iter().filter(|r| r.kind == "tonic-unary").collect();
    let keys: std::collections::BTreeSet<(usize, usize)> =
        tonic.iter().map(|r| (r.size, r.callers)).collect();
    for (size, callers) in keys {
        let base = tonic
            .iter()
            .find(|r| {
                r.method == "tonic-tcp"
                    && r.size == size
                    && r.callers == callers
                    && r.error.is_none()
            })
            .map(|r| r.per_s);
        s += &format!(
            "\n## tonic unary echo, {size} B, {callers} concurrent caller(s) on one channel\n{:<22} {:>10} {:>9} {:>9} {:>14}\n",
            "method", "req/s", "p50 us", "p99 us", "req/s vs tcp"
        );
        let mut mine: Vec<&&Row> = tonic
            .iter()
            .filter(|r| r.size == size && r.callers == callers)
            .collect();
        mine.sort_by(|a, b| b.per_s.total_cmp(&a.per_s));
        for r in mine {
            match &r.error {
                Some(e) => s += &format!("{:<22} failed: {e}\n", r.method),
                None => {
                    s += &format!(
                        "{:<22} {:>10.0} {:>9.1} {:>9.1} {:>13.2}x\n",
                        r.method,
                        r.per_s,
                        r.p50_us,
                        r.p99_us,
                        base.map_or(f64::NAN, |b| r.per_s / b)
                    )
                }
            }
        }
    }
    s
}

fn stats(
    kind: &'static str,
    method: &str,
    size: usize,
    callers: usize,
    mut ns: Vec<u64>,
    wall: Duration,
) -> Row {
    ns.sort_unstable();
    let pct = |p: f64| ns[((ns.len() as f64 - 1.0) * p).round() as usize] as f64 / 1000.0;
    let mean = ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0;
    Row {
        kind,
        method: method.to_string(),
        size,
        callers,
        count: ns.len() as u64,
        rounds: 1,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        mean_us: mean,
        per_s: ns.len() as f64 / wall.as_secs_f64(),
        error: None,
    }
}

fn failed(kind: &'static str, method: &str, size: usize, callers: usize, e: String) -> Row {
    Row {
        kind,
        method: method.to_string(),
        size,
        callers,
        count: 0,
        rounds: 1,
        p50_us: f64::NAN,
        p99_us: f64::NAN,
        mean_us: f64::NAN,
        per_s: f64::NAN,
        error: Some(e),
    }
}

/// A server process: started with its method and address, it prints `ready ADDR` once
/// it listens; it exits when its stdin closes (or with the bench).
struct Peer {
    child: Child,
    addr: String,
}

impl Peer {
    fn start(
        exe: &std::path::Path,
        method: &str,
        addr: &str,
        cpu: Option<usize>,
    ) -> Result<Peer, String> {
        let mut cmd = Command::new(exe);
        if let Some(cpu) = cpu {
            cmd.env(PEER_CPU_ENV, cpu.to_string());
        }
        let mut child = cmd
            .args([PEER_CMD, method, addr])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start the server: {e}"))?;
        let out = child.stdout.take().expect("piped");
        let mut line = String::new();
        BufReader::new(out)
            .read_line(&mut line)
            .map_err(|e| format!("read the server's address: {e}"))?;
        let Some(addr) = line.trim().strip_prefix("ready ") else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the server did not start (said {line:?})"));
        };
        Ok(Peer {
            addr: addr.to_string(),
            child,
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn scratch_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("shmlink-bench-async-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
}

fn addr_for(method: &str) -> String {
    let dir = scratch_dir();
    match method {
        "shmlink-async" | "shmlink-async-nospin" | "shmlink-async-stream" | "tonic-shm" => {
            format!("shm:{}/{method}.sock", dir.display())
        }
        "tokio-uds" | "tonic-uds" => format!("{}/{method}.uds", dir.display()),
        _ => "127.0.0.1:0".to_string(),
    }
}

fn shm_opts(method: &str) -> Options {
    if method == "shmlink-async-nospin" {
        Options::default().wait_policy(WaitPolicy::BLOCKING)
    } else {
        Options::default()
    }
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The payload of message `i`: `size` bytes starting with `i`.
fn message(i: u64, size: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..size)
        .map(|k| (k as u64).wrapping_add(i) as u8)
        .collect();
    let n = size.min(8);
    m[..n].copy_from_slice(&i.to_le_bytes()[..n]);
    m
}

/// What message `msg`, #`i`, goes out as: itself, or a damaged copy where `fault` hits it
/// (the echo, compared with `msg`, then differs).
fn outgoing(msg: &[u8], i: u64, fault: Option<Fault>) -> std::borrow::Cow<'_, [u8]> {
    match fault {
        Some(f) if f.hits(i) => {
            let mut v = msg.to_vec();
            f.damage(&mut v, i);
            std::borrow::Cow::Owned(v)
        }
        _ => std::borrow::Cow::Borrowed(msg),
    }
}

/// The corrupt:N or scribble:N in `SHMLINK_BENCH_FAULT` (main refused the others).
fn fault() -> Option<Fault> {
    shmlink_bench::fault::data_fault()
}

/// The environment variable that tells the server process which CPU to pin itself to.
const PEER_CPU_ENV: &str = "SHMLINK_BENCH_ASYNC_PEER_CPU";

/// [`run_rtt`] on a thread pinned to the first allowed CPU, with the server on the second.
fn run_rtt_pinned(exe: &std::path::Path, method: &str, size: usize, n: u64) -> Row {
    let exe = exe.to_path_buf();
    pinned("round-trip", method, size, 1, move |m, cpu| {
        run_rtt(&exe, m, size, n, cpu)
    })
}

/// [`run_tonic`] pinned like [`run_rtt_pinned`].
fn run_tonic_pinned(
    exe: &std::path::Path,
    method: &str,
    size: usize,
    callers: usize,
    calls: u64,
) -> Row {
    let exe = exe.to_path_buf();
    pinned("tonic-unary", method, size, callers, move |m, cpu| {
        run_tonic(&exe, m, size, callers, calls, cpu)
    })
}

/// Runs `run(method, server CPU)` on a thread pinned to the first allowed CPU; the server
/// CPU is the second (the first when there is only one).
fn pinned(
    kind: &'static str,
    method: &str,
    size: usize,
    callers: usize,
    run: impl FnOnce(&str, Option<usize>) -> Row + Send + 'static,
) -> Row {
    let cpus = shmlink_measure::cpus::allowed_cpus();
    let (client, server) = match cpus[..] {
        [a, b, ..] => (Some(a), Some(b)),
        [a] => (Some(a), Some(a)),
        [] => (None, None),
    };
    let method = method.to_string();
    std::thread::spawn(move || {
        if let Some(cpu) = client {
            if let Err(e) = shmlink_measure::sys::pin_to_cpu(cpu) {
                return failed(
                    kind,
                    &method,
                    size,
                    callers,
                    format!("pin to CPU {cpu}: {e}"),
                );
            }
        }
        run(&method, server)
    })
    .join()
    .unwrap_or_else(|_| failed(kind, "?", size, callers, "panicked".into()))
}

fn run_rtt(exe: &std::path::Path, method: &str, size: usize, n: u64, cpu: Option<usize>) -> Row {
    let peer = match Peer::start(exe, method, &addr_for(method), cpu) {
        Ok(p) => p,
        Err(e) => return failed("round-trip", method, size, 1, e),
    };
    let warm = (n / 10).max(200);
    let fault = fault();
    if let Err(e) = shmlink_bench::fault::reached(fault, warm + n) {
        return failed("round-trip", method, size, 1, e);
    }
    let res = current_thread().block_on(async {
        match method {
            "shmlink-async" | "shmlink-async-nospin" => {
                let mut c = shmlink::tokio::Connection::connect(&peer.addr, &shm_opts(method))
                    .await
                    .map_err(|e| e.to_string())?;
                let mut ns = Vec::with_capacity(n as usize);
                let mut buf = vec![0u8; size];
                let t0 = Instant::now();
                for i in 0..warm + n {
                    if i == warm {
                        ns.clear();
                    }
                    let msg = message(i, size);
                    let out = outgoing(&msg, i, fault);
                    let t = Instant::now();
                    c.send(&out).await.map_err(|e| e.to_string())?;
                    let k = c.recv(&mut buf).await.map_err(|e| e.to_string())?;
                    ns.push(t.elapsed().as_nanos() as u64);
                    if buf[..k] != msg[..] {
                        return Err(format!("round trip {i}: wrong echo"));
                    }
                }
                let _ = t0;
                c.close().await.map_err(|e| e.to_string())?;
                Ok(ns)
            }
            "shmlink-async-stream" => {
                let c = shmlink::tokio::Connection::connect(&peer.addr, &Options::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let s = c.into_byte_stream();
                codec_rtt(
                    Framed::new(s, LengthDelimitedCodec::new()),
                    size,
                    warm,
                    n,
                    fault,
                )
                .await
            }
            "tokio-uds" => {
                let s = tokio::net::UnixStream::connect(&peer.addr)
                    .await
                    .map_err(|e| e.to_string())?;
                codec_rtt(
                    Framed::new(s, LengthDelimitedCodec::new()),
                    size,
                    warm,
                    n,
                    fault,
                )
                .await
            }
            _ => {
                let s = tokio::net::TcpStream::connect(&peer.addr)
                    .await
                    .map_err(|e| e.to_string())?;
                s.set_nodelay(true).map_err(|e| e.to_string())?;
                codec_rtt(
                    Framed::new(s, LengthDelimitedCodec::new()),
                    size,
                    warm,
                    n,
                    fault,
                )
                .await
            }
        }
    });
    match res {
        Ok(ns) => {
            let wall = Duration::from_nanos(ns.iter().sum());
            stats("round-trip", method, size, 1, ns, wall)
        }
        Err(e) => failed("round-trip", method, size, 1, e),
    }
}

async fn codec_rtt<T>(
    mut f: Framed<T, LengthDelimitedCodec>,
    size: usize,
    warm: u64,
    n: u64,
    fault: Option<Fault>,
) -> Result<Vec<u64>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut ns = Vec::with_capacity(n as usize);
    for i in 0..warm + n {
        if i == warm {
            ns.clear();
        }
        let msg = message(i, size);
        let out = outgoing(&msg, i, fault).into_owned();
        let t = Instant::now();
        f.send(bytes::Bytes::from(out))
            .await
            .map_err(|e| e.to_string())?;
        let back = f
            .next()
            .await
            .ok_or("the server closed")?
            .map_err(|e| e.to_string())?;
        ns.push(t.elapsed().as_nanos() as u64);
        if back[..] != msg[..] {
            return Err(format!("round trip {i}: wrong echo"));
        }
    }
    Ok(ns)
}

fn run_tonic(
    exe: &std::path::Path,
    method: &str,
    size: usize,
    callers: usize,
    calls: u64,
    cpu: Option<usize>,
) -> Row {
    let peer = match Peer::start(exe, method, &addr_for(method), cpu) {
        Ok(p) => p,
        Err(e) => return failed("tonic-unary", method, size, callers, e),
    };
    let warm = (calls / 10).max(100);
    let fault = fault();
    if let Err(e) = shmlink_bench::fault::reached(fault, warm + calls * callers as u64) {
        return failed("tonic-unary", method, size, callers, e);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let res: Result<(Vec<u64>, Duration), String> = rt.block_on(async {
        let channel = match method {
            "tonic-shm" => shmlink_grpc::channel(&peer.addr, &Options::default())
                .await
                .map_err(|e| format!("{e}: {:?}", std::error::Error::source(&e)))?,
            "tonic-uds" => {
                let path = peer.addr.clone();
                let ch = tonic::transport::Endpoint::from_static("http://uds.invalid")
                    .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                                tokio::net::UnixStream::connect(path).await?,
                            ))
                        }
                    }))
                    .await
                    .map_err(|e| e.to_string())?;
                shmlink_grpc::ShmChannel::new(ch)
            }
            _ => {
                let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", peer.addr))
                    .map_err(|e| e.to_string())?
                    .tcp_nodelay(true)
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?;
                shmlink_grpc::ShmChannel::new(ch)
            }
        };
        let client = EchoClient::new(channel);
        // Warm-up.
        {
            let mut c = client.clone();
            for i in 0..warm {
                let msg = message(i, size);
                let back = c
                    .unary(outgoing(&msg, i, fault).into_owned())
                    .await
                    .map_err(|e| e.to_string())?;
                if back != msg {
                    return Err(format!("warm-up call {i}: wrong echo"));
                }
            }
        }
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for k in 0..callers {
            let mut c = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut ns = Vec::with_capacity(calls as usize);
                for i in 0..calls {
                    let seq = warm + i * callers as u64 + k as u64;
                    let msg = message(seq, size);
                    let out = outgoing(&msg, seq, fault).into_owned();
                    let t = Instant::now();
                    let back = c.unary(out).await.map_err(|e| e.to_string())?;
                    ns.push(t.elapsed().as_nanos() as u64);
                    if back != msg {
                        return Err(format!("caller {k}, call {i} (message #{seq}): wrong echo"));
                    }
                }
                Ok::<_, String>(ns)
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.map_err(|e| e.to_string())??);
        }
        Ok((all, t0.elapsed()))
    });
    match res {
        Ok((ns, wall)) => stats("tonic-unary", method, size, callers, ns, wall),
        Err(e) => failed("tonic-unary", method, size, callers, e),
    }
}

/// The server process: `PEER_CMD METHOD ADDR`.
pub fn peer_main(method: &str, addr: &str) -> ExitCode {
    // Exit when the bench goes away (stdin closes).
    std::thread::spawn(|| {
        let mut s = String::new();
        let _ = std::io::stdin().read_line(&mut s);
        std::process::exit(0);
    });
    if let Some(cpu) = std::env::var(PEER_CPU_ENV)
        .ok()
        .and_then(|c| c.parse().ok())
    {
        if let Err(e) = shmlink_measure::sys::pin_to_cpu(cpu) {
            eprintln!("shmlink-bench: pin the server to CPU {cpu}: {e}");
            return ExitCode::from(1);
        }
    }
    let res: Result<(), String> = match method {
        "shmlink-async" | "shmlink-async-nospin" => current_thread().block_on(async {
            let mut l = shmlink::tokio::Listener::bind(addr, &shm_opts(method))
                .map_err(|e| e.to_string())?;
            ready(&l.local_addr());
            loop {
                let mut c = l.accept().await.map_err(|e| e.to_string())?;
                let mut buf = vec![0u8; 1 << 20];
                while let Ok(n) = c.recv(&mut buf).await {
                    if c.send(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }),
        "shmlink-async-stream" => current_thread().block_on(async {
            let mut l = shmlink::tokio::Listener::bind(addr, &Options::default())
                .map_err(|e| e.to_string())?;
            ready(&l.local_addr());
            loop {
                let c = l.accept().await.map_err(|e| e.to_string())?;
                codec_echo(Framed::new(
                    c.into_byte_stream(),
                    LengthDelimitedCodec::new(),
                ))
                .await;
            }
        }),
        "tokio-uds" => current_thread().block_on(async {
            let _ = std::fs::remove_file(addr);
            let l = tokio::net::UnixListener::bind(addr).map_err(|e| e.to_string())?;
            ready(addr);
            loop {
                let (s, _) = l.accept().await.map_err(|e| e.to_string())?;
                codec_echo(Framed::new(s, LengthDelimitedCodec::new())).await;
            }
        }),
        "tokio-tcp" => current_thread().block_on(async {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| e.to_string())?;
            ready(&l.local_addr().map_err(|e| e.to_string())?.to_string());
            loop {
                let (s, _) = l.accept().await.map_err(|e| e.to_string())?;
                let _ = s.set_nodelay(true);
                codec_echo(Framed::new(s, LengthDelimitedCodec::new())).await;
            }
        }),
        "tonic-shm" | "tonic-uds" | "tonic-tcp" => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
            .block_on(async {
                let router = tonic::transport::Server::builder().add_service(EchoServer::default());
                match method {
                    "tonic-shm" => {
                        let l = shmlink::tokio::Listener::bind(addr, &Options::default())
                            .map_err(|e| e.to_string())?;
                        ready(&l.local_addr());
                        router
                            .serve_with_incoming(shmlink_grpc::incoming(l))
                            .await
                            .map_err(|e| e.to_string())
                    }
                    "tonic-uds" => {
                        let _ = std::fs::remove_file(addr);
                        let l = tokio::net::UnixListener::bind(addr).map_err(|e| e.to_string())?;
                        ready(addr);
                        router
                            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(l))
                            .await
                            .map_err(|e| e.to_string())
                    }
                    _ => {
                        let l = tokio::net::TcpListener::bind(addr)
                            .await
                            .map_err(|e| e.to_string())?;
                        ready(&l.local_addr().map_err(|e| e.to_string())?.to_string());
                        let incoming = tokio_stream::wrappers::TcpListenerStream::new(l).map(|s| {
                            s.inspect(|s| {
                                let _ = s.set_nodelay(true);
                            })
                        });
                        router
                            .serve_with_incoming(incoming)
                            .await
                            .map_err(|e| e.to_string())
                    }
                }
            }),
        other => Err(format!("unknown method {other}")),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("error {e}");
            ExitCode::from(1)
        }
    }
}

fn ready(addr: &str) {
    let mut out = std::io::stdout();
    let _ = writeln!(out, "ready {addr}");
    let _ = out.flush();
}

async fn codec_echo<T>(mut f: Framed<T, LengthDelimitedCodec>)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    while let Some(Ok(m)) = f.next().await {
        if f.send(m.freeze()).await.is_err() {
            break;
        }
    }
}
