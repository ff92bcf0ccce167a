//! `ExportingPublisher` in one process, over loopback (no namespaces, no root): every
//! message reaches Zenoh whether or not the host has subscribers; while it has none and
//! the topic keeps no history, nothing goes into the local ring, and a subscriber that
//! joins gets every message from the next one on, in order; a topic with history still
//! fills its ring for late joiners.

mod loopback;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use loopback::pair;
use shmlink::{PubSubOptions, Subscriber};
use shmlink_zenoh::{ExportingPublisher, DEFAULT_PREFIX};
use zenoh::Wait;

/// Message `n`, 64 bytes.
fn msg(n: u64) -> Vec<u8> {
    loopback::msg(n, 64)
}

/// The number of a 64-byte message made by [`msg`], checked whole.
fn number(m: &[u8]) -> u64 {
    assert_eq!(m.len(), 64);
    loopback::number(m)
}

/// The next message Zenoh delivered, within 10 s.
fn next(rx: &mpsc::Receiver<Vec<u8>>) -> u64 {
    number(
        &rx.recv_timeout(Duration::from_secs(10))
            .expect("a message from Zenoh"),
    )
}

#[test]
fn local_ring_only_when_someone_reads_it_or_history_asks() {
    let (dir, a, b) = pair("exporting");
    // What Zenoh delivers of `plain` (the topic with history is checked locally only).
    let (tx, plain) = mpsc::channel();
    let _remote = b
        .declare_subscriber(format!("{DEFAULT_PREFIX}plain"))
        .callback(move |s| {
            let _ = tx.send(s.payload().to_bytes().to_vec());
        })
        .wait()
        .unwrap();

    let opts = PubSubOptions::default().max_msg_size(64).slots(64);
    let mut p = ExportingPublisher::new(&a, "plain", &opts, DEFAULT_PREFIX).unwrap();
    // Until Zenoh's routes are up, puts go nowhere: send until one arrives.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    loop {
        p.publish(&msg(n)).unwrap();
        n += 1;
        if let Ok(m) = plain.recv_timeout(Duration::from_millis(50)) {
            let first = number(&m);
            for want in first + 1..n {
                assert_eq!(next(&plain), want);
            }
            break;
        }
        assert!(Instant::now() < deadline, "Zenoh never delivered");
    }
    assert_eq!(p.local().stats().published, 0, "nobody reads the ring");

    // A local subscriber joins: from the next message on, it gets every one.
    let mut sub = Subscriber::connect("shm:plain", &PubSubOptions::default()).unwrap();
    let joined = n;
    for _ in 0..20 {
        p.publish(&msg(n)).unwrap();
        assert_eq!(next(&plain), n);
        n += 1;
    }
    let mut buf = [0u8; 64];
    for want in joined..n {
        let len = sub.recv(&mut buf).unwrap();
        assert_eq!(number(&buf[..len]), want);
    }
    assert_eq!(p.local().stats().published, 20);
    drop(sub);
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.local().subscriber_count() > 0 {
        assert!(Instant::now() < deadline, "the subscriber never left");
        std::thread::sleep(Duration::from_millis(10));
    }
    p.publish_vec(msg(n)).unwrap();
    assert_eq!(next(&plain), n);
    assert_eq!(
        p.local().stats().published,
        20,
        "nobody reads the ring again"
    );
    p.close().unwrap();

    // With history, the ring is filled for late joiners even while nobody reads it.
    let mut h =
        ExportingPublisher::new(&a, "hist", &opts.clone().history(4), DEFAULT_PREFIX).unwrap();
    for n in 0..10 {
        h.publish(&msg(n)).unwrap();
    }
    assert_eq!(h.local().stats().published, 10);
    let mut late = Subscriber::connect("shm:hist", &PubSubOptions::default()).unwrap();
    for want in 6..10 {
        let len = late.recv(&mut buf).unwrap();
        assert_eq!(number(&buf[..len]), want);
    }
    h.close().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
