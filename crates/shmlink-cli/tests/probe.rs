//! `shmlink probe ADDR` (the health check of deploy/): exit 0 while a `pong --server`
//! listens, 1 once it was SIGKILLed and left its socket file behind (stale, told apart
//! from a timeout), 1 where nothing ever listened, and the same for TCP and abstract
//! Unix addresses; vm: and malformed addresses are usage errors (2).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use shmlink::{Listener, Options};

const BIN: &str = env!("CARGO_BIN_EXE_shmlink");

/// A directory of this test's own, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("shmlink-probe-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process, killed on drop.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `shmlink probe ARGS` with `SHMLINK_DIR=dir`, and how long it took.
fn probe(dir: &Path, args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = Command::new(BIN)
        .arg("probe")
        .args(args)
        .env("SHMLINK_DIR", dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (out, start.elapsed())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Starts `shmlink pong --server shm:NAME` in `dir` and waits until `ready` holds
/// (`what` says what a timeout means).
fn start_pong(dir: &Path, name: &str, ready: impl Fn() -> bool, what: &str) -> Kill {
    let child = Command::new(BIN)
        .args(["pong", "--server", "--cpus", "none", &format!("shm:{name}")])
        .env("SHMLINK_DIR", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Kill(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(Instant::now() < deadline, "pong --server {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

/// Starts `shmlink pong --server shm:NAME` in `dir` and waits until its socket exists.
fn pong_server(dir: &Path, name: &str) -> Kill {
    let sock = dir.join(format!("{name}.sock"));
    start_pong(dir, name, || sock.exists(), "did not bind")
}

#[test]
fn a_live_server_passes_and_a_killed_one_fails_although_its_socket_file_stays() {
    let dir = Dir::new("kill");
    let mut server = pong_server(&dir.0, "p");
    let (out, _) = probe(&dir.0, &["shm:p"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    assert!(line.starts_with("shm:p: listening (pid "), "{line}");
    assert!(
        line.contains(&format!("pid {}", server.0.id())),
        "{line} (server pid {})",
        server.0.id()
    );
    // A bare name is shm:NAME, as in every command.
    assert_eq!(probe(&dir.0, &["p"]).0.status.code(), Some(0));

    // SIGKILL: no handler runs, the socket file stays.
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    let sock = dir.0.join("p.sock");
    assert!(sock.exists(), "SIGKILL removed the socket file?");
    let (out, took) = probe(&dir.0, &["--timeout", "10000", "shm:p"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    // Told apart by the kernel's ECONNREFUSED, not by waiting out the timeout.
    assert!(
        err.contains("socket file of a listener that is gone"),
        "{err}"
    );
    println!("probe of a SIGKILLed server's socket: exit 1 after {took:?} (timeout 10 s): {err}");
    assert!(sock.exists(), "the probe must not remove what it probes");

    // A new server on the same name replaces the stale file; the probe passes again.
    let _again = pong_server_replacing(&dir.0, "p");
    let (out, _) = probe(&dir.0, &["shm:p"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// Like [`pong_server`], for a name whose stale socket file exists: waits for the probe.
fn pong_server_replacing(dir: &Path, name: &str) -> Kill {
    let answers = || probe(dir, &[name]).0.status.code() == Some(0);
    start_pong(dir, name, answers, "did not replace the stale socket")
}

#[test]
fn nothing_there_fails() {
    let dir = Dir::new("none");
    let (out, _) = probe(&dir.0, &["shm:nobody"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no socket"),
        "{}",
        text(&out.stderr)
    );
    // A rendezvous directory that does not exist: 1 too, with the reason.
    let missing = dir.0.join("missing");
    let (out, _) = probe(&missing, &["shm:nobody"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // A regular file where the socket should be: not a listener.
    std::fs::write(dir.0.join("plain.sock"), b"x").unwrap();
    let (out, _) = probe(&dir.0, &["shm:plain"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
}

#[test]
fn a_server_stopped_with_sigterm_fails_too() {
    let dir = Dir::new("term");
    let mut server = pong_server(&dir.0, "t");
    assert_eq!(probe(&dir.0, &["shm:t"]).0.status.code(), Some(0));
    // SAFETY: signalling our own child, which we have not waited for.
    unsafe { libc::kill(server.0.id() as i32, libc::SIGTERM) };
    server.0.wait().unwrap();
    let (out, _) = probe(&dir.0, &["shm:t"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
}

#[test]
fn tcp_and_abstract_addresses() {
    let dir = Dir::new("tcp");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    for prefix in ["tcp", "auto", "tls"] {
        let (out, _) = probe(&dir.0, &[&format!("{prefix}:127.0.0.1:{port}")]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{prefix}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stdout).contains("accepts TCP connections"));
    }
    drop(l);
    let (out, _) = probe(&dir.0, &[&format!("tcp:127.0.0.1:{port}")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));

    let name = format!("shmlink-probe-{}", std::process::id());
    let addr = format!("shm:@{name}");
    let listener = Listener::bind(&addr, &Options::default()).unwrap();
    let (out, _) = probe(&dir.0, &[&addr]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!("pid {}", std::process::id())),
        "{}",
        text(&out.stdout)
    );
    drop(listener);
    let (out, _) = probe(&dir.0, &[&addr]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
}

#[test]
fn bad_arguments_exit_2() {
    let dir = Dir::new("usage");
    for args in [
        &["vm:x"][..],
        &["foo:bar"],
        &[],
        &["--timeout", "0", "shm:x"],
    ] {
        let (out, _) = probe(&dir.0, args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}
