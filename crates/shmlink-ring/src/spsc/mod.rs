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
//!
//! # Files
//!
//! - `message.rs`: the record format (header word, flags, [`Record`]) and the one wire
//!   format of a split message: [`Fragment`] writes it, [`Reassembly`] checks it.
//! - `layout.rs`: the control blocks, their offsets, [`RingRef`].
//! - `notify.rs`: the wake-up protocol's announcements and fences, [`WakeGroup`].
//! - `producer.rs`, `consumer.rs`: the two ends.

#[cfg(doc)]
use crate::Violation;
mod consumer;
mod layout;
mod message;
mod notify;
mod producer;

#[cfg(all(test, loom))]
mod loom_model;
#[cfg(all(test, loom))]
mod loom_shared;
#[cfg(all(test, not(loom)))]
mod tests;

pub use consumer::Consumer;
pub use layout::{
    ConsumerCtl, ProducerCtl, RingRef, CLOSED_OFFSET, CONSUMER_WAITING_OFFSET, HEAD_OFFSET,
    PRODUCER_WAITING_OFFSET, TAIL_OFFSET,
};
pub use message::{
    first_total, header_word, record_size, split_size, Fragment, Piece, Reassembler, Reassembly,
    Record, ALIGN, FLAG_FIRST, FLAG_MORE, FLAG_SKIP, HEADER, RESTART_MIN, TOTAL_LEN,
};
pub use notify::{FenceMode, WakeGroup, SHARED_TOKEN, WITHDRAWN};
pub use producer::Producer;
