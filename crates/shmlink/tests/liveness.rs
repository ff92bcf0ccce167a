//! Liveness against peers that stay connected but do not cooperate: nothing they do may
//! hold an honest side forever or take what belongs to others (issue 13).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use shmlink::{Connection, ErrorKind, Options, Policy, PubSubOptions, Publisher, Subscriber};
use shmlink_testkit::{HostilePeer, HostileSubscriber};

const RING: usize = 4096;

/// The close linger documented on `Connection::close`.
const CLOSE_LINGER: Duration = Duration::from_secs(30);

fn small_opts() -> Options {
    Options::default().ring_size(RING).max_msg_size(1 << 20)
}

/// Fills the server's 4096-byte ring with a 2000-byte message and a split 3000-byte one in
/// non-blocking mode, so that the end of the split message stays pending in user space.
fn leave_a_fragment_pending(server: &mut Connection) {
    server.set_nonblocking(true);
    server.send(&payload(0, 2000)).unwrap();
    server.send(&payload(1, 3000)).unwrap();
    let e = server.send(b"x").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WouldBlock, "ring should be full: {e}");
}

#[test]
fn shm_close_times_out_when_the_peer_never_reads() {
    let (mut l, addr) = bind("shm", &small_opts());
    let a = addr.clone();
    let peer = thread::spawn(move || HostilePeer::connect(&a, RING).unwrap());
    let mut server = l.accept().unwrap();
    // Connected, and never advances its head.
    let peer = peer.join().unwrap();
    leave_a_fragment_pending(&mut server);

    let (tx, rx) = mpsc::channel();
    thread::spawn(move || tx.send(server.close()).unwrap());
    let r = rx
        .recv_timeout(CLOSE_LINGER + Duration::from_secs(60))
        .expect("close() still blocked long after the linger");
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
    drop(peer);
}

#[test]
fn shm_close_lingers_for_a_peer_that_reads() {
    let (mut client, mut server) = pair_with("shm", &small_opts());
    leave_a_fragment_pending(&mut server);

    let (tx, rx) = mpsc::channel();
    thread::spawn(move || tx.send(server.close()).unwrap());
    verify(0, 2000, &client.recv_vec().unwrap());
    verify(1, 3000, &client.recv_vec().unwrap());
    expect_eos(&mut client);
    let r = rx
        .recv_timeout(CLOSE_LINGER + Duration::from_secs(60))
        .expect("close() did not return");
    r.unwrap();
}

// --- pub/sub: the `Block` stall rule ---------------------------------------------------

/// Publishes `n` messages in a thread, counting them in `published`; returns the
/// publisher once done, or panics if that takes longer than `limit`.
fn publish_all(
    mut publisher: Publisher,
    n: u64,
    published: Arc<AtomicU64>,
    limit: Duration,
) -> (Publisher, Duration) {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let t = Instant::now();
        for seq in 0..n {
            publisher.publish(&seq.to_le_bytes()).unwrap();
            published.store(seq + 1, Ordering::Release);
        }
        tx.send((publisher, t.elapsed())).unwrap();
    });
    rx.recv_timeout(limit)
        .expect("the publisher did not finish: held up by a subscriber")
}

/// A subscriber that moves its cursor by one every 150 ms (just inside a 200 ms stall
/// timeout), without reading or ringing, used to hold a `Block` publisher to one message
/// per stall timeout forever. Now it must read what was published when the publisher
/// began waiting within the timeout, so it is detached and the publisher goes on.
#[test]
fn block_detaches_a_subscriber_that_trickles_progress() {
    let stall = Duration::from_millis(200);
    let addr = fresh_addr("shm");
    let opts = PubSubOptions::default()
        .slots(4)
        .max_msg_size(64)
        .policy(Policy::Block)
        .stall_timeout(stall);
    let publisher = Publisher::bind(&addr, &opts).unwrap();
    let hostile = HostileSubscriber::connect(&addr).unwrap();
    publisher
        .wait_for_subscribers(1, Duration::from_secs(10))
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let trickler = {
        let (stop, published) = (stop.clone(), published.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(150));
                let c = hostile.cursor();
                // Never past what was published: that would be a protocol violation,
                // detached for another reason.
                if c < published.load(Ordering::Acquire) {
                    hostile.store_cursor(c + 1);
                }
            }
        })
    };
    let (publisher, took) = publish_all(publisher, 20, published, Duration::from_secs(60));
    stop.store(true, Ordering::Relaxed);
    trickler.join().unwrap();
    let stats = publisher.stats();
    eprintln!(
        "20 messages past a trickling subscriber in {took:?} (stall timeout {stall:?}): {stats:?}"
    );
    assert!(
        stats.detached >= 1,
        "the trickling subscriber was never detached: {stats:?}"
    );
    assert_eq!(stats.subscribers, 0, "{stats:?}");
    publisher.close().unwrap();
}

/// A slow subscriber that still keeps up with a ring per stall timeout (here 4 slots per
/// second; it reads about 100 a second) is never detached: `Block` back-pressure stays.
#[test]
fn block_keeps_a_slow_subscriber_that_keeps_up() {
    let addr = fresh_addr("shm");
    let opts = PubSubOptions::default()
        .slots(4)
        .max_msg_size(64)
        .policy(Policy::Block)
        .stall_timeout(Duration::from_secs(1));
    let publisher = Publisher::bind(&addr, &opts).unwrap();
    let mut sub = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap();
    publisher
        .wait_for_subscribers(1, Duration::from_secs(10))
        .unwrap();
    const N: u64 = 50;
    let reader = thread::spawn(move || {
        for seq in 0..N {
            let m = sub.recv_vec().unwrap();
            assert_eq!(m, seq.to_le_bytes());
            thread::sleep(Duration::from_millis(10)); // "work" per message
        }
        sub
    });
    let published = Arc::new(AtomicU64::new(0));
    let (publisher, took) = publish_all(publisher, N, published, Duration::from_secs(60));
    let stats = publisher.stats();
    eprintln!("{N} messages to a slow subscriber in {took:?}: {stats:?}");
    assert_eq!(stats.detached, 0, "{stats:?}");
    let mut sub = reader.join().unwrap();
    publisher.close().unwrap();
    assert_eq!(sub.recv_vec().unwrap_err().kind(), ErrorKind::EndOfStream);
}

// --- pub/sub: network subscribers and the topic's slots --------------------------------

/// Remote (network) subscribers are bounded by `max_remote_subscribers`, so a flood of
/// TCP subscriptions leaves the other slots to local subscribers. An `auto:` topic serves
/// both: `tcp:` subscribers to its port stay remote, `auto:` ones on this kernel attach
/// over shared memory and count as local.
#[test]
fn remote_subscriber_flood_leaves_the_local_slots() {
    let opts = PubSubOptions::default()
        .slots(16)
        .max_msg_size(64)
        .max_subscribers(4)
        .max_remote_subscribers(2);
    let mut publisher = Publisher::bind("auto:127.0.0.1:0", &opts).unwrap();
    let addr = publisher.local_addr();
    let tcp = addr.replacen("auto:", "tcp:", 1);

    let mut subs = Vec::new();
    let mut refused = 0;
    for _ in 0..8 {
        match Subscriber::connect(&tcp, &PubSubOptions::default()) {
            Ok(s) => {
                assert_eq!(s.transport(), shmlink::Transport::Tcp);
                subs.push(s);
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
                assert!(e.to_string().contains("max_remote_subscribers"), "{e}");
                refused += 1;
            }
        }
    }
    assert_eq!(
        (subs.len(), refused),
        (2, 6),
        "remote subscribers admitted, refused"
    );

    // The local slots are still there.
    for _ in 0..2 {
        let s = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap();
        assert_eq!(s.transport(), shmlink::Transport::Shm);
        subs.push(s);
    }
    publisher
        .wait_for_subscribers(4, Duration::from_secs(10))
        .unwrap();
    // Now the topic is full, for anyone.
    let e = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");

    // Every admitted subscriber is served.
    publisher.publish(b"to all four").unwrap();
    publisher.close().unwrap();
    for s in &mut subs {
        assert_eq!(s.recv_vec().unwrap(), b"to all four");
        assert_eq!(s.recv_vec().unwrap_err().kind(), ErrorKind::EndOfStream);
    }
}

/// The same bound on a `tcp:` topic: the remotes beyond it are refused, with the reason.
#[test]
fn tcp_topic_refuses_remotes_beyond_the_bound() {
    let opts = PubSubOptions::default()
        .slots(16)
        .max_msg_size(64)
        .max_subscribers(4);
    let publisher = Publisher::bind("tcp:127.0.0.1:0", &opts).unwrap();
    let addr = publisher.local_addr();
    // Default bound: half of max_subscribers.
    let admitted: Vec<_> = (0..2)
        .map(|_| Subscriber::connect(&addr, &PubSubOptions::default()).unwrap())
        .collect();
    for _ in 0..4 {
        let e = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
        assert!(
            e.to_string().contains("maximum of 2 remote subscribers"),
            "{e}"
        );
    }
    assert_eq!(publisher.subscriber_count(), 2);
    drop(admitted);
    publisher.close().unwrap();
}

/// A subscriber that announces sleep after every message without reading anything asked
/// the publisher for a doorbell (a system call) on every publish (issue 13, "lower"). By
/// the doorbell rule it gets one doorbell, and no more until its cursor moves; an honest
/// subscriber sleeping between messages on another slot still wakes for every one.
#[test]
fn a_subscriber_announcing_sleep_without_reading_costs_one_doorbell() {
    const COUNT: u64 = 2000;
    let addr = fresh_addr("shm");
    let opts = PubSubOptions::default()
        .slots(64)
        .max_msg_size(64)
        .policy(Policy::Overwrite)
        .wait_policy(shmlink::WaitPolicy::BLOCKING);
    let mut publisher = Publisher::bind(&addr, &opts).unwrap();
    let hostile = Arc::new(HostileSubscriber::connect(&addr).unwrap());
    let mut honest = Subscriber::connect(&addr, &opts).unwrap();
    honest.set_nonblocking(true);
    publisher
        .wait_for_subscribers(2, Duration::from_secs(10))
        .unwrap();

    // The honest one reads in non-blocking mode and waits on its fd like an event loop:
    // a doorbell lost to the rule would leave the fd unreadable with a message waiting.
    let (ack_tx, ack_rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        let mut buf = [0u8; 64];
        let mut next = 0u64;
        while next < COUNT {
            match honest.recv(&mut buf) {
                Ok(n) => {
                    assert_eq!(&buf[..n], &next.to_le_bytes(), "message {next}");
                    next += 1;
                    ack_tx.send(next).unwrap();
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    let mut pfd = libc::pollfd {
                        fd: std::os::fd::AsRawFd::as_raw_fd(&honest),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd for the duration of the call.
                    let r = unsafe { libc::poll(&mut pfd, 1, 10_000) };
                    assert_eq!(
                        r, 1,
                        "lost wake-up: message {next} waiting, fd not readable"
                    );
                }
                Err(e) => panic!("message {next}: {e}"),
            }
        }
    });
    let mut hostile_doorbells = 0;
    for seq in 0..COUNT {
        hostile.announce_sleep();
        publisher.publish(&seq.to_le_bytes()).unwrap();
        // One message at a time, so the honest subscriber goes back to sleep before each.
        let acked = ack_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(acked, seq + 1);
        hostile_doorbells += hostile.take_doorbells();
    }
    reader.join().unwrap();
    eprintln!("{COUNT} publishes: the never-reading subscriber got {hostile_doorbells} doorbells");
    assert!(
        hostile_doorbells <= 1,
        "{hostile_doorbells} doorbells to a subscriber whose cursor never moved"
    );

    // Once its cursor moves (it claims to have read), it is owed a doorbell again — one
    // per message at most, what an honest subscriber sleeping between messages costs.
    let mut moved_doorbells = 0;
    for seq in COUNT..COUNT + 100 {
        hostile.store_cursor(seq);
        hostile.announce_sleep();
        publisher.publish(&seq.to_le_bytes()).unwrap();
        moved_doorbells += hostile.take_doorbells();
    }
    assert!(
        (1..=100).contains(&moved_doorbells),
        "{moved_doorbells} doorbells for 100 messages"
    );
    publisher.close().unwrap();
}
