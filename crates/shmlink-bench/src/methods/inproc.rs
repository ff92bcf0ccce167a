//! `--pattern inproc`: two threads of one process, in-process shmlink (`shm:` with
//! `Options::in_process`) against the channels people use between threads:
//! `std::sync::mpsc` (`sync_channel`), `crossbeam-channel`, `flume` (bounded) and
//! `tokio::sync::mpsc` used from plain threads (`blocking_send`/`blocking_recv`).
//!
//! Every method carries byte messages the same way: the sender copies the caller's bytes
//! in (shmlink into its ring slot, a channel into a new `Vec<u8>`), the receiver copies
//! them out into its buffer. Each direction holds at most what a 1 MiB shmlink ring
//! holds: the channels are bounded to `1 MiB / size` messages (1 to 1024), shmlink to
//! 1 MiB in flight (and two messages of any size) and 1024 messages.
//!
//! - **Round trip**: the measuring thread sends, the echo thread checks the message and
//!   sends it back, the measuring thread checks the echo; every round trip is timed
//!   (`Instant`, two clock reads) but those whose messages were checksummed in full (see
//!   below), p50 and p99 reported.
//! - **Throughput**: the measuring thread sends `n` messages back to back, the other
//!   receives and checks them all and answers once; messages per second over the whole.
//!
//! Every message is a data message of [`shmlink_measure::payload`] and is checked the
//! way the point-to-point bench checks it, by the same code ([`Checker`](shmlink_measure::verify::Checker)): its length and
//! both copies of its sequence number always, every byte for the first laps and for a
//! random one in 16 chosen from a seed the checking ends share
//! ([`shmlink_measure::verify`]). `SHMLINK_BENCH_FAULT=corrupt:N|scribble:N` makes the
//! measuring thread damage the message(s) it sends (for tests: the run must fail).
//!
//! The two threads are pinned to two different allowed CPUs (one CPU: both on it).

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use shmlink::{Connection, Listener, Options};
use shmlink_measure::payload;
use shmlink_measure::protocol::Fault;
use shmlink_measure::verify::{fresh_seed, Checker, Sampling};

/// Ring bytes per direction (the same as the two-process `shm` rows).
pub const RING: usize = 1 << 20;
/// Most messages in flight per direction.
const MAX_SLOTS: usize = 1024;

/// One end of an in-process pair, moved to its thread.
pub trait Chan: Send {
    /// Sends a copy of `msg`.
    fn send(&mut self, msg: &[u8]) -> io::Result<()>;
    /// Receives one message into `buf`; returns its length.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
}

/// Both ends of a pair: the measuring end, the other end.
pub type Pair = (Box<dyn Chan>, Box<dyn Chan>);

/// A method: its name, what it is, and how to make a connected pair for `size`-byte
/// messages.
pub struct InprocMethod {
    pub name: &'static str,
    pub about: &'static str,
    pub pair: fn(size: usize) -> io::Result<Pair>,
}

/// Every method, in table order.
pub static METHODS: &[InprocMethod] = &[
    InprocMethod {
        name: "shmlink-inproc",
        about: "shmlink shm: with Options::in_process (in-process ring, park/unpark), default wait policy",
        pair: shmlink_pair,
    },
    InprocMethod {
        name: "std-mpsc",
        about: "std::sync::mpsc::sync_channel, Vec<u8> messages",
        pair: std_pair,
    },
    InprocMethod {
        name: "crossbeam-channel",
        about: "crossbeam_channel::bounded, Vec<u8> messages",
        pair: crossbeam_pair,
    },
    InprocMethod {
        name: "flume",
        about: "flume::bounded, Vec<u8> messages",
        pair: flume_pair,
    },
    InprocMethod {
        name: "tokio-mpsc-blocking",
        about: "tokio::sync::mpsc::channel, blocking_send/blocking_recv from plain threads",
        pair: tokio_pair,
    },
];

/// The method called `name`.
pub fn find(name: &str) -> Option<&'static InprocMethod> {
    METHODS.iter().find(|m| m.name == name)
}

/// Messages a bounded channel holds per direction for `size`-byte messages.
pub fn capacity(size: usize) -> usize {
    (RING / size.max(1)).clamp(1, MAX_SLOTS)
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the other end is gone")
}

fn copy_out(v: &[u8], buf: &mut [u8]) -> io::Result<usize> {
    let dst = buf
        .get_mut(..v.len())
        .ok_or_else(|| io::Error::other(format!("message of {} bytes too large", v.len())))?;
    dst.copy_from_slice(v);
    Ok(v.len())
}

struct ShmlinkChan(Connection);

impl Chan for ShmlinkChan {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        self.0
            .send(msg)
            .map_err(|e| io::Error::other(e.to_string()))
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0
            .recv(buf)
            .map_err(|e| io::Error::other(e.to_string()))
    }
}

fn shmlink_pair(size: usize) -> io::Result<Pair> {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let addr = format!(
        "shm:@shmlink-bench-inproc-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let opts = Options::default()
        .in_process(true)
        .ring_size(RING)
        .max_msg_size(size.max(Options::default().configured_max_msg_size()));
    let err = |e: shmlink::Error| io::Error::other(e.to_string());
    let mut l = Listener::bind(&addr, &opts).map_err(err)?;
    let c = Connection::connect(&addr, &opts).map_err(err)?;
    let s = l.accept().map_err(err)?;
    Ok((Box::new(ShmlinkChan(c)), Box::new(ShmlinkChan(s))))
}

/// A channel end pair over any channel type with `Vec<u8>` messages.
macro_rules! channel_chan {
    ($name:ident, $tx:ty, $rx:ty, |$t:ident, $m:ident| $send:expr, |$r:ident| $recv:expr) => {
        struct $name {
            tx: $tx,
            rx: $rx,
        }

        impl Chan for $name {
            fn send(&mut self, msg: &[u8]) -> io::Result<()> {
                let $t = &mut self.tx;
                let $m = msg.to_vec();
                $send.map_err(|_| gone())
            }

            fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let $r = &mut self.rx;
                let v: Vec<u8> = $recv.ok_or_else(gone)?;
                copy_out(&v, buf)
            }
        }
    };
}

channel_chan!(
    StdChan,
    std::sync::mpsc::SyncSender<Vec<u8>>,
    std::sync::mpsc::Receiver<Vec<u8>>,
    |t, m| t.send(m),
    |r| r.recv().ok()
);

fn std_pair(size: usize) -> io::Result<Pair> {
    let (at, ar) = std::sync::mpsc::sync_channel(capacity(size));
    let (bt, br) = std::sync::mpsc::sync_channel(capacity(size));
    Ok((
        Box::new(StdChan { tx: at, rx: br }),
        Box::new(StdChan { tx: bt, rx: ar }),
    ))
}

channel_chan!(
    CrossbeamChan,
    crossbeam_channel::Sender<Vec<u8>>,
    crossbeam_channel::Receiver<Vec<u8>>,
    |t, m| t.send(m),
    |r| r.recv().ok()
);

fn crossbeam_pair(size: usize) -> io::Result<Pair> {
    let (at, ar) = crossbeam_channel::bounded(capacity(size));
    let (bt, br) = crossbeam_channel::bounded(capacity(size));
    Ok((
        Box::new(CrossbeamChan { tx: at, rx: br }),
        Box::new(CrossbeamChan { tx: bt, rx: ar }),
    ))
}

channel_chan!(
    FlumeChan,
    flume::Sender<Vec<u8>>,
    flume::Receiver<Vec<u8>>,
    |t, m| t.send(m),
    |r| r.recv().ok()
);

fn flume_pair(size: usize) -> io::Result<Pair> {
    let (at, ar) = flume::bounded(capacity(size));
    let (bt, br) = flume::bounded(capacity(size));
    Ok((
        Box::new(FlumeChan { tx: at, rx: br }),
        Box::new(FlumeChan { tx: bt, rx: ar }),
    ))
}

channel_chan!(
    TokioChan,
    tokio::sync::mpsc::Sender<Vec<u8>>,
    tokio::sync::mpsc::Receiver<Vec<u8>>,
    |t, m| t.blocking_send(m),
    |r| r.blocking_recv()
);

fn tokio_pair(size: usize) -> io::Result<Pair> {
    let (at, ar) = tokio::sync::mpsc::channel(capacity(size));
    let (bt, br) = tokio::sync::mpsc::channel(capacity(size));
    Ok((
        Box::new(TokioChan { tx: at, rx: br }),
        Box::new(TokioChan { tx: bt, rx: ar }),
    ))
}

/// One measurement of one method at one size.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    /// `round-trip` or `throughput`.
    pub kind: &'static str,
    pub method: &'static str,
    pub size: usize,
    /// Round trips timed, or messages streamed.
    pub count: u64,
    pub rounds: u32,
    /// Round trip percentiles (0 for throughput rows).
    pub p50_us: f64,
    pub p99_us: f64,
    /// Round trips or messages per second.
    pub per_s: f64,
    pub error: Option<String>,
}

impl Row {
    fn failed(kind: &'static str, method: &'static str, size: usize, e: String) -> Row {
        Row {
            kind,
            method,
            size,
            count: 0,
            rounds: 1,
            p50_us: 0.0,
            p99_us: 0.0,
            per_s: 0.0,
            error: Some(e),
        }
    }
}

/// The CPUs of the measuring thread and of the other thread.
fn cpus() -> (Option<usize>, Option<usize>) {
    match shmlink_measure::cpus::allowed_cpus()[..] {
        [a, b, ..] => (Some(a), Some(b)),
        [a] => (Some(a), Some(a)),
        [] => (None, None),
    }
}

fn pin(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        // Best effort: an unpinned run still measures, only noisier.
        let _ = shmlink_sys::pin_to_cpu(cpu);
    }
}

/// Writes data message `seq` into `buf`: in full if `checker` checksums it, else only
/// what is checked of it (its sequence numbers), as the point-to-point throughput driver
/// does; then damages it as `fault` says.
fn write(buf: &mut [u8], seq: u64, checker: &Checker, fault: Option<Fault>) {
    if checker.full(seq) {
        payload::write(buf, seq);
    } else {
        payload::write_ends(buf, seq);
    }
    if let Some(f) = fault {
        f.damage(buf, seq);
    }
}

/// Checks that the `len` bytes received into `buf` are data message `seq`.
fn check(checker: &mut Checker, buf: &[u8], len: usize, seq: u64) -> io::Result<()> {
    let msg = buf
        .get(..len)
        .ok_or_else(|| io::Error::other(format!("message #{seq}: {len} bytes received")))?;
    checker
        .check(msg, seq)
        .map_err(|e| io::Error::other(e.to_string()))
}

/// The checkers of both ends of a run: the same seed, so both checksum the same
/// messages.
fn checkers(size: usize) -> io::Result<(Checker, Checker)> {
    let seed = fresh_seed()?;
    let c = || Checker::new(size, Sampling::DEFAULT, seed, false);
    Ok((c(), c()))
}

/// `Err` if `fault` would not be injected in a run of `total` messages.
fn reached(fault: Option<Fault>, total: u64) -> io::Result<()> {
    crate::fault::reached(fault, total).map_err(io::Error::other)
}

/// Runs `body` on a thread pinned to the measuring CPU, with the other end served by
/// `peer` on a thread pinned to the other CPU.
fn with_threads<T: Send + 'static>(
    method: &InprocMethod,
    size: usize,
    peer: impl FnOnce(Box<dyn Chan>) -> io::Result<()> + Send + 'static,
    body: impl FnOnce(&mut dyn Chan) -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let (a, b) = (method.pair)(size)?;
    let (mine, theirs) = cpus();
    let peer = std::thread::spawn(move || {
        pin(theirs);
        peer(b)
    });
    let measured = std::thread::spawn(move || {
        pin(mine);
        let mut a = a;
        let r = body(&mut *a);
        drop(a); // ends the peer's loop
        r
    })
    .join()
    .map_err(|_| io::Error::other("measuring thread panicked"))?;
    let served = peer
        .join()
        .map_err(|_| io::Error::other("peer thread panicked"))?;
    // The other end's failure first: it is the cause where both failed (a message it
    // rejected, after which the measuring end found it gone).
    served.map_err(|e| io::Error::other(format!("the other end: {e}")))?;
    measured
}

/// Round trips of `size` bytes: `n` measured after `n / 10` (at least 100) untimed;
/// `fault` damages what the measuring end sends (for tests).
pub fn round_trip(method: &'static InprocMethod, size: usize, n: u64, fault: Option<Fault>) -> Row {
    let warm = (n / 10).max(100);
    let run = || -> io::Result<(Vec<u64>, Duration)> {
        reached(fault, warm + n)?;
        let (mut mine, mut theirs) = checkers(size)?;
        let echo = move |mut c: Box<dyn Chan>| -> io::Result<()> {
            let mut buf = vec![0u8; size];
            let mut seq = 0;
            // Until the measuring end goes away.
            while let Ok(len) = c.recv(&mut buf) {
                check(&mut theirs, &buf, len, seq)?;
                c.send(&buf[..len])?;
                seq += 1;
            }
            Ok(())
        };
        let body = move |c: &mut dyn Chan| -> io::Result<(Vec<u64>, Duration)> {
            let mut msg = vec![0u8; size];
            let mut back = vec![0u8; size];
            let mut samples = Vec::with_capacity(n as usize);
            let mut total = Duration::ZERO;
            for seq in 0..warm + n {
                // Every byte: the echo is checked against it, and it is written before
                // the clock starts.
                payload::write(&mut msg, seq);
                if let Some(f) = fault {
                    f.damage(&mut msg, seq);
                }
                let t0 = Instant::now();
                c.send(&msg)?;
                let len = c.recv(&mut back)?;
                let dt = t0.elapsed();
                check(&mut mine, &back, len, seq)
                    .map_err(|e| io::Error::other(format!("echo: {e}")))?;
                // Round trips whose messages were checksummed in full are not timed.
                if seq >= warm && mine.timed(seq) {
                    samples.push(dt.as_nanos() as u64);
                    total += dt;
                }
            }
            Ok((samples, total))
        };
        with_threads(method, size, echo, body)
    };
    match run() {
        Ok((mut samples, total)) => {
            let timed = samples.len() as u64;
            let Some(p) = shmlink_measure::stats::Percentiles::of(&mut samples) else {
                return Row::failed(
                    "round-trip",
                    method.name,
                    size,
                    "no round trip timed".into(),
                );
            };
            Row {
                kind: "round-trip",
                method: method.name,
                size,
                count: timed,
                rounds: 1,
                p50_us: p.p50 as f64 / 1e3,
                p99_us: p.p99 as f64 / 1e3,
                per_s: timed as f64 / total.as_secs_f64(),
                error: None,
            }
        }
        Err(e) => Row::failed("round-trip", method.name, size, e.to_string()),
    }
}

/// `n` messages of `size` bytes streamed one way, then one answer; `fault` damages what
/// the measuring end sends (for tests).
pub fn throughput(method: &'static InprocMethod, size: usize, n: u64, fault: Option<Fault>) -> Row {
    let run = || -> io::Result<Duration> {
        reached(fault, n)?;
        let (sample, mut theirs) = checkers(size)?;
        let sink = move |mut c: Box<dyn Chan>| -> io::Result<()> {
            let mut buf = vec![0u8; size];
            for seq in 0..n {
                let len = c.recv(&mut buf)?;
                check(&mut theirs, &buf, len, seq)?;
            }
            c.send(&[1])?;
            // Until the measuring end goes away (it may still be receiving the answer).
            let _ = c.recv(&mut buf);
            Ok(())
        };
        let body = move |c: &mut dyn Chan| -> io::Result<Duration> {
            let mut msg = vec![0u8; size];
            let mut ack = vec![0u8; size.max(1)];
            let t0 = Instant::now();
            for seq in 0..n {
                write(&mut msg, seq, &sample, fault);
                c.send(&msg)?;
            }
            c.recv(&mut ack)?;
            Ok(t0.elapsed())
        };
        with_threads(method, size, sink, body)
    };
    match run() {
        Ok(t) => Row {
            kind: "throughput",
            method: method.name,
            size,
            count: n,
            rounds: 1,
            p50_us: 0.0,
            p99_us: 0.0,
            per_s: n as f64 / t.as_secs_f64(),
            error: None,
        },
        Err(e) => Row::failed("throughput", method.name, size, e.to_string()),
    }
}

/// The median row of several rounds (each figure's median); the first error if any.
pub fn median(rows: &[Row]) -> Row {
    let mut out = rows[0].clone();
    if let Some(e) = rows.iter().find_map(|r| r.error.clone()) {
        out.error = Some(e);
        return out;
    }
    out.rounds = rows.len() as u32;
    let med = |f: fn(&Row) -> f64| super::median_f64(rows.iter().map(f));
    out.p50_us = med(|r| r.p50_us);
    out.p99_us = med(|r| r.p99_us);
    out.per_s = med(|r| r.per_s);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every method carries a short run of both kinds at a small and a large size.
    #[test]
    fn every_method_runs() {
        for m in METHODS {
            for size in [64, 256 << 10] {
                let r = round_trip(m, size, 50, None);
                assert!(r.error.is_none(), "{} {size}: {:?}", m.name, r.error);
                assert!(r.p50_us > 0.0 && r.p99_us >= r.p50_us, "{r:?}");
                let t = throughput(m, size, 200, None);
                assert!(t.error.is_none(), "{} {size}: {:?}", m.name, t.error);
                assert!(t.per_s > 0.0, "{t:?}");
            }
        }
    }

    /// A damaged message fails every method's run, both kinds, with the verifier's
    /// reason; a fault past the run's end fails it too (it was not injected).
    #[test]
    fn a_damaged_message_fails_the_run() {
        for m in METHODS {
            for fault in [Fault::Corrupt(40), Fault::Scribble(40)] {
                let r = round_trip(m, 64, 500, Some(fault));
                let e = r.error.unwrap_or_default();
                assert!(e.contains("failed verification"), "{} {fault}: {e}", m.name);
                let t = throughput(m, 64, 500, Some(fault));
                let e = t.error.unwrap_or_default();
                assert!(e.contains("failed verification"), "{} {fault}: {e}", m.name);
            }
            let t = throughput(m, 64, 500, Some(Fault::Corrupt(500)));
            let e = t.error.unwrap_or_default();
            assert!(e.contains("would not be injected"), "{}: {e}", m.name);
        }
    }
}
