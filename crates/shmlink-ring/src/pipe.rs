//! The in-process pipe: one direction of a connection whose two ends live in one process
//! (shmlink's in-process `shm:` connections, docs/design.md "In-process connections").
//!
//! A [`Pipe`] is a single-producer single-consumer ring of message slots, each a
//! `Vec<u8>` kept between messages (so a steady stream allocates nothing), with flow
//! control in bytes: at most `ring` bytes in flight, or two messages of any size (so that
//! one is written while the other is read). The producer's position is [`Tx`], the
//! consumer's [`Rx`]; each slot belongs to one of them at a time, handed over by the
//! positions (`tail`, then `head`).
//!
//! The wake-up protocol: a side that must wait announces itself in its own [`Waiters`]
//! bits, then looks again; the other side publishes its progress with a sequentially
//! consistent read-modify-write (`publish`, `consume`) and then reads those bits
//! ([`Waiters::take`]): whichever comes second sees the other, so no wake-up is lost and
//! one costs a system call only when the other side is known to sleep. The waker clears
//! the bits it acts on, so each announcement brings at most one wake-up. [`End`] says
//! whether a side is still there; it is stored after the side's last message.
//!
//! How a side sleeps (thread parking, an eventfd) is the caller's: this module is the
//! lock-free part only. Its loom model (`pipe/loom_model.rs`) moves messages through a
//! pipe small enough to fill, both sides parking the way shmlink's do.
//!
//! Loom treats sequentially consistent accesses as acquire/release (it models SeqCst
//! fences only), so under `--cfg loom` a SeqCst fence follows each read-modify-write the
//! no-lost-wake-up argument rests on (`seqcst_point`); the C++ model gives the SeqCst
//! accesses of a normal build at least that order.

use std::sync::Mutex;

use crate::sync::{AtomicU64, AtomicU8, Ordering, UnsafeCell};
use crate::Line;

#[cfg(all(test, loom))]
mod loom_model;

/// Slots per pipe: one per this many bytes of the ring size, within the bounds below.
const BYTES_PER_SLOT: usize = 256;
const MIN_SLOTS: usize = 16;
const MAX_SLOTS: usize = 1024;
/// A consumed message's buffer stays in its slot up to this capacity, or four times the
/// ring's bytes per slot if more; a larger one goes to the pipe's free list (a mutex:
/// worth it only where the copy dwarfs it), whose top is the warmest.
const MIN_KEEP: usize = 2048;

/// Under loom only, a SeqCst fence after a SeqCst read-modify-write (see the module
/// docs); nothing in a normal build.
#[inline(always)]
fn seqcst_point() {
    #[cfg(loom)]
    // SYNC POINT (inproc wake, loom): the SeqCst fence loom can model, standing for the
    // SeqCst order of the RMW just before it (see the module docs); pairs with the same
    // fence on the other side.
    crate::sync::fence(Ordering::SeqCst);
}

/// One direction: a ring of message slots.
pub struct Pipe {
    slots: Box<[UnsafeCell<Vec<u8>>]>,
    mask: u64,
    /// Bytes that may be in flight; besides, two messages of any size may always be
    /// (so that one is written while the other is read).
    cap: u64,
    /// Messages published (the producer's position).
    tail: Line<AtomicU64>,
    /// Messages consumed and their bytes (the consumer's position).
    head: Line<Consumed>,
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

// SAFETY: slot `i` is touched only by the producer while it is not published and
// unconsumed, and only by the consumer between the producer's publication of it (`tail`)
// and the consumer's release of it (`head`): the positions hand each slot from one
// thread to the other (`Tx` and `Rx` each have one owner: their methods take `&mut`).
unsafe impl Sync for Pipe {}

impl Pipe {
    /// A pipe for `ring` bytes in flight.
    pub fn new(ring: usize) -> Pipe {
        let n = (ring / BYTES_PER_SLOT)
            .clamp(MIN_SLOTS, MAX_SLOTS)
            .next_power_of_two();
        Pipe {
            slots: (0..n).map(|_| UnsafeCell::new(Vec::new())).collect(),
            mask: n as u64 - 1,
            cap: ring as u64,
            keep: (4 * ring / n).max(MIN_KEEP),
            free: Mutex::new(FreeList::default()),
            tail: Line(AtomicU64::new(0)),
            head: Line(Consumed {
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
    /// The caller owns that slot now (see the `Sync` impl) and holds no other reference
    /// to it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slot(&self, pos: u64) -> &mut Vec<u8> {
        // SAFETY: the caller owns the slot; the index is masked into the array.
        self.slots[(pos & self.mask) as usize].with_mut(|p| unsafe { &mut *p })
    }
}

/// The producer's side of a pipe: its position and what it last read of the consumer's.
#[derive(Debug, Default)]
pub struct Tx {
    tail: u64,
    sent_bytes: u64,
    seen_head: u64,
    seen_consumed: u64,
}

impl Tx {
    /// Whether a message of `len` bytes fits, with what we last read of the consumer.
    #[inline(always)]
    pub fn fits(&self, pipe: &Pipe, len: usize) -> bool {
        let in_flight = self.sent_bytes - self.seen_consumed;
        let msgs = self.tail - self.seen_head;
        msgs <= pipe.mask && (msgs < 2 || in_flight + len as u64 <= pipe.cap)
    }

    /// Whether a message of `len` bytes fits, reading the consumer's position again.
    #[inline]
    pub fn has_room(&mut self, pipe: &Pipe, len: usize) -> bool {
        if self.fits(pipe, len) {
            return true;
        }
        let h = &pipe.head.0;
        // SYNC POINT (inproc room): SeqCst load pairs with the consumer's SeqCst swap of
        // `msgs` in `Rx::consume` (and, for the no-lost-wake-up, with its load of our wait
        // bits after it).
        let msgs = h.msgs.load(Ordering::SeqCst);
        // SYNC POINT (inproc room): Acquire pairs with the consumer's Release store of
        // `bytes` in `Rx::consume`, made before its swap of `msgs`.
        let bytes = h.bytes.load(Ordering::Acquire);
        self.seen_head = msgs;
        self.seen_consumed = bytes;
        self.fits(pipe, len)
    }

    /// The slot at `tail`, for a message of `len` bytes: its own buffer, or a kept one
    /// if that is too small (so a stream of large messages reuses a few warm buffers
    /// instead of allocating, and faulting in, one per message).
    ///
    /// # Safety
    /// [`has_room`](Self::has_room) (or `fits`) said a message fits since the last
    /// [`publish`](Self::publish), and no other reference to the slot lives.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slot<'p>(&self, pipe: &'p Pipe, len: usize) -> &'p mut Vec<u8> {
        // SAFETY: the slot at `tail` is free (the caller's contract): ours until `publish`.
        let v = unsafe { pipe.slot(self.tail) };
        if v.capacity() < len && len > pipe.keep {
            if let Some(buf) = pipe.take(len) {
                *v = buf;
            }
        }
        v
    }

    /// The slot at `tail` as it is (a reservation being written).
    ///
    /// # Safety
    /// As for [`slot`](Self::slot).
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn reserved<'p>(&self, pipe: &'p Pipe) -> &'p mut Vec<u8> {
        // SAFETY: forwarded to the caller.
        unsafe { pipe.slot(self.tail) }
    }

    /// Publishes the message in the slot at `tail` (`len` bytes). The caller then wakes
    /// the consumer if it waits ([`Waiters::take`] of its [`Waiters::DATA`] bits).
    #[inline(always)]
    pub fn publish(&mut self, pipe: &Pipe, len: usize) {
        self.tail += 1;
        self.sent_bytes += len as u64;
        // SYNC POINT (inproc data): SeqCst swap publishes the slot's message: pairs with
        // the consumer's SeqCst load of `tail` in `Rx::has_data`, and orders before our
        // load of its wait bits in `Waiters::take`.
        pipe.tail.0.swap(self.tail, Ordering::SeqCst);
        seqcst_point();
    }
}

/// The consumer's side of a pipe: its position and what it last read of the producer's.
#[derive(Debug, Default)]
pub struct Rx {
    head: u64,
    consumed: u64,
    seen_tail: u64,
}

impl Rx {
    /// Whether a message waits, reading the producer's position again if needed.
    #[inline]
    pub fn has_data(&mut self, pipe: &Pipe) -> bool {
        if self.seen_tail != self.head {
            return true;
        }
        // SYNC POINT (inproc data): SeqCst load pairs with the producer's SeqCst swap of
        // `tail` in `Tx::publish`: the slot's message is visible (and, after `announce`,
        // no wake-up is lost).
        self.seen_tail = pipe.tail.0.load(Ordering::SeqCst);
        self.seen_tail != self.head
    }

    /// The message at `head`.
    ///
    /// # Safety
    /// [`has_data`](Self::has_data) said it is published, and no other reference to the
    /// slot lives.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn current<'p>(&self, pipe: &'p Pipe) -> &'p mut Vec<u8> {
        // SAFETY: published and not consumed (the caller's contract): ours.
        unsafe { pipe.slot(self.head) }
    }

    /// Consumes the message at `head` (`len` bytes), handing its slot back. The caller
    /// then wakes the producer if it waits ([`Waiters::take`] of its
    /// [`Waiters::ROOM`] bits).
    ///
    /// The message must be published ([`has_data`](Self::has_data)) and no reference to
    /// it may live on (the `&mut self` of the callers' `release` ensures it).
    #[inline(always)]
    pub fn consume(&mut self, pipe: &Pipe, len: usize) {
        // SAFETY: the slot at `head` holds a published message: ours until `head` moves,
        // below.
        let v = unsafe { pipe.slot(self.head) };
        if v.capacity() > pipe.keep {
            pipe.give(std::mem::take(v));
        }
        self.head += 1;
        self.consumed += len as u64;
        let h = &pipe.head.0;
        // SYNC POINT (inproc room): Release pairs with the producer's Acquire load of
        // `bytes` in `Tx::has_room`.
        h.bytes.store(self.consumed, Ordering::Release);
        // SYNC POINT (inproc room): SeqCst swap hands the slot back: pairs with the
        // producer's SeqCst load in `Tx::has_room`, and orders before our load of its
        // wait bits in `Waiters::take`.
        h.msgs.swap(self.head, Ordering::SeqCst);
        seqcst_point();
    }
}

/// What a side waits for and how to wake it: bits it sets itself, cleared by the waker.
pub struct Waiters(Line<AtomicU8>);

impl Waiters {
    /// Waits for data, parked.
    pub const DATA_PARK: u8 = 1;
    /// Waits for room, parked.
    pub const ROOM_PARK: u8 = 2;
    /// Waits for data, its descriptor armed.
    pub const DATA_FD: u8 = 4;
    /// Waits for room, its descriptor armed.
    pub const ROOM_FD: u8 = 8;
    /// Waits for data, either way.
    pub const DATA: u8 = Self::DATA_PARK | Self::DATA_FD;
    /// Waits for room, either way.
    pub const ROOM: u8 = Self::ROOM_PARK | Self::ROOM_FD;

    /// Bits `initial` announced.
    pub fn new(initial: u8) -> Waiters {
        Waiters(Line(AtomicU8::new(initial)))
    }

    /// Announces `bit`; the caller then looks again at what it waits for.
    #[inline]
    pub fn announce(&self, bit: u8) {
        // SYNC POINT (inproc wake): SeqCst RMW pairs with the waker's SeqCst load in
        // `take`, after its position RMW (`publish`/`consume`): whichever comes second
        // sees the other.
        self.0 .0.fetch_or(bit, Ordering::SeqCst);
        seqcst_point();
    }

    /// Withdraws `bit` (the second look found what it waits for).
    #[inline]
    pub fn retract(&self, bit: u8) {
        // SYNC POINT (inproc wake): SeqCst RMW withdraws our announcement; pairs with
        // `take_slow`'s `fetch_and`.
        self.0 .0.fetch_and(!bit, Ordering::SeqCst);
    }

    /// The waker's side, after its position RMW: which of `bits` the other side
    /// announced, clearing them (it is woken once per announcement).
    #[inline(always)]
    pub fn take(&self, bits: u8) -> u8 {
        // SYNC POINT (inproc wake): SeqCst load pairs with the sleeper's SeqCst `fetch_or`
        // in `announce`: our position RMW came first, so either we see its bit or its
        // second look sees our position.
        if self.0 .0.load(Ordering::SeqCst) & bits != 0 {
            self.take_slow(bits)
        } else {
            0
        }
    }

    #[cold]
    #[inline(never)]
    fn take_slow(&self, bits: u8) -> u8 {
        // SYNC POINT (inproc wake): SeqCst RMW clears the bits we act on; pairs with
        // `announce`/`retract` on the sleeping side.
        self.0 .0.fetch_and(!bits, Ordering::SeqCst) & bits
    }

    /// Clears every bit (the other side left: it is woken for all of them).
    pub fn take_all(&self) {
        // SYNC POINT (inproc wake): SeqCst RMW clears every bit the side announced;
        // pairs with its `announce`.
        self.0 .0.fetch_and(0, Ordering::SeqCst);
    }
}

/// Whether a side is still there: live, closed gracefully, or dropped without closing.
pub struct End(AtomicU8);

impl End {
    /// The side is there.
    pub const LIVE: u8 = 0;
    /// It closed: every message it sent is in the pipe.
    pub const CLOSED: u8 = 1;
    /// It went without closing.
    pub const RESET: u8 = 2;

    /// A live side.
    pub fn new() -> End {
        End(AtomicU8::new(Self::LIVE))
    }

    /// How the side is, ordered with everything around it.
    #[inline]
    pub fn load(&self) -> u8 {
        // SYNC POINT (inproc end): SeqCst load pairs with the SeqCst store in `set`:
        // after the side's last `publish`, so seeing the end means seeing every message
        // before it; after our `announce`, so a side that left is never slept on.
        self.0.load(Ordering::SeqCst)
    }

    /// How the side is, where only its messages matter (not a wake-up).
    #[inline]
    pub fn load_acquire(&self) -> u8 {
        // SYNC POINT (inproc end): Acquire pairs with the SeqCst store in `set`.
        self.0.load(Ordering::Acquire)
    }

    /// The side leaves (`CLOSED` or `RESET`), after its last message; the caller then
    /// clears the other side's [`Waiters`] and wakes it whatever it waits for.
    pub fn set(&self, how: u8) {
        // SYNC POINT (inproc end): SeqCst store pairs with the other side's SeqCst
        // `load`s, made after its own `announce`.
        self.0.store(how, Ordering::SeqCst);
        seqcst_point();
    }
}

impl Default for End {
    fn default() -> End {
        End::new()
    }
}
