//! What a listener reports about itself and its connections (what [`inspect`] returns and
//! `shmlink ls` shows), and the per-connection counters behind it: plain types, shared by
//! the transports that fill them in, the handshake that encodes them and `inspect` that
//! decodes them.
//!
//! [`inspect`]: crate::inspect()

use std::time::SystemTime;

use crate::sync::{AtomicU64, Ordering};
use crate::sys::socket::PeerCred;

/// Per-connection message and byte counters.
///
/// `Send`, `Sync`, `Copy`: plain numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Messages sent.
    pub msgs_out: u64,
    /// Payload bytes sent.
    pub bytes_out: u64,
    /// Messages received.
    pub msgs_in: u64,
    /// Payload bytes received.
    pub bytes_in: u64,
}

/// A connection's counters where the listener that accepted it can read them (for
/// `shmlink ls`, see [`inspect`](crate::inspect())) without slowing the connection down.
///
/// The connection's owner is the only writer: every update happens through
/// `&mut Connection`. So an update is a plain load and store, never a read-modify-write
/// (`fetch_add` is a locked instruction on x86, tens of cycles on every message); with one
/// writer no update can be lost.
///
/// Aligned to a cache line so the writes never share one with unrelated data of another
/// thread.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct SharedCounters {
    msgs_out: AtomicU64,
    bytes_out: AtomicU64,
    msgs_in: AtomicU64,
    bytes_in: AtomicU64,
}

impl SharedCounters {
    pub(crate) fn new() -> SharedCounters {
        SharedCounters {
            msgs_out: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            msgs_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
        }
    }

    // SYNC POINT: counters. Relaxed everywhere, on purpose. The single writer reads back
    // its own last store (program order), so `store(load + n)` never loses an update; a
    // connection that moves to another thread moves with a happens-before edge (spawn,
    // channel), so its next owner reads the latest values too. A reader in another thread
    // (the listener answering `ls`) needs no ordering with anything: each load returns
    // some value the counter held, never a torn one; the four counters may be caught
    // between two updates of one message (msgs_out already counted, bytes_out not yet),
    // which a status display tolerates.
    #[inline]
    fn add(counter: &AtomicU64, n: u64) {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    /// Counts one message of `n` bytes sent. Only the connection's owner calls this.
    #[inline]
    pub(crate) fn count_out(&self, n: usize) {
        Self::add(&self.msgs_out, 1);
        Self::add(&self.bytes_out, n as u64);
    }

    /// Counts one message of `n` bytes received. Only the connection's owner calls this.
    #[inline]
    pub(crate) fn count_in(&self, n: usize) {
        Self::add(&self.msgs_in, 1);
        Self::add(&self.bytes_in, n as u64);
    }

    /// The counters now, from any thread.
    pub(crate) fn get(&self) -> Counters {
        Counters {
            msgs_out: self.msgs_out.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            msgs_in: self.msgs_in.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
        }
    }
}

/// A process at the other end of a Unix socket, as the kernel saw it when the socket was
/// connected or bound (`SO_PEERCRED`): the kernel's word, not the peer's.
///
/// `Send`, `Sync`, `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessCred {
    /// Process id in the PID namespace of whoever asked the kernel (0 if the process is
    /// in a namespace that one cannot see into).
    pub pid: u32,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

impl From<PeerCred> for ProcessCred {
    fn from(c: PeerCred) -> ProcessCred {
        ProcessCred {
            pid: u32::try_from(c.pid).unwrap_or(0),
            uid: c.uid,
            gid: c.gid,
        }
    }
}

/// What a listener reports about itself and its connections.
///
/// `Send`, `Sync`, `Clone`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListenerStatus {
    /// The listener's address: `shm:NAME` as it was bound, or `auto:HOST:PORT`.
    pub address: String,
    /// `"shm"` or `"auto"`.
    pub transport: String,
    /// An `auto:` listener's TCP or TLS address (`tcp:HOST:PORT`, `tls:HOST:PORT`).
    pub over: Option<String>,
    /// When the listener was bound (to the millisecond).
    pub started: SystemTime,
    /// The live connections it accepted, oldest first.
    pub connections: Vec<ConnectionStatus>,
    /// Some connections were left out: the answer is limited to 64 KiB (about a thousand
    /// connections).
    pub truncated: bool,
    /// The clients (and `inspect` queries) it refused since it was bound, by reason.
    pub refusals: Refusals,
}

/// How many clients a listener refused since it was bound, by the reason its `Refuse`
/// packet gave (docs/design.md, the handshake's refusal codes).
///
/// `Send`, `Sync`, `Copy`: plain numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refusals {
    /// The client spoke another protocol version.
    pub version: u64,
    /// The client's credentials were not allowed (uid/gid policy).
    pub permission: u64,
    /// The client asked for something impossible (ring sizes).
    pub invalid: u64,
    /// The client's packets were malformed (or its segment was unsealed, too small, …).
    pub protocol: u64,
    /// The listener could not set the connection up (out of memory, descriptors, …).
    pub resources: u64,
}

impl Refusals {
    /// Each reason's name (`version`, `permission`, `invalid`, `protocol`, `resources`)
    /// and count, in that order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("version", self.version),
            ("permission", self.permission),
            ("invalid", self.invalid),
            ("protocol", self.protocol),
            ("resources", self.resources),
        ]
        .into_iter()
    }

    /// The total over every reason (saturating).
    pub fn total(&self) -> u64 {
        self.iter().fold(0, |a, (_, n)| a.saturating_add(n))
    }
}

/// One connection a listener accepted and that is still open in the listener's process.
///
/// `Send`, `Sync`, `Clone`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionStatus {
    /// The connection's transport: `"shm"`, or `"tcp"`/`"tls"` for an `auto:` connection
    /// that stayed on TCP.
    pub transport: String,
    /// The client process on `shm:` (pid in the listener's PID namespace).
    pub peer: Option<ProcessCred>,
    /// The client's address on `tcp:`/`tls:` (`tcp:IP:PORT`).
    pub peer_addr: Option<String>,
    /// When the listener accepted it (to the millisecond).
    pub accepted: SystemTime,
    /// The listener side's counters: `msgs_in` are messages the client sent.
    pub counters: Counters,
}
