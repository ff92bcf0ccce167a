//! Publish/subscribe over the network: the scenarios of `pubsub.rs` with subscribers
//! over `tcp:` (fan-out to 1, 4 and 64 subscriber processes under `block`, exact loss
//! counts under `overwrite`, a subscriber or the publisher killed with SIGKILL, graceful
//! close), local `shm:` and remote subscribers on one topic, `tls:`, `auto:` choosing
//! shared memory on this kernel, peers of the wrong role, and hostile bytes on the wire.
//!
//! The other processes are this test binary run again (see [`pubsub_common`]).
//! Message counts are smaller than over `shm:` (every message crosses loopback TCP in a
//! debug build): 50,000 to one subscriber, 20,000 to four and to 64.

mod common;
mod pubsub_common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::{fresh_addr, opts};
use pubsub_common::*;
use shmlink::{
    Connection, ErrorKind, Listener, Options, Policy, PubSubOptions, Publisher, Subscriber,
};

const TCP: &str = "tcp:127.0.0.1:0";

/// The child processes' entry point (see [`pubsub_common::child_main`]).
#[test]
#[ignore = "the child processes of the other tests, which run it with --ignored"]
fn child_main() {
    pubsub_common::child_main();
}

#[test]
fn block_fan_out_over_tcp_to_1_subscriber_process() {
    run("tcp fan-out 1", || fan_out(1, 50_000));
}

#[test]
fn block_fan_out_over_tcp_to_4_subscriber_processes() {
    run("tcp fan-out 4", || fan_out(4, 20_000));
}

#[test]
fn block_fan_out_over_tcp_to_64_subscriber_processes() {
    run("tcp fan-out 64", || fan_out(64, 20_000));
}

/// `subs` subscriber processes each receive all `total` messages over TCP, in order,
/// intact, then end-of-stream.
fn fan_out(subs: usize, total: u64) {
    let opts = PubSubOptions::default().slots(1024).max_msg_size(64);
    let mut publisher = Publisher::bind(TCP, &opts).unwrap();
    let addr = publisher.local_addr();
    assert!(addr.starts_with("tcp:127.0.0.1:"), "{addr}");
    let mut children: Vec<_> = (0..subs)
        .map(|_| ChildProc::spawn("reader", &addr, ""))
        .collect();
    publisher.wait_for_subscribers(subs, WAIT).unwrap();
    // The fan-out thread notes the peer right after the ring reader joined.
    assert!(common::wait_until(WAIT, || publisher
        .subscribers()
        .iter()
        .all(|s| s.remote.is_some())));
    let t = Instant::now();
    for seq in 0..total {
        publish(&mut publisher, seq);
    }
    let stats = publisher.stats();
    assert_eq!(stats.detached, 0, "{stats:?}");
    publisher.close().unwrap();
    expect_everything_received(&mut children, total);
    eprintln!(
        "{subs} tcp subscribers x {total} messages: {:.0} msgs/s end to end",
        total as f64 / t.elapsed().as_secs_f64()
    );
}

/// Under `overwrite` with a deliberately slow remote subscriber: the fast ones (which
/// the test keeps up with) lose nothing; the slow one's reported losses equal the gaps
/// in the sequence numbers it received. The test publishes until the slow one has lost
/// messages (its socket full, its ring reader overtaken).
#[test]
fn overwrite_slow_remote_subscriber_reports_exactly_what_it_missed() {
    run("tcp overwrite slow", || {
        let slots = 256;
        let opts = PubSubOptions::default()
            .slots(slots)
            .max_msg_size(64)
            .policy(Policy::Overwrite);
        let mut publisher = Publisher::bind(TCP, &opts).unwrap();
        let addr = publisher.local_addr();
        let mut slow = ChildProc::spawn("slow", &addr, "32");
        publisher.wait_for_subscribers(1, WAIT).unwrap();
        let slow_slot = publisher.subscribers()[0].slot;
        let mut fast: Vec<_> = (0..2)
            .map(|_| ChildProc::spawn("reader", &addr, ""))
            .collect();
        publisher.wait_for_subscribers(3, WAIT).unwrap();
        let deadline = Instant::now() + WAIT;
        let mut seq = 0u64;
        loop {
            if seq % 32 == 0 {
                let subs = publisher.subscribers();
                let slow_missed = subs
                    .iter()
                    .find(|s| s.slot == slow_slot)
                    .map_or(0, |s| s.missed);
                if seq >= 20_000 && slow_missed > 0 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the slow subscriber lost nothing after {seq} messages"
                );
                keep_within_half_the_ring(&publisher, slots, |s| s.slot != slow_slot);
            }
            publish(&mut publisher, seq);
            seq += 1;
        }
        let total = seq;
        publisher.close().unwrap();
        expect_everything_received(&mut fast, total);
        expect_exact_losses(
            &mut slow,
            total,
            &format!("slow tcp subscriber of {total} messages"),
        );
    });
}

/// Under `block`, a remote subscriber that stops reading holds the publisher up once
/// its socket and the ring are full; SIGKILL frees the publisher long before the stall
/// timeout, the other subscriber receives everything, and the dead one's slot takes a
/// new subscriber.
#[test]
fn killed_remote_subscriber_frees_the_publisher_and_its_slot() {
    run("tcp subscriber sigkill", || {
        let stall = Duration::from_secs(120);
        let opts = PubSubOptions::default()
            .slots(16)
            .max_msg_size(64)
            .max_subscribers(2)
            .max_remote_subscribers(2) // both are remote here
            .stall_timeout(stall);
        let mut publisher = Publisher::bind(TCP, &opts).unwrap();
        let addr = publisher.local_addr();
        let (reader, mut idle) = reader_and_idle_fill_the_topic(&mut publisher, &addr);

        publisher.set_nonblocking(true);
        let mut seq = 0;
        let deadline = Instant::now() + WAIT;
        // Fill the idle subscriber's socket buffers and then the ring.
        loop {
            match try_publish(&mut publisher, seq) {
                Ok(()) => seq += 1,
                Err(ErrorKind::WouldBlock) => {
                    // Blocked: for a moment by the fan-out or the reader, for good by the
                    // idle one once its socket is full and the reader has caught up.
                    if readable(&publisher, Duration::from_millis(200)) {
                        continue;
                    }
                    let lags: Vec<u64> = publisher.subscribers().iter().map(|s| s.lag).collect();
                    if lags.contains(&0) {
                        break;
                    }
                    assert!(Instant::now() < deadline, "never blocked: {lags:?}");
                }
                Err(e) => panic!("{e:?}"),
            }
        }
        // More than the ring holds went out to the idle one: its socket is full.
        assert!(seq > 16, "blocked after {seq} messages");
        eprintln!("blocked by the idle remote after {seq} messages");
        let killed = idle.sigkill();
        publish_once_freed(&mut publisher, seq, killed);
        seq += 1;
        eprintln!(
            "SIGKILL -> publisher free after {:?} (stall timeout {stall:?})",
            killed.elapsed()
        );
        idle.expect_killed();
        assert!(common::wait_until(WAIT, || publisher.subscriber_count() == 1));

        // The slot is free: a new remote subscriber takes it and receives what follows.
        late_subscriber_takes_the_slot(publisher, &addr, seq, reader);
    });
}

/// Under `block`, a remote subscriber that stops reading is detached after the stall
/// timeout (its socket and then the ring full); when it reads again it gets every
/// message that was sent to it, then `Detached`; it may subscribe again. The other
/// subscriber loses nothing.
#[test]
fn stalled_remote_subscriber_is_detached_and_may_resubscribe() {
    run("tcp stall", || {
        let opts = PubSubOptions::default()
            .slots(16)
            .max_msg_size(64)
            .stall_timeout(Duration::from_millis(500));
        let mut publisher = Publisher::bind(TCP, &opts).unwrap();
        let addr = publisher.local_addr();
        let mut reader = ChildProc::spawn("reader", &addr, "");
        let mut stalled = ChildProc::spawn("stall", &addr, "");
        publisher.wait_for_subscribers(2, WAIT).unwrap();
        let deadline = Instant::now() + WAIT;
        let mut seq = 0;
        while publisher.stats().detached == 0 {
            assert!(
                Instant::now() < deadline,
                "not detached after {seq} messages"
            );
            for _ in 0..256 {
                publish(&mut publisher, seq);
                seq += 1;
            }
        }
        eprintln!("stalled remote detached after {seq} messages");
        stalled.say("go");
        assert_eq!(stalled.report("detached"), "error=Detached");
        publisher.wait_for_subscribers(2, WAIT).unwrap();
        let rejoined_at = seq;
        for _ in 0..1000 {
            publish(&mut publisher, seq);
            seq += 1;
        }
        publisher.close().unwrap();
        assert_eq!(
            reader.report("result"),
            format!("first=0 received={seq} error=EndOfStream")
        );
        assert_eq!(
            stalled.report("result"),
            format!("first={rejoined_at} received=1000 error=EndOfStream")
        );
        reader.expect_success();
        stalled.expect_success();
    });
}

/// A publisher process killed with SIGKILL: every remote subscriber receives a
/// consecutive run of messages from the first, then `ConnectionReset`.
#[test]
fn killed_publisher_resets_every_remote_subscriber() {
    run("tcp publisher sigkill", || {
        const SENT: u64 = 10_000;
        let mut publisher = ChildProc::spawn("publisher", TCP, &format!("2 {SENT}"));
        let addr = publisher.report("bound");
        assert!(addr.starts_with("tcp:"), "{addr}");
        let mut readers: Vec<_> = (0..2)
            .map(|_| ChildProc::spawn("reader", &addr, ""))
            .collect();
        publisher.report("sent");
        let killed = publisher.sigkill();
        publisher.expect_killed();
        for r in &mut readers {
            let res = r.report("result");
            assert!(
                res.starts_with("first=0 ") && res.ends_with(" error=ConnectionReset"),
                "{res}"
            );
            // What the fan-out had not yet handed to the kernel died with the publisher.
            assert!(field(&res, "received") <= SENT, "{res}");
            r.expect_success();
        }
        // The kernel closes the dead publisher's sockets: no timeout involved.
        let reset = killed.elapsed();
        eprintln!("SIGKILL -> both remote subscribers reset after {reset:?}");
        assert!(reset < Duration::from_secs(5), "{reset:?}");
    });
}

/// `close` delivers every message to remote subscribers (also through `recv_ref` and in
/// non-blocking mode), then end-of-stream, and frees the port.
#[test]
fn graceful_close_is_end_of_stream_after_the_last_message() {
    run("tcp graceful close", || {
        const TOTAL: u64 = 10_000;
        let opts = PubSubOptions::default().slots(64).max_msg_size(64);
        let mut publisher = Publisher::bind(TCP, &opts).unwrap();
        let addr = publisher.local_addr();
        let a = addr.clone();
        let by_ref = std::thread::spawn(move || {
            let mut sub = Subscriber::connect(&a, &PubSubOptions::default()).unwrap();
            assert_eq!(sub.transport(), shmlink::Transport::Tcp);
            assert_eq!(sub.policy(), Policy::Block);
            assert_eq!(sub.max_msg_size(), 64);
            let mut n = 0;
            loop {
                match sub.recv_ref() {
                    Ok(m) => {
                        assert_eq!(check(&m.to_vec().unwrap()), n);
                        assert_eq!(m.position(), n);
                        assert!(m.intact());
                        n += 1;
                    }
                    Err(e) => {
                        assert_eq!(e.kind(), ErrorKind::EndOfStream, "{e}");
                        break;
                    }
                }
            }
            assert_eq!(sub.stats().received, n);
            // The end is remembered.
            assert_eq!(sub.recv_vec().unwrap_err().kind(), ErrorKind::EndOfStream);
            n
        });
        let a = addr.clone();
        let nonblocking = std::thread::spawn(move || {
            let mut sub = Subscriber::connect(&a, &PubSubOptions::default()).unwrap();
            sub.set_nonblocking(true);
            assert!(sub.is_nonblocking());
            let mut buf = [0u8; 64];
            let mut n = 0;
            loop {
                match sub.recv(&mut buf) {
                    Ok(len) => {
                        assert_eq!(check(&buf[..len]), n);
                        n += 1;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        assert!(readable(&sub, WAIT), "fd not readable within {WAIT:?}");
                    }
                    Err(e) => {
                        assert_eq!(e.kind(), ErrorKind::EndOfStream, "{e}");
                        break;
                    }
                }
            }
            n
        });
        publisher.wait_for_subscribers(2, WAIT).unwrap();
        for seq in 0..TOTAL {
            publish(&mut publisher, seq);
        }
        publisher.close().unwrap();
        assert_eq!(by_ref.join().unwrap(), TOTAL);
        assert_eq!(nonblocking.join().unwrap(), TOTAL);
        let e = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                ErrorKind::ConnectionRefused | ErrorKind::Other | ErrorKind::ConnectionReset
            ),
            "{e}"
        );
    });
}

/// `close` waits for remotes to take what they are owed, but not for one that takes
/// nothing: after the stall timeout it is reset, and `close` returns; the others got
/// everything.
#[test]
fn close_is_bounded_by_a_stuck_remote() {
    run("tcp close with a stuck remote", || {
        let slots = 64;
        let opts = PubSubOptions::default()
            .slots(slots)
            .max_msg_size(64)
            .policy(Policy::Overwrite)
            .stall_timeout(Duration::from_millis(500));
        let mut publisher = Publisher::bind(TCP, &opts).unwrap();
        let addr = publisher.local_addr();
        let mut idle = ChildProc::spawn("idle", &addr, "");
        publisher.wait_for_subscribers(1, WAIT).unwrap();
        let idle_slot = publisher.subscribers()[0].slot;
        let mut reader = ChildProc::spawn("reader", &addr, "");
        publisher.wait_for_subscribers(2, WAIT).unwrap();
        // Publish until the idle one's socket is full (loopback buffers took about
        // 90,000 of these messages in `killed_remote_subscriber_frees_the_publisher`)
        // and its ring reader overtaken.
        let deadline = Instant::now() + WAIT;
        let mut seq = 0;
        loop {
            let subs = publisher.subscribers();
            if seq >= 300_000 && subs.iter().any(|s| s.slot == idle_slot && s.missed > 0) {
                break;
            }
            assert!(Instant::now() < deadline, "idle remote never overtaken");
            if subs
                .iter()
                .any(|s| s.slot != idle_slot && s.lag > slots as u64 / 2)
            {
                std::thread::yield_now();
                continue;
            }
            for _ in 0..16 {
                publish(&mut publisher, seq);
                seq += 1;
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let closing = Instant::now();
        std::thread::spawn(move || tx.send(publisher.close()).unwrap());
        rx.recv_timeout(WAIT)
            .expect("close did not return")
            .unwrap();
        eprintln!(
            "close with a stuck remote returned after {:?} (stall timeout 500 ms)",
            closing.elapsed()
        );
        assert_eq!(
            reader.report("result"),
            format!("first=0 received={seq} error=EndOfStream")
        );
        reader.expect_success();
        idle.sigkill();
        idle.expect_killed();
    });
}

/// One topic bound at `auto:`: two subscriber processes attach over shared memory, two
/// over `tcp:` (the same port); all four receive everything.
#[test]
fn local_shm_and_remote_tcp_subscribers_share_a_topic() {
    run("mixed shm and tcp", || {
        const TOTAL: u64 = 20_000;
        let opts = PubSubOptions::default().slots(1024).max_msg_size(64);
        let mut publisher = Publisher::bind("auto:127.0.0.1:0", &opts).unwrap();
        let auto = publisher.local_addr();
        let tcp = auto.replacen("auto:", "tcp:", 1);
        let mut children: Vec<_> = [&auto, &auto, &tcp, &tcp]
            .into_iter()
            .map(|a| ChildProc::spawn("reader", a, ""))
            .collect();
        publisher.wait_for_subscribers(4, WAIT).unwrap();
        let remote = || {
            let subs = publisher.subscribers();
            subs.iter().filter(|s| s.remote.is_some()).count()
        };
        assert!(common::wait_until(WAIT, || remote() == 2));
        for seq in 0..TOTAL {
            publish(&mut publisher, seq);
        }
        publisher.close().unwrap();
        expect_everything_received(&mut children, TOTAL);
    });
}

/// `auto:` on the publisher's kernel subscribes over shared memory; without the topic's
/// rendezvous socket it stays on TCP and still receives everything.
#[test]
fn auto_subscriber_picks_shm_locally_and_tcp_otherwise() {
    run("auto", || {
        let mut publisher =
            Publisher::bind("auto:127.0.0.1:0", &PubSubOptions::default().slots(256)).unwrap();
        let addr = publisher.local_addr();
        let mut local = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap();
        assert_eq!(local.transport(), shmlink::Transport::Shm);
        // Remove the rendezvous socket (its name carries the port): the next one stays
        // on TCP.
        let port = addr.rsplit(':').next().unwrap();
        let dir = shmlink::rendezvous_dir();
        let mut removed = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with(&format!("topic-{port}-")) {
                std::fs::remove_file(&p).unwrap();
                removed += 1;
            }
        }
        assert_eq!(removed, 1, "no topic socket for port {port} in {dir:?}");
        let mut remote = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap();
        assert_eq!(remote.transport(), shmlink::Transport::Tcp);
        publisher.wait_for_subscribers(2, WAIT).unwrap();
        for seq in 0..100 {
            publish(&mut publisher, seq);
        }
        publisher.close().unwrap();
        for sub in [&mut local, &mut remote] {
            assert_eq!(read_all(sub), "first=0 received=100 error=EndOfStream");
        }
    });
}

/// Late remote joiners replay the history they ask for; refusals (a topic full, messages
/// larger than the subscriber accepts) carry their reason over the network.
#[test]
fn remote_history_and_refusals() {
    run("history and refusals", || {
        let opts = PubSubOptions::default()
            .slots(64)
            .max_msg_size(64)
            .history(10)
            .max_subscribers(2)
            .max_remote_subscribers(2); // both are remote here
        let mut publisher = Publisher::bind(TCP, &opts).unwrap();
        let addr = publisher.local_addr();
        for seq in 0..20 {
            publish(&mut publisher, seq);
        }
        let mut all = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap();
        assert_eq!(all.position(), 10);
        let three = Subscriber::connect(&addr, &PubSubOptions::default().history(3)).unwrap();
        assert_eq!(three.position(), 17);
        let e = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
        assert!(e.to_string().contains("maximum of 2"), "{e}");
        drop(three);
        assert!(common::wait_until(WAIT, || publisher.subscriber_count() == 1));
        let e = Subscriber::connect(&addr, &PubSubOptions::default().max_msg_size(16)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("up to 64 bytes"), "{e}");
        publisher.close().unwrap();
        assert_eq!(read_all(&mut all), "first=10 received=10 error=EndOfStream");
    });
}

/// What waits in the ring goes out in one write as a `Batch` record: a raw client that
/// asks for a history of 100 messages gets its `Welcome`, then one record with all 100,
/// intact and in order, then each later message in a `Data` record of its own.
#[test]
fn waiting_messages_go_out_as_one_batch() {
    run("batch", || {
        let opts = PubSubOptions::default()
            .slots(256)
            .max_msg_size(64)
            .history(100);
        let mut publisher = Publisher::bind(TCP, &opts).unwrap();
        let addr = publisher.local_addr();
        for seq in 0..100 {
            publish(&mut publisher, seq);
        }
        let mut s = TcpStream::connect(addr.strip_prefix("tcp:").unwrap()).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.write_all(&topic_hello(1 << 20)).unwrap();
        s.read_exact(&mut [0u8; 16]).unwrap();
        // Subscribe: version 3, no flags, all the history offered, any size, no boot id.
        let subscribe = [&[1u8, 3, 0][..], &[0xff; 8], &[0; 8], &[0, 0]].concat();
        s.write_all(&frame(&subscribe)).unwrap();
        let mut next_record = || {
            let mut head = [0u8; 5];
            s.read_exact(&mut head).unwrap();
            assert_eq!(head[0], 1, "a data frame");
            let mut rec = vec![0u8; u32::from_le_bytes(head[1..].try_into().unwrap()) as usize];
            s.read_exact(&mut rec).unwrap();
            rec
        };
        assert_eq!(next_record()[0], 2, "Welcome");
        let batch = next_record();
        assert_eq!(batch[0], 8, "a Batch record");
        let (mut at, mut seq) = (1, 0);
        while at < batch.len() {
            let len = u32::from_le_bytes(batch[at..at + 4].try_into().unwrap()) as usize;
            assert_eq!(check(&batch[at + 4..at + 4 + len]), seq);
            (at, seq) = (at + 4 + len, seq + 1);
        }
        assert_eq!((at, seq), (batch.len(), 100));
        publish(&mut publisher, 100);
        let data = next_record();
        assert_eq!(data[0], 5, "a Data record");
        assert_eq!(check(&data[1..]), 100);
    });
}

/// `recv_timeout`: a blocking receive on an idle topic ends with `TimedOut` after about
/// the timeout (not before), the subscription stays usable and in order, and the end of
/// the stream is still reported as such; over `shm:`, `tcp:` and `auto:` (shared memory).
#[test]
fn recv_timeout_bounds_a_blocking_receive_and_keeps_the_subscription() {
    run("recv timeout", || {
        let timeout = Duration::from_millis(150);
        for bind in [
            fresh_addr("shm"),
            TCP.to_string(),
            "auto:127.0.0.1:0".into(),
        ] {
            let opts = PubSubOptions::default().slots(64).recv_timeout(timeout);
            let mut publisher = Publisher::bind(&bind, &opts).unwrap();
            let mut sub = Subscriber::connect(&publisher.local_addr(), &opts).unwrap();
            publisher.wait_for_subscribers(1, WAIT).unwrap();
            let mut buf = vec![0u8; 4096];
            for round in 0..2u64 {
                let t = Instant::now();
                let e = sub.recv(&mut buf).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::TimedOut, "{bind}: {e}");
                assert!(
                    t.elapsed() >= timeout,
                    "{bind}: woke after {:?}",
                    t.elapsed()
                );
                publish(&mut publisher, round);
                let n = sub.recv(&mut buf).unwrap();
                assert_eq!(check(&buf[..n]), round, "{bind}");
            }
            publisher.close().unwrap();
            let e = sub.recv(&mut buf).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::EndOfStream, "{bind}: {e}");
        }
        let zero = PubSubOptions::default().recv_timeout(Duration::ZERO);
        let e = Subscriber::connect(TCP, &zero).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("recv_timeout"), "{e}");
    });
}

/// `tls:` with the test certificates (mutual TLS): subscribe, receive, end of stream.
#[test]
fn tls_topic_smoke() {
    run("tls", || {
        let opts = PubSubOptions::default().options(opts("tls")).slots(64);
        let mut publisher = Publisher::bind("tls:127.0.0.1:0", &opts).unwrap();
        let addr = publisher.local_addr();
        assert!(addr.starts_with("tls:"), "{addr}");
        let o = opts.clone();
        let sub = std::thread::spawn(move || {
            let mut sub = Subscriber::connect(&addr, &o).unwrap();
            assert_eq!(sub.transport(), shmlink::Transport::Tls);
            read_all(&mut sub)
        });
        publisher.wait_for_subscribers(1, WAIT).unwrap();
        for seq in 0..1000 {
            publish(&mut publisher, seq);
        }
        publisher.close().unwrap();
        assert_eq!(
            sub.join().unwrap(),
            "first=0 received=1000 error=EndOfStream"
        );
    });
}

/// A point-to-point `Connection` that reaches a topic, and a `Subscriber` that reaches a
/// `Listener`, fail at once with `ProtocolViolation` naming the other side's role.
#[test]
fn wrong_role_peers_get_a_protocol_violation() {
    run("wrong role", || {
        for bind in [TCP, "auto:127.0.0.1:0"] {
            let publisher = Publisher::bind(bind, &PubSubOptions::default()).unwrap();
            let e = Connection::connect(&publisher.local_addr(), &Options::default()).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::ProtocolViolation, "{bind}: {e}");
            assert!(e.to_string().contains("publish/subscribe"), "{e}");
            // The topic still serves subscribers.
            Subscriber::connect(&publisher.local_addr(), &PubSubOptions::default()).unwrap();
        }
        for bind in [TCP, "auto:127.0.0.1:0"] {
            let mut listener = Listener::bind(bind, &Options::default()).unwrap();
            let addr = listener.local_addr();
            // The listener runs handshakes in `accept`: a subscriber, then a connection.
            let clients = std::thread::spawn(move || {
                let sub = Subscriber::connect(&addr, &PubSubOptions::default());
                let conn = Connection::connect(&addr, &Options::default());
                (sub.err(), conn.is_ok())
            });
            listener.accept().unwrap();
            let (e, conn_ok) = clients.join().unwrap();
            let e = e.expect("a subscriber to a listener must fail");
            assert_eq!(e.kind(), ErrorKind::ProtocolViolation, "{bind}: {e}");
            assert!(e.to_string().contains("point-to-point"), "{e}");
            assert!(conn_ok, "the listener still serves connections");
        }
    });
}

// ---------------------------------------------------------------------------------------
// Hostile bytes: a fake publisher and a fake subscriber that speak the framed hello and
// then break the record protocol.

/// A framed hello of the topic role announcing `max` bytes.
fn topic_hello(max: u64) -> Vec<u8> {
    let mut h = b"SLNK".to_vec();
    h.extend_from_slice(&[1, 1, 0, 0]);
    h.extend_from_slice(&max.to_le_bytes());
    h
}

/// A `tcp:` data frame carrying `payload`.
fn frame(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![1u8];
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

/// A welcome record: `block`, 64-byte messages, starting at 0.
fn welcome() -> Vec<u8> {
    let mut w = vec![2u8, 1];
    w.extend_from_slice(&64u64.to_le_bytes());
    w.extend_from_slice(&0u64.to_le_bytes());
    w
}

/// Serves one subscriber from a fake publisher that answers with `records`, then the
/// framed FIN; returns the messages the subscriber received and the error that ended its
/// connect or its `recv`s.
fn against_fake_publisher(records: Vec<Vec<u8>>) -> (Vec<Vec<u8>>, ErrorKind, String) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("tcp:{}", listener.local_addr().unwrap());
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut hello = [0u8; 16];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&topic_hello(1 << 20)).unwrap();
        let mut head = [0u8; 5];
        s.read_exact(&mut head).unwrap(); // the Subscribe frame
        let mut body = vec![0u8; u32::from_le_bytes(head[1..].try_into().unwrap()) as usize];
        s.read_exact(&mut body).unwrap();
        for r in records {
            s.write_all(&frame(&r)).unwrap();
        }
        s.write_all(&[2, 0, 0, 0, 0]).unwrap(); // FIN
                                                // Keep the socket open until the subscriber is done with it.
        let _ = s.read(&mut [0u8; 1]);
    });
    let opts = PubSubOptions::default().options(Options::default().connect_timeout(WAIT));
    let mut got = Vec::new();
    let e = match Subscriber::connect(&addr, &opts) {
        Err(e) => e,
        Ok(mut sub) => loop {
            match sub.recv_vec() {
                Ok(m) => got.push(m),
                Err(e) => break e,
            }
        },
    };
    server.join().unwrap();
    (got, e.kind(), e.to_string())
}

#[test]
fn hostile_publisher_bytes_are_protocol_violations() {
    run("hostile publisher", || {
        let bad_welcome = {
            let mut w = welcome();
            w[1] = 7;
            w
        };
        let cases: Vec<(Vec<Vec<u8>>, &str)> = vec![
            (vec![bad_welcome], "unknown policy"),
            (vec![[welcome(), vec![0]].concat()], "after its last field"),
            (vec![vec![]], "empty"),
            (vec![vec![99]], "unknown kind"),
            (vec![vec![5, 1, 2]], "publisher answered"), // Data before Welcome
            (
                vec![welcome(), [&[5u8][..], &[0; 65]].concat()],
                "maximum is 64",
            ),
            (
                vec![welcome(), [&[6u8][..], &[1, 0, 0, 0, 0, 0, 0, 0]].concat()],
                "policy",
            ),
            (vec![welcome(), welcome()], "unexpected record Welcome"),
            (vec![welcome(), vec![8]], "no message"),
            (vec![welcome(), vec![8, 2, 0, 0, 0, 1]], "truncated"),
            (vec![welcome(), vec![8, 0, 0, 0]], "truncated"),
            (
                vec![welcome(), [&[8u8, 65, 0, 0, 0][..], &[0; 65]].concat()],
                "maximum is 64",
            ),
            (
                vec![
                    welcome(),
                    [&[8u8, 0xff, 0xff, 0xff, 0xff][..], b"x"].concat(),
                ],
                "maximum is 64",
            ),
        ];
        for (records, want) in cases {
            let (got, kind, msg) = against_fake_publisher(records.clone());
            assert_eq!(kind, ErrorKind::ProtocolViolation, "{records:?}: {msg}");
            assert!(msg.contains(want), "{records:?}: {msg}");
            assert!(got.is_empty(), "{records:?}: delivered {got:?}");
        }
        // Well-formed streams pass, for contrast: data records and batches (with an empty
        // message) in order, then end of stream.
        let batch = [&[8u8, 2, 0, 0, 0][..], b"hi", &[0; 4], &[1, 0, 0, 0], b"!"].concat();
        let (got, kind, msg) = against_fake_publisher(vec![
            welcome(),
            [&[5u8][..], b"a"].concat(),
            batch,
            [&[5u8][..], b"z"].concat(),
        ]);
        assert_eq!(kind, ErrorKind::EndOfStream, "{msg}");
        let want: Vec<&[u8]> = vec![b"a", b"hi", b"", b"!", b"z"];
        assert_eq!(got, want);
    });
}

#[test]
fn hostile_subscriber_bytes_are_dropped_and_others_served() {
    run("hostile subscriber", || {
        let mut publisher = Publisher::bind(TCP, &PubSubOptions::default().slots(64)).unwrap();
        let addr = publisher.local_addr();
        let sock_addr = addr.strip_prefix("tcp:").unwrap().to_string();
        let garbage: Vec<Vec<u8>> = vec![
            vec![],
            vec![1],                                              // truncated Subscribe
            vec![1, 1, 0x80, 0, 0],                               // unknown flags, truncated
            vec![5, 1, 2, 3],                                     // Data from a subscriber
            [&[1u8, 1, 0][..], &[0; 16], &[0xff, 0xff]].concat(), // boot id too long
        ];
        for g in garbage {
            let mut s = TcpStream::connect(&sock_addr).unwrap();
            s.set_read_timeout(Some(WAIT)).unwrap();
            s.write_all(&topic_hello(1 << 20)).unwrap();
            let mut hello = [0u8; 16];
            s.read_exact(&mut hello).unwrap();
            assert_eq!(&hello[..6], b"SLNK\x01\x01", "the topic's hello");
            s.write_all(&frame(&g)).unwrap();
            // The publisher hangs up without admitting it.
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            assert!(rest.is_empty(), "{g:?}: answered {rest:?}");
        }
        assert_eq!(publisher.subscriber_count(), 0);
        let a = addr.clone();
        let sub = std::thread::spawn(move || {
            let mut sub = Subscriber::connect(&a, &PubSubOptions::default()).unwrap();
            read_all(&mut sub)
        });
        publisher.wait_for_subscribers(1, WAIT).unwrap();
        for seq in 0..10 {
            publish(&mut publisher, seq);
        }
        publisher.close().unwrap();
        assert_eq!(sub.join().unwrap(), "first=0 received=10 error=EndOfStream");
    });
}
