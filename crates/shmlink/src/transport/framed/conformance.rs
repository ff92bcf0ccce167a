//! The behaviour every framed transport must show, as functions each transport's tests
//! call with its addresses (options follow the address: [`opts_for`]).

use std::os::fd::{AsFd, BorrowedFd};
use std::thread;
use std::time::{Duration, Instant};

use super::hello::{hello, parse_hello, PROTOCOL_VERSION};
use super::{Frame, HELLO_LEN};
use crate::error::ErrorKind;
use crate::options::Options;
use crate::sys::stream::{self, Ready};
use crate::{Connection, Listener};

/// Default options for a listener or client at `addr`: on `tls:`, with the test
/// certificates (both ends share one identity and require each other's: mutual TLS).
pub(crate) fn opts_for(addr: &str) -> Options {
    if addr.starts_with("tls:") {
        Options::default().tls(crate::transport::tls::test_tls())
    } else {
        Options::default()
    }
}

/// How long a test waits for something that should happen at once.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

/// A deadline [`PATIENCE`] from now.
pub(crate) fn soon() -> Option<Instant> {
    Some(Instant::now() + PATIENCE)
}

fn readable(fd: BorrowedFd<'_>, deadline: Option<Instant>) -> bool {
    stream::wait(fd, Ready::Read, deadline).unwrap()
}

fn now() -> Option<Instant> {
    Some(Instant::now())
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// Accepts one connection, failing the test (instead of hanging) if none comes.
pub(crate) fn accept_within(listener: &mut Listener) -> Connection {
    listener.set_nonblocking(true);
    let deadline = soon();
    let conn = loop {
        match listener.accept() {
            Ok(c) => break c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(readable(listener.as_fd(), deadline), "no client came")
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    listener.set_nonblocking(false);
    conn
}

/// Connects to an address when dropped, so that a listener blocked in `accept` wakes
/// up even if the thread holding it panics.
struct Knock(String);

impl Drop for Knock {
    fn drop(&mut self) {
        let _ = Connection::connect(&self.0, &opts_for(&self.0));
    }
}

/// A client connected to a fresh listener on `bind`, and the server's end.
pub(crate) fn pair(bind: &str, opts: &Options) -> (Listener, Connection, Connection) {
    pair_with(bind, opts, opts)
}

/// [`pair`] with options for each side.
fn pair_with(
    bind: &str,
    server_opts: &Options,
    client_opts: &Options,
) -> (Listener, Connection, Connection) {
    let mut listener = Listener::bind(bind, server_opts).unwrap();
    let addr = listener.local_addr();
    let o = client_opts.clone();
    let client = thread::spawn(move || Connection::connect(&addr, &o).unwrap());
    let server = accept_within(&mut listener);
    (listener, client.join().unwrap(), server)
}

/// Each side sends up to the smaller of both maxima.
pub(crate) fn smaller_maximum_wins(bind: &str) {
    let small = opts_for(bind).max_msg_size(1000);
    let big = opts_for(bind);
    for (server_opts, client_opts) in [(&small, &big), (&big, &small)] {
        let (_l, mut client, mut server) = pair_with(bind, server_opts, client_opts);
        assert_eq!((client.max_msg_size(), server.max_msg_size()), (1000, 1000));
        let e = client.send(&[0; 1001]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MessageTooLarge);
        client.send(&[1; 1000]).unwrap();
        server.send(&[2; 1000]).unwrap();
        assert_eq!(server.recv_vec().unwrap(), [1; 1000]);
        assert_eq!(client.recv_vec().unwrap(), [2; 1000]);
    }
}

/// Receives on a non-blocking connection, waiting on its fd while it would block.
fn recv_when_ready(conn: &mut Connection) -> Vec<u8> {
    let deadline = soon();
    loop {
        match conn.recv_vec() {
            Ok(m) => return m,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(readable(conn.as_fd(), deadline), "no message came")
            }
            Err(e) => panic!("recv: {e}"),
        }
    }
}

/// Echoes messages until the peer closes; returns how many.
fn echo_server(mut conn: Connection) -> thread::JoinHandle<usize> {
    thread::spawn(move || {
        let mut n = 0;
        loop {
            match conn.recv_vec() {
                Ok(m) => conn.send(&m).unwrap(),
                Err(e) if e.kind() == ErrorKind::EndOfStream => return n,
                Err(e) => panic!("echo server: {e}"),
            }
            n += 1;
        }
    })
}

/// Messages of many sizes (zero and fragment boundaries included) come back intact,
/// through every receive call.
pub(crate) fn echo(bind: &str) {
    let (_l, mut client, server) = pair(bind, &opts_for(bind));
    let server = echo_server(server);
    let sizes = [0, 1, 5, 100, 65535, 65536, 65537, 200_000, 1 << 20, 0, 3];
    let mut buf = vec![0u8; 1 << 20];
    for (i, &size) in sizes.iter().enumerate() {
        let msg = pattern(size, i as u8);
        client.send(&msg).unwrap();
        match i % 3 {
            0 => assert_eq!(client.recv_vec().unwrap(), msg),
            1 => assert_eq!(client.recv_ref().unwrap().bytes().to_vec(), msg),
            _ => {
                let n = client.recv(&mut buf).unwrap();
                assert_eq!(&buf[..n], &msg[..]);
            }
        }
    }
    let c = client.counters();
    assert_eq!(
        (c.msgs_out, c.msgs_in),
        (sizes.len() as u64, sizes.len() as u64)
    );
    client.close().unwrap();
    assert_eq!(server.join().unwrap(), sizes.len());
}

/// A message of the maximum size (64 MiB by default) crosses, written in place; one
/// byte more is refused before anything is sent.
pub(crate) fn largest_message(bind: &str) {
    let (_l, mut client, mut server) = pair(bind, &opts_for(bind));
    let max = client.max_msg_size();
    assert_eq!(max, 64 << 20);
    assert_eq!(server.max_msg_size(), max);
    let msg = pattern(max, 7);
    let expect = msg.clone();
    let reader = thread::spawn(move || {
        let got = server.recv_vec().unwrap();
        assert!(got == expect, "64 MiB message corrupted");
        server
    });
    let mut buf = client.reserve(max).unwrap();
    buf.copy_from_slice(&msg);
    buf.commit().unwrap();
    let e = client.send(&vec![0; max + 1]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MessageTooLarge);
    let mut server = reader.join().unwrap();
    client.send(b"after").unwrap();
    assert_eq!(server.recv_vec().unwrap(), b"after");
}

/// Zero-length messages are messages; the end of the stream is an error, never 0.
pub(crate) fn zero_length_and_end_of_stream(bind: &str) {
    let (_l, mut client, mut server) = pair(bind, &opts_for(bind));
    client.send(b"").unwrap();
    client.send(b"").unwrap();
    assert_eq!(server.recv(&mut []).unwrap(), 0);
    assert!(server.recv_vec().unwrap().is_empty());
    drop(client);
    for _ in 0..2 {
        assert_eq!(
            server.recv_vec().unwrap_err().kind(),
            ErrorKind::EndOfStream
        );
    }
    // The peer is gone: sending fails instead of vanishing.
    assert_eq!(
        server.send(b"x").unwrap_err().kind(),
        ErrorKind::ConnectionReset
    );
}

/// Sending to a peer that went away fails with ConnectionReset, even before its FIN
/// has been read.
pub(crate) fn send_after_peer_left(bind: &str) {
    let (_l, mut client, server) = pair(bind, &opts_for(bind));
    drop(server);
    let deadline = Instant::now() + PATIENCE;
    let e = loop {
        // The first sends may still reach the kernel before the peer's reset returns.
        match client.send(b"anyone?") {
            Ok(()) => assert!(Instant::now() < deadline, "sends keep succeeding"),
            Err(e) => break e,
        }
    };
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    assert!(e.to_string().contains(&client.peer_addr()), "{e}");
    assert_eq!(
        client.send(b"x").unwrap_err().kind(),
        ErrorKind::ConnectionReset
    );
    assert_eq!(
        client.recv_vec().unwrap_err().kind(),
        ErrorKind::EndOfStream
    );
}

/// Non-blocking calls return WouldBlock and the fd tells when to call again; a slow
/// receiver pushes back on a non-blocking sender without losing anything.
pub(crate) fn nonblocking_flow_control(bind: &str) {
    let (_l, mut client, mut server) = pair(bind, &opts_for(bind));
    client.set_nonblocking(true);
    server.set_nonblocking(true);
    assert_eq!(server.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
    assert!(!readable(server.as_fd(), now()));
    client.send(b"wake").unwrap();
    assert!(readable(server.as_fd(), soon()));
    assert_eq!(server.recv_vec().unwrap(), b"wake");
    assert!(!readable(server.as_fd(), now()));

    // Fill the path until the sender is pushed back.
    let chunk = pattern(64 << 10, 1);
    let mut accepted = 0usize;
    loop {
        match client.send(&chunk) {
            Ok(()) => accepted += 1,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("send: {e}"),
        }
        assert!(accepted < 100_000, "sender never pushed back");
    }
    assert!(!readable(client.as_fd(), now()));
    // Drain. The last message accepted sits partly in the sender's queue, which moves
    // only when the sender calls again; its fd says when.
    let mut received = 0usize;
    let mut stalls = 0;
    while received < accepted {
        match server.recv_ref().map(|m| m.bytes().to_vec() == chunk[..]) {
            Ok(intact) => {
                assert!(intact);
                received += 1;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if stalls == 0 {
                    assert!(readable(client.as_fd(), soon()), "sender not woken");
                }
                stalls += 1;
                // Any call pushes the queue on.
                assert_eq!(client.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
                assert!(readable(server.as_fd(), soon()), "data stuck");
            }
            Err(e) => panic!("recv: {e}"),
        }
    }
    assert!(stalls > 0);
    assert!(!readable(client.as_fd(), now()));
    client.send(b"more").unwrap();
    assert_eq!(recv_when_ready(&mut server), b"more");
    assert_eq!(server.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
}

/// Messages that arrived together (and sit in user space on stream transports) keep
/// the fd readable until each is received.
pub(crate) fn fd_stays_readable_while_messages_wait(bind: &str) {
    let (_l, mut client, mut server) = pair(bind, &opts_for(bind));
    for i in 0..10u8 {
        client.send(&[i; 10]).unwrap();
    }
    server.set_nonblocking(true);
    for i in 0..10u8 {
        assert!(
            readable(server.as_fd(), soon()),
            "message {i} not announced"
        );
        assert_eq!(server.recv_vec().unwrap(), [i; 10]);
    }
    assert!(!readable(server.as_fd(), now()));
    drop(client);
    assert!(readable(server.as_fd(), soon()));
    assert_eq!(
        server.recv_vec().unwrap_err().kind(),
        ErrorKind::EndOfStream
    );
}

/// A blocking sender waits for a slow receiver; nothing is lost or reordered.
pub(crate) fn blocking_flow_control(bind: &str) {
    let (_l, mut client, mut server) = pair(bind, &opts_for(bind));
    let sender = thread::spawn(move || {
        for i in 0..300u32 {
            let mut msg = pattern(50_000, i as u8);
            msg[..4].copy_from_slice(&i.to_le_bytes());
            client.send(&msg).unwrap();
        }
    });
    for i in 0..300u32 {
        let m = server.recv_ref().unwrap().bytes().to_vec();
        assert_eq!(m.len(), 50_000);
        assert_eq!(m[..4], i.to_le_bytes());
        assert_eq!(m[4..], pattern(50_000, i as u8)[4..]);
    }
    sender.join().unwrap();
}

/// What a non-blocking send queued is still delivered when the sender closes at once.
pub(crate) fn close_delivers_queued_messages(bind: &str) {
    let (_l, mut client, mut server) = pair(bind, &opts_for(bind));
    client.set_nonblocking(true);
    let big = pattern(4 << 20, 3);
    client.send(&big).unwrap();
    let closer = thread::spawn(move || client.close());
    assert!(server.recv_vec().unwrap() == big);
    assert_eq!(
        server.recv_vec().unwrap_err().kind(),
        ErrorKind::EndOfStream
    );
    closer.join().unwrap().unwrap();
}

/// A message that does not fit the caller's buffer stays queued; an aborted
/// reservation sends nothing; a lent message is the same until released.
pub(crate) fn in_place_calls(bind: &str) {
    let (_l, mut client, mut server) = pair(bind, &opts_for(bind));
    drop(client.reserve(3).unwrap());
    let mut buf = client.reserve(5).unwrap();
    buf.copy_from_slice(b"hello");
    buf.commit().unwrap();
    let mut small = [0u8; 2];
    let e = server.recv(&mut small).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MessageTooLarge);
    assert_eq!(server.recv_ref().unwrap().bytes().to_vec(), b"hello");
    client.send(b"next").unwrap();
    assert_eq!(server.recv_vec().unwrap(), b"next");
    assert_eq!(server.counters().msgs_in, 2);
}

/// A non-blocking listener says WouldBlock and its fd announces clients.
pub(crate) fn nonblocking_accept(bind: &str) {
    let mut listener = Listener::bind(bind, &opts_for(bind)).unwrap();
    listener.set_nonblocking(true);
    assert_eq!(listener.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
    assert!(!readable(listener.as_fd(), now()));
    let addr = listener.local_addr();
    let client = thread::spawn(move || {
        let mut c = Connection::connect(&addr, &opts_for(&addr)).unwrap();
        c.send(b"hi").unwrap();
        c
    });
    let mut server = loop {
        match listener.accept() {
            Ok(c) => break c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(readable(listener.as_fd(), soon()), "client not announced")
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    let _client = client.join().unwrap();
    assert_eq!(server.recv_vec().unwrap(), b"hi");
    assert!(!readable(listener.as_fd(), now()));
}

/// Connecting where nobody listens is refused.
pub(crate) fn connect_refused(addr: &str) {
    let e = Connection::connect(addr, &opts_for(addr)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    assert!(e.to_string().contains(addr), "{e}");
}

/// A hand-driven client, to play a crashed or hostile peer.
pub(crate) trait RawPeer: Sized {
    /// Connects without a handshake.
    fn connect(addr: &str) -> Self;
    /// Writes one unit: a packet on `ux:`, bytes on `tcp:`.
    fn write(&mut self, bytes: &[u8]);
    /// Reads the listener's hello; `None` at end of stream.
    fn read_hello(&mut self) -> Option<[u8; HELLO_LEN]>;
    /// Whether the listener closed the socket (waits a while).
    fn closed_by_peer(&mut self) -> bool;
    /// A frame of `kind` with `payload`, as one write unit.
    fn frame(kind: Frame, payload: &[u8]) -> Vec<u8>;

    /// Connects and completes the handshake.
    fn handshake(addr: &str) -> Self {
        let mut raw = Self::connect(addr);
        raw.write(&hello(1 << 20));
        let h = raw.read_hello().expect("listener hello");
        parse_hello(&h).unwrap();
        raw
    }
}

/// A client that sends garbage, and one that sends nothing, are dropped without
/// holding up the listener, which serves a good client meanwhile.
pub(crate) fn bad_clients_are_dropped<R: RawPeer + Send + 'static>(bind: &str) {
    let opts = opts_for(bind).handshake_timeout(Duration::from_millis(300));
    let mut listener = Listener::bind(bind, &opts).unwrap();
    let addr = listener.local_addr();
    let mut garbage = R::connect(&addr);
    garbage.write(b"GET / HTTP/1.1\r\n");
    let silent = R::connect(&addr);
    let good = {
        let addr = addr.clone();
        thread::spawn(move || {
            let mut c = Connection::connect(&addr, &opts_for(&addr)).unwrap();
            c.send(b"good").unwrap();
            c
        })
    };
    let mut server = accept_within(&mut listener);
    assert_eq!(server.recv_vec().unwrap(), b"good");
    let _good = good.join().unwrap();
    // Both are dropped while accept waits, the silent one at its handshake deadline.
    let late = thread::spawn(move || {
        let _knock = Knock(addr);
        let (mut garbage, mut silent) = (garbage, silent);
        assert!(garbage.closed_by_peer(), "garbage client not dropped");
        assert!(silent.closed_by_peer(), "silent client not dropped");
    });
    let _late_server = listener.accept().unwrap();
    late.join().unwrap();
}

/// A client whose first bytes are not a hello is dropped as soon as they arrive, though
/// they are fewer than a hello and its handshake deadline lies far beyond the test's
/// patience.
pub(crate) fn garbage_is_dropped_at_once<R: RawPeer + Send + 'static>(bind: &str) {
    let opts = opts_for(bind).handshake_timeout(Duration::from_secs(3600));
    let mut listener = Listener::bind(bind, &opts).unwrap();
    let addr = listener.local_addr();
    let peer = thread::spawn(move || {
        let _knock = Knock(addr.clone());
        let mut garbage = R::connect(&addr);
        garbage.write(b"GET /\r\n");
        assert!(
            garbage.closed_by_peer(),
            "garbage client kept until its deadline"
        );
    });
    // Returns the knocking client, once the garbage one has been dealt with.
    let _server = listener.accept().unwrap();
    peer.join().unwrap();
}

/// A client of another protocol version gets our hello (so it can report the
/// mismatch) and is dropped.
pub(crate) fn other_version_is_told_and_dropped<R: RawPeer + Send + 'static>(bind: &str) {
    let mut listener = Listener::bind(bind, &opts_for(bind)).unwrap();
    let addr = listener.local_addr();
    let peer = thread::spawn(move || {
        let _knock = Knock(addr.clone());
        let mut raw = R::connect(&addr);
        let mut h = hello(100);
        h[4] = PROTOCOL_VERSION + 1;
        raw.write(&h);
        let reply = raw.read_hello().expect("the listener's hello");
        assert_eq!(parse_hello(&reply).unwrap(), 64 << 20);
        assert!(
            raw.closed_by_peer(),
            "client of another version not dropped"
        );
    });
    // Returns the knocking client, once the other one has been dealt with.
    let _server = listener.accept().unwrap();
    peer.join().unwrap();
}

/// Messages before a FIN arrive, then end of stream; without a FIN, the end of the
/// socket is a reset (the peer crashed).
pub(crate) fn fin_versus_crash<R: RawPeer + Send + 'static>(bind: &str) {
    for graceful in [true, false] {
        let mut listener = Listener::bind(bind, &opts_for(bind)).unwrap();
        let addr = listener.local_addr();
        let peer = thread::spawn(move || {
            let mut raw = R::handshake(&addr);
            raw.write(&R::frame(Frame::Data, b"last words"));
            raw.write(&R::frame(Frame::Data, b""));
            if graceful {
                raw.write(&R::frame(Frame::Fin, b""));
            }
        });
        let mut server = accept_within(&mut listener);
        assert_eq!(server.recv_vec().unwrap(), b"last words");
        assert_eq!(server.recv_vec().unwrap(), b"");
        peer.join().unwrap();
        let expect = if graceful {
            ErrorKind::EndOfStream
        } else {
            ErrorKind::ConnectionReset
        };
        assert_eq!(server.recv_vec().unwrap_err().kind(), expect);
        assert_eq!(server.recv_vec().unwrap_err().kind(), expect);
    }
}

/// Frames that break the protocol end the connection with ProtocolViolation (the
/// listener's maximum message size is 1000 bytes). Each case is a list of writes.
pub(crate) fn hostile_frames<R: RawPeer + Send + 'static>(bind: &str, cases: &[&[&[u8]]]) {
    let opts = opts_for(bind).max_msg_size(1000);
    let mut listener = Listener::bind(bind, &opts).unwrap();
    for case in cases {
        let addr = listener.local_addr();
        let writes: Vec<Vec<u8>> = case.iter().map(|w| w.to_vec()).collect();
        let peer = thread::spawn(move || {
            let mut raw = R::handshake(&addr);
            raw.write(&R::frame(Frame::Data, b"fine"));
            for w in &writes {
                raw.write(w);
            }
            raw
        });
        let mut server = accept_within(&mut listener);
        assert_eq!(server.max_msg_size(), 1000);
        assert_eq!(server.recv_vec().unwrap(), b"fine");
        let e = server.recv_vec().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ProtocolViolation, "{case:02x?}: {e}");
        assert_eq!(
            server.recv_vec().unwrap_err().kind(),
            ErrorKind::ProtocolViolation
        );
        drop(peer.join().unwrap());
    }
}

/// The client checks the listener's hello. `fake` starts a listener that reads one
/// client's hello, answers with the given bytes (closing at once if there are none) and
/// waits for the client to go; it returns the address and the listener's thread.
pub(crate) fn client_checks_listener_hello(
    fake: impl Fn(Vec<u8>) -> (String, thread::JoinHandle<()>),
) {
    let mut newer = hello(100);
    newer[4] = PROTOCOL_VERSION + 1;
    for (reply, kind) in [
        (newer.to_vec(), ErrorKind::VersionMismatch),
        (
            b"HTTP/1.1 200 OK\r\n".to_vec(),
            ErrorKind::ProtocolViolation,
        ),
        (Vec::new(), ErrorKind::ConnectionRefused),
    ] {
        let (addr, server) = fake(reply);
        let e = Connection::connect(&addr, &opts_for(&addr)).unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
        assert!(e.to_string().contains(&addr), "{e}");
        server.join().unwrap();
    }
}

/// The tests above that take nothing but the address to bind, as `#[test]` functions of
/// the calling module: `bind_tests!(ANY);`.
macro_rules! bind_tests {
    ($bind:expr) => {
        $crate::transport::framed::conformance::bind_tests!(@each $bind;
            echo, largest_message, zero_length_and_end_of_stream, send_after_peer_left,
            nonblocking_flow_control, fd_stays_readable_while_messages_wait,
            blocking_flow_control, close_delivers_queued_messages, in_place_calls,
            nonblocking_accept);
    };
    (@each $bind:expr; $($test:ident),*) => {$(
        #[test]
        fn $test() {
            $crate::transport::framed::conformance::$test($bind);
        }
    )*};
}
pub(crate) use bind_tests;
