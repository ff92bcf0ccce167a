//! Runs the built `shmlink` binary: short pong runs on every transport, the
//! JSON they print, the exit code of bad arguments, a corrupted answer, and the server
//! process dying with its parent. Timings are never asserted.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_shmlink");

/// A rendezvous directory of this test's own, removed on drop.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn shm_dir(test: &str) -> Dir {
    let dir = std::env::temp_dir().join(format!("shmlink-cli-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    Dir(dir)
}

fn shmlink(dir: &Dir, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("SHMLINK_DIR", &dir.0);
    cmd
}

fn run(dir: &Dir, args: &[&str]) -> Output {
    shmlink(dir, args).output().expect("run shmlink")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The addresses to try, one per transport.
fn addrs(test: &str) -> Vec<String> {
    let pid = std::process::id();
    vec![
        format!("shm:{test}-{pid}"),
        format!("ux:shmlink-cli-{test}-{pid}"),
        "tcp:127.0.0.1:0".to_string(),
    ]
}

/// Runs `pong --json ARGS ADDR` and returns what it printed.
fn pong_json(dir: &Dir, args: &[&str], addr: &str) -> Value {
    let mut all = vec!["pong", "--json"];
    all.extend_from_slice(args);
    all.push(addr);
    let out = run(dir, &all);
    assert!(
        out.status.success(),
        "shmlink {all:?} failed ({}): {}",
        out.status,
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON object per run: {stdout:?}");
    serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {stdout:?}"))
}

const FIELDS: [&str; 8] = [
    "transport",
    "size",
    "count",
    "window",
    "rtt_ns",
    "msgs_per_s",
    "bytes_per_s",
    "cpu_us_per_msg",
];

/// Checks the fields every run has.
fn check_common(v: &Value, addr: &str, size: u64, count: u64, window: u64) {
    let obj = v.as_object().expect("a JSON object");
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut want = FIELDS.to_vec();
    want.sort_unstable();
    assert_eq!(keys, want, "{v}");
    let prefix = addr.split(':').next().unwrap();
    assert_eq!(v["transport"], prefix, "{v}");
    assert_eq!(v["size"], size, "{v}");
    assert_eq!(v["count"], count, "{v}");
    assert_eq!(v["window"], window, "{v}");
    for end in ["client", "server"] {
        let cpu = v["cpu_us_per_msg"][end].as_f64();
        assert!(cpu.is_some_and(|c| c >= 0.0), "cpu of {end}: {v}");
    }
}

fn check_latency(v: &Value, addr: &str, size: u64, count: u64) {
    check_common(v, addr, size, count, 1);
    assert!(
        v["msgs_per_s"].is_null() && v["bytes_per_s"].is_null(),
        "{v}"
    );
    let rtt: Vec<u64> = ["p50", "p90", "p99", "p999", "max"]
        .iter()
        .map(|p| {
            v["rtt_ns"][p]
                .as_u64()
                .unwrap_or_else(|| panic!("rtt_ns.{p}: {v}"))
        })
        .collect();
    assert_eq!(v["rtt_ns"].as_object().unwrap().len(), 5, "{v}");
    assert!(
        rtt.windows(2).all(|w| w[0] <= w[1]),
        "percentiles out of order: {v}"
    );
}

fn check_throughput(v: &Value, addr: &str, size: u64, count: u64, window: u64) {
    check_common(v, addr, size, count, window);
    assert!(v["rtt_ns"].is_null(), "{v}");
    let msgs = v["msgs_per_s"].as_f64().expect("msgs_per_s");
    let bytes = v["bytes_per_s"].as_f64().expect("bytes_per_s");
    assert!(msgs > 0.0, "{v}");
    assert!(
        (bytes - msgs * size as f64).abs() <= 1e-6 * bytes.max(1.0),
        "{v}"
    );
}

#[test]
fn json_runs_on_every_transport() {
    let dir = shm_dir("json");
    for addr in addrs("json") {
        let v = pong_json(&dir, &["--latency", "-m", "100", "-n", "300"], &addr);
        check_latency(&v, &addr, 100, 300);
        for size in ["1", "15"] {
            let v = pong_json(&dir, &["--latency", "-m", size, "-n", "50"], &addr);
            check_latency(&v, &addr, size.parse().unwrap(), 50);
        }
        let v = pong_json(&dir, &["-m", "4k", "-n", "500", "-w", "8"], &addr);
        check_throughput(&v, &addr, 4096, 500, 8);
        let v = pong_json(&dir, &["-m", "1M", "-n", "20", "-w", "3"], &addr);
        check_throughput(&v, &addr, 1 << 20, 20, 3);
        // In place (reserve/commit, recv_ref), every byte checksummed.
        let zc = ["--zero-copy", "--verify", "all"];
        let v = pong_json(
            &dir,
            &[&zc[..], &["--latency", "-m", "100", "-n", "300"]].concat(),
            &addr,
        );
        check_latency(&v, &addr, 100, 300);
        let v = pong_json(
            &dir,
            &[&zc[..], &["-m", "1M", "-n", "20", "-w", "3"]].concat(),
            &addr,
        );
        check_throughput(&v, &addr, 1 << 20, 20, 3);
    }
}

#[test]
fn several_addresses_give_a_table_row_each() {
    let dir = shm_dir("table");
    let pid = std::process::id();
    let a = format!("shm:table-a-{pid}");
    let b = format!("shm:table-b-{pid}");
    let out = run(
        &dir,
        &["pong", "--latency", "-n", "100", "--cpus", "0,0", &a, &b],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "description, header, two rows: {stdout}");
    assert!(lines[0].starts_with("# pong latency") && lines[0].contains("CPU 0"));
    assert!(lines[1].contains("p99.9"));
    assert!(lines[2].starts_with("shm") && lines[3].starts_with("shm"));
}

/// Kills the child on drop, so a failing test leaves no server behind.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_separate_server_serves_clients_one_after_another() {
    let dir = shm_dir("separate");
    for addr in addrs("separate") {
        if addr.starts_with("tcp:") {
            continue; // a separate server needs a port known in advance
        }
        let server = shmlink(&dir, &["pong", "--server", "--spin-us", "0", &addr])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let _server = Reaper(server);
        // The client retries while the server is not listening yet.
        let v = pong_json(&dir, &["--client", "--latency", "-n", "100"], &addr);
        check_latency(&v, &addr, 64, 100);
        let v = pong_json(&dir, &["--client", "-n", "1000", "--spin-us", "0"], &addr);
        check_throughput(&v, &addr, 64, 1000, 64);
    }
}

#[test]
fn bad_arguments_exit_with_2() {
    let dir = shm_dir("args");
    for args in [
        &["pong", "--frobnicate"][..],
        &["pong", "-m", "12Q"],
        &["pong", "-n", "0"],
        &["pong", "-w", "0"],
        &["pong", "--cpus", "9,99"],
        &["pong", "--cpus", "0"],
        &["pong", "--ring-size", "1000"],
        &["pong", "--server"],
        &["pong", "--server", "--client", "shm:x"],
        &["pong", "--latency", "-w", "2"],
        &["pong", "-m"],
        &["pong", "foo:bar"],
        &["bong"],
        &[],
    ] {
        let out = run(&dir, args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with("shmlink: "), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = run(&dir, &["pong", "--help"]);
    assert!(out.status.success() && text(&out.stdout).contains("--spin-us"));
}

#[test]
fn a_corrupted_answer_fails_the_run() {
    use shmlink::{Listener, Options};
    let dir = shm_dir("corrupt");
    std::env::set_var("SHMLINK_DIR", &dir.0);
    let addr = format!("shm:corrupt-{}", std::process::id());
    let mut listener = Listener::bind(&addr, &Options::default()).unwrap();
    let client = shmlink(
        &dir,
        &[
            "pong",
            "--client",
            "--latency",
            "-n",
            "10",
            "-m",
            "64",
            &addr,
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // A server that answers the first message with one bit flipped.
    let mut conn = listener.accept().unwrap();
    let hello = conn.recv_vec().unwrap();
    assert!(hello.starts_with(b"PONGHELO"));
    conn.send(b"PONGREDY").unwrap();
    let mut msg = conn.recv_vec().unwrap();
    assert_eq!(msg.len(), 64);
    msg[40] ^= 0x04;
    conn.send(&msg).unwrap();
    let out = client.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("message #0 (64 bytes) failed verification: checksum"),
        "{stderr}"
    );
}

/// The pids whose parent is `parent` (from /proc).
fn children(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the parenthesised command name: state, ppid, …
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = rest.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == parent {
            out.push(pid);
        }
    }
    out
}

/// Whether `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat[stat.rfind(')').unwrap() + 2..].starts_with('Z'),
    }
}

#[test]
fn the_server_process_dies_with_its_parent() {
    let dir = shm_dir("orphan");
    let addr = format!("shm:orphan-{}", std::process::id());
    // Long enough to be still running when it is killed.
    let parent = shmlink(
        &dir,
        &[
            "pong",
            "--latency",
            "-n",
            "100000000",
            "--cpus",
            "none",
            &addr,
        ],
    )
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    let mut parent = Reaper(parent);
    let deadline = Instant::now() + Duration::from_secs(10);
    let server = loop {
        if let Some(&pid) = children(parent.0.id()).first() {
            break pid;
        }
        assert!(Instant::now() < deadline, "no server process appeared");
        std::thread::sleep(Duration::from_millis(5));
    };
    parent.0.kill().unwrap(); // SIGKILL: no destructor runs in the parent
    parent.0.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone(server) {
        assert!(
            Instant::now() < deadline,
            "server {server} outlived its parent"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits up to 10 s for `cond`.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `pong --server` stopped by SIGTERM (a service manager) or SIGINT (Ctrl-C), idle or
/// after serving a run, drops its listener: the socket file is gone and it exits 0.
#[test]
fn a_server_stopped_by_a_signal_removes_its_socket_file() {
    let dir = shm_dir("signal");
    let pid = std::process::id();
    for (sig, name, run_first) in [
        (libc::SIGTERM, "SIGTERM", false),
        (libc::SIGINT, "SIGINT", false),
        (libc::SIGTERM, "SIGTERM", true),
    ] {
        let addr = format!("shm:signal-{name}-{run_first}-{pid}");
        let socket = dir.0.join(format!("signal-{name}-{run_first}-{pid}.sock"));
        let server = shmlink(&dir, &["pong", "--server", "--cpus", "none", &addr])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut server = Reaper(server);
        wait_for("the server's socket file", || socket.exists());
        if run_first {
            let v = pong_json(&dir, &["--client", "--latency", "-n", "100"], &addr);
            check_latency(&v, &addr, 64, 100);
        }
        // SAFETY: kill takes a pid and a signal number; the pid is our own child, not
        // reaped yet (the Reaper waits for it below).
        assert_eq!(unsafe { libc::kill(server.0.id() as i32, sig) }, 0);
        let mut status = None;
        wait_for("the server to exit", || {
            status = server.0.try_wait().unwrap();
            status.is_some()
        });
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut server.0.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(status.unwrap().success(), "{name}: {:?}: {stderr}", status);
        assert!(stderr.contains(&format!("stopped by {name}")), "{stderr}");
        assert!(!socket.exists(), "{name} left {} behind", socket.display());
    }
}
