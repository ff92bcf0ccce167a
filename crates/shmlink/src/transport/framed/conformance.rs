//! The framed transports' raw-wire checks, as functions each transport's tests call with
//! its addresses (options follow the address: [`opts_for`]): what a listener does with a
//! hand-driven peer ([`RawPeer`]) that sends garbage, nothing, another version's hello,
//! hostile frames, or ends without a FIN, and what a client does with a listener's bad
//! hello. Everything a connection promises through the public API is the conformance
//! suite's (`tests/conformance.rs`), which runs on every transport.

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
    match addr.starts_with("tls:") {
        #[cfg(feature = "tls")]
        true => Options::default().tls(crate::transport::tls::test_tls()),
        _ => Options::default(),
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

/// A client's first messages may come right behind its hello, before the listener's
/// hello (`auto:`'s client sends its negotiation so): the listener reads only the hello
/// in its handshake and delivers those messages, in order, on the accepted connection.
pub(crate) fn messages_behind_the_hello_are_delivered<R: RawPeer + Send + 'static>(bind: &str) {
    let mut listener = Listener::bind(bind, &opts_for(bind)).unwrap();
    let addr = listener.local_addr();
    let peer = thread::spawn(move || {
        let mut raw = R::connect(&addr);
        raw.write(&hello(1 << 20));
        raw.write(&R::frame(Frame::Data, b"first"));
        raw.write(&R::frame(Frame::Data, b"second"));
        let h = raw.read_hello().expect("the listener's hello");
        parse_hello(&h).unwrap();
        raw.write(&R::frame(Frame::Fin, b""));
    });
    let mut server = accept_within(&mut listener);
    assert_eq!(server.recv_vec().unwrap(), b"first");
    assert_eq!(server.recv_vec().unwrap(), b"second");
    peer.join().unwrap();
    assert_eq!(
        server.recv_vec().unwrap_err().kind(),
        ErrorKind::EndOfStream
    );
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
