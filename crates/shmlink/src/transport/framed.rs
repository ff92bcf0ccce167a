//! What the socket transports (`ux:`, `tcp:`) share: the hello exchanged on connect, the
//! connection state machine, and the listener with its handshake queue.
//!
//! A transport supplies a [`Wire`] (how a frame is written and how frames are read back)
//! and an [`Acceptor`] (how the listening socket hands out clients). Every wire carries
//! the same two frame kinds: data (one message of any length up to the receiver's maximum,
//! zero included) and FIN, which a graceful close sends last.
//!
//! # Handshake
//!
//! Right after connecting, the client sends a [`HELLO_LEN`]-byte hello: the magic `SLNK`,
//! the protocol version, three reserved bytes, and the largest message it accepts (`u64`,
//! little-endian). The listener answers with its own hello once the client's is valid (also
//! when only the version differs, so the client can report the mismatch); clients that send
//! anything else, or nothing within the handshake timeout, are dropped without an answer
//! while the listener goes on serving others. Each side then sends messages up to the
//! smaller of the two maxima.
//!
//! # End of stream
//!
//! The receiver reports every message sent before a FIN, then [`ErrorKind::EndOfStream`];
//! end of stream or `ECONNRESET` without a FIN means the peer died
//! ([`ErrorKind::ConnectionReset`]).
//!
//! Closing never blocks. It writes what the socket takes at once; when the peer's full
//! buffers leave part of a queued message or the FIN unwritten, a short-lived thread writes
//! the rest (as the kernel does for a closed TCP socket) and gives up after
//! [`CLOSE_LINGER`] without progress. A process that exits right after closing can lose
//! that rest, and its peer then sees a reset.
//!
//! # Readiness
//!
//! The descriptor a connection exposes is a private epoll set. It holds the socket for
//! input always, the socket for output while a non-blocking send left bytes queued, and an
//! eventfd that is set while complete frames wait in user space (a stream read can return
//! several). So it is readable exactly when a call may make progress.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::options::Options;
use crate::sys::stream::{self, EventFlag, Ready};
use crate::sys::Epoll;
use crate::transport::{ConnOps, ListenerOps};

/// First bytes of every hello.
const HELLO_MAGIC: [u8; 4] = *b"SLNK";
/// Version of the framed protocol.
const PROTOCOL_VERSION: u8 = 1;
/// Length of a hello: magic, version, three reserved bytes, largest message accepted.
pub(crate) const HELLO_LEN: usize = 16;

/// How long a closed connection's remaining bytes wait for the peer to take some before
/// they are given up (the peer then sees a reset instead of the FIN).
const CLOSE_LINGER: Duration = Duration::from_secs(30);
/// Most clients a listener keeps in the middle of their handshake; beyond that the oldest
/// is dropped, so a flood of idle clients cannot exhaust descriptors.
const MAX_PENDING: usize = 128;
/// Vectors larger than this are freed after use instead of kept for the next message.
const RETAIN_MAX: usize = 4 << 20;

/// Epoll tokens of a connection's set.
const TOKEN_SOCKET: u64 = 0;
const TOKEN_FLAG: u64 = 1;
/// Epoll token of a listener's listening socket; pending clients count up from 1.
const TOKEN_LISTEN: u64 = 0;

/// A hello announcing `max_msg`.
fn hello(max_msg: usize) -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..4].copy_from_slice(&HELLO_MAGIC);
    h[4] = PROTOCOL_VERSION;
    h[8..].copy_from_slice(&(max_msg as u64).to_le_bytes());
    h
}

/// Checks a peer's hello; returns the largest message the peer accepts.
fn parse_hello(h: &[u8; HELLO_LEN]) -> Result<usize> {
    if h[..4] != HELLO_MAGIC {
        return Err(Error::violation(format!(
            "the peer is not a shmlink peer (hello starts with {:02x?})",
            &h[..4]
        )));
    }
    if h[4] != PROTOCOL_VERSION {
        return Err(Error::new(
            ErrorKind::VersionMismatch,
            format!(
                "the peer speaks framed protocol version {}, this side speaks {PROTOCOL_VERSION}",
                h[4]
            ),
        ));
    }
    let max = u64::from_le_bytes(h[8..].try_into().expect("8 bytes"));
    Ok(usize::try_from(max).unwrap_or(usize::MAX))
}

/// Sends our hello on a fresh socket, whose empty send buffer always takes it whole.
fn send_hello(sock: BorrowedFd<'_>, max_msg: usize) -> io::Result<()> {
    if stream::send_parts(sock, &hello(max_msg), &[], false)? != HELLO_LEN {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "hello did not fit a fresh socket",
        ));
    }
    Ok(())
}

/// The kind of a frame being written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// One message.
    Data,
    /// The sender closes gracefully; nothing follows.
    Fin,
}

/// What one attempt to receive found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// A whole message of this length is current.
    Message(usize),
    /// The peer's FIN.
    Fin,
    /// The socket's end of stream (not preceded by a FIN).
    Eof,
    /// Nothing yet (non-blocking).
    Empty,
}

/// How a transport puts frames on its socket and takes them off.
///
/// Errors of kind `InvalidData` mean the peer broke the protocol; the connection reports
/// them as [`ErrorKind::ProtocolViolation`].
pub(crate) trait Wire: Send + Sized + 'static {
    /// A receiver that accepts messages up to `max_recv` bytes.
    fn new(max_recv: usize) -> Self;
    /// Writes one frame from `*sent` (bytes of the frame already written) on, advancing
    /// `*sent`. Returns true when the frame is complete, false when a non-blocking write
    /// found the socket full.
    fn write(
        sock: BorrowedFd<'_>,
        frame: Frame,
        payload: &[u8],
        sent: &mut usize,
        blocking: bool,
    ) -> io::Result<bool>;
    /// Reads until a message is complete (it becomes current), a FIN or end of stream
    /// arrives, or (non-blocking) the socket has nothing more. Not called while a message
    /// is current.
    fn read(&mut self, sock: BorrowedFd<'_>, blocking: bool) -> io::Result<Incoming>;
    /// The current message.
    fn current(&self) -> &[u8];
    /// Consumes the current message.
    fn release(&mut self);
    /// Consumes the current message, handing it over without a copy where possible.
    fn take_current(&mut self) -> Vec<u8>;
    /// Whether a whole frame beyond the current message waits in user space, where the
    /// socket's readiness cannot announce it.
    fn buffered(&self) -> bool {
        false
    }
    /// Reads part of a hello without blocking, appending to `got` (never beyond
    /// [`HELLO_LEN`]). Returns the bytes read, 0 at end of stream.
    fn recv_hello(sock: BorrowedFd<'_>, got: &mut Vec<u8>) -> io::Result<usize>;
}

/// Clears `v` for reuse, freeing it if it grew large.
pub(crate) fn recycle(v: &mut Vec<u8>) {
    v.clear();
    if v.capacity() > RETAIN_MAX {
        *v = Vec::new();
    }
}

/// Hands over the message in `v`: moves the vector when the message fills at least half
/// of it, copies it otherwise (and keeps the larger buffer for the next message).
pub(crate) fn take_vec(v: &mut Vec<u8>) -> Vec<u8> {
    if v.len() * 2 >= v.capacity() {
        std::mem::take(v)
    } else {
        let out = v.to_vec();
        recycle(v);
        out
    }
}

/// Runs the client's half of the handshake on a connected socket; returns the largest
/// message the listener accepts.
pub(crate) fn client_handshake<W: Wire>(
    sock: BorrowedFd<'_>,
    max_msg: usize,
    deadline: Instant,
) -> Result<usize> {
    send_hello(sock, max_msg).map_err(|e| Error::io("send hello", e))?;
    let mut got = Vec::with_capacity(HELLO_LEN);
    while got.len() < HELLO_LEN {
        match W::recv_hello(sock, &mut got) {
            Ok(0) => {
                return Err(Error::new(
                    ErrorKind::ConnectionRefused,
                    "the listener closed the connection during the handshake",
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !stream::wait(sock, Ready::Read, Some(deadline))
                    .map_err(|e| Error::io("wait for hello", e))?
                {
                    return Err(Error::new(
                        ErrorKind::TimedOut,
                        "no hello from the listener within the connect timeout",
                    ));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return Err(Error::violation(format!("listener's hello: {e}")))
            }
            Err(e) => return Err(Error::io("receive hello", e)),
        }
    }
    parse_hello(got[..].try_into().expect("HELLO_LEN bytes"))
}

/// A terminal state remembered so that every later call reports it again.
struct Ended {
    kind: ErrorKind,
    msg: String,
}

impl Ended {
    fn of(e: &Error) -> Ended {
        Ended {
            kind: e.kind(),
            msg: e.to_string(),
        }
    }

    fn error(&self) -> Error {
        Error::new(self.kind, self.msg.clone())
    }
}

/// A message a non-blocking send could not write whole.
struct Queued {
    payload: Vec<u8>,
    /// Bytes of its frame already written.
    sent: usize,
}

/// Writes one frame, waiting for room in blocking mode. Returns false when a non-blocking
/// write found the socket full.
fn write_frame<W: Wire>(
    sock: BorrowedFd<'_>,
    frame: Frame,
    payload: &[u8],
    sent: &mut usize,
    blocking: bool,
) -> io::Result<bool> {
    loop {
        if W::write(sock, frame, payload, sent, blocking)? {
            return Ok(true);
        }
        if !blocking {
            return Ok(false);
        }
        // The socket is in blocking mode, so the kernel waits for room itself; should it
        // ever report EAGAIN anyway, wait here rather than spin.
        stream::wait(sock, Ready::Write, None)?;
    }
}

/// A connection over a framed socket transport.
pub(crate) struct FramedConn<W: Wire> {
    sock: OwnedFd,
    wire: W,
    /// The pollable descriptor ([`ConnOps::fd`]).
    epoll: Epoll,
    /// Set while whole frames wait in the wire's buffer (created on first need).
    flag: Option<EventFlag>,
    flag_set: bool,
    /// Whether the epoll set watches the socket for output (exactly while `queued`).
    out_watched: bool,
    queued: Option<Queued>,
    /// The message being built in place; its capacity is reused.
    staging: Vec<u8>,
    staged_blocking: bool,
    /// Length of the current received message.
    current: Option<usize>,
    rx_end: Option<Ended>,
    tx_end: Option<Ended>,
    max_send: usize,
    local: String,
    peer: String,
}

impl<W: Wire> FramedConn<W> {
    /// Wraps a socket whose handshake is done. `max_recv` is our limit, `peer_max` the
    /// peer's.
    pub(crate) fn new(
        sock: OwnedFd,
        max_recv: usize,
        peer_max: usize,
        local: String,
        peer: String,
    ) -> io::Result<FramedConn<W>> {
        stream::set_blocking(sock.as_fd())?;
        let epoll = Epoll::new()?;
        epoll.add(sock.as_raw_fd(), libc::EPOLLIN as u32, TOKEN_SOCKET)?;
        Ok(FramedConn {
            sock,
            wire: W::new(max_recv),
            epoll,
            flag: None,
            flag_set: false,
            out_watched: false,
            queued: None,
            staging: Vec::new(),
            staged_blocking: true,
            current: None,
            rx_end: None,
            tx_end: None,
            max_send: max_recv.min(peer_max),
            local,
            peer,
        })
    }

    fn send_error(&self, e: io::Error) -> Error {
        Error::io(format!("send to {}", self.peer), e)
    }

    fn recv_error(&self, e: io::Error) -> Error {
        if e.kind() == io::ErrorKind::InvalidData {
            Error::violation(format!("receive from {}: {e}", self.peer))
        } else {
            Error::io(format!("receive from {}", self.peer), e)
        }
    }

    /// Remembers a send-side failure; every later send reports it.
    fn end_tx(&mut self, e: Error) -> Error {
        self.tx_end = Some(Ended::of(&e));
        self.queued = None;
        e
    }

    /// Remembers how the receive side ended; every later receive reports it.
    fn end_rx(&mut self, e: Error) -> Error {
        self.rx_end = Some(Ended::of(&e));
        e
    }

    /// Fails if sending can no longer succeed.
    fn check_tx(&self) -> Result<()> {
        if let Some(end) = &self.tx_end {
            return Err(end.error());
        }
        match &self.rx_end {
            Some(end) if end.kind == ErrorKind::EndOfStream => Err(Error::reset(format!(
                "send to {}: the peer closed the connection",
                self.peer
            ))),
            Some(end) => Err(end.error()),
            None => Ok(()),
        }
    }

    /// Makes the epoll set watch the socket for output exactly while bytes are queued.
    fn watch_output(&mut self, on: bool) -> Result<()> {
        if on != self.out_watched {
            let mut events = libc::EPOLLIN as u32;
            if on {
                events |= libc::EPOLLOUT as u32;
            }
            self.epoll
                .modify(self.sock.as_raw_fd(), events, TOKEN_SOCKET)
                .map_err(|e| Error::io(format!("watch the connection to {}", self.peer), e))?;
            self.out_watched = on;
        }
        Ok(())
    }

    /// Makes the eventfd flag mirror whether whole frames wait in the wire's buffer.
    fn sync_flag(&mut self) -> Result<()> {
        let want = self.wire.buffered();
        if want == self.flag_set {
            return Ok(());
        }
        let ctx = |e| Error::io(format!("flag buffered input from {}", self.peer), e);
        if self.flag.is_none() {
            let flag = EventFlag::new().map_err(ctx)?;
            self.epoll
                .add(flag.fd().as_raw_fd(), libc::EPOLLIN as u32, TOKEN_FLAG)
                .map_err(ctx)?;
            self.flag = Some(flag);
        }
        let flag = self.flag.as_ref().expect("created above");
        if want { flag.set() } else { flag.clear() }.map_err(ctx)?;
        self.flag_set = want;
        Ok(())
    }

    /// Writes queued bytes. Returns true when the queue is empty.
    fn flush(&mut self, blocking: bool) -> Result<bool> {
        let Some(q) = &mut self.queued else {
            return Ok(true);
        };
        let sock = self.sock.as_fd();
        match write_frame::<W>(sock, Frame::Data, &q.payload, &mut q.sent, blocking) {
            Ok(true) => {
                let q = self.queued.take().expect("checked above");
                if self.staging.capacity() < q.payload.capacity() {
                    self.staging = q.payload;
                    recycle(&mut self.staging);
                }
                self.watch_output(false)?;
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) => {
                let e = self.send_error(e);
                let e = self.end_tx(e);
                self.watch_output(false)?;
                Err(e)
            }
        }
    }

    /// Gets ready to send one more message: the queue must drain first.
    fn before_send(&mut self, blocking: bool) -> Result<()> {
        self.check_tx()?;
        if !self.flush(blocking)? {
            return Err(Error::would_block());
        }
        Ok(())
    }

    /// Queues what a non-blocking write left of a frame.
    fn enqueue(&mut self, payload: Vec<u8>, sent: usize) -> Result<()> {
        self.queued = Some(Queued { payload, sent });
        self.watch_output(true)
    }

    /// Sends the staged message.
    fn send_staged(&mut self) -> Result<()> {
        let mut sent = 0;
        let sock = self.sock.as_fd();
        match write_frame::<W>(
            sock,
            Frame::Data,
            &self.staging,
            &mut sent,
            self.staged_blocking,
        ) {
            Ok(true) => {
                recycle(&mut self.staging);
                Ok(())
            }
            Ok(false) => {
                let frame = std::mem::take(&mut self.staging);
                self.enqueue(frame, sent)
            }
            Err(e) => {
                let e = self.send_error(e);
                Err(self.end_tx(e))
            }
        }
    }

    /// Delivers the queue and a FIN. What the peer's full buffers do not take now is left
    /// to a thread, so that closing never blocks (like the kernel, which delivers a closed
    /// TCP socket's buffer in the background).
    fn finish(&mut self) -> Result<()> {
        let mut fin_sent = 0;
        if self.flush(false)? {
            let sock = self.sock.as_fd();
            if W::write(sock, Frame::Fin, &[], &mut fin_sent, false)
                .map_err(|e| self.send_error(e))?
            {
                stream::discard_input(sock);
                return Ok(());
            }
        }
        let sock = self
            .sock
            .try_clone()
            .map_err(|e| Error::io("keep the socket for closing", e))?;
        let queued = self.queued.take();
        std::thread::Builder::new()
            .name("shmlink-close".into())
            .spawn(move || linger::<W>(sock, queued, fin_sent))
            .map_err(|e| Error::io("start the closing thread", e))?;
        Ok(())
    }
}

/// Writes what a closed connection has left: the queue, then the FIN; gives up when the
/// peer takes nothing for [`CLOSE_LINGER`] or is gone.
fn linger<W: Wire>(sock: OwnedFd, queued: Option<Queued>, mut fin_sent: usize) {
    let sock = sock.as_fd();
    let write_all = |frame, payload: &[u8], sent: &mut usize| -> io::Result<bool> {
        while !W::write(sock, frame, payload, sent, false)? {
            if !stream::wait(sock, Ready::Write, Some(Instant::now() + CLOSE_LINGER))? {
                return Ok(false);
            }
        }
        Ok(true)
    };
    let done = match queued {
        Some(mut q) => write_all(Frame::Data, &q.payload, &mut q.sent),
        None => Ok(true),
    }
    .and_then(|ok| Ok(ok && write_all(Frame::Fin, &[], &mut fin_sent)?));
    if matches!(done, Ok(true)) {
        stream::discard_input(sock);
    }
}

impl<W: Wire> ConnOps for FramedConn<W> {
    fn into_shm(
        self: Box<Self>,
    ) -> std::result::Result<Box<crate::transport::shm::ShmConn>, Box<dyn ConnOps>> {
        Err(self)
    }

    fn send(&mut self, msg: &[u8], blocking: bool) -> Result<()> {
        self.before_send(blocking)?;
        let mut sent = 0;
        let sock = self.sock.as_fd();
        match write_frame::<W>(sock, Frame::Data, msg, &mut sent, blocking) {
            Ok(true) => Ok(()),
            Ok(false) => {
                // Accepted: the rest goes out on later calls.
                let mut frame = std::mem::take(&mut self.staging);
                frame.clear();
                frame.extend_from_slice(msg);
                self.enqueue(frame, sent)
            }
            Err(e) => {
                let e = self.send_error(e);
                Err(self.end_tx(e))
            }
        }
    }

    fn reserve(&mut self, n: usize, blocking: bool) -> Result<()> {
        self.before_send(blocking)?;
        self.staging.clear();
        self.staging.resize(n, 0);
        self.staged_blocking = blocking;
        Ok(())
    }

    fn reserved(&self) -> &[u8] {
        &self.staging
    }

    fn reserved_mut(&mut self) -> &mut [u8] {
        &mut self.staging
    }

    fn commit(&mut self) -> Result<()> {
        self.send_staged()
    }

    fn abort_reserve(&mut self) {
        recycle(&mut self.staging);
    }

    fn recv_next(&mut self, blocking: bool) -> Result<usize> {
        if let Some(n) = self.current {
            return Ok(n);
        }
        if let Some(end) = &self.rx_end {
            return Err(end.error());
        }
        // A failed flush is remembered for the next send; the peer's messages may still
        // be waiting here.
        let _ = self.flush(false);
        loop {
            // With bytes queued, a blocking read must also wake for output room, or two
            // peers could wait for each other.
            let kernel_blocking = blocking && self.queued.is_none();
            let sock = self.sock.as_fd();
            match self.wire.read(sock, kernel_blocking) {
                Ok(Incoming::Message(n)) => {
                    self.current = Some(n);
                    self.sync_flag()?;
                    return Ok(n);
                }
                Ok(Incoming::Fin) => {
                    self.sync_flag()?;
                    return Err(self.end_rx(Error::eos()));
                }
                Ok(Incoming::Eof) => {
                    let e = Error::reset(format!(
                        "receive from {}: the peer closed the connection without FIN \
                         (it crashed or was killed)",
                        self.peer
                    ));
                    return Err(self.end_rx(e));
                }
                Ok(Incoming::Empty) if blocking => {
                    let ready = if self.queued.is_some() {
                        Ready::ReadWrite
                    } else {
                        Ready::Read
                    };
                    stream::wait(sock, ready, None).map_err(|e| self.recv_error(e))?;
                    let _ = self.flush(false);
                }
                Ok(Incoming::Empty) => {
                    self.sync_flag()?;
                    return Err(Error::would_block());
                }
                Err(e) => {
                    let e = self.recv_error(e);
                    return Err(self.end_rx(e));
                }
            }
        }
    }

    fn current(&self) -> &[u8] {
        if self.current.is_some() {
            self.wire.current()
        } else {
            &[]
        }
    }

    fn release(&mut self) {
        if self.current.take().is_some() {
            self.wire.release();
        }
    }

    fn take_current(&mut self) -> Vec<u8> {
        if self.current.take().is_some() {
            self.wire.take_current()
        } else {
            Vec::new()
        }
    }

    fn max_send_size(&self) -> usize {
        self.max_send
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.epoll.fd()
    }

    fn close(&mut self) -> Result<()> {
        if self.tx_end.is_some() || self.rx_end.is_some() {
            // The peer is gone or finished (or broke the protocol): nothing to deliver.
            stream::discard_input(self.sock.as_fd());
            return Ok(());
        }
        self.finish()
    }

    fn local_addr(&self) -> String {
        self.local.clone()
    }

    fn peer_addr(&self) -> String {
        self.peer.clone()
    }
}

/// How a transport's listening socket hands out clients.
pub(crate) trait Acceptor: Send + 'static {
    /// The wire accepted connections speak.
    type Wire: Wire;
    /// The listening socket.
    fn listen_fd(&self) -> BorrowedFd<'_>;
    /// Takes one waiting client without blocking: its socket and address text. `None`
    /// when nobody waits.
    fn accept(&mut self) -> io::Result<Option<(OwnedFd, String)>>;
    /// The bound address, as text with the transport prefix.
    fn local_addr(&self) -> String;
}

/// A client whose hello has not arrived yet.
struct Pending {
    sock: OwnedFd,
    peer: String,
    deadline: Instant,
    hello: Vec<u8>,
}

/// A listener over a framed socket transport: accepts sockets, runs their handshakes
/// without letting a slow or hostile client hold up others, and hands out connections.
pub(crate) struct FramedListener<A: Acceptor> {
    acceptor: A,
    /// Holds the listening socket and every pending client ([`ListenerOps::fd`]).
    epoll: Epoll,
    pending: HashMap<u64, Pending>,
    next_token: u64,
    events: Vec<(u64, u32)>,
    max_msg: usize,
    handshake_timeout: Duration,
}

impl<A: Acceptor> FramedListener<A> {
    /// Serves clients of `acceptor` with the limits in `opts`.
    pub(crate) fn new(acceptor: A, opts: &Options) -> Result<FramedListener<A>> {
        let ctx = |e| Error::io("create the listener's epoll set", e);
        let epoll = Epoll::new().map_err(ctx)?;
        epoll
            .add(
                acceptor.listen_fd().as_raw_fd(),
                libc::EPOLLIN as u32,
                TOKEN_LISTEN,
            )
            .map_err(ctx)?;
        Ok(FramedListener {
            acceptor,
            epoll,
            pending: HashMap::new(),
            next_token: TOKEN_LISTEN + 1,
            events: Vec::new(),
            max_msg: opts.max_msg_size,
            handshake_timeout: opts.handshake_timeout,
        })
    }

    /// An OS error of this listener, naming its address.
    fn error(&self, what: &str, e: io::Error) -> Error {
        Error::io(format!("{what} on {}", self.acceptor.local_addr()), e)
    }

    /// Takes one new client into the pending set and tries its handshake at once.
    fn accept_new(&mut self) -> Result<Option<Box<dyn ConnOps>>> {
        let Some((sock, peer)) = self
            .acceptor
            .accept()
            .map_err(|e| self.error("accept", e))?
        else {
            return Ok(None);
        };
        if self.pending.len() >= MAX_PENDING {
            let oldest = self
                .pending
                .iter()
                .min_by_key(|(_, p)| p.deadline)
                .map(|(&t, _)| t);
            if let Some(t) = oldest {
                self.pending.remove(&t);
            }
        }
        let token = self.next_token;
        self.next_token += 1;
        self.epoll
            .add(sock.as_raw_fd(), libc::EPOLLIN as u32, token)
            .map_err(|e| self.error("watch a new client", e))?;
        self.pending.insert(
            token,
            Pending {
                sock,
                peer,
                deadline: Instant::now() + self.handshake_timeout,
                hello: Vec::with_capacity(HELLO_LEN),
            },
        );
        self.advance(token)
    }

    /// Reads what a pending client sent; returns its connection once its hello is
    /// complete and valid. Bad clients are dropped (closing a socket also removes it from
    /// the epoll set).
    fn advance(&mut self, token: u64) -> Result<Option<Box<dyn ConnOps>>> {
        let Some(p) = self.pending.get_mut(&token) else {
            return Ok(None);
        };
        match <A::Wire as Wire>::recv_hello(p.sock.as_fd(), &mut p.hello) {
            Ok(0) => {
                self.pending.remove(&token);
                return Ok(None);
            }
            Ok(_) if p.hello.len() < HELLO_LEN => return Ok(None),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(_) => {
                self.pending.remove(&token);
                return Ok(None);
            }
        }
        let p = self.pending.remove(&token).expect("looked up above");
        let peer_max = match parse_hello(p.hello[..].try_into().expect("HELLO_LEN bytes")) {
            Ok(max) => max,
            Err(e) => {
                if e.kind() == ErrorKind::VersionMismatch {
                    // Tell the client which version we speak; it reports the mismatch.
                    let _ = send_hello(p.sock.as_fd(), self.max_msg);
                }
                return Ok(None);
            }
        };
        // The socket moves to the connection's own epoll set.
        self.epoll
            .delete(p.sock.as_raw_fd())
            .map_err(|e| self.error("unwatch a client", e))?;
        if send_hello(p.sock.as_fd(), self.max_msg).is_err() {
            return Ok(None);
        }
        let conn = FramedConn::<A::Wire>::new(
            p.sock,
            self.max_msg,
            peer_max,
            self.acceptor.local_addr(),
            p.peer,
        )
        .map_err(|e| self.error("set up an accepted connection", e))?;
        Ok(Some(Box::new(conn)))
    }

    /// Handles one batch of readiness events.
    fn handle(&mut self, events: &[(u64, u32)]) -> Result<Option<Box<dyn ConnOps>>> {
        for &(token, _) in events {
            let conn = if token == TOKEN_LISTEN {
                self.accept_new()?
            } else {
                self.advance(token)?
            };
            if conn.is_some() {
                // Events not handled yet are reported again (level-triggered).
                return Ok(conn);
            }
        }
        Ok(None)
    }
}

impl<A: Acceptor> ListenerOps for FramedListener<A> {
    fn accept(&mut self, blocking: bool) -> Result<Box<dyn ConnOps>> {
        loop {
            let now = Instant::now();
            self.pending.retain(|_, p| p.deadline > now);
            let deadline = if blocking {
                self.pending.values().map(|p| p.deadline).min()
            } else {
                Some(now)
            };
            let mut events = std::mem::take(&mut self.events);
            let res = self
                .epoll
                .wait(deadline, &mut events)
                .map_err(|e| self.error("wait for clients", e))
                .and_then(|()| self.handle(&events));
            self.events = events;
            if let Some(conn) = res? {
                return Ok(conn);
            }
            if !blocking {
                return Err(Error::would_block());
            }
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.epoll.fd()
    }

    fn local_addr(&self) -> String {
        self.acceptor.local_addr()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Unit tests of the shared parts, and the behaviour every framed transport must show,
    //! as functions each transport's tests call with its addresses.

    use super::*;
    use crate::{Connection, Listener};
    use std::os::fd::AsFd;
    use std::thread;

    /// How long a test waits for something that should happen at once.
    pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

    fn soon() -> Option<Instant> {
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

    #[test]
    fn hello_round_trips_and_rejects_garbage() {
        assert_eq!(parse_hello(&hello(12345)).unwrap(), 12345);
        let mut bad = hello(1);
        bad[0] = b'X';
        assert_eq!(
            parse_hello(&bad).unwrap_err().kind(),
            ErrorKind::ProtocolViolation
        );
        let mut newer = hello(1);
        newer[4] = PROTOCOL_VERSION + 1;
        let e = parse_hello(&newer).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::VersionMismatch);
        assert!(e.to_string().contains("version 2"), "{e}");
    }

    #[test]
    fn take_vec_moves_full_buffers_and_copies_small_ones() {
        let mut v = Vec::with_capacity(100);
        v.extend_from_slice(&[1; 60]);
        let ptr = v.as_ptr();
        let taken = take_vec(&mut v);
        assert_eq!(taken.as_ptr(), ptr);
        assert_eq!(v.capacity(), 0);
        let mut v = Vec::with_capacity(100);
        v.extend_from_slice(&[1; 10]);
        assert_eq!(take_vec(&mut v), [1; 10]);
        assert!(v.is_empty() && v.capacity() >= 100);
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
            let _ = Connection::connect(&self.0, &Options::default());
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
        let small = Options::default().max_msg_size(1000);
        let big = Options::default();
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
        let (_l, mut client, server) = pair(bind, &Options::default());
        let server = echo_server(server);
        let sizes = [0, 1, 5, 100, 65535, 65536, 65537, 200_000, 1 << 20, 0, 3];
        let mut buf = vec![0u8; 1 << 20];
        for (i, &size) in sizes.iter().enumerate() {
            let msg = pattern(size, i as u8);
            client.send(&msg).unwrap();
            match i % 3 {
                0 => assert_eq!(client.recv_vec().unwrap(), msg),
                1 => assert_eq!(&*client.recv_ref().unwrap(), &msg[..]),
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
        let (_l, mut client, mut server) = pair(bind, &Options::default());
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
        let (_l, mut client, mut server) = pair(bind, &Options::default());
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
        let (_l, mut client, server) = pair(bind, &Options::default());
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
        let (_l, mut client, mut server) = pair(bind, &Options::default());
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
            match server.recv_ref().map(|m| *m == chunk[..]) {
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
        let (_l, mut client, mut server) = pair(bind, &Options::default());
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
        let (_l, mut client, mut server) = pair(bind, &Options::default());
        let sender = thread::spawn(move || {
            for i in 0..300u32 {
                let mut msg = pattern(50_000, i as u8);
                msg[..4].copy_from_slice(&i.to_le_bytes());
                client.send(&msg).unwrap();
            }
        });
        for i in 0..300u32 {
            let m = server.recv_ref().unwrap();
            assert_eq!(m.len(), 50_000);
            assert_eq!(m[..4], i.to_le_bytes());
            assert_eq!(m[4..], pattern(50_000, i as u8)[4..]);
        }
        sender.join().unwrap();
    }

    /// What a non-blocking send queued is still delivered when the sender closes at once.
    pub(crate) fn close_delivers_queued_messages(bind: &str) {
        let (_l, mut client, mut server) = pair(bind, &Options::default());
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
        let (_l, mut client, mut server) = pair(bind, &Options::default());
        drop(client.reserve(3).unwrap());
        let mut buf = client.reserve(5).unwrap();
        buf.copy_from_slice(b"hello");
        buf.commit().unwrap();
        let mut small = [0u8; 2];
        let e = server.recv(&mut small).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::MessageTooLarge);
        assert_eq!(&*server.recv_ref().unwrap(), b"hello");
        client.send(b"next").unwrap();
        assert_eq!(server.recv_vec().unwrap(), b"next");
        assert_eq!(server.counters().msgs_in, 2);
    }

    /// A non-blocking listener says WouldBlock and its fd announces clients.
    pub(crate) fn nonblocking_accept(bind: &str) {
        let mut listener = Listener::bind(bind, &Options::default()).unwrap();
        listener.set_nonblocking(true);
        assert_eq!(listener.accept().unwrap_err().kind(), ErrorKind::WouldBlock);
        assert!(!readable(listener.as_fd(), now()));
        let addr = listener.local_addr();
        let client = thread::spawn(move || {
            let mut c = Connection::connect(&addr, &Options::default()).unwrap();
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
        let e = Connection::connect(addr, &Options::default()).unwrap_err();
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
        let opts = Options::default().handshake_timeout(Duration::from_millis(300));
        let mut listener = Listener::bind(bind, &opts).unwrap();
        let addr = listener.local_addr();
        let mut garbage = R::connect(&addr);
        garbage.write(b"GET / HTTP/1.1\r\n");
        let silent = R::connect(&addr);
        let good = {
            let addr = addr.clone();
            thread::spawn(move || {
                let mut c = Connection::connect(&addr, &Options::default()).unwrap();
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

    /// A client of another protocol version gets our hello (so it can report the
    /// mismatch) and is dropped.
    pub(crate) fn other_version_is_told_and_dropped<R: RawPeer + Send + 'static>(bind: &str) {
        let mut listener = Listener::bind(bind, &Options::default()).unwrap();
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
            let mut listener = Listener::bind(bind, &Options::default()).unwrap();
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
        let opts = Options::default().max_msg_size(1000);
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
            let e = Connection::connect(&addr, &Options::default()).unwrap_err();
            assert_eq!(e.kind(), kind, "{e}");
            assert!(e.to_string().contains(&addr), "{e}");
            server.join().unwrap();
        }
    }
}
