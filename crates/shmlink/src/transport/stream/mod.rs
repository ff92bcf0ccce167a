//! The stream layer under `tcp:` and `tls:`: TCP with `TCP_NODELAY`, one length-prefixed
//! frame per message, and for `tls:` a TLS session between the frames and the socket
//! ([`StreamLink`], the session in [`tls`]). The registry entries that parse the addresses
//! are `transport::tcp` and `transport::tls`.
//!
//! A frame is a [`HEADER_LEN`]-byte header — kind ([`KIND_DATA`] or [`KIND_FIN`]) and
//! payload length (`u32`, little-endian) — followed by the payload; a frame is written with
//! one gather write. The receiver reads large chunks and parses every frame in them, lending
//! small messages in place from its read buffer; a message larger than the buffer is read
//! straight into its own vector, which grows as the bytes arrive. Handshake, flow control
//! and end-of-stream rules are those of [`framed`](super::framed).
//!
//! # Entry points on a connected stream
//!
//! [`connect_stream`] runs the client's handshake — TLS first when asked, then the
//! hello — on a TCP stream that is already connected and returns the framed connection;
//! the listener drives its half without blocking
//! (`framed::listener::ServerHandshake`). (`auto:` needs
//! neither: it negotiates with messages on an established `tcp:` or `tls:` connection.)

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use super::framed::{
    bad_data, client_handshake, recycle, take_vec, Acceptor, Frame, FramedConn, FramedListener,
    Incoming, Link, Wire, HELLO_LEN,
};
use crate::error::{Error, ErrorKind, Result};
use crate::options::Options;
use crate::sys::stream;
use crate::transport::ListenerOps;

pub(crate) mod tls;

pub(crate) use tls::{ClientTls, ServerTls, TlsSession};

/// Frame header: kind, then payload length (`u32`, little-endian).
const HEADER_LEN: usize = 5;
/// A message.
const KIND_DATA: u8 = 1;
/// Graceful close; no payload.
const KIND_FIN: u8 = 2;
/// Size of the read buffer; larger frames are read into a vector of their own.
const READ_BUF: usize = 64 << 10;

/// Where the current message lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Current {
    None,
    /// In the read buffer, at `start..start + len`.
    Buffered {
        start: usize,
        len: usize,
    },
    /// In `big`.
    Big,
}

/// A connected TCP socket, with or without a TLS session over it.
pub(crate) struct StreamLink {
    sock: OwnedFd,
    layer: Layer,
}

/// What lies between the frames and the socket.
enum Layer {
    /// Nothing: frames go to the kernel as they are.
    Plain,
    /// TLS.
    Tls(Box<TlsSession>),
    /// The TLS session moved to a closing thread ([`Link::detach`]).
    Detached,
}

impl StreamLink {
    /// `sock`, with `tls` over it if given (its handshake not run yet).
    pub(crate) fn new(sock: OwnedFd, tls: Option<TlsSession>) -> StreamLink {
        let layer = match tls {
            Some(t) => Layer::Tls(Box::new(t)),
            None => Layer::Plain,
        };
        StreamLink { sock, layer }
    }

    /// The prefix of the addresses of a connection over this link.
    fn scheme(&self) -> &'static str {
        match self.layer {
            Layer::Plain => "tcp",
            Layer::Tls(_) | Layer::Detached => "tls",
        }
    }
}

fn detached() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the TLS session moved to the closing thread",
    )
}

impl Link for StreamLink {
    fn sock(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    fn handshake(&mut self) -> io::Result<bool> {
        match &mut self.layer {
            Layer::Plain => Ok(true),
            Layer::Tls(t) => t.handshake(self.sock.as_fd()),
            Layer::Detached => Err(detached()),
        }
    }

    #[inline]
    fn send_parts(&mut self, head: &[u8], body: &[u8], blocking: bool) -> io::Result<usize> {
        match &mut self.layer {
            Layer::Plain => stream::send_parts(self.sock.as_fd(), head, body, blocking),
            Layer::Tls(t) => t.send(self.sock.as_fd(), head, body, blocking),
            Layer::Detached => Err(detached()),
        }
    }

    #[inline]
    fn recv_append(&mut self, buf: &mut Vec<u8>, max: usize, blocking: bool) -> io::Result<usize> {
        match &mut self.layer {
            Layer::Plain => stream::recv_append(self.sock.as_fd(), buf, max, blocking),
            Layer::Tls(t) => t.recv_append(self.sock.as_fd(), buf, max, blocking),
            Layer::Detached => Err(detached()),
        }
    }

    #[inline]
    fn pending_output(&self) -> bool {
        match &self.layer {
            Layer::Tls(t) => t.pending_output(),
            Layer::Plain | Layer::Detached => false,
        }
    }

    fn flush(&mut self, blocking: bool) -> io::Result<bool> {
        match &mut self.layer {
            Layer::Tls(t) => t.flush(self.sock.as_fd(), blocking),
            Layer::Plain | Layer::Detached => Ok(true),
        }
    }

    #[inline]
    fn buffered_input(&self) -> bool {
        match &self.layer {
            Layer::Tls(t) => t.buffered_input(),
            Layer::Plain | Layer::Detached => false,
        }
    }

    fn close_notify(&mut self) {
        if let Layer::Tls(t) = &mut self.layer {
            t.close_notify();
        }
    }

    fn detach(&mut self) -> io::Result<StreamLink> {
        let sock = self.sock.try_clone()?;
        let layer = match self.layer {
            Layer::Plain => Layer::Plain,
            _ => std::mem::replace(&mut self.layer, Layer::Detached),
        };
        Ok(StreamLink { sock, layer })
    }
}

/// Length-prefixed frames on a byte stream.
pub(crate) struct TcpWire {
    max_recv: usize,
    /// Bytes read and not yet parsed start at `pos`; capacity [`READ_BUF`].
    buf: Vec<u8>,
    pos: usize,
    /// A frame too large for `buf`: its payload so far, and its full length.
    big: Vec<u8>,
    big_len: Option<usize>,
    current: Current,
}

impl TcpWire {
    /// The header at `pos`, if it has arrived: frame kind and payload length, validated.
    fn header(&self) -> io::Result<Option<(Frame, usize)>> {
        let Some(h) = self.buf.get(self.pos..self.pos + HEADER_LEN) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(h[1..].try_into().expect("4 bytes")) as usize;
        match h[0] {
            KIND_DATA if len <= self.max_recv => Ok(Some((Frame::Data, len))),
            KIND_DATA => Err(bad_data(format!(
                "frame of {len} bytes exceeds the maximum message size of {} bytes",
                self.max_recv
            ))),
            KIND_FIN if len == 0 => Ok(Some((Frame::Fin, 0))),
            KIND_FIN => Err(bad_data(format!("FIN frame with {len} bytes of payload"))),
            k => Err(bad_data(format!("unknown frame kind {k:#04x}"))),
        }
    }

    /// Continues reading a frame too large for the read buffer.
    fn read_big(
        &mut self,
        link: &mut StreamLink,
        total: usize,
        blocking: bool,
    ) -> io::Result<Incoming> {
        while self.big.len() < total {
            let missing = total - self.big.len();
            if self.big.len() == self.big.capacity() {
                // Double as the bytes arrive; never trust the header for the allocation.
                self.big
                    .reserve_exact(self.big.len().max(READ_BUF).min(missing));
            }
            match link.recv_append(&mut self.big, missing, blocking) {
                Ok(0) => return Ok(Incoming::Eof),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Incoming::Empty),
                Err(e) => return Err(e),
            }
        }
        self.big_len = None;
        self.current = Current::Big;
        Ok(Incoming::Message(total))
    }
}

impl Wire for TcpWire {
    type Link = StreamLink;

    fn new(max_recv: usize) -> TcpWire {
        TcpWire {
            max_recv,
            buf: Vec::with_capacity(READ_BUF),
            pos: 0,
            big: Vec::new(),
            big_len: None,
            current: Current::None,
        }
    }

    fn write(
        link: &mut StreamLink,
        frame: Frame,
        payload: &[u8],
        sent: &mut usize,
        blocking: bool,
    ) -> io::Result<bool> {
        let len = u32::try_from(payload.len()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "message too large for a frame")
        })?;
        let mut header = [0u8; HEADER_LEN];
        header[0] = match frame {
            Frame::Data => KIND_DATA,
            Frame::Fin => KIND_FIN,
        };
        header[1..].copy_from_slice(&len.to_le_bytes());
        while *sent < HEADER_LEN + payload.len() {
            let (head, body) = match header.get(*sent..) {
                Some(rest) if !rest.is_empty() => (rest, payload),
                _ => (&[][..], &payload[*sent - HEADER_LEN..]),
            };
            match link.send_parts(head, body, blocking) {
                Ok(n) => *sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn read(&mut self, link: &mut StreamLink, blocking: bool) -> io::Result<Incoming> {
        loop {
            if let Some(total) = self.big_len {
                return self.read_big(link, total, blocking);
            }
            if let Some((frame, len)) = self.header()? {
                let start = self.pos + HEADER_LEN;
                if frame == Frame::Fin {
                    self.pos = start;
                    return Ok(Incoming::Fin);
                }
                if self.buf.len() - start >= len {
                    self.pos = start + len;
                    self.current = Current::Buffered { start, len };
                    return Ok(Incoming::Message(len));
                }
                if HEADER_LEN + len > READ_BUF {
                    // Everything buffered belongs to this frame.
                    self.big.extend_from_slice(&self.buf[start..]);
                    self.buf.clear();
                    self.pos = 0;
                    self.big_len = Some(len);
                    continue;
                }
            }
            // Keep the unparsed tail (less than one frame) at the front, then read more.
            self.buf.drain(..self.pos);
            self.pos = 0;
            let room = READ_BUF - self.buf.len();
            match link.recv_append(&mut self.buf, room, blocking) {
                Ok(0) => return Ok(Incoming::Eof),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Incoming::Empty),
                Err(e) => return Err(e),
            }
        }
    }

    fn current(&self) -> &[u8] {
        match self.current {
            Current::None => &[],
            Current::Buffered { start, len } => &self.buf[start..start + len],
            Current::Big => &self.big,
        }
    }

    fn release(&mut self) {
        if std::mem::replace(&mut self.current, Current::None) == Current::Big {
            recycle(&mut self.big);
        }
    }

    fn take_current(&mut self) -> Vec<u8> {
        let msg = match self.current {
            Current::Big => take_vec(&mut self.big),
            _ => self.current().to_vec(),
        };
        self.current = Current::None;
        msg
    }

    fn buffered(&self) -> bool {
        match self.header() {
            Ok(None) => false,
            Ok(Some((_, len))) => self.buf.len() - self.pos - HEADER_LEN >= len,
            // The next call reports the violation.
            Err(_) => true,
        }
    }

    fn recv_hello(link: &mut StreamLink, got: &mut Vec<u8>) -> io::Result<usize> {
        let missing = HELLO_LEN.saturating_sub(got.len());
        got.reserve_exact(missing);
        link.recv_append(got, missing, false)
    }
}

/// Connects to `host:port`, trying each address the name resolves to in turn until the
/// deadline.
pub(crate) fn dial(host: &str, port: u16, deadline: Instant) -> Result<TcpStream> {
    let mut last = Error::new(
        ErrorKind::ConnectionRefused,
        format!("{host} resolves to no address"),
    );
    for sa in resolve(host, port)? {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::new(ErrorKind::TimedOut, "connect timeout expired"));
        }
        match TcpStream::connect_timeout(&sa, left) {
            Ok(s) => return Ok(s),
            Err(e) => last = Error::io(format!("connect to {sa}"), e),
        }
    }
    Err(last)
}

/// The addresses `host` resolves to; a name that does not resolve is `NotFound` (as
/// XCM's `ENOENT`), not an internal error.
fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>> {
    (host, port)
        .to_socket_addrs()
        .map(Iterator::collect)
        .map_err(|e| Error::new(ErrorKind::NotFound, format!("resolve {host}: {e}")))
}

/// The text of a socket address with a transport prefix.
fn addr_text(scheme: &str, sa: SocketAddr) -> String {
    format!("{scheme}:{sa}")
}

/// Dials `host:port` and runs the client's half of the handshake ([`connect_stream`])
/// within `opts`' connect timeout.
pub(crate) fn connect_to(
    host: &str,
    port: u16,
    tls: Option<&ClientTls>,
    opts: &Options,
    early: Option<&[u8]>,
) -> Result<Box<dyn crate::transport::ConnOps>> {
    let deadline = Instant::now() + opts.connect_timeout;
    let stream = dial(host, port, deadline)?;
    Ok(Box::new(connect_stream(
        stream, tls, opts, early, deadline,
    )?))
}

/// Runs the client's half of the handshake on a connected TCP stream — the TLS
/// handshake first when `tls` is given, then the hello — before `deadline`, and returns
/// the connection. Its addresses read `tls:` or `tcp:` accordingly. `early` is a first
/// message sent right behind the hello ([`client_handshake`]).
pub(crate) fn connect_stream(
    stream: TcpStream,
    tls: Option<&ClientTls>,
    opts: &Options,
    early: Option<&[u8]>,
    deadline: Instant,
) -> Result<FramedConn<TcpWire>> {
    let setup = |e| Error::io("set up the socket", e);
    stream.set_nodelay(true).map_err(setup)?;
    let (local, peer) = (
        stream.local_addr().map_err(setup)?,
        stream.peer_addr().map_err(setup)?,
    );
    let session = tls
        .map(ClientTls::session)
        .transpose()
        .map_err(|e| Error::io("start a TLS session", e))?;
    let mut link = StreamLink::new(OwnedFd::from(stream), session);
    let scheme = link.scheme();
    let peer_max = client_handshake::<TcpWire>(&mut link, opts, early, deadline)?;
    FramedConn::new(
        link,
        opts.max_msg_size,
        peer_max,
        addr_text(scheme, local),
        addr_text(scheme, peer),
    )
    .map_err(setup)
}

/// Starts the listener's half of the handshake on an accepted TCP stream — the TLS
/// handshake first when `tls` is given, then the hello; drive it with
/// [`ServerHandshake::advance`] (it never blocks) and finish it with
/// [`ServerHandshake::finish`]. `local` is the listener's address as clients see it.
#[cfg(all(test, feature = "tls"))]
pub(crate) fn accept_stream(
    stream: TcpStream,
    tls: Option<&ServerTls>,
    local: String,
    opts: &Options,
) -> io::Result<super::framed::ServerHandshake<TcpWire>> {
    let peer = stream.peer_addr()?;
    let (link, peer) = stream_link(stream, peer, tls)?;
    Ok(super::framed::ServerHandshake::new(link, local, peer, opts))
}

/// An accepted stream as a link, with its peer's address text.
fn stream_link(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<&ServerTls>,
) -> io::Result<(StreamLink, String)> {
    stream.set_nodelay(true)?;
    let session = tls.map(ServerTls::session).transpose()?;
    let link = StreamLink::new(OwnedFd::from(stream), session);
    let peer = addr_text(link.scheme(), peer);
    Ok((link, peer))
}

/// Binds a listening TCP socket and serves `tcp:` clients on it, or `tls:` clients with
/// `tls`.
pub(crate) fn listen(
    host: &str,
    port: u16,
    tls: Option<ServerTls>,
    opts: &Options,
) -> Result<Box<dyn ListenerOps>> {
    let listener =
        TcpListener::bind(&resolve(host, port)?[..]).map_err(|e| Error::io("socket bind", e))?;
    let setup = |e| Error::io("set up the listening socket", e);
    listener.set_nonblocking(true).map_err(setup)?;
    let scheme = if tls.is_some() { "tls" } else { "tcp" };
    let addr = addr_text(scheme, listener.local_addr().map_err(setup)?);
    Ok(Box::new(FramedListener::new(
        TcpAcceptor {
            listener,
            addr,
            tls,
        },
        opts,
    )?))
}

/// A listening TCP socket.
struct TcpAcceptor {
    listener: TcpListener,
    addr: String,
    /// Set on a `tls:` listener.
    tls: Option<ServerTls>,
}

impl Acceptor for TcpAcceptor {
    type Wire = TcpWire;

    fn listen_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    fn accept(&mut self) -> io::Result<Option<(StreamLink, String)>> {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    // A client that is already gone fails here; skip it.
                    if let Ok(link) = stream_link(stream, peer, self.tls.as_ref()) {
                        return Ok(Some(link));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn local_addr(&self) -> String {
        self.addr.clone()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::transport::framed::conformance::{self, RawPeer, PATIENCE};
    use crate::{Connection, Listener};
    use std::io::{Read, Write};
    use std::thread;

    const ANY: &str = "tcp:127.0.0.1:0";

    /// A raw TCP client.
    /// A raw TCP client (of a `tcp:` or a `tls:` listener).
    pub(crate) struct RawTcp(TcpStream);

    impl RawPeer for RawTcp {
        fn connect(addr: &str) -> RawTcp {
            let s = TcpStream::connect(addr.split_once(':').unwrap().1).unwrap();
            s.set_read_timeout(Some(PATIENCE)).unwrap();
            RawTcp(s)
        }

        fn write(&mut self, bytes: &[u8]) {
            self.0.write_all(bytes).unwrap();
        }

        fn read_hello(&mut self) -> Option<[u8; HELLO_LEN]> {
            let mut h = [0u8; HELLO_LEN];
            match self.0.read_exact(&mut h) {
                Ok(()) => Some(h),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => None,
                Err(e) => panic!("{e}"),
            }
        }

        fn closed_by_peer(&mut self) -> bool {
            let mut buf = [0u8; 64];
            loop {
                match self.0.read(&mut buf) {
                    Ok(0) => return true,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return true,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                    Err(e) => panic!("{e}"),
                }
            }
        }

        fn frame(kind: Frame, payload: &[u8]) -> Vec<u8> {
            let kind = match kind {
                Frame::Data => KIND_DATA,
                Frame::Fin => KIND_FIN,
            };
            header(kind, payload.len() as u32)
                .into_iter()
                .chain(payload.iter().copied())
                .collect()
        }
    }

    /// A frame header.
    pub(crate) fn header(kind: u8, len: u32) -> [u8; HEADER_LEN] {
        let mut h = [kind, 0, 0, 0, 0];
        h[1..].copy_from_slice(&len.to_le_bytes());
        h
    }

    #[test]
    fn bad_clients_are_dropped() {
        conformance::bad_clients_are_dropped::<RawTcp>(ANY);
    }

    #[test]
    fn garbage_is_dropped_at_once() {
        conformance::garbage_is_dropped_at_once::<RawTcp>(ANY);
    }

    #[test]
    fn other_version_is_told_and_dropped() {
        conformance::other_version_is_told_and_dropped::<RawTcp>(ANY);
    }

    #[test]
    fn fin_versus_crash() {
        conformance::fin_versus_crash::<RawTcp>(ANY);
    }

    #[test]
    fn messages_behind_the_hello_are_delivered() {
        conformance::messages_behind_the_hello_are_delivered::<RawTcp>(ANY);
    }

    #[test]
    fn hostile_frames() {
        let too_big = RawTcp::frame(Frame::Data, &[0; 1001]);
        conformance::hostile_frames::<RawTcp>(
            ANY,
            &[
                &[&too_big],
                // A claim alone is enough: nothing is allocated for it.
                &[&header(KIND_DATA, 1 << 30)],
                &[&header(KIND_DATA, u32::MAX)],
                &[&[0x7f, 0, 0, 0, 0]],
                &[&header(KIND_FIN, 3), b"abc"],
            ],
        );
    }

    #[test]
    fn client_checks_listener_hello() {
        conformance::client_checks_listener_hello(|reply| {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = format!("tcp:{}", listener.local_addr().unwrap());
            let server = thread::spawn(move || {
                let (s, _) = listener.accept().unwrap();
                s.set_read_timeout(Some(PATIENCE)).unwrap();
                let mut raw = RawTcp(s);
                raw.read_hello().expect("client hello");
                if !reply.is_empty() {
                    raw.write(&reply);
                    assert!(raw.closed_by_peer());
                }
            });
            (addr, server)
        });
    }

    #[test]
    fn port_zero_reports_the_real_port() {
        let (listener, client, server) = conformance::pair(ANY, &Options::default());
        let addr = listener.local_addr();
        assert!(addr.starts_with("tcp:127.0.0.1:"), "{addr}");
        assert_ne!(addr, ANY);
        assert_eq!(client.peer_addr(), addr);
        assert_eq!(server.local_addr(), addr);
        assert_eq!(server.peer_addr(), client.local_addr());
        assert_eq!(client.transport(), crate::Transport::Tcp);
    }

    #[test]
    fn a_port_serves_one_listener() {
        let first = Listener::bind(ANY, &Options::default()).unwrap();
        let e = Listener::bind(&first.local_addr(), &Options::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}");
        assert!(e.to_string().contains(&first.local_addr()), "{e}");
    }

    #[test]
    fn host_names_resolve() {
        let mut listener = Listener::bind(ANY, &Options::default()).unwrap();
        let port = listener
            .local_addr()
            .rsplit_once(':')
            .unwrap()
            .1
            .to_string();
        let client = thread::spawn(move || {
            Connection::connect(&format!("tcp:localhost:{port}"), &Options::default()).unwrap()
        });
        let _server = conformance::accept_within(&mut listener);
        client.join().unwrap();
    }
}
