//! In-process `shm:` connections: both ends in one process (docs/design.md, "In-process
//! connections").
//!
//! A listener bound with [`Options::in_process`](crate::Options::in_process) enters an
//! [`Inbox`] in a process-wide table keyed by its rendezvous socket; a client in the same
//! process that also asks for it finds the inbox before it touches the socket, builds
//! both ends of the connection itself and leaves the listener's end in the inbox, whose
//! eventfd sits in the listener's epoll set. No memfd, no socket, no handshake packets.
//!
//! Each direction is a [`Pipe`]: a single-producer single-consumer ring of message slots
//! (each a `Vec<u8>` kept between messages, so a steady stream allocates nothing), with
//! flow control in bytes (at most the smaller of both sides' ring sizes in flight, or one
//! messages of any size when fewer are in flight, so that one is written while the other is read). A side that must wait spins and yields
//! per its wait policy, then announces itself in its own `wait` bits and parks its thread
//! (blocking mode) or returns `WouldBlock` with its eventfd armed (non-blocking mode). The
//! other side publishes its progress with a sequentially consistent read-modify-write and
//! then reads those bits: whichever comes second sees the other (no lost wake-up), and a
//! wake-up costs a system call only when the other side is known to sleep. The waker
//! clears the bits it acts on, so each announcement brings at most one wake-up.

use crate::sync::{AtomicU64, AtomicU8, Ordering};
use std::cell::UnsafeCell;
use std::collections::{HashMap, VecDeque};
use std::mem;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::{self, Thread, ThreadId};

use crate::error::{Error, Result};
use crate::notify::spin_then_yield;
use crate::options::{Options, WaitPolicy};
use crate::sys::stream::EventFlag;
use crate::transport::ConnOps;
use crate::view::SharedBytes;

/// Wait bits a side sets in its own [`Side::wait`]: what it waits for and how to wake it.
const DATA_PARK: u8 = 1;
const ROOM_PARK: u8 = 2;
const DATA_FD: u8 = 4;
const ROOM_FD: u8 = 8;
const DATA: u8 = DATA_PARK | DATA_FD;
const ROOM: u8 = ROOM_PARK | ROOM_FD;

/// [`Side::end`]: the side is live, closed gracefully, or dropped without closing.
const LIVE: u8 = 0;
const CLOSED: u8 = 1;
const RESET: u8 = 2;

/// Slots per pipe: one per this many bytes of the ring size, within the bounds below.
const BYTES_PER_SLOT: usize = 256;
const MIN_SLOTS: usize = 16;
const MAX_SLOTS: usize = 1024;
/// A consumed message's buffer stays in its slot up to this capacity, or four times the
/// ring's bytes per slot if more; a larger one goes to the pipe's free list (a mutex:
/// worth it only where the copy dwarfs it), whose top is the warmest.
const MIN_KEEP: usize = 2048;

/// Keeps what it holds on a cache line (pair) of its own.
#[repr(align(128))]
struct Padded<T>(T);

/// One direction: a ring of message slots.
struct Pipe {
    slots: Box<[UnsafeCell<Vec<u8>>]>,
    mask: u64,
    /// Bytes that may be in flight; besides, two messages of any size may always be
    /// (so that one is written while the other is read).
    cap: u64,
    /// Messages published (the producer's position).
    tail: Padded<AtomicU64>,
    /// Messages consumed and their bytes (the consumer's position).
    head: Padded<Consumed>,
    /// Capacity a slot keeps after its message is consumed.
    keep: usize,
    /// Large buffers of consumed messages, for the next large ones (last in, first out:
    /// the warmest first), at most `cap` bytes of them (or two buffers).
    free: Mutex<FreeList>,
}

/// A pipe's kept buffers and their total capacity.
#[derive(Default)]
struct FreeList {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

struct Consumed {
    msgs: AtomicU64,
    bytes: AtomicU64,
}

// SAFETY: slot `i` is touched only by the producer while `head <= i < head + slots`
// does not hold for it as a published message, and only by the consumer between the
// producer's publication of it (`tail`, release) and the consumer's release of it
// (`head`, release): the positions hand each slot from one thread to the other.
unsafe impl Sync for Pipe {}

impl Pipe {
    fn new(ring: usize) -> Pipe {
        let n = (ring / BYTES_PER_SLOT)
            .clamp(MIN_SLOTS, MAX_SLOTS)
            .next_power_of_two();
        Pipe {
            slots: (0..n).map(|_| UnsafeCell::new(Vec::new())).collect(),
            mask: n as u64 - 1,
            cap: ring as u64,
            keep: (4 * ring / n).max(MIN_KEEP),
            free: Mutex::new(FreeList::default()),
            tail: Padded(AtomicU64::new(0)),
            head: Padded(Consumed {
                msgs: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
            }),
        }
    }

    /// Keeps the buffer of a consumed message for a later one.
    fn give(&self, buf: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.bufs.len() < 2 || (free.bytes + buf.capacity()) as u64 <= self.cap {
            free.bytes += buf.capacity();
            free.bufs.push(buf);
        }
    }

    /// A kept buffer for a message of `len` bytes: the warmest that is large enough
    /// (looking at the last few only: the list is a stack, its top the warmest).
    fn take(&self, len: usize) -> Option<Vec<u8>> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let n = free.bufs.len();
        let i = (n.saturating_sub(4)..n)
            .rev()
            .find(|&i| free.bufs[i].capacity() >= len)?;
        let buf = free.bufs.remove(i);
        free.bytes -= buf.capacity();
        Some(buf)
    }

    /// The slot of message `pos`.
    ///
    /// # Safety
    /// The caller owns that slot now (see the `Sync` impl).
    #[allow(clippy::mut_from_ref)]
    unsafe fn slot(&self, pos: u64) -> &mut Vec<u8> {
        // SAFETY: the caller owns the slot; the index is masked into the array.
        unsafe { &mut *self.slots[(pos & self.mask) as usize].get() }
    }
}

/// What one end shares with the other: how it waits and whether it is still there.
struct Side {
    /// What this side waits for (`DATA_*`, `ROOM_*`); set by it, cleared by the waker.
    wait: Padded<AtomicU8>,
    /// [`LIVE`], [`CLOSED`] or [`RESET`].
    end: AtomicU8,
    /// The thread to unpark for `*_PARK`.
    thread: Mutex<Option<Thread>>,
    /// This side's fd: readable when a non-blocking call is worth making again.
    flag: EventFlag,
}

impl Side {
    fn new() -> Result<Side> {
        Ok(Side {
            // A new end starts announced for data on its fd, like a new `shm:` consumer:
            // an event loop may watch the fd before its first receive.
            wait: Padded(AtomicU8::new(DATA_FD)),
            end: AtomicU8::new(LIVE),
            thread: Mutex::new(None),
            flag: EventFlag::new().map_err(|e| Error::io("eventfd", e))?,
        })
    }

    /// Makes the fd readable. Every time, even if it is readable already: an event loop
    /// that watches it edge-triggered (tokio) wakes only for a new write.
    fn signal(&self) {
        let _ = self.flag.set();
    }

    /// Wakes this side for the `bits` it waits on, if it does (the caller published its
    /// progress with a sequentially consistent operation before).
    #[inline(always)]
    fn wake(&self, bits: u8) {
        // SYNC POINT (inproc wake): SeqCst load pairs with the sleeper's SeqCst `fetch_or`
        // in `announce`: our position RMW (`publish`/`consume`) came first, so either we
        // see its bit or its re-check sees our position.
        if self.wait.0.load(Ordering::SeqCst) & bits != 0 {
            self.wake_slow(bits);
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_slow(&self, bits: u8) {
        // SYNC POINT (inproc wake): SeqCst RMW clears the bits we act on; pairs with
        // `announce`/`retract` on the sleeping side (one wake-up per announcement).
        let hit = self.wait.0.fetch_and(!bits, Ordering::SeqCst) & bits;
        if hit & (DATA_PARK | ROOM_PARK) != 0 {
            self.unpark();
        }
        if hit & (DATA_FD | ROOM_FD) != 0 {
            self.signal();
        }
    }

    fn unpark(&self) {
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = t.as_ref() {
            t.unpark();
        }
    }
}

/// Both ends' shared state. Index 0 is the client, 1 the server; pipe `i` carries what
/// side `i` sends.
struct Shared {
    pipes: [Pipe; 2],
    sides: [Side; 2],
}

/// The message `recv_next` made current: its length, or none.
type Current = Option<usize>;

/// One end of an in-process connection.
pub(crate) struct InprocConn {
    shared: Arc<Shared>,
    me: usize,
    /// Our producer position and what we last read of the consumer's.
    tail: u64,
    sent_bytes: u64,
    seen_head: u64,
    seen_consumed: u64,
    /// Our consumer position and what we last read of the producer's.
    head: u64,
    consumed: u64,
    seen_tail: u64,
    current: Current,
    /// Bytes reserved in the slot at `tail`.
    reserved: Option<usize>,
    /// The last non-blocking send returned `WouldBlock` waiting for room for
    /// `room_need` bytes; the last non-blocking receive returned `WouldBlock` (a new end
    /// starts so). What a call of the other direction keeps the fd readable for.
    tx_waiting: bool,
    room_need: usize,
    rx_waiting: bool,
    /// The thread last registered in our `Side::thread`.
    parked_as: Option<ThreadId>,
    wait: WaitPolicy,
    max_send: usize,
    closed: bool,
    addr: String,
}

impl InprocConn {
    #[inline(always)]
    fn tx(&self) -> &Pipe {
        &self.shared.pipes[self.me]
    }

    #[inline(always)]
    fn rx(&self) -> &Pipe {
        &self.shared.pipes[1 - self.me]
    }

    #[inline(always)]
    fn own(&self) -> &Side {
        &self.shared.sides[self.me]
    }

    #[inline(always)]
    fn peer(&self) -> &Side {
        &self.shared.sides[1 - self.me]
    }

    fn peer_gone(&self) -> Error {
        Error::reset(format!(
            "{}: peer has closed or lost the connection",
            self.addr
        ))
    }

    /// Whether a message of `len` bytes fits, with what we last read of the consumer.
    #[inline(always)]
    fn fits(&self, len: usize) -> bool {
        let pipe = self.tx();
        let in_flight = self.sent_bytes - self.seen_consumed;
        let msgs = self.tail - self.seen_head;
        msgs <= pipe.mask && (msgs < 2 || in_flight + len as u64 <= pipe.cap)
    }

    /// Whether a message of `len` bytes fits, reading the consumer's position again.
    #[inline]
    fn has_room(&mut self, len: usize) -> bool {
        if self.fits(len) {
            return true;
        }
        let h = &self.tx().head.0;
        // SYNC POINT (inproc room): SeqCst load pairs with the consumer's SeqCst swap of
        // `msgs` in `consume` (and, for the no-lost-wake-up, with its load of our wait bits
        // after it).
        let msgs = h.msgs.load(Ordering::SeqCst);
        // SYNC POINT (inproc room): Acquire pairs with the consumer's Release store of
        // `bytes` in `consume`, made before its swap of `msgs`.
        let bytes = h.bytes.load(Ordering::Acquire);
        self.seen_head = msgs;
        self.seen_consumed = bytes;
        self.fits(len)
    }

    /// Whether a message waits, reading the producer's position again if needed.
    #[inline]
    fn has_data(&mut self) -> bool {
        if self.seen_tail != self.head {
            return true;
        }
        // SYNC POINT (inproc data): SeqCst load pairs with the producer's SeqCst swap of
        // `tail` in `publish`: the slot's message is visible (and, after `announce`, no
        // wake-up is lost).
        self.seen_tail = self.rx().tail.0.load(Ordering::SeqCst);
        self.seen_tail != self.head
    }

    /// Registers the calling thread as the one to unpark (only when it changed).
    fn register_thread(&mut self) {
        let id = thread::current().id();
        if self.parked_as != Some(id) {
            *self.own().thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread::current());
            self.parked_as = Some(id);
        }
    }

    /// Announces `bit` in our wait bits; `ready` then re-checks the condition.
    fn announce(&self, bit: u8) {
        // SYNC POINT (inproc wake): SeqCst RMW pairs with the waker's SeqCst load in
        // `Side::wake`, after its position RMW: whichever comes second sees the other.
        self.own().wait.0.fetch_or(bit, Ordering::SeqCst);
    }

    fn retract(&self, bit: u8) {
        // SYNC POINT (inproc wake): SeqCst RMW withdraws our announcement; pairs with
        // `Side::wake_slow`'s `fetch_and`.
        self.own().wait.0.fetch_and(!bit, Ordering::SeqCst);
    }

    /// A non-blocking call's wait for `bit` (`DATA_FD` or `ROOM_FD`): clears the fd of
    /// cues already dealt with (so that a level-triggered event loop does not see it
    /// readable for nothing), announces `bit`, and looks again (`true`: ready after
    /// all). A cleared cue may have been the other direction's: if its caller waits and
    /// may progress, or the peer is gone (its fd stays readable from then on), the fd is
    /// set again.
    fn nonblocking_wait(&mut self, bit: u8) -> bool {
        // One `read`, only on the way to `WouldBlock`: cues written before it are for
        // states the checks below see.
        let _ = self.own().flag.clear();
        self.announce(bit);
        let ready = if bit == DATA_FD {
            self.has_data()
        } else {
            self.has_room(self.room_need)
        };
        if ready {
            self.retract(bit);
        }
        let other_ready = if bit == DATA_FD {
            self.tx_waiting && self.has_room(self.room_need)
        } else {
            self.rx_waiting && self.has_data()
        };
        // SYNC POINT (inproc end): SeqCst load pairs with the SeqCst store in `finish`: a
        // gone peer keeps our fd readable.
        if other_ready || self.peer().end.load(Ordering::SeqCst) != LIVE {
            self.own().signal();
        }
        ready
    }

    /// Parks until `ready` or the peer is gone (`bit` announced, re-checked after).
    fn park(&mut self, bit: u8, mut ready: impl FnMut(&mut Self) -> bool) {
        self.register_thread();
        loop {
            self.announce(bit);
            // SYNC POINT (inproc end): SeqCst load pairs with the SeqCst store in `finish`,
            // after our `announce` (`finish` clears every bit and unparks after it).
            if ready(self) || self.peer().end.load(Ordering::SeqCst) != LIVE {
                self.retract(bit);
                return;
            }
            thread::park();
            // Unparked by the waker (which cleared the bit) or spuriously: look again.
        }
    }

    /// Room for a message of `len` bytes: `Ok(false)` when non-blocking and full.
    #[inline(always)]
    fn room(&mut self, len: usize, blocking: bool) -> Result<bool> {
        if self.has_room(len) {
            self.tx_waiting = false;
            return Ok(true);
        }
        self.wait_room(len, blocking)
    }

    #[cold]
    #[inline(never)]
    fn wait_room(&mut self, len: usize, blocking: bool) -> Result<bool> {
        // SYNC POINT (inproc end): Acquire pairs with the SeqCst store in `finish`.
        if self.peer().end.load(Ordering::Acquire) != LIVE {
            return Err(self.peer_gone());
        }
        if !blocking {
            self.room_need = len;
            if self.nonblocking_wait(ROOM_FD) {
                self.tx_waiting = false;
                return Ok(true);
            }
            self.tx_waiting = true;
            return Ok(false);
        }
        let policy = self.wait;
        if !spin_then_yield(&policy, || Ok(self.has_room(len)))? {
            self.park(ROOM_PARK, |c| c.has_room(len));
        }
        if self.has_room(len) {
            self.tx_waiting = false;
            return Ok(true);
        }
        Err(self.peer_gone())
    }

    /// Publishes the message in the slot at `tail` (`len` bytes).
    #[inline(always)]
    fn publish(&mut self, len: usize) {
        self.tail += 1;
        self.sent_bytes += len as u64;
        // SYNC POINT (inproc data): SeqCst swap publishes the slot's message: pairs with
        // the consumer's SeqCst load of `tail` in `has_data`, and orders before our load of
        // its wait bits in `wake`.
        self.tx().tail.0.swap(self.tail, Ordering::SeqCst);
        self.peer().wake(DATA);
    }

    /// The slot at `tail`, for a message of `len` bytes: its own buffer, or a kept one
    /// if that is too small (so a stream of large messages reuses a few warm buffers
    /// instead of allocating, and faulting in, one per message).
    #[inline(always)]
    fn tx_slot(&mut self, len: usize) -> &mut Vec<u8> {
        let pipe = self.tx();
        // SAFETY: `room` said the slot at `tail` is free: ours until `publish`.
        let v = unsafe { pipe.slot(self.tail) };
        if v.capacity() < len && len > pipe.keep {
            if let Some(buf) = pipe.take(len) {
                *v = buf;
            }
        }
        v
    }

    /// Consumes the message at `head`.
    #[inline(always)]
    fn consume(&mut self, len: usize) {
        let pipe = self.rx();
        // SAFETY: the slot at `head` holds a published message: ours until `head` moves.
        let v = unsafe { pipe.slot(self.head) };
        if v.capacity() > pipe.keep {
            pipe.give(mem::take(v));
        }
        self.head += 1;
        self.consumed += len as u64;
        let h = &self.rx().head.0;
        // SYNC POINT (inproc room): Release pairs with the producer's Acquire load of
        // `bytes` in `has_room`.
        h.bytes.store(self.consumed, Ordering::Release);
        // SYNC POINT (inproc room): SeqCst swap hands the slot back: pairs with the
        // producer's SeqCst load in `has_room`, and orders before our load of its wait bits
        // in `wake`.
        h.msgs.swap(self.head, Ordering::SeqCst);
        self.peer().wake(ROOM);
    }

    /// The length of the message at `head` (which `has_data` said is published).
    #[inline(always)]
    fn head_len(&self) -> usize {
        // SAFETY: published and not consumed: ours to read.
        unsafe { self.rx().slot(self.head).len() }
    }

    #[cold]
    #[inline(never)]
    fn wait_data(&mut self, blocking: bool) -> Result<usize> {
        loop {
            // The end first: seeing it guarantees seeing every message before it.
            // SYNC POINT (inproc end): SeqCst load before the data check pairs with
            // `finish`'s SeqCst store after the peer's last `publish`: seeing the end means
            // seeing every message before it.
            let end = self.peer().end.load(Ordering::SeqCst);
            if self.has_data() {
                self.rx_waiting = false;
                return Ok(self.head_len());
            }
            match end {
                LIVE => {}
                CLOSED => return Err(Error::eos()),
                _ => return Err(self.peer_gone()),
            }
            if !blocking {
                // SYNC POINT (inproc end): SeqCst load pairs with the SeqCst store in
                // `finish`.
                if self.nonblocking_wait(DATA_FD) || self.peer().end.load(Ordering::SeqCst) != LIVE
                {
                    continue;
                }
                self.rx_waiting = true;
                return Err(Error::would_block());
            }
            let policy = self.wait;
            if !spin_then_yield(&policy, || Ok(self.has_data()))? {
                self.park(DATA_PARK, |c| c.has_data());
            }
        }
    }

    /// Marks our end and wakes the peer whatever it waits for (its fd stays readable).
    fn finish(&mut self, how: u8) {
        // SYNC POINT (inproc end): SeqCst store pairs with the peer's SeqCst loads of `end`
        // (`wait_data`, `park`, `nonblocking_wait`): after our last `publish`, so every
        // message is seen first.
        self.own().end.store(how, Ordering::SeqCst);
        let peer = self.peer();
        // SYNC POINT (inproc wake): SeqCst RMW clears every bit the peer announced (it is
        // woken for all of them): pairs with its `announce`.
        peer.wait.0.fetch_and(0, Ordering::SeqCst);
        peer.unpark();
        peer.signal();
    }
}

impl ConnOps for InprocConn {
    #[inline]
    fn send(&mut self, msg: &[u8], blocking: bool) -> Result<()> {
        if !self.room(msg.len(), blocking)? {
            return Err(Error::would_block());
        }
        let v = self.tx_slot(msg.len());
        v.clear();
        v.extend_from_slice(msg);
        self.publish(msg.len());
        Ok(())
    }

    #[inline]
    fn reserve(&mut self, n: usize, blocking: bool) -> Result<()> {
        if !self.room(n, blocking)? {
            return Err(Error::would_block());
        }
        let v = self.tx_slot(n);
        // Old bytes may stay: they are the caller's to overwrite.
        if v.len() >= n {
            v.truncate(n);
        } else {
            v.resize(n, 0);
        }
        self.reserved = Some(n);
        Ok(())
    }

    #[inline]
    fn reserved(&self) -> &[u8] {
        match self.reserved {
            // SAFETY: `reserve` made the slot at `tail` ours and `n` bytes long.
            Some(n) => unsafe { &self.tx().slot(self.tail)[..n] },
            None => &[],
        }
    }

    #[inline]
    fn reserved_mut(&mut self) -> &mut [u8] {
        match self.reserved {
            // SAFETY: as in `reserved`; `&mut self` makes this the only reference.
            Some(n) => unsafe { &mut self.tx().slot(self.tail)[..n] },
            None => &mut [],
        }
    }

    #[inline]
    fn commit(&mut self) -> Result<()> {
        if let Some(n) = self.reserved.take() {
            self.publish(n);
        }
        Ok(())
    }

    #[inline]
    fn abort_reserve(&mut self) {
        self.reserved = None;
    }

    #[inline]
    fn recv_next(&mut self, blocking: bool) -> Result<usize> {
        if let Some(n) = self.current {
            return Ok(n);
        }
        let n = if self.has_data() {
            self.rx_waiting = false;
            self.head_len()
        } else {
            self.wait_data(blocking)?
        };
        self.current = Some(n);
        Ok(n)
    }

    #[inline]
    fn current(&self) -> SharedBytes<'_> {
        match self.current {
            // SAFETY: the current message is published and not consumed: ours to read
            // until `release`, which takes `&mut self`.
            Some(_) => SharedBytes::local(unsafe { self.rx().slot(self.head) }),
            None => SharedBytes::local(&[]),
        }
    }

    #[inline]
    fn release(&mut self) {
        if let Some(n) = self.current.take() {
            self.consume(n);
        }
    }

    fn take_current(&mut self) -> Vec<u8> {
        match self.current.take() {
            Some(n) => {
                // SAFETY: as in `current`; the slot gets an empty buffer back.
                let v = mem::take(unsafe { self.rx().slot(self.head) });
                self.consume(n);
                v
            }
            None => Vec::new(),
        }
    }

    fn max_send_size(&self) -> usize {
        self.max_send
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.own().flag.fd()
    }

    fn close(&mut self, _wait: bool) -> Result<()> {
        // Nothing is ever queued outside the pipe: every accepted message is in it.
        if !self.closed {
            self.closed = true;
            self.finish(CLOSED);
        }
        Ok(())
    }

    fn local_addr(&self) -> String {
        self.addr.clone()
    }

    fn peer_addr(&self) -> String {
        self.addr.clone()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

impl Drop for InprocConn {
    fn drop(&mut self) {
        // Dropped without `close` (the public `Connection` always closes): a reset.
        if !self.closed {
            self.closed = true;
            self.finish(RESET);
        }
    }
}

/// Builds both ends: `(client, server)`.
fn pair(addr: &str, client: &Options, server: &Options) -> Result<(InprocConn, InprocConn)> {
    let shared = Arc::new(Shared {
        pipes: [
            Pipe::new(client.ring_size.min(server.ring_size)),
            Pipe::new(client.ring_size.min(server.ring_size)),
        ],
        sides: [Side::new()?, Side::new()?],
    });
    let max_send = client.max_msg_size.min(server.max_msg_size);
    let end = |me, wait| InprocConn {
        shared: shared.clone(),
        me,
        tail: 0,
        sent_bytes: 0,
        seen_head: 0,
        seen_consumed: 0,
        head: 0,
        consumed: 0,
        seen_tail: 0,
        current: None,
        reserved: None,
        tx_waiting: false,
        room_need: 0,
        rx_waiting: true,
        parked_as: None,
        wait,
        max_send,
        closed: false,
        addr: addr.to_string(),
    };
    Ok((end(0, client.wait), end(1, server.wait)))
}

/// Most connections an inbox holds before they are accepted; beyond, the oldest is
/// dropped (its client sees a reset), like the `shm:` listener's pending handshakes.
const MAX_WAITING: usize = 128;

/// A listener's door for clients in its own process.
pub(crate) struct Inbox {
    waiting: Mutex<VecDeque<InprocConn>>,
    /// Readable while `waiting` is not empty; in the listener's epoll set.
    flag: EventFlag,
    opts: Options,
    addr: String,
    /// The rendezvous socket file's (device, inode), if it is a file: a client checks
    /// that the path still leads to this listener.
    file: Option<(u64, u64)>,
    /// The process that entered it: a `fork` child inherits a copy of the table, whose
    /// entries lead to a listener that only the parent accepts from.
    pid: u32,
}

impl Inbox {
    /// The descriptor the listener watches.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.flag.fd()
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<InprocConn>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next connection a client made, if any.
    pub(crate) fn take(&self) -> Option<Box<dyn ConnOps>> {
        let mut q = self.lock();
        let conn = q.pop_front();
        if q.is_empty() {
            let _ = self.flag.clear();
        }
        conn.map(|c| Box::new(c) as Box<dyn ConnOps>)
    }

    /// A client's connection to this listener: the client's end; the listener's waits.
    fn connect(&self, opts: &Options) -> Result<Box<dyn ConnOps>> {
        let (client, server) = pair(&self.addr, opts, &self.opts)?;
        let evicted = {
            let mut q = self.lock();
            let evicted = if q.len() >= MAX_WAITING {
                q.pop_front()
            } else {
                None
            };
            q.push_back(server);
            evicted
        };
        drop(evicted);
        self.flag
            .set()
            .map_err(|e| Error::io("wake the listener", e))?;
        Ok(Box::new(client))
    }
}

/// The listeners of this process that take in-process clients, by rendezvous socket.
fn table() -> MutexGuard<'static, HashMap<String, Weak<Inbox>>> {
    static TABLE: OnceLock<Mutex<HashMap<String, Weak<Inbox>>>> = OnceLock::new();
    TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Enters a listener bound at `key` (its rendezvous socket, as text) with socket file
/// identity `file`; it stays entered while the returned inbox lives.
pub(crate) fn register(
    key: String,
    addr: &str,
    opts: &Options,
    file: Option<(u64, u64)>,
) -> Result<Arc<Inbox>> {
    let inbox = Arc::new(Inbox {
        waiting: Mutex::new(VecDeque::new()),
        flag: EventFlag::new().map_err(|e| Error::io("eventfd", e))?,
        opts: opts.clone(),
        addr: addr.to_string(),
        file,
        pid: std::process::id(),
    });
    let mut t = table();
    t.retain(|_, w| w.strong_count() > 0);
    t.insert(key, Arc::downgrade(&inbox));
    Ok(inbox)
}

/// Leaves the table (a listener's drop), if `inbox` is still the one entered at `key`.
pub(crate) fn unregister(key: &str, inbox: &Arc<Inbox>) {
    let mut t = table();
    if t.get(key).is_some_and(|w| w.as_ptr() == Arc::as_ptr(inbox)) {
        t.remove(key);
    }
    // Clients that connected and were never accepted see a reset.
    let waiting = mem::take(&mut *inbox.lock());
    drop(waiting);
}

/// Connects in-process to the listener entered at `key`, if there is one in this
/// process; `file` is what the socket path leads to now (device, inode), if a file.
pub(crate) fn connect(
    key: &str,
    file: Option<(u64, u64)>,
    opts: &Options,
) -> Option<Result<Box<dyn ConnOps>>> {
    let inbox = table().get(key).and_then(Weak::upgrade)?;
    if inbox.file != file {
        // The path now leads elsewhere (the socket file was replaced).
        return None;
    }
    if inbox.pid != std::process::id() {
        // A copy of the parent's table in a `fork` child: the listener accepts in the
        // parent, through the socket.
        return None;
    }
    Some(inbox.connect(opts))
}
