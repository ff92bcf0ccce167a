//! A real program under transparent mode: redis-server (Debian's, installed by
//! `scripts/apps.sh install`) runs preloaded; redis-cli and redis-benchmark talk to it
//! plain (TCP) and preloaded (shared memory). Values must come back intact both ways,
//! the preloaded clients must really use shared memory and the plain ones must not.
//! Numbers are printed, never asserted (`scripts/apps.sh bench` reports the ratio).

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{preload_lib, Scratch};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);

fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `program` with the test's rendezvous directory under `dir`, preloaded with `lib` if
/// given (and never with an `LD_PRELOAD` inherited from the test's environment).
fn app(program: &str, dir: &Path, lib: Option<&Path>) -> Command {
    let mut c = Command::new(program);
    c.env("SHMLINK_DIR", dir.join("rdv"))
        .env_remove("LD_PRELOAD");
    if let Some(lib) = lib {
        c.env("LD_PRELOAD", lib);
    }
    c
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A child killed and reaped on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(cmd: Command, what: &str) -> Output {
    run_with_input(cmd, what, None)
}

fn run_with_input(mut cmd: Command, what: &str, input: Option<&[u8]>) -> Output {
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    if let Some(data) = input {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(data).expect("write stdin");
    }
    // Output is read while the child runs (a full pipe would stop it); a timer kills it
    // if it does not end in time.
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(RUN_TIMEOUT) {
        Ok(out) => out.expect("output"),
        Err(_) => {
            // SAFETY: kills the child we spawned (it is not reaped yet: the thread waits).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("{what} did not finish in {RUN_TIMEOUT:?}");
        }
    };
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Requests per second of each test in `redis-benchmark -q` output.
fn rates(out: &Output) -> Vec<(String, f64)> {
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(": ")?;
            let rps = rest.split_whitespace().next()?.parse::<f64>().ok()?;
            rest.contains("requests per second")
                .then(|| (name.trim().to_string(), rps))
        })
        .collect()
}

fn shm_lines(log: &Path) -> usize {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(log) {
        let _ = f.read_to_string(&mut s);
    }
    s.lines()
        .filter(|l| l.ends_with("on shared memory"))
        .count()
}

/// Whether redis-server, redis-cli and redis-benchmark are installed; the calling test
/// is skipped if not.
fn redis_installed() -> bool {
    let all = have("redis-server") && have("redis-benchmark") && have("redis-cli");
    if !all {
        shmlink_testkit::skip(
            "apps",
            "redis-server, redis-cli or redis-benchmark is not installed (scripts/apps.sh install)",
        );
    }
    all
}

/// Starts `cmd`, a server, with `SHMLINK_LOG=debug` and its stderr in `log`.
fn spawn_logged(cmd: &mut Command, log: &Path, what: &str) -> Child {
    cmd.env("SHMLINK_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"))
}

/// Waits up to 20 s until `listens` says the server `what` listens.
fn wait_listening(what: &str, mut listens: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !listens() {
        assert!(Instant::now() < deadline, "{what} never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A redis-server on `port` (preloaded with `lib` if given), its stderr in `log`,
/// killed on drop; returns once it listens.
fn redis_server(dir: &Path, lib: Option<&Path>, port: &str, log: &Path) -> Reaped {
    let mut s = app("redis-server", dir, lib);
    s.args(["--port", port, "--bind", "127.0.0.1", "--save", ""])
        .args(["--appendonly", "no", "--dir"])
        .arg(dir);
    let server = Reaped(spawn_logged(&mut s, log, "redis-server"));
    let port = port.parse::<u16>().unwrap();
    wait_listening("redis-server", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    server
}

/// A test's preloaded redis-server on a free port, its log in `server.log` of the test's
/// scratch directory.
struct Redis {
    server: Reaped,
    port: String,
    log: PathBuf,
    lib: PathBuf,
    dir: PathBuf,
    _scratch: Scratch,
}

impl Redis {
    /// The server, or `None` (the test skipped) where redis is not installed.
    fn start(tag: &str) -> Option<Redis> {
        if !redis_installed() {
            return None;
        }
        let scratch = Scratch::new(tag);
        let dir = scratch.0.clone();
        let lib = preload_lib();
        let port = free_port().to_string();
        let log = dir.join("server.log");
        let server = redis_server(&dir, Some(&lib), &port, &log);
        Some(Redis {
            server,
            port,
            log,
            lib,
            dir,
            _scratch: scratch,
        })
    }

    /// A client `program` (redis-cli, redis-benchmark) of this server, preloaded or not.
    fn client(&self, program: &str, preloaded: bool) -> Command {
        let mut c = app(program, &self.dir, preloaded.then_some(&*self.lib));
        c.args(["-p", &self.port]);
        c
    }
}

#[test]
fn redis_serves_plain_and_preloaded_clients() {
    let Some(redis) = Redis::start("redis") else {
        return;
    };
    let client = |program: &str, preloaded: bool| redis.client(program, preloaded);
    let server_log = &redis.log;
    // A value larger than a ring, set and read back both ways.
    let value: String = (0..300_000)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    for (preloaded, key) in [(false, "k-plain"), (true, "k-shm")] {
        let before = shm_lines(server_log);
        let mut set = client("redis-cli", preloaded);
        set.args(["-x", "set", key]);
        run_with_input(set, "redis-cli set", Some(value.as_bytes()));
        let mut get = client("redis-cli", preloaded);
        get.args(["get", key]);
        let out = run(get, "redis-cli get");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim_end(),
            value,
            "preloaded {preloaded}: the value came back different"
        );
        let used = shm_lines(server_log) - before;
        if preloaded {
            assert_eq!(
                used, 2,
                "both preloaded redis-cli runs go over shared memory"
            );
        } else {
            assert_eq!(used, 0, "plain clients stay on TCP");
        }
    }
    for args in [&["-c", "1"][..], &["-c", "50", "-P", "16"][..]] {
        let mut got = Vec::new();
        for preloaded in [false, true] {
            let before = shm_lines(server_log);
            let mut b = client("redis-benchmark", preloaded);
            b.args(["-t", "set,get", "-n", "20000", "-q"]).args(args);
            let out = run(b, "redis-benchmark");
            let r = rates(&out);
            assert_eq!(r.len(), 2, "SET and GET rates: {r:?}");
            let used = shm_lines(server_log) - before;
            if preloaded {
                assert!(
                    used >= 2 * args[1].parse::<usize>().unwrap(),
                    "every connection of both tests (SET, GET) on shared memory ({used})"
                );
            } else {
                assert_eq!(used, 0);
            }
            got.push(r);
        }
        for ((name, tcp), (_, shm)) in got[0].iter().zip(&got[1]) {
            eprintln!(
                "redis-benchmark {} {name}: TCP {tcp:.0}/s, shmlink {shm:.0}/s, ratio {:.2} (not asserted)",
                args.join(" "),
                shm / tcp
            );
        }
    }
}

/// nginx in one process (`master_process off`) serving static files preloaded: curl
/// fetches a 1 MiB file (nginx's `sendfile`) intact plain and preloaded, and wrk runs
/// `-c 1` and `-c 64` both ways without socket errors; only the preloaded clients use
/// shared memory.
#[test]
fn nginx_serves_plain_and_preloaded_clients() {
    nginx_check(false);
}

/// The same with nginx's default process model, a master and two workers that share the
/// listening socket by `fork` (the claims are answered by the worker that accepts).
#[test]
fn nginx_master_and_workers_serve_over_shm() {
    nginx_check(true);
}

/// Stops an nginx master gracefully (its workers with it), else kills it.
struct NginxMaster(Child);

impl Drop for NginxMaster {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn nginx_check(master: bool) {
    if !have_path("nginx") || !have_path("wrk") || !have_path("curl") {
        shmlink_testkit::skip(
            "apps",
            "nginx, wrk or curl is not installed (scripts/apps.sh install)",
        );
        return;
    }
    let scratch = Scratch::new(if master { "nginx-master" } else { "nginx" });
    let dir = scratch.0.clone();
    std::fs::create_dir_all(dir.join("www")).expect("scratch dir");
    std::fs::create_dir_all(dir.join("tmp")).expect("scratch dir");
    let body: Vec<u8> = (0..1 << 20)
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("www/f1m"), &body).expect("file");
    std::fs::write(dir.join("www/f4k"), &body[..4096]).expect("file");
    let port = free_port();
    let d = dir.display();
    let conf = format!(
        "{}daemon off;\nmaster_process {};\nworker_processes {};\nerror_log {d}/error.log info;\n\
         pid {d}/nginx.pid;\nevents {{ worker_connections 1024; }}\nhttp {{\n  access_log off;\n\
         sendfile on;\n  client_body_temp_path {d}/tmp;\n  proxy_temp_path {d}/tmp;\n\
         fastcgi_temp_path {d}/tmp;\n  uwsgi_temp_path {d}/tmp;\n  scgi_temp_path {d}/tmp;\n\
         server {{ listen 127.0.0.1:{port}; root {d}/www; }}\n}}\n",
        // As root, nginx's workers would become `nobody`, which the registration
        // (root's) does not admit: they keep root's uid here (docs/transparent.md).
        // SAFETY: plain geteuid.
        if master && unsafe { libc::geteuid() } == 0 {
            "user root;\n"
        } else {
            ""
        },
        if master { "on" } else { "off" },
        if master { 2 } else { 1 },
    );
    std::fs::write(dir.join("nginx.conf"), conf).expect("conf");
    let lib = preload_lib();
    let log = dir.join("preload.log");
    let server = spawn_logged(
        app("nginx", &dir, Some(&lib))
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-p")
            .arg(&dir),
        &log,
        "nginx",
    );
    let _server = NginxMaster(server);
    wait_listening("nginx", || TcpStream::connect(("127.0.0.1", port)).is_ok());
    // nginx sends its stderr to error.log once it runs: count the decisions in both.
    let shm = || shm_lines(&log) + shm_lines(&dir.join("error.log"));
    let client = |program: &str, preloaded: bool| app(program, &dir, preloaded.then_some(&*lib));
    for preloaded in [false, true] {
        let before = shm();
        let mut curl = client("curl", preloaded);
        curl.args(["-s", "--fail", &format!("http://127.0.0.1:{port}/f1m")]);
        let out = run(curl, "curl");
        assert!(
            out.stdout == body,
            "preloaded {preloaded}: the file came back different"
        );
        let used = shm() - before;
        assert_eq!(
            used,
            usize::from(preloaded),
            "preloaded {preloaded}: shm connections"
        );
    }
    for conns in ["1", "64"] {
        let mut rates = Vec::new();
        for preloaded in [false, true] {
            let before = shm();
            let mut wrk = client("wrk", preloaded);
            wrk.args([
                "-t1",
                "-c",
                conns,
                "-d2s",
                &format!("http://127.0.0.1:{port}/f4k"),
            ]);
            let out = run(wrk, "wrk");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                !text.contains("Socket errors") && !text.contains("Non-2xx"),
                "preloaded {preloaded}, -c {conns}: {text}"
            );
            let rps = text
                .lines()
                .find_map(|l| l.strip_prefix("Requests/sec:"))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no Requests/sec in {text}"));
            assert!(rps > 0.0);
            let used = shm() - before;
            if preloaded {
                assert!(used >= 1, "the preloaded wrk used shared memory ({used})");
            } else {
                assert_eq!(used, 0);
            }
            rates.push(rps);
        }
        eprintln!(
            "wrk -c {conns} 4 KiB file: TCP {:.0}/s, shmlink {:.0}/s, ratio {:.2} (not asserted)",
            rates[0],
            rates[1],
            rates[1] / rates[0]
        );
    }
    drop(_server);
}

/// Whether `program` is on PATH (for programs without a harmless `--version`).
fn have_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// iperf3 (one stream, 2 s): the server preloaded, the client plain then preloaded; both
/// runs complete, and only the preloaded client's connections (control and data) use
/// shared memory.
#[test]
fn iperf3_streams_plain_and_preloaded() {
    if !have_path("iperf3") {
        shmlink_testkit::skip("apps", "iperf3 is not installed (scripts/apps.sh install)");
        return;
    }
    let scratch = Scratch::new("iperf");
    let dir = scratch.0.clone();
    let lib = preload_lib();
    let mut rates = Vec::new();
    for preloaded in [false, true] {
        let port = free_port().to_string();
        let log = dir.join(format!("server-{preloaded}.log"));
        let server = spawn_logged(
            app("iperf3", &dir, Some(&lib)).args(["-s", "-1", "-p", &port]),
            &log,
            "iperf3 -s",
        );
        let server = Reaped(server);
        wait_listening("iperf3 -s", || shm_registered(&log) > 0);
        let mut c = app("iperf3", &dir, preloaded.then_some(&*lib));
        c.args(["-c", "127.0.0.1", "-p", &port, "-t", "2"]);
        let out = run(c, "iperf3 -c");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let receiver = text
            .lines()
            .find(|l| l.trim_end().ends_with("receiver"))
            .unwrap_or_else(|| panic!("no receiver line: {text}"))
            .to_string();
        rates.push(receiver);
        drop(server);
        let used = shm_lines(&log);
        if preloaded {
            assert!(used >= 2, "control and data connections on shm ({used})");
        } else {
            assert_eq!(used, 0, "a plain client stays on TCP");
        }
    }
    eprintln!(
        "iperf3 TCP: {}\niperf3 shmlink: {} (not asserted)",
        rates[0], rates[1]
    );
}

/// Registrations logged in a preloaded server's log (it listens).
fn shm_registered(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(": registered at "))
        .count()
}

/// sockperf (server preloaded): ping-pong and throughput, 64 B messages, 1 s each, with
/// a plain client then a preloaded one; both complete and report their figure, and only
/// the preloaded client's connection uses shared memory.
#[test]
fn sockperf_plain_and_preloaded() {
    if !have_path("sockperf") {
        shmlink_testkit::skip(
            "apps",
            "sockperf is not installed (scripts/apps.sh install)",
        );
        return;
    }
    let scratch = Scratch::new("sockperf");
    let dir = scratch.0.clone();
    let lib = preload_lib();
    let port = free_port().to_string();
    let log = dir.join("server.log");
    let server = spawn_logged(
        app("sockperf", &dir, Some(&lib)).args(["server", "--tcp", "-i", "127.0.0.1", "-p", &port]),
        &log,
        "sockperf server",
    );
    let _server = Reaped(server);
    wait_listening("sockperf server", || shm_registered(&log) > 0);
    // A client of this server, preloaded or not: `mode` with 64 B messages for 1 s.
    let client = |mode: &str, preloaded: bool| {
        let mut c = app("sockperf", &dir, preloaded.then_some(&*lib));
        c.args([mode, "--tcp", "-i", "127.0.0.1", "-p", &port])
            .args(["-m", "64", "-t", "1"]);
        c
    };
    for (mode, key) in [
        ("ping-pong", "percentile 50.000"),
        ("throughput", "Message Rate is"),
    ] {
        let mut figures = Vec::new();
        for preloaded in [false, true] {
            let before = shm_lines(&log);
            let out = run(client(mode, preloaded), "sockperf client");
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            let line = text
                .lines()
                .find(|l| l.contains(key))
                .unwrap_or_else(|| panic!("{mode}, preloaded {preloaded}: no {key:?} in {text}"))
                .to_string();
            let used = shm_lines(&log) - before;
            if preloaded {
                assert_eq!(used, 1, "{mode}: the preloaded client used shared memory");
            } else {
                assert_eq!(used, 0, "{mode}: a plain client stays on TCP");
            }
            figures.push(line);
        }
        eprintln!(
            "sockperf {mode}: TCP {} | shmlink {} (not asserted)",
            figures[0], figures[1]
        );
    }
    // A third and fourth preloaded client on the same server: each earlier client closed
    // with replies unread, which TCP's server sees as a reset (and drops the message it
    // had half received); as an end of stream, the leftover used to corrupt the next
    // connection on that fd number (sockperf: "_seqN > m_maxSequenceNo").
    for _ in 0..2 {
        run(
            client("ping-pong", true),
            "sockperf ping-pong, a later preloaded client",
        );
    }
}

/// kill -9 of redis-server under a running redis-benchmark: the client fails with the
/// same exit status preloaded as over plain TCP, and with one of the two errors TCP gives
/// it: "Connection reset by peer" when the server died with the client's request unread
/// (a reset), "Server closed the connection" when it died between requests (a FIN).
/// Which one is a matter of timing, over TCP as over shared memory.
#[test]
fn a_killed_redis_server_fails_the_client_as_over_tcp() {
    if !have("redis-server") || !have("redis-benchmark") {
        shmlink_testkit::skip(
            "apps",
            "redis-server or redis-benchmark is not installed (scripts/apps.sh install)",
        );
        return;
    }
    let scratch = Scratch::new("redis-kill");
    let dir = scratch.0.clone();
    let lib = preload_lib();
    let mut seen = Vec::new();
    for preloaded in [false, true] {
        let port = free_port().to_string();
        let log = dir.join(format!("server-{preloaded}.log"));
        let mut server = redis_server(&dir, preloaded.then_some(&*lib), &port, &log);
        let mut c = app("redis-benchmark", &dir, preloaded.then_some(&*lib));
        c.args(["-p", &port, "-t", "set", "-n", "100000000", "-c", "1", "-q"])
            .env("SHMLINK_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let client = c.spawn().expect("spawn redis-benchmark");
        let pid = client.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(client.wait_with_output());
        });
        std::thread::sleep(Duration::from_millis(700));
        server.0.kill().expect("kill -9 redis-server");
        let _ = server.0.wait();
        let out = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(out) => out.expect("output"),
            Err(_) => {
                // SAFETY: kills the child we spawned (the thread has not reaped it).
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                panic!("preloaded {preloaded}: redis-benchmark did not end after the kill");
            }
        };
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let error = stderr
            .lines()
            .chain(String::from_utf8_lossy(&out.stdout).lines())
            .find(|l| l.starts_with("Error"))
            .map(str::to_string);
        if preloaded {
            assert!(
                stderr.contains("on shared memory"),
                "the preloaded client used shared memory:\n{stderr}"
            );
        }
        seen.push((out.status.code(), error));
    }
    eprintln!(
        "kill -9 of redis-server: TCP {:?}, shmlink {:?}",
        seen[0], seen[1]
    );
    let tcp_errors = [
        "Error: Connection reset by peer",
        "Error: Server closed the connection",
    ];
    for (i, (status, error)) in seen.iter().enumerate() {
        assert_eq!(*status, Some(1), "run {i}: redis-benchmark's exit status");
        let e = error.as_deref().unwrap_or("no error line");
        assert!(tcp_errors.contains(&e), "run {i}: {e}");
    }
}

/// CPU time `pid` has used so far (user + system), from `/proc/PID/stat`.
fn cpu_used(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // The fields after the command name (which may hold spaces) start after its ')'.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..]
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of the line (11 and 12 after the name).
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// Preloaded programs that wait on shm connections spin for a bounded budget, stretched
/// while their peer keeps answering soon (`SHMLINK_SPIN_MAX_US`), then sleep: after a
/// pipelined benchmark has stretched the spins, a preloaded redis-server and a preloaded
/// subscriber that waits on it in a blocking read use next to no CPU while nothing is
/// sent, and the subscriber still gets the next message (a doorbell wakes it). The
/// window is a second of idleness, measured in CPU ticks, not in elapsed time; a spin
/// that never ends would show a whole second per process.
#[test]
fn idle_preloaded_programs_use_no_cpu() {
    let Some(redis) = Redis::start("redis-idle") else {
        return;
    };
    let (server, log) = (&redis.server, &redis.log);
    let client = |program: &str| redis.client(program, true);
    let mut bench = client("redis-benchmark");
    bench.args(["-t", "get", "-n", "200000", "-c", "8", "-P", "8", "-q"]);
    run(bench, "redis-benchmark");
    let mut sub = client("redis-cli");
    sub.args(["subscribe", "idle"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut sub = Reaped(sub.spawn().expect("spawn redis-cli subscribe"));
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = sub.0.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next_line = || {
        rx.recv_timeout(Duration::from_secs(20))
            .expect("a line from the subscriber")
    };
    // "subscribe", "idle", "1": subscribed.
    let confirm: Vec<String> = (0..3).map(|_| next_line()).collect();
    assert_eq!(confirm, ["subscribe", "idle", "1"]);
    let before = [cpu_used(server.0.id()), cpu_used(sub.0.id())];
    std::thread::sleep(Duration::from_secs(1));
    let after = [cpu_used(server.0.id()), cpu_used(sub.0.id())];
    for (i, who) in ["redis-server", "the subscriber"].iter().enumerate() {
        let used = after[i] - before[i];
        eprintln!("{who}: {used:?} of CPU in a second of idleness");
        assert!(
            used < Duration::from_millis(100),
            "{who} used {used:?} of CPU in a second of idleness"
        );
    }
    let mut publish = client("redis-cli");
    publish.args(["publish", "idle", "hello"]);
    let out = run(publish, "redis-cli publish");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "1",
        "one receiver"
    );
    let msg: Vec<String> = (0..3).map(|_| next_line()).collect();
    assert_eq!(msg, ["message", "idle", "hello"]);
    assert!(
        shm_lines(log) >= 3,
        "the benchmark, the subscriber and the publisher used shared memory"
    );
}
