//! Loom model of the in-process pipe and its wake-up protocol.
//!
//! Run with the ring's other models: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3
//! cargo test -p shmlink-ring --release loom`.
//!
//! A producer sends three 4-byte messages through a pipe of 8 bytes (two messages in
//! flight, so the third waits for room) to a consumer that checks each one's bytes. Each
//! side that finds nothing to do parks the way shmlink's in-process connections do (a
//! counter doorbell standing for `thread::park`/`unpark`): note the doorbell's count,
//! announce in its own [`Waiters`], look again, and only then wait for the count to
//! change; the other side, after its `publish` or `consume`, rings if [`Waiters::take`]
//! finds the announcement. A lost wake-up leaves a side waiting forever, which loom
//! reports as a deadlock; a message read before it is published is a loom causality
//! error on its slot (the slots are loom cells under `--cfg loom`) or fails the byte
//! check. A second model ends the stream by [`End::set`] instead of a count.

use loom::sync::Arc;
use loom::thread;

use super::*;
use crate::loom_doorbell::Doorbell;

struct Shared {
    pipe: Pipe,
    /// The consumer's and the producer's announcements.
    rx_wait: Waiters,
    tx_wait: Waiters,
    /// Rung for the consumer, for the producer.
    to_rx: Doorbell,
    to_tx: Doorbell,
    /// The producer's end.
    end: End,
}

const LEN: usize = 4;

fn shared() -> Arc<Shared> {
    Arc::new(Shared {
        pipe: Pipe::new(2 * LEN),
        rx_wait: Waiters::new(0),
        tx_wait: Waiters::new(0),
        to_rx: Doorbell::default(),
        to_tx: Doorbell::default(),
        end: End::new(),
    })
}

/// Sends message `i` (LEN bytes of value `i`), parking while the pipe is full.
fn send(s: &Shared, tx: &mut Tx, i: u8) {
    while !tx.has_room(&s.pipe, LEN) {
        let seen = s.to_tx.seen();
        s.tx_wait.announce(Waiters::ROOM_PARK);
        if tx.has_room(&s.pipe, LEN) {
            s.tx_wait.retract(Waiters::ROOM_PARK);
            break;
        }
        s.to_tx.wait_past(seen);
    }
    // SAFETY: `has_room` said it fits; only this thread produces.
    let v = unsafe { tx.slot(&s.pipe, LEN) };
    v.clear();
    v.extend_from_slice(&[i; LEN]);
    tx.publish(&s.pipe, LEN);
    if s.rx_wait.take(Waiters::DATA) != 0 {
        s.to_rx.ring();
    }
}

/// Whether a message waits, parking until one does or `stop` says to stop looking.
fn wait_data(s: &Shared, rx: &mut Rx, stop: impl Fn() -> bool) -> bool {
    loop {
        let ended = stop();
        if rx.has_data(&s.pipe) {
            return true;
        }
        if ended {
            return false;
        }
        let seen = s.to_rx.seen();
        s.rx_wait.announce(Waiters::DATA_PARK);
        if rx.has_data(&s.pipe) || stop() {
            s.rx_wait.retract(Waiters::DATA_PARK);
            continue;
        }
        s.to_rx.wait_past(seen);
    }
}

/// Takes the message at the head, checks it is message `i`, and hands its slot back.
fn receive(s: &Shared, rx: &mut Rx, i: u8) {
    // SAFETY: `has_data` said it is published; only this thread consumes.
    let v = unsafe { rx.current(&s.pipe) };
    assert_eq!(v.as_slice(), &[i; LEN], "message {i}");
    rx.consume(&s.pipe, LEN);
    if s.tx_wait.take(Waiters::ROOM) != 0 {
        s.to_tx.ring();
    }
}

#[test]
fn loom_pipe_messages_arrive_whole_and_no_wake_up_is_lost() {
    loom::model(|| {
        let s = shared();
        let p = s.clone();
        let producer = thread::spawn(move || {
            let mut tx = Tx::default();
            for i in 1..=3 {
                send(&p, &mut tx, i);
            }
        });
        let mut rx = Rx::default();
        for i in 1..=3 {
            assert!(wait_data(&s, &mut rx, || false));
            receive(&s, &mut rx, i);
        }
        producer.join().unwrap();
    });
}

#[test]
fn loom_pipe_end_comes_after_the_last_message() {
    loom::model(|| {
        let s = shared();
        let p = s.clone();
        let producer = thread::spawn(move || {
            let mut tx = Tx::default();
            send(&p, &mut tx, 1);
            p.end.set(End::CLOSED);
            p.rx_wait.take_all();
            p.to_rx.ring();
        });
        let mut rx = Rx::default();
        let mut got = 0;
        while wait_data(&s, &mut rx, || s.end.load() != End::LIVE) {
            got += 1;
            receive(&s, &mut rx, got);
        }
        assert_eq!(got, 1, "the end was seen before the message");
        producer.join().unwrap();
    });
}
