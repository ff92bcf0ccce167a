//! The broker clients against real brokers (`scripts/brokers.sh start`) and against fake
//! servers that misbehave.
//!
//! A test that needs a broker that is not reachable is skipped with the reason
//! (`shmlink_testkit::skip`), or fails where `SHMLINK_REQUIRE` names `brokers` (CI). Every
//! read has a deadline.

use std::io::{self, Read, Write};
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

fn redis_fanout(count: u64, size: usize, window: usize) {
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
    publisher.set_window(window).unwrap();
    let messages = Messages::new(size);
    let mut msg = Vec::new();
    for seq in 0..count {
        messages.make(seq, &mut msg);
        publisher.publish(&msg).unwrap();
    }
    publisher.flush().unwrap();
    join(handles);
    println!(
        "redis: {count} x {size} B to 2 subscribers (window {window}) in {:?}",
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
    redis_fanout(10_000, 8, 0);
}

#[test]
fn brokers_redis_fanout_64_kib() {
    redis_fanout(10_000, 64 << 10, 0);
}

#[test]
fn brokers_redis_fanout_pipelined() {
    redis_fanout(10_000, 100, 64);
}

#[test]
fn brokers_redis_fanout_1_mib() {
    redis_fanout(200, 1 << 20, 0);
}

#[test]
fn brokers_amqp_fanout_8_bytes() {
    amqp_fanout(10_000, 8);
}

#[test]
fn brokers_amqp_fanout_64_kib() {
    amqp_fanout(10_000, 64 << 10);
}

/// 1 MiB bodies are split into 9 frames of at most 128 KiB and reassembled.
#[test]
fn brokers_amqp_fanout_1_mib() {
    amqp_fanout(200, 1 << 20);
}

/// `try_recv` and a non-blocking `recv` return at once when nothing is there, and find the
/// message once it came.
#[test]
fn brokers_redis_try_recv_and_nonblocking() {
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
    assert!(err.to_string().contains("read timed out"), "{err}");
    sub.set_nonblocking(true).unwrap();
    assert_eq!(
        sub.recv(&mut buf).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    publisher.publish(b"one").unwrap();
    publisher.publish(b"").unwrap();
    await_message(|buf| sub.try_recv(buf), &mut buf);
    assert_eq!(buf, b"one");
    await_message(|buf| sub.try_recv(buf), &mut buf);
    assert_eq!(buf, b"");
    assert!(!sub.try_recv(&mut buf).unwrap());
}

#[test]
fn brokers_amqp_try_recv_and_nonblocking() {
    let Some(addr) = broker(brokers::amqp_addr()) else {
        return;
    };
    let exchange = unique("amqp-nb");
    let mut sub = amqp::Subscriber::connect(addr, &exchange).unwrap();
    assert!(
        sub.queue().starts_with("amq.gen-"),
        "queue {:?}",
        sub.queue()
    );
    let mut publisher = amqp::Publisher::connect(addr, &exchange).unwrap();
    let mut buf = Vec::new();
    assert!(!sub.try_recv(&mut buf).unwrap());
    sub.set_nonblocking(true).unwrap();
    assert_eq!(
        sub.recv(&mut buf).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    publisher.publish(b"one").unwrap();
    publisher.publish(b"").unwrap();
    publisher.check().unwrap();
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

/// A Channel.Close from RabbitMQ is an error with its reply code and text.
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
    assert!(
        text.contains("403") && text.contains("ACCESS_REFUSED"),
        "{text}"
    );
    assert!(text.contains("Exchange.Declare"), "{text}");
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

/// A server on an ephemeral loopback port that accepts one connection, reads `expect`
/// bytes from it, writes `reply`, and keeps the connection open until the client closes it.
fn fake_server(expect: usize, reply: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(READ_DEADLINE)).unwrap();
        let mut got = vec![0; expect];
        if stream.read_exact(&mut got).is_err() {
            return;
        }
        let _ = stream.write_all(&reply);
        let mut rest = [0; 1024];
        while matches!(stream.read(&mut rest), Ok(n) if n > 0) {}
    });
    addr
}

fn amqp_frame(kind: u8, channel: u16, payload: &[u8], end: u8) -> Vec<u8> {
    let mut f = vec![kind];
    f.extend_from_slice(&channel.to_be_bytes());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f.push(end);
    f
}

#[test]
fn brokers_fake_amqp_wrong_frame_end_is_invalid_data() {
    let addr = fake_server(8, amqp_frame(1, 0, b"\x00\x0a\x00\x0a\x00\x09", 0x00));
    let err = amqp::Subscriber::connect(addr, "x")
        .err()
        .expect("connect succeeded");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("instead of 0xce"), "{err}");
}

#[test]
fn brokers_fake_amqp_hostile_frame_size_is_invalid_data() {
    // A frame header announcing 4 GiB before Connection.Tune.
    let addr = fake_server(8, b"\x01\x00\x00\xff\xff\xff\xff".to_vec());
    let err = amqp::Publisher::connect(addr, "x")
        .err()
        .expect("connect succeeded");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(
        err.to_string().contains("over the frame size limit"),
        "{err}"
    );
}

#[test]
fn brokers_fake_amqp_connection_close_reports_the_server_text() {
    // Connection.Close 501 FRAME_ERROR in reply to Connection.Start.
    let mut close = b"\x00\x0a\x00\x32\x01\xf5".to_vec();
    close.push(11);
    close.extend_from_slice(b"FRAME_ERROR");
    close.extend_from_slice(b"\x00\x0a\x00\x0a");
    let addr = fake_server(8, amqp_frame(1, 0, &close, 0xce));
    let err = amqp::Publisher::connect(addr, "x")
        .err()
        .expect("connect succeeded");
    assert_eq!(err.kind(), io::ErrorKind::Other, "{err}");
    assert!(
        err.to_string()
            .contains("501 FRAME_ERROR (in reply to Connection.Start)"),
        "{err}"
    );
}

#[test]
fn brokers_fake_amqp_truncated_method_is_invalid_data() {
    // Connection.Start whose tables run past the frame.
    let addr = fake_server(
        8,
        amqp_frame(1, 0, b"\x00\x0a\x00\x0a\x00\x09\x00\x00\x10\x00", 0xce),
    );
    let err = amqp::Publisher::connect(addr, "x")
        .err()
        .expect("connect succeeded");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(
        err.to_string().contains("truncated Connection.Start"),
        "{err}"
    );
}

#[test]
fn brokers_fake_redis_hostile_bulk_length_is_invalid_data() {
    let subscribe = b"*2\r\n$9\r\nSUBSCRIBE\r\n$1\r\nc\r\n";
    let mut reply = b"*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n".to_vec();
    reply.extend_from_slice(b"*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$99999999999\r\n");
    let addr = fake_server(subscribe.len(), reply);
    let mut sub = redis::Subscriber::connect(addr, "c").unwrap();
    sub.set_read_timeout(Some(READ_DEADLINE)).unwrap();
    let err = sub.recv(&mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("over the limit"), "{err}");
}

#[test]
fn brokers_fake_redis_message_for_another_channel_is_invalid_data() {
    let subscribe = b"*2\r\n$9\r\nSUBSCRIBE\r\n$1\r\nc\r\n";
    let mut reply = b"*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n".to_vec();
    // The message arrives in the same write as the confirmation: it stays buffered.
    reply.extend_from_slice(b"*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nok\r\n");
    reply.extend_from_slice(b"*3\r\n$7\r\nmessage\r\n$1\r\nd\r\n$2\r\nno\r\n");
    let addr = fake_server(subscribe.len(), reply);
    let mut sub = redis::Subscriber::connect(addr, "c").unwrap();
    sub.set_read_timeout(Some(READ_DEADLINE)).unwrap();
    let mut buf = Vec::new();
    sub.recv(&mut buf).unwrap();
    assert_eq!(buf, b"ok");
    let err = sub.recv(&mut buf).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("channel \"d\""), "{err}");
}

#[test]
fn brokers_fake_redis_closed_connection_is_eof() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Reads the PING (so that closing sends FIN, not RST), then closes.
    let server = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(READ_DEADLINE)).unwrap();
        let mut ping = [0; 14];
        stream.read_exact(&mut ping).unwrap();
        assert_eq!(&ping, b"*1\r\n$4\r\nPING\r\n");
    });
    let err = redis::Publisher::connect(addr, "c")
        .err()
        .expect("connect succeeded");
    server.join().unwrap();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
    assert!(err.to_string().contains("closed the connection"), "{err}");
}

/// A server that writes `bytes` one byte per write (`TCP_NODELAY`), so that the client
/// sees messages and frames in many partial reads; it reads nothing (the client's
/// requests fit in the socket buffer) and keeps the connection open until the client
/// closes it.
fn trickling_server(bytes: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_nodelay(true).unwrap();
        for b in &bytes {
            if stream.write_all(std::slice::from_ref(b)).is_err() {
                return;
            }
        }
        stream.set_read_timeout(Some(READ_DEADLINE)).unwrap();
        let mut rest = [0; 1024];
        while matches!(stream.read(&mut rest), Ok(n) if n > 0) {}
    });
    addr
}

#[test]
fn brokers_fake_redis_messages_in_partial_reads() {
    let mut script = b"*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n".to_vec();
    let payloads: [&[u8]; 3] = [b"first", b"", b"\r\n$3\r\n*1\r\n\0\xff"];
    for p in payloads {
        script.extend_from_slice(
            format!("*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n${}\r\n", p.len()).as_bytes(),
        );
        script.extend_from_slice(p);
        script.extend_from_slice(b"\r\n");
    }
    let mut sub = redis::Subscriber::connect(trickling_server(script), "c").unwrap();
    sub.set_read_timeout(Some(READ_DEADLINE)).unwrap();
    let mut buf = Vec::new();
    for p in payloads {
        sub.recv(&mut buf).unwrap();
        assert_eq!(buf, p);
    }
}

/// A method frame for the fake AMQP server.
fn amqp_method(channel: u16, id: (u16, u16), args: &[u8]) -> Vec<u8> {
    let mut payload = id.0.to_be_bytes().to_vec();
    payload.extend_from_slice(&id.1.to_be_bytes());
    payload.extend_from_slice(args);
    amqp_frame(1, channel, &payload, 0xce)
}

/// Everything a RabbitMQ server says to a subscriber up to Basic.ConsumeOk, frame size
/// 4096, without waiting for the requests.
fn amqp_subscriber_handshake() -> Vec<u8> {
    let mut s = Vec::new();
    // Start: 0-9, empty server properties, mechanisms, locales.
    s.extend(amqp_method(
        0,
        (10, 10),
        b"\x00\x09\x00\x00\x00\x00\x00\x00\x00\x0eAMQPLAIN PLAIN\x00\x00\x00\x05en_US",
    ));
    // Tune: channel_max 2047, frame_max 4096, heartbeat 60.
    s.extend(amqp_method(
        0,
        (10, 30),
        b"\x07\xff\x00\x00\x10\x00\x00\x3c",
    ));
    s.extend(amqp_method(0, (10, 41), b"\x00"));
    s.extend(amqp_method(1, (20, 11), b"\x00\x00\x00\x00"));
    s.extend(amqp_method(1, (40, 11), b""));
    s.extend(amqp_method(
        1,
        (50, 11),
        b"\x02q1\x00\x00\x00\x00\x00\x00\x00\x00",
    ));
    s.extend(amqp_method(1, (50, 21), b""));
    s.extend(amqp_method(1, (60, 11), b""));
    s.extend(amqp_method(1, (60, 21), b"\x03tag"));
    s
}

/// A delivery of `body` in body frames of at most `chunk` bytes.
fn amqp_delivery(tag: u64, body: &[u8], chunk: usize) -> Vec<u8> {
    let mut deliver = b"\x03tag".to_vec();
    deliver.extend_from_slice(&tag.to_be_bytes());
    deliver.extend_from_slice(b"\x00\x01x\x00"); // redelivered, exchange "x", routing key ""
    let mut s = amqp_method(1, (60, 60), &deliver);
    let mut header = b"\x00\x3c\x00\x00".to_vec();
    header.extend_from_slice(&(body.len() as u64).to_be_bytes());
    header.extend_from_slice(b"\x00\x00");
    s.extend(amqp_frame(2, 1, &header, 0xce));
    for part in body.chunks(chunk) {
        s.extend(amqp_frame(3, 1, part, 0xce));
    }
    s
}

#[test]
fn brokers_fake_amqp_bodies_reassembled_from_partial_reads() {
    let bodies: Vec<Vec<u8>> = vec![
        b"small".to_vec(),
        Vec::new(),
        (0..10_000u32).map(|i| (i * 7) as u8).collect(),
    ];
    let mut script = amqp_subscriber_handshake();
    script.extend(amqp_frame(8, 0, b"", 0xce)); // a heartbeat in between is ignored
    for (tag, body) in bodies.iter().enumerate() {
        script.extend(amqp_delivery(tag as u64 + 1, body, 4096 - 8));
    }
    let mut sub = amqp::Subscriber::connect(trickling_server(script), "x").unwrap();
    assert_eq!(sub.queue(), "q1");
    sub.set_read_timeout(Some(READ_DEADLINE)).unwrap();
    let mut buf = Vec::new();
    for body in &bodies {
        sub.recv(&mut buf).unwrap();
        assert_eq!(&buf, body);
    }
}

#[test]
fn brokers_fake_amqp_body_longer_than_announced_is_invalid_data() {
    let mut script = amqp_subscriber_handshake();
    let mut delivery = amqp_delivery(1, b"0123456789", 4096 - 8);
    // Announce 4 bytes in the content header (body size at payload offset 4..12).
    let header_at = delivery.len() - (8 + 10) - (8 + 14);
    delivery[header_at + 7 + 4..header_at + 7 + 12].copy_from_slice(&4u64.to_be_bytes());
    script.extend(delivery);
    let mut sub = amqp::Subscriber::connect(trickling_server(script), "x").unwrap();
    sub.set_read_timeout(Some(READ_DEADLINE)).unwrap();
    let err = sub.recv(&mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(
        err.to_string()
            .contains("body frame of 10 bytes where 4 were left"),
        "{err}"
    );
}

#[test]
fn brokers_fake_amqp_frame_over_negotiated_size_is_invalid_data() {
    let mut script = amqp_subscriber_handshake();
    // Frame size 4096 was negotiated; a body frame of 5000 bytes breaks it.
    script.extend(amqp_delivery(1, &[1; 5000], 5000));
    let mut sub = amqp::Subscriber::connect(trickling_server(script), "x").unwrap();
    sub.set_read_timeout(Some(READ_DEADLINE)).unwrap();
    let err = sub.recv(&mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(
        err.to_string()
            .contains("over the frame size limit of 4096"),
        "{err}"
    );
}
