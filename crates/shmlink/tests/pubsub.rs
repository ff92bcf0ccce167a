//! Publish/subscribe between processes: fan-out to 1, 4 and 64 subscriber processes
//! under `block`, exact loss counts under `overwrite`, a subscriber or the publisher
//! killed with SIGKILL, graceful close, a stalled subscriber detached, a hostile
//! subscriber, late joiners with history, non-blocking mode and fds.
//!
//! The other processes are this test binary run again (see [`pubsub_common`]).
//!
//! Message counts: the fan-out tests send 1,000,000 messages to 1, 4 and 64 subscribers
//! (about 40 s for 64 in a debug build on two CPUs).

mod common;
mod pubsub_common;

use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::fresh_addr;
use pubsub_common::*;
use shmlink::{
    Connection, ErrorKind, Listener, Options, Policy, PubSubOptions, Publisher, Subscriber,
};

// ---------------------------------------------------------------------------------------
// The tests.

#[test]
fn block_fan_out_to_1_subscriber_process() {
    run("fan-out 1", || fan_out(1, 1_000_000));
}

#[test]
fn block_fan_out_to_4_subscriber_processes() {
    run("fan-out 4", || fan_out(4, 1_000_000));
}

#[test]
fn block_fan_out_to_64_subscriber_processes() {
    run("fan-out 64", || fan_out(64, 1_000_000));
}

/// `subs` subscriber processes each receive all `total` messages, in order, intact,
/// then end-of-stream.
fn fan_out(subs: usize, total: u64) {
    let addr = fresh_addr("shm");
    // Up to 64 processes share this machine's CPUs: a subscriber may not run for a
    // second while the publisher waits for it, and the stricter stall rule (catch up
    // within the timeout) would detach it; what this test checks is delivery.
    let opts = PubSubOptions::default()
        .slots(4096)
        .max_msg_size(64)
        .stall_timeout(Duration::from_secs(30));
    let mut publisher = Publisher::bind(&addr, &opts).unwrap();
    let mut children: Vec<_> = (0..subs)
        .map(|_| ChildProc::spawn("reader", &addr, ""))
        .collect();
    publisher.wait_for_subscribers(subs, WAIT).unwrap();
    let cpu = shmlink_sys::cpu_time();
    let t = Instant::now();
    for seq in 0..total {
        publish(&mut publisher, seq);
    }
    let (elapsed, cpu) = (t.elapsed(), shmlink_sys::cpu_time() - cpu);
    let stats = publisher.stats();
    assert_eq!(stats.detached, 0, "{stats:?}");
    publisher.close().unwrap();
    expect_everything_received(&mut children, total);
    eprintln!(
        "{subs} subscribers x {total} messages: {:.0} msgs/s, publisher CPU {:.0} ns/msg (test process)",
        total as f64 / elapsed.as_secs_f64(),
        cpu.as_nanos() as f64 / total as f64
    );
}

/// Under `overwrite` with a deliberately slow subscriber: the fast ones (which the test
/// keeps up with) lose nothing; the slow one's reported losses equal the gaps in the
/// sequence numbers it received, event by event and in total.
#[test]
fn overwrite_slow_subscriber_reports_exactly_what_it_missed() {
    run("overwrite slow", || {
        let total = 1_000_000;
        let slots = 256;
        let addr = fresh_addr("shm");
        let opts = PubSubOptions::default()
            .slots(slots)
            .max_msg_size(64)
            .policy(Policy::Overwrite);
        let mut publisher = Publisher::bind(&addr, &opts).unwrap();
        let mut fast: Vec<_> = (0..2)
            .map(|_| ChildProc::spawn("reader", &addr, ""))
            .collect();
        let mut slow = ChildProc::spawn("slow", &addr, "");
        publisher.wait_for_subscribers(3, WAIT).unwrap();
        let slow_pid = slow.id() as i32;
        for seq in 0..total {
            if seq % 32 == 0 {
                keep_within_half_the_ring(&publisher, slots, |s| s.pid != slow_pid);
            }
            publish(&mut publisher, seq);
        }
        publisher.close().unwrap();
        expect_everything_received(&mut fast, total);
        expect_exact_losses(&mut slow, total, "slow subscriber");
    });
}

/// Under `block`, a subscriber that stops reading holds the publisher up; SIGKILL frees
/// the publisher at once (long before the stall timeout) and frees the slot for a new
/// subscriber.
#[test]
fn killed_subscriber_frees_the_publisher_and_its_slot() {
    run("subscriber sigkill", || {
        let addr = fresh_addr("shm");
        let opts = PubSubOptions::default()
            .slots(16)
            .max_msg_size(64)
            .max_subscribers(2)
            .stall_timeout(Duration::from_secs(120));
        let mut publisher = Publisher::bind(&addr, &opts).unwrap();
        let (reader, mut idle) = reader_and_idle_fill_the_topic(&mut publisher, &addr);

        publisher.set_nonblocking(true);
        let mut seq = 0;
        loop {
            match try_publish(&mut publisher, seq) {
                Ok(()) => seq += 1,
                Err(ErrorKind::WouldBlock) => break,
                Err(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(seq, 16, "the idle subscriber holds the ring");
        // The reader caught up; the publisher is still held by the idle one.
        assert!(common::wait_until(WAIT, || publisher
            .subscribers()
            .iter()
            .any(|s| s.lag == 0)));
        assert_eq!(
            publisher.loan(16).err().map(|e| e.kind()),
            Some(ErrorKind::WouldBlock)
        );
        assert!(!readable(&publisher, Duration::ZERO));

        let killed = idle.sigkill();
        // The publisher's fd turns readable and the publish goes through.
        publish_once_freed(&mut publisher, seq, killed);
        seq += 1;
        let freed = killed.elapsed();
        eprintln!("SIGKILL -> publisher free after {freed:?} (stall timeout 120 s)");
        idle.expect_killed();
        assert_eq!(publisher.subscriber_count(), 1);

        // The slot is free: a new subscriber takes it and receives what follows.
        late_subscriber_takes_the_slot(publisher, &addr, seq, reader);
    });
}

/// The same with the publisher blocked in `publish` (blocking mode, parked in the
/// kernel): SIGKILL of the subscriber it waits for returns the call promptly.
#[test]
fn killed_subscriber_returns_a_blocked_publish() {
    run("subscriber sigkill, blocking publish", || {
        let addr = fresh_addr("shm");
        let opts = PubSubOptions::default()
            .slots(16)
            .max_msg_size(64)
            .stall_timeout(Duration::from_secs(120));
        let mut publisher = Publisher::bind(&addr, &opts).unwrap();
        let mut idle = ChildProc::spawn("idle", &addr, "");
        publisher.wait_for_subscribers(1, WAIT).unwrap();
        for seq in 0..16 {
            publish(&mut publisher, seq);
        }
        let (tx, rx) = mpsc::channel();
        let blocked = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            publish(&mut publisher, 16); // blocks: the idle subscriber holds slot 0
            (Instant::now(), publisher)
        });
        let tid = rx.recv().unwrap();
        // Parked, not spinning: the thread goes to sleep in the kernel (state S) and
        // stays in `publish` (the subscriber reads nothing).
        let parked = || {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
                .ok()
                .and_then(|stat| {
                    stat.rsplit_once(") ")
                        .map(|(_, rest)| rest.starts_with('S'))
                })
                .unwrap_or(false)
        };
        assert!(common::wait_until(WAIT, || blocked.is_finished() || parked()));
        assert!(
            !blocked.is_finished(),
            "publish did not wait for the subscriber"
        );
        let killed = idle.sigkill();
        assert!(
            common::wait_until(WAIT, || blocked.is_finished()),
            "publish still blocked after SIGKILL"
        );
        let (done, publisher) = blocked.join().unwrap();
        let after = done.duration_since(killed);
        eprintln!("SIGKILL -> blocked publish returned after {after:?} (stall timeout 120 s)");
        assert!(after < Duration::from_secs(5), "{after:?}");
        idle.expect_killed();
        assert_eq!(publisher.subscriber_count(), 0);
        assert_eq!(publisher.stats().published, 17);
    });
}

/// Under `block`, a live subscriber that reads nothing for the stall timeout is
/// detached: the publisher goes on, the subscriber's next `recv` says `Detached`, and it
/// may subscribe again.
#[test]
fn stalled_subscriber_is_detached_and_may_resubscribe() {
    run("stall", || {
        let addr = fresh_addr("shm");
        let stall = Duration::from_millis(300);
        let opts = PubSubOptions::default()
            .slots(16)
            .max_msg_size(64)
            .stall_timeout(stall);
        let mut publisher = Publisher::bind(&addr, &opts).unwrap();
        let mut reader = ChildProc::spawn("reader", &addr, "");
        let mut stalled = ChildProc::spawn("stall", &addr, "");
        publisher.wait_for_subscribers(2, WAIT).unwrap();
        for seq in 0..16 {
            publish(&mut publisher, seq);
        }
        let t = Instant::now();
        publish(&mut publisher, 16); // waits for the stalled one, then detaches it
        let held = t.elapsed();
        eprintln!("publisher held {held:?} by a stalled subscriber (stall timeout {stall:?})");
        assert!(held >= stall, "detached before the stall timeout: {held:?}");
        assert!(held < stall + Duration::from_secs(10), "{held:?}");
        assert_eq!(publisher.stats().detached, 1);
        assert_eq!(publisher.subscriber_count(), 1);
        stalled.say("go");
        assert_eq!(stalled.report("detached"), "error=Detached");
        publisher.wait_for_subscribers(2, WAIT).unwrap(); // it subscribed again
        for seq in 17..100 {
            publish(&mut publisher, seq);
        }
        publisher.close().unwrap();
        assert_eq!(
            reader.report("result"),
            "first=0 received=100 error=EndOfStream"
        );
        // Subscribed again before message 17, with no history: 17 to 99.
        assert_eq!(
            stalled.report("result"),
            "first=17 received=83 error=EndOfStream"
        );
        reader.expect_success();
        stalled.expect_success();
    });
}

/// A publisher killed with SIGKILL: every subscriber — blocked in `recv`, or waiting on
/// its fd in non-blocking mode — gets `ConnectionReset` promptly, after every message
/// published before.
#[test]
fn killed_publisher_resets_every_subscriber() {
    run("publisher sigkill", || {
        const SUBS: usize = 4;
        const SENT: u64 = 500;
        let addr = fresh_addr("shm");
        let mut publisher = ChildProc::spawn("publisher", &addr, &format!("{SUBS} {SENT}"));
        publisher.report("bound");
        let (tx, rx) = mpsc::channel();
        let threads: Vec<_> = (0..SUBS)
            .map(|i| {
                let (addr, tx) = (addr.clone(), tx.clone());
                std::thread::spawn(move || {
                    let mut sub = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap();
                    let nonblocking = i == 0;
                    sub.set_nonblocking(nonblocking);
                    let mut buf = [0u8; 64];
                    let mut got = 0;
                    let err = loop {
                        match sub.recv(&mut buf) {
                            Ok(n) => {
                                assert_eq!(check(&buf[..n]), got);
                                got += 1;
                                if got == SENT {
                                    tx.send(()).unwrap();
                                }
                            }
                            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                                assert!(readable(&sub, WAIT), "fd never turned readable");
                            }
                            Err(e) => break e,
                        }
                    };
                    (got, err.kind(), Instant::now())
                })
            })
            .collect();
        for _ in 0..SUBS {
            rx.recv_timeout(WAIT)
                .expect("a subscriber did not get every message");
        }
        let killed = publisher.sigkill();
        publisher.expect_killed();
        for t in threads {
            assert!(
                common::wait_until(WAIT, || t.is_finished()),
                "subscriber still blocked"
            );
            let (got, kind, at) = t.join().unwrap();
            let after = at.duration_since(killed);
            eprintln!("SIGKILL -> {kind:?} after {after:?}");
            assert_eq!((got, kind), (SENT, ErrorKind::ConnectionReset));
            assert!(after < Duration::from_secs(2), "reset took {after:?}");
        }
    });
}

/// `resubscribe(true)`: a blocking subscriber outlives its publishers — one SIGKILLed,
/// one closed gracefully — and joins each next one at the same address, reporting
/// `Resubscribed` once per gap, with every message of each publisher in order and none
/// repeated.
#[test]
fn resubscribing_subscriber_outlives_killed_and_closed_publishers() {
    run("resubscribe", || {
        const FIRST: u64 = 300;
        let addr = fresh_addr("shm");
        let mut first = ChildProc::spawn("publisher", &addr, &format!("1 {FIRST}"));
        first.report("bound");
        let opts = PubSubOptions::default().resubscribe(true).history(0);
        let mut sub = Subscriber::connect(&addr, &opts).unwrap();
        let reader = std::thread::spawn(move || {
            // What arrived, in order: each publisher's sequence numbers, and "gap" for
            // each Resubscribed.
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while seen.len() < (FIRST + 2 + 100 + 10) as usize {
                match sub.recv(&mut buf) {
                    Ok(n) => seen.push(check(&buf[..n]).to_string()),
                    Err(e) if e.kind() == ErrorKind::Resubscribed => {
                        assert!(e.to_string().contains("subscribed again"), "{e}");
                        seen.push("gap".into());
                    }
                    Err(e) => panic!("the subscription ended: {e}"),
                }
            }
            seen
        });
        first.report("sent");
        first.sigkill();
        first.expect_killed();
        for count in [100, 10] {
            let mut p = Publisher::bind(&addr, &PubSubOptions::default()).unwrap();
            p.wait_for_subscribers(1, WAIT).unwrap();
            for seq in 0..count {
                publish(&mut p, seq);
            }
            p.close().unwrap();
        }
        assert!(
            common::wait_until(WAIT, || reader.is_finished()),
            "reader stuck"
        );
        let seen = reader.join().unwrap();
        let want: Vec<String> = (0..FIRST)
            .map(|s| s.to_string())
            .chain(["gap".to_string()])
            .chain((0..100).map(|s| s.to_string()))
            .chain(["gap".to_string()])
            .chain((0..10).map(|s| s.to_string()))
            .collect();
        assert_eq!(seen, want);
    });
}

/// In non-blocking mode the end is reported as usual; `resubscribe()` then makes one
/// attempt: refused while nobody is bound (the subscriber stays as it was), and on
/// success a new fd, still non-blocking, that turns readable with the new publisher's
/// messages.
#[test]
fn resubscribe_by_hand_in_nonblocking_mode() {
    run("resubscribe by hand", || {
        let addr = fresh_addr("shm");
        let p = Publisher::bind(&addr, &PubSubOptions::default()).unwrap();
        let opts = PubSubOptions::default().resubscribe(true);
        let mut sub = Subscriber::connect(&addr, &opts).unwrap();
        sub.set_nonblocking(true);
        p.close().unwrap();
        assert!(readable(&sub, WAIT));
        assert_eq!(sub.recv_vec().unwrap_err().kind(), ErrorKind::EndOfStream);
        let e = sub.resubscribe().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
        assert_eq!(sub.recv_vec().unwrap_err().kind(), ErrorKind::EndOfStream);
        let mut p = Publisher::bind(&addr, &PubSubOptions::default()).unwrap();
        sub.resubscribe().unwrap();
        assert!(sub.is_nonblocking());
        assert_eq!(sub.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
        publish(&mut p, 0);
        assert!(readable(&sub, WAIT), "the new fd never turned readable");
        assert_eq!(check(&sub.recv_vec().unwrap()), 0);
    });
}

/// A publisher that closes right after publishing: every subscriber receives every
/// message — reading them after the publisher is gone — then end-of-stream, again and
/// again; the address is free afterwards.
#[test]
fn graceful_close_is_end_of_stream_after_the_last_message() {
    run("graceful close", || {
        let addr = fresh_addr("shm");
        let opts = PubSubOptions::default().slots(1024).max_msg_size(64);
        let mut publisher = Publisher::bind(&addr, &opts).unwrap();
        let mut children: Vec<_> = (0..3)
            .map(|_| ChildProc::spawn("wait-then-read", &addr, ""))
            .collect();
        let mut local = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap();
        publisher.wait_for_subscribers(4, WAIT).unwrap();
        for seq in 0..1000 {
            publish(&mut publisher, seq);
        }
        publisher.close().unwrap();
        for c in &mut children {
            c.say("go"); // read only now, with the publisher closed
            assert_eq!(
                c.report("result"),
                "first=0 received=1000 error=EndOfStream"
            );
            c.expect_success();
        }
        for seq in 0..1000 {
            assert_eq!(check(&local.recv_vec().unwrap()), seq);
        }
        for _ in 0..3 {
            assert_eq!(local.recv_vec().unwrap_err().kind(), ErrorKind::EndOfStream);
        }
        let e = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
        Publisher::bind(&addr, &opts).unwrap();
    });
}

/// A hostile subscriber cannot write the topic (every attempt fails), and whatever it
/// writes into what it can write — the bell page, its cursor page, its socket — the
/// other subscribers read every message intact, under both policies. Every message is
/// published with the hostile member in the topic: under `block` the publisher detaches
/// it for its scribbled cursor, and it subscribes again (the publisher waits for that);
/// it is alive at the end.
#[test]
fn hostile_subscriber_cannot_corrupt_what_others_read() {
    run("hostile", || {
        for policy in [Policy::Block, Policy::Overwrite] {
            let total = 200_000;
            let slots = 256;
            let addr = fresh_addr("shm");
            let opts = PubSubOptions::default()
                .slots(slots)
                .max_msg_size(64)
                .policy(policy)
                .stall_timeout(Duration::from_millis(200));
            let mut publisher = Publisher::bind(&addr, &opts).unwrap();
            let mut honest: Vec<_> = (0..2)
                .map(|_| ChildProc::spawn("reader", &addr, ""))
                .collect();
            publisher.wait_for_subscribers(2, WAIT).unwrap();
            let honest_pids: Vec<i32> = honest.iter().map(|c| c.id() as i32).collect();
            let mut hostile = ChildProc::spawn("hostile", &addr, "");
            let attacks = hostile.report("attacked");
            eprintln!("{policy:?}: hostile subscriber's attacks on the topic: {attacks}");
            assert!(!attacks.contains("OK"), "an attack went through: {attacks}");
            hostile.report("scribbling");
            for seq in 0..total {
                // The honest two and the hostile one (after a detachment, once it is back).
                publisher.wait_for_subscribers(3, WAIT).unwrap();
                if policy == Policy::Overwrite && seq % 32 == 0 {
                    // Keep the honest ones within the ring: they must lose nothing.
                    let deadline = Instant::now() + WAIT;
                    while publisher
                        .subscribers()
                        .iter()
                        .any(|s| honest_pids.contains(&s.pid) && s.lag > slots as u64 / 2)
                    {
                        assert!(Instant::now() < deadline, "honest subscribers stopped");
                        std::thread::yield_now();
                    }
                }
                publish(&mut publisher, seq);
            }
            publisher.wait_for_subscribers(3, WAIT).unwrap();
            let stats = publisher.stats();
            let pids: Vec<i32> = publisher.subscribers().iter().map(|s| s.pid).collect();
            eprintln!("{policy:?}: publisher after the attack: {stats:?}");
            // Nobody left; everyone who joined besides the three members now was detached
            // (the hostile one's earlier subscriptions: the honest ones are members).
            assert_eq!(stats.published, total, "{stats:?}");
            assert_eq!((stats.subscribers, stats.left), (3, 0), "{stats:?}");
            assert_eq!(stats.joined, 3 + stats.detached, "{stats:?}");
            assert!(
                honest_pids.iter().all(|p| pids.contains(p))
                    && pids.contains(&(hostile.id() as i32)),
                "members {pids:?}: honest {honest_pids:?}, hostile {}",
                hostile.id()
            );
            if policy == Policy::Block {
                // The publisher reads every cursor at least once per lap of the ring.
                assert!(
                    stats.detached > 0,
                    "the scribbled cursor went unnoticed: {stats:?}"
                );
            }
            hostile.sigkill();
            hostile.expect_killed(); // it was alive until now
            publisher.close().unwrap();
            expect_everything_received(&mut honest, total);
        }
    });
}

/// Late joiners start with the next message, or replay the history they ask for (up to
/// what the publisher keeps).
#[test]
fn late_joiners_replay_history_or_start_with_the_next_message() {
    run("history", || {
        for policy in [Policy::Block, Policy::Overwrite] {
            let addr = fresh_addr("shm");
            let opts = PubSubOptions::default()
                .slots(64)
                .max_msg_size(64)
                .policy(policy)
                .history(10);
            let mut publisher = Publisher::bind(&addr, &opts).unwrap();
            for seq in 0..100 {
                publish(&mut publisher, seq); // nobody listens yet
            }
            let join = |history: Option<u64>| {
                let mut o = PubSubOptions::default();
                if let Some(h) = history {
                    o = o.history(h);
                }
                let mut s = Subscriber::connect(&addr, &o).unwrap();
                s.set_nonblocking(true);
                s
            };
            let mut all = join(None); // everything the publisher keeps: 10
            let mut three = join(Some(3));
            let mut none = join(Some(0));
            let mut more = join(Some(1000)); // asks for more than kept
            publisher.wait_for_subscribers(4, WAIT).unwrap();
            let drain = |s: &mut Subscriber| -> Vec<u64> {
                let mut got = Vec::new();
                loop {
                    match s.recv_vec() {
                        Ok(m) => got.push(check(&m)),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => return got,
                        Err(e) => panic!("{policy:?}: {e}"),
                    }
                }
            };
            assert_eq!(drain(&mut all), (90..100).collect::<Vec<_>>(), "{policy:?}");
            assert_eq!(
                drain(&mut three),
                (97..100).collect::<Vec<_>>(),
                "{policy:?}"
            );
            assert_eq!(drain(&mut none), Vec::<u64>::new(), "{policy:?}");
            assert_eq!(
                drain(&mut more),
                (90..100).collect::<Vec<_>>(),
                "{policy:?}"
            );
            for seq in 100..110 {
                publish(&mut publisher, seq);
            }
            for s in [&mut all, &mut three, &mut none, &mut more] {
                assert_eq!(drain(s), (100..110).collect::<Vec<_>>(), "{policy:?}");
            }
        }
    });
}

/// Non-blocking mode: a subscriber's fd turns readable when a message arrives; a
/// publisher held by a subscriber gets `WouldBlock`, and its fd turns readable when the
/// subscriber reads. Counters follow.
#[test]
fn nonblocking_mode_and_fds() {
    run("nonblocking", || {
        let addr = fresh_addr("shm");
        let opts = PubSubOptions::default().slots(4).max_msg_size(64);
        let mut publisher = Publisher::bind(&addr, &opts).unwrap();
        let mut sub = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap();
        publisher.wait_for_subscribers(1, WAIT).unwrap();
        sub.set_nonblocking(true);
        publisher.set_nonblocking(true);
        assert_eq!(sub.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
        assert!(!readable(&sub, Duration::ZERO));
        publish(&mut publisher, 0);
        assert!(readable(&sub, WAIT), "subscriber fd did not turn readable");
        assert_eq!(check(&sub.recv_vec().unwrap()), 0);
        for seq in 1..5 {
            publish(&mut publisher, seq);
        }
        let info = publisher.subscribers();
        assert_eq!(info.len(), 1);
        assert_eq!((info[0].lag, info[0].pid), (4, std::process::id() as i32));
        assert_eq!(sub.stats().lag, 4);
        let e = publisher.loan(16).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::WouldBlock);
        assert!(!readable(&publisher, Duration::ZERO));
        let msg = sub.recv_ref().unwrap();
        assert_eq!(check(&msg.to_vec().unwrap()), 1);
        assert!(msg.intact());
        drop(msg);
        assert!(
            readable(&publisher, WAIT),
            "publisher fd did not turn readable"
        );
        publish(&mut publisher, 5);
        for seq in 2..6 {
            assert_eq!(check(&sub.recv_vec().unwrap()), seq);
        }
        let s = sub.stats();
        assert_eq!((s.received, s.missed, s.lag), (6, 0, 0));
        assert_eq!(publisher.stats().published, 6);
        // Oversized messages are refused, and a subscriber buffer too small keeps it.
        let e = publisher.publish(&[0u8; 65]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MessageTooLarge);
        publish(&mut publisher, 6);
        let mut small = [0u8; 8];
        assert_eq!(
            sub.recv(&mut small).unwrap_err().kind(),
            ErrorKind::MessageTooLarge
        );
        assert_eq!(check(&sub.recv_vec().unwrap()), 6);
    });
}

/// A background subscriber's doorbell is rung after the others': three subscribers
/// asleep, the background one first to join (so in the lowest slot, which is rung first
/// otherwise); one publication rings all three before it returns, and an epoll lists
/// ready fds in the order they became ready.
#[test]
fn background_subscribers_are_woken_last() {
    run("background", || {
        let addr = fresh_addr("shm");
        let opts = PubSubOptions::default().max_msg_size(64);
        let mut publisher = Publisher::bind(&addr, &opts).unwrap();
        let background = PubSubOptions::default().background(true);
        let mut subs = vec![Subscriber::connect(&addr, &background).unwrap()];
        for _ in 0..2 {
            subs.push(Subscriber::connect(&addr, &PubSubOptions::default()).unwrap());
        }
        publisher.wait_for_subscribers(3, WAIT).unwrap();
        // SAFETY: epoll_create1 with a valid flag; the fd is closed below.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0, "epoll_create1 failed");
        for (i, sub) in subs.iter_mut().enumerate() {
            sub.set_nonblocking(true);
            // An empty look announces sleep: the next message rings this doorbell.
            assert_eq!(sub.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: i as u64,
            };
            // SAFETY: a valid epoll fd, the subscriber's open fd, a valid event.
            let r = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, sub.as_raw_fd(), &mut ev) };
            assert_eq!(r, 0, "epoll_ctl failed");
        }
        publish(&mut publisher, 0);
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: a valid epoll fd and room for 4 events.
        let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 4, 10_000) };
        // SAFETY: our own epoll fd, closed once.
        unsafe { libc::close(ep) };
        let order: Vec<u64> = evs[..n.max(0) as usize].iter().map(|e| e.u64).collect();
        assert_eq!(
            order,
            [1, 2, 0],
            "the background subscriber (0) must be rung last"
        );
        for sub in &mut subs {
            assert_eq!(check(&sub.recv_vec().unwrap()), 0);
        }
    });
}

/// Zero-copy on both ends under `overwrite`: a message borrowed in place that the
/// publisher laps is reported as no longer intact, and the next `recv` reports exactly
/// the messages lost; a loan may publish fewer bytes than it reserved.
#[test]
fn overwrite_lapping_a_borrowed_message_is_detected() {
    run("overwrite borrow", || {
        let addr = fresh_addr("shm");
        let opts = PubSubOptions::default()
            .slots(4)
            .max_msg_size(64)
            .policy(Policy::Overwrite);
        let mut publisher = Publisher::bind(&addr, &opts).unwrap();
        let mut sub = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap();
        publisher.wait_for_subscribers(1, WAIT).unwrap();
        let mut loan = publisher.loan(64).unwrap();
        fill(0, &mut loan[..msg_len(0)]);
        loan.publish_len(msg_len(0)).unwrap();
        let msg = sub.recv_ref().unwrap();
        assert_eq!((check(&msg.to_vec().unwrap()), msg.position()), (0, 0));
        assert!(msg.intact());
        // The publisher never waits: it laps the borrowed message.
        for seq in 1..10 {
            publish(&mut publisher, seq);
        }
        assert!(!msg.intact(), "a lapped message still looks intact");
        // What a copy would get now is torn: the sample refuses to hand it over.
        assert_eq!(
            msg.to_vec(),
            None,
            "a lapped message was copied as if intact"
        );
        assert_eq!(msg.copy_to(&mut [0u8; 64]), None);
        drop(msg);
        let e = sub.recv_vec().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Lagged, "{e}");
        // 10 written, 4 slots: 6..10 are in the ring, 0..6 are lost.
        assert_eq!(e.missed(), Some(6), "{e}");
        for seq in 6..10 {
            assert_eq!(check(&sub.recv_vec().unwrap()), seq);
        }
        let s = sub.stats();
        assert_eq!((s.received, s.missed, s.lag), (4, 6, 0));
        assert_eq!(publisher.subscribers()[0].missed, 6);
    });
}

/// Plain `shm:` peers and publish/subscribe peers that meet are refused with a reason.
#[test]
fn wrong_kind_of_peer_is_refused_with_a_reason() {
    run("wrong peer", || {
        let topic = fresh_addr("shm");
        let _publisher = Publisher::bind(&topic, &PubSubOptions::default()).unwrap();
        let e = Connection::connect(&topic, &Options::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ProtocolViolation, "{e}");
        assert!(e.to_string().contains("publish/subscribe topic"), "{e}");

        let plain = fresh_addr("shm");
        let mut listener = Listener::bind(&plain, &Options::default()).unwrap();
        listener.set_nonblocking(true);
        let a = plain.clone();
        let sub = std::thread::spawn(move || Subscriber::connect(&a, &PubSubOptions::default()));
        // The listener answers handshakes while it accepts.
        while !sub.is_finished() {
            match listener.accept() {
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    readable(&listener, Duration::from_millis(10));
                }
                other => panic!("accepted a subscriber: {other:?}"),
            }
        }
        let e = sub.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ProtocolViolation, "{e}");
        assert!(e.to_string().contains("a publisher?"), "{e}");

        let small = PubSubOptions::default().max_msg_size(100);
        let e = Subscriber::connect(&topic, &small).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("4080"), "{e}");
    });
}

/// The child processes' entry point (see [`pubsub_common::child_main`]).
#[test]
#[ignore = "the child processes of the other tests, which run it with --ignored"]
fn child_main() {
    pubsub_common::child_main();
}
