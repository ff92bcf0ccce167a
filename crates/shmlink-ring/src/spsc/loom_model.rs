//! Loom model of the ring and its wake-up protocol (docs/design.md §4).
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p shmlink-ring
//! --release loom` (`.ci/run` does).
//!
//! A producer and a consumer thread move records through a ring small enough to fill and
//! wrap. As in the `shm:` transport, each side writes only its own control block (the
//! producer's [`ProducerCtl`] and the data area, the consumer's [`ConsumerCtl`]) and
//! only loads from the other's: the two blocks are separate allocations here, separate
//! segments there, and a waker never clears a sleeper's announcement but remembers the
//! last one it woke. Each side that finds nothing to do parks the way the `shm:` transport does:
//! drain its doorbell (remember the count), announce (`arm`), re-check, and only then wait
//! for the count to change. A lost wake-up leaves a side waiting forever, which loom
//! reports as a deadlock; a torn or reordered record fails the payload check, and a
//! record written over bytes the consumer has not finished with is a loom causality
//! error (see [`Shared`]). Under loom the consumer finds records through the producer's
//! `tail` (the data area is plain memory the model registers by hand, so an atomic
//! header word cannot be modelled); the header protocol that a normal build polls first is
//! checked by the ring's threaded tests, and the clearing of the next header slot it
//! rests on (a read, and a zero where the word could be taken for a header) is
//! registered here as a write, the stronger access. The wake-up protocol is the same in
//! both: `arm` re-checks the `tail`. The models check [`FenceMode::Symmetric`]; the asymmetric mode
//! replaces the waker's fence with a compiler barrier and adds `membarrier` to the
//! sleeper's, which loom cannot express: the argument for it is written next to
//! `announce` in the ring module.

use std::ptr::NonNull;

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

use super::consumer::*;
use super::layout::*;
use super::message::*;
use super::notify::*;
use super::producer::*;
use crate::loom_doorbell::{Doorbell, PLACES};

/// Ring memory shared by the two threads: the producer's block and data area, the
/// consumer's block.
///
/// The data area is modelled twice over. `data` is the memory the ring itself reads and
/// writes (record headers, `2 * CAP` bytes as `RingRef` requires); headers always start
/// in its first copy. `words` is the memory as the two sides of the double mapping share
/// it: one loom cell per 8 bytes of the ring, indexed by offset modulo `CAP`, so a
/// payload word written past the end of the first copy lands on the cell of the ring's
/// start, as it does through the real mirror. Payloads live only in `words`; every header
/// write and read is registered on its cell too, so loom reports any access to a word
/// that the other side may still be using (a record that wraps onto unread data).
struct Shared {
    prod: Box<ProducerCtl>,
    cons: Box<ConsumerCtl>,
    data: Box<[std::cell::UnsafeCell<u64>]>,
    words: Box<[UnsafeCell<u64>]>,
    to_consumer: Doorbell,
    to_producer: Doorbell,
}

// SAFETY: the data words are written by the producer and read by the consumer only in the
// order the ring's atomics establish (that ordering is what this model checks).
unsafe impl Sync for Shared {}
// SAFETY: as above; nothing in Shared is tied to a thread.
unsafe impl Send for Shared {}

const CAP: usize = 64;

impl Shared {
    /// A fresh ring; `armed`: the consumer starts announced, as a connection's does;
    /// `places`: the doorbells know where their sleepers sleep.
    fn new(armed: bool, places: bool) -> Arc<Shared> {
        let bell = || {
            if places {
                Doorbell::with_places()
            } else {
                Doorbell::default()
            }
        };
        let cons = Box::new(ConsumerCtl::new());
        if armed {
            cons.start_armed();
        }
        Arc::new(Shared {
            prod: Box::new(ProducerCtl::new()),
            cons,
            data: (0..2 * CAP / 8).map(|_| 0.into()).collect(),
            words: (0..CAP / 8).map(|_| UnsafeCell::new(0)).collect(),
            to_consumer: bell(),
            to_producer: bell(),
        })
    }
    fn ring(&self) -> RingRef {
        // SAFETY: the blocks and `data` live as long as the Arc the threads hold; the ring
        // writes only headers into `data`, and headers start below CAP.
        unsafe {
            RingRef::new(
                NonNull::from(&*self.prod),
                NonNull::from(&*self.cons),
                NonNull::new(self.data.as_ptr() as *mut u8).unwrap(),
                CAP,
            )
        }
    }
    /// The shared word at `p`, a pointer the ring handed out (header or payload, in
    /// either copy), and its offset from the start of the first copy.
    fn word(&self, p: NonNull<u8>) -> (&UnsafeCell<u64>, usize) {
        let off = p.as_ptr() as usize - self.data.as_ptr() as usize;
        assert!(
            off % 8 == 0 && off < 2 * CAP,
            "record outside the double mapping"
        );
        (&self.words[off % CAP / 8], off)
    }
}

/// One run: `records` records of `len` payload bytes (a multiple of 8).
#[derive(Clone, Copy)]
struct Cfg {
    records: u64,
    len: usize,
    /// The consumer starts announced, as a connection's does.
    armed: bool,
    /// Records whose payload runs past the end of the first copy.
    straddling: u64,
    mode: FenceMode,
    /// Both sides withdraw their announcement whenever they wake, as an event loop does
    /// that woke for another connection (`arm` withdraws it when its re-check finds work).
    withdraw: bool,
    /// The producer writes records and publishes them this many at a time
    /// ([`Producer::write`], [`Producer::publish`]; 1: [`Producer::commit`] each), and
    /// before it waits for room.
    batch: u64,
    /// The consumer's [`Consumer::set_lazy_head`] (0: [`Consumer::advance`] each); it
    /// flushes before it waits.
    lazy: usize,
    /// Each side sleeps in a different place each time (the control socket, then its
    /// doorbell pipe, as a connection used now by an event loop, now by blocking calls
    /// does), storing the place before it announces; the waker rings where it reads
    /// the sleeper sleeps (design §4.4). Otherwise one place.
    places: bool,
}

/// The payload word `k` of record `i`.
fn value(i: u64, k: usize) -> u64 {
    100 + 16 * i + k as u64
}

fn run(cfg: Cfg) {
    let Cfg {
        records,
        len,
        armed,
        straddling,
        mode,
        withdraw,
        batch,
        lazy,
        places,
    } = cfg;
    // The place of a side's `n`th sleep.
    let place_of = move |n: usize| if places { n % PLACES } else { 0 };
    loom::model(move || {
        let shared = Shared::new(armed, places);
        let s = shared.clone();
        let producer = thread::spawn(move || {
            let mut p = Producer::new(s.ring(), mode);
            let mut sleeps = 0;
            for i in 0..records {
                loop {
                    if let Some(dst) = p.try_reserve(len).unwrap() {
                        for k in 0..len / 8 {
                            // SAFETY: `len` bytes reserved at `dst`, 8-aligned.
                            let (cell, _) = s.word(unsafe { dst.add(8 * k) });
                            // SAFETY: loom checks that no read of this word by the
                            // consumer can be concurrent with this write.
                            cell.with_mut(|w| unsafe { *w = value(i, k) });
                        }
                        // The header `commit` writes, registered with loom first.
                        // SAFETY: the header sits just before the payload, in the mapping.
                        let (cell, _) = s.word(unsafe { dst.sub(HEADER) });
                        cell.with_mut(|_| ());
                        // And the next record's header slot, which `commit` clears: loom
                        // checks it is free space, not bytes the consumer still reads.
                        // SAFETY: at most half a ring past a header below CAP: mapped.
                        let (cell, _) = s.word(unsafe { dst.add(record_size(len) - HEADER) });
                        cell.with_mut(|_| ());
                        if batch == 1 {
                            if p.commit(len, 0) {
                                s.to_consumer.ring();
                            }
                        } else {
                            p.write(len, 0);
                            if ((i + 1) % batch == 0 || i + 1 == records) && p.publish() {
                                s.to_consumer.ring();
                            }
                        }
                        break;
                    }
                    // Written records go out before waiting (a sleeping consumer would
                    // not know of them).
                    if p.publish() {
                        s.to_consumer.ring();
                    }
                    let place = place_of(sleeps);
                    sleeps += 1;
                    let seen = s.to_producer.seen_at(place);
                    s.to_producer.set_place(place);
                    if !p.arm(record_size(len)).unwrap() {
                        s.to_producer.wait_past_at(place, seen);
                        if withdraw {
                            p.withdraw();
                        }
                    }
                }
            }
            if p.close() {
                s.to_consumer.ring();
            }
        });
        let mut c = Consumer::new(shared.ring(), mode);
        c.set_lazy_head(lazy);
        let (mut next, mut straddled, mut sleeps) = (0, 0, 0);
        loop {
            if let Some(rec) = c.peek().unwrap() {
                assert_eq!(rec.len, len);
                // The header `peek` read, registered with loom.
                // SAFETY: the header sits just before the payload, in the mapping.
                let (cell, _) = shared.word(unsafe { rec.ptr.sub(HEADER) });
                cell.with(|_| ());
                for k in 0..len / 8 {
                    // SAFETY: peek validated the record; word k of its payload is inside.
                    let (cell, off) = shared.word(unsafe { rec.ptr.add(8 * k) });
                    straddled += u64::from(k == 0 && off + len > CAP);
                    // SAFETY: loom checks this read against the producer's writes.
                    let v = cell.with(|w| unsafe { *w });
                    assert_eq!(v, value(next, k), "record lost, torn or out of order");
                }
                next += 1;
                let wake = if lazy == 0 {
                    c.advance(rec.size())
                } else {
                    c.consume(rec.size())
                };
                if wake {
                    shared.to_producer.ring();
                }
                continue;
            }
            // Held-back consumption goes out before waiting (the producer may wait for it).
            if c.flush() {
                shared.to_producer.ring();
            }
            if c.peer_closed() && !c.has_data().unwrap() {
                break;
            }
            let place = place_of(sleeps);
            sleeps += 1;
            let seen = shared.to_consumer.seen_at(place);
            shared.to_consumer.set_place(place);
            if !c.arm().unwrap() && !c.peer_closed() {
                shared.to_consumer.wait_past_at(place, seen);
                if withdraw {
                    c.withdraw();
                }
            }
        }
        assert_eq!(next, records);
        assert_eq!(straddled, straddling, "records across the end of the ring");
        producer.join().unwrap();
    });
}

/// Records of 8 bytes take 16 and divide the capacity: none crosses the end.
const SMALL: Cfg = Cfg {
    records: 3,
    len: 8,
    armed: false,
    straddling: 0,
    mode: FenceMode::Symmetric,
    withdraw: false,
    batch: 1,
    lazy: 0,
    places: false,
};

#[test]
fn loom_records_and_wakeups_within_one_lap() {
    run(SMALL);
}

#[test]
fn loom_armed_start_as_a_connection_begins() {
    // The consumer announced before the producer's first record (`start_armed`).
    run(Cfg {
        armed: true,
        ..SMALL
    });
}

#[test]
fn loom_withdrawn_announcements_lose_no_wakeup() {
    // Every wake-up withdraws the announcement it woke for (a full ring, so the producer
    // sleeps and withdraws too): the next sleep announces anew and is still woken.
    run(Cfg {
        records: 5,
        armed: true,
        withdraw: true,
        ..SMALL
    });
}

#[test]
fn loom_full_ring_wraps_and_wakes_the_producer() {
    // 3 records fill the ring (the next header slot stays free); the 4th to 6th need the
    // producer to wait and wrap.
    run(Cfg {
        records: 6,
        ..SMALL
    });
}

#[test]
fn loom_records_straddle_the_end_of_the_ring() {
    // Records of 24 bytes at 0, 24, 48, 72 (= 8): the third needs the first consumed (and
    // the slot at 72 = 8 free for its successor's header) and
    // runs from 48 to 72, its second word on the bytes of the first record's header (the
    // mirror); the fourth lands on the first record's payload.
    run(Cfg {
        records: 4,
        len: 16,
        straddling: 1,
        ..SMALL
    });
}

#[test]
#[should_panic(expected = "deadlock")]
fn loom_asymmetric_mode_without_its_membarrier_loses_a_wakeup() {
    // What loom sees of the asymmetric mode: the waker's compiler barrier (nothing to
    // loom) and the sleeper's fence, without the membarrier's fence on the waker's side.
    // The model finds the lost wake-up: the membarrier is what the mode rests on, and
    // these models do catch a missing fence.
    run(Cfg {
        mode: FenceMode::Asymmetric,
        ..SMALL
    });
}

#[test]
fn loom_batched_publication_and_lazy_head_wrap_and_wake() {
    // The producer publishes two records per `tail` store (and before it waits for room);
    // the consumer publishes `head` every second record (and before it waits). 5 records
    // of 16 bytes in a 64-byte ring: both sides must wait for the other and wake it.
    run(Cfg {
        records: 5,
        batch: 2,
        lazy: 32,
        ..SMALL
    });
}

#[test]
fn loom_batched_publication_from_an_armed_start() {
    run(Cfg {
        records: 3,
        armed: true,
        batch: 3,
        lazy: 32,
        ..SMALL
    });
}

#[test]
fn loom_sleeps_alternate_between_socket_and_pipe() {
    // Both sides change where they sleep at every wait (design §4.4's place word): a
    // waker that loads an announcement after its fence also reads the place stored
    // before it, so no wake-up goes to the place nobody sleeps on. A full ring and an
    // armed start: both sides sleep, in both places.
    run(Cfg {
        records: 5,
        armed: true,
        places: true,
        ..SMALL
    });
}
