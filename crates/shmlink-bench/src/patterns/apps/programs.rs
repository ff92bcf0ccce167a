//! The programs of `--pattern apps`: starting a plain or preloaded server on a free
//! loopback port, running a client case against it and reading its numbers, and checking
//! from the preload's debug logs that every connection of a preloaded run moved to
//! shared memory ([`moved`]), as many as the server counts ([`accepted`]).

use std::collections::BTreeSet;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How many more requests a pipelined redis run makes than a `-c 1` run: at 2–3 M
/// requests/s, 100 000 of them last 40–60 ms, and the rate printed then moved by 10 %
/// and more from run to run (the start of 50 connections is in it; the printed rate is
/// requests over whole milliseconds).
pub(super) const PIPELINED_FACTOR: u64 = 10;

/// One measurement of a client run: (metric, unit, higher is better, value).
pub(super) type Sample = (String, &'static str, bool, f64);

/// A server process, killed and reaped when dropped.
pub(super) struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where the programs run: scratch directory, preload library, CPUs.
pub(super) struct Env {
    /// The scratch directory (logs, configurations).
    pub(super) dir: PathBuf,
    /// The preload library.
    pub(super) lib: PathBuf,
    pub(super) server_cpu: Option<usize>,
    pub(super) client_cpu: Option<usize>,
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
            // SAFETY: between fork and exec only async-signal-safe calls: pin_to_cpu is
            // one sched_setaffinity on a stack-allocated set (it allocates only to report
            // a CPU out of range, and the error is ignored here as before).
            unsafe {
                c.pre_exec(move || {
                    let _ = shmlink_sys::pin_to_cpu(cpu);
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
            let log = || -> String {
                server
                    .logs
                    .iter()
                    .zip(&before)
                    .map(|(p, &at)| read(p).get(at..).unwrap_or_default().to_string())
                    .collect()
            };
            // The server's preload logs an accepted connection's fate once its claim is
            // settled, which may be after the client has exited (a claim in flight is
            // waited for, bounded): read its log until it names as many connections as
            // the server counted, for at most a few seconds.
            let mut text = log();
            let deadline = Instant::now() + SETTLE;
            while accepted.is_some_and(|n| settled(&text, server.port) < n)
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(50));
                text = log();
            }
            moved(&stderr, &text, server.port, (conns, accepted))
                .map_err(|e| format!("{prog}: {e}"))?;
        }
        Ok(stdout)
    }
}

/// A running server: its program (`redis`, `nginx`, …), port and the files its stderr
/// goes to.
pub(super) struct ServerAt {
    app: String,
    port: u16,
    logs: Vec<PathBuf>,
}

/// The connections the `app` server on `port` has accepted so far, by its own count,
/// asked over a plain TCP connection of this process (counted too): redis's
/// `total_connections_received` (`INFO stats`), nginx's `accepts` (`stub_status`); `None`
/// for programs that do not count.
pub(super) fn accepted(app: &str, port: u16) -> Option<Result<u64, String>> {
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

/// How long a preloaded server's log is waited for after its client exited (see
/// [`settled`]).
const SETTLE: Duration = Duration::from_secs(5);

/// What the preload logged, without its `shmlink-preload[PID]: ` prefix.
fn what(line: &str) -> Option<&str> {
    line.split_once("]: ").map(|(_, w)| w)
}

/// The client ends of the connections to `port` that a preload's `log` says moved onto
/// shared memory: the client's lines `A -> B: fd N on shared memory` (`arrow` " -> "),
/// the server's `B <- A: …` (" <- ").
fn moved_ends(log: &str, arrow: &str, port: u16) -> BTreeSet<String> {
    let to = format!(":{port}");
    log.lines()
        .filter_map(what)
        .filter_map(|w| {
            let pair = w.strip_suffix(" on shared memory")?.rsplit_once(": fd ")?.0;
            let (a, b) = pair.split_once(arrow)?;
            match arrow {
                " -> " if b.ends_with(&to) => Some(a.to_string()),
                " <- " if a.ends_with(&to) => Some(b.to_string()),
                _ => None,
            }
        })
        .collect()
}

/// The client ends of the connections to `port` whose claim the server dropped because
/// the client closed the connection while it was being moved (`accept B <- A: claim
/// dropped (…); stays TCP`).
fn dropped_ends(server: &str, port: u16) -> BTreeSet<String> {
    server
        .lines()
        .filter_map(what)
        .filter_map(|w| dropped_end(w, port))
        .map(str::to_string)
        .collect()
}

/// The client end `A` of one logged `accept B <- A: claim dropped …` for `port`.
fn dropped_end(what: &str, port: u16) -> Option<&str> {
    let pair = what
        .strip_prefix("accept ")?
        .split_once(": claim dropped")?
        .0;
    let (b, a) = pair.split_once(" <- ")?;
    b.ends_with(&format!(":{port}")).then_some(a)
}

/// How many connections to `port` the server's log has settled: moved, or dropped.
pub(super) fn settled(server: &str, port: u16) -> usize {
    moved_ends(server, " <- ", port).len() + dropped_ends(server, port).len()
}

/// Checks the preload's debug lines of one preloaded client run (`client`: its stderr;
/// `server`: what its server logged meanwhile) against `port`: the client moved at
/// least `conns` connections to `port` onto shared memory (`A -> B: fd N on shared
/// memory`), and exactly `accepted`, the server's own count of the run's connections,
/// where it has one; the server moved exactly the same ones (`B <- A: …`), and neither
/// logged a connection that stayed on TCP.
///
/// One exception: a connection the client closed while it was being moved, before it
/// could carry a byte (a client that exits as its run ends: wrk reconnects until then).
/// The server logs its claim as dropped; the client, which never finished the connect,
/// did not log it as moved. Such connections count among the server's accepted ones, but
/// neither as moved nor as staying on TCP. A client that gave up on a claim and went on
/// over TCP says so (`connect SERVER: …; plain TCP`), and fails the run.
pub(super) fn moved(
    client: &str,
    server: &str,
    port: u16,
    (conns, accepted): (usize, Option<usize>),
) -> Result<(), String> {
    let (mine, theirs) = (
        moved_ends(client, " -> ", port),
        moved_ends(server, " <- ", port),
    );
    // Dropped by the server, not moved by the client (a client that went on over TCP
    // logs that itself: `connect SERVER: …; plain TCP`).
    let closed: BTreeSet<String> = &dropped_ends(server, port) - &mine;
    let tcp: Vec<&str> = client
        .lines()
        .chain(server.lines())
        .filter_map(what)
        .filter(|w| {
            w.contains("plain TCP")
                || w.contains("stays TCP")
                || w.contains("; TCP")
                || (w.starts_with("claim ") && w.contains(": no"))
        })
        .filter(|w| dropped_end(w, port).is_none_or(|a| !closed.contains(a)))
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
    if let Some(n) = accepted.filter(|&n| n != mine.len() + closed.len()) {
        return Err(format!(
            "the server accepted {n} connections in the run, {} of them moved to shared \
             memory ({} closed by the client while being moved)",
            mine.len(),
            closed.len()
        ));
    }
    if mine != theirs {
        let only = |a: &BTreeSet<String>, b: &BTreeSet<String>| {
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
pub(super) fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(prog))
        .find(|f| f.is_file())
}

pub(super) fn installed(prog: &str) -> bool {
    which(prog).is_some()
}

/// The first missing program of `progs`, as a skip reason.
pub(super) fn missing(progs: &[&str]) -> Option<String> {
    progs
        .iter()
        .find(|p| !installed(p))
        .map(|p| format!("{p} is not installed (scripts/apps.sh install)"))
}

/// The preload library: `--preload-lib`, `$SHMLINK_PRELOAD_LIB`, or next to this program.
pub(super) fn find_lib(given: Option<PathBuf>) -> Result<PathBuf, String> {
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
pub(super) fn redis_csv(out: &str) -> Vec<(String, f64, Option<f64>)> {
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
pub(super) fn number_after(out: &str, key: &str) -> Option<f64> {
    out.lines().find_map(|l| {
        let rest = &l[l.find(key)? + key.len()..];
        let t = rest.trim_start_matches([' ', '=', ':']);
        let end = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        t[..end].parse().ok()
    })
}

/// One client run of `case` against `server` (`run_secs` per timed run, `requests` per
/// `redis-benchmark -c 1` run): its samples.
pub(super) fn run_case(
    env: &Env,
    case: &str,
    server: &ServerAt,
    (run_secs, requests): (u32, u64),
    pre: bool,
) -> Result<Vec<Sample>, String> {
    let cpu = env.client_cpu;
    let port = server.port;
    let limit = Duration::from_secs(u64::from(run_secs) * 4 + 60);
    let p = port.to_string();
    let secs = run_secs.to_string();
    // sockperf's client in `mode` against the server, 64 B messages.
    let sockperf = |mode: &str| {
        let mut c = env.cmd("sockperf", cpu, pre);
        c.args([mode, "--tcp", "-i", "127.0.0.1", "-p", &p, "-m", "64"]);
        c
    };
    match case {
        "redis -c 1" | "redis -c 50 -P 16" => {
            let mut c = env.cmd("redis-benchmark", cpu, pre);
            c.args(["-h", "127.0.0.1", "-p", &p, "-t", "set,get", "--csv", "-n"]);
            let conns = if case == "redis -c 1" {
                c.arg(requests.to_string()).args(["-c", "1"]);
                1
            } else {
                c.arg((requests * PIPELINED_FACTOR).to_string())
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
            let mut c = sockperf("ping-pong");
            // A paced run: unpaced, sockperf bounds a run's sequence numbers by a rate it
            // assumes, and a shared-memory pair (over a million round trips a second
            // here) can pass it ("ERROR: _seqN > m_maxSequenceNo", exit 6; TCP's tens of
            // thousands never do). 500 000 a second leaves room between sends.
            c.args(["--mps", "500000", "-t", &secs]);
            let out = env.run(c, pre, server, 1, limit)?;
            let p50 = number_after(&out, "percentile 50.000").ok_or("sockperf printed no p50")?;
            Ok(vec![("64 B p50 (half RTT)".into(), "us", false, p50)])
        }
        "sockperf throughput" => {
            let mut c = sockperf("throughput");
            c.args(["-t", &secs]);
            let out = env.run(c, pre, server, 1, limit)?;
            let r =
                number_after(&out, "Message Rate is").ok_or("sockperf printed no message rate")?;
            Ok(vec![("64 B msg/s".into(), "msg/s", true, r)])
        }
        other => Err(format!("unknown case {other}")),
    }
}

/// Starts the plain (`pre` false) or preloaded server of `app`.
pub(super) fn start_server(env: &Env, app: &str, pre: bool) -> Result<(Server, ServerAt), String> {
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
pub(super) fn cases(app: &str) -> (&'static [&'static str], &'static [&'static str]) {
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
