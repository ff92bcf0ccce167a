//! `Connection::batch`: the same messages, order and flow control as one `send` each, on
//! every transport; on `shm:` published together, and never held back from a peer that
//! needs them (every wait inside a batch publishes it first). Also the receiving side's
//! `consume`/`flush` path (`shm:` publishes its ring position through it; a held-back
//! position is published before it waits): a producer waiting for room still gets it.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::*;
use shmlink::{Connection, Options, WaitPolicy};

/// Generous: a deadlock fails the test instead of hanging it.
const LIMIT: Duration = Duration::from_secs(60);

/// Runs `f` on a thread; fails if it does not finish within [`LIMIT`].
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(LIMIT)
        .unwrap_or_else(|_| panic!("{what}: no progress in {LIMIT:?} (a batch held back?)"))
}

/// Message `i`'s length: mostly small, every 97th larger than half of a 4 KiB ring (split
/// on `shm:`), a few empty.
fn len_of(i: u64) -> usize {
    match i % 97 {
        0 => 3000,
        13 => 0,
        k => 12 + (k as usize * 7) % 200,
    }
}

fn stream_in_batches(transport: &str, opts: Options, batch: u64) {
    let (mut client, mut server) = pair_with(transport, &opts);
    const COUNT: u64 = 3000;
    let reader = std::thread::spawn(move || {
        for i in 0..COUNT {
            let msg = server.recv_vec().unwrap();
            verify(i, len_of(i), &msg);
        }
        server
    });
    within(transport, move || {
        let mut i = 0;
        while i < COUNT {
            let mut b = client.batch();
            for _ in 0..batch.min(COUNT - i) {
                if i % 2 == 0 {
                    b.send(&payload(i, len_of(i))).unwrap();
                } else {
                    let msg = payload(i, len_of(i));
                    let mut buf = b.reserve(msg.len()).unwrap();
                    buf.copy_from_slice(&msg);
                    buf.commit().unwrap();
                }
                i += 1;
            }
            b.finish();
        }
        reader.join().unwrap();
    });
}

#[test]
fn batches_deliver_every_message_in_order_through_a_small_ring() {
    // A 4 KiB ring: batches of 64 messages wait for room inside the batch.
    let spin = Options::default().ring_size(4096);
    stream_in_batches("shm", spin.clone(), 64);
    stream_in_batches("shm", spin, 1);
    // Both ends sleep at once whenever they wait: a batch's records must wake the reader.
    let blocking = Options::default()
        .ring_size(4096)
        .wait_policy(WaitPolicy::BLOCKING);
    stream_in_batches("shm", blocking, 16);
}

#[test]
fn other_transports_send_a_batch_message_by_message() {
    for t in ["ux", "tcp"] {
        stream_in_batches(t, opts(t), 32);
    }
}

#[test]
fn a_receive_inside_a_batch_publishes_what_it_holds() {
    // Request, then wait for the answer without ending the batch: the request must go out
    // before the requester sleeps, whatever the wait policy.
    for policy in [WaitPolicy::default(), WaitPolicy::BLOCKING] {
        let opts = Options::default().wait_policy(policy);
        let (mut client, mut server) = pair_with("shm", &opts);
        let echo = std::thread::spawn(move || {
            for _ in 0..100 {
                let msg = server.recv_vec().unwrap();
                server.send(&msg).unwrap();
            }
        });
        within("request inside a batch", move || {
            client.begin_batch();
            for i in 0..100u64 {
                client.send(&payload(i, 64)).unwrap();
                let back = client.recv_vec().unwrap();
                verify(i, 64, &back);
            }
            client.end_batch();
            echo.join().unwrap();
        });
    }
}

#[test]
fn closing_inside_a_batch_delivers_it() {
    let (mut client, mut server) = pair_with("shm", &Options::default());
    let reader = std::thread::spawn(move || {
        let mut n = 0;
        while let Ok(msg) = server.recv_vec() {
            verify(n, 40, &msg);
            n += 1;
        }
        n
    });
    client.begin_batch();
    for i in 0..10u64 {
        client.send(&payload(i, 40)).unwrap();
    }
    client.close().unwrap();
    assert_eq!(within("close", move || reader.join().unwrap()), 10);
}

#[test]
fn a_reader_that_stops_early_still_frees_the_room_it_read() {
    // The reader takes every message the ring held, then waits for one more: the wait
    // publishes its position, so the writer, stuck on a full 4 KiB ring, gets room.
    let opts = Options::default()
        .ring_size(4096)
        .wait_policy(WaitPolicy::BLOCKING);
    let (mut client, mut server) = pair_with("shm", &opts);
    within("lazy head", move || {
        let writer = std::thread::spawn(move || {
            for i in 0..500u64 {
                client.send(&payload(i, 100)).unwrap();
            }
            client
        });
        for i in 0..500u64 {
            verify(i, 100, &server.recv_vec().unwrap());
        }
        let _client: Connection = writer.join().unwrap();
    });
}
