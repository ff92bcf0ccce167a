//! What the publish/subscribe tests over `shm:` (`pubsub.rs`) and over the network
//! (`pubsub_net.rs`) share: self-checking messages, the child processes that play
//! subscribers or a publisher, and the deadline-bound test runner.
//!
//! The other processes are the test binary run again as `--ignored --exact child_main`
//! (an ignored test, so that it is not counted as one) with a role in [`ROLE_VAR`], the
//! address in [`ADDR_VAR`] and an argument in [`ARG_VAR`] (see [`child_main`]); a child
//! reports on stdout behind [`MARK`]. Every wait is for a condition, with a deadline.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStdin, ChildStdout, ExitStatus, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{checksum, rerun_ignored};
use shmlink::inspect::SubscriberInfo;
use shmlink::{ErrorKind, Options, PubSubOptions, Publisher, Subscriber};

/// Environment variable carrying a child's role; absent in normal test runs.
pub const ROLE_VAR: &str = "SHMLINK_PUBSUB_ROLE";
/// Environment variable carrying the topic's address.
pub const ADDR_VAR: &str = "SHMLINK_PUBSUB_ADDR";
/// Environment variable carrying the role's argument.
pub const ARG_VAR: &str = "SHMLINK_PUBSUB_ARG";
/// What a child's report lines start with.
pub const MARK: &str = "SHMLINK-PUBSUB:";
/// Deadline for one awaited condition (a child connecting, a report, a wake-up after a
/// kill — the latter also checked against a much tighter bound where it matters).
pub const WAIT: Duration = Duration::from_secs(60);
/// Whole-test deadline: a hang fails the test instead of blocking CI.
pub const TEST_DEADLINE: Duration = Duration::from_secs(900);

// ---------------------------------------------------------------------------------------
// Messages: sequence number, checksum, 16..=64 bytes.

pub fn msg_len(seq: u64) -> usize {
    16 + (seq % 49) as usize
}

/// Fills `buf` (of `msg_len(seq)` bytes) with message `seq`: the sequence number, a
/// checksum of the rest, and bytes derived from the sequence number.
pub fn fill(seq: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate().skip(12) {
        *b = (seq as usize).wrapping_mul(31).wrapping_add(i) as u8;
    }
    let sum = checksum(&buf[12..]);
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    buf[8..12].copy_from_slice(&sum.to_le_bytes());
}

/// The sequence number of a message, after checking its length and checksum.
pub fn check(msg: &[u8]) -> u64 {
    assert!(msg.len() >= 16, "message of {} bytes", msg.len());
    let seq = u64::from_le_bytes(msg[..8].try_into().unwrap());
    assert_eq!(msg.len(), msg_len(seq), "message {seq}: wrong length");
    let sum = u32::from_le_bytes(msg[8..12].try_into().unwrap());
    assert_eq!(
        sum,
        checksum(&msg[12..]),
        "message {seq}: checksum mismatch"
    );
    let mut want = vec![0u8; msg.len()];
    fill(seq, &mut want);
    assert_eq!(msg, &want[..], "message {seq}: corrupted");
    seq
}

pub fn publish(p: &mut Publisher, seq: u64) {
    let mut loan = p.loan(msg_len(seq)).unwrap();
    fill(seq, &mut loan);
    loan.publish().unwrap();
}

/// The overwrite tests' own flow control for their fast subscribers (those `fast`
/// picks), which must lose nothing: waits until each is within half the ring of `slots`.
pub fn keep_within_half_the_ring(
    publisher: &Publisher,
    slots: usize,
    fast: impl Fn(&SubscriberInfo) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    while publisher
        .subscribers()
        .iter()
        .any(|s| fast(s) && s.lag > slots as u64 / 2)
    {
        assert!(Instant::now() < deadline, "fast subscribers stopped");
        std::thread::yield_now();
    }
}

/// Publishes message `seq` (the publisher may be non-blocking).
pub fn try_publish(p: &mut Publisher, seq: u64) -> Result<(), ErrorKind> {
    let mut loan = p.loan(msg_len(seq)).map_err(|e| e.kind())?;
    fill(seq, &mut loan);
    loan.publish().map_err(|e| e.kind())
}

/// The start of the killed-subscriber tests, on a topic of at most two subscribers: a
/// reader and an idle subscriber join, and a third is refused.
pub fn reader_and_idle_fill_the_topic(
    publisher: &mut Publisher,
    addr: &str,
) -> (ChildProc, ChildProc) {
    let reader = ChildProc::spawn("reader", addr, "");
    let idle = ChildProc::spawn("idle", addr, "");
    publisher.wait_for_subscribers(2, WAIT).unwrap();
    let e = Subscriber::connect(addr, &PubSubOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    assert!(e.to_string().contains("maximum of 2"), "{e}");
    (reader, idle)
}

/// Publishes message `seq` once the subscriber that held the publisher up is gone: it
/// was killed at `killed`, and the publisher must be free within 5 s (it waits on the
/// publisher's fd meanwhile).
pub fn publish_once_freed(p: &mut Publisher, seq: u64, killed: Instant) {
    let deadline = killed + Duration::from_secs(5);
    loop {
        match try_publish(p, seq) {
            Ok(()) => return,
            Err(ErrorKind::WouldBlock) => {
                let left = deadline.saturating_duration_since(Instant::now());
                assert!(!left.is_zero(), "publisher still blocked 5 s after SIGKILL");
                readable(p, left);
            }
            Err(e) => panic!("{e:?}"),
        }
    }
}

/// The end of the killed-subscriber tests, message `seq` next: a late subscriber takes
/// the freed slot, 1,000 more messages go out (the publisher blocking), then the end of
/// the stream. `reader` received every message from the first, the late one every
/// message from its joining; three joined in all, one left.
pub fn late_subscriber_takes_the_slot(
    mut publisher: Publisher,
    addr: &str,
    mut seq: u64,
    mut reader: ChildProc,
) {
    let mut late = ChildProc::spawn("reader", addr, "");
    publisher.wait_for_subscribers(2, WAIT).unwrap();
    let first_late = seq;
    publisher.set_nonblocking(false);
    for _ in 0..1000 {
        publish(&mut publisher, seq);
        seq += 1;
    }
    let stats = publisher.stats();
    assert_eq!(
        (stats.joined, stats.left, stats.detached),
        (3, 1, 0),
        "{stats:?}"
    );
    publisher.close().unwrap();
    assert_eq!(
        reader.report("result"),
        format!("first=0 received={seq} error=EndOfStream")
    );
    assert_eq!(
        late.report("result"),
        format!("first={first_late} received=1000 error=EndOfStream")
    );
    reader.expect_success();
    late.expect_success();
}

pub fn kind_name(k: ErrorKind) -> String {
    format!("{k:?}")
}

// ---------------------------------------------------------------------------------------
// The child side.

/// The child's entry point (each test file calls it from its `child_main` test): a
/// no-op in normal runs; with [`ROLE_VAR`] set it plays that
/// role and ends the process without returning.
pub fn child_main() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    let addr = std::env::var(ADDR_VAR).expect("child without an address");
    let arg = std::env::var(ARG_VAR).unwrap_or_default();
    let opts = PubSubOptions::default().options(Options::default().connect_timeout(WAIT));
    let connect =
        || Subscriber::connect(&addr, &opts).unwrap_or_else(|e| panic!("child {role}: {e}"));
    match role.as_str() {
        // Reads until an error; reports the first sequence number, the count (all
        // consecutive, intact) and the error.
        "reader" => {
            let mut sub = connect();
            report("result", &read_all(&mut sub));
        }
        // Like "reader", after the test says "go".
        "wait-then-read" => {
            let mut sub = connect();
            wait_for_go();
            report("result", &read_all(&mut sub));
        }
        // Reads slowly (a pause of 1 ms every ARG messages, default 16); checks each loss
        // report against the gap it leaves.
        "slow" => {
            let every: u64 = arg.parse().unwrap_or(16);
            let mut sub = connect();
            let (mut next, mut received, mut missed, mut events) = (0u64, 0u64, 0u64, 0u64);
            let mut buf = [0u8; 64];
            loop {
                match sub.recv(&mut buf) {
                    Ok(n) => {
                        let seq = check(&buf[..n]);
                        assert_eq!(seq, next, "gap not reported (missed so far {missed})");
                        next += 1;
                        received += 1;
                        if received % every == 0 {
                            // Deliberately slow: this is the behaviour under test.
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::Lagged => {
                        let m = e.missed().expect("Lagged carries a count");
                        assert!(m > 0);
                        next += m;
                        missed += m;
                        events += 1;
                    }
                    Err(e) if e.kind() == ErrorKind::EndOfStream => break,
                    Err(e) => panic!("slow subscriber: {e}"),
                }
            }
            let stats = sub.stats();
            report(
                "result",
                &format!(
                    "received={received} missed={missed} events={events} stats_missed={}",
                    stats.missed
                ),
            );
        }
        // Subscribes and reads nothing; stays until killed or its stdin closes.
        "idle" => {
            let _sub = connect();
            idle();
        }
        // Subscribes, reads nothing until "go", then expects to be detached, subscribes
        // again and reads to the end.
        "stall" => {
            let mut sub = connect();
            wait_for_go();
            let mut buf = [0u8; 64];
            let mut next = None;
            let err = loop {
                match sub.recv(&mut buf) {
                    Ok(n) => {
                        // Whatever arrives before the detachment is consecutive.
                        let seq = check(&buf[..n]);
                        assert_eq!(seq, next.unwrap_or(seq), "lost before detachment");
                        next = Some(seq + 1);
                    }
                    Err(e) => break e,
                }
            };
            report("detached", &format!("error={}", kind_name(err.kind())));
            drop(sub);
            let mut sub = connect();
            report("result", &read_all(&mut sub));
        }
        // Binds the topic, waits for the subscribers, publishes, stays until killed.
        "publisher" => {
            let (subs, count) = arg.split_once(' ').unwrap();
            let (subs, count): (usize, u64) = (subs.parse().unwrap(), count.parse().unwrap());
            let mut p = Publisher::bind(&addr, &PubSubOptions::default()).unwrap();
            report("bound", &p.local_addr());
            p.wait_for_subscribers(subs, WAIT).unwrap();
            for seq in 0..count {
                publish(&mut p, seq);
            }
            report("sent", "");
            idle();
        }
        // Attacks the topic, reports, then scribbles over everything it can write and
        // floods its socket until killed — subscribing again whenever the publisher
        // detaches it (a scribbled cursor gives it away), so that the topic keeps a
        // hostile member.
        "hostile" => {
            let subscribe = || {
                shmlink_testkit::HostileSubscriber::connect(&addr)
                    .unwrap_or_else(|e| panic!("child hostile: {e}"))
            };
            let mut h = subscribe();
            let results: Vec<String> = h
                .attack_topic()
                .into_iter()
                .map(|(what, r)| match r {
                    Ok(()) => format!("{what}: OK"),
                    Err(e) => format!("{what}: refused ({e})"),
                })
                .collect();
            report("attacked", &results.join("; "));
            report("scribbling", "");
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ std::process::id() as u64;
            loop {
                h.scribble(&mut seed, 64);
                match h.send(&[0xff; 32]) {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    // The publisher shut our socket down: detached.
                    Err(_) => h = subscribe(),
                }
                std::thread::yield_now();
            }
        }
        other => panic!("unknown child role {other:?}"),
    }
    std::process::exit(0)
}

/// Reads until an error: "first=F received=N error=KIND", all messages consecutive.
pub fn read_all(sub: &mut Subscriber) -> String {
    let mut buf = [0u8; 64];
    let (mut first, mut next, mut received) = (None, 0u64, 0u64);
    let err = loop {
        match sub.recv(&mut buf) {
            Ok(n) => {
                let seq = check(&buf[..n]);
                if first.is_none() {
                    first = Some(seq);
                    next = seq;
                }
                assert_eq!(seq, next, "out of order or lost");
                next += 1;
                received += 1;
            }
            Err(e) => break e,
        }
    };
    format!(
        "first={} received={received} error={}",
        first.unwrap_or(0),
        kind_name(err.kind())
    )
}

pub fn report(what: &str, rest: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{MARK} {what} {rest}").unwrap();
    out.flush().unwrap();
}

pub fn wait_for_go() {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "go");
}

/// Blocks until the test closes our stdin (or dies).
pub fn idle() -> ! {
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    std::process::exit(3)
}

// ---------------------------------------------------------------------------------------
// The test side.

/// Runs one test body alone (the fan-out tests need the CPUs) under a deadline.
pub fn run(name: &str, body: impl FnOnce() + Send + 'static) {
    static SERIAL: Mutex<()> = Mutex::new(());
    super::common::serially_within(&SERIAL, name, TEST_DEADLINE, body);
}

/// Whether `fd` turns readable within `timeout`.
pub fn readable(fd: &impl AsFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd that lives across the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n == 1
}

/// A child process playing a role; killed and reaped on drop if still running.
pub struct ChildProc {
    role: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    status: Option<ExitStatus>,
}

impl ChildProc {
    pub fn spawn(role: &str, addr: &str, arg: &str) -> ChildProc {
        let mut child = rerun_ignored("child_main")
            .env(ROLE_VAR, role)
            .env(ADDR_VAR, addr)
            .env(ARG_VAR, arg)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        // A reader thread, so that waiting for a report can have a deadline.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildProc {
            role: role.to_string(),
            stdin: child.stdin.take(),
            child,
            lines,
            status: None,
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The rest of the child's next `MARK what` line (the test harness prints text of
    /// its own, some of it on the same line).
    pub fn report(&mut self, what: &str) -> String {
        let mark = format!("{MARK} {what}");
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some((_, rest)) = line.split_once(&mark) {
                        return rest.trim().to_string();
                    }
                }
                Err(_) => {
                    let status = self.child.try_wait().unwrap();
                    panic!(
                        "child {} ({}): no {what:?} report within {WAIT:?} (status {status:?})",
                        self.role,
                        self.id()
                    );
                }
            }
        }
    }

    /// Sends a line to the child's stdin.
    pub fn say(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Sends SIGKILL; returns the instant just before.
    pub fn sigkill(&mut self) -> Instant {
        assert!(self.status.is_none(), "child {} already reaped", self.role);
        let pid = self.child.id() as libc::pid_t;
        let at = Instant::now();
        // SAFETY: kill has no memory-safety preconditions; `pid` is our child and not yet
        // reaped, so the number cannot name another process.
        let r = unsafe { libc::kill(pid, libc::SIGKILL) };
        assert_eq!(r, 0, "kill: {}", std::io::Error::last_os_error());
        at
    }

    pub fn wait(&mut self) -> ExitStatus {
        if self.status.is_none() {
            drop(self.stdin.take());
            self.status = Some(self.child.wait().unwrap());
        }
        self.status.unwrap()
    }

    pub fn expect_killed(&mut self) {
        let status = self.wait();
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "child {}: {status}",
            self.role
        );
    }

    pub fn expect_success(&mut self) {
        let status = self.wait();
        assert!(
            status.success(),
            "child {} ({}): {status}",
            self.role,
            self.id()
        );
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

/// Each of `children` received messages 0 to `total - 1`, then end-of-stream, and
/// exited successfully.
pub fn expect_everything_received(children: &mut [ChildProc], total: u64) {
    for c in children {
        assert_eq!(
            c.report("result"),
            format!("first=0 received={total} error=EndOfStream"),
            "subscriber {}",
            c.id()
        );
        c.expect_success();
    }
}

/// The number after `name=` in a child's report.
pub fn field(report: &str, name: &str) -> u64 {
    report
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {report:?}"))
        .parse()
        .unwrap()
}

/// A `slow` subscriber's report under `overwrite` after `total` messages: it lagged,
/// and what it received and the losses it was told of (in events and in its stats) add
/// up to `total` exactly. `what` names it on stderr.
pub fn expect_exact_losses(slow: &mut ChildProc, total: u64, what: &str) {
    let r = slow.report("result");
    let (received, missed, events) = (
        field(&r, "received"),
        field(&r, "missed"),
        field(&r, "events"),
    );
    eprintln!("{what}: {r}");
    assert_eq!(received + missed, total, "{r}");
    assert!(
        missed > 0 && events > 0,
        "the slow subscriber never lagged: {r}"
    );
    assert_eq!(field(&r, "stats_missed"), missed, "{r}");
    slow.expect_success();
}
