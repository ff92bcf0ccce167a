//! One `shm:` connection: two segments (ours, the peer's) holding the two rings, the
//! Unix socket that carries doorbells and reports the peer's death, and, when both sides
//! have them, the doorbell pipes a blocking wait sleeps on (docs/design.md §4.4).
//!
//! This file holds the connection's state ([`ShmConn`], what it made current or
//! reserved), its setup and the [`ConnOps`] table that dispatches to the three concerns:
//! `send.rs` (records, fragments and the pending rest of a split message), `recv.rs`
//! (records in place, split messages, waiting for data) and `wait.rs` (doorbells,
//! draining them, sleeping). The split format itself is the ring's
//! (`shmlink_ring::spsc::Fragment`, `Reassembly`).

mod recv;
mod send;
mod wait;

use std::mem;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use super::bell::PipeBell;
use super::segment::{Segment, Wait};
use crate::error::{Error, ErrorKind, Result};
use crate::options::{WaitPolicy, MIN_RING_SIZE};
use crate::ring::{record_size, Consumer, FenceMode, Producer, Reassembler, WakeGroup, HEADER};
use crate::sys;
use crate::transport::ConnOps;
use crate::view::SharedBytes;

/// Largest fragment (record) of a split message: a quarter ring, at most this. Small
/// enough that the receiver copies one while the sender writes the next (docs/design.md
/// §3.2).
const FRAGMENT_MAX: usize = 128 << 10;

/// Below this length no ring splits a message that fits one record: the fragment
/// payload of the smallest ring.
const SPLIT_MIN: usize = MIN_RING_SIZE / 4 - HEADER;

/// Payload bytes of a full fragment through `ring`: the fragments of a message larger
/// than the ring's largest record.
#[inline]
fn fragment_payload(ring: &crate::ring::RingRef) -> usize {
    (ring.max_record() / 2).min(FRAGMENT_MAX) - HEADER
}

/// The smallest fragment of a message split so that the receiver copies one fragment
/// while the sender writes the next (docs/design.md §3.2).
const PIPELINE_MIN: usize = 16 << 10;

/// The largest message a peer running this code never splits through a ring whose full
/// fragment is `fragment` bytes (`pipeline_fragment` cuts nothing shorter than two of its
/// smallest fragments): a receive buffer of at most this many bytes cannot take a split
/// message in place.
#[inline]
fn unsplit_max(fragment: usize) -> usize {
    2 * fragment.min(PIPELINE_MIN - HEADER) - 1
}

/// What one hand-over between the two ends (the sender's header store reaching the
/// receiver) costs, in bytes the copy would have moved meanwhile: the pipelined round
/// trip is about two copies of the message plus one fragment and one hand-over per
/// fragment each way, least at fragments of `sqrt(len * HAND_OVER_BYTES)` bytes. Measured
/// by a two-thread model of the split protocol (`scripts/fragment-model.c`) on an AMD
/// EPYC (Zen 3): 64 KiB best in 32 KiB fragments, 1 MiB in 64-128 KiB, 4 MiB in 128 KiB
/// (docs/benchmarks.md, "Large copies and 4K aliasing").
const HAND_OVER_BYTES: f64 = (8 << 10) as f64;

/// Level-2 cache size assumed where the kernel does not report one.
const L2_DEFAULT: usize = 512 << 10;

/// How much of a ring `Options::large_messages` sized a copying sender of a whole
/// `record`-byte record (64 KiB or more) keeps in use: at most this many bytes, the new
/// record and the next header slot included, so three records in flight where it is four
/// records. Half this CPU's level-2 cache, or four records where that is more. Such a ring
/// holds 16 messages of 64 KiB so that a writer in place has many in flight; a copying
/// sender that ran as far ahead would copy into lines no cache holds any more by the time
/// the receiver copies them out, and measured slower than on the 256 KiB ring
/// (docs/benchmarks.md, "Placement").
#[inline]
fn run_ahead(record: usize) -> usize {
    let l2 = sys::cache::l2_size().unwrap_or(L2_DEFAULT);
    (l2 / 2).max(record.saturating_mul(4))
}

/// The record payload (`Fragment::next`'s maximum) of the fragments of a `len`-byte
/// message that fits one record of `ring` and is split so that the receiver copies one
/// fragment while the sender writes the next, or `None` when it goes whole (fewer than
/// two fragments would be worth it). About `sqrt(len * HAND_OVER_BYTES)` bytes, at least
/// [`PIPELINE_MIN`], at most a quarter of this CPU's level-2 cache (read at start: a
/// fragment being written and the one being read stay in the two cores' caches) and the
/// ring's full fragment; the message is cut into equal parts of that size, rounded up to
/// cache lines.
#[inline]
fn pipeline_fragment(len: usize, ring: &crate::ring::RingRef) -> Option<usize> {
    let l2 = sys::cache::l2_size().unwrap_or(L2_DEFAULT);
    pipeline_piece(len, fragment_payload(ring), l2)
}

/// [`pipeline_fragment`] through a ring whose full fragment is `fragment` bytes, on a CPU
/// with `l2` bytes of level-2 cache.
fn pipeline_piece(len: usize, fragment: usize, l2: usize) -> Option<usize> {
    let cap = fragment.min((l2 / 4).max(PIPELINE_MIN) - HEADER);
    let ideal = ((len as f64) * HAND_OVER_BYTES).sqrt() as usize;
    let target = ideal.max(PIPELINE_MIN).min(cap);
    if len / target < 2 {
        return None;
    }
    // Enough pieces that none exceeds the cap, then equal parts, in whole cache lines
    // where that stays under the cap.
    let payload = len + crate::ring::TOTAL_LEN;
    let pieces = (len / target).max(payload.div_ceil(cap));
    let even = payload.div_ceil(pieces);
    let lines = even.next_multiple_of(64);
    Some(if lines <= cap { lines } else { even })
}

/// A doorbell's byte: which of the receiver's two directions may progress. Both share
/// one control socket (the connection's fd), so a drain must know whose cue it takes.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Bell {
    /// Your receive ring has records (or the end-of-stream mark).
    Data = 1,
    /// Your send ring has room.
    Room = 2,
}

impl Bell {
    /// The receiver's wait this doorbell ends.
    fn wait(self) -> Wait {
        match self {
            Bell::Data => Wait::Data,
            Bell::Room => Wait::Room,
        }
    }

    fn other(self) -> Bell {
        match self {
            Bell::Data => Bell::Room,
            Bell::Room => Bell::Data,
        }
    }
}

/// The message `recv_next` made current.
enum Current {
    None,
    /// A single record, read in place in the ring.
    InPlace {
        ptr: NonNull<u8>,
        len: usize,
    },
    /// A split message, reassembled in `reasm`.
    Reassembled,
}

/// What `reserve` set aside.
enum Reservation {
    None,
    /// Payload space of a record in the ring.
    InPlace {
        ptr: NonNull<u8>,
        len: usize,
    },
    /// A message of `len` bytes, too large for one record, staged in `stage[..len]`.
    Staged {
        len: usize,
        blocking: bool,
    },
}

/// The two directions and how one side of a connection uses them.
pub(crate) struct ShmConn {
    tx: Producer,
    rx: Consumer,
    /// Keeps the rings mapped; `tx`/`rx` point into it.
    seg: Segment,
    /// Control socket: doorbells in both directions, EOF when the peer is gone.
    sock: OwnedFd,
    wait: WaitPolicy,
    max_send: usize,
    max_recv: usize,
    current: Current,
    /// A split message as it arrives, and once complete (`Current::Reassembled`).
    reasm: Reassembler,
    reservation: Reservation,
    stage: Vec<u8>,
    /// The unsent rest of a split message accepted in non-blocking mode.
    pending: Vec<u8>,
    pending_pos: usize,
    /// The control socket reported end-of-file or a reset: the peer is gone.
    peer_eof: bool,
    /// An announcement found work at once and was left for the peer to clear, so a
    /// doorbell may arrive that nobody sleeps for: drain before the next sleep.
    stale_doorbell: bool,
    /// The last receive returned `WouldBlock` (or none was made yet: a new consumer
    /// starts announced): a data doorbell is the caller's cue, which only a receive may
    /// drain.
    rx_waiting: bool,
    /// We waited for data since the last record we sent (`Producer::sent`).
    rx_waited: bool,
    /// The last send returned `WouldBlock` or left the rest of a message pending: a room
    /// doorbell is the caller's cue, which only a call that retries the send may drain.
    tx_waiting: bool,
    /// The consumer's position when the last wait for data began: what was taken since
    /// says how large the messages are (`recv::large_message_patience`).
    rx_mark: u64,
    /// Set after a protocol violation: the connection is dead.
    broken: Option<String>,
    /// Inside a batch ([`ConnOps::begin_batch`]): records are written, and published
    /// (one `tail` store, one fence) before any wait and when the batch ends.
    batching: bool,
    /// See [`Setup::copy_ahead`].
    copy_ahead: bool,
    closed: bool,
    local: String,
    peer: String,
    /// The doorbell pipes, if both sides have them: a blocking wait sleeps on its pipe
    /// and says so in its segment ([`Place`](super::segment::Place)); the peer rings
    /// where it sleeps. (Last: only wake-ups use it, and the fields above keep their
    /// places.)
    bell: Option<PipeBell>,
    /// The shared wait token the next non-blocking wait for data announces instead of a
    /// count ([`ShmConn::set_wait_token`]).
    wait_token: Option<u64>,
    /// The peer process's group: a data doorbell for a shared token the group already
    /// rang for is skipped ([`ShmConn::set_wake_group`]).
    wake_group: Option<Arc<WakeGroup>>,
}

// SAFETY: the raw pointers in `current`, `reservation` and the rings point into `seg`,
// which the connection owns and moves with it; nothing else in the process refers to them.
unsafe impl Send for ShmConn {}

/// What a side needs to build its half of a connection.
pub(crate) struct Setup {
    pub seg: Segment,
    pub fence: FenceMode,
    pub sock: OwnedFd,
    /// What the socket's status flags are known to be: `Some(false)` blocking already
    /// (accepted so), `Some(true)` non-blocking and nothing else (made with
    /// `SOCK_NONBLOCK`), `None` unknown (asked with `F_GETFL`).
    pub sock_nonblocking: Option<bool>,
    pub bell: Option<PipeBell>,
    pub wait: WaitPolicy,
    pub max_send: usize,
    pub max_recv: usize,
    /// Copying sends of whole records of 64 KiB or more keep within [`run_ahead`] of the
    /// receiver (`Options::copy_ahead`).
    pub copy_ahead: bool,
    pub local: String,
    pub peer: String,
}

/// The receiving end of a connection's ring. While it follows a producer that publishes
/// in batches it publishes its position once per 4 KiB taken (at most an eighth of the
/// ring) and before it waits; otherwise once per record (`Consumer::consume`):
/// docs/benchmarks.md, round 3.
fn lazy_consumer(ring: crate::ring::RingRef, fence: FenceMode) -> Consumer {
    let lazy = (ring.max_record() / 4).min(LAZY_HEAD);
    let mut rx = Consumer::new(ring, fence);
    rx.set_lazy_head(lazy);
    rx
}

/// Bytes a batch-following consumer takes before it publishes its position.
const LAZY_HEAD: usize = 4 << 10;

impl ShmConn {
    pub(crate) fn new(s: Setup) -> ShmConn {
        // Sleeping is a blocking `recv` on the control socket; every other call on it says
        // MSG_DONTWAIT. (If this fails, `take_doorbell` falls back to `poll`.)
        let _ = match s.sock_nonblocking {
            Some(false) => Ok(()),
            Some(true) => sys::stream::set_blocking_fresh(s.sock.as_fd()),
            None => sys::stream::set_blocking(s.sock.as_fd()),
        };
        ShmConn {
            tx: Producer::new(s.seg.tx(), s.fence),
            rx: lazy_consumer(s.seg.rx(), s.fence),
            seg: s.seg,
            sock: s.sock,
            wait: s.wait,
            max_send: s.max_send,
            max_recv: s.max_recv,
            current: Current::None,
            reasm: Reassembler::new(),
            reservation: Reservation::None,
            stage: Vec::new(),
            pending: Vec::new(),
            pending_pos: 0,
            peer_eof: false,
            stale_doorbell: false,
            rx_waiting: true,
            rx_waited: false,
            tx_waiting: false,
            rx_mark: 0,
            broken: None,
            batching: false,
            copy_ahead: s.copy_ahead,
            closed: false,
            local: s.local,
            peer: s.peer,
            bell: s.bell,
            wait_token: None,
            wake_group: None,
        }
    }

    /// Non-blocking waits for data announce `token` (a value this process never announced
    /// before, the same on every connection one sleep waits on) instead of a count, until
    /// set to `None` (`shmlink_ring::spsc::Consumer::arm_token`). Blocking waits keep counts.
    pub(crate) fn set_wait_token(&mut self, token: Option<u64>) {
        self.wait_token = token;
    }

    /// The group of connections to the peer's process whose data doorbells for one
    /// shared token ring once (`shmlink_ring::spsc::WakeGroup`).
    pub(crate) fn set_wake_group(&mut self, group: Option<Arc<WakeGroup>>) {
        self.wake_group = group;
    }

    /// Remembers a protocol violation; every later call fails with it.
    #[cold]
    fn fail(&mut self, e: impl Into<Error>) -> Error {
        let e = e.into();
        if e.kind() == ErrorKind::ProtocolViolation && self.broken.is_none() {
            self.broken = Some(e.message().to_string());
        }
        e
    }

    fn check_broken(&self) -> Result<()> {
        match &self.broken {
            Some(msg) => Err(Error::violation(format!(
                "{}: connection broken earlier: {msg}",
                self.peer
            ))),
            None => Ok(()),
        }
    }

    fn peer_gone(&self) -> Error {
        Error::reset(format!(
            "{}: peer has closed or lost the connection",
            self.peer
        ))
    }

    /// See [`crate::shm::ShmControl::shares_cpu_with_peer`].
    pub(crate) fn shares_cpu_with_peer(&self) -> bool {
        self.seg.note_cpu(sys::current_cpu())
    }
}

impl ConnOps for ShmConn {
    #[inline]
    fn recv_into(&mut self, buf: &mut [u8], blocking: bool) -> Result<Option<usize>> {
        // Only a split message in blocking mode with nothing unusual going on, into a
        // buffer that can hold one (a message of at most a fragment is never split: the
        // buffer's length is compared with the smallest ring's fragment here, with this
        // ring's there); anything else is `recv_next`'s.
        if !blocking
            || self.broken.is_some()
            || !matches!(self.current, Current::None)
            || self.reasm.in_progress()
            || buf.len() < SPLIT_MIN
        {
            return Ok(None);
        }
        self.recv_split_into(buf)
    }

    #[inline]
    fn send(&mut self, msg: &[u8], blocking: bool) -> Result<()> {
        self.check_broken()?;
        self.flush_pending(blocking)?;
        self.send_message(msg, blocking)
    }

    fn writable(&mut self) -> Result<bool> {
        self.check_broken()?;
        match self.flush_pending(false) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }

    #[inline]
    fn reserve(&mut self, n: usize, blocking: bool) -> Result<()> {
        self.check_broken()?;
        self.flush_pending(blocking)?;
        self.reservation = if record_size(n) <= self.tx.ring().max_record() {
            let Some(ptr) = self.room(n, blocking)? else {
                return Err(Error::would_block());
            };
            Reservation::InPlace { ptr, len: n }
        } else {
            // Grow only: the bytes are the caller's to overwrite (like a ring slot's), so
            // there is no need to clear them for every message.
            if self.stage.len() < n {
                self.stage.resize(n, 0);
            }
            Reservation::Staged { len: n, blocking }
        };
        Ok(())
    }

    #[inline]
    fn reserved(&self) -> &[u8] {
        match self.reservation {
            // SAFETY: `room` reserved `len` payload bytes at `ptr` in our own segment,
            // which only this process can write (the peer maps it read-only, sealed
            // F_SEAL_FUTURE_WRITE; docs/design.md), and which the peer does not read as
            // a record until `commit` publishes it.
            Reservation::InPlace { ptr, len } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), len)
            },
            Reservation::Staged { len, .. } => &self.stage[..len],
            Reservation::None => &[],
        }
    }

    #[inline]
    fn reserved_mut(&mut self) -> &mut [u8] {
        match self.reservation {
            // SAFETY: as in `reserved`; `&mut self` makes this the only reference.
            Reservation::InPlace { ptr, len } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), len)
            },
            Reservation::Staged { len, .. } => &mut self.stage[..len],
            Reservation::None => &mut [],
        }
    }

    #[inline]
    fn commit(&mut self) -> Result<()> {
        match mem::replace(&mut self.reservation, Reservation::None) {
            Reservation::InPlace { len, .. } => {
                self.commit_record(len, 0);
                Ok(())
            }
            Reservation::Staged { len, blocking } => {
                let stage = mem::take(&mut self.stage);
                let r = self.send_message(&stage[..len], blocking);
                self.stage = stage;
                r
            }
            Reservation::None => Ok(()),
        }
    }

    #[inline]
    fn abort_reserve(&mut self) {
        self.reservation = Reservation::None;
    }

    fn truncate_reserved(&mut self, len: usize) {
        match &mut self.reservation {
            // In place: the record is committed shorter than the room reserved for it.
            Reservation::InPlace { len: n, .. } | Reservation::Staged { len: n, .. } => {
                *n = len.min(*n);
            }
            Reservation::None => {}
        }
    }

    #[inline]
    fn recv_next(&mut self, blocking: bool) -> Result<usize> {
        // Fast path: a whole record waiting, nothing unusual going on.
        if let (None, Current::None, false, true) = (
            &self.broken,
            &self.current,
            self.reasm.in_progress(),
            self.pending.is_empty(),
        ) {
            if let Ok(Some(rec)) = self.rx.peek() {
                if rec.flags == 0 && rec.len <= self.max_recv {
                    self.rx_waiting = false;
                    self.current = Current::InPlace {
                        ptr: rec.ptr,
                        len: rec.len,
                    };
                    return Ok(rec.len);
                }
            }
        }
        self.recv_next_slow(blocking)
    }

    #[inline]
    fn current(&self) -> SharedBytes<'_> {
        match self.current {
            // SAFETY: `peek` validated the record inside the mapping, which lives as long
            // as `self`. The peer may still write it: SharedBytes only copies it out.
            Current::InPlace { ptr, len } => unsafe { SharedBytes::shared(ptr, len) },
            Current::Reassembled => SharedBytes::local(self.reasm.message()),
            Current::None => SharedBytes::local(&[]),
        }
    }

    #[inline]
    fn release(&mut self) {
        match mem::replace(&mut self.current, Current::None) {
            Current::InPlace { len, .. } => {
                if self.rx.consume(record_size(len)) {
                    self.doorbell(Bell::Room);
                }
            }
            Current::Reassembled => self.reasm.clear(),
            Current::None => {}
        }
    }

    fn take_current(&mut self) -> Vec<u8> {
        match self.current {
            Current::Reassembled => {
                self.current = Current::None;
                self.reasm.take_message()
            }
            _ => {
                let v = self.current().to_vec();
                self.release();
                v
            }
        }
    }

    fn max_send_size(&self) -> usize {
        self.max_send
    }

    #[inline]
    fn begin_batch(&mut self) {
        self.batching = true;
    }

    #[inline]
    fn end_batch(&mut self) {
        self.batching = false;
        self.publish_tx();
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    fn close(&mut self, wait: bool) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        // Only the rest of a split message accepted in non-blocking mode can be pending;
        // everything else already sits in the ring, which outlives this process. Dropping
        // (`!wait`) writes what fits now and never blocks; `close` lingers, bounded.
        let flushed = if self.broken.is_some() || self.peer_eof {
            Ok(())
        } else if wait {
            self.linger()
        } else {
            self.flush_pending(false)
        };
        self.flush_rx();
        // A peer that closed its side (its ring's end mark, set once it lingered) waits
        // for nothing any more: no doorbell, which would meet its closed socket (a
        // connection's usual end when the client closes first).
        if self.tx.close() && !self.rx.peer_closed() {
            self.doorbell(Bell::Data);
        }
        flushed
    }

    fn local_addr(&self) -> String {
        self.local.clone()
    }

    fn peer_addr(&self) -> String {
        self.peer.clone()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{Fragment, TOTAL_LEN};

    /// The fragment sizes of a message split with record payloads of at most `max`.
    fn pieces(len: usize, max: usize) -> Vec<usize> {
        let (mut left, mut first, mut out) = (len, true, Vec::new());
        while left > 0 {
            let f = Fragment::next(first, left, max);
            first = false;
            left -= f.chunk;
            out.push(f.len());
        }
        out
    }

    #[test]
    fn pipeline_fragments_grow_with_the_message_within_the_cache_and_the_ring() {
        let l2 = 512 << 10;
        let full = 128 << 10;
        // What the two-thread model measured best (see HAND_OVER_BYTES).
        assert_eq!(
            pieces(64 << 10, pipeline_piece(64 << 10, full, l2).unwrap()).len(),
            2
        );
        let mib = pieces(1 << 20, pipeline_piece(1 << 20, full, l2).unwrap());
        assert!((8..=16).contains(&mib.len()), "{mib:?}");
        let four = pieces(4 << 20, pipeline_piece(4 << 20, full, l2).unwrap());
        assert_eq!(four.len(), 33, "128 KiB records, the ring's full fragment");
        // A smaller level-2 cache, smaller fragments; a larger ring fragment alone
        // changes nothing below the cache's quarter.
        assert!(pipeline_piece(4 << 20, full, 256 << 10).unwrap() <= 64 << 10);
        assert_eq!(
            pipeline_piece(1 << 20, 512 << 10, 8 << 20),
            pipeline_piece(1 << 20, full, 8 << 20)
        );
        // (full fragment, largest record) of rings of 4 KiB, 16 KiB, 256 KiB, 4 MiB and
        // 32 MiB; only messages that fit one record are cut this way.
        let rings = [
            (1016, 2 << 10),
            (4088, 8 << 10),
            (65528, 128 << 10),
            (full - HEADER, 2 << 20),
            (full - HEADER, 16 << 20),
        ];
        for l2 in [0, 32 << 10, 512 << 10, 2 << 20, 64 << 20] {
            for (fragment, record) in rings {
                for len in (SPLIT_MIN..record - 16).step_by(4093) {
                    let Some(max) = pipeline_piece(len, fragment, l2) else {
                        continue;
                    };
                    let p = pieces(len, max);
                    assert!(p.len() >= 2, "len {len}: {p:?}");
                    assert!(max <= fragment && max > TOTAL_LEN, "len {len}, max {max}");
                    assert!(
                        len > unsplit_max(fragment),
                        "len {len} split below the bound"
                    );
                    // Equal parts: the last is not a sliver.
                    assert!(
                        p[p.len() - 1] * 4 >= max || p.len() > 16,
                        "len {len}: {p:?}"
                    );
                }
            }
        }
    }
}
