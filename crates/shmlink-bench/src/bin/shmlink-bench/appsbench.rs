//! `shmlink-bench --pattern apps`: real programs from the distribution, each run over
//! plain TCP on loopback and under transparent mode (`libshmlink_preload.so`, issue 16,
//! docs/transparent.md), in one table: program, metric, TCP, shmlink, ratio.
//!
//! Each program gets two private servers (one plain, one preloaded) on free loopback
//! ports; the clients run against them alternately (plain, preloaded, plain, … for
//! `--rounds` rounds) and each cell is the median of its rounds. Servers are pinned to
//! one allowed CPU and clients to another (as the point-to-point bench pins its two
//! ends). A preloaded client run counts only if every one of its connections really
//! went over shared memory, on both sides ([`moved`]): the client's and the server's debug
//! logs (`SHMLINK_LOG=debug`) must name the same connections as moved, at least as many
//! as the run opens (50 per redis-benchmark test for `-c 50`, 64 for `wrk -c 64`, …)
//! and, for redis and nginx, exactly as many as the server itself counts ([`accepted`]);
//! neither may name a connection that stayed on TCP. A row
//! whose runs failed is marked failed and the program exits 1; programs that are not
//! installed are skipped with the reason (`scripts/apps.sh install` installs them).

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use shmlink_bench::cli::{usage, within, Cli, UsageError};

/// The programs, in table order.
const APPS: &[&str] = &["redis", "nginx", "iperf3", "sockperf"];

/// `--pattern apps`'s options.
#[derive(Debug)]
struct Args {
    apps: Vec<String>,
    rounds: u32,
    /// Seconds per timed client run (wrk, iperf3, sockperf).
    secs: u32,
    /// Requests per `redis-benchmark -c 1` run; the pipelined runs (`-c 50 -P 16`) take
    /// [`PIPELINED_FACTOR`] times as many.
    requests: u64,
    json: Option<PathBuf>,
    lib: Option<PathBuf>,
}

/// How many more requests a pipelined redis run makes than a `-c 1` run: at 2–3 M
/// requests/s, 100 000 of them last 40–60 ms, and the rate printed then moved by 10 %
/// and more from run to run (the start of 50 connections is in it; the printed rate is
/// requests over whole milliseconds).
const PIPELINED_FACTOR: u64 = 10;

/// The options `--pattern apps` takes.
const FLAGS: &[&str] = &[
    "apps",
    "methods",
    "rounds",
    "duration",
    "requests",
    "quick",
    "json",
    "preload-lib",
];

fn config(cli: &Cli) -> Result<Args, UsageError> {
    if let Some(flag) = cli.not_in(FLAGS) {
        return usage(format!(
            "{flag:?} does not apply to --pattern apps (its options: --apps LIST, \
             --rounds N, --duration SECONDS, --requests N, --quick, --json FILE, \
             --preload-lib PATH)"
        ));
    }
    let mut a = Args {
        apps: APPS.iter().map(|s| s.to_string()).collect(),
        rounds: 3,
        secs: 2,
        requests: 100_000,
        json: cli.json.clone(),
        lib: cli.preload_lib.clone(),
    };
    // `--methods` is another name of `--apps`.
    if let Some(text) = cli.apps.as_ref().or(cli.methods.as_ref()) {
        if text != "all" {
            a.apps = Vec::new();
            for m in text.split(',') {
                if !APPS.contains(&m) {
                    return usage(format!(
                        "unknown program {m:?} (valid with --pattern apps: all, {})",
                        APPS.join(", ")
                    ));
                }
                a.apps.push(m.to_string());
            }
        }
    }
    if let Some(text) = &cli.duration {
        a.secs = within("--duration", text, 1..=60)?;
    }
    if let Some(text) = &cli.requests {
        a.requests = within("--requests", text, 100..=10_000_000)?;
    }
    if cli.quick {
        a.rounds = 1;
        a.secs = 1;
        a.requests = 20_000;
    }
    if let Some(text) = &cli.rounds {
        a.rounds = within("--rounds", text, 1..=50)?;
    }
    Ok(a)
}

/// One line of the table.
#[derive(Serialize, Clone, Debug)]
struct Row {
    program: String,
    metric: String,
    unit: &'static str,
    /// Whether a higher value is better (the ratio is then shmlink / TCP, else TCP /
    /// shmlink: above 1 means shmlink is better either way).
    higher_is_better: bool,
    tcp: Option<f64>,
    shmlink: Option<f64>,
    ratio: Option<f64>,
    rounds: u32,
    /// Why the row has no numbers: its programs are not installed.
    skipped: Option<String>,
    /// Why the row has no numbers: a run failed (a server that did not start, a client
    /// that failed, a preloaded run not wholly on shared memory).
    #[serde(default)]
    failed: Option<String>,
}

#[derive(Serialize)]
struct Report {
    schema: &'static str,
    pattern: &'static str,
    shmlink_version: &'static str,
    command: String,
    machine: shmlink_bench::report::Machine,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
    results: Vec<Row>,
}

/// One measurement of a client run: (metric, unit, higher is better, value).
type Sample = (String, &'static str, bool, f64);

/// A server process, killed and reaped when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where the programs run: scratch directory, preload library, CPUs.
struct Env {
    dir: PathBuf,
    lib: PathBuf,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
}

impl Env {
    /// A command pinned to `cpu`, preloaded or not (with its own rendezvous directory
    /// and a debug log when preloaded).
    fn cmd(&self, prog: &str, cpu: Option<usize>, preloaded: bool) -> Command {
        let mut c = Command::new(which(prog).unwrap_or_else(|| PathBuf::from(prog)));
        c.env_remove("LD_PRELOAD")
            .env_remove("SHMLINK_LOG")
            .env("SHMLINK_DIR", self.dir.join("rdv"))
            .stdin(Stdio::null());
        if preloaded {
            c.env("LD_PRELOAD", &self.lib).env("SHMLINK_LOG", "debug");
        }
        if let Some(cpu) = cpu {
            // SAFETY: between fork and exec only async-signal-safe calls:
            // sched_setaffinity on a stack-allocated set.
            unsafe {
                c.pre_exec(move || {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                    Ok(())
                });
            }
        }
        c
    }

    /// Starts a server and waits (≤ 10 s) until it accepts on `port`.
    fn server(&self, mut c: Command, port: u16, log: &str) -> Result<Server, String> {
        let f = std::fs::File::create(self.dir.join(log)).map_err(|e| format!("{log}: {e}"))?;
        let child = c
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .map_err(|e| format!("start {:?}: {e}", c.get_program()))?;
        let mut s = Server(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(s);
            }
            if let Ok(Some(st)) = s.0.try_wait() {
                return Err(format!(
                    "{:?} exited ({st}) before listening (see {})",
                    c.get_program(),
                    self.dir.join(log).display()
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!("{:?} did not listen within 10 s", c.get_program()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs a client to completion (killed after `limit`): its stdout and stderr, or why
    /// not.
    fn client(&self, mut c: Command, limit: Duration) -> Result<(String, String), String> {
        let prog = c.get_program().to_string_lossy().into_owned();
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start {prog}: {e}"))?;
        // Read both pipes on threads so a chatty child cannot block on a full pipe.
        let mut out = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        let t_out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let t_err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let deadline = Instant::now() + limit;
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("{prog} did not finish within {limit:?}"));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(format!("{prog}: wait: {e}")),
            }
        };
        let stdout = t_out.join().unwrap_or_default();
        let stderr = t_err.join().unwrap_or_default();
        if !status.success() {
            let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
            return Err(format!("{prog} failed ({status}): {}", tail.join(" / ")));
        }
        Ok((stdout, stderr))
    }

    /// Runs the client `c` of a run with at least `conns` connections to `server`'s port:
    /// its stdout. A preloaded run must have moved every connection onto shared memory
    /// ([`moved`]); where the server program counts the connections it accepts (redis,
    /// nginx: [`accepted`]), exactly that many.
    fn run(
        &self,
        c: Command,
        pre: bool,
        server: &ServerAt,
        conns: usize,
        limit: Duration,
    ) -> Result<String, String> {
        let prog = c.get_program().to_string_lossy().into_owned();
        let before: Vec<usize> = server.logs.iter().map(|p| read(p).len()).collect();
        let count = || accepted(&server.app, server.port).transpose();
        let accepted_before = if pre { count()? } else { None };
        let (stdout, stderr) = self.client(c, limit)?;
        if pre {
            // The counting connections are the bench's own (plain TCP): one per count.
            let accepted = match (accepted_before, count()?) {
                (Some(b), Some(a)) => Some(a.saturating_sub(b + 1) as usize),
                _ => None,
            };
            let log: String = server
                .logs
                .iter()
                .zip(before)
                .map(|(p, at)| read(p).get(at..).unwrap_or_default().to_string())
                .collect();
            moved(&stderr, &log, server.port, (conns, accepted))
                .map_err(|e| format!("{prog}: {e}"))?;
        }
        Ok(stdout)
    }
}

/// A running server: its program (`redis`, `nginx`, …), port and the files its stderr
/// goes to.
struct ServerAt {
    app: String,
    port: u16,
    logs: Vec<PathBuf>,
}

/// The connections the `app` server on `port` has accepted so far, by its own count,
/// asked over a plain TCP connection of this process (counted too): redis's
/// `total_connections_received` (`INFO stats`), nginx's `accepts` (`stub_status`); `None`
/// for programs that do not count.
fn accepted(app: &str, port: u16) -> Option<Result<u64, String>> {
    let (request, key): (&[u8], &str) = match app {
        "redis" => (b"INFO stats\r\nQUIT\r\n", "total_connections_received:"),
        "nginx" => (
            b"GET /shmlink-status HTTP/1.0\r\n\r\n",
            "server accepts handled requests",
        ),
        _ => return None,
    };
    let ask = || -> Result<u64, String> {
        use std::io::Write;
        let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        s.write_all(request).map_err(|e| e.to_string())?;
        let mut text = String::new();
        s.read_to_string(&mut text).map_err(|e| e.to_string())?;
        let after = &text[text.find(key).ok_or(format!("no {key:?} in {text:?}"))? + key.len()..];
        after
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .ok_or(format!("no count after {key:?} in {text:?}"))
    };
    Some(ask().map_err(|e| format!("count the {app} server's connections: {e}")))
}

/// A file's text ("" if unreadable).
fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Checks the preload's debug lines of one preloaded client run (`client`: its stderr;
/// `server`: what its server logged meanwhile) against `port`: the client moved at
/// least `conns` connections to `port` onto shared memory (`A -> B: fd N on shared
/// memory`), and exactly `accepted`, the server's own count of the run's connections,
/// where it has one; the server moved exactly the same ones (`B <- A: …`), and neither
/// logged a connection that stayed on TCP.
fn moved(
    client: &str,
    server: &str,
    port: u16,
    (conns, accepted): (usize, Option<usize>),
) -> Result<(), String> {
    let to = format!(":{port}");
    // `shmlink-preload[PID]: WHAT`
    let what = |l: &str| l.split_once("]: ").map(|(_, w)| w.to_string());
    let ends = |log: &str, arrow: &str| -> std::collections::BTreeSet<String> {
        log.lines()
            .filter_map(what)
            .filter_map(|w| {
                let pair = w.strip_suffix(" on shared memory")?.rsplit_once(": fd ")?.0;
                let (a, b) = pair.split_once(arrow)?;
                // The client's end, on the connection to our server's port.
                match arrow {
                    " -> " if b.ends_with(&to) => Some(a.to_string()),
                    " <- " if a.ends_with(&to) => Some(b.to_string()),
                    _ => None,
                }
            })
            .collect()
    };
    let (mine, theirs) = (ends(client, " -> "), ends(server, " <- "));
    let tcp: Vec<String> = client
        .lines()
        .chain(server.lines())
        .filter_map(what)
        .filter(|w| {
            w.contains("plain TCP")
                || w.contains("stays TCP")
                || w.contains("; TCP")
                || (w.starts_with("claim ") && w.contains(": no"))
        })
        .collect();
    if !tcp.is_empty() {
        return Err(format!(
            "{} connection(s) stayed on TCP: {}",
            tcp.len(),
            tcp.join(" / ")
        ));
    }
    if mine.len() < conns {
        return Err(format!(
            "{} of the run's {conns} connections moved to shared memory (the client's log; \
             SHMLINK_LOG=debug lines \"… on shared memory\")",
            mine.len()
        ));
    }
    if let Some(n) = accepted.filter(|&n| n != mine.len()) {
        return Err(format!(
            "the server accepted {n} connections in the run, {} of them moved to shared \
             memory",
            mine.len()
        ));
    }
    if mine != theirs {
        let only = |a: &std::collections::BTreeSet<String>,
                    b: &std::collections::BTreeSet<String>| {
            a.difference(b).cloned().collect::<Vec<_>>().join(", ")
        };
        return Err(format!(
            "the client moved {} connections, the server {}: only the client's: [{}], only \
             the server's: [{}]",
            mine.len(),
            theirs.len(),
            only(&mine, &theirs),
            only(&theirs, &mine)
        ));
    }
    Ok(())
}

/// A free loopback port (bound and released).
fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// Where `prog` is: on `PATH`, else in `/usr/sbin` or `/sbin` (nginx lives there and
/// a user's `PATH` may lack them).
fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(prog))
        .find(|f| f.is_file())
}

fn installed(prog: &str) -> bool {
    which(prog).is_some()
}

/// The first missing program of `progs`, as a skip reason.
fn missing(progs: &[&str]) -> Option<String> {
    progs
        .iter()
        .find(|p| !installed(p))
        .map(|p| format!("{p} is not installed (scripts/apps.sh install)"))
}

/// The preload library: `--preload-lib`, `$SHMLINK_PRELOAD_LIB`, or next to this program.
fn find_lib(given: Option<PathBuf>) -> Result<PathBuf, String> {
    let candidate = given
        .or_else(|| std::env::var_os("SHMLINK_PRELOAD_LIB").map(PathBuf::from))
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(|d| d.join("libshmlink_preload.so")))
        });
    match candidate {
        Some(p) if p.is_file() => Ok(p),
        Some(p) => Err(format!(
            "no preload library at {} (cargo build --release -p shmlink-preload, or \
             --preload-lib PATH)",
            p.display()
        )),
        None => Err("no preload library (--preload-lib PATH)".into()),
    }
}

/// The redis-benchmark `--csv` rows: (test, requests/s, p50 ms).
fn redis_csv(out: &str) -> Vec<(String, f64, Option<f64>)> {
    let mut header: Vec<String> = Vec::new();
    let mut rows = Vec::new();
    for line in out.lines() {
        let cells: Vec<String> = line
            .split(',')
            .map(|c| c.trim().trim_matches('"').to_string())
            .collect();
        if cells.first().is_some_and(|c| c == "test") {
            header = cells;
            continue;
        }
        let col = |name: &str| header.iter().position(|h| h == name);
        let (Some(rps), Some(test)) = (col("rps").or(Some(1)), cells.first()) else {
            continue;
        };
        let Some(r) = cells.get(rps).and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        let p50 = col("p50_latency_ms")
            .and_then(|i| cells.get(i))
            .and_then(|v| v.parse::<f64>().ok());
        rows.push((test.clone(), r, p50));
    }
    rows
}

/// The first number after `key` on a line containing it.
fn number_after(out: &str, key: &str) -> Option<f64> {
    out.lines().find_map(|l| {
        let rest = &l[l.find(key)? + key.len()..];
        let t = rest.trim_start_matches([' ', '=', ':']);
        let end = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        t[..end].parse().ok()
    })
}

/// One client run of `case` against `server`: its samples.
fn run_case(
    env: &Env,
    case: &str,
    server: &ServerAt,
    a: &Args,
    pre: bool,
) -> Result<Vec<Sample>, String> {
    let cpu = env.client_cpu;
    let port = server.port;
    let limit = Duration::from_secs(u64::from(a.secs) * 4 + 60);
    let p = port.to_string();
    let secs = a.secs.to_string();
    match case {
        "redis -c 1" | "redis -c 50 -P 16" => {
            let mut c = env.cmd("redis-benchmark", cpu, pre);
            c.args(["-h", "127.0.0.1", "-p", &p, "-t", "set,get", "--csv", "-n"]);
            let conns = if case == "redis -c 1" {
                c.arg(a.requests.to_string()).args(["-c", "1"]);
                1
            } else {
                c.arg((a.requests * PIPELINED_FACTOR).to_string())
                    .args(["-c", "50", "-P", "16"]);
                50
            };
            // Each test (SET, GET) opens its own connections.
            let out = env.run(c, pre, server, 2 * conns, limit)?;
            let rows = redis_csv(&out);
            let mut v = Vec::new();
            for (test, rps, p50) in rows {
                v.push((format!("{test} req/s"), "req/s", true, rps));
                if case == "redis -c 1" && test == "GET" {
                    if let Some(p50) = p50 {
                        v.push(("GET p50".to_string(), "ms", false, p50));
                    }
                }
            }
            if v.is_empty() {
                return Err("redis-benchmark printed no CSV rows".into());
            }
            Ok(v)
        }
        "wrk -c 1" | "wrk -c 64" => {
            let conns = if case == "wrk -c 1" { "1" } else { "64" };
            let mut c = env.cmd("wrk", cpu, pre);
            c.args(["-t", "1", "-c", conns, "-d"])
                .arg(format!("{secs}s"))
                .arg(format!("http://127.0.0.1:{p}/f4k"));
            let out = env.run(c, pre, server, conns.parse().unwrap_or(1), limit)?;
            if out.contains("Socket errors") || out.contains("Non-2xx") {
                return Err(format!("wrk reported errors: {}", out.trim()));
            }
            let r = number_after(&out, "Requests/sec:").ok_or("wrk printed no Requests/sec")?;
            Ok(vec![("req/s".into(), "req/s", true, r)])
        }
        "iperf3" => {
            let mut c = env.cmd("iperf3", cpu, pre);
            c.args(["-c", "127.0.0.1", "-p", &p, "-J", "-t", &secs]);
            // The control connection and one data stream.
            let out = env.run(c, pre, server, 2, limit)?;
            let j: serde_json::Value =
                serde_json::from_str(&out).map_err(|e| format!("iperf3 -J: {e}"))?;
            let bps = j["end"]["sum_received"]["bits_per_second"]
                .as_f64()
                .ok_or("iperf3 -J has no end.sum_received.bits_per_second")?;
            Ok(vec![("Gbit/s".into(), "Gbit/s", true, bps / 1e9)])
        }
        "sockperf ping-pong" => {
            let mut c = env.cmd("sockperf", cpu, pre);
            c.args([
                "ping-pong",
                "--tcp",
                "-i",
                "127.0.0.1",
                "-p",
                &p,
                "-m",
                "64",
                // A paced run: unpaced, sockperf bounds a run's sequence numbers by a rate it
                // assumes, and a shared-memory pair (over a million round trips a second
                // here) can pass it ("ERROR: _seqN > m_maxSequenceNo", exit 6; TCP's
                // tens of thousands never do). 500 000 a second leaves room between sends.
                "--mps",
                "500000",
                "-t",
            ])
            .arg(&secs);
            let out = env.run(c, pre, server, 1, limit)?;
            let p50 = number_after(&out, "percentile 50.000").ok_or("sockperf printed no p50")?;
            Ok(vec![("64 B p50 (half RTT)".into(), "us", false, p50)])
        }
        "sockperf throughput" => {
            let mut c = env.cmd("sockperf", cpu, pre);
            c.args([
                "throughput",
                "--tcp",
                "-i",
                "127.0.0.1",
                "-p",
                &p,
                "-m",
                "64",
                "-t",
            ])
            .arg(&secs);
            let out = env.run(c, pre, server, 1, limit)?;
            let r =
                number_after(&out, "Message Rate is").ok_or("sockperf printed no message rate")?;
            Ok(vec![("64 B msg/s".into(), "msg/s", true, r)])
        }
        other => Err(format!("unknown case {other}")),
    }
}

/// Starts the plain (`pre` false) or preloaded server of `app`.
fn start_server(env: &Env, app: &str, pre: bool) -> Result<(Server, ServerAt), String> {
    let port = free_port()?;
    let cpu = env.server_cpu;
    let tag = if pre { "shm" } else { "tcp" };
    let c = match app {
        "redis" => {
            let mut c = env.cmd("redis-server", cpu, pre);
            c.args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no", "--dir"])
            .arg(&env.dir);
            c
        }
        "nginx" => {
            let d = env.dir.join(format!("nginx-{tag}"));
            std::fs::create_dir_all(d.join("tmp")).map_err(|e| e.to_string())?;
            std::fs::create_dir_all(d.join("www")).map_err(|e| e.to_string())?;
            let body: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 13) as u8).collect();
            std::fs::write(d.join("www/f4k"), body).map_err(|e| e.to_string())?;
            let dd = d.display();
            let conf = format!(
                "daemon off;\nmaster_process off;\nworker_processes 1;\n\
                 error_log {dd}/error.log;\npid {dd}/nginx.pid;\n\
                 events {{ worker_connections 1024; }}\nhttp {{\n  access_log off;\n\
                 sendfile on;\n  client_body_temp_path {dd}/tmp;\n  proxy_temp_path {dd}/tmp;\n\
                 fastcgi_temp_path {dd}/tmp;\n  uwsgi_temp_path {dd}/tmp;\n\
                 scgi_temp_path {dd}/tmp;\n\
                 server {{ listen 127.0.0.1:{port}; root {dd}/www;\n\
                 location = /shmlink-status {{ stub_status; }} }}\n}}\n"
            );
            std::fs::write(d.join("nginx.conf"), conf).map_err(|e| e.to_string())?;
            let mut c = env.cmd("nginx", cpu, pre);
            c.arg("-c").arg(d.join("nginx.conf")).arg("-p").arg(&d);
            c
        }
        "iperf3" => {
            let mut c = env.cmd("iperf3", cpu, pre);
            c.args(["-s", "-B", "127.0.0.1", "-p", &port.to_string()]);
            c
        }
        "sockperf" => {
            let mut c = env.cmd("sockperf", cpu, pre);
            c.args([
                "server",
                "--tcp",
                "-i",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ]);
            c
        }
        other => return Err(format!("unknown program {other}")),
    };
    let log = format!("{app}-{tag}.log");
    let s = env.server(c, port, &log)?;
    let mut logs = vec![env.dir.join(log)];
    if app == "nginx" {
        // Where nginx's stderr goes once it runs.
        logs.push(env.dir.join(format!("nginx-{tag}")).join("error.log"));
    }
    Ok((
        s,
        ServerAt {
            app: app.to_string(),
            port,
            logs,
        },
    ))
}

/// The client cases of `app` and the programs they need.
fn cases(app: &str) -> (&'static [&'static str], &'static [&'static str]) {
    match app {
        "redis" => (
            &["redis -c 1", "redis -c 50 -P 16"],
            &["redis-server", "redis-benchmark"],
        ),
        "nginx" => (&["wrk -c 1", "wrk -c 64"], &["nginx", "wrk"]),
        "iperf3" => (&["iperf3"], &["iperf3"]),
        _ => (
            &["sockperf ping-pong", "sockperf throughput"],
            &["sockperf"],
        ),
    }
}

/// The median of `v` (sorted copy).
fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Runs every case of `app`, plain and preloaded alternately for `rounds` rounds.
fn bench_app(env: &Env, app: &str, a: &Args) -> Vec<Row> {
    let (list, progs) = cases(app);
    let row = |case: &str, skipped: Option<String>, failed: Option<String>| Row {
        program: case.to_string(),
        metric: "-".into(),
        unit: "",
        higher_is_better: true,
        tcp: None,
        shmlink: None,
        ratio: None,
        rounds: 0,
        skipped,
        failed,
    };
    if let Some(why) = missing(progs) {
        return list
            .iter()
            .map(|c| row(c, Some(why.clone()), None))
            .collect();
    }
    let servers = start_server(env, app, false).and_then(|t| {
        let s = start_server(env, app, true)?;
        Ok((t, s))
    });
    let ((_tcp_server, tcp_at), (_shm_server, shm_at)) = match servers {
        Ok(s) => s,
        Err(e) => return list.iter().map(|c| row(c, None, Some(e.clone()))).collect(),
    };
    let mut rows = Vec::new();
    for case in list {
        let mut cells: Vec<Cell> = Vec::new();
        let mut error = None;
        'rounds: for round in 0..a.rounds {
            for pre in [false, true] {
                eprint!(
                    "\r# round {}/{}: {case} {}          ",
                    round + 1,
                    a.rounds,
                    if pre { "shmlink" } else { "TCP" }
                );
                let server = if pre { &shm_at } else { &tcp_at };
                match run_case(env, case, server, a, pre) {
                    Ok(samples) => {
                        for (metric, unit, hib, v) in samples {
                            let i = match cells.iter().position(|c| c.0 == metric) {
                                Some(i) => i,
                                None => {
                                    cells.push((metric, unit, hib, Vec::new(), Vec::new()));
                                    cells.len() - 1
                                }
                            };
                            if pre {
                                cells[i].4.push(v);
                            } else {
                                cells[i].3.push(v);
                            }
                        }
                    }
                    Err(e) => {
                        error = Some(format!("{} run: {e}", if pre { "shmlink" } else { "TCP" }));
                        break 'rounds;
                    }
                }
            }
        }
        if let Some(e) = error {
            rows.push(row(case, None, Some(e)));
            continue;
        }
        for (metric, unit, hib, t, s) in cells {
            let (tcp, shm) = (median(&t), median(&s));
            let ratio = match (tcp, shm) {
                (Some(t), Some(s)) if t > 0.0 && s > 0.0 => Some(if hib { s / t } else { t / s }),
                _ => None,
            };
            rows.push(Row {
                program: case.to_string(),
                metric,
                unit,
                higher_is_better: hib,
                tcp,
                shmlink: shm,
                ratio,
                rounds: t.len().min(s.len()) as u32,
                skipped: None,
                failed: None,
            });
        }
    }
    rows
}

/// Per metric: (name, unit, higher is better, TCP samples, shmlink samples).
type Cell = (String, &'static str, bool, Vec<f64>, Vec<f64>);

/// A number for the table: integers for large values, three significant-ish digits for
/// small ones.
fn num(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.3}"),
    }
}

fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<22} {:<22} {:>12} {:>12} {:>7}\n",
        "program", "metric", "TCP", "shmlink", "ratio"
    );
    for r in rows {
        match (&r.skipped, &r.failed) {
            (_, Some(why)) => s += &format!("{:<22} failed: {why}\n", r.program),
            (Some(why), None) => s += &format!("{:<22} skipped: {why}\n", r.program),
            (None, None) => {
                s += &format!(
                    "{:<22} {:<22} {:>12} {:>12} {:>6.2}x\n",
                    r.program,
                    format!("{} ({})", r.metric, r.unit),
                    num(r.tcp),
                    num(r.shmlink),
                    r.ratio.unwrap_or(f64::NAN)
                )
            }
        }
    }
    s
}

/// `shmlink-bench --pattern apps ...`.
pub fn main(cli: &Cli) -> ExitCode {
    let a = match config(cli) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("shmlink-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let lib = match find_lib(a.lib.clone()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("shmlink-bench: --pattern apps: {e}");
            return ExitCode::from(1);
        }
    };
    let dir = std::env::temp_dir().join(format!("shmlink-apps-bench-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("shmlink-bench: {}: {e}", dir.display());
        return ExitCode::from(1);
    }
    let cpus = shmlink_measure::cpus::allowed_cpus();
    let (server_cpu, client_cpu) = match cpus[..] {
        [s, c, ..] => (Some(s), Some(c)),
        _ => (None, None),
    };
    let env = Env {
        dir: dir.clone(),
        lib,
        server_cpu,
        client_cpu,
    };
    println!(
        "# shmlink-bench --pattern apps: each program plain (TCP loopback) and preloaded \
         (shmlink run), alternating, median of {} rounds; {}; ratio > 1: shmlink better \
         (shmlink/TCP for rates, TCP/shmlink for latencies)",
        a.rounds,
        match (server_cpu, client_cpu) {
            (Some(s), Some(c)) => format!("servers on CPU {s}, clients on CPU {c}"),
            _ => "not pinned (one CPU allowed)".to_string(),
        }
    );
    let mut results = Vec::new();
    for app in &a.apps {
        results.extend(bench_app(&env, app, &a));
    }
    eprintln!();
    let failed = results.iter().filter(|r| r.failed.is_some()).count();
    let _ = std::fs::remove_dir_all(&dir);
    print!("{}", table(&results));
    let report = Report {
        schema: "shmlink-bench/apps-1",
        pattern: "apps",
        shmlink_version: env!("CARGO_PKG_VERSION"),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: shmlink_bench::report::Machine::this(),
        server_cpu,
        client_cpu,
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
        eprintln!(
            "shmlink-bench: {failed} of {} rows failed",
            report.results.len()
        );
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Args, UsageError> {
        let argv = std::iter::once("shmlink-bench").chain(s.split_whitespace());
        let cli = Cli::parse_from(argv, String::new()).map_err(|e| UsageError(e.to_string()))?;
        config(&cli)
    }

    #[test]
    fn options_and_detection() {
        assert_eq!(parse("--pattern=apps").unwrap().apps, APPS);
        let a = parse("--pattern apps --quick --apps redis,iperf3").unwrap();
        assert_eq!((a.rounds, a.secs, a.requests), (1, 1, 20_000));
        assert_eq!(a.apps, ["redis", "iperf3"]);
        assert!(parse("--pattern apps --apps mysql").is_err());
        assert!(parse("--pattern apps --window 4").is_err());
        assert!(parse("--pattern apps --rounds 0").is_err());
    }

    /// The preload's lines for connections from client ports `ports` to port 7000.
    fn lines(ports: std::ops::Range<u16>, client: bool) -> String {
        ports
            .map(|p| {
                if client {
                    format!("shmlink-preload[9]: 127.0.0.1:{p} -> 127.0.0.1:7000: fd 5 on shared memory\n")
                } else {
                    format!("shmlink-preload[8]: 127.0.0.1:7000 <- 127.0.0.1:{p}: fd 9 on shared memory\n")
                }
            })
            .collect()
    }

    #[test]
    fn every_connection_must_move_on_both_sides() {
        let (c, s) = (lines(40000..40050, true), lines(40000..40050, false));
        assert_eq!(moved(&c, &s, 7000, (50, None)), Ok(()));
        // One connection short of the run's 50 (it stayed on TCP without a word).
        let e = moved(
            &lines(40000..40049, true),
            &lines(40000..40049, false),
            7000,
            (50, None),
        );
        assert!(e.unwrap_err().contains("49 of the run's 50"));
        // The server did not take one of the client's.
        let e = moved(&c, &lines(40001..40050, false), 7000, (50, None)).unwrap_err();
        assert!(e.contains("only the client's: [127.0.0.1:40000]"), "{e}");
        // Another port's connections do not count.
        assert!(moved(&c, &s, 7001, (1, None)).is_err());
        // A connection that stayed on TCP fails the run, whoever says it.
        let tcp = "shmlink-preload[9]: connect 127.0.0.1:7000: claim refused; plain TCP\n";
        assert!(moved(&(c.clone() + tcp), &s, 7000, (50, None)).is_err());
        let no = "shmlink-preload[8]: claim 127.0.0.1:7000 <- 127.0.0.1:40077: no\n";
        assert!(moved(&c, &(s.clone() + no), 7000, (50, None)).is_err());
        // The server accepted 51 connections of the run (its own count): one more than
        // the logs name, which went to TCP unseen.
        let e = moved(&c, &s, 7000, (50, Some(51))).unwrap_err();
        assert!(
            e.contains("accepted 51 connections in the run, 50 of them"),
            "{e}"
        );
        assert_eq!(moved(&c, &s, 7000, (50, Some(50))), Ok(()));
        // No preload (SHMLINK_PRELOAD=off): nothing logged.
        assert!(moved("", "", 7000, (1, None))
            .unwrap_err()
            .contains("0 of the run's 1"));
    }

    #[test]
    fn parses_the_programs_output() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\"\n\
                   \"SET\",\"50000.00\",\"0.020\",\"0.008\",\"0.015\"\n\
                   \"GET\",\"62500.00\",\"0.018\",\"0.008\",\"0.012\"\n";
        let rows = redis_csv(csv);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1], ("GET".to_string(), 62500.0, Some(0.012)));
        assert_eq!(
            number_after("  Latency 1ms\nRequests/sec:  31291.55\n", "Requests/sec:"),
            Some(31291.55)
        );
        assert_eq!(
            number_after(
                "sockperf: ---> percentile 50.000 =    2.318\n",
                "percentile 50.000"
            ),
            Some(2.318)
        );
        assert_eq!(
            number_after(
                "sockperf: Summary: Message Rate is 874343 [msg/sec]",
                "Message Rate is"
            ),
            Some(874343.0)
        );
    }
}
