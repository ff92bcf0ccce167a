//! Unit tests of the SPSC ring: records, wrap-around, hostile positions and headers,
//! the wake-up protocol and its fence modes, in process memory.

use super::consumer::*;
use super::layout::*;
use super::message::*;
use super::notify::*;
use super::producer::*;
use crate::sync::{AtomicU32, Ordering};
use std::ptr::NonNull;

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

/// Writes a 64-byte record of `i`s without publishing it.
fn write_64(p: &mut Producer, i: u8) {
    let dst = p.try_reserve(64).unwrap().unwrap();
    // SAFETY: try_reserve returned room for 64 bytes.
    unsafe { dst.as_ptr().write_bytes(i, 64) };
    p.write(64, 0);
}

/// After a `tail` read that revealed a batch, the consumer takes records up to that
/// tail and then waits for the next publication instead of chasing headers; after a
/// one-record step it finds records by their header again.
#[test]
fn a_batched_producer_is_followed_by_tail() {
    let mut h = HeapRing::new(4096);
    let (mut p, mut c) = h.ends();
    for i in 0..10 {
        write_64(&mut p, i);
    }
    assert!(!p.publish());
    write_64(&mut p, 10); // written, not published
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
    write_64(&mut p, 11);
    assert_eq!(
        pop(&mut c).unwrap(),
        [11; 64],
        "after a small step: found by its header, unpublished"
    );
    assert!(c.peek().unwrap().is_none());
}

/// A busy-polling consumer watches the header at `head` (the record's own line), also
/// of a record not yet published; once a `tail` read finds it ahead of the published
/// `tail` (a batch), it follows `tail` instead.
#[test]
fn a_polling_consumer_watches_headers_until_it_runs_ahead_of_a_batch() {
    let mut h = HeapRing::new(4096);
    let (mut p, mut c) = h.ends();
    assert!(!c.poll().unwrap(), "nothing written");
    write_64(&mut p, 0);
    assert!(c.poll().unwrap(), "the header is stamped, tail still 0");
    assert_eq!(h.prod.tail.0.load(Ordering::Relaxed), 0);
    assert_eq!(pop(&mut c).unwrap(), [0; 64]);
    assert!(!c.poll().unwrap());
    // A batch written and not published: taken by the headers, ahead of tail.
    for i in 1..=10 {
        write_64(&mut p, i);
    }
    for i in 1..=10u8 {
        assert!(c.poll().unwrap());
        assert_eq!(pop(&mut c).unwrap(), [i; 64]);
    }
    assert!(
        c.peek().unwrap().is_none(),
        "the tail read finds head far ahead"
    );
    write_64(&mut p, 11);
    assert!(
        !c.poll().unwrap(),
        "following tail now: the unpublished record waits for its publication"
    );
    assert!(!p.publish());
    assert!(c.poll().unwrap());
    assert_eq!(pop(&mut c).unwrap(), [11; 64]);
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

/// Records that never fill a large ring (a round trip at a time) keep to its first half
/// and two records: the producer restarts the empty ring once a lap. A ring that is not
/// empty at that check is not restarted until the next lap.
#[test]
fn traffic_that_never_fills_the_ring_keeps_to_its_start() {
    let cap = 256 << 10;
    let mut h = HeapRing::new(cap);
    let (mut p, mut c) = h.ends();
    let base = h.data.as_ptr() as usize;
    let offset = |dst: NonNull<u8>| dst.as_ptr() as usize - base - HEADER;
    let mut furthest = 0;
    for i in 0..1000u32 {
        let msg = vec![i as u8; 1000 + i as usize % 24];
        let dst = p.try_reserve(msg.len()).unwrap().unwrap();
        furthest = furthest.max(offset(dst) + record_size(msg.len()));
        // SAFETY: try_reserve returned room for msg.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), dst.as_ptr(), msg.len()) };
        p.commit(msg.len(), 0);
        let r = loop {
            let r = c.peek().unwrap().unwrap();
            if !r.is_skip() {
                break r;
            }
            c.advance(r.size());
        };
        // SAFETY: peek validated the record inside the mapping.
        let got = unsafe { std::slice::from_raw_parts(r.ptr.as_ptr(), r.len) };
        assert_eq!(got, msg);
        c.advance(r.size());
    }
    assert!(
        furthest <= cap / 2 + HEADER + 2 * record_size(1023),
        "{furthest}"
    );

    // Behind at the check: the records go on past it, to the end of the lap.
    let mut h = HeapRing::new(cap);
    let (mut p, mut c) = h.ends();
    let base = h.data.as_ptr() as usize;
    let offset = |dst: NonNull<u8>| dst.as_ptr() as usize - base - HEADER;
    let size = record_size(1000);
    let mut pos = 0;
    for round in 0..3 {
        for _ in 0..cap / 2 / size {
            let dst = p.try_reserve(1000).unwrap().unwrap();
            assert_eq!(offset(dst), pos % cap, "round {round}");
            p.commit(1000, 0);
            pos += size;
        }
        while let Some(r) = c.peek().unwrap() {
            assert!(!r.is_skip());
            c.advance(r.size());
        }
    }
    assert!(pos > cap, "a whole lap without a restart");
}

/// Payload that looks like the next record's header is never taken for one (records
/// of one size: the next header slot always holds an earlier lap's header).
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

/// A record that ends at a line's start, where an earlier lap's payload left the very
/// header a record would have there now: the producer clears that word before it
/// publishes, and leaves alone a stale word no consumer would take (an earlier lap's
/// header), which it only reads, unless the next record is expected at once.
#[test]
fn a_stale_word_that_reads_as_the_next_header_is_cleared_first() {
    let cap = 256u64;
    let mut h = HeapRing::new(cap as usize);
    let (mut p, mut c) = h.ends();
    // Lap 0: two records of 120 bytes (at 0 and 128). The first one's payload holds, at
    // position 64, the header a record at 64 would have one lap later.
    let mut msg = [1u8; 120];
    msg[56..64].copy_from_slice(&header_word(cap + 64, 8, 0).to_le_bytes());
    for _ in 0..2 {
        assert!(push(&mut p, &msg));
        assert_eq!(pop(&mut c).unwrap(), msg);
    }
    let word = |h: &HeapRing, pos: u64| h.data[(pos % cap / 8) as usize];
    let old_header = word(&h, 128);
    assert_ne!(old_header, 0);
    // Lap 1: a 56-byte record at 256 ends at 320 (line 1, where the forged word is).
    assert!(push(&mut p, &[7; 56]));
    assert_eq!(
        word(&h, 64),
        0,
        "the word that reads as a header was cleared"
    );
    assert_eq!(pop(&mut c).unwrap(), [7; 56]);
    assert!(c.peek().unwrap().is_none(), "no record after the one sent");
    // The next one ends at 384 (line 2), over lap 0's second header: not one for 384,
    // so the producer leaves it (a store there would wait for a line the consumer
    // polls next to).
    assert!(push(&mut p, &[8; 56]));
    assert_eq!(word(&h, 128), old_header);
    assert_eq!(pop(&mut c).unwrap(), [8; 56]);
    assert!(c.peek().unwrap().is_none());
    // An answer to a request that was found waiting in the other direction (a
    // pipeline's): the next record follows at once, so its slot is zeroed ahead of it,
    // payload bytes or not.
    p.sent(1, false);
    assert_ne!(word(&h, 192), 0);
    assert!(push(&mut p, &[9; 56]));
    assert_eq!(word(&h, 192), 0, "zeroed ahead of a pipeline's next answer");
    // An answer to a request waited for: a round trip's, the slot only read.
    p.sent(2, true);
    let lap1_header = word(&h, 0);
    assert!(push(&mut p, &[10; 56]));
    assert_eq!(word(&h, 0), lap1_header);
    for v in [9, 10] {
        assert_eq!(pop(&mut c).unwrap(), [v; 56]);
    }
    assert!(c.peek().unwrap().is_none());
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
