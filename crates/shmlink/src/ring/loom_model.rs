//! Loom model of the ring and its wake-up protocol (DESIGN §4).
//!
//! Run with `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p shmlink --lib
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
//! reports as a deadlock; a torn or reordered record fails the payload check. The model
//! checks [`FenceMode::Symmetric`]; the asymmetric mode replaces the waker's fence with a
//! compiler barrier and the sleeper's with `membarrier`, which loom cannot express.

use std::ptr::NonNull;

use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

use super::*;

/// The doorbell: a counter of rings and a way to wait for it to move (the socket byte and
/// `poll` in the real transport).
#[derive(Default)]
struct Doorbell {
    rings: Mutex<u64>,
    cv: Condvar,
}

impl Doorbell {
    fn ring(&self) {
        *self.rings.lock().unwrap() += 1;
        self.cv.notify_one();
    }
    /// What has been rung so far ("drain").
    fn seen(&self) -> u64 {
        *self.rings.lock().unwrap()
    }
    /// Sleeps until a ring after `seen` ("poll").
    fn wait_past(&self, seen: u64) {
        let mut n = self.rings.lock().unwrap();
        while *n == seen {
            n = self.cv.wait(n).unwrap();
        }
    }
}

/// Ring memory shared by the two threads: the producer's block and data area, the
/// consumer's block. Records of 8 payload bytes take 16 bytes and divide the capacity, so
/// none crosses the end and the second (mirror) copy of the data area is never needed.
struct Shared {
    prod: Box<ProducerCtl>,
    cons: Box<ConsumerCtl>,
    data: Box<[std::cell::UnsafeCell<u64>]>,
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
    /// A fresh ring; `armed`: the consumer starts announced, as a connection's does.
    fn new(armed: bool) -> Arc<Shared> {
        let cons = Box::new(ConsumerCtl::new());
        if armed {
            cons.start_armed();
        }
        Arc::new(Shared {
            prod: Box::new(ProducerCtl::new()),
            cons,
            data: (0..2 * CAP / 8).map(|_| 0.into()).collect(),
            to_consumer: Doorbell::default(),
            to_producer: Doorbell::default(),
        })
    }
    fn ring(&self) -> RingRef {
        // SAFETY: the blocks and `data` live as long as the Arc the threads hold; records
        // never cross the end of the first copy (see `Shared`).
        unsafe {
            RingRef::new(
                NonNull::from(&*self.prod),
                NonNull::from(&*self.cons),
                NonNull::new(self.data.as_ptr() as *mut u8).unwrap(),
                CAP,
            )
        }
    }
}

fn run(records: u64, armed: bool) {
    loom::model(move || {
        let shared = Shared::new(armed);
        let s = shared.clone();
        let producer = thread::spawn(move || {
            let mut p = Producer::new(s.ring(), FenceMode::Symmetric);
            for i in 0..records {
                loop {
                    if let Some(dst) = p.try_reserve(8).unwrap() {
                        // SAFETY: 8 bytes reserved at `dst`, 8-aligned.
                        unsafe { dst.cast::<u64>().as_ptr().write(i + 100) };
                        if p.commit(8, 0) {
                            s.to_consumer.ring();
                        }
                        break;
                    }
                    let seen = s.to_producer.seen();
                    if !p.arm(record_size(8)).unwrap() {
                        s.to_producer.wait_past(seen);
                    }
                }
            }
            if p.close() {
                s.to_consumer.ring();
            }
        });
        let mut c = Consumer::new(shared.ring(), FenceMode::Symmetric);
        let mut next = 0;
        loop {
            if let Some(rec) = c.peek().unwrap() {
                assert_eq!(rec.len, 8);
                // SAFETY: peek validated the record; its payload is one aligned u64.
                let v = unsafe { rec.ptr.cast::<u64>().as_ptr().read() };
                assert_eq!(v, next + 100, "record lost, torn or out of order");
                next += 1;
                if c.advance(rec.size()) {
                    shared.to_producer.ring();
                }
                continue;
            }
            if c.peer_closed() && !c.has_data().unwrap() {
                break;
            }
            let seen = shared.to_consumer.seen();
            if !c.arm().unwrap() && !c.peer_closed() {
                shared.to_consumer.wait_past(seen);
            }
        }
        assert_eq!(next, records);
        producer.join().unwrap();
    });
}

#[test]
fn loom_records_and_wakeups_within_one_lap() {
    run(3, false);
}

#[test]
fn loom_armed_start_as_a_connection_begins() {
    // The consumer announced before the producer's first record (`start_armed`).
    run(3, true);
}

#[test]
fn loom_full_ring_wraps_and_wakes_the_producer() {
    // 4 records fill the ring; the 5th and 6th need the producer to wait and wrap.
    run(6, false);
}
