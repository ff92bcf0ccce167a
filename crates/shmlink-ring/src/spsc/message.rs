//! The record format: an 8-byte header word (length, flags, position stamp) before each
//! payload; and the one wire format of a message split over several records, written by
//! [`Fragment`] and read back by [`Reassembly`] (every transport over these rings uses
//! both, so the format and its checks of a hostile peer's fragments live here only).
//!
//! A message that does not fit one record (or that a sender chooses to split) becomes
//! fragments: the first has [`FLAG_FIRST`] | [`FLAG_MORE`] and its payload starts with the
//! message's total length (`u64`, little endian, [`TOTAL_LEN`] bytes), middle fragments
//! have [`FLAG_MORE`], the last has no flag. A whole message is one record with no flag.

use std::ptr::NonNull;

#[cfg(doc)]
use super::{Consumer, Producer};
use crate::error::{Result, Violation};

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
/// Records of at least this size (and a sixteenth of the ring) restart at the ring's start
/// when the ring is empty. On a ring of at least twice this size, any record also
/// restarts an empty ring once the tail is half a ring into its lap and the skip would
/// leave room for the largest record behind this one (`Producer::try_reserve`).
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
    /// [`Consumer::advance`]`(size())`, its payload is padding.
    pub fn is_skip(&self) -> bool {
        self.flags == FLAG_SKIP
    }

    /// Bytes the record occupies in the ring.
    pub fn size(&self) -> usize {
        record_size(self.len)
    }
}

/// Bytes of the total-length prefix at the start of a first fragment.
pub const TOTAL_LEN: usize = 8;

/// One fragment of a message being split: what the sender writes into the next record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragment {
    /// Message bytes the fragment carries (after the total-length prefix, if any).
    pub chunk: usize,
    /// The record's flags.
    pub flags: u32,
}

impl Fragment {
    /// The next fragment of a message of which `left` bytes are still to be sent, in
    /// records of at most `max` payload bytes (`max > TOTAL_LEN`). `first` for the
    /// message's first fragment, which starts with the total length and must leave bytes
    /// for a later one (`left > max - TOTAL_LEN`: a message that fits one fragment is
    /// sent whole).
    #[inline]
    pub fn next(first: bool, left: usize, max: usize) -> Fragment {
        debug_assert!(max > TOTAL_LEN);
        if first {
            debug_assert!(
                left > max - TOTAL_LEN,
                "a message that fits one record is sent whole"
            );
            return Fragment {
                chunk: max - TOTAL_LEN,
                flags: FLAG_FIRST | FLAG_MORE,
            };
        }
        let chunk = left.min(max);
        Fragment {
            chunk,
            flags: if chunk < left { FLAG_MORE } else { 0 },
        }
    }

    /// Whether this is a message's first fragment (its payload starts with the total).
    #[inline]
    pub fn is_first(&self) -> bool {
        self.flags & FLAG_FIRST != 0
    }

    /// The record's payload length: the prefix (first fragment only) and the chunk.
    #[inline]
    pub fn len(&self) -> usize {
        self.chunk + if self.is_first() { TOTAL_LEN } else { 0 }
    }

    /// Whether the fragment carries no byte at all (never: a fragment has a flag or bytes).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the fragment's payload at `dst`: the total length `total` (first fragment
    /// only), then `body`, the `chunk` message bytes it carries.
    ///
    /// # Safety
    /// `dst` has room for [`len`](Fragment::len) bytes (the payload of a record reserved
    /// with [`Producer::try_reserve`] for that length) that
    /// no one else writes or reads while this runs, and does not overlap `body`.
    #[inline]
    pub unsafe fn write(&self, dst: NonNull<u8>, total: usize, body: &[u8]) {
        debug_assert_eq!(body.len(), self.chunk);
        let mut at = dst.as_ptr();
        if self.is_first() {
            // SAFETY: the caller reserved `len()` = TOTAL_LEN + chunk bytes at `dst`.
            unsafe {
                at.copy_from_nonoverlapping((total as u64).to_le_bytes().as_ptr(), TOTAL_LEN);
                at = at.add(TOTAL_LEN);
            }
        }
        // SAFETY: the rest of the reserved bytes hold `body` (`chunk` bytes); the caller
        // guarantees they do not overlap it. `copy_shared` rather than `memcpy`: its
        // `rep movsb` is twenty times slower at some distances between the two, which
        // `copy_shared` avoids (a fragment is large: the check costs nothing).
        unsafe { shmlink_sys::copy_shared(at, body.as_ptr(), body.len()) };
    }

    /// [`write`](Fragment::write) for a data area other processes may write at the same
    /// time (a region several guests map writable): the bytes go out with
    /// [`shmlink_sys::copy_shared`], whose copy is opaque to the compiler, so a peer's
    /// racing store is no data race in our program (it only garbles what it receives).
    ///
    /// # Safety
    /// `dst` has room for [`len`](Fragment::len) bytes reserved as for `write`, and does
    /// not overlap `body`; others may write them.
    #[inline]
    pub unsafe fn write_shared(&self, dst: NonNull<u8>, total: usize, body: &[u8]) {
        debug_assert_eq!(body.len(), self.chunk);
        let mut at = dst.as_ptr();
        if self.is_first() {
            // SAFETY: the caller reserved `len()` = TOTAL_LEN + chunk bytes at `dst`.
            unsafe {
                shmlink_sys::copy_shared(at, (total as u64).to_le_bytes().as_ptr(), TOTAL_LEN);
                at = at.add(TOTAL_LEN);
            }
        }
        // SAFETY: as above, for the `chunk` bytes after the prefix.
        unsafe { shmlink_sys::copy_shared(at, body.as_ptr(), body.len()) };
    }
}

/// Ring bytes (headers and padding included) of a `len`-byte message split by
/// [`Fragment::next`] into records of at most `max` payload bytes.
pub fn split_size(len: usize, max: usize) -> usize {
    let payload = len + TOTAL_LEN;
    let last = payload % max;
    payload / max * record_size(max) + if last > 0 { record_size(last) } else { 0 }
}

/// The total length a first fragment announces, if `rec` is one ([`FLAG_FIRST`] |
/// [`FLAG_MORE`] with room for the prefix); read once, for a receiver that decides where
/// to put the message before it takes the fragment. Not validated: [`Reassembly::accept`]
/// checks it.
///
/// # Safety
/// `rec` was returned by [`Consumer::peek`] of a ring that is
/// still mapped, and not consumed since.
#[inline]
pub unsafe fn first_total(rec: &Record) -> Option<u64> {
    if rec.flags != FLAG_FIRST | FLAG_MORE || rec.len < TOTAL_LEN {
        return None;
    }
    let mut total = [0u8; TOTAL_LEN];
    // SAFETY: `peek` validated the payload (at least TOTAL_LEN bytes) inside the mapping
    // (the caller's contract); `total` is a distinct local buffer. The peer may be writing
    // the bytes: `copy_shared` reads them without a data race.
    unsafe { shmlink_sys::copy_shared(total.as_mut_ptr(), rec.ptr.as_ptr(), TOTAL_LEN) };
    Some(u64::from_le_bytes(total))
}

/// Where one validated fragment's message bytes are and where they go.
#[derive(Clone, Copy, Debug)]
pub struct Piece {
    /// The bytes in the ring (past the total-length prefix of a first fragment).
    pub src: NonNull<u8>,
    /// How many.
    pub len: usize,
    /// Their offset in the message: `at + len <= total`.
    pub at: usize,
    /// The message's total length.
    pub total: usize,
    /// Whether this fragment completes the message (`at + len == total`).
    pub last: bool,
}

/// The receiving side of the split format: checks a sequence of fragment records as a
/// hostile peer may have written it, and says where each one's bytes belong. Refused, as
/// a [`Violation`]: a fragment flag outside a split message or a first fragment inside one
/// (a new message in the middle of another), a first fragment without its length, a total
/// above the receiver's maximum or not above the first fragment's bytes (a message that
/// fits one record is never split), fragments that reach the total before the last or
/// fall short of it at the last. The total is read once (into the state); only it, and
/// the lengths and flags the ring validated, decide anything.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reassembly {
    /// The message's total length while one is in progress.
    total: Option<usize>,
    /// Its bytes received so far.
    have: usize,
}

impl Reassembly {
    /// No message in progress.
    pub const fn new() -> Reassembly {
        Reassembly {
            total: None,
            have: 0,
        }
    }

    /// Whether a split message is in progress (its first fragment taken, not its last).
    #[inline(always)]
    pub fn in_progress(&self) -> bool {
        self.total.is_some()
    }

    /// Validates `rec`, a record that is no skip ([`Record::is_skip`]) and no whole
    /// message (`rec.flags != 0` or [`in_progress`](Reassembly::in_progress)), as the
    /// next fragment of a message of at most `max` bytes, and moves on past it: the
    /// caller copies the [`Piece`] out, then consumes the record. After an error the
    /// state is unchanged; the connection is broken anyway.
    ///
    /// # Safety
    /// As for [`first_total`]: `rec` came from [`Consumer::peek`]
    /// of a ring that is still mapped, and was not consumed since.
    pub unsafe fn accept(&mut self, rec: &Record, max: usize) -> Result<Piece> {
        match (self.total, rec.flags) {
            (None, f) if f == FLAG_FIRST | FLAG_MORE => {
                // SAFETY: forwarded to the caller.
                let Some(total) = (unsafe { first_total(rec) }) else {
                    return Err(Violation::new(format!(
                        "first fragment of {} bytes has no length",
                        rec.len
                    )));
                };
                let len = rec.len - TOTAL_LEN;
                if total > max as u64 || total <= len as u64 {
                    return Err(Violation::new(format!(
                        "split message claims {total} bytes (first fragment {len}, maximum {max})"
                    )));
                }
                let total = total as usize;
                self.total = Some(total);
                self.have = len;
                Ok(Piece {
                    // SAFETY: TOTAL_LEN <= rec.len: still inside the validated payload.
                    src: unsafe { rec.ptr.add(TOTAL_LEN) },
                    len,
                    at: 0,
                    total,
                    last: false,
                })
            }
            (Some(total), f) if f == FLAG_MORE || f == 0 => {
                let last = f == 0;
                let have = self.have + rec.len;
                // A middle fragment must leave bytes for the last; the last must end the
                // message exactly.
                if (!last && have >= total) || (last && have != total) {
                    return Err(Violation::new(format!(
                        "fragments add up to {have} bytes of a {total}-byte message{}",
                        if last { "" } else { " before its last" }
                    )));
                }
                let at = self.have;
                if last {
                    *self = Reassembly::new();
                } else {
                    self.have = have;
                }
                Ok(Piece {
                    src: rec.ptr,
                    len: rec.len,
                    at,
                    total,
                    last,
                })
            }
            (state, f) => Err(Violation::new(format!(
                "fragment flags {f:#x} unexpected ({} a split message)",
                if state.is_some() { "inside" } else { "outside" }
            ))),
        }
    }
}

/// A split message reassembled into a buffer of its own: [`Reassembly`]'s checks, and
/// each fragment's bytes copied out of the ring once, straight into place (with
/// [`shmlink_sys::copy_shared`]: the peer may be writing them).
#[derive(Debug, Default)]
pub struct Reassembler {
    state: Reassembly,
    buf: Vec<u8>,
}

impl Reassembler {
    /// Nothing received yet.
    pub const fn new() -> Reassembler {
        Reassembler {
            state: Reassembly::new(),
            buf: Vec::new(),
        }
    }

    /// Whether a split message is in progress.
    #[inline(always)]
    pub fn in_progress(&self) -> bool {
        self.state.in_progress()
    }

    /// Takes fragment `rec` (see [`Reassembly::accept`]) of a message of at most `max`
    /// bytes: `Ok(Some(total))` once the message is complete ([`message`]).
    ///
    /// # Safety
    /// As for [`Reassembly::accept`].
    ///
    /// [`message`]: Reassembler::message
    pub unsafe fn take(&mut self, rec: &Record, max: usize) -> Result<Option<usize>> {
        // SAFETY: forwarded to the caller.
        let piece = unsafe { self.state.accept(rec, max) }?;
        if piece.at == 0 {
            self.buf.clear();
            self.buf.reserve(piece.total);
        }
        debug_assert_eq!(self.buf.len(), piece.at);
        // The total was checked against `max` and reserved at the first fragment; this
        // only grows the buffer if that reservation was smaller.
        self.buf.reserve(piece.len);
        // SAFETY: `src..src + len` lies in the validated payload (the caller's contract);
        // the vector has room for `len` more bytes, which `copy_shared` initialises
        // before `set_len`, and does not overlap the ring.
        unsafe {
            shmlink_sys::copy_shared(
                self.buf.as_mut_ptr().add(piece.at),
                piece.src.as_ptr(),
                piece.len,
            );
            self.buf.set_len(piece.at + piece.len);
        }
        Ok(piece.last.then_some(piece.total))
    }

    /// The message reassembled last (empty after [`clear`](Reassembler::clear)).
    #[inline]
    pub fn message(&self) -> &[u8] {
        &self.buf
    }

    /// Hands the reassembled message over (the buffer starts anew).
    pub fn take_message(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    /// Forgets the reassembled message (keeping the buffer's memory).
    #[inline]
    pub fn clear(&mut self) {
        self.buf.clear();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Splits `msg` into fragment records of at most `max` payload bytes, as a sender
    /// does: (flags, payload) each.
    fn split(msg: &[u8], max: usize) -> Vec<(u32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < msg.len() {
            let f = Fragment::next(pos == 0, msg.len() - pos, max);
            let mut payload = vec![0u8; f.len()];
            // SAFETY: `payload` has `f.len()` bytes of its own.
            unsafe {
                f.write(
                    NonNull::new(payload.as_mut_ptr()).unwrap(),
                    msg.len(),
                    &msg[pos..pos + f.chunk],
                )
            };
            out.push((f.flags, payload));
            pos += f.chunk;
        }
        out
    }

    fn rec(r: &mut (u32, Vec<u8>)) -> Record {
        Record {
            ptr: NonNull::new(r.1.as_mut_ptr()).unwrap(),
            len: r.1.len(),
            flags: r.0,
        }
    }

    /// Feeds `records` to a reassembler: the message, or the first violation.
    fn reassemble(records: &mut [(u32, Vec<u8>)], max: usize) -> Result<Option<Vec<u8>>> {
        let mut r = Reassembler::new();
        for x in records.iter_mut() {
            // SAFETY: the record's payload is the vector it points into, alive here.
            if unsafe { r.take(&rec(x), max) }?.is_some() {
                return Ok(Some(r.take_message()));
            }
        }
        Ok(None)
    }

    #[test]
    fn split_then_reassemble_gives_the_message_back() {
        for (len, max) in [(9, 8 + 1), (100, 16), (1000, 64), (1001, 64), (4096, 1000)] {
            let msg: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let mut recs = split(&msg, max);
            assert_eq!(recs[0].0, FLAG_FIRST | FLAG_MORE);
            assert_eq!(recs.last().unwrap().0, 0);
            assert!(recs[1..recs.len() - 1].iter().all(|r| r.0 == FLAG_MORE));
            assert!(recs.iter().all(|r| r.1.len() <= max && !r.1.is_empty()));
            let ring: usize = recs.iter().map(|r| record_size(r.1.len())).sum();
            assert_eq!(ring, split_size(len, max), "{len} in {max}");
            assert_eq!(reassemble(&mut recs, len).unwrap(), Some(msg));
        }
    }

    fn first(total: u64, body: usize) -> (u32, Vec<u8>) {
        let mut p = total.to_le_bytes().to_vec();
        p.resize(TOTAL_LEN + body, 1);
        (FLAG_FIRST | FLAG_MORE, p)
    }

    fn violation(mut recs: Vec<(u32, Vec<u8>)>, max: usize) -> String {
        match reassemble(&mut recs, max) {
            Err(e) => e.to_string(),
            Ok(m) => panic!("accepted: {m:?}"),
        }
    }

    #[test]
    fn hostile_fragment_sequences_are_violations() {
        let max = 1000;
        // A total above the maximum, or not above the first fragment's bytes.
        assert!(violation(vec![first(u64::MAX, 10)], max).contains("claims"));
        assert!(violation(vec![first(max as u64 + 1, 10)], max).contains("claims"));
        assert!(violation(vec![first(10, 10)], max).contains("claims"));
        // A first fragment too short to hold the length.
        assert!(violation(vec![(FLAG_FIRST | FLAG_MORE, vec![0; 4])], max).contains("no length"));
        // Fragments beyond the total, a middle one reaching it, a last one short of it.
        let more = |n| (FLAG_MORE, vec![2u8; n]);
        let last = |n| (0, vec![3u8; n]);
        assert!(violation(vec![first(30, 10), more(30)], max).contains("add up"));
        assert!(violation(vec![first(30, 10), more(20), last(0)], max).contains("add up"));
        assert!(violation(vec![first(30, 10), last(10)], max).contains("add up"));
        assert!(violation(vec![first(30, 10), last(30)], max).contains("add up"));
        // A new message in the middle of one; fragments without a first.
        assert!(violation(vec![first(30, 10), first(30, 10)], max).contains("inside"));
        assert!(violation(vec![more(10)], max).contains("outside"));
        // The right sequence is accepted.
        let mut ok = vec![first(30, 10), more(10), last(10)];
        let mut want = vec![1u8; 10];
        want.extend([2u8; 10]);
        want.extend([3u8; 10]);
        assert_eq!(reassemble(&mut ok, max).unwrap(), Some(want));
    }

    #[test]
    fn a_violation_leaves_the_state_as_it_was() {
        let mut s = Reassembly::new();
        let mut f = first(30, 10);
        // SAFETY: the payload is the vector it points into.
        unsafe { s.accept(&rec(&mut f), 100) }.unwrap();
        let mut bad = (FLAG_MORE, vec![0u8; 40]);
        // SAFETY: as above.
        assert!(unsafe { s.accept(&rec(&mut bad), 100) }.is_err());
        assert!(s.in_progress());
        let mut end = (0, vec![0u8; 20]);
        // SAFETY: as above.
        let p = unsafe { s.accept(&rec(&mut end), 100) }.unwrap();
        assert!(p.last && p.at == 10 && p.total == 30);
        assert!(!s.in_progress());
    }
}
