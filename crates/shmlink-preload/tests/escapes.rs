//! Escape routes: a connection's fd leaving the preload library's sight must never cost
//! bytes silently. `tests/c/escapes.c`, compiled here with the system C compiler, runs a
//! preloaded TCP server and client through each route (docs/transparent.md, "Escape
//! routes"):
//! - the fd passed to another process with `SCM_RIGHTS`: the connection continues over
//!   TCP, and the receiver's bytes arrive intact; with the peer gone and bytes of it
//!   unread, `sendmsg` fails instead;
//! - bytes written on the fd with a raw `syscall(SYS_write)` or through stdio
//!   (`fdopen` + `fprintf`): both ends see a reset, and no such byte reaches the
//!   server's program as stream data;
//! - `close_range` over the library's own fds, the freed numbers reused by new files:
//!   the library neither writes into nor closes those files; over the connection's own
//!   fd, it closes the connection and the number's next file is the program's;
//! - `dup2` onto one of the library's fds: refused with `EBUSY`, the connection goes on.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{compile, finish, preload_lib, Scratch};

/// What both sides printed (stdout) and logged (stderr, `SHMLINK_LOG=debug`).
struct Run {
    server: String,
    client: String,
    logs: String,
}

impl Run {
    /// Panics unless `line` is one of the lines printed by either side.
    fn expect(&self, line: &str) {
        assert!(
            self.server
                .lines()
                .chain(self.client.lines())
                .any(|l| l == line),
            "expected the line {line:?}\n{self}"
        );
    }

    /// The line starting with `prefix` (panics if none).
    fn line(&self, prefix: &str) -> &str {
        self.server
            .lines()
            .chain(self.client.lines())
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?}\n{self}"))
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "server stdout:\n{}\nclient stdout:\n{}\nlogs:\n{}",
            self.server, self.client, self.logs
        )
    }
}

/// Runs `escapes server MODE` and `escapes client MODE`, both preloaded, with their own
/// rendezvous directory, and requires that their connection went over shared memory.
fn run(prog: &Path, dir: &Path, mode: &str) -> Run {
    run_n(prog, dir, mode, 1)
}

/// [`run`] for a mode with `conns` connections, each of which must use shared memory.
fn run_n(prog: &Path, dir: &Path, mode: &str, conns: usize) -> Run {
    let rdv = dir.join(format!("r-{mode}"));
    let port_file = dir.join(format!("port-{mode}"));
    let cmd = |role: &str, arg: &str| {
        let mut c = Command::new(prog);
        c.args([role, mode, arg])
            .env("SHMLINK_DIR", &rdv)
            .env("SHMLINK_LOG", "debug")
            .env("LD_PRELOAD", preload_lib())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let server = cmd("server", port_file.to_str().expect("utf-8 path"))
        .spawn()
        .expect("start the server");
    let deadline = Instant::now() + Duration::from_secs(10);
    let port = loop {
        if let Ok(p) = std::fs::read_to_string(&port_file) {
            break p.trim().to_string();
        }
        assert!(Instant::now() < deadline, "the server never wrote its port");
        std::thread::sleep(Duration::from_millis(10));
    };
    let client = cmd("client", &port).spawn().expect("start the client");
    let c = finish(client, "the client");
    let s = finish(server, "the server");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let r = Run {
        server: text(&s.stdout),
        client: text(&c.stdout),
        logs: text(&s.stderr) + &text(&c.stderr),
    };
    let shm = r
        .logs
        .lines()
        .filter(|l| l.ends_with("on shared memory"))
        .count();
    assert_eq!(
        shm,
        2 * conns,
        "both ends must have moved to shared memory\n{r}"
    );
    assert!(
        c.status.success(),
        "the client failed ({:?})\n{r}",
        c.status
    );
    r
}

/// The fd passed with SCM_RIGHTS to a process forked before the connection: the
/// connection continues over TCP (here and there), so the 21 bytes the receiver writes
/// reach the server after the 13 the sender wrote before passing it, and the server's
/// answer reaches the receiver. Before: the 21 bytes went to the library's control
/// socket and were lost, the server read a clean end of stream after 13 bytes, and the
/// receiver read a doorbell byte as the answer.
#[test]
fn a_connection_passed_with_scm_rights_continues_over_tcp() {
    let dir = Scratch::new("rights");
    let Some(prog) = compile(&dir.0, "escapes") else {
        return;
    };
    let r = run(&prog, &dir.0, "rights");
    r.expect("client: passed the fd");
    r.expect("child: wrote 21 bytes");
    r.expect("server: read: 34 bytes");
    r.expect("server: stream intact: yes");
    r.expect("child: reply: ok 34");
    r.expect("server: end: 0 more bytes, then EOF");
    assert!(
        r.logs
            .contains("passed with SCM_RIGHTS; continues over TCP"),
        "{r}"
    );
}

/// Passing the fd of a connection whose peer is gone: the peer cannot send again what
/// it wrote, so with 4 of its bytes unread here `sendmsg` fails with `ENOBUFS` (nothing
/// passed; the program reads the bytes itself), while with everything read the fd goes
/// (as the TCP socket, whose end the receiver reads). Before: the fd went with the
/// 4 bytes left behind, and the receiver read a clean end of stream.
#[test]
fn a_connection_whose_peer_is_gone_passes_only_with_nothing_unread() {
    let dir = Scratch::new("gone");
    let Some(prog) = compile(&dir.0, "escapes") else {
        return;
    };
    let r = run_n(&prog, &dir.0, "rights-gone", 2);
    let client: Vec<&str> = r.client.lines().collect();
    let want = [
        "client: sendmsg: ENOBUFS",
        "client: own read: 4 bytes, then EOF",
        "client: end read first: EOF",
        "client: passed the fd",
        "client: done",
    ];
    let mine: Vec<&str> = client
        .iter()
        .copied()
        .filter(|l| l.starts_with("client: "))
        .collect();
    assert_eq!(mine, want, "\n{r}");
    r.expect("child: no fd received");
    r.expect("child: read: 0 bytes, then EOF");
}

/// Bytes written with a raw `syscall(SYS_write)` on a moved fd land on the library's
/// control socket: the server's library takes them for what they are, a hole in the
/// stream, and resets the connection at both ends. The server's program reads an error
/// (after at most what the client wrote through the library), never a raw byte; the
/// client's read fails, and so does its next write. Before: the bytes were dropped, the
/// server read a clean end of stream, the client's read timed out and its write
/// succeeded.
#[test]
fn raw_writes_on_a_moved_fd_reset_both_ends() {
    let dir = Scratch::new("raw");
    let Some(prog) = compile(&dir.0, "escapes") else {
        return;
    };
    for n in [19, 4096, 70_000] {
        let r = run(&prog, &dir.0, &format!("raw{n}"));
        r.expect("client: raw write: all taken");
        expect_reset_at_both_ends(&r, &format!("{n} raw bytes"));
    }
}

/// After a write past the library: the server read at most what went through the
/// library ("before\n", "after\n"), no raw byte, then a reset; the client's next call
/// gets the reset and its later write fails.
fn expect_reset_at_both_ends(r: &Run, what: &str) {
    let read = r.line("server: read: ");
    assert!(
        read.ends_with(" bytes, then ECONNRESET"),
        "{what}: the server must see a reset: {read:?}\n{r}"
    );
    let got: usize = read["server: read: ".len()..]
        .split(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a count");
    assert!(got <= 13, "{what}: {got} bytes read\n{r}");
    r.expect("server: raw bytes seen: 0");
    // The reset is reported once: to the client's write after the raw bytes if it came
    // that early (the server read "before\n" and found its ring empty), else to its read.
    let client_reset = r
        .client
        .lines()
        .any(|l| l == "client: write after: ECONNRESET" || l == "client: read: ECONNRESET");
    assert!(client_reset, "{what}: the client must see the reset\n{r}");
    let later = r.line("client: write later: ");
    assert!(
        later.ends_with("EPIPE") || later.ends_with("ECONNRESET"),
        "{what}: the client's connection must stay broken: {later:?}\n{r}"
    );
    assert!(r.logs.contains("is not a doorbell"), "{what}\n{r}");
}

/// The same through stdio: `fdopen` + `fprintf` + `fflush` on a moved fd (glibc's stdio
/// writes with its internal `write`, which no preload library can take over). Before:
/// the 100 bytes were lost and the server read a clean end of stream.
#[test]
fn stdio_writes_on_a_moved_fd_reset_both_ends() {
    let dir = Scratch::new("stdio");
    let Some(prog) = compile(&dir.0, "escapes") else {
        return;
    };
    let r = run(&prog, &dir.0, "stdio");
    r.expect("client: fflush: ok");
    expect_reset_at_both_ends(&r, "stdio");
}

/// `close_range(fd + 1, ~0U, 0)` through the C library leaves the library's own fds
/// open (as `close` does), so the new files the program opens next never take their
/// numbers: none gets a doorbell byte, none is closed when the connection closes, and
/// the connection goes on working. Before: the control socket's number went to a new
/// socket pair, which the library closed with the connection (and Rust's fd-ownership
/// check aborted the client for the TCP socket closed under it).
///
/// The raw system call bypasses the hook: then at least the library does not close
/// the new file that reuses a number (it checks the inode first); doorbells it rings
/// before may still reach that file (docs/transparent.md, "Escape routes").
#[test]
fn close_range_leaves_the_librarys_fds_and_new_files_alone() {
    let dir = Scratch::new("cr");
    let Some(prog) = compile(&dir.0, "escapes") else {
        return;
    };
    let r = run(&prog, &dir.0, "closerange");
    r.expect("client: fds above the connection's before close_range: some");
    r.expect("client: pong2: 5 bytes");
    r.expect("client: new files the library wrote to: 0");
    r.expect("client: new files the library closed: 0");
    r.expect("client: done");
    r.expect("server: end: 0 more bytes, then EOF");

    let r = run(&prog, &dir.0, "closerange-raw");
    r.expect("client: pong2: 5 bytes");
    r.expect("client: new files the library closed: 0");
    r.expect("client: done");
}

/// `dup2` of a new file onto one of the library's own fds (found in /proc/self/fd above
/// the connection's) is refused with `EBUSY`, and the connection goes on. Before: the
/// dup replaced the control socket, whose number the library kept using.
#[test]
fn dup2_onto_a_library_fd_is_refused() {
    let dir = Scratch::new("dup2");
    let Some(prog) = compile(&dir.0, "escapes") else {
        return;
    };
    let r = run(&prog, &dir.0, "dup2onto");
    r.expect("client: dup2 onto the library's fd: EBUSY");
    r.expect("client: pong2: 5 bytes");
    r.expect("client: new files the library wrote to: 0");
    r.expect("client: done");
    r.expect("server: end: 0 more bytes, then EOF");
}

/// `close_range(fd, ~0U, 0)` with the connection's own fd in the range closes the
/// connection as `close` would (the server reads the end), and the new file that takes
/// its number is the program's: the bytes written on it reach that file. Before: the
/// library still took the number for the connection and the bytes went into its ring;
/// the socket pair got nothing, and the client aborted at exit.
#[test]
fn close_range_over_the_connections_own_fd_closes_it() {
    let dir = Scratch::new("own");
    let Some(prog) = compile(&dir.0, "escapes") else {
        return;
    };
    let r = run(&prog, &dir.0, "closerange-own");
    r.expect("client: the pair took the connection's number: yes");
    r.expect("client: the pair got it: yes");
    r.expect("client: done");
    r.expect("server: end: 0 more bytes, then EOF");
}
