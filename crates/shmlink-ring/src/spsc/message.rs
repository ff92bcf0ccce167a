//! The record format: an 8-byte header word (length, flags, position stamp) before each
//! payload, and the fragment flags of a message split over several records.

use std::ptr::NonNull;

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
pub(super) const KNOWN_FLAGS: u32 = FLAG_MORE | FLAG_FIRST;
/// Bit 63 of a header word: a published header (a zeroed slot is never one).
const STAMP_VALID: u64 = 1 << 63;
/// Bits 34..63 of a header word: the record's position / 8, modulo 2^29.
const STAMP_SHIFT: u32 = 34;
const STAMP_MASK: u64 = ((1 << 29) - 1) << STAMP_SHIFT;
/// Bits 32..34 of a header word: the flags.
pub(super) const FLAGS_MASK: u64 = 0b11 << 32;

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
pub(super) fn stamped(word: u64, pos: u64) -> bool {
    word & (STAMP_MASK | STAMP_VALID) == header_word(pos, 0, 0)
}

/// Bytes a record with `len` payload bytes occupies.
pub const fn record_size(len: usize) -> usize {
    (HEADER + len + ALIGN - 1) & !(ALIGN - 1)
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
    /// [`Consumer::advance`](super::Consumer::advance)`(size())`, its payload is padding.
    pub fn is_skip(&self) -> bool {
        self.flags == FLAG_SKIP
    }

    /// Bytes the record occupies in the ring.
    pub fn size(&self) -> usize {
        record_size(self.len)
    }
}
