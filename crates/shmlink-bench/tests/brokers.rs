//! The broker clients (the `redis` crate and `lapin`, wrapped in `brokers::{redis,amqp}`)
//! against real brokers (`scripts/brokers.sh start`), every byte of every message checked
//! at every subscriber, and against fake servers that are not brokers.
//!
//! A test that needs a broker that is not reachable is skipped with the reason
//! (`shmlink_testkit::skip`), or fails where `SHMLINK_REQUIRE` names `brokers` (CI). Every
//! read has a deadline.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use shmlink_bench::brokers::{self, amqp, redis};

/// How long a subscriber waits for any one message before the test fails.
const READ_DEADLINE: Duration = Duration::from_secs(30);

/// The broker's address, or `None` once the test is skipped for the reason (a failure
/// where `SHMLINK_REQUIRE` names `brokers`).
fn broker(addr: Result<SocketAddr, String>) -> Option<SocketAddr> {
    match addr {
        Ok(addr) => Some(addr),
        Err(reason) => {
            shmlink_testkit::skip("brokers", reason);
            None
        }
    }
}

/// A channel or exchange name no other test (or run) uses.
fn unique(what: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "shmlink-test-{what}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Message `seq` of `size` bytes (at least 8): a fixed pseudo-random pattern with the
/// sequence number in the first and (when it fits) the last 8 bytes, so that lost,
/// reordered, truncated or shuffled parts all show.
struct Messages {
    base: Vec<u8>,
}

impl Messages {
    fn new(size: usize) -> Messages {
        assert!(size >= 8);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let base = (0..size)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        Messages { base }
    }

    fn make(&self, seq: u64, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.base);
        out[..8].copy_from_slice(&seq.to_le_bytes());
        let n = out.len();
        if n >= 16 {
            out[n - 8..].copy_from_slice(&seq.to_le_bytes());
        }
    }

    /// Panics unless `msg` is message `seq`.
    fn check(&self, who: &str, seq: u64, msg: &[u8]) {
        assert_eq!(
            msg.len(),
            self.base.len(),
            "{who}: message {seq} has the wrong length"
        );
        let got = u64::from_le_bytes(msg[..8].try_into().unwrap());
        assert_eq!(got, seq, "{who}: message {got} where {seq} was expected");
        let n = msg.len();
        if n >= 16 {
            assert_eq!(
                &msg[n - 8..],
                &seq.to_le_bytes(),
                "{who}: message {seq} has a wrong tail"
            );
            assert!(
                msg[8..n - 8] == self.base[8..n - 8],
                "{who}: message {seq} is corrupted"
            );
        }
    }
}

/// A subscriber of either broker, as the fan-out test drives it.
trait Sub: Send + 'static {
    fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<()>;
    fn close(self) -> io::Result<()>;
}

impl Sub for redis::Subscriber {
    fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        redis::Subscriber::recv(self, buf)
    }

    fn close(self) -> io::Result<()> {
        Ok(())
    }
}

impl Sub for amqp::Subscriber {
    fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        amqp::Subscriber::recv(self, buf)
    }

    fn close(self) -> io::Result<()> {
        amqp::Subscriber::close(self)
    }
}

/// Starts `subscribers` threads that each connect (with `connect`), say they are ready, then
/// receive and check `count` messages of `size` bytes. Returns once all are ready, with a
/// handle per thread.
fn start_subscribers<S: Sub>(
    subscribers: usize,
    count: u64,
    size: usize,
    connect: impl Fn() -> io::Result<S> + Send + Clone + 'static,
) -> Vec<thread::JoinHandle<()>> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let handles = (0..subscribers)
        .map(|i| {
            let (connect, ready_tx) = (connect.clone(), ready_tx.clone());
            thread::spawn(move || {
                let who = format!("subscriber {i}");
                let mut sub = connect().unwrap_or_else(|e| panic!("{who}: connect: {e}"));
                ready_tx.send(()).unwrap();
                let messages = Messages::new(size);
                let mut buf = Vec::new();
                for seq in 0..count {
                    sub.recv(&mut buf)
                        .unwrap_or_else(|e| panic!("{who}: recv of message {seq}: {e}"));
                    messages.check(&who, seq, &buf);
                }
                sub.close().unwrap_or_else(|e| panic!("{who}: close: {e}"));
            })
        })
        .collect();
    for _ in 0..subscribers {
        ready_rx
            .recv_timeout(READ_DEADLINE)
            .expect("a subscriber did not get ready (see its panic)");
    }
    handles
}

fn join(handles: Vec<thread::JoinHandle<()>>) {
    for h in handles {
        if let Err(panic) = h.join() {
            std::panic::resume_unwind(panic);
        }
    }
}

fn redis_fanout(count: u64, size: usize) {
    let Some(addr) = broker(brokers::redis_addr()) else {
        return;
    };
    let channel = unique("redis");
    let started = Instant::now();
    let handles = start_subscribers(2, count, size, {
        let channel = channel.clone();
        move || {
            let mut sub = redis::Subscriber::connect(addr, &channel)?;
            sub.set_read_timeout(Some(READ_DEADLINE))?;
            Ok(sub)
        }
    });
    let mut publisher = redis::Publisher::connect(addr, &channel).unwrap();
    publisher.wait_for_subscribers(2, READ_DEADLINE).unwrap();
    let messages = Messages::new(size);
    let mut msg = Vec::new();
    for seq in 0..count {
        messages.make(seq, &mut msg);
        publisher.publish(&msg).unwrap();
    }
    join(handles);
    println!(
        "redis: {count} x {size} B to 2 subscribers in {:?}",
        started.elapsed()
    );
}

fn amqp_fanout(count: u64, size: usize) {
    let Some(addr) = broker(brokers::amqp_addr()) else {
        return;
    };
    let exchange = unique("amqp");
    let started = Instant::now();
    let mut publisher = amqp::Publisher::connect(addr, &exchange).unwrap();
    let handles = start_subscribers(2, count, size, {
        let exchange = exchange.clone();
        move || {
            let mut sub = amqp::Subscriber::connect(addr, &exchange)?;
            sub.set_read_timeout(Some(READ_DEADLINE))?;
            Ok(sub)
        }
    });
    let messages = Messages::new(size);
    let mut msg = Vec::new();
    for seq in 0..count {
        messages.make(seq, &mut msg);
        publisher.publish(&msg).unwrap();
    }
    publisher.close().unwrap();
    join(handles);
    println!(
        "rabbitmq: {count} x {size} B to 2 subscribers in {:?}",
        started.elapsed()
    );
}

#[test]
fn brokers_redis_fanout_8_bytes() {
    redis_fanout(10_000, 8);
}

#[test]
fn brokers_redis_fanout_64_kib() {
    redis_fanout(10_000, 64 << 10);
}

#[test]
fn brokers_redis_fanout_1_mib() {
    redis_fanout(200, 1 << 20);
}

#[test]
fn brokers_amqp_fanout_8_bytes() {
    amqp_fanout(10_000, 8);
}

#[test]
fn brokers_amqp_fanout_64_kib() {
    amqp_fanout(10_000, 64 << 10);
}

/// 1 MiB bodies are split into 9 frames of at most 128 KiB and reassembled (by lapin).
#[test]
fn brokers_amqp_fanout_1_mib() {
    amqp_fanout(200, 1 << 20);
}

/// `try_recv` returns at once when nothing is there, and finds the message once it came; a
/// `recv` with a read timeout stops with `TimedOut`.
#[test]
fn brokers_redis_try_recv_and_timeout() {
    let Some(addr) = broker(brokers::redis_addr()) else {
        return;
    };
    let channel = unique("redis-nb");
    let mut sub = redis::Subscriber::connect(addr, &channel).unwrap();
    let mut publisher = redis::Publisher::connect(addr, &channel).unwrap();
    assert_eq!(publisher.subscribers(&channel).unwrap(), 1);
    let mut buf = Vec::new();
    assert!(!sub.try_recv(&mut buf).unwrap());
    sub.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let err = sub.recv(&mut buf).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    assert!(sub.set_read_timeout(Some(Duration::ZERO)).is_err());
    publisher.publish(b"one").unwrap();
    publisher.publish(b"").unwrap();
    await_message(|buf| sub.try_recv(buf), &mut buf);
    assert_eq!(buf, b"one");
    await_message(|buf| sub.try_recv(buf), &mut buf);
    assert_eq!(buf, b"");
    assert!(!sub.try_recv(&mut buf).unwrap());
}

#[test]
fn brokers_amqp_try_recv_and_timeout() {
    let Some(addr) = broker(brokers::amqp_addr()) else {
        return;
    };
    let exchange = unique("amqp-nb");
    let mut sub = amqp::Subscriber::connect(addr, &exchange).unwrap();
    let mut publisher = amqp::Publisher::connect(addr, &exchange).unwrap();
    let mut buf = Vec::new();
    assert!(!sub.try_recv(&mut buf).unwrap());
    sub.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let err = sub.recv(&mut buf).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    publisher.publish(b"one").unwrap();
    publisher.publish(b"").unwrap();
    await_message(|buf| sub.try_recv(buf), &mut buf);
    assert_eq!(buf, b"one");
    await_message(|buf| sub.try_recv(buf), &mut buf);
    assert_eq!(buf, b"");
    assert!(!sub.try_recv(&mut buf).unwrap());
    publisher.close().unwrap();
    sub.close().unwrap();
}

/// Polls `try_recv` until it has a message (the broker forwards it at once; the deadline is
/// only for failure).
fn await_message(mut try_recv: impl FnMut(&mut Vec<u8>) -> io::Result<bool>, buf: &mut Vec<u8>) {
    let deadline = Instant::now() + READ_DEADLINE;
    while !try_recv(buf).unwrap() {
        assert!(
            Instant::now() < deadline,
            "no message within {READ_DEADLINE:?}"
        );
        thread::yield_now();
    }
}

/// A Channel.Close from RabbitMQ is an error with its text.
#[test]
fn brokers_amqp_server_refusal_is_reported() {
    let Some(addr) = broker(brokers::amqp_addr()) else {
        return;
    };
    // Names starting with "amq." are reserved.
    let err = amqp::Publisher::connect(addr, "amq.shmlink-test")
        .err()
        .expect("connect succeeded");
    let text = err.to_string();
    assert_eq!(err.kind(), io::ErrorKind::Other, "{text}");
    assert!(text.contains("ACCESS_REFUSED"), "{text}");
}

#[test]
fn brokers_redis_oversized_message_is_refused() {
    let Some(addr) = broker(brokers::redis_addr()) else {
        return;
    };
    let mut publisher = redis::Publisher::connect(addr, &unique("redis-big")).unwrap();
    let too_big = vec![0; brokers::MAX_MESSAGE + 1];
    assert_eq!(
        publisher.publish(&too_big).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
}

#[test]
fn brokers_amqp_oversized_message_is_refused() {
    let Some(addr) = broker(brokers::amqp_addr()) else {
        return;
    };
    let mut publisher = amqp::Publisher::connect(addr, &unique("amqp-big")).unwrap();
    let too_big = vec![0; brokers::MAX_MESSAGE + 1];
    assert_eq!(
        publisher.publish(&too_big).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
}

// ---------------------------------------------------------------------- fake servers

/// A server on an ephemeral loopback port that accepts one connection, writes `reply`
/// and closes it.
fn fake_server(reply: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let _ = stream.write_all(reply);
    });
    addr
}

/// Something that is not RabbitMQ: connecting is an error naming the address, not a hang.
#[test]
fn brokers_fake_amqp_server_is_an_error() {
    let addr = fake_server(b"HTTP/1.1 400 Bad Request\r\n\r\n");
    let started = Instant::now();
    let err = amqp::Subscriber::connect(addr, "x")
        .err()
        .expect("connect succeeded");
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
    assert!(started.elapsed() < READ_DEADLINE, "{:?}", started.elapsed());
}

/// Something that is not Redis: connecting is an error naming the address, not a hang.
#[test]
fn brokers_fake_redis_server_is_an_error() {
    let addr = fake_server(b"$99999999999999999999\r\n");
    let started = Instant::now();
    let err = redis::Publisher::connect(addr, "x")
        .err()
        .expect("connect succeeded");
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
    let addr = fake_server(b"");
    let err = redis::Subscriber::connect(addr, "x")
        .err()
        .expect("connect succeeded");
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
    assert!(started.elapsed() < READ_DEADLINE, "{:?}", started.elapsed());
}
