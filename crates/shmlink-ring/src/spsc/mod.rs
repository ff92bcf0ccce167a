//! Single-producer single-consumer rings of variable-length records in shared memory.
//!
//! A ring is two control blocks and a data area of `cap` bytes (a power of two) that is
//! mapped twice back to back, so a record starting anywhere in the first copy is
//! contiguous. Each side writes only its own block, which lives in memory it owns
//! (docs/design.md §9.1): the producer's [`ProducerCtl`] (its position `tail`, the end-of-stream
//! mark and its sleep announcements) sits next to the data area it fills, the consumer's
//! [`ConsumerCtl`] (its position `head` and its sleep announcements) in the consumer's
//! memory; the other side maps each read-only. Positions are monotonically increasing
//! 64-bit byte counters on separate cache lines; each side caches the other's position
//! and reloads it only when the cached value says "full" or "empty" (rtrb's
//! `cached_head`/`cached_tail`).
//!
//! A record is an 8-byte header — payload length (`u32`, little endian), flags (2 bits)
//! and a stamp of the record's position ([`header_word`]) — followed by the payload, padded
//! to 8 bytes. The header is published last (Release) and the producer zeroes the next
//! record's header slot before it, so the consumer polls the header where the next record
//! will be (in the line it is about to read anyway) instead of the producer's `tail`: in
//! steady state neither side touches the other's position line, and the only line that
//! moves between the cores per record is the record itself. `tail` is still published
//! per record, in a line the consumer reads only before it sleeps (the wake-up protocol
//! below) and after a header says nothing is there. (A producer that publishes in batches is
//! followed by `tail` instead, see [`Consumer::peek`].) A message that does not fit in one record
//! is split: the first fragment has [`FLAG_FIRST`] | [`FLAG_MORE`] and starts with the
//! message's total length (`u64`), middle fragments have [`FLAG_MORE`], the last has no
//! flag.
//!
//! # Waking (docs/design.md §4)
//!
//! A side that is about to sleep increments its `waiting` count (in its own block), issues
//! a full fence and checks the ring again ([`Consumer::arm`], [`Producer::arm`]). A side
//! that makes progress publishes its position, issues a full fence and reads the other
//! side's count ([`Producer::commit`], [`Consumer::advance`] return `true` when the peer
//! must be woken). Whichever of the two fences comes second sees the other side's store,
//! so either the sleeper sees the progress or the waker sees the new count: no lost
//! wake-up. The waker cannot write the sleeper's memory, so instead of clearing a flag it
//! remembers the last count it woke the peer for and wakes only for a newer one: each
//! announcement costs at most one wake-up. A side that finds work after announcing (the
//! re-check, or another connection an event loop waits on) withdraws the announcement
//! ([`Consumer::withdraw`], [`Producer::withdraw`]): it sets [`WITHDRAWN`] in its count,
//! and a waker that reads the bit rings nothing. The next announcement clears the bit and
//! counts on, so it differs from every count woken for. A doorbell rung before the waker
//! saw the bit may still arrive: the side must treat it as stale.
//!
//! # Hostile peers
//!
//! The peer may write anything into its own control block and data area at any time (it
//! cannot write ours: the kernel refuses it a writable mapping). Every position and record
//! header it wrote is read once into a local, validated against what this side
//! knows (monotonicity, alignment, capacity, bytes available), and a bad value becomes a
//! [`Violation`]. Reads and writes stay within the doubly-mapped `2 * cap` bytes whatever
//! the peer does.

use std::ptr::NonNull;

use crate::error::{Result, Violation};
use crate::sync::{compiler_fence, fence, AtomicU32, AtomicU64, Ordering};
use crate::Line;

#[cfg(all(test, loom))]
mod loom_model;
#[cfg(all(test, loom))]
mod loom_shared;

/// Size of a record header.
pub const HEADER: usize = 8;
/// Records start at multiples of this.
pub const ALIGN: usize = 8;
/// More fragments of this message follow.
pub const FLAG_MORE: u32 = 1;
/// First fragment of a split message; its payload starts with the total length (`u64`).
pub const FLAG_FIRST: u32 = 2;
/// Flags of a skip record (`FLAG_FIRST` alone, which no message uses): padding from its
/// position to the end of the ring, written by the producer before a large record when
/// the ring is empty, so that the record starts at the ring's start, in memory the last
/// large record warmed (caches, TLB) instead of the coldest part of the ring. The
/// consumer passes over it ([`Record::is_skip`]).
pub const FLAG_SKIP: u32 = FLAG_FIRST;
/// Records of at least this size (and an eighth of the ring) restart at the ring's start
/// when the ring is empty.
pub const RESTART_MIN: usize = 64 << 10;
const KNOWN_FLAGS: u32 = FLAG_MORE | FLAG_FIRST;
/// Bit 63 of a header word: a published header (a zeroed slot is never one).
const STAMP_VALID: u64 = 1 << 63;
/// Bits 34..63 of a header word: the record's position / 8, modulo 2^29.
const STAMP_SHIFT: u32 = 34;
const STAMP_MASK: u64 = ((1 << 29) - 1) << STAMP_SHIFT;
/// Bits 32..34 of a header word: the flags.
const FLAGS_MASK: u64 = 0b11 << 32;

/// The header word of a record at position `pos` with `len` payload bytes and `flags`:
/// length in bits 0..32, flags in 32..34, `pos / 8` (modulo 2^29) in 34..63, bit 63 set.
#[inline(always)]
pub const fn header_word(pos: u64, len: usize, flags: u32) -> u64 {
    len as u64
        | ((flags as u64) << 32) & FLAGS_MASK
        | ((pos >> 3) << STAMP_SHIFT) & STAMP_MASK
        | STAMP_VALID
}

/// Whether `word` is a header published for position `pos` (valid bit and stamp).
#[inline(always)]
fn stamped(word: u64, pos: u64) -> bool {
    word & (STAMP_MASK | STAMP_VALID) == header_word(pos, 0, 0)
}

/// How far ahead of its position each side prefetches: a few cache lines, about what the
/// other core produces or consumes during one cache-line transfer.
const PREFETCH_AHEAD: usize = 512;

/// Asks for the cache line at `p` in a writable state (x86 `prefetchw`); a hint only.
#[inline(always)]
fn prefetch_write(p: *const u8) {
    // Miri cannot run inline assembly; a hint can be left out.
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    let _ = p;
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: prefetchw is a hint: it never faults or changes memory, whatever the address.
    unsafe {
        std::arch::asm!("prefetchw [{}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
}

/// Asks for the cache line at `p` for reading; a hint only.
#[inline(always)]
fn prefetch_read(p: *const u8) {
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    let _ = p;
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: prefetcht0 is a hint: it never faults or changes memory, whatever the address.
    unsafe {
        std::arch::asm!("prefetcht0 [{}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
}

/// Bytes a record with `len` payload bytes occupies.
pub const fn record_size(len: usize) -> usize {
    (HEADER + len + ALIGN - 1) & !(ALIGN - 1)
}

/// What the producer of a ring writes. It lives in memory the producer owns (its own
/// segment: the consumer maps it read-only) and an all-zero block is a fresh ring.
#[repr(C)]
pub struct ProducerCtl {
    /// Bytes ever published by the producer.
    tail: Line<AtomicU64>,
    /// Set by the producer after its last record: graceful end of stream.
    closed: Line<AtomicU32>,
    /// How many times the producer announced that it sleeps waiting for space.
    waiting: Line<AtomicU64>,
}

/// What the consumer of a ring writes, in memory the consumer owns (the producer maps it
/// read-only); all-zero is a fresh ring.
#[repr(C)]
pub struct ConsumerCtl {
    /// Bytes ever consumed by the consumer.
    head: Line<AtomicU64>,
    /// How many times the consumer announced that it sleeps waiting for data.
    waiting: Line<AtomicU64>,
}

/// Byte offset of `tail` in a [`ProducerCtl`] (for hostile-peer tests and fuzzing).
pub const TAIL_OFFSET: usize = std::mem::offset_of!(ProducerCtl, tail);
/// Byte offset of the `closed` flag in a [`ProducerCtl`].
pub const CLOSED_OFFSET: usize = std::mem::offset_of!(ProducerCtl, closed);
/// Byte offset of the producer's announcement count in a [`ProducerCtl`].
pub const PRODUCER_WAITING_OFFSET: usize = std::mem::offset_of!(ProducerCtl, waiting);
/// Byte offset of `head` in a [`ConsumerCtl`].
pub const HEAD_OFFSET: usize = std::mem::offset_of!(ConsumerCtl, head);
/// Byte offset of the consumer's announcement count in a [`ConsumerCtl`].
pub const CONSUMER_WAITING_OFFSET: usize = std::mem::offset_of!(ConsumerCtl, waiting);

impl ProducerCtl {
    /// A fresh control block (for rings in process memory and tests).
    pub fn new() -> ProducerCtl {
        ProducerCtl {
            tail: Line(AtomicU64::new(0)),
            closed: Line(AtomicU32::new(0)),
            waiting: Line(AtomicU64::new(0)),
        }
    }
}

impl Default for ProducerCtl {
    fn default() -> Self {
        ProducerCtl::new()
    }
}

impl ConsumerCtl {
    /// A fresh control block (for rings in process memory and tests).
    pub fn new() -> ConsumerCtl {
        ConsumerCtl {
            head: Line(AtomicU64::new(0)),
            waiting: Line(AtomicU64::new(0)),
        }
    }

    /// Marks the consumer as waiting before the ring is shared, so that the first record
    /// always rings the doorbell: a new connection's fd then becomes readable when its
    /// first message arrives, without the application having to call `recv` first.
    pub fn start_armed(&self) {
        self.waiting.0.store(1, Ordering::Relaxed);
    }
}

impl Default for ConsumerCtl {
    fn default() -> Self {
        ConsumerCtl::new()
    }
}

/// How a side orders "publish my position" against "read the sleeper's flag".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceMode {
    /// Both the waker and the sleeper issue a full fence (docs/design.md §4.2; the
    /// protocol the loom model checks).
    Symmetric,
    /// The waker, on every record, only stops the compiler from reordering; the sleeper,
    /// before it re-checks, runs `membarrier(GLOBAL_EXPEDITED)`, which makes every CPU
    /// running a registered process (the waker's) execute a full fence. That is the same
    /// StoreLoad ordering as two fences, paid on the rare path only (the argument is at
    /// `announce`: loom cannot check it). Both processes must be registered
    /// ([`shmlink_sys::membarrier_register`]); the handshake checks it.
    Asymmetric,
}

// # Why the asymmetric fence is sound (an argument: loom cannot check it)
//
// The loom model checks `Symmetric`: the waker W stores its position, fences, loads the
// sleeper's count; the sleeper S stores its count, fences, loads W's position (the
// re-check). Of two SeqCst fences one comes first, so one side sees the other's store.
// `Asymmetric` removes W's fence (a compiler barrier remains) and adds to S, after its
// fence, `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`. Loom has no operation by which one
// thread makes another execute a fence at a point the other does not choose, which is
// what membarrier does; modelling it as a fence on S's own side would check nothing new.
// What loom does show (`loom_asymmetric_mode_without_its_membarrier_loses_a_wakeup`): the
// mode without the membarrier's effect loses a wake-up, so everything rests on the
// guarantee below.
//
// What the kernel guarantees (membarrier(2); the ordering table in the syscall's comment
// in kernel/sched/membarrier.c): when GLOBAL_EXPEDITED returns, every thread of every
// process registered with MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED that was running has
// passed through a full memory barrier (an IPI to its CPU) between the call's entry and
// its return; a thread that was not running is in that state already (the scheduler
// fences on context switch). The call fences the caller at entry and at exit. The table
// lists "compiler barrier on one side, sys_membarrier on the other" as ordered, like two
// full barriers. The IPI's barrier lands at some point P of W's instruction stream:
// - P before W's position store: S's count store came before the IPI was sent (S's fence,
//   then the entry barrier), and W's count load comes after P (the compiler barrier keeps
//   it there in program order; a CPU does not hoist loads above a full barrier), so W
//   sees the count and wakes S.
// - P between W's store and its load: a full fence between them, the symmetric case.
// - P after W's load: W's store precedes P, so it is globally visible before membarrier
//   returns, and S's re-check, after the return, sees W's position: S does not sleep.
// The compiler barrier is what makes "P between the store and the load" the only way to
// split them: without it the compiler could sink the store below the load. (Rust's
// `compiler_fence` is specified for exactly this: ordering against code that runs
// asynchronously on the same thread, as a signal handler — here, the IPI's barrier.)
//
// Across processes: the two sides are different processes that share memory, so the
// command must be GLOBAL_EXPEDITED, as `shmlink_sys::membarrier_global` issues.
// PRIVATE_EXPEDITED fences only the threads of the caller's own process (those sharing
// its mm) and would leave the peer unfenced. Both sides register before offering the
// feature (shmlink's `transport::shm::own_features`) and the handshake enables the mode
// only if both offered it. Registration belongs to the mm: a forked child inherits it (checked on
// Linux 6.18: a child of a registered process may issue PRIVATE_EXPEDITED, which refuses
// unregistered callers) and exec clears it, as it clears `membarrier_register`'s
// cached answer. The call can still fail after that: ENOMEM (the kernel allocates a CPU
// mask), or a seccomp filter installed after the handshake. W was then perhaps not
// fenced, so `announce` reports it and the sleeper polls instead of sleeping.

/// Set in an announcement count by a side that no longer sleeps on its announcement
/// ([`Consumer::withdraw`]): wakers ring nothing for it. A peer that predates the bit
/// never sets it (its counts stay far below 2^63), and one that ignores it rings once
/// more for the changed count: a spurious wake-up, as before the bit existed.
pub const WITHDRAWN: u64 = 1 << 63;

/// Full fence (or its light half), then read the other side's announcement count: `true`
/// (wake it) if it announced sleep since the last wake-up we sent, which `woken` records,
/// and has not withdrawn it.
#[inline(always)]
fn take_waiter(count: &AtomicU64, woken: &mut u64, mode: FenceMode) -> bool {
    match mode {
        // SYNC POINT (notify): pairs with the fence in `announce` on the other side. Our
        // position store (Release) precedes this fence and the count load follows it; the
        // sleeper's count store precedes its fence and its position load follows. Of two
        // SeqCst fences one is first, so at least one side sees the other's store: no lost
        // wake-up.
        FenceMode::Symmetric => fence(Ordering::SeqCst),
        // SYNC POINT (notify, asymmetric): pairs with the membarrier in `announce`. If our
        // count load ran before the sleeper's membarrier, the membarrier made our earlier
        // position store visible before the sleeper re-checks; if it ran after, it sees
        // the count the sleeper stored before its membarrier.
        FenceMode::Asymmetric => compiler_fence(Ordering::SeqCst),
    }
    // The count lives in the peer's memory: any value may be there, and all it decides is
    // whether to ring a doorbell. An honest count only grows, so a new announcement always
    // differs from the last one woken for.
    let now = count.load(Ordering::Relaxed);
    // A withdrawn announcement: the peer is awake and checks the ring before it sleeps
    // again, which it announces with a new count (the fence argument then holds anew).
    if now == *woken || now & WITHDRAWN != 0 {
        return false;
    }
    *woken = now;
    true
}

/// Announce sleep: count one more announcement, then the heavy fence (the check that
/// follows is the caller's). Returns `false` if the heavy half of an asymmetric fence
/// failed: the waker may then miss the announcement, so the caller must not sleep.
#[must_use]
fn announce(count: &AtomicU64, mode: FenceMode) -> bool {
    // Only this side writes its count (it lives in our own memory), so load and store
    // need no read-modify-write. Clearing `WITHDRAWN` and counting on gives a value no
    // waker has woken for (wakers remember counts without the bit).
    // A count never carries `SHARED_TOKEN` (a token before it counts on without it).
    count.store(
        (count.load(Ordering::Relaxed) & COUNT_BITS).wrapping_add(1) & COUNT_BITS,
        Ordering::Relaxed,
    );
    // SYNC POINT (notify): pairs with `take_waiter` on the other side.
    fence(Ordering::SeqCst);
    match mode {
        FenceMode::Symmetric => true,
        // SYNC POINT (notify, asymmetric): the fence the waker's compiler barrier pairs
        // with (see "Why the asymmetric fence is sound" above).
        FenceMode::Asymmetric => membarrier_global(),
    }
}

/// Set in an announcement made with a shared wait token ([`Consumer::arm_token`]): a waiter
/// that sleeps on several rings at once (an event loop's `epoll_wait`) announced the same
/// value on each, and a producer process that rang for that value on one of them may skip
/// the others ([`WakeGroup`]). Counts ([`Consumer::arm`]) never carry the bit.
pub const SHARED_TOKEN: u64 = 1 << 62;

/// The bits of an announcement that count: they only grow, whatever mix of counts and
/// tokens a side announces, so an announcement never equals one a waker woke for.
const COUNT_BITS: u64 = !(WITHDRAWN | SHARED_TOKEN);

/// Announce sleep with a shared wait token (see [`SHARED_TOKEN`]): the token if it is above
/// the ring's last announcement, else the next count, without the bit (a waker then
/// rings as for any count: only a missed skip, never a lost wake-up). Either way the
/// value's [`COUNT_BITS`] grow, as `announce`'s do.
#[must_use]
fn announce_token(count: &AtomicU64, token: u64, mode: FenceMode) -> bool {
    let last = count.load(Ordering::Relaxed) & COUNT_BITS;
    let token = token & COUNT_BITS;
    let next = if token > last {
        token | SHARED_TOKEN
    } else {
        last.wrapping_add(1) & COUNT_BITS
    };
    count.store(next, Ordering::Relaxed);
    // SYNC POINT (notify): pairs with `take_waiter` on the other side, as in `announce`.
    fence(Ordering::SeqCst);
    match mode {
        FenceMode::Symmetric => true,
        // SYNC POINT (notify, asymmetric): as in `announce`.
        FenceMode::Asymmetric => membarrier_global(),
    }
}

/// What a producer process remembers of one peer process's shared wait tokens: the last
/// one it rang a doorbell for, on any of the connections to that peer. A waiter that
/// announced one token on several rings sleeps on all of their doorbells in one wait and,
/// once woken, looks at every one of those rings before it sleeps again, with a new token
/// (the ring makes each announcement's value new, [`Consumer::arm_token`]). So one
/// doorbell per token suffices: a producer that finds the token already rung for skips
/// its own. Its data is then either seen by the waiter's scan after that doorbell, or
/// the scan ran before the data's fence, and the waiter's next announcement (a new
/// value, then a full fence) is ordered after it and sees the data, or the producer
/// reads the new value and rings. Only the existence of a ringer matters, so the swap is
/// Relaxed. Keep one group per peer process: token values are unique only within the
/// process that announced them, and a peer's values decide only its own wake-ups.
#[derive(Debug, Default)]
pub struct WakeGroup {
    last: AtomicU64,
}

impl WakeGroup {
    /// A group that has rung for nothing yet.
    pub fn new() -> WakeGroup {
        WakeGroup {
            last: AtomicU64::new(0),
        }
    }

    /// Whether to ring the doorbell for `announced` (what the waker woke for,
    /// [`Producer::woken`]): always for a count; for a shared token, only if nobody in
    /// the group rang for it already (the first caller claims it).
    #[inline]
    pub fn claim(&self, announced: u64) -> bool {
        if announced & SHARED_TOKEN == 0 || announced & WITHDRAWN != 0 {
            return true;
        }
        // SYNC POINT (notify, shared token): Relaxed: see the type's documentation.
        self.last.swap(announced, Ordering::Relaxed) != announced
    }
}

/// Withdraw the standing announcement, if any: no fence, because a waker that still
/// reads the old count only rings a doorbell the side treats as stale.
fn withdraw(count: &AtomicU64) {
    let now = count.load(Ordering::Relaxed);
    if now & WITHDRAWN == 0 {
        // SYNC POINT (notify, withdraw): Relaxed: see above; ordered for wakers by the
        // fence of the next `announce`, which clears the bit.
        count.store(now | WITHDRAWN, Ordering::Relaxed);
    }
}

/// `shmlink_sys::membarrier_global`, whether it ran (tests can make it fail).
fn membarrier_global() -> bool {
    #[cfg(all(test, not(loom)))]
    if tests::MEMBARRIER_FAILS.with(std::cell::Cell::get) {
        return false;
    }
    // Loom cannot model the call's effect (see above): its models see a no-op.
    cfg!(loom) || shmlink_sys::membarrier_global().is_ok()
}

/// Where a ring lives: its two control blocks and its (doubly mapped) data area.
#[derive(Clone, Copy)]
pub struct RingRef {
    prod: NonNull<ProducerCtl>,
    cons: NonNull<ConsumerCtl>,
    data: NonNull<u8>,
    cap: usize,
}

// SAFETY: a RingRef is pointers into shared memory that is valid for as long as the
// owners of the mappings keep them (see `RingRef::new`); all shared fields are atomics.
unsafe impl Send for RingRef {}

impl RingRef {
    /// # Safety
    /// `prod` must point to a `ProducerCtl` and `cons` to a `ConsumerCtl` (or zeroed
    /// memory of their sizes), 128-aligned, and `data` to `2 * cap` readable bytes,
    /// 8-aligned, whose second half mirrors the first. A [`Producer`] built from this
    /// RingRef writes `prod` and `data`, a [`Consumer`] writes `cons`: those must be
    /// writable for the side that builds one, the rest need only be readable (the other
    /// side's memory, mapped read-only; the ring only loads from it). All must stay valid
    /// as long as any Producer or Consumer built from this RingRef lives. `cap` must be a
    /// power of two ≥ 64.
    pub unsafe fn new(
        prod: NonNull<ProducerCtl>,
        cons: NonNull<ConsumerCtl>,
        data: NonNull<u8>,
        cap: usize,
    ) -> RingRef {
        debug_assert!(cap.is_power_of_two() && cap >= 64);
        debug_assert!(prod.as_ptr() as usize % 128 == 0 && cons.as_ptr() as usize % 128 == 0);
        debug_assert!(data.as_ptr() as usize % ALIGN == 0);
        RingRef {
            prod,
            cons,
            data,
            cap,
        }
    }

    /// The producer's block. The consumer only loads from it (atomic loads of at most 8
    /// bytes never write, so read-only memory is fine).
    #[inline]
    fn prod(&self) -> &ProducerCtl {
        // SAFETY: valid for the RingRef's life (contract of `new`); only atomics inside.
        unsafe { self.prod.as_ref() }
    }

    /// The consumer's block; the producer only loads from it.
    #[inline]
    fn cons(&self) -> &ConsumerCtl {
        // SAFETY: valid for the RingRef's life (contract of `new`); only atomics inside.
        unsafe { self.cons.as_ref() }
    }

    /// Data area at position `pos` (wrapped into the first copy).
    #[inline]
    fn at(&self, pos: u64) -> NonNull<u8> {
        // SAFETY: the offset is below `cap`, inside the data area (contract of `new`).
        unsafe { self.data.add(pos as usize & (self.cap - 1)) }
    }

    /// Stores header slot word `word` at position `pos` (Release: what the producer wrote
    /// before is visible to a consumer that loads the word with Acquire).
    #[inline(always)]
    fn store_header(&self, pos: u64, word: u64, order: Ordering) {
        let p = self.at(pos).cast::<u64>().as_ptr();
        // Loom models the data area as plain memory (the header protocol is the tail's
        // there, see `Consumer::peek`): a volatile store, as the mapping sees it.
        #[cfg(loom)]
        {
            let _ = order;
            // SAFETY: positions are 8-aligned and below cap: inside the mapping.
            unsafe { p.write_volatile(word.to_le()) }
        }
        #[cfg(not(loom))]
        // SAFETY: an 8-aligned word inside the data area (contract of `new`); the producer
        // writes its data area only through this ring, atomically for header slots.
        unsafe {
            (*p.cast::<AtomicU64>()).store(word.to_le(), order)
        }
    }

    /// Loads the header slot at position `pos` (Acquire: pairs with `store_header`'s
    /// Release). The peer may have written anything there.
    #[inline(always)]
    fn load_header(&self, pos: u64) -> u64 {
        let p = self.at(pos).cast::<u64>().as_ptr();
        #[cfg(loom)]
        // SAFETY: as in `store_header`.
        let word = unsafe { p.read_volatile() };
        #[cfg(not(loom))]
        // SAFETY: an 8-aligned word inside the mapping; an atomic load of 8 bytes never
        // writes, so read-only memory is fine.
        let word = unsafe { (*p.cast::<AtomicU64>()).load(Ordering::Acquire) };
        u64::from_le(word)
    }

    /// The largest record (header included) a producer writes in one piece: half the ring,
    /// so that the producer can fill one half while the consumer drains the other.
    #[inline]
    pub fn max_record(&self) -> usize {
        self.cap / 2
    }
}

/// The writing end of a ring.
pub struct Producer {
    ring: RingRef,
    mode: FenceMode,
    /// Our position; the shared `tail` only ever receives this value.
    tail: u64,
    /// The consumer's position as last read and validated.
    cached_head: u64,
    /// The consumer's announcement count we last woke it for.
    woken: u64,
    /// The last value stored to the shared `tail` ([`Producer::publish`]); below `tail`
    /// while records written with [`Producer::write`] await their publication.
    published: u64,
}

impl Producer {
    /// The producer of a fresh (all-zero) ring.
    pub fn new(ring: RingRef, mode: FenceMode) -> Producer {
        Producer {
            ring,
            mode,
            tail: 0,
            cached_head: 0,
            woken: 0,
            published: 0,
        }
    }

    /// The ring.
    #[inline]
    pub fn ring(&self) -> &RingRef {
        &self.ring
    }

    /// Free bytes for a record according to the cached head: the ring less what is
    /// unread and less the next record's header slot, which every commit zeroes.
    #[inline(always)]
    fn free(&self) -> usize {
        (self.ring.cap - HEADER).saturating_sub((self.tail - self.cached_head) as usize)
    }

    /// Reloads and validates the consumer's position (only when the cached one says
    /// full: off the fast path).
    #[cold]
    #[inline(never)]
    fn refresh_head(&mut self) -> Result<()> {
        // SYNC POINT (data): Acquire pairs with the Release store in `Consumer::advance`:
        // the consumer has finished reading every byte before `head`, so we may reuse it.
        let head = self.ring.cons().head.0.load(Ordering::Acquire);
        if head < self.cached_head || head > self.tail || head % ALIGN as u64 != 0 {
            return Err(Violation::new(format!(
                "ring head {head} invalid (previous {}, tail {})",
                self.cached_head, self.tail
            )));
        }
        self.cached_head = head;
        Ok(())
    }

    /// Whether the consumer has yet to take some of the records published so far
    /// (reloads its position). For a peer that is gone: did it leave data unread?
    pub fn unconsumed(&mut self) -> Result<bool> {
        self.refresh_head()?;
        Ok(self.cached_head != self.tail)
    }

    /// Calls `f` with the payload and flags of every record the consumer has not taken
    /// yet (from its published position to ours, published or only written), in order;
    /// skip records are passed over. For a peer that is gone, or that asked to have them
    /// sent again another way. Our own records, in our own memory: a header that is not
    /// the one we wrote is a violation all the same.
    pub fn for_each_unconsumed(&mut self, mut f: impl FnMut(&[u8], u32)) -> Result<()> {
        self.refresh_head()?;
        let mut pos = self.cached_head;
        while pos < self.tail {
            let word = self.ring.load_header(pos);
            let len = (word & 0xffff_ffff) as usize;
            let flags = ((word & FLAGS_MASK) >> 32) as u32;
            let size = record_size(len);
            if !stamped(word, pos) || size > self.ring.cap - HEADER || pos + size as u64 > self.tail
            {
                return Err(Violation::new(format!(
                    "own record at {pos} unreadable (header {word:#x}, tail {})",
                    self.tail
                )));
            }
            if flags != FLAG_SKIP {
                // SAFETY: a record of ours (at most half the ring, or a skip, which is not
                // read) starting below cap lies in the 2*cap mapped bytes; only this
                // producer writes it, and not while we read (`&mut self`).
                let payload = unsafe {
                    std::slice::from_raw_parts(self.ring.at(pos).add(HEADER).as_ptr(), len)
                };
                f(payload, flags);
            }
            pos += size as u64;
        }
        Ok(())
    }

    /// Whether `need` bytes are free, reloading the head if the cache says no.
    #[inline(always)]
    pub fn has_room(&mut self, need: usize) -> Result<bool> {
        if self.free() >= need {
            return Ok(true);
        }
        self.refresh_head()?;
        Ok(self.free() >= need)
    }

    /// Where the payload of a record with `len` bytes goes, if there is room for it.
    /// `record_size(len)` must not exceed [`RingRef::max_record`].
    #[inline(always)]
    pub fn try_reserve(&mut self, len: usize) -> Result<Option<NonNull<u8>>> {
        debug_assert!(record_size(len) <= self.ring.max_record());
        if record_size(len) >= RESTART_MIN.max(self.ring.cap / 8) {
            self.restart_if_empty(record_size(len))?;
        }
        if !self.has_room(record_size(len))? {
            return Ok(None);
        }
        // SAFETY: the header starts below `cap` and the record is at most cap/2 bytes, so
        // it lies within the 2*cap mapped bytes.
        Ok(Some(unsafe { self.ring.at(self.tail).add(HEADER) }))
    }

    /// Before a large record of `size` bytes (or records: the fragments of a message, in
    /// all): if the ring is empty and they fit at its start, writes a skip record
    /// ([`FLAG_SKIP`]) to the end of the ring, so they land at the start, where the
    /// previous ones did. The skip is published with the next record (by `commit`'s
    /// `tail`: no wake-up of its own, which would use up the consumer's announcement); a
    /// consumer that finds its header first passes over it. [`try_reserve`] does this
    /// itself for a record of at least [`RESTART_MIN`] and an eighth of the ring.
    ///
    /// [`try_reserve`]: Producer::try_reserve
    #[cold]
    pub fn restart_if_empty(&mut self, size: usize) -> Result<()> {
        let off = self.tail as usize & (self.ring.cap - 1);
        // The skip (cap - off bytes), the record and the next header slot must fit.
        if off == 0 || off < size + HEADER {
            return Ok(());
        }
        if self.tail != self.cached_head {
            self.refresh_head()?;
            if self.tail != self.cached_head {
                return Ok(());
            }
        }
        let skip = (self.ring.cap - off) as u64;
        self.ring
            .store_header(self.tail + skip, 0, Ordering::Relaxed);
        // SYNC POINT (data): Release pairs with the Acquire in `Consumer::peek` (the
        // zeroed slot first, as in `commit`).
        self.ring.store_header(
            self.tail,
            header_word(self.tail, skip as usize - HEADER, FLAG_SKIP),
            Ordering::Release,
        );
        self.tail += skip;
        Ok(())
    }

    /// Publishes the record reserved by the last successful [`try_reserve`] with `len`
    /// payload bytes (the same `len`) and `flags`. Returns whether the consumer announced
    /// sleep and must be woken. [`write`] then [`publish`], in one call.
    ///
    /// [`try_reserve`]: Producer::try_reserve
    /// [`write`]: Producer::write
    /// [`publish`]: Producer::publish
    #[inline(always)]
    pub fn commit(&mut self, len: usize, flags: u32) -> bool {
        self.write(len, flags);
        self.publish()
    }

    /// Writes the header of the record reserved by the last successful [`try_reserve`]
    /// (`len` payload bytes, the same `len`, and `flags`) without publishing `tail`: a
    /// consumer that is reading finds the record by its header, but one that sleeps or is
    /// about to is neither woken nor told (its re-check reads `tail`). Several records
    /// written this way are published together by one [`publish`]: one store of `tail`
    /// and one full fence for all of them. The caller must [`publish`] before it waits
    /// for anything (room included) and when the batch ends.
    ///
    /// [`try_reserve`]: Producer::try_reserve
    /// [`publish`]: Producer::publish
    #[inline(always)]
    pub fn write(&mut self, len: usize, flags: u32) {
        let size = record_size(len) as u64;
        // The next record's header slot reads "nothing yet" before this header says
        // "here": a consumer that sees this record never takes stale bytes there (an old
        // header, or payload that looks like one) for the next. `try_reserve` kept the
        // slot free (`free` leaves HEADER bytes for it).
        self.ring
            .store_header(self.tail + size, 0, Ordering::Relaxed);
        // SYNC POINT (data): Release pairs with the Acquire in `Consumer::peek`: the
        // payload and the zeroed slot are visible before the header is.
        self.ring.store_header(
            self.tail,
            header_word(self.tail, len, flags),
            Ordering::Release,
        );
        self.tail += size;
        // Start taking ownership of the lines the next records will fill, so the stores
        // to them do not wait for the consumer's core to give them up. `at` + the distance
        // stays inside the double mapping (PREFETCH_AHEAD < cap).
        prefetch_write(
            self.ring
                .at(self.tail)
                .as_ptr()
                .wrapping_add(PREFETCH_AHEAD),
        );
    }

    /// Publishes every record written since the last publication (one store of `tail`,
    /// one full fence). Returns whether the consumer announced sleep and must be woken;
    /// `false` at once, without a fence, if nothing was written since.
    #[inline(always)]
    pub fn publish(&mut self) -> bool {
        if self.published == self.tail {
            return false;
        }
        self.published = self.tail;
        // SYNC POINT (data): Release pairs with the Acquire load in `Consumer::refresh_tail`
        // (the consumer reads `tail` only before it sleeps: this line stays ours).
        self.ring.prod().tail.0.store(self.tail, Ordering::Release);
        // SYNC POINT (notify): the wake-up protocol orders this `tail` store (which covers
        // every record written before it) against the consumer's announcement.
        take_waiter(&self.ring.cons().waiting.0, &mut self.woken, self.mode)
    }

    /// Announces that the producer will sleep until `need` bytes are free, then checks
    /// again. `Ok(true)`: room appeared, do not sleep (the announcement is withdrawn; a
    /// doorbell rung before that may still come); also when the asymmetric fence failed,
    /// where sleeping could miss the wake-up (check the room again instead).
    pub fn arm(&mut self, need: usize) -> Result<bool> {
        debug_assert!(
            self.published == self.tail,
            "publish written records before waiting for room"
        );
        if !announce(&self.ring.prod().waiting.0, self.mode) {
            return Ok(true);
        }
        self.refresh_head()?;
        let room = self.free() >= need;
        if room {
            self.withdraw();
        }
        Ok(room)
    }

    /// Withdraws the producer's standing announcement (it no longer sleeps on it): the
    /// consumer rings no doorbell for it. Only for a producer that checks the ring again
    /// before it sleeps (with a new [`arm`](Producer::arm)). A doorbell the consumer rang
    /// before it saw this may still arrive.
    pub fn withdraw(&mut self) {
        withdraw(&self.ring.prod().waiting.0);
    }

    /// The consumer announcement this producer last decided to wake (what
    /// [`commit`](Producer::commit)/[`publish`](Producer::publish)/[`close`](Producer::close)
    /// returning `true` was for): the value a [`WakeGroup`] decides on.
    pub fn woken(&self) -> u64 {
        self.woken
    }

    /// Marks the end of the stream after the last record. Returns whether the consumer
    /// must be woken.
    pub fn close(&mut self) -> bool {
        // Records written and not yet published go out with the mark (the fence below
        // follows both stores).
        if self.published != self.tail {
            self.published = self.tail;
            // SYNC POINT (data): as in `publish`.
            self.ring.prod().tail.0.store(self.tail, Ordering::Release);
        }
        // SYNC POINT (close): Release pairs with the Acquire in `Consumer::peer_closed`:
        // a consumer that sees `closed` also sees every record published before it.
        self.ring.prod().closed.0.store(1, Ordering::Release);
        take_waiter(&self.ring.cons().waiting.0, &mut self.woken, self.mode)
    }
}

/// A record as the consumer sees it: validated header and payload location.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    /// Payload start.
    pub ptr: NonNull<u8>,
    /// Payload length.
    pub len: usize,
    /// Flags ([`FLAG_MORE`], [`FLAG_FIRST`]).
    pub flags: u32,
}

impl Record {
    /// Whether this is a skip record ([`FLAG_SKIP`]): pass over it with
    /// [`Consumer::advance`]`(size())`, its payload is padding.
    pub fn is_skip(&self) -> bool {
        self.flags == FLAG_SKIP
    }

    /// Bytes the record occupies in the ring.
    pub fn size(&self) -> usize {
        record_size(self.len)
    }
}

/// The reading end of a ring.
pub struct Consumer {
    ring: RingRef,
    mode: FenceMode,
    /// Our position; the shared `head` only ever receives this value.
    head: u64,
    /// The producer's position as last read and validated.
    cached_tail: u64,
    /// The producer's announcement count we last woke it for.
    woken: u64,
    /// The last value stored to the shared `head`; below `head` while records taken with
    /// [`Consumer::consume`] await their publication.
    published: u64,
    /// [`Consumer::consume`] publishes once this many bytes were taken unpublished (0:
    /// every time, as [`Consumer::advance`]).
    lazy: u64,
    /// Whether the last `tail` read revealed more than [`BATCH_SEEN`] bytes beyond
    /// `head`: the producer publishes in batches (or we fell behind). Past the records
    /// that read revealed, [`Consumer::peek`] then reads `tail` before the next header:
    /// the records of a batch are taken once the batch is published, while the producer
    /// fills the next one, instead of one by one as their headers appear, chasing the
    /// producer through the very lines it is writing (measured: 31-35 against 47-50 M
    /// msg/s for 64 B records in batches of 64, docs/benchmarks.md, round 3). After a
    /// small step (a producer publishing each record) the header comes first, as before.
    by_tail: bool,
}

/// A `tail` that moves by more than this many bytes past `head` at once says the producer
/// publishes in batches ([`Consumer::peek`]); one record of up to 500 bytes at a time
/// does not.
const BATCH_SEEN: u64 = PREFETCH_AHEAD as u64;

impl Consumer {
    /// The consumer of a fresh (all-zero) ring.
    pub fn new(ring: RingRef, mode: FenceMode) -> Consumer {
        Consumer {
            ring,
            mode,
            head: 0,
            cached_tail: 0,
            woken: 0,
            published: 0,
            lazy: 0,
            by_tail: false,
        }
    }

    /// Our position: bytes taken from the ring since it was created (skip records and
    /// headers included).
    #[inline]
    pub fn position(&self) -> u64 {
        self.head
    }

    /// Lets [`Consumer::consume`] hold back the publication of `head` until `bytes`
    /// bytes were taken (capped at half the ring; 0, the default, publishes every
    /// time). The producer then sees up to that much less room than there is, while the
    /// consumer still has records to read: it publishes whenever it finds the ring empty
    /// ([`Consumer::flush`] before it waits).
    pub fn set_lazy_head(&mut self, bytes: usize) {
        self.lazy = bytes.min(self.ring.cap / 2) as u64;
    }

    /// The ring.
    #[inline]
    pub fn ring(&self) -> &RingRef {
        &self.ring
    }

    /// Reloads and validates the producer's position. The header protocol lets the
    /// consumer run ahead of the `tail` it last read, and even of the one it reads now
    /// (the producer stores a record's header before its tail), so `tail` may lie below
    /// `head`; it never decreases and is never more than a ring ahead.
    #[inline]
    fn refresh_tail(&mut self) -> Result<()> {
        // SYNC POINT (data): Acquire pairs with the Release store in `Producer::commit`:
        // every record before `tail` is completely written.
        let tail = self.ring.prod().tail.0.load(Ordering::Acquire);
        if tail < self.cached_tail
            || tail > self.head + self.ring.cap as u64
            || tail % ALIGN as u64 != 0
        {
            return Err(Violation::new(format!(
                "ring tail {tail} invalid (previous {}, head {}, capacity {})",
                self.cached_tail, self.head, self.ring.cap
            )));
        }
        if tail > self.head && tail > self.cached_tail {
            self.by_tail = tail - self.head > BATCH_SEEN;
        }
        self.cached_tail = tail;
        Ok(())
    }

    /// Whether a record is available, by the producer's `tail` (reloaded when the cached
    /// one says empty): what a waiting consumer polls. It polls `tail`, not the next
    /// header, on purpose: the header's line is the one the producer is filling, and a
    /// consumer spinning on it would take it away from every store of the record.
    #[inline]
    pub fn has_data(&mut self) -> Result<bool> {
        self.has_data_by_tail()
    }

    /// Whether the producer's `tail` says a record is available (also the check after an
    /// announcement: the wake-up protocol orders `tail`, see the module's docs). A
    /// published tail beyond `head` with no header there is a violation.
    fn has_data_by_tail(&mut self) -> Result<bool> {
        if self.head >= self.cached_tail {
            self.refresh_tail()?;
        }
        if self.head >= self.cached_tail {
            return Ok(false);
        }
        if !stamped(self.ring.load_header(self.head), self.head) {
            return self.no_header();
        }
        Ok(true)
    }

    /// No header at `head`: nothing to read, unless a `tail` read earlier says the
    /// producer published a record there.
    #[cold]
    fn no_header(&self) -> Result<bool> {
        if self.head < self.cached_tail {
            return Err(Violation::new(format!(
                "no record header at {} (tail {})",
                self.head, self.cached_tail
            )));
        }
        Ok(false)
    }

    /// The next record, validated, or `None` if the ring is empty. The header at `head`
    /// is looked at first (the consumer reads its line next anyway): while the consumer
    /// is behind, records are found without touching the producer's `tail` line. Past the
    /// records a `tail` read revealed, after one that revealed a batch, `tail` is read
    /// first (see `by_tail`).
    #[inline]
    pub fn peek(&mut self) -> Result<Option<Record>> {
        // Past the last `tail` read, a producer that publishes in batches is best followed
        // by `tail` (see `by_tail`). Loom: always the tail first (the data area is plain
        // memory there, see loom_model.rs).
        if (cfg!(loom) || (self.following_tail() && self.head >= self.cached_tail))
            && !self.has_data_by_tail()?
        {
            return Ok(None);
        }
        // Read the header once into a local; everything below uses the local copy.
        let mut word = self.ring.load_header(self.head);
        if !stamped(word, self.head) {
            if !self.has_data_by_tail()? {
                return Ok(None);
            }
            // `has_data_by_tail` found the header stamped; a peer may change it, so read
            // it once more into the local and check again.
            word = self.ring.load_header(self.head);
            if !stamped(word, self.head) {
                return self.no_header().map(|_| None);
            }
        }
        let len = (word & 0xffff_ffff) as usize;
        let flags = ((word & FLAGS_MASK) >> 32) as u32;
        // A record is at most half the ring (`RingRef::max_record`), so one starting below
        // cap lies inside the 2*cap mapped bytes whatever the peer wrote; a skip record
        // ends exactly at the end of the ring (and is never read).
        let bad = if flags == FLAG_SKIP {
            (self.head as usize + record_size(len)) % self.ring.cap != 0
                || record_size(len) > self.ring.cap - HEADER
        } else {
            record_size(len) > self.ring.max_record()
        };
        if bad {
            return Err(Violation::new(format!(
                "bad record header at {}: length {len}, flags {flags:#x}, ring of {} bytes",
                self.head, self.ring.cap
            )));
        }
        debug_assert!(flags & !KNOWN_FLAGS == 0);
        Ok(Some(Record {
            // SAFETY: the record (≤ cap/2 bytes from a start below cap) lies in the 2*cap
            // mapped bytes.
            ptr: unsafe { self.ring.at(self.head).add(HEADER) },
            len,
            flags,
        }))
    }

    /// Consumes `bytes` (the size of the record(s) just read) and publishes the new
    /// `head`. Returns whether the producer announced sleep and must be woken.
    #[inline]
    pub fn advance(&mut self, bytes: usize) -> bool {
        self.take(bytes);
        self.publish()
    }

    /// Consumes `bytes` like [`Consumer::advance`], but publishes `head` (a store and a
    /// full fence) only once [`Consumer::set_lazy_head`]'s amount was taken since the last
    /// publication. The caller must [`Consumer::flush`] before it waits for data (and
    /// before [`Consumer::arm`]). Returns whether the producer must be woken.
    ///
    /// Only while it follows a producer that publishes in batches (see `by_tail`): one
    /// that publishes each record gets each `head` at once (holding it back measured
    /// slower there, 27-32 against 38-40 M msg/s for 64 B records; in batches of 64 it
    /// measured 90 against 13-15 M msg/s: the producer that waits for room no longer
    /// takes the `head` line from the consumer on every record).
    #[inline]
    pub fn consume(&mut self, bytes: usize) -> bool {
        self.take(bytes);
        if self.head - self.published < self.lazy && self.following_tail() {
            return false;
        }
        self.publish()
    }

    /// Whether the consumer follows `tail` rather than headers (`by_tail`; always under
    /// loom, whose models find records by `tail`).
    #[inline(always)]
    fn following_tail(&self) -> bool {
        cfg!(loom) || self.by_tail
    }

    /// Publishes what [`Consumer::consume`] held back, if anything. Returns whether the
    /// producer must be woken.
    #[inline]
    pub fn flush(&mut self) -> bool {
        if self.published == self.head {
            return false;
        }
        self.publish()
    }

    #[inline(always)]
    fn take(&mut self, bytes: usize) {
        self.head += bytes as u64;
        if self.cached_tail > self.head + PREFETCH_AHEAD as u64 {
            // Published records further on: fetch them while this one is handled.
            prefetch_read(
                self.ring
                    .at(self.head)
                    .as_ptr()
                    .wrapping_add(PREFETCH_AHEAD),
            );
        }
    }

    #[inline(always)]
    fn publish(&mut self) -> bool {
        self.published = self.head;
        // SYNC POINT (data): Release pairs with the Acquire load in `Producer::refresh_head`.
        self.ring.cons().head.0.store(self.head, Ordering::Release);
        // SYNC POINT (notify): the wake-up protocol orders this `head` store against the
        // producer's announcement; a `head` held back by `consume` is not stored, so it
        // needs no fence until `flush` or a later `consume` stores it.
        take_waiter(&self.ring.prod().waiting.0, &mut self.woken, self.mode)
    }

    /// Announces that the consumer will sleep until data arrives, then checks again.
    /// `Ok(true)`: data appeared, do not sleep (the announcement is withdrawn; a doorbell
    /// rung before that may still come); also when the asymmetric fence failed, where
    /// sleeping could miss the wake-up (peek again instead).
    pub fn arm(&mut self) -> Result<bool> {
        debug_assert!(
            self.published == self.head,
            "flush consumed records before waiting for data"
        );
        if !announce(&self.ring.cons().waiting.0, self.mode) {
            return Ok(true);
        }
        // SYNC POINT (notify): the re-check reads `tail`, the position the producer
        // stores before its fence in `commit` (the header alone is not ordered by it).
        let data = self.has_data_by_tail()?;
        if data {
            self.withdraw();
        }
        Ok(data)
    }

    /// [`arm`](Consumer::arm) with a shared wait token (a value the caller's process never
    /// used before, with the same token on every ring one wait sleeps on; see
    /// [`WakeGroup`]): the announcement is the token, with [`SHARED_TOKEN`], when it is
    /// above this ring's last announcement, else the next count.
    pub fn arm_token(&mut self, token: u64) -> Result<bool> {
        debug_assert!(
            self.published == self.head,
            "flush consumed records before waiting for data"
        );
        if !announce_token(&self.ring.cons().waiting.0, token, self.mode) {
            return Ok(true);
        }
        // SYNC POINT (notify): as in `arm`.
        let data = self.has_data_by_tail()?;
        if data {
            self.withdraw();
        }
        Ok(data)
    }

    /// Withdraws the consumer's standing announcement (it no longer sleeps on it): the
    /// producer rings no doorbell for it. Only for a consumer that checks the ring again
    /// before it sleeps (with a new [`arm`](Consumer::arm)). A doorbell the producer rang
    /// before it saw this may still arrive.
    pub fn withdraw(&mut self) {
        withdraw(&self.ring.cons().waiting.0);
    }

    /// Whether the producer marked the end of the stream. Check [`Consumer::has_data`]
    /// after this returns `true`: records published before the mark are still readable.
    pub fn peer_closed(&self) -> bool {
        // SYNC POINT (close): Acquire pairs with the Release in `Producer::close`.
        self.ring.prod().closed.0.load(Ordering::Acquire) != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A ring in process memory, its data area mirrored by hand (tests only write
    /// records that do not cross the end, or check through the mirror explicitly).
    pub(crate) struct HeapRing {
        prod: Box<ProducerCtl>,
        cons: Box<ConsumerCtl>,
        data: Vec<u64>,
    }

    impl HeapRing {
        pub(crate) fn new(cap: usize) -> HeapRing {
            HeapRing {
                prod: Box::new(ProducerCtl::new()),
                cons: Box::new(ConsumerCtl::new()),
                data: vec![0u64; 2 * cap / 8],
            }
        }
        /// A producer and a consumer of the ring, symmetric fences.
        fn ends(&mut self) -> (Producer, Consumer) {
            (
                Producer::new(self.ring(), FenceMode::Symmetric),
                Consumer::new(self.ring(), FenceMode::Symmetric),
            )
        }
        pub(crate) fn ring(&mut self) -> RingRef {
            let cap = self.data.len() * 4;
            // SAFETY: the Boxes and the Vec outlive the producers/consumers of each test;
            // records that wrap are never read through the unmirrored second half in
            // these tests (they stay within one lap by construction).
            unsafe {
                RingRef::new(
                    NonNull::from(&mut *self.prod),
                    NonNull::from(&mut *self.cons),
                    NonNull::new(self.data.as_mut_ptr().cast()).unwrap(),
                    cap,
                )
            }
        }
    }

    fn push(p: &mut Producer, msg: &[u8]) -> bool {
        let Some(dst) = p.try_reserve(msg.len()).unwrap() else {
            return false;
        };
        // SAFETY: try_reserve returned room for msg.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), dst.as_ptr(), msg.len()) };
        p.commit(msg.len(), 0);
        true
    }

    fn pop(c: &mut Consumer) -> Option<Vec<u8>> {
        let r = c.peek().unwrap()?;
        // SAFETY: peek validated the record inside the mapping.
        let v = unsafe { std::slice::from_raw_parts(r.ptr.as_ptr(), r.len) }.to_vec();
        c.advance(r.size());
        Some(v)
    }

    #[test]
    fn written_records_are_found_by_header_and_published_together() {
        let mut h = HeapRing::new(256);
        let (mut p, mut c) = h.ends();
        c.set_lazy_head(64);
        for i in 0..3u8 {
            let dst = p.try_reserve(8).unwrap().unwrap();
            // SAFETY: try_reserve returned room for 8 bytes.
            unsafe { dst.as_ptr().write_bytes(i, 8) };
            p.write(8, 0);
        }
        // Not published: `tail` still reads 0, but a reading consumer finds the headers.
        assert_eq!(h.prod.tail.0.load(Ordering::Relaxed), 0);
        for i in 0..3u8 {
            let r = c.peek().unwrap().unwrap();
            // SAFETY: peek validated the record inside the mapping.
            let bytes = unsafe { std::slice::from_raw_parts(r.ptr.as_ptr(), r.len) };
            assert_eq!(bytes, [i; 8]);
            assert!(!c.consume(r.size()));
        }
        assert!(c.peek().unwrap().is_none());
        // Found by their headers (no batch seen through `tail`): the lazy head is not
        // held back, each record's `head` went out at once (`a_batched_producer_is_
        // followed_by_tail` holds it back).
        assert_eq!(h.cons.head.0.load(Ordering::Relaxed), 48);
        assert!(!c.flush());
        // One publication for the three records; a second has nothing to do.
        assert!(!p.publish());
        assert_eq!(h.prod.tail.0.load(Ordering::Relaxed), 48);
        assert!(!p.publish());
        // An announcement made before the publication is answered by it, once.
        assert!(!c.arm().unwrap());
        assert!(push(&mut p, b"wake"));
        assert_eq!(pop(&mut c).unwrap(), b"wake");
        // Both announce; close publishes a written record and wakes the consumer, the
        // consumer's next publication wakes the producer.
        assert!(!c.arm().unwrap());
        assert!(
            !p.arm(250).unwrap(),
            "more than the ring holds: the producer announces"
        );
        p.try_reserve(0).unwrap().unwrap();
        p.write(0, 0);
        assert!(p.close(), "close publishes the written record and wakes");
        let r = c.peek().unwrap().unwrap();
        assert_eq!(r.len, 0);
        assert!(
            c.consume(r.size()) || c.flush(),
            "the waiting producer is woken once"
        );
    }

    /// After a `tail` read that revealed a batch, the consumer takes records up to that
    /// tail and then waits for the next publication instead of chasing headers; after a
    /// one-record step it finds records by their header again.
    #[test]
    fn a_batched_producer_is_followed_by_tail() {
        let mut h = HeapRing::new(4096);
        let (mut p, mut c) = h.ends();
        let write = |p: &mut Producer, i: u8| {
            let dst = p.try_reserve(64).unwrap().unwrap();
            // SAFETY: try_reserve returned room for 64 bytes.
            unsafe { dst.as_ptr().write_bytes(i, 64) };
            p.write(64, 0);
        };
        for i in 0..10 {
            write(&mut p, i);
        }
        assert!(!p.publish());
        write(&mut p, 10); // written, not published
        c.set_lazy_head(1024);
        assert!(c.has_data().unwrap(), "the tail read reveals 720 bytes");
        for i in 0..10u8 {
            let r = c.peek().unwrap().unwrap();
            // SAFETY: peek validated the record inside the mapping.
            let bytes = unsafe { std::slice::from_raw_parts(r.ptr.as_ptr(), r.len) };
            assert_eq!(bytes, [i; 64]);
            assert!(!c.consume(r.size()));
        }
        // Following a batch: the head is held back (720 bytes < 1024) until a flush.
        assert_eq!(h.cons.head.0.load(Ordering::Relaxed), 0);
        assert!(!c.flush());
        assert_eq!(h.cons.head.0.load(Ordering::Relaxed), 720);
        assert!(
            c.peek().unwrap().is_none(),
            "past a batch: the unpublished record waits for its publication"
        );
        assert!(!p.publish());
        assert_eq!(pop(&mut c).unwrap(), [10; 64], "one record revealed");
        write(&mut p, 11);
        assert_eq!(
            pop(&mut c).unwrap(),
            [11; 64],
            "after a small step: found by its header, unpublished"
        );
        assert!(c.peek().unwrap().is_none());
    }

    #[test]
    fn records_round_trip_and_fill_the_ring() {
        let mut h = HeapRing::new(256);
        let (mut p, mut c) = h.ends();
        assert!(pop(&mut c).is_none());
        assert!(push(&mut p, b""));
        assert!(push(&mut p, b"hello"));
        assert_eq!(pop(&mut c).unwrap(), b"");
        assert_eq!(pop(&mut c).unwrap(), b"hello");
        // 16 bytes per record of 5..8 bytes: (256 - 8) / 16 records fit (the next
        // header slot stays free), then full.
        let mut n = 0;
        while push(&mut p, b"1234567") {
            n += 1;
        }
        assert_eq!(n, 15);
        assert!(pop(&mut c).is_some());
        assert!(push(&mut p, b"x"));
    }

    #[test]
    fn hostile_positions_and_headers_are_violations() {
        let mut h = HeapRing::new(256);
        let (mut p, mut c) = h.ends();
        push(&mut p, b"abc");
        assert_eq!(pop(&mut c).unwrap(), b"abc");
        // The positions are read before a sleep (`arm`).
        h.prod.tail.0.store(7, Ordering::Relaxed);
        assert!(c.arm().is_err(), "unaligned tail");
        h.prod.tail.0.store(4096, Ordering::Relaxed);
        assert!(c.arm().is_err(), "tail beyond capacity");
        h.prod.tail.0.store(32, Ordering::Relaxed);
        assert!(c.arm().is_err(), "a published tail with no header at head");
        // Headers: only one stamped for this position counts; its length must fit.
        h.prod.tail.0.store(16, Ordering::Relaxed);
        let mut c = Consumer::new(h.ring(), FenceMode::Symmetric);
        c.head = 16;
        h.data[2] = header_word(16 + 256, 3, 0); // last lap's stamp
        assert!(c.peek().unwrap().is_none());
        h.data[2] = 3 | 1 << 32; // no stamp
        assert!(c.peek().unwrap().is_none());
        h.data[2] = header_word(16, 1000, 0); // beyond half the ring
        assert!(c.peek().is_err());
        h.data[2] = header_word(16, 120, FLAG_MORE);
        let r = c.peek().unwrap().unwrap();
        assert_eq!((r.len, r.flags), (120, FLAG_MORE));
        h.cons.head.0.store(24, Ordering::Relaxed); // beyond our tail
        let mut p2 = Producer::new(h.ring(), FenceMode::Symmetric);
        p2.tail = 16;
        p2.cached_head = 0;
        assert!(p2.has_room(256).is_err());
    }

    /// The records the consumer has not taken, read back by the producer in order
    /// (skip records passed over, written-but-unpublished ones included).
    #[test]
    fn the_producer_reads_back_what_the_consumer_has_not_taken() {
        let cap = 1 << 20;
        let mut h = HeapRing::new(cap);
        let (mut p, mut c) = h.ends();
        let seen = |p: &mut Producer| {
            let mut v = Vec::new();
            p.for_each_unconsumed(|b, f| v.push((b.to_vec(), f)))
                .unwrap();
            v
        };
        assert!(seen(&mut p).is_empty());
        assert!(push(&mut p, &[1; 100]));
        assert!(push(&mut p, &[2; 5]));
        assert_eq!(seen(&mut p), [(vec![1; 100], 0), (vec![2; 5], 0)]);
        assert_eq!(pop(&mut c).unwrap(), [1; 100]);
        assert_eq!(seen(&mut p), [(vec![2; 5], 0)]);
        assert_eq!(pop(&mut c).unwrap(), [2; 5]);
        // A large record on the empty ring restarts at its start behind a skip record;
        // one more is only written, not published.
        let big = 200 << 10;
        let dst = p.try_reserve(big).unwrap().unwrap();
        // SAFETY: `try_reserve` gave room for `big` bytes at `dst`.
        unsafe { std::ptr::write_bytes(dst.as_ptr(), 3, big) };
        p.commit(big, 0);
        let dst = p.try_reserve(7).unwrap().unwrap();
        // SAFETY: as above, 7 bytes.
        unsafe { std::ptr::write_bytes(dst.as_ptr(), 4, 7) };
        p.write(7, FLAG_MORE);
        assert_eq!(seen(&mut p), [(vec![3; big], 0), (vec![4; 7], FLAG_MORE)]);
    }

    /// A large record on an empty ring restarts at the ring's start, behind a skip record
    /// to the end; on a ring that is not empty it goes where the tail is.
    #[test]
    fn large_records_restart_at_the_start_of_an_empty_ring() {
        let cap = 1 << 20;
        let mut h = HeapRing::new(cap);
        let (mut p, mut c) = h.ends();
        let base = h.data.as_ptr() as usize;
        assert!(push(&mut p, &[1; 100]));
        assert_eq!(pop(&mut c).unwrap(), [1; 100]);
        let big = 200 << 10;
        // It does not fit before the tail (112): it goes at the tail.
        let dst = p.try_reserve(big).unwrap().unwrap();
        assert_eq!(dst.as_ptr() as usize - base, 112 + HEADER);
        p.commit(big, 0);
        let r = c.peek().unwrap().unwrap();
        assert_eq!((r.len, r.is_skip()), (big, false));
        c.advance(r.size());
        // Now it does: the next one restarts at the start.
        let dst = p.try_reserve(big).unwrap().unwrap();
        assert_eq!(
            dst.as_ptr() as usize - base,
            HEADER,
            "at the start of the ring"
        );
        p.commit(big, 0);
        let skip = c.peek().unwrap().unwrap();
        assert!(skip.is_skip());
        assert_eq!(skip.size(), cap - 112 - record_size(big));
        c.advance(skip.size());
        let r = c.peek().unwrap().unwrap();
        assert_eq!(
            (r.len, r.flags, r.ptr.as_ptr() as usize - base),
            (big, 0, HEADER)
        );
        c.advance(r.size());
        // Not empty: the next large record follows the small one.
        assert!(push(&mut p, &[2; 100]));
        let dst = p.try_reserve(big).unwrap().unwrap();
        assert_eq!(
            dst.as_ptr() as usize - base,
            record_size(big) + 112 + HEADER
        );
        p.commit(big, 0);
        // Both read, nothing is left.
        for _ in 0..2 {
            let r = c.peek().unwrap().unwrap();
            c.advance(r.size());
        }
        assert!(c.peek().unwrap().is_none());
        // A skip record must end at the end of the ring.
        let mut c2 = Consumer::new(h.ring(), FenceMode::Symmetric);
        h.data[0] = header_word(0, 1000, FLAG_SKIP);
        assert!(c2.peek().is_err());
    }

    /// Payload that looks like the next record's header is never taken for one: the
    /// producer zeroes the next header slot before it publishes a record.
    #[test]
    fn payload_that_looks_like_a_header_is_not_one() {
        let mut h = HeapRing::new(256);
        let (mut p, mut c) = h.ends();
        // Lap after lap, each record's payload carries the header the next record would
        // have at every position.
        let mut pos = 0u64;
        for i in 0..200u64 {
            let mut msg = [0u8; 24];
            for (k, w) in msg.chunks_mut(8).enumerate() {
                let next = pos + 32 + 8 * k as u64;
                w.copy_from_slice(&header_word(next, 8, 0).to_le_bytes());
            }
            msg[..8].copy_from_slice(&i.to_le_bytes());
            assert!(push(&mut p, &msg));
            pos += 32;
            let r = pop(&mut c).unwrap();
            assert_eq!(r[..8], i.to_le_bytes());
            assert!(
                c.peek().unwrap().is_none(),
                "record {i}: no next record yet"
            );
        }
    }

    /// Two threads, many laps, records of varying length: every record arrives whole
    /// and in order through the header protocol.
    #[test]
    fn threads_stream_records_through_the_headers() {
        let mut h = HeapRing::new(1024);
        let ring = h.ring();
        let (mut p, mut c) = (
            Producer::new(ring, FenceMode::Symmetric),
            Consumer::new(ring, FenceMode::Symmetric),
        );
        const N: u64 = 200_000;
        let gave_up = &AtomicU32::new(0);
        struct StopOnUnwind<'a>(&'a AtomicU32);
        impl Drop for StopOnUnwind<'_> {
            fn drop(&mut self) {
                self.0.store(1, Ordering::Relaxed);
            }
        }
        std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..N {
                    // 9..=65 bytes, never across the end (HeapRing has no mirror): pad.
                    let len = 9 + (i as usize * 7) % 57;
                    loop {
                        let at = (p.tail as usize) & 1023;
                        if at + record_size(len) > 1024 {
                            // Fill to the end with a record the consumer skips.
                            let fill = 1024 - at - HEADER;
                            if p.try_reserve(fill).unwrap().is_some() {
                                p.commit(fill, FLAG_FIRST);
                            }
                            continue;
                        }
                        if let Some(dst) = p.try_reserve(len).unwrap() {
                            // SAFETY: `len` > 8 bytes reserved at `dst`.
                            unsafe {
                                dst.as_ptr()
                                    .cast::<[u8; 8]>()
                                    .write_unaligned(i.to_le_bytes());
                                dst.as_ptr().add(len - 1).write(i as u8);
                            }
                            p.commit(len, 0);
                            break;
                        }
                        if gave_up.load(Ordering::Relaxed) != 0 {
                            return;
                        }
                        std::hint::spin_loop();
                    }
                }
            });
            // A failed check stops the producer too (the scope waits for it).
            let stop = StopOnUnwind(gave_up);
            let mut next = 0;
            let mut spins = 0u64;
            while next < N {
                let Some(r) = c.peek().unwrap() else {
                    std::hint::spin_loop();
                    spins += 1;
                    if spins == 100_000_000 {
                        panic!(
                            "stuck at {next}, head {}, word {:#x}",
                            c.head,
                            c.ring.load_header(c.head)
                        );
                    }
                    continue;
                };
                spins = 0;
                if r.flags == 0 {
                    // SAFETY: peek validated the record.
                    let b = unsafe { std::slice::from_raw_parts(r.ptr.as_ptr(), r.len) };
                    assert_eq!(r.len, 9 + (next as usize * 7) % 57);
                    assert_eq!(b[..8], next.to_le_bytes());
                    assert_eq!(b[r.len - 1], next as u8);
                    next += 1;
                }
                c.advance(r.size());
            }
            drop(stop);
        });
    }

    #[test]
    fn arming_sees_data_published_before_it() {
        let mut h = HeapRing::new(256);
        let (mut p, mut c) = h.ends();
        assert!(!c.arm().unwrap());
        // The consumer announced sleep: the commit must ask for a wake-up, once.
        let dst = p.try_reserve(1).unwrap().unwrap();
        // SAFETY: one byte reserved.
        unsafe { dst.as_ptr().write(9) };
        assert!(p.commit(1, 0));
        assert!(!p.commit_wakes_again());
        // Announcing with data present says "don't sleep" and withdraws the
        // announcement: the waker rings nothing for it.
        assert!(c.arm().unwrap());
        assert!(!p.commit_wakes_again());
        // An announcement withdrawn by hand (an event loop woken by another connection)
        // rings nothing either; the next one is woken.
        let r = c.peek().unwrap().unwrap();
        c.advance(r.size());
        assert!(!c.arm().unwrap());
        c.withdraw();
        assert!(!p.commit_wakes_again());
        assert!(!c.arm().unwrap());
        assert!(p.commit_wakes_again());
        assert!(!p.commit_wakes_again());
        assert!(!c.peer_closed());
        assert!(!p.close());
        assert!(c.peer_closed());
    }

    /// Shared wait tokens: two rings announce one token; the producers' group rings for
    /// it once, a new token (or a count) rings again, and a token that is not new on a
    /// ring becomes that ring's next count.
    #[test]
    fn a_shared_token_rings_once_per_group() {
        let (mut ha, mut hb) = (HeapRing::new(256), HeapRing::new(256));
        let (mut pa, mut ca) = (
            Producer::new(ha.ring(), FenceMode::Symmetric),
            Consumer::new(ha.ring(), FenceMode::Symmetric),
        );
        let (mut pb, mut cb) = (
            Producer::new(hb.ring(), FenceMode::Symmetric),
            Consumer::new(hb.ring(), FenceMode::Symmetric),
        );
        let group = WakeGroup::new();
        let token = 1000;
        assert!(!ca.arm_token(token).unwrap());
        assert!(!cb.arm_token(token).unwrap());
        assert!(push(&mut pa, b"a"));
        assert_eq!(pa.woken(), token | SHARED_TOKEN);
        assert!(group.claim(pa.woken()), "the first ring for the token");
        assert!(push(&mut pb, b"b"));
        assert_eq!(pb.woken(), token | SHARED_TOKEN);
        assert!(!group.claim(pb.woken()), "the waiter's other ring: skipped");
        // The waiter woke, took both records and sleeps again with a new token.
        for c in [&mut ca, &mut cb] {
            c.withdraw();
            let r = c.peek().unwrap().unwrap();
            c.advance(r.size());
        }
        assert!(!ca.arm_token(token + 1).unwrap());
        assert!(push(&mut pa, b"a"));
        assert!(group.claim(pa.woken()), "a new token rings");
        // The same token again is not new on the ring: it becomes the next count, which
        // no group skips.
        let r = ca.peek().unwrap().unwrap();
        ca.advance(r.size());
        assert!(!ca.arm_token(token + 1).unwrap());
        assert!(push(&mut pa, b"a"));
        assert_eq!(pa.woken(), token + 2, "a count, without the bit");
        assert!(group.claim(pa.woken()));
        // A count that follows a token stays without the bit and keeps growing.
        let r = ca.peek().unwrap().unwrap();
        ca.advance(r.size());
        assert!(!ca.arm().unwrap());
        assert!(push(&mut pa, b"a"));
        assert_eq!(pa.woken(), token + 3);
        assert!(
            group.claim(pa.woken()) && group.claim(pa.woken()),
            "counts always ring"
        );
    }

    thread_local! {
        /// Makes this thread's `membarrier` calls fail, as ENOMEM or a late seccomp filter
        /// would.
        pub(super) static MEMBARRIER_FAILS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A failed `membarrier` must not let a side sleep: the waker, which fenced only
    /// against the compiler, may not see the announcement, and the wake-up would be lost.
    #[test]
    #[cfg_attr(miri, ignore = "membarrier(2) is a system call miri does not emulate")]
    fn a_failed_membarrier_means_do_not_sleep() {
        let mut h = HeapRing::new(256);
        let (mut p, mut c) = (
            Producer::new(h.ring(), FenceMode::Asymmetric),
            Consumer::new(h.ring(), FenceMode::Asymmetric),
        );
        MEMBARRIER_FAILS.with(|f| f.set(true));
        assert!(
            c.arm().unwrap(),
            "empty ring: the consumer polls instead of sleeping"
        );
        while push(&mut p, b"1234567") {}
        assert!(
            p.arm(16).unwrap(),
            "full ring: the producer polls instead of sleeping"
        );
        MEMBARRIER_FAILS.with(|f| f.set(false));
        if shmlink_sys::membarrier_register() {
            // With the fence in place, an empty ring and a full one mean sleep.
            assert!(!p.arm(16).unwrap());
            while pop(&mut c).is_some() {}
            assert!(!c.arm().unwrap());
        }
    }

    impl Producer {
        fn commit_wakes_again(&mut self) -> bool {
            take_waiter(&self.ring.cons().waiting.0, &mut self.woken, self.mode)
        }
    }
}
