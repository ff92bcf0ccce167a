//! One `shm:` connection: two segments (ours, the peer's) holding the two rings, the
//! Unix socket that carries doorbells and reports the peer's death, and, when both sides
//! have them, the doorbell pipes a blocking wait sleeps on (docs/design.md §4.4).

use std::io;
use std::mem;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bell::PipeBell;
use super::segment::{Place, Segment, Wait};
use crate::error::{Error, ErrorKind, Result};
use crate::notify::spin_then_yield;
use crate::options::{WaitPolicy, MIN_RING_SIZE};
use crate::ring::{
    first_total, record_size, split_size, Consumer, FenceMode, Fragment, Producer, Reassembler,
    Reassembly, Record, WakeGroup, HEADER, TOTAL_LEN,
};
use crate::sys::{self, pipe, poll_fd, socket};
use crate::transport::{ConnOps, CLOSE_LINGER};
use crate::view::SharedBytes;

/// Largest fragment (record) of a split message: a quarter ring, at most this. Small
/// enough that the receiver copies one while the sender writes the next (docs/design.md
/// §3.2).
const FRAGMENT_MAX: usize = 128 << 10;

/// Below this length no ring splits a message that fits one record: the fragment
/// payload of the smallest ring.
const SPLIT_MIN: usize = MIN_RING_SIZE / 4 - HEADER;

/// Payload bytes of a full fragment through `ring`. A message of at most this many bytes
/// is never split by us (and so, from a peer running this code, never arrives split).
#[inline]
fn fragment_payload(ring: &crate::ring::RingRef) -> usize {
    (ring.max_record() / 2).min(FRAGMENT_MAX) - HEADER
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
    /// The last send returned `WouldBlock` or left the rest of a message pending: a room
    /// doorbell is the caller's cue, which only a call that retries the send may drain.
    tx_waiting: bool,
    /// The consumer's position when the last wait for data began: what was taken since
    /// says how large the messages are ([`large_message_patience`]).
    rx_mark: u64,
    /// Set after a protocol violation: the connection is dead.
    broken: Option<String>,
    /// Inside a batch ([`ConnOps::begin_batch`]): records are written, and published
    /// (one `tail` store, one fence) before any wait and when the batch ends.
    batching: bool,
    closed: bool,
    local: String,
    peer: String,
    /// The doorbell pipes, if both sides have them: a blocking wait sleeps on its pipe
    /// and says so in its segment ([`Place`]); the peer rings where it sleeps. (Last:
    /// only wake-ups use it, and the fields above keep their places.)
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
    pub bell: Option<PipeBell>,
    pub wait: WaitPolicy,
    pub max_send: usize,
    pub max_recv: usize,
    pub local: String,
    pub peer: String,
}

/// Bytes taken between two waits for data from which a waiting receiver polls longer
/// (the size where large records restart at the ring's start).
const LARGE_TAKEN: u64 = crate::ring::RESTART_MIN as u64;
/// The longest extra polling [`large_message_patience`] grants.
const MAX_PATIENCE: Duration = Duration::from_millis(1);

/// How much longer than its policy's spin and yield phases a blocking receive that took
/// `taken` bytes since its previous wait polls (yielding) before it sleeps: half a
/// nanosecond per byte (the time a peer needs to write, or check and answer, a message of
/// that size at about 2 GB/s), at most [`MAX_PATIENCE`], none below [`LARGE_TAKEN`] or
/// under a policy that never polls. A peer producing a 1 MiB record takes longer than the
/// default 50 µs budget, and a receiver that slept would pay a wake-up per message on
/// top of it (docs/benchmarks.md, "Large messages"); after the extra time it sleeps as
/// before, so an idle connection still costs nothing.
fn large_message_patience(policy: &WaitPolicy, taken: u64) -> Duration {
    if taken < LARGE_TAKEN || (policy.spin.is_zero() && policy.yield_.is_zero()) {
        return Duration::ZERO;
    }
    Duration::from_nanos(taken / 2).min(MAX_PATIENCE)
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
        let _ = sys::stream::set_blocking(s.sock.as_fd());
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
            tx_waiting: false,
            rx_mark: 0,
            broken: None,
            batching: false,
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

    /// Rings the peer's doorbell where the peer said it sleeps for that wait: a byte in its
    /// pipe, or one packet on the control socket, whose byte says which of its
    /// directions may progress ([`Bell`]).
    #[cold]
    fn doorbell(&mut self, bell: Bell) {
        if bell == Bell::Data {
            if let Some(group) = &self.wake_group {
                // The peer sleeps on this token on several connections at once, and a
                // doorbell for it went out on one of them: it looks at this ring too
                // before it sleeps again (`WakeGroup`).
                if !group.claim(self.tx.woken()) {
                    return;
                }
            }
        }
        if let Some(pipes) = &self.bell {
            // After the fence that loaded the peer's announcement, which the peer made
            // after storing its place (`ShmConn::place`).
            if self.seg.peer_place(bell.wait()) == Place::Pipe {
                // A full pipe already holds doorbells the peer has not taken; we hold a
                // read end of it (the guard), so a dead peer is no error either.
                let _ = pipe::ring(pipes.ring_fd(), bell as u8);
                return;
            }
        }
        match socket::send(self.sock.as_fd(), &[bell as u8]) {
            // A full socket already holds doorbells the peer has not drained.
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => self.peer_eof = true,
        }
    }

    /// Takes one doorbell off the control socket, noticing EOF; `Ok(false)` if none was
    /// there. With `wait`, sleeps until one comes (or the peer is gone).
    fn take_doorbell(&mut self, wait: bool) -> Result<bool> {
        let mut buf = [0u8; 16];
        let sock = self.sock.as_fd();
        let got = if wait {
            socket::recv_wait(sock, &mut buf)
        } else {
            socket::recv(sock, &mut buf)
        };
        match got {
            Ok(0) => self.peer_eof = true,
            Ok(1) if buf[0] == Bell::Data as u8 || buf[0] == Bell::Room as u8 => return Ok(true),
            Ok(n) => {
                // Not a doorbell (`recv` says a packet's real length): bytes written to
                // the peer's end of this socket past its library (transparent mode: a
                // raw `write` on a moved fd), or a peer's deliberate reset. Dropping
                // them would leave a silent hole in someone's stream: the connection
                // is broken instead, and every later call says so.
                let e = Error::violation(format!(
                    "{}: a {n}-byte packet on the control socket is not a doorbell",
                    self.peer
                ));
                return Err(self.fail(e));
            }
            // Only without `wait`, or if the socket could not be made blocking.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && wait => {
                poll_fd(sock, sys::Interest::READABLE, None)
                    .map_err(|e| Error::io(format!("{}: poll", self.peer), e))?;
                return self.take_doorbell(false);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                ) =>
            {
                self.peer_eof = true
            }
            Err(e) => return Err(Error::io(format!("{}: control socket", self.peer), e)),
        }
        Ok(false)
    }

    /// Drains the doorbells waiting on the control socket, so that the fd stops being
    /// readable before a non-blocking caller goes back to its event loop. The caller
    /// re-checks `own`'s direction after this; a doorbell for the other direction stops
    /// the drain while a caller still waits on that direction, because it is that
    /// caller's only cue: taking it would leave the fd quiet with work to do.
    fn drain(&mut self, own: Bell) -> Result<()> {
        let other_waits = match own {
            Bell::Data => self.tx_waiting,
            Bell::Room => self.rx_waiting,
        };
        // Bounded: a peer that keeps ringing cannot keep us here.
        for _ in 0..64 {
            if other_waits && !self.may_take_next_doorbell(own) {
                break;
            }
            if !self.take_doorbell(false)? {
                break;
            }
        }
        Ok(())
    }

    /// Whether the first packet on the control socket may be taken by a drain for `own`:
    /// `own`'s doorbell, a packet that is no doorbell, end-of-file or an error (which
    /// `take_doorbell` reports). `false` if there is none.
    fn may_take_next_doorbell(&self, own: Bell) -> bool {
        let mut buf = [0u8; 16];
        match socket::peek(self.sock.as_fd(), &mut buf) {
            Ok(0) => true,
            Ok(n) => n != 1 || buf[0] != own.other() as u8,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        }
    }

    /// The wait policy for this wait: without the spin phase when the peer last waited on
    /// our CPU (same-core placement), so it gets the CPU at once through `sched_yield`.
    fn policy(&self) -> WaitPolicy {
        if self.seg.note_cpu(sys::current_cpu()) {
            WaitPolicy {
                spin: Duration::ZERO,
                yield_: self.wait.spin + self.wait.yield_,
            }
        } else {
            self.wait
        }
    }

    /// Before announcing: a non-blocking caller returns to its event loop, which must not
    /// see the fd readable for doorbells already dealt with; a blocking one must not wake
    /// at once for a doorbell nobody slept for. Each announcement brings at most one
    /// doorbell, so in blocking mode only a left-over one needs draining.
    fn drain_stale(&mut self, blocking: bool, own: Bell) -> Result<()> {
        if !blocking || self.stale_doorbell {
            self.stale_doorbell = false;
            self.drain(own)?;
        }
        Ok(())
    }

    /// Says where the wait about to be announced for `wait` sleeps: on the doorbell pipe
    /// when the call blocks and the connection has pipes, else on the control socket
    /// (which event loops watch). Before the announcement (`Segment::set_place` fences).
    /// Returns whether it is the pipe.
    #[inline]
    fn place(&mut self, wait: Wait, blocking: bool) -> bool {
        let pipe = blocking && self.bell.is_some();
        let place = if pipe { Place::Pipe } else { Place::Socket };
        self.seg.set_place(wait, place);
        pipe
    }

    /// Sleeps until a doorbell comes or the peer is gone, and takes that doorbell (a stale
    /// one costs one more round): on the control socket, one blocking `recv`; on the pipe
    /// (`on_pipe`), one blocking `read`, which takes every byte waiting there at once.
    #[cold]
    #[inline(never)]
    fn sleep(&mut self, on_pipe: bool) -> Result<()> {
        match &self.bell {
            Some(pipes) if on_pipe => {
                let fd = pipes.sleep_fd();
                let mut buf = [0u8; 64];
                match pipe::read_wait(fd, &mut buf) {
                    // Every write end is closed: the peer's process is gone (or it
                    // closed the connection).
                    Ok(0) => self.peer_eof = true,
                    Ok(_) => {}
                    // Someone made the read end non-blocking (the peer shares it): wait
                    // for it to be readable; the caller looks again and reads.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        poll_fd(fd, sys::Interest::READABLE, None)
                            .map_err(|e| Error::io(format!("{}: poll", self.peer), e))?;
                    }
                    Err(e) => return Err(Error::io(format!("{}: doorbell pipe", self.peer), e)),
                }
                Ok(())
            }
            _ => self.take_doorbell(true).map(drop),
        }
    }

    /// Room for a record with `len` payload bytes: waits per policy when blocking,
    /// `Ok(None)` when non-blocking and full (the fd will signal when to retry).
    #[inline(always)]
    fn room(&mut self, len: usize, blocking: bool) -> Result<Option<NonNull<u8>>> {
        if let Ok(Some(p)) = self.tx.try_reserve(len) {
            self.tx_waiting = false;
            return Ok(Some(p));
        }
        self.wait_room(len, blocking)
    }

    #[cold]
    #[inline(never)]
    fn wait_room(&mut self, len: usize, blocking: bool) -> Result<Option<NonNull<u8>>> {
        let need = record_size(len);
        // A batch's records go out before waiting: the consumer may be asleep.
        self.publish_tx();
        let mut spun = false;
        self.drain_stale(blocking, Bell::Room)?;
        loop {
            match self.tx.try_reserve(len) {
                Ok(Some(p)) => {
                    self.tx_waiting = false;
                    return Ok(Some(p));
                }
                Ok(None) => {}
                Err(e) => return Err(self.fail(e)),
            }
            if self.peer_eof {
                return Err(self.peer_gone());
            }
            if blocking && !spun {
                spun = true;
                let policy = self.policy();
                let tx = &mut self.tx;
                match spin_then_yield(&policy, || Ok(tx.has_room(need)?)) {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => return Err(self.fail(e)),
                }
            }
            let on_pipe = self.place(Wait::Room, blocking);
            match self.tx.arm(need) {
                Ok(true) => {
                    // A doorbell on the pipe is taken by the next sleep there.
                    self.stale_doorbell |= !on_pipe;
                    continue;
                }
                Ok(false) => {}
                Err(e) => return Err(self.fail(e)),
            }
            if !blocking {
                self.tx_waiting = true;
                return Ok(None);
            }
            self.sleep(on_pipe)?;
        }
    }

    /// Writes one whole message as a record (no flag) at `dst`, reserved by `room`.
    #[inline]
    fn write_record(&mut self, dst: NonNull<u8>, body: &[u8]) {
        // SAFETY: `room` reserved `body.len()` bytes at `dst`, in our own segment (the peer
        // maps it read-only); the ring never overlaps `body`.
        unsafe {
            dst.as_ptr()
                .copy_from_nonoverlapping(body.as_ptr(), body.len())
        };
        self.commit_record(body.len(), 0);
    }

    /// Publishes the record just written, or only writes its header inside a batch.
    #[inline(always)]
    fn commit_record(&mut self, len: usize, flags: u32) {
        if self.batching {
            self.tx.write(len, flags);
        } else if self.tx.commit(len, flags) {
            self.doorbell(Bell::Data);
        }
    }

    /// Publishes the records a batch wrote so far (one `tail` store and one fence).
    #[inline]
    fn publish_tx(&mut self) {
        if self.tx.publish() {
            self.doorbell(Bell::Data);
        }
    }

    /// Publishes the `head` that lazy consumption held back (before any wait for data).
    #[inline]
    fn flush_rx(&mut self) {
        if self.rx.flush() {
            self.doorbell(Bell::Room);
        }
    }

    /// At the end of a split message: publishes the `head` that a small last fragment
    /// held back, so that the sender of the next large message finds the ring empty (and
    /// splits it from the ring's start) even if we have not waited again by then; measured
    /// one in three round trips otherwise (docs/benchmarks.md).
    #[inline]
    fn flush_rx_after_split(&mut self) {
        self.flush_rx();
    }

    /// Sends `data` as fragments; `total` is set for the start of a message (its first
    /// fragment carries the length). Returns how many bytes of `data` went out; fewer
    /// than all only in non-blocking mode.
    fn write_fragments(
        &mut self,
        data: &[u8],
        mut total: Option<usize>,
        blocking: bool,
    ) -> Result<usize> {
        let frag_payload = fragment_payload(self.tx.ring());
        let mut pos = 0;
        while pos < data.len() {
            let frag = Fragment::next(total.is_some(), data.len() - pos, frag_payload);
            let Some(dst) = self.room(frag.len(), blocking)? else {
                return Ok(pos);
            };
            // SAFETY: `room` reserved `frag.len()` bytes at `dst`, in our own segment (the
            // peer maps it read-only, and reads the record only once it is committed).
            unsafe { frag.write(dst, total.take().unwrap_or(0), &data[pos..pos + frag.chunk]) };
            self.commit_record(frag.len(), frag.flags);
            pos += frag.chunk;
        }
        Ok(pos)
    }

    /// Sends one message of any size. A split message that the ring cannot take whole in
    /// non-blocking mode is accepted: its rest waits in `pending`. A message shorter than
    /// any ring's fragment is one record: one comparison with a constant on the path of
    /// small messages, the rest out of line (64 B streams measured 5 % slower with the
    /// split decision on this path, docs/benchmarks.md).
    #[inline]
    fn send_message(&mut self, msg: &[u8], blocking: bool) -> Result<()> {
        if msg.len() < SPLIT_MIN {
            self.send_whole(msg, blocking)
        } else {
            self.send_large(msg, blocking)
        }
    }

    #[inline(always)]
    fn send_whole(&mut self, msg: &[u8], blocking: bool) -> Result<()> {
        let Some(dst) = self.room(msg.len(), blocking)? else {
            return Err(Error::would_block());
        };
        self.write_record(dst, msg);
        Ok(())
    }

    /// A message of at least [`SPLIT_MIN`] bytes. One larger than a fragment goes whole if
    /// it fits one record and the receiver is behind or we are in a batch (published at
    /// its end). Otherwise it is split: always when it does not fit one record, and on
    /// an empty ring (the receiver has taken everything and waits for it) so that the
    /// receiver copies one fragment while we write the next instead of waiting for the
    /// whole message; the fragments then restart at the ring's start when they all fit
    /// there, so a blocking send into the empty ring never waits (docs/design.md §3.2).
    #[inline(never)]
    fn send_large(&mut self, msg: &[u8], blocking: bool) -> Result<()> {
        let frag = fragment_payload(self.tx.ring());
        if record_size(msg.len()) <= self.tx.ring().max_record() {
            let whole = msg.len() <= frag
                || self.batching
                || match self.tx.unconsumed() {
                    Ok(behind) => behind,
                    Err(e) => return Err(self.fail(e)),
                };
            if whole {
                return self.send_whole(msg, blocking);
            }
            if let Err(e) = self.tx.restart_if_empty(split_size(msg.len(), frag)) {
                return Err(self.fail(e));
            }
        }
        let sent = self.write_fragments(msg, Some(msg.len()), blocking)?;
        if sent == 0 {
            return Err(Error::would_block());
        }
        debug_assert!(self.pending.is_empty());
        self.pending.extend_from_slice(&msg[sent..]);
        self.pending_pos = 0;
        Ok(())
    }

    /// Pushes out the rest of a split message accepted earlier.
    #[inline]
    fn flush_pending(&mut self, blocking: bool) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.flush_pending_slow(blocking)
    }

    #[cold]
    #[inline(never)]
    fn flush_pending_slow(&mut self, blocking: bool) -> Result<()> {
        let data = mem::take(&mut self.pending);
        let sent = self.write_fragments(&data[self.pending_pos..], None, blocking);
        self.pending = data;
        self.pending_pos += sent?;
        if self.pending_pos < self.pending.len() {
            return Err(Error::would_block());
        }
        self.pending.clear();
        self.pending_pos = 0;
        Ok(())
    }

    /// A blocking close's delivery of the rest of a split message accepted in non-blocking
    /// mode: waits for the peer as long as it takes some of it, and fails with
    /// [`ErrorKind::TimedOut`] once it has taken nothing for [`CLOSE_LINGER`]. A peer that
    /// stays connected but never reads must not hold `close` forever.
    #[cold]
    fn linger(&mut self) -> Result<()> {
        let mut deadline = Instant::now() + CLOSE_LINGER;
        loop {
            let before = self.pending_pos;
            match self.flush_pending(false) {
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                done => return done,
            }
            let now = Instant::now();
            if self.pending_pos != before {
                deadline = now + CLOSE_LINGER;
            } else if now >= deadline {
                return Err(Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "{}: close: the peer took nothing for {CLOSE_LINGER:?}; {} bytes of a \
                         split message were not delivered",
                        self.peer,
                        self.pending.len().saturating_sub(self.pending_pos)
                    ),
                ));
            }
            // The failed reservation armed the peer's doorbell for the room we need: sleep
            // until it rings, the peer goes away (EOF), or the deadline. The next
            // `flush_pending` drains what woke us.
            poll_fd(self.sock.as_fd(), sys::Interest::READABLE, Some(deadline))
                .map_err(|e| Error::io(format!("{}: close: poll", self.peer), e))?;
        }
    }

    /// Takes one fragment of a split message; returns the message length once complete.
    /// The bytes are copied out of the ring once, straight into the reassembly buffer
    /// (the peer may be writing them: only lengths and flags the ring validated, and the
    /// copied total, decide anything; the checks are the ring's, `Reassembly`).
    fn take_fragment(&mut self, rec: Record) -> Result<Option<usize>> {
        // SAFETY: `peek` returned `rec` and it is not consumed.
        let done = unsafe { self.reasm.take(&rec, self.max_recv) }?;
        if self.rx.consume(rec.size()) {
            self.doorbell(Bell::Room);
        }
        if done.is_some() {
            self.flush_rx_after_split();
            self.current = Current::Reassembled;
        }
        Ok(done)
    }

    /// Waits until the receive ring has a record; reports end-of-stream or reset once the
    /// peer is gone and everything it sent has been read.
    fn wait_data(&mut self, blocking: bool) -> Result<()> {
        // What we consumed and held back goes out before waiting: the producer may be
        // waiting for that room; and a batch's records, which the peer may be waiting
        // for before it answers.
        self.flush_rx();
        self.publish_tx();
        let taken = self.rx.position().wrapping_sub(self.rx_mark);
        self.rx_mark = self.rx.position();
        if blocking {
            let mut policy = self.policy();
            policy.yield_ += large_message_patience(&policy, taken);
            let rx = &mut self.rx;
            if spin_then_yield(&policy, || Ok(rx.has_data()?))? {
                return Ok(());
            }
        }
        self.drain_stale(blocking, Bell::Data)?;
        loop {
            // A graceful close sets the ring's closed flag and rings the doorbell before
            // the control socket closes: either one ends the wait.
            if self.peer_eof || self.rx.peer_closed() {
                return self.end_of_data();
            }
            let on_pipe = self.place(Wait::Data, blocking);
            let armed = match self.wait_token {
                Some(token) if !blocking => self.rx.arm_token(token)?,
                _ => self.rx.arm()?,
            };
            if armed {
                // A doorbell on the pipe is taken by the next sleep there.
                self.stale_doorbell |= !on_pipe;
                return Ok(());
            }
            if !blocking {
                self.rx_waiting = true;
                return Err(Error::would_block());
            }
            self.sleep(on_pipe)?;
            if self.rx.has_data()? {
                return Ok(());
            }
        }
    }

    /// The largest message a peer running this code never splits through the receive
    /// ring (a hostile one may split anything: `recv_next` handles that too).
    #[inline]
    fn rx_unsplit_max(&self) -> usize {
        fragment_payload(self.rx.ring())
    }

    /// Whether a reservation of `n` bytes is written in place in the ring (else it is
    /// staged, and a non-blocking commit of it can fail with `WouldBlock`).
    #[cfg(feature = "tokio")]
    #[inline]
    pub(crate) fn fits_in_place(&self, n: usize) -> bool {
        record_size(n) <= self.tx.ring().max_record()
    }

    /// Whether `recv_next` would return at once: a record waits, something unusual
    /// (a current message, a broken ring, the peer's end) needs the slow path, or the
    /// peer closed. Reads shared memory only: no announcement, no system call.
    #[inline]
    pub(crate) fn recv_hint(&mut self) -> bool {
        if self.broken.is_some() || !matches!(self.current, Current::None) || self.peer_eof {
            return true;
        }
        self.rx.has_data().unwrap_or(true) || self.rx.peer_closed()
    }

    /// See [`crate::Connection::unconsumed_sent`].
    pub(crate) fn unconsumed_sent(&mut self) -> Option<Vec<u8>> {
        if !self.pending.is_empty() || !matches!(self.reservation, Reservation::None) {
            return None;
        }
        let mut out = Vec::new();
        let mut whole = true;
        self.tx
            .for_each_unconsumed(|payload, flags| {
                whole &= flags == 0;
                out.extend_from_slice(payload);
            })
            .ok()?;
        whole.then_some(out)
    }

    /// See [`crate::Connection::shares_cpu_with_peer`].
    pub(crate) fn shares_cpu_with_peer(&self) -> bool {
        self.seg.note_cpu(sys::current_cpu())
    }

    /// Withdraws the wait a non-blocking receive announced (it returned `WouldBlock`):
    /// the peer rings no doorbell for it. A doorbell rung before the peer saw this may
    /// still come and is drained as a stale one.
    pub(crate) fn withdraw_wait(&mut self) {
        if self.rx_waiting {
            self.rx.withdraw();
            self.stale_doorbell = true;
        }
    }

    /// Whether the peer has yet to take some of what we sent (the tx ring holds records
    /// it did not consume). A broken ring counts as unread.
    pub(crate) fn peer_unread(&mut self) -> bool {
        self.tx.unconsumed().unwrap_or(true)
    }

    /// The peer is gone: what it sent is still delivered, then end-of-stream if it closed
    /// gracefully, a reset if it did not.
    fn end_of_data(&mut self) -> Result<()> {
        // `closed` first: seeing it guarantees seeing every record before it.
        let closed = self.rx.peer_closed();
        if self.rx.has_data()? {
            return Ok(());
        }
        Err(if closed && !self.reasm.in_progress() {
            Error::eos()
        } else {
            self.peer_gone()
        })
    }

    /// Everything `recv_next` does beyond taking a waiting record: the current message,
    /// split messages, waiting, errors.
    #[cold]
    #[inline(never)]
    fn recv_next_slow(&mut self, blocking: bool) -> Result<usize> {
        self.check_broken()?;
        match self.current {
            Current::InPlace { len, .. } => return Ok(len),
            Current::Reassembled => return Ok(self.reasm.message().len()),
            Current::None => {}
        }
        // A split message accepted in non-blocking mode moves on whenever we are called.
        if !self.pending.is_empty() {
            match self.flush_pending(false) {
                Err(e) if e.kind() != ErrorKind::WouldBlock => return Err(e),
                _ => {}
            }
        }
        loop {
            let rec = match self.rx.peek() {
                Ok(Some(rec)) => {
                    self.rx_waiting = false;
                    rec
                }
                Ok(None) => match self.wait_data(blocking) {
                    Ok(()) => continue,
                    Err(e) => return Err(self.fail(e)),
                },
                Err(e) => return Err(self.fail(e)),
            };
            if rec.is_skip() {
                // Padding before a large record that restarted at the ring's start.
                if self.rx.consume(rec.size()) {
                    self.doorbell(Bell::Room);
                }
                continue;
            }
            if !self.reasm.in_progress() && rec.flags == 0 {
                if rec.len > self.max_recv {
                    let e = Error::violation(format!(
                        "{}: message of {} bytes exceeds our maximum of {}",
                        self.peer, rec.len, self.max_recv
                    ));
                    return Err(self.fail(e));
                }
                self.current = Current::InPlace {
                    ptr: rec.ptr,
                    len: rec.len,
                };
                return Ok(rec.len);
            }
            match self.take_fragment(rec) {
                Ok(Some(n)) => return Ok(n),
                Ok(None) => {}
                Err(e) => return Err(self.fail(e)),
            }
        }
    }
}

impl ShmConn {
    /// A split message, fragment by fragment, straight into `buf` (blocking only: a
    /// non-blocking receive could stop between fragments, and `buf` cannot hold a
    /// half-received message until the next call). `Ok(None)` before anything is taken:
    /// not a split message, something unusual going on, or one larger than `buf` (which
    /// `recv_next` then reassembles, so it stays queued for `recv_vec`).
    #[inline(never)]
    fn recv_split_into(&mut self, buf: &mut [u8]) -> Result<Option<usize>> {
        if !self.pending.is_empty() || buf.len() <= self.rx_unsplit_max() {
            return Ok(None);
        }
        let first = match self.rx.peek() {
            Ok(Some(rec)) if rec.is_skip() => {
                // Padding before a first fragment that restarted at the ring's start.
                if self.rx.consume(rec.size()) {
                    self.doorbell(Bell::Room);
                }
                return self.recv_split_into(buf);
            }
            Ok(Some(rec)) => rec,
            Ok(None) => {
                self.wait_data(true).map_err(|e| self.fail(e))?;
                return self.recv_split_into(buf);
            }
            Err(e) => return Err(self.fail(e)),
        };
        // SAFETY: `peek` returned `first` and it is not consumed.
        let Some(total) = (unsafe { first_total(&first) }) else {
            return Ok(None); // not a split message, or one `take_fragment` reports
        };
        let first_len = (first.len - TOTAL_LEN) as u64;
        if total > self.max_recv as u64 || total <= first_len || total > buf.len() as u64 {
            return Ok(None); // `recv_next` reports it, or reassembles it for `recv_vec`
        }
        self.rx_waiting = false;
        // The checks of the sequence are the ring's; with `buf`'s length as the maximum,
        // every piece lies in `buf` whatever the peer writes meanwhile (`accept` reads the
        // total again and checks it anew).
        let max = self.max_recv.min(buf.len());
        let mut state = Reassembly::new();
        let mut rec = first;
        loop {
            // SAFETY: `peek` returned `rec` and it is not consumed.
            let piece = match unsafe { state.accept(&rec, max) } {
                Ok(piece) => piece,
                Err(e) => return Err(self.fail(e)),
            };
            // SAFETY: `src..src + len` lies in the validated payload and
            // `buf[at..at + len]` in the caller's buffer (at + len <= total <= max <=
            // buf.len()).
            unsafe {
                sys::copy_shared(
                    buf.as_mut_ptr().add(piece.at),
                    piece.src.as_ptr(),
                    piece.len,
                )
            };
            if self.rx.consume(rec.size()) {
                self.doorbell(Bell::Room);
            }
            if piece.last {
                self.flush_rx_after_split();
                return Ok(Some(piece.total));
            }
            // The next fragment (passing over skip records), waiting for it.
            rec = loop {
                match self.rx.peek() {
                    Ok(Some(r)) if r.is_skip() => {
                        if self.rx.consume(r.size()) {
                            self.doorbell(Bell::Room);
                        }
                    }
                    // `accept` checks its flags.
                    Ok(Some(r)) => break r,
                    Ok(None) => {
                        // A peer gone mid-message is a reset (`end_of_data`), never EOS.
                        if let Err(e) = self.wait_data(true) {
                            let e = if e.kind() == ErrorKind::EndOfStream {
                                self.peer_gone()
                            } else {
                                e
                            };
                            return Err(self.fail(e));
                        }
                    }
                    Err(e) => return Err(self.fail(e)),
                }
            };
        }
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
        if self.tx.close() {
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
