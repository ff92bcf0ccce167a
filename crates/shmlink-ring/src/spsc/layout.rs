//! Where a ring lives: the producer's and the consumer's control blocks (`#[repr(C)]`,
//! one cache line per field, all-zero is a fresh ring), their field offsets, and
//! [`RingRef`], the pointers to both blocks and the doubly mapped data area, with the
//! header-slot loads and stores and the prefetch hints both sides use.

use std::ptr::NonNull;

use super::message::ALIGN;
#[cfg(doc)]
use super::{Consumer, Producer};
use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::Line;

/// What the producer of a ring writes. It lives in memory the producer owns (its own
/// segment: the consumer maps it read-only) and an all-zero block is a fresh ring.
#[repr(C)]
pub struct ProducerCtl {
    /// Bytes ever published by the producer.
    pub(super) tail: Line<AtomicU64>,
    /// Set by the producer after its last record: graceful end of stream.
    pub(super) closed: Line<AtomicU32>,
    /// How many times the producer announced that it sleeps waiting for space.
    pub(super) waiting: Line<AtomicU64>,
}

/// What the consumer of a ring writes, in memory the consumer owns (the producer maps it
/// read-only); all-zero is a fresh ring.
#[repr(C)]
pub struct ConsumerCtl {
    /// Bytes ever consumed by the consumer.
    pub(super) head: Line<AtomicU64>,
    /// How many times the consumer announced that it sleeps waiting for data.
    pub(super) waiting: Line<AtomicU64>,
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

/// A cache line's size (x86-64 and most others).
pub(super) const LINE: u64 = 64;

/// How far ahead of its position each side prefetches: a few cache lines, about what the
/// other core produces or consumes during one cache-line transfer.
pub(super) const PREFETCH_AHEAD: usize = 512;

/// Asks for the cache line at `p` in a writable state (x86 `prefetchw`); a hint only.
#[inline(always)]
pub(super) fn prefetch_write(p: *const u8) {
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
pub(super) fn prefetch_read(p: *const u8) {
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    let _ = p;
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: prefetcht0 is a hint: it never faults or changes memory, whatever the address.
    unsafe {
        std::arch::asm!("prefetcht0 [{}]", in(reg) p, options(nostack, preserves_flags, readonly));
    }
}

/// Where a ring lives: its two control blocks and its (doubly mapped) data area.
#[derive(Clone, Copy)]
pub struct RingRef {
    prod: NonNull<ProducerCtl>,
    cons: NonNull<ConsumerCtl>,
    data: NonNull<u8>,
    pub(super) cap: usize,
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
    pub(super) fn prod(&self) -> &ProducerCtl {
        // SAFETY: valid for the RingRef's life (contract of `new`); only atomics inside.
        unsafe { self.prod.as_ref() }
    }

    /// The consumer's block; the producer only loads from it.
    #[inline]
    pub(super) fn cons(&self) -> &ConsumerCtl {
        // SAFETY: valid for the RingRef's life (contract of `new`); only atomics inside.
        unsafe { self.cons.as_ref() }
    }

    /// Data area at position `pos` (wrapped into the first copy).
    #[inline]
    pub(super) fn at(&self, pos: u64) -> NonNull<u8> {
        // SAFETY: the offset is below `cap`, inside the data area (contract of `new`).
        unsafe { self.data.add(pos as usize & (self.cap - 1)) }
    }

    /// Stores header slot word `word` at position `pos` (Release: what the producer wrote
    /// before is visible to a consumer that loads the word with Acquire).
    #[inline(always)]
    pub(super) fn store_header(&self, pos: u64, word: u64, order: Ordering) {
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
    pub(super) fn load_header(&self, pos: u64) -> u64 {
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

    /// The ring's size in bytes.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The largest record (header included) a producer writes in one piece: half the ring,
    /// so that the producer can fill one half while the consumer drains the other.
    #[inline]
    pub fn max_record(&self) -> usize {
        self.cap / 2
    }
}
