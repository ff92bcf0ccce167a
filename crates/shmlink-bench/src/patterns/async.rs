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

use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use crate::cli::{method_list, positive, size_list, usage, Cli, UsageError};
use crate::pattern::{write_json, Pattern, ReportHead};

mod ends;

use ends::{peer_main, run_rtt_pinned, run_tonic_pinned, Row, PEER_CMD};

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

/// `--pattern async`.
pub struct Async;

impl Pattern for Async {
    fn name(&self) -> &'static str {
        "async"
    }

    fn help(&self) -> &'static str {
        "async Rust on tokio, each end its own process on a current-thread runtime,
pinned cross-core. Round trip: shmlink-async (spin budget 20 us),
shmlink-async-nospin, shmlink-async-stream (ByteStream), tokio-uds and tokio-tcp
(LengthDelimitedCodec); tonic unary echo: tonic-shm, tonic-uds, tonic-tcp with 1 and
16 concurrent callers (req/s, p50, p99). Options: --methods, --sizes [default: 64],
--callers LIST [default: 1,16], --iterations N (round trips [default: 20000] and
calls per caller [default: 4000]), --rounds [default: 3], --quick, --json FILE."
    }

    fn flags(&self) -> &'static [&'static str] {
        FLAGS
    }

    fn child(&self, argv: &[String]) -> Option<ExitCode> {
        match argv {
            [cmd, method, addr] if cmd == PEER_CMD => Some(peer_main(method, addr)),
            _ => None,
        }
    }

    fn run(&self, cli: &Cli) -> Result<ExitCode, UsageError> {
        Ok(run(config(cli)?))
    }
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

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    head: ReportHead,
    results: Vec<Row>,
}

/// `shmlink-bench --pattern async ...`.
fn run(a: Args) -> ExitCode {
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
        head: ReportHead::new("shmlink-bench/async-1", "async"),
        results,
    };
    if !write_json(a.json.as_deref(), &report) {
        return ExitCode::from(1);
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
