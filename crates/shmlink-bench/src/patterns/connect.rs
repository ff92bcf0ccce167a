//! `shmlink-bench --pattern connect`: connections per second (connect + one 64-byte round
//! trip + close), shmlink `shm:` and `auto:` against plain Unix and TCP sockets (see
//! `crate::methods::connect`). The server is this program re-executed (hidden
//! subcommand [`PEER_CMD`]), pinned to the second allowed CPU, the client to the first.
//! Methods are interleaved over the rounds; the table shows each figure's median.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use crate::methods::connect::{self, Row, METHODS};
use shmlink_measure::protocol::Fault;

use crate::cli::{method_list, positive, usage, Cli, UsageError};
use crate::pattern::Pattern;

/// The hidden subcommand of the server process: `PEER_CMD METHOD TAG`.
pub const PEER_CMD: &str = "__connect-peer";
/// The environment variable that tells the server which CPU to pin itself to.
const PEER_CPU_ENV: &str = "SHMLINK_BENCH_CONNECT_PEER_CPU";

struct Args {
    methods: Vec<&'static connect::ConnectMethod>,
    seconds: f64,
    rounds: u32,
    json: Option<PathBuf>,
}

/// `--pattern connect`.
pub struct Connect;

impl Pattern for Connect {
    fn name(&self) -> &'static str {
        "connect"
    }

    fn help(&self) -> &'static str {
        "connect + one 64 B round trip + close, per second (shm, auto, in-process, uds,
tcp); the server is this program re-executed. Options: --methods, --seconds,
--rounds, --quick, --json FILE."
    }

    fn flags(&self) -> &'static [&'static str] {
        FLAGS
    }

    fn child(&self, argv: &[String]) -> Option<ExitCode> {
        match argv {
            [cmd, method, tag] if cmd == PEER_CMD => Some(peer_main(method, tag)),
            _ => None,
        }
    }

    fn run(&self, cli: &Cli) -> Result<ExitCode, UsageError> {
        Ok(run(config(cli)?))
    }
}

/// The options `--pattern connect` takes.
const FLAGS: &[&str] = &["methods", "seconds", "rounds", "quick", "json"];

fn config(cli: &Cli) -> Result<Args, UsageError> {
    let mut a = Args {
        methods: METHODS.iter().collect(),
        seconds: 2.0,
        rounds: 3,
        json: cli.json.clone(),
    };
    if cli.quick {
        a.seconds = 0.5;
        a.rounds = 1;
    }
    if let Some(text) = &cli.methods {
        let names: Vec<&str> = METHODS.iter().map(|m| m.name).collect();
        if let Some(ms) = method_list(text, "connect", &names, connect::find)? {
            a.methods = ms;
        }
    }
    if let Some(text) = &cli.seconds {
        match text.parse::<f64>() {
            Ok(s) if s > 0.0 && s <= 600.0 => a.seconds = s,
            _ => return usage("--seconds needs a duration in seconds (0 to 600)"),
        }
    }
    if let Some(text) = &cli.rounds {
        a.rounds = positive(text, "--rounds")?;
    }
    Ok(a)
}

/// The server process: binds, prints `ADDR <address>`, serves until killed.
pub fn peer_main(method: &str, tag: &str) -> ExitCode {
    if let Some(cpu) = std::env::var(PEER_CPU_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        let _ = shmlink_sys::pin_to_cpu(cpu);
    }
    let mut server = match connect::Server::bind(method, tag) {
        Ok(s) => s,
        Err(e) => {
            println!("ERROR bind: {e}");
            return ExitCode::FAILURE;
        }
    };
    match server.addr() {
        Ok(a) => println!("ADDR {a}"),
        Err(e) => {
            println!("ERROR address: {e}");
            return ExitCode::FAILURE;
        }
    }
    match server.serve() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shmlink-bench: connect server: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A running server process, killed on drop.
struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_peer(method: &str, tag: &str, cpu: Option<usize>) -> Result<(Peer, String), String> {
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args([PEER_CMD, method, tag])
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    if let Some(cpu) = cpu {
        cmd.env(PEER_CPU_ENV, cpu.to_string());
    }
    let mut child = cmd.spawn().map_err(|e| format!("start the server: {e}"))?;
    let out = child.stdout.take().expect("piped stdout");
    let peer = Peer(child);
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .map_err(|e| format!("read the server's address: {e}"))?;
    match line.trim().split_once(' ') {
        Some(("ADDR", addr)) => Ok((peer, addr.to_string())),
        _ => Err(format!("server said {:?}", line.trim())),
    }
}

fn time_of(seconds: f64) -> Duration {
    Duration::from_secs_f64(seconds)
}

/// `shmlink-inproc`: the server is a thread of this process, pinned to `server`.
fn run_in_process(
    m: &'static connect::ConnectMethod,
    tag: &str,
    time: Duration,
    (client, server): (Option<usize>, Option<usize>),
    fault: Option<Fault>,
) -> Result<Row, String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let mut srv = connect::Server::bind(m.name, tag).map_err(|e| format!("bind: {e}"))?;
    let addr = srv.addr().map_err(|e| format!("address: {e}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let serving = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            if let Some(cpu) = server {
                let _ = shmlink_sys::pin_to_cpu(cpu);
            }
            srv.serve_until(&stop)
        })
    };
    let a = addr.clone();
    let row = std::thread::spawn(move || {
        if let Some(cpu) = client {
            let _ = shmlink_sys::pin_to_cpu(cpu);
        }
        connect::measure(m, &a, 50, time, fault)
    })
    .join()
    .map_err(|_| "client panicked".to_string())?;
    stop.store(true, Ordering::Release);
    // Wakes the accept, which then sees `stop` (the next connection's message: the
    // server checks it like any other).
    let _ = connect::once(m.name, &addr, row.made, None);
    match serving.join() {
        Ok(Ok(())) => Ok(row),
        Ok(Err(e)) => Err(format!("server: {e}")),
        Err(_) => Err("server panicked".into()),
    }
}

fn run_one(
    m: &'static connect::ConnectMethod,
    seconds: f64,
    round: u32,
    fault: Option<Fault>,
) -> Row {
    let failed = |e: String| Row::empty(m.name, Some(e));
    let cpus = shmlink_measure::cpus::allowed_cpus();
    let (client, server) = match cpus[..] {
        [a, b, ..] => (Some(a), Some(b)),
        [a] => (Some(a), Some(a)),
        [] => (None, None),
    };
    let tag = format!("shmlink-bench-connect-{}-{round}", std::process::id());
    if m.name == "shmlink-inproc" {
        return run_in_process(m, &tag, time_of(seconds), (client, server), fault)
            .unwrap_or_else(failed);
    }
    let (peer, addr) = match start_peer(m.name, &tag, server) {
        Ok(p) => p,
        Err(e) => return failed(e),
    };
    let time = Duration::from_secs_f64(seconds);
    let row = std::thread::spawn(move || {
        if let Some(cpu) = client {
            let _ = shmlink_sys::pin_to_cpu(cpu);
        }
        connect::measure(m, &addr, 50, time, fault)
    })
    .join()
    .unwrap_or_else(|_| failed("client panicked".into()));
    drop(peer);
    row
}

fn run(a: Args) -> ExitCode {
    // corrupt:N, scribble:N (main refused the other faults).
    let fault = crate::fault::data_fault();
    let mut runs: Vec<Vec<Row>> = vec![Vec::new(); a.methods.len()];
    for round in 0..a.rounds {
        eprintln!("round {} of {}", round + 1, a.rounds);
        for (i, m) in a.methods.iter().enumerate() {
            runs[i].push(run_one(m, a.seconds, round, fault));
        }
    }
    let rows: Vec<Row> = runs.iter().map(|r| connect::median(r)).collect();
    let base = rows
        .iter()
        .find(|r| r.method == "uds" && r.error.is_none())
        .map(|r| r.per_s);
    println!(
        "\n## connect + one 64 B round trip + close (medians over {} round(s) of {} s)\n{:<16} {:>12} {:>10} {:>10} {:>10} {:>10}",
        a.rounds, a.seconds, "method", "conn/s", "p50 us", "p90 us", "p99 us", "vs uds"
    );
    for r in &rows {
        match &r.error {
            Some(e) => println!("{:<16} failed: {e}", r.method),
            None => println!(
                "{:<16} {:>12.0} {:>10.1} {:>10.1} {:>10.1} {:>9.2}x",
                r.method,
                r.per_s,
                r.p50_us,
                r.p90_us,
                r.p99_us,
                base.map_or(f64::NAN, |b| r.per_s / b)
            ),
        }
    }
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&rows).expect("rows serialize");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("shmlink-bench: write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if rows.iter().any(|r| r.error.is_some()) {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
