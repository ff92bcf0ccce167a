//! Lock-free rings in memory shared between processes that do not trust each other: the
//! ring layer of shmlink, usable on its own.
//!
//! - [`spsc`]: a single-producer single-consumer ring of variable-length records in a
//!   doubly-mapped data area, with a no-lost-wake-up sleep protocol (symmetric fences, or
//!   an asymmetric fence whose heavy half is `membarrier`).
//! - [`broadcast`]: one publisher writes each message once into a slot (a seqlock); any
//!   number of subscribers read it in place with their own cursors; lossless or lossy.
//! - [`pipe`]: the in-process pipe, a ring of message buffers between two threads of one
//!   process, with the same announce-then-look-again wake-up bits.
//! - [`slot`]: the handshake state machines of a region shared without a socket (`vm:`'s
//!   connection slots, listener entries and once-written values), one atomic word each.
//!
//! The rings are pure algorithms on raw memory: the caller maps the memory (a sealed memfd
//! for another process, or any allocation within one) and moves doorbells (a socket
//! byte, an eventfd). Everything the other side may write is read once, validated, and a
//! value no correct peer writes becomes a [`Violation`] rather than a wild access.
//!
//! The atomics come from [`sync`], which loom replaces: the loom models of all four run
//! with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p shmlink-ring
//! --release loom`.
//!
//! # Example
//!
//! An SPSC ring between two threads of one process. The data area is mapped twice back
//! to back ([`shmlink_sys::memfd::Mapping`]), so that every record is contiguous; the two
//! control blocks sit in the header page, zeroed (a fresh ring). A real peer would sleep
//! on a doorbell when [`Consumer::arm`](spsc::Consumer::arm) says so; this one spins.
//!
//! ```
//! use std::os::fd::AsFd;
//! use shmlink_ring::spsc::{Consumer, ConsumerCtl, FenceMode, Producer, ProducerCtl, RingRef};
//! use shmlink_sys::memfd::{self, Mapping};
//!
//! let page = shmlink_sys::page_size();
//! let cap = 4 * page;
//! let fd = memfd::create_unsealed("example-ring", Mapping::file_size(page, &[cap]))?;
//! let map = Mapping::map(fd.as_fd(), page, &[cap], true)?;
//! let (data, cap) = map.ring(0);
//! let prod = map.header().cast::<ProducerCtl>();
//! // SAFETY: the consumer's block follows the producer's inside the header page, at a
//! // multiple of its 128-byte alignment.
//! let cons = unsafe { map.header().add(std::mem::size_of::<ProducerCtl>()) }.cast::<ConsumerCtl>();
//! // SAFETY: zeroed control blocks, 128-aligned, and `2 * cap` doubly-mapped bytes, all
//! // writable, valid while `map` lives: longer than the scoped threads below.
//! let ring = unsafe { RingRef::new(prod, cons, data, cap) };
//!
//! std::thread::scope(|s| {
//!     s.spawn(move || {
//!         let mut tx = Producer::new(ring, FenceMode::Symmetric);
//!         for i in 0..1000u32 {
//!             let msg = i.to_le_bytes();
//!             let dst = loop {
//!                 match tx.try_reserve(msg.len()).unwrap() {
//!                     Some(dst) => break dst,
//!                     None => std::thread::yield_now(), // full
//!                 }
//!             };
//!             // SAFETY: `try_reserve` returned room for `msg.len()` bytes.
//!             unsafe { dst.as_ptr().copy_from_nonoverlapping(msg.as_ptr(), msg.len()) };
//!             tx.commit(msg.len(), 0); // `true` would mean: ring the consumer's doorbell
//!         }
//!     });
//!     let mut rx = Consumer::new(ring, FenceMode::Symmetric);
//!     for i in 0..1000u32 {
//!         let rec = loop {
//!             match rx.peek().unwrap() {
//!                 Some(rec) => break rec,
//!                 None => std::thread::yield_now(), // empty
//!             }
//!         };
//!         let mut msg = [0u8; 4];
//!         assert_eq!(rec.len, msg.len());
//!         // SAFETY: `peek` validated a record of `rec.len` bytes inside the mapping; the
//!         // producer does not reuse it before `advance`.
//!         unsafe { msg.as_mut_ptr().copy_from_nonoverlapping(rec.ptr.as_ptr(), rec.len) };
//!         assert_eq!(u32::from_le_bytes(msg), i);
//!         rx.advance(rec.size());
//!     }
//! });
//! # Ok::<(), std::io::Error>(())
//! ```

#![warn(missing_docs)]

pub mod broadcast;
mod error;
#[cfg(all(test, loom))]
mod loom_doorbell;
pub mod pipe;
pub mod slot;
pub mod spsc;
pub mod sync;

pub use error::{Result, Violation};

/// One cache line (two on CPUs with adjacent-line prefetch), so that fields written by
/// different sides never share a line.
#[repr(C, align(128))]
pub struct Line<T>(pub T);
