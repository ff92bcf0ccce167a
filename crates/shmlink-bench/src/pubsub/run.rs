//! One pub/sub run as processes. The orchestrator starts the publisher process
//! (`shmlink-bench __bench-pub SPEC`, pinned to the first CPU), which sets the method up and
//! starts one subscriber process per subscriber (`shmlink-bench __bench-sub SPEC`, pinned to
//! the second CPU; they die with the publisher, `PR_SET_PDEATHSIG`). Each subscriber
//! has a side channel to the publisher (a Unix stream socket pair, outside the method):
//! it says when it has subscribed, and acknowledges every message.
//!
//! Pacing: the publisher publishes one message, waits until every subscriber has
//! acknowledged it (a page of one message), pauses for [`GAP`], and publishes the next.
//! So no message ever waits behind another in a queue: what is measured is the way from
//! one publish call to N subscribers, each of them waiting when the message comes. A
//! lone subscriber has its CPU to itself and busy-polls through the pause (bounded by
//! [`OWN_CPU_SPIN`](super::methods::OWN_CPU_SPIN)), as a latency-sensitive deployment
//! with a core per subscriber would; subscribers that share a CPU poll only briefly
//! ([`SPIN`](super::methods::SPIN)) and are asleep when the message comes, so their
//! latency is a wake-up's. The first `warmup` messages are not measured.
//!
//! What is measured, per message:
//!
//! - **latency** at each subscriber: from the publisher's clock read just before the
//!   publish call (stamped into the message, see [`message`]) to the subscriber's clock
//!   read when the message is in its hands (after the copy, for copying methods), before
//!   verification. Every message is verified in full at every subscriber.
//! - **time in publish**: wall time inside the publish call(s) (for a zero-copy method:
//!   the loan and the publish, not the filling in between).
//! - **publisher CPU**: the publisher process's CPU time (`CLOCK_PROCESS_CPUTIME_ID`)
//!   over the measured part minus its main thread's (`CLOCK_THREAD_CPUTIME_ID`), i.e.
//!   the method's own threads (I/O, control), plus the main thread's CPU time inside the
//!   publish calls (read around each call, with the wall clock's reads inside). The
//!   benchmark's own work — generating payloads, reading acks, pausing — is left out;
//!   the whole process's CPU is reported too.
//!
//! A failure anywhere (a subscriber that exits, a wrong message, an ack that does not
//! come within [`ACK_TIMEOUT`]) fails the run with the reason on stderr; the orchestrator
//! kills a run that exceeds its timeout and lets the method clean up. [`FAULT_ENV`]
//! injects such failures for tests (see [`crate::fault`]).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, ExitCode};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::message::{self, MIN_SIZE};
use super::{find, methods, Ctx, Publish};
use crate::fault;
use crate::run::{print_result, run_child, run_spec_main, spawn_hidden, FAULT_ENV};
use crate::sys::pin;
use crate::sys::{ctx, err, inherited_fd, socketpair};
use shmlink_measure::protocol::Fault;
use shmlink_measure::stats::Percentiles;

/// The hidden subcommand that runs a publisher.
pub const PUB_CMD: &str = "__bench-pub";
/// The hidden subcommand that runs a subscriber.
pub const SUB_CMD: &str = "__bench-sub";
/// With [`FAULT_ENV`]: only this method's runs inject the fault (unset: every method's);
/// `exit:N`, `hang:N`: its first subscriber; `corrupt:N`, `scribble:N`: its publisher.
pub const FAULT_METHOD_ENV: &str = "SHMLINK_BENCH_FAULT_METHOD";
/// How long the publisher waits for the subscribers to subscribe.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the publisher waits for one subscriber's acknowledgement of a message.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause after every subscriber acknowledged a message, before the next one.
pub const GAP: Duration = Duration::from_micros(50);
/// What a subscriber sends on its side channel once it has subscribed.
const READY: u64 = u64::MAX;

/// One run, as the orchestrator asks for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    pub method: String,
    pub size: usize,
    pub subscribers: usize,
    /// Messages before the measured ones.
    pub warmup: u64,
    /// Measured messages.
    pub count: u64,
    /// CPUs of the publisher and of the subscribers; `None`: not pinned.
    pub cpus: Option<(usize, usize)>,
    /// Unique name for methods that rendezvous by name.
    pub tag: String,
}

/// What one run measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunOutput {
    /// Measured messages (each delivered to every subscriber).
    pub count: u64,
    pub elapsed_ns: u64,
    /// Latency percentiles over every measured message at every subscriber.
    pub latency_ns: Percentiles,
    /// Latency percentiles of each subscriber (by index).
    pub per_subscriber_ns: Vec<Percentiles>,
    /// Wall time inside the publish call(s), per message, µs.
    pub pub_us_per_msg: f64,
    /// Publisher CPU attributable to the method, per message, µs (see the module docs).
    pub pub_cpu_us_per_msg: f64,
    /// The publisher process's whole CPU time per message, µs, the benchmark's pacing and
    /// ack handling included.
    pub pub_process_cpu_us_per_msg: f64,
    /// Each subscriber process's CPU time per message, µs, averaged over subscribers.
    pub sub_cpu_us_per_msg: f64,
}

/// A subscriber's instructions (one JSON argument).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SubSpec {
    method: String,
    size: usize,
    subscribers: usize,
    index: usize,
    warmup: u64,
    count: u64,
    cpu: Option<usize>,
    same_core: bool,
    tag: String,
    /// The side channel's fd number (inherited).
    side: RawFd,
    args: Vec<String>,
}

/// What a subscriber reports (one JSON line on its stdout).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SubReport {
    /// Latency of each measured message, ns.
    latency_ns: Vec<u64>,
    /// CPU time over the measured messages.
    cpu_ns: u64,
}

fn ctx_of(spec_size: usize, subscribers: usize, same_core: bool, tag: &str) -> Ctx {
    Ctx {
        size: spec_size,
        subscribers,
        same_core,
        tag: tag.to_string(),
        // Subscribers are all pinned to one CPU: only a lone one has it to itself.
        spin: if subscribers == 1 && !same_core {
            methods::OWN_CPU_SPIN
        } else {
            methods::SPIN
        },
    }
}

/// A started subscriber process.
struct Sub {
    child: Child,
    side: UnixStream,
    stdout: BufReader<std::process::ChildStdout>,
}

fn start_subscriber(
    exe: &Path,
    spec: &SubSpec,
    theirs: &OwnedFd,
    inherit: &[OwnedFd],
) -> io::Result<(Child, std::process::ChildStdout)> {
    let mut fds: Vec<RawFd> = inherit.iter().map(|f| f.as_raw_fd()).collect();
    fds.push(theirs.as_raw_fd());
    let spec_json = serde_json::to_string(spec).expect("a SubSpec serialises");
    let mut child = spawn_hidden(exe, SUB_CMD, &spec_json, fds)
        .map_err(ctx(format!("start subscriber {}", spec.index)))?;
    let stdout = child.stdout.take().expect("stdout is piped");
    Ok((child, stdout))
}

/// Reads one 8-byte word from subscriber `i`'s side channel (which has a read timeout).
fn read_word(side: &mut UnixStream, i: usize, what: &dyn Fn() -> String) -> io::Result<u64> {
    let mut b = [0u8; 8];
    side.read_exact(&mut b).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => err(format!(
            "subscriber {i} did not {} within {ACK_TIMEOUT:?}",
            what()
        )),
        io::ErrorKind::UnexpectedEof => err(format!(
            "subscriber {i} went away before it could {}",
            what()
        )),
        _ => ctx(format!("subscriber {i}: side channel"))(e),
    })?;
    Ok(u64::from_le_bytes(b))
}

/// The wall time and the calling thread's CPU time at one moment.
#[derive(Clone, Copy)]
struct Mark {
    wall: Instant,
    cpu: Duration,
}

impl Mark {
    /// Reads both clocks; the thread's CPU clock on the outside, so the interval between
    /// two marks that it measures includes the wall clock's reads, not the reverse.
    #[inline]
    fn start() -> Mark {
        let cpu = message::thread_cpu();
        Mark {
            wall: Instant::now(),
            cpu,
        }
    }

    #[inline]
    fn end() -> Mark {
        let wall = Instant::now();
        Mark {
            wall,
            cpu: message::thread_cpu(),
        }
    }

    /// (wall, CPU) from `self` to `later`.
    fn to(self, later: Mark) -> (Duration, Duration) {
        (later.wall - self.wall, later.cpu.saturating_sub(self.cpu))
    }
}

/// Publishes message `seq`, damaged as `fault` says (for tests); returns the wall time and
/// this thread's CPU time spent in the method's calls.
fn publish_one(
    p: &mut dyn Publish,
    buf: &mut [u8],
    seq: u64,
    fault: Option<Fault>,
) -> io::Result<(Duration, Duration)> {
    if let Some(zc) = p.in_place() {
        let mut marks: Option<(Mark, Mark)> = None;
        let m0 = Mark::start();
        zc.publish_in_place(buf.len(), &mut |b| {
            let loaned = Mark::end();
            message::fill(b, seq);
            message::damage(b, seq, fault);
            let filled = Mark::start();
            message::stamp(b);
            marks = Some((loaned, filled));
        })?;
        let m1 = Mark::end();
        let (loaned, filled) = marks.ok_or_else(|| err("the method did not fill a message"))?;
        let (a, b) = (m0.to(loaned), filled.to(m1));
        return Ok((a.0 + b.0, a.1 + b.1));
    }
    message::fill(buf, seq);
    message::damage(buf, seq, fault);
    let m0 = Mark::start();
    message::stamp(buf);
    p.publish(buf)?;
    Ok(m0.to(Mark::end()))
}

/// Runs `spec` in this process (the publisher) with subscribers started from `exe`.
pub fn publish(spec: &RunSpec, exe: &Path) -> io::Result<RunOutput> {
    let method =
        find(&spec.method).ok_or_else(|| err(format!("unknown method {:?}", spec.method)))?;
    if spec.size < MIN_SIZE {
        return Err(err(format!(
            "{}-byte messages are too small (at least {MIN_SIZE})",
            spec.size
        )));
    }
    if spec.subscribers == 0 || spec.count == 0 {
        return Err(err("a run needs at least one subscriber and one message"));
    }
    let total = spec.warmup.saturating_add(spec.count);
    let fault = publisher_fault(&spec.method);
    fault::reached(fault, total).map_err(err)?;
    pin(spec.cpus.map(|c| c.0))?;
    let same_core = spec.cpus.is_some_and(|(a, b)| a == b);
    let c = ctx_of(spec.size, spec.subscribers, same_core, &spec.tag);
    let prepared = method.prepare(&c).map_err(ctx("set up"))?;
    if prepared.args.len() != spec.subscribers || prepared.inherit.len() != spec.subscribers {
        return Err(err("the method prepared the wrong number of subscribers"));
    }
    let mut subs = Vec::with_capacity(spec.subscribers);
    for (index, (args, inherit)) in prepared.args.into_iter().zip(prepared.inherit).enumerate() {
        let (mine, theirs) = socketpair(libc::SOCK_STREAM)?;
        let sub = SubSpec {
            method: spec.method.clone(),
            size: spec.size,
            subscribers: spec.subscribers,
            index,
            warmup: spec.warmup,
            count: spec.count,
            cpu: spec.cpus.map(|c| c.1),
            same_core,
            tag: spec.tag.clone(),
            side: theirs.as_raw_fd(),
            args,
        };
        let (child, stdout) = start_subscriber(exe, &sub, &theirs, &inherit)?;
        let side = UnixStream::from(mine);
        side.set_read_timeout(Some(ACK_TIMEOUT))
            .map_err(ctx("SO_RCVTIMEO"))?;
        subs.push(Sub {
            child,
            side,
            stdout: BufReader::new(stdout),
        });
    }
    for (i, s) in subs.iter_mut().enumerate() {
        let word = read_word(&mut s.side, i, &|| "subscribe".to_string())?;
        if word != READY {
            return Err(err(format!("subscriber {i} sent {word} instead of ready")));
        }
    }
    let mut publisher = (prepared.finish)(SETUP_TIMEOUT).map_err(ctx("wait for subscribers"))?;

    let mut buf = vec![0u8; spec.size];
    let mut in_publish = Duration::ZERO;
    let mut in_publish_cpu = Duration::ZERO;
    let mut start = (
        Instant::now(),
        message::process_cpu(),
        message::thread_cpu(),
    );
    for seq in 0..total {
        if seq == spec.warmup {
            start = (
                Instant::now(),
                message::process_cpu(),
                message::thread_cpu(),
            );
        }
        let (wall, cpu) = publish_one(publisher.as_mut(), &mut buf, seq, fault)
            .map_err(ctx(format!("publish #{seq}")))?;
        if seq >= spec.warmup {
            in_publish += wall;
            in_publish_cpu += cpu;
        }
        for (i, s) in subs.iter_mut().enumerate() {
            let ack = read_word(&mut s.side, i, &|| format!("acknowledge message #{seq}"))?;
            if ack != seq {
                return Err(err(format!(
                    "subscriber {i} acknowledged #{ack}, expected #{seq}"
                )));
            }
        }
        std::thread::sleep(GAP);
    }
    let elapsed = start.0.elapsed();
    let process = message::process_cpu().saturating_sub(start.1);
    let main = message::thread_cpu().saturating_sub(start.2);

    let mut all = Vec::new();
    let mut per_sub = Vec::with_capacity(subs.len());
    let mut sub_cpu = Duration::ZERO;
    for (i, s) in subs.iter_mut().enumerate() {
        let mut line = String::new();
        s.stdout
            .read_line(&mut line)
            .map_err(ctx(format!("read subscriber {i}'s report")))?;
        let mut r: SubReport = serde_json::from_str(line.trim())
            .map_err(|e| err(format!("subscriber {i}'s report {line:?}: {e}")))?;
        if r.latency_ns.len() as u64 != spec.count {
            return Err(err(format!(
                "subscriber {i} measured {} messages, expected {}",
                r.latency_ns.len(),
                spec.count
            )));
        }
        all.extend_from_slice(&r.latency_ns);
        per_sub.push(Percentiles::of(&mut r.latency_ns).expect("count > 0"));
        sub_cpu += Duration::from_nanos(r.cpu_ns);
    }
    drop(publisher);
    for (i, mut s) in subs.into_iter().enumerate() {
        drop(s.side);
        let status = s
            .child
            .wait()
            .map_err(ctx(format!("wait for subscriber {i}")))?;
        if !status.success() {
            return Err(err(format!("subscriber {i} failed at exit: {status}")));
        }
    }
    let n = spec.count as f64;
    let us = |d: Duration| d.as_nanos() as f64 / 1000.0 / n;
    Ok(RunOutput {
        count: spec.count,
        elapsed_ns: elapsed.as_nanos() as u64,
        latency_ns: Percentiles::of(&mut all).expect("count > 0"),
        per_subscriber_ns: per_sub,
        pub_us_per_msg: us(in_publish),
        pub_cpu_us_per_msg: us(process.saturating_sub(main) + in_publish_cpu),
        pub_process_cpu_us_per_msg: us(process),
        sub_cpu_us_per_msg: us(sub_cpu) / spec.subscribers as f64,
    })
}

/// A fault a subscriber injects, for tests of failure handling ([`FAULT_ENV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SubFault {
    /// `exit:N`: exit with status 3 when message #N is due (a crash mid-run).
    Exit(u64),
    /// `hang:N`: stop at message #N, neither receiving nor acknowledging (a hung
    /// subscriber; it dies with the publisher).
    Hang(u64),
}

/// The data fault in [`FAULT_ENV`] (`corrupt:N`, `scribble:N`) the publisher of `method`
/// injects: every subscriber must catch it. Only into the method in [`FAULT_METHOD_ENV`]
/// if set.
fn publisher_fault(method: &str) -> Option<Fault> {
    let method_ok = std::env::var(FAULT_METHOD_ENV).map_or(true, |m| m == method);
    fault::data_fault().filter(|_| method_ok)
}

/// Whether this subscriber injects the fault in [`FAULT_ENV`]: only the first
/// subscriber, of the method in [`FAULT_METHOD_ENV`] if set. (`corrupt:N` and
/// `scribble:N` are the publisher's: [`publisher_fault`].)
fn fault_for(spec: &SubSpec) -> Option<SubFault> {
    let text = std::env::var(FAULT_ENV).ok()?;
    let fault = match text.split_once(':') {
        Some(("hang", n)) => SubFault::Hang(n.parse().ok()?),
        _ => match Fault::parse(&text)? {
            Fault::Exit(n) => SubFault::Exit(n),
            Fault::Corrupt(_) | Fault::Scribble(_) => return None,
        },
    };
    let method_ok = std::env::var(FAULT_METHOD_ENV).map_or(true, |m| m == spec.method);
    (spec.index == 0 && method_ok).then_some(fault)
}

fn subscribe(spec: &SubSpec) -> io::Result<SubReport> {
    pin(spec.cpu)?;
    let mut side = UnixStream::from(inherited_fd(&spec.side.to_string())?);
    let method =
        find(&spec.method).ok_or_else(|| err(format!("unknown method {:?}", spec.method)))?;
    let c = ctx_of(spec.size, spec.subscribers, spec.same_core, &spec.tag);
    let mut rx = method.subscribe(&c, &spec.args).map_err(ctx("subscribe"))?;
    side.write_all(&READY.to_le_bytes())
        .map_err(ctx("say ready"))?;
    let fault = fault_for(spec);
    let total = spec.warmup.saturating_add(spec.count);
    // Bounded: a count is whatever the command line said.
    let mut lat = Vec::with_capacity(spec.count.min(1 << 20) as usize);
    let mut cpu0 = message::process_cpu();
    for seq in 0..total {
        if seq == spec.warmup {
            cpu0 = message::process_cpu();
        }
        match fault {
            Some(SubFault::Exit(n)) if n == seq => {
                eprintln!(
                    "subscriber {}: injected fault: exiting at message #{seq}",
                    spec.index
                );
                std::process::exit(3);
            }
            Some(SubFault::Hang(n)) if n == seq => {
                eprintln!(
                    "subscriber {}: injected fault: hanging at message #{seq}",
                    spec.index
                );
                loop {
                    std::thread::park();
                }
            }
            _ => {}
        }
        rx.recv(&mut |msg| {
            let now = message::now_ns();
            let l = (msg.len() >= message::STAMP).then(|| message::latency(msg, now));
            message::verify(msg, seq, spec.size).map_err(|e| err(e.to_string()))?;
            if seq >= spec.warmup {
                lat.extend(l);
            }
            Ok(())
        })
        .map_err(ctx(format!("receive #{seq}")))?;
        side.write_all(&seq.to_le_bytes())
            .map_err(ctx(format!("acknowledge #{seq}")))?;
    }
    let cpu = message::process_cpu().saturating_sub(cpu0);
    Ok(SubReport {
        latency_ns: lat,
        cpu_ns: cpu.as_nanos() as u64,
    })
}

/// `shmlink-bench __bench-pub SPEC`: prints the run's [`RunOutput`] as JSON; exit 1 with the
/// error on stderr on failure.
pub fn publisher_main(spec_json: &str) -> ExitCode {
    run_spec_main(spec_json, "publisher: ", publish)
}

/// `shmlink-bench __bench-sub SPEC`: one subscriber of a run.
pub fn subscriber_main(spec_json: &str) -> ExitCode {
    let res = serde_json::from_str::<SubSpec>(spec_json)
        .map_err(|e| err(format!("bad subscriber spec: {e}")))
        .and_then(|spec| {
            subscribe(&spec).map_err(|e| err(format!("subscriber {}: {e}", spec.index)))
        });
    print_result(res, "")
}

/// Runs `spec` in a publisher process started from `exe` (the `shmlink-bench` binary), killing
/// it after `timeout`. The error is what the publisher and subscribers said on stderr.
pub fn run_isolated(exe: &Path, spec: &RunSpec, timeout: Duration) -> Result<RunOutput, String> {
    let clean_up = || {
        if let Some(m) = find(&spec.method) {
            m.clean_up_after_failure(&spec.tag);
        }
    };
    let stdout = run_child(
        exe,
        PUB_CMD,
        &serde_json::to_string(spec).expect("a RunSpec serialises"),
        timeout,
        &clean_up,
    )?;
    serde_json::from_str(stdout.trim()).map_err(|e| format!("unreadable result {stdout:?}: {e}"))
}
