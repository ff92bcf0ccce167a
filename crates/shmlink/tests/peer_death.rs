//! Crash behaviour, tested by really killing processes, on every transport (`shm`, `ux`,
//! `tcp`): a peer process that dies — SIGKILL, or exit without closing — is reported to a
//! blocked `recv` or `send` as [`ErrorKind::ConnectionReset`] within [`RESET_WITHIN`],
//! after every message it sent; a peer that closes and then exits is
//! [`ErrorKind::EndOfStream`]. After a death the listener keeps serving, and nothing is
//! left behind: no `/dev/shm` entry, no descriptor, no file in the rendezvous directory
//! beyond the listener's own socket (and not even that once the listener is dropped).
//!
//! The peer is this test binary run again as `--ignored --exact child_main` (an ignored
//! test, so that it is not counted as one) with its role in [`ROLE_VAR`] and the address
//! in [`ADDR_VAR`] (see [`child_main`]). A child that should stay alive blocks reading its
//! stdin (a pipe the test holds), so it also exits when the test process goes away.
//!
//! A latency over budget is retried (at most [`ATTEMPTS`] times, every attempt checked in
//! full and logged with the CPU wait it suffered): on a shared machine a runnable thread
//! can wait longer than the budget for a CPU, while a library that notices death late
//! fails every attempt.
//!
//! "Parked" is observed, not waited for by sleeping: the blocked thread's state in
//! `/proc/self/task/TID/stat` is `S` and `/proc/self/task/TID/syscall` shows it inside a
//! system call that waits for I/O, so its spin-and-yield budget is spent.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use shmlink::{Connection, ErrorKind, Listener, Options, WaitPolicy};

/// The requirement: a peer's death reaches a blocked call within this time.
const RESET_WITHIN: Duration = Duration::from_millis(100);
/// Whole-test deadline: a hang fails the test instead of blocking CI.
const TEST_DEADLINE: Duration = Duration::from_secs(120);
/// Deadline for one awaited condition (a child connecting, a thread parking, …); also the
/// handshake and connect timeouts, which on a loaded machine can pass before a freshly
/// started child gets to say hello.
const WAIT: Duration = Duration::from_secs(30);
/// Attempts at meeting [`RESET_WITHIN`] (see [`within_budget`]).
const ATTEMPTS: usize = 3;

/// Environment variable carrying a child's role; absent in normal test runs.
const ROLE_VAR: &str = "SHMLINK_TEST_CHILD";
/// Environment variable carrying the address a child connects to.
const ADDR_VAR: &str = "SHMLINK_TEST_ADDR";
/// The line a child prints once everything it had to send is sent.
const SENT_MARK: &str = "SHMLINK-CHILD: all sent";

/// Messages a child streams first (the survivor reads them as they come).
const STREAM: u64 = 120;
/// Messages a child sends after the survivor's ack, which wait unread in the connection
/// until the child has died: few and small enough for every transport's buffers.
const SMALL: u64 = 64;
/// The survivor's go-ahead for the small messages.
const ACK: &[u8] = b"ack";
/// Size of the messages a child fills the connection with.
const FILL_LEN: usize = 1000;
/// Messages echoed by the client that proves the listener still serves.
const ECHO: u64 = 24;

/// Mixed sizes: mostly small, every tenth message 300 KiB (split on `shm:` and `ux:`).
fn stream_len(seq: u64) -> usize {
    if seq % 10 == 7 {
        300 << 10
    } else {
        12 + (seq as usize * 37) % 3000
    }
}

fn small_len(seq: u64) -> usize {
    12 + (seq as usize) % 120
}

fn echo_len(seq: u64) -> usize {
    match seq % 6 {
        0 => 0,
        5 => 1 << 20,
        _ => 12 + (seq as usize * 101) % 5000,
    }
}

/// Instantiates every test for each transport (`shm::killed_peer_wakes_parked_recv`, …).
macro_rules! death_tests {
    ($($transport:ident),*) => {$(
        mod $transport {
            death_tests!(@tests $transport:
                killed_peer_wakes_parked_recv, killed_peer_wakes_parked_recv_blocking_policy,
                killed_peer_wakes_blocked_send, killed_peer_wakes_blocked_send_blocking_policy,
                killed_peer_messages_arrive_before_reset, close_then_exit_is_end_of_stream,
                close_then_exit_with_full_buffers_is_end_of_stream,
                exit_without_close_is_reset_after_draining);
        }
    )*};
    (@tests $transport:ident: $($test:ident),*) => {$(
        #[test]
        fn $test() {
            super::run_test(stringify!($transport), stringify!($test), super::$test);
        }
    )*};
}

death_tests!(shm, ux, tcp);

fn run_test(t: &'static str, name: &str, test: fn(&'static str)) {
    run(&format!("{t}::{name}"), move || test(t));
}

// ---------------------------------------------------------------------------------------
// The tests.

fn killed_peer_wakes_parked_recv(t: &'static str) {
    parked_recv_sees_reset(t, WaitPolicy::default());
}

fn killed_peer_wakes_parked_recv_blocking_policy(t: &'static str) {
    parked_recv_sees_reset(t, WaitPolicy::BLOCKING);
}

fn killed_peer_wakes_blocked_send(t: &'static str) {
    blocked_send_sees_reset(t, WaitPolicy::default());
}

fn killed_peer_wakes_blocked_send_blocking_policy(t: &'static str) {
    blocked_send_sees_reset(t, WaitPolicy::BLOCKING);
}

/// Runs `attempt` until one shows the reset within [`RESET_WITHIN`], at most [`ATTEMPTS`]
/// times. Every attempt checks everything else in full; only the time may be retried, and
/// only because on a shared machine a thread can wait longer than the budget for a CPU
/// (logged as `cpu wait`). A library that notices death late fails every attempt.
fn within_budget(what: &str, mut attempt: impl FnMut() -> Wake) {
    let mut over = Vec::new();
    for _ in 0..ATTEMPTS {
        let wake = attempt();
        eprintln!("{what}: SIGKILL -> ConnectionReset after {wake}");
        if wake.latency < RESET_WITHIN {
            return;
        }
        over.push(wake.to_string());
    }
    panic!("{what}: the reset took longer than {RESET_WITHIN:?} in every attempt: {over:?}");
}

/// The child streams messages, then stays alive and silent; the survivor reads them all
/// and parks in `recv`. SIGKILL must wake it with a reset within [`RESET_WITHIN`].
fn parked_recv_sees_reset(t: &'static str, policy: WaitPolicy) {
    let what = format!("{t}: recv parked ({})", policy_name(policy));
    within_budget(&what, || parked_recv_attempt(t, policy));
}

fn parked_recv_attempt(t: &'static str, policy: WaitPolicy) -> Wake {
    let mut fx = Fixture::new(t, &Options::default().wait_policy(policy));
    let mut child = fx.spawn(Role::StreamIdle);
    let mut conn = fx.accept(&mut child);
    let (tid_tx, tid_rx) = mpsc::channel();
    let receiver = std::thread::spawn(move || {
        for seq in 0..STREAM {
            verify(seq, stream_len(seq), &conn.recv_vec().unwrap());
        }
        tid_tx.send(gettid()).unwrap();
        let res = conn.recv_vec();
        let woke = Instant::now();
        let cpu_wait = runqueue_wait("/proc/thread-self/schedstat");
        // The reset is final: asking again gives it again.
        let again = conn.recv_vec().map(|m| m.len());
        (res.map(|m| m.len()), woke, cpu_wait, again)
    });
    let Some(tid) = first_report(&tid_rx) else {
        propagate(receiver)
    };
    assert!(
        wait_until(WAIT, || sleeps_waiting_for_io(tid)),
        "{t}: the receiver never parked in the kernel"
    );

    let cpu_wait_before = runqueue_wait(&format!("/proc/self/task/{tid}/schedstat"));
    let killed = child.sigkill();
    let (res, woke, cpu_wait_after, again) = join_within(receiver, t);
    let wake = Wake::new(killed, woke, cpu_wait_before, cpu_wait_after);
    let err = res.expect_err("recv returned a message from a killed peer");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{t}: {err}");
    let again = again.unwrap_err();
    assert_eq!(again.kind(), ErrorKind::ConnectionReset, "{t}: {again}");
    child.expect_killed();
    drop(child);
    fx.finish();
    wake
}

/// The child connects and never reads; the survivor sends until flow control blocks it
/// for good. SIGKILL must wake the blocked `send` with a reset within [`RESET_WITHIN`].
fn blocked_send_sees_reset(t: &'static str, policy: WaitPolicy) {
    let what = format!("{t}: send blocked ({})", policy_name(policy));
    within_budget(&what, || blocked_send_attempt(t, policy));
}

fn blocked_send_attempt(t: &'static str, policy: WaitPolicy) -> Wake {
    let mut fx = Fixture::new(t, &Options::default().wait_policy(policy));
    let mut child = fx.spawn(Role::Idle);
    let mut conn = fx.accept(&mut child);
    let sent = Arc::new(AtomicU64::new(0));
    let progress = sent.clone();
    let (tid_tx, tid_rx) = mpsc::channel();
    let sender = std::thread::spawn(move || {
        let msg = payload(0, 64 << 10);
        tid_tx.send(gettid()).unwrap();
        let err = loop {
            match conn.send(&msg) {
                Ok(()) => progress.fetch_add(1, Ordering::Relaxed),
                Err(e) => break e,
            };
        };
        let woke = Instant::now();
        let cpu_wait = runqueue_wait("/proc/thread-self/schedstat");
        // The peer sent nothing, so what follows is the reset as well (not end-of-stream).
        let recv = conn.recv_vec().map(|m| m.len());
        (err, woke, cpu_wait, recv)
    });
    let Some(tid) = first_report(&tid_rx) else {
        propagate(sender)
    };
    // Blocked for good: asleep in an I/O wait, and no message went out since last time.
    let mut last = u64::MAX;
    assert!(
        wait_until(WAIT, || {
            let now = sent.load(Ordering::Relaxed);
            let still = now == last && sleeps_waiting_for_io(tid);
            last = now;
            still
        }),
        "{t}: the sender never blocked (sent {} messages)",
        sent.load(Ordering::Relaxed)
    );

    let cpu_wait_before = runqueue_wait(&format!("/proc/self/task/{tid}/schedstat"));
    let killed = child.sigkill();
    let (err, woke, cpu_wait_after, recv) = join_within(sender, t);
    let wake = Wake::new(killed, woke, cpu_wait_before, cpu_wait_after);
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{t}: {err}");
    let recv = recv.unwrap_err();
    assert_eq!(recv.kind(), ErrorKind::ConnectionReset, "{t}: {recv}");
    child.expect_killed();
    drop(child);
    fx.finish();
    wake
}

/// Messages the child sent before SIGKILL — some read while it streamed, the rest still
/// unread when it died — all arrive, in order and intact, and only then the reset.
fn killed_peer_messages_arrive_before_reset(t: &'static str) {
    let mut fx = Fixture::new(t, &Options::default());
    let mut child = fx.spawn(Role::StreamAckSmallIdle);
    let mut conn = fx.accept(&mut child);
    read_stream_and_ack(&mut conn);
    child.wait_for_line(SENT_MARK);
    child.sigkill();
    child.expect_killed();
    read_small(&mut conn);
    expect_reset(&mut conn, t);
    drop(conn);
    drop(child);
    fx.finish();
}

/// A child that closes and exits at once: everything it sent, then end-of-stream — even
/// though the survivor reads the tail only after the process is gone.
fn close_then_exit_is_end_of_stream(t: &'static str) {
    let mut fx = Fixture::new(t, &Options::default());
    let mut child = fx.spawn(Role::StreamAckSmallClose);
    let mut conn = fx.accept(&mut child);
    read_stream_and_ack(&mut conn);
    child.expect_success();
    read_small(&mut conn);
    expect_eos(&mut conn);
    expect_eos(&mut conn);
    drop(conn);
    drop(child);
    fx.finish();
}

/// A child that fills the connection with non-blocking sends until one is refused, then
/// closes and exits: every message `send` accepted arrives, then end-of-stream (`close`
/// hands what the full buffers did not take to the transport before it returns).
fn close_then_exit_with_full_buffers_is_end_of_stream(t: &'static str) {
    let mut fx = Fixture::new(t, &Options::default());
    let mut child = fx.spawn(Role::FillClose);
    let mut conn = fx.accept(&mut child);
    let accepted: u64 = child.wait_for_line(SENT_MARK).trim().parse().unwrap();
    // The child is now in `close()`, which waits until we have taken what its full
    // buffers held; read it, then the child exits cleanly.
    for seq in 0..accepted {
        match conn.recv_vec() {
            Ok(m) => verify(seq, FILL_LEN, &m),
            Err(e) => panic!("{t}: message {seq} of {accepted} accepted by send: {e}"),
        }
    }
    expect_eos(&mut conn);
    child.expect_success();
    drop(conn);
    drop(child);
    fx.finish();
}

/// A child that exits without closing (no destructor runs): everything it sent, then a
/// reset, not end-of-stream.
fn exit_without_close_is_reset_after_draining(t: &'static str) {
    let mut fx = Fixture::new(t, &Options::default());
    let mut child = fx.spawn(Role::StreamAckSmallExit);
    let mut conn = fx.accept(&mut child);
    read_stream_and_ack(&mut conn);
    child.expect_success();
    read_small(&mut conn);
    expect_reset(&mut conn, t);
    drop(conn);
    drop(child);
    fx.finish();
}

/// The connection reports `ConnectionReset`, and keeps reporting it.
fn expect_reset(conn: &mut Connection, t: &str) {
    for _ in 0..2 {
        let e = conn.recv_vec().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{t}: {e}");
    }
}

/// Reads the child's stream, then lets it send the small messages.
fn read_stream_and_ack(conn: &mut Connection) {
    for seq in 0..STREAM {
        verify(seq, stream_len(seq), &conn.recv_vec().unwrap());
    }
    conn.send(ACK).unwrap();
}

fn read_small(conn: &mut Connection) {
    for i in 0..SMALL {
        verify(STREAM + i, small_len(i), &conn.recv_vec().unwrap());
    }
}

// ---------------------------------------------------------------------------------------
// The child side.

/// What a child process does once connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Sends the stream, then stays alive without reading.
    StreamIdle,
    /// Stays alive without reading or sending.
    Idle,
    /// Sends the stream, waits for the ack, sends the small messages, prints
    /// [`SENT_MARK`] and stays alive.
    StreamAckSmallIdle,
    /// Sends like `StreamAckSmallIdle`, then closes and exits 0.
    StreamAckSmallClose,
    /// Sends like `StreamAckSmallIdle`, then exits 0 without closing.
    StreamAckSmallExit,
    /// Sends non-blocking until a send is refused, prints [`SENT_MARK`] and how many
    /// were accepted, closes and exits 0.
    FillClose,
    /// Echoes every message until end-of-stream, then exits 0.
    Echo,
}

const ROLES: &[(Role, &str)] = &[
    (Role::StreamIdle, "stream-idle"),
    (Role::Idle, "idle"),
    (Role::StreamAckSmallIdle, "stream-ack-small-idle"),
    (Role::StreamAckSmallClose, "stream-ack-small-close"),
    (Role::StreamAckSmallExit, "stream-ack-small-exit"),
    (Role::FillClose, "fill-close"),
    (Role::Echo, "echo"),
];

impl Role {
    fn name(self) -> &'static str {
        ROLES.iter().find(|(r, _)| *r == self).unwrap().1
    }

    fn from_name(name: &str) -> Role {
        let found = ROLES.iter().find(|(_, n)| *n == name);
        found
            .unwrap_or_else(|| panic!("unknown child role {name:?}"))
            .0
    }
}

/// The child's entry point: a no-op in normal runs; with [`ROLE_VAR`] set (by
/// [`Fixture::spawn`]) it plays that role and ends the process without returning.
#[test]
#[ignore = "the child processes of the other tests, which run it with --ignored"]
fn child_main() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    let addr = std::env::var(ADDR_VAR).expect("child without an address");
    let role = Role::from_name(&role);
    let start = Instant::now();
    let mut conn = Connection::connect(&addr, &Options::default().connect_timeout(WAIT))
        .unwrap_or_else(|e| {
            let after = start.elapsed();
            panic!("child {role:?}: connect {addr} failed after {after:?}: {e}")
        });
    match role {
        Role::Idle => idle(),
        Role::StreamIdle => {
            send_stream(&mut conn);
            idle()
        }
        Role::StreamAckSmallIdle | Role::StreamAckSmallClose | Role::StreamAckSmallExit => {
            send_stream(&mut conn);
            assert_eq!(conn.recv_vec().unwrap(), ACK);
            for i in 0..SMALL {
                conn.send(&payload(STREAM + i, small_len(i))).unwrap();
            }
            match role {
                Role::StreamAckSmallClose => {
                    conn.close().unwrap();
                    std::process::exit(0)
                }
                // `exit` runs no destructor: the connection is never closed.
                Role::StreamAckSmallExit => std::process::exit(0),
                _ => {
                    println!("{SENT_MARK}");
                    idle()
                }
            }
        }
        Role::FillClose => {
            conn.set_nonblocking(true);
            let mut accepted = 0;
            loop {
                match conn.send(&payload(accepted, FILL_LEN)) {
                    Ok(()) => accepted += 1,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => panic!("fill child: {e}"),
                }
                assert!(accepted < 1_000_000, "fill child: buffers never filled");
            }
            conn.set_nonblocking(false);
            println!("{SENT_MARK} {accepted}");
            conn.close().unwrap();
            std::process::exit(0)
        }
        Role::Echo => loop {
            match conn.recv_vec() {
                Ok(m) => conn.send(&m).unwrap(),
                Err(e) if e.kind() == ErrorKind::EndOfStream => {
                    drop(conn);
                    std::process::exit(0)
                }
                Err(e) => panic!("echo child: {e}"),
            }
        },
    }
}

fn send_stream(conn: &mut Connection) {
    for seq in 0..STREAM {
        conn.send(&payload(seq, stream_len(seq))).unwrap();
    }
}

/// Blocks until the test closes our stdin (or dies), keeping every connection open.
fn idle() -> ! {
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    std::process::exit(3)
}

// ---------------------------------------------------------------------------------------
// The test side: fixture, children, observation.

/// Runs one test body under a lock (the file and descriptor checks need the process to
/// themselves, and the latency budget needs the CPUs) and a deadline.
fn run(name: &str, body: impl FnOnce() + Send + 'static) {
    static SERIAL: Mutex<()> = Mutex::new(());
    common::serially_within(&SERIAL, name, TEST_DEADLINE, body);
}

/// A listener on a fresh address, with what the file system and descriptor table looked
/// like before it, to check that nothing is left behind.
struct Fixture {
    transport: &'static str,
    listener: Option<Listener>,
    addr: String,
    /// The test's own rendezvous directory and the listener's socket file in it (`shm:`
    /// and `ux:` bind socket files there; `tcp:` has none).
    dir: Option<(PathBuf, String)>,
    dev_shm: BTreeSet<String>,
    fds: Vec<String>,
}

impl Fixture {
    fn new(t: &'static str, opts: &Options) -> Fixture {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let dev_shm = entries(Path::new("/dev/shm"));
        let fds = open_fds();
        let (addr, dir) = match t {
            "tcp" => ("tcp:127.0.0.1:0".to_string(), None),
            "shm" | "ux" => {
                let n = SEQ.fetch_add(1, Ordering::Relaxed);
                let dir =
                    std::env::temp_dir().join(format!("shmlink-death-{}-{n}", std::process::id()));
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir(&dir).unwrap();
                let file = "srv.sock".to_string();
                (
                    format!("{t}:{}", dir.join(&file).display()),
                    Some((dir, file)),
                )
            }
            other => panic!("unknown transport {other}"),
        };
        // Built before binding, so that its drop cleans up if binding fails.
        let mut fx = Fixture {
            transport: t,
            listener: None,
            addr,
            dir,
            dev_shm,
            fds,
        };
        let opts = opts.clone().handshake_timeout(WAIT);
        let listener = Listener::bind(&fx.addr, &opts)
            .unwrap_or_else(|e| panic!("{t}: bind {}: {e}", fx.addr));
        fx.addr = listener.local_addr();
        fx.listener = Some(listener);
        fx.check_dir_holds_only_the_socket();
        fx
    }

    fn spawn(&self, role: Role) -> ChildProc {
        ChildProc::spawn(role, &self.addr)
    }

    /// Accepts `child`'s connection, failing fast if the child dies first.
    fn accept(&mut self, child: &mut ChildProc) -> Connection {
        let l = self.listener.as_mut().expect("listener dropped");
        l.set_nonblocking(true);
        let deadline = Instant::now() + WAIT;
        loop {
            match l.accept() {
                Ok(conn) => {
                    l.set_nonblocking(false);
                    assert_eq!(conn.transport().as_str(), self.transport);
                    // A connection adds no file next to the listener's socket.
                    self.check_dir_holds_only_the_socket();
                    return conn;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("accept on {}: {e}", self.addr),
            }
            if let Some(status) = child.try_wait() {
                panic!("child {:?} ended ({status}) before connecting", child.role);
            }
            assert!(Instant::now() < deadline, "no client within {WAIT:?}");
            let mut p = libc::pollfd {
                fd: l.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd that lives across the call.
            unsafe { libc::poll(&mut p, 1, 10) };
        }
    }

    fn check_dir_holds_only_the_socket(&self) {
        if let Some((dir, file)) = &self.dir {
            let found = entries(dir);
            assert_eq!(
                found,
                BTreeSet::from([file.clone()]),
                "{}: rendezvous directory {} holds more than the listener's socket",
                self.transport,
                dir.display()
            );
        }
    }

    /// After a death: the listener still serves a new client (which echoes), and once
    /// the listener is dropped nothing of the test is left.
    fn finish(mut self) {
        let t = self.transport;
        self.check_dir_holds_only_the_socket();
        let mut echo = self.spawn(Role::Echo);
        let mut conn = self.accept(&mut echo);
        for seq in 0..ECHO {
            conn.send(&payload(seq, echo_len(seq))).unwrap();
            verify(seq, echo_len(seq), &conn.recv_vec().unwrap());
        }
        conn.close().unwrap();
        echo.expect_success();
        drop(echo);
        self.check_dir_holds_only_the_socket();

        drop(self.listener.take());
        if let Some((dir, _)) = &self.dir {
            let left = entries(dir);
            assert!(left.is_empty(), "{t}: left in {}: {left:?}", dir.display());
            std::fs::remove_dir(dir).unwrap();
        }
        let dev_shm = entries(Path::new("/dev/shm"));
        let new: Vec<_> = dev_shm.difference(&self.dev_shm).collect();
        assert!(new.is_empty(), "{t}: new entries in /dev/shm: {new:?}");
        let fds = open_fds();
        assert_eq!(fds, self.fds, "{t}: descriptors left open");
    }
}

/// A failed test leaves nothing behind either (a passed one has checked that already).
impl Drop for Fixture {
    fn drop(&mut self) {
        drop(self.listener.take());
        if let Some((dir, _)) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A child process playing a [`Role`]; killed and reaped on drop if still running.
struct ChildProc {
    role: Role,
    child: Child,
    stdout: BufReader<ChildStdout>,
    status: Option<ExitStatus>,
}

impl ChildProc {
    fn spawn(role: Role, addr: &str) -> ChildProc {
        let mut child = rerun_ignored("child_main")
            .env(ROLE_VAR, role.name())
            .env(ADDR_VAR, addr)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        ChildProc {
            role,
            child,
            stdout,
            status: None,
        }
    }

    /// Sends SIGKILL; returns the instant just before.
    fn sigkill(&mut self) -> Instant {
        assert!(
            self.status.is_none(),
            "child {:?} already reaped",
            self.role
        );
        let pid = self.child.id() as libc::pid_t;
        let at = Instant::now();
        // SAFETY: kill has no memory-safety preconditions; `pid` is our child and not yet
        // reaped, so the number cannot name another process.
        let r = unsafe { libc::kill(pid, libc::SIGKILL) };
        assert_eq!(r, 0, "kill: {}", std::io::Error::last_os_error());
        at
    }

    fn wait(&mut self) -> ExitStatus {
        if self.status.is_none() {
            self.status = Some(self.child.wait().unwrap());
        }
        self.status.unwrap()
    }

    fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().unwrap();
        }
        self.status
    }

    fn expect_killed(&mut self) {
        let status = self.wait();
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "child {:?}: {status}",
            self.role
        );
    }

    fn expect_success(&mut self) {
        let status = self.wait();
        assert!(status.success(), "child {:?}: {status}", self.role);
    }

    /// Reads the child's stdout up to `mark` (the test harness prints text of its own,
    /// some of it on the same line: `test child_main ... `).
    /// Returns what follows `mark` on its line.
    fn wait_for_line(&mut self, mark: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).unwrap();
            if n == 0 {
                let status = self.wait();
                panic!("child {:?} ended ({status}) before {mark:?}", self.role);
            }
            if let Some((_, rest)) = line.split_once(mark) {
                return rest.to_string();
            }
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The first report a worker thread sends, or `None` if it ended without one (panicked).
fn first_report<T>(rx: &mpsc::Receiver<T>) -> Option<T> {
    rx.recv_timeout(WAIT).ok()
}

/// Re-raises the panic of a worker that ended without reporting.
fn propagate<R>(worker: std::thread::JoinHandle<R>) -> ! {
    match worker.join() {
        Err(panic) => std::panic::resume_unwind(panic),
        Ok(_) => panic!("worker ended without reporting"),
    }
}

/// Joins a worker blocked on a connection whose peer was just killed; fails if the worker
/// is still blocked [`WAIT`] later.
fn join_within<R>(worker: std::thread::JoinHandle<R>, t: &str) -> R {
    assert!(
        wait_until(WAIT, || worker.is_finished()),
        "{t}: still blocked {WAIT:?} after the peer was killed"
    );
    worker
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// How a blocked survivor woke after the kill.
struct Wake {
    /// From just before SIGKILL to the survivor's error.
    latency: Duration,
    /// Of that, how long the survivor thread waited for a CPU after it became runnable
    /// (from `/proc/.../schedstat`, if the kernel keeps it).
    cpu_wait: Option<Duration>,
}

impl Wake {
    fn new(
        killed: Instant,
        woke: Instant,
        cpu_wait_before: Option<Duration>,
        cpu_wait_after: Option<Duration>,
    ) -> Wake {
        let latency = woke
            .checked_duration_since(killed)
            .expect("the survivor failed before the peer was killed");
        let cpu_wait = cpu_wait_before
            .zip(cpu_wait_after)
            .map(|(before, after)| after.saturating_sub(before));
        Wake { latency, cpu_wait }
    }
}

impl std::fmt::Display for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.latency)?;
        if let Some(w) = self.cpu_wait {
            write!(f, " (cpu wait {w:?})")?;
        }
        Ok(())
    }
}

/// Total time a thread has spent runnable but waiting for a CPU: the second field of its
/// `schedstat` file.
fn runqueue_wait(path: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(path).ok()?;
    let ns = stat.split_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

fn policy_name(policy: WaitPolicy) -> &'static str {
    if policy == WaitPolicy::BLOCKING {
        "blocking policy"
    } else if policy == WaitPolicy::default() {
        "default policy"
    } else {
        "custom policy"
    }
}

/// Names in a directory (empty if it does not exist).
fn entries(dir: &Path) -> BTreeSet<String> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => BTreeSet::new(),
    }
}

/// This process's open descriptors and what they point at.
fn open_fds() -> Vec<String> {
    let mut fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            Some(format!(
                "{} -> {}",
                e.file_name().to_string_lossy(),
                target.display()
            ))
        })
        .collect();
    fds.sort();
    fds
}
