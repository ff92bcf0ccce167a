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
//! - **Round trip**: the measuring thread sends, the echo thread sends it back; every
//!   round trip is timed (`Instant`, two clock reads), p50 and p99 reported.
//! - **Throughput**: the measuring thread sends `n` messages back to back, the other
//!   receives them all (checking each message's sequence number) and answers once;
//!   messages per second over the whole.
//!
//! The two threads are pinned to two different allowed CPUs (one CPU: both on it).

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use shmlink::{Connection, Listener, Options};

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

/// Writes `seq` into the message's first bytes.
fn stamp(buf: &mut [u8], seq: u64) {
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
}

fn check(buf: &[u8], len: usize, want_len: usize, seq: u64) -> io::Result<()> {
    let n = want_len.min(8);
    if len != want_len || buf[..n] != seq.to_le_bytes()[..n] {
        return Err(io::Error::other(format!(
            "message {seq}: wrong length or out of order ({len} bytes)"
        )));
    }
    Ok(())
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
    let out = measured?;
    served?;
    Ok(out)
}

/// Round trips of `size` bytes: `n` timed after `n / 10` (at least 100) untimed.
pub fn round_trip(method: &'static InprocMethod, size: usize, n: u64) -> Row {
    let echo = move |mut c: Box<dyn Chan>| -> io::Result<()> {
        let mut buf = vec![0u8; size];
        // Until the measuring end goes away.
        while let Ok(len) = c.recv(&mut buf) {
            c.send(&buf[..len])?;
        }
        Ok(())
    };
    let body = move |c: &mut dyn Chan| -> io::Result<(Vec<u64>, Duration)> {
        let mut msg = vec![0x5au8; size];
        let mut back = vec![0u8; size];
        let warm = (n / 10).max(100);
        let mut samples = Vec::with_capacity(n as usize);
        let mut total = Duration::ZERO;
        for seq in 0..warm + n {
            stamp(&mut msg, seq);
            let t0 = Instant::now();
            c.send(&msg)?;
            let len = c.recv(&mut back)?;
            let dt = t0.elapsed();
            check(&back, len, size, seq)?;
            if seq >= warm {
                samples.push(dt.as_nanos() as u64);
                total += dt;
            }
        }
        Ok((samples, total))
    };
    match with_threads(method, size, echo, body) {
        Ok((mut samples, total)) => {
            let p = shmlink_measure::stats::Percentiles::of(&mut samples)
                .expect("at least one round trip");
            Row {
                kind: "round-trip",
                method: method.name,
                size,
                count: n,
                rounds: 1,
                p50_us: p.p50 as f64 / 1e3,
                p99_us: p.p99 as f64 / 1e3,
                per_s: n as f64 / total.as_secs_f64(),
                error: None,
            }
        }
        Err(e) => Row::failed("round-trip", method.name, size, e.to_string()),
    }
}

/// `n` messages of `size` bytes streamed one way, then one answer.
pub fn throughput(method: &'static InprocMethod, size: usize, n: u64) -> Row {
    let sink = move |mut c: Box<dyn Chan>| -> io::Result<()> {
        let mut buf = vec![0u8; size];
        for seq in 0..n {
            let len = c.recv(&mut buf)?;
            check(&buf, len, size, seq)?;
        }
        c.send(&[1])?;
        // Until the measuring end goes away (it may still be receiving the answer).
        let _ = c.recv(&mut buf);
        Ok(())
    };
    let body = move |c: &mut dyn Chan| -> io::Result<Duration> {
        let mut msg = vec![0x5au8; size];
        let mut ack = vec![0u8; size.max(1)];
        let t0 = Instant::now();
        for seq in 0..n {
            stamp(&mut msg, seq);
            c.send(&msg)?;
        }
        c.recv(&mut ack)?;
        Ok(t0.elapsed())
    };
    match with_threads(method, size, sink, body) {
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
                let r = round_trip(m, size, 50);
                assert!(r.error.is_none(), "{} {size}: {:?}", m.name, r.error);
                assert!(r.p50_us > 0.0 && r.p99_us >= r.p50_us, "{r:?}");
                let t = throughput(m, size, 200);
                assert!(t.error.is_none(), "{} {size}: {:?}", m.name, t.error);
                assert!(t.per_s > 0.0, "{t:?}");
            }
        }
    }
}
