//! The public API: [`Listener`], [`Connection`] and the in-place send/receive guards.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;

use crate::addr::{Address, Transport};
use crate::error::{Error, ErrorKind, Result};
use crate::options::Options;
use crate::status::{Counters, SharedCounters};
use crate::transport::{self, with_conn, Accepted, Conn, ConnOps, ListenerOps};
use crate::view::SharedBytes;

/// A server socket: binds an address and accepts connections.
///
/// ```
/// # std::env::set_var("SHMLINK_DIR", std::env::temp_dir().join(format!("shmlink-doc-{}", std::process::id())));
/// use shmlink::{Connection, Listener, Options};
/// let mut listener = Listener::bind("shm:doc-listener", &Options::default())?;
/// let client = std::thread::spawn(|| -> shmlink::Result<Vec<u8>> {
///     let mut c = Connection::connect("shm:doc-listener", &Options::default())?;
///     c.send(b"ping")?;
///     c.recv_vec()
/// });
/// let mut server = listener.accept()?;
/// let ping = server.recv_vec()?;
/// server.send(&ping)?;
/// assert_eq!(client.join().unwrap()?, b"ping");
/// # Ok::<(), shmlink::Error>(())
/// ```
///
/// `Send` (serve it from any thread), not `Sync`: `accept` takes `&mut self`.
pub struct Listener {
    ops: Box<dyn ListenerOps>,
    nonblocking: bool,
}

impl Listener {
    /// Binds `addr` (`shm:NAME`, `ux:NAME`, `tcp:HOST:PORT`, `tls:HOST:PORT`, …).
    pub fn bind(addr: &str, opts: &Options) -> Result<Listener> {
        opts.validate()?;
        let parsed = Address::parse(addr)?;
        let ops = (transport::lookup(&parsed).bind)(&parsed, opts)
            .map_err(|e| e.context(format_args!("bind {addr}")))?;
        Ok(Listener {
            ops,
            nonblocking: false,
        })
    }

    /// Waits for the next client and completes its handshake. Clients that fail the
    /// handshake are refused with a reason and skipped; the listener keeps serving.
    /// In non-blocking mode, returns [`ErrorKind::WouldBlock`] when no client is ready.
    pub fn accept(&mut self) -> Result<Connection> {
        let Accepted { conn, counters } = self.ops.accept(!self.nonblocking)?;
        let conn = Connection::from_ops(conn, counters);
        crate::trace::event!(
            info,
            listener = %self.local_addr(),
            peer = %conn.peer_addr(),
            transport = %conn.transport(),
            "accepted"
        );
        Ok(conn)
    }

    /// An endless iterator over accepted connections, like
    /// [`std::net::TcpListener::incoming`]: each item is what [`accept`](Self::accept)
    /// returns. Refused clients never appear (the listener skips them); an error item is
    /// the listener's own failure (or [`ErrorKind::WouldBlock`] in non-blocking mode) and
    /// the iteration may go on after it.
    ///
    /// ```
    /// # std::env::set_var("SHMLINK_DIR", std::env::temp_dir().join(format!("shmlink-doc-{}", std::process::id())));
    /// use shmlink::{Connection, Listener, Options};
    /// let mut listener = Listener::bind("shm:doc-incoming", &Options::default())?;
    /// let client = std::thread::spawn(|| Connection::connect("shm:doc-incoming", &Options::default()));
    /// for conn in listener.incoming().take(1) {
    ///     let conn = conn?;
    ///     assert_eq!(conn.transport(), shmlink::Transport::Shm);
    /// }
    /// client.join().unwrap()?;
    /// # Ok::<(), shmlink::Error>(())
    /// ```
    pub fn incoming(&mut self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    /// Switches non-blocking mode; the listener's fd is readable when `accept` may succeed.
    pub fn set_nonblocking(&mut self, nonblocking: bool) {
        self.nonblocking = nonblocking;
    }

    /// The bound address (for `tcp:HOST:0` and `tls:HOST:0`, with the port the OS chose).
    pub fn local_addr(&self) -> String {
        self.ops.local_addr()
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ops.fd()
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        self.ops.fd().as_raw_fd()
    }
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.local_addr())
            .finish()
    }
}

/// The iterator [`Listener::incoming`] returns: never ends, each item is one
/// [`Listener::accept`].
///
/// `Send`, like the [`Listener`] it borrows.
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a mut Listener,
}

impl Iterator for Incoming<'_> {
    type Item = Result<Connection>;

    fn next(&mut self) -> Option<Result<Connection>> {
        Some(self.listener.accept())
    }
}

/// A connection: reliable, ordered, message-boundary-preserving, flow-controlled.
///
/// Blocking by default; in non-blocking mode calls return [`ErrorKind::WouldBlock`] and the
/// connection's fd ([`AsRawFd`]) becomes readable when it is worth calling again or the
/// peer is gone. Zero-length messages are valid messages; the end of the stream is
/// reported as [`ErrorKind::EndOfStream`], never as a length of 0.
///
/// `Send`, not `Sync`: move it to the thread that serves it; every call takes
/// `&mut self`. To send from one thread while another receives, [`split`](Self::split) it.
pub struct Connection {
    ops: Conn,
    /// The transport's limit, cached: it is checked on every send.
    max_send: usize,
    nonblocking: bool,
    /// What the messages travel over (for `auto:`, what it settled on).
    transport: Transport,
    /// Shared with the listener that accepted the connection, if it keeps track of it.
    counters: Arc<SharedCounters>,
    closed: bool,
    /// Whether the peer's death was reported (`tracing` feature), so it is reported once.
    #[cfg(feature = "tracing")]
    reset_seen: bool,
}

impl Connection {
    /// `counters`: those the listener reads, if it keeps track of the connection.
    fn from_ops(ops: Box<dyn ConnOps>, counters: Option<Arc<SharedCounters>>) -> Connection {
        let local = ops.local_addr();
        let transport = local
            .split_once(':')
            .and_then(|(prefix, _)| prefix.parse().ok())
            .unwrap_or_else(|| panic!("transport gave a local address without prefix: {local:?}"));
        Connection {
            max_send: ops.max_send_size(),
            transport,
            ops: ops.into(),
            nonblocking: false,
            counters: counters.unwrap_or_else(|| Arc::new(SharedCounters::new())),
            closed: false,
            #[cfg(feature = "tracing")]
            reset_seen: false,
        }
    }

    /// Connects to `addr`, waiting at most the connect timeout for the handshake.
    pub fn connect(addr: &str, opts: &Options) -> Result<Connection> {
        opts.validate()?;
        let parsed = Address::parse(addr)?;
        let ops = (transport::lookup(&parsed).connect)(&parsed, opts)
            .map_err(|e| e.context(format_args!("connect {addr}")))?;
        Ok(Connection::from_ops(ops, None))
    }

    /// Reports (`tracing` feature) the first [`ErrorKind::ConnectionReset`]: the peer
    /// died or broke the connection.
    #[cold]
    fn failed(&mut self, e: Error) -> Error {
        #[cfg(feature = "tracing")]
        if e.kind() == ErrorKind::ConnectionReset && !self.reset_seen {
            self.reset_seen = true;
            crate::trace::event!(
                warn,
                local = %self.local_addr(),
                peer = %self.peer_addr(),
                error = %e,
                "peer died or reset the connection"
            );
        }
        e
    }

    #[inline]
    fn check_open(&self) -> Result<()> {
        if self.closed {
            return Err(Error::new(ErrorKind::Closed, "connection already closed"));
        }
        Ok(())
    }

    #[inline]
    fn check_size(&self, n: usize) -> Result<()> {
        let max = self.max_send;
        if n > max {
            return Err(Error::new(
                ErrorKind::MessageTooLarge,
                format!(
                    "message of {n} bytes exceeds the maximum of {max} bytes on {}",
                    self.peer_addr()
                ),
            ));
        }
        Ok(())
    }

    /// Sends one message. Blocks while the peer's receive window is full (flow control).
    #[inline]
    pub fn send(&mut self, msg: &[u8]) -> Result<()> {
        self.check_open()?;
        self.check_size(msg.len())?;
        if let Err(e) = with_conn!(&mut self.ops, |c| c.send(msg, !self.nonblocking)) {
            return Err(self.failed(e));
        }
        self.counters.count_out(msg.len());
        Ok(())
    }

    /// Reserves room for a message of `n` bytes to fill in place; send it with
    /// [`SendBuf::commit`]. On `shm:` the bytes are written straight into the ring when
    /// the message fits in one record (half the ring); larger messages are staged. On
    /// `vm:` they are written into a private buffer that `commit` copies into the ring
    /// (any guest on the region can write the ring, so no slice over it is lent).
    ///
    /// ```
    /// # fn demo(conn: &mut shmlink::Connection) -> shmlink::Result<()> {
    /// let mut buf = conn.reserve(8)?;
    /// buf.copy_from_slice(&42u64.to_le_bytes());
    /// buf.commit()?;
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn reserve(&mut self, n: usize) -> Result<SendBuf<'_>> {
        self.check_open()?;
        self.check_size(n)?;
        with_conn!(&mut self.ops, |c| c.reserve(n, !self.nonblocking))?;
        Ok(SendBuf {
            conn: self,
            len: n,
            done: false,
        })
    }

    /// Starts a batch: messages sent through the returned [`Batch`] are the same
    /// messages, in the same order, under the same flow control as with
    /// [`send`](Self::send) and [`reserve`](Self::reserve), but a transport may publish
    /// them together: `shm:` makes them visible to the peer with one store of its ring
    /// position and one full fence when the batch ends (or before it would wait for room)
    /// instead of one per message. The peer may see them earlier, never later than the
    /// end of the batch (dropping the [`Batch`] ends it). Other transports send each
    /// message at once.
    ///
    /// ```
    /// # fn demo(conn: &mut shmlink::Connection) -> shmlink::Result<()> {
    /// let mut batch = conn.batch();
    /// for i in 0..16u64 {
    ///     batch.send(&i.to_le_bytes())?;
    /// }
    /// batch.finish();
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn batch(&mut self) -> Batch<'_> {
        self.begin_batch();
        Batch { conn: self }
    }

    /// Starts a batch without a guard (for a connection kept in a struct); messages sent
    /// until [`end_batch`](Self::end_batch) may be published together, as in
    /// [`batch`](Self::batch). Any wait (for room, for a message) publishes them first,
    /// so a batch never holds back what the peer needs to answer. Calling it inside a
    /// batch does nothing.
    #[inline]
    pub fn begin_batch(&mut self) {
        with_conn!(&mut self.ops, |c| c.begin_batch());
    }

    /// Ends a batch begun with [`begin_batch`](Self::begin_batch): everything sent in it
    /// is published. Outside a batch it does nothing.
    #[inline]
    pub fn end_batch(&mut self) {
        with_conn!(&mut self.ops, |c| c.end_batch());
    }

    #[inline]
    fn next(&mut self) -> Result<usize> {
        self.check_open()?;
        match with_conn!(&mut self.ops, |c| c.recv_next(!self.nonblocking)) {
            Ok(n) => Ok(n),
            Err(e) => Err(self.failed(e)),
        }
    }

    #[inline]
    fn count_in(&mut self, n: usize) {
        self.counters.count_in(n);
    }

    /// Receives one message into `buf`; returns its length. If the message does not fit,
    /// returns [`ErrorKind::MessageTooLarge`] and leaves it queued, so nothing is lost.
    #[inline]
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        self.check_open()?;
        let blocking = !self.nonblocking;
        match with_conn!(&mut self.ops, |c| c.recv_into(buf, blocking)) {
            Ok(Some(n)) => {
                self.count_in(n);
                return Ok(n);
            }
            Ok(None) => {}
            Err(e) => return Err(self.failed(e)),
        }
        let n = self.next()?;
        if n > buf.len() {
            return Err(Error::new(
                ErrorKind::MessageTooLarge,
                format!(
                    "message of {n} bytes does not fit the {}-byte buffer (still queued)",
                    buf.len()
                ),
            ));
        }
        with_conn!(&self.ops, |c| c.current().copy_to(&mut buf[..n]));
        with_conn!(&mut self.ops, |c| c.release());
        self.count_in(n);
        Ok(n)
    }

    /// Receives one message into a new vector.
    pub fn recv_vec(&mut self) -> Result<Vec<u8>> {
        let n = self.next()?;
        self.count_in(n);
        Ok(with_conn!(&mut self.ops, |c| c.take_current()))
    }

    /// Receives one message and lends it in place (in the shared-memory ring on `shm:`);
    /// it is consumed when the guard drops. The peer's process can write that memory, so
    /// the guard lends no `&[u8]` there: copy what you need out of
    /// [`RecvBuf::bytes`] (each byte read once), or borrow it with the `unsafe`
    /// [`SharedBytes::as_slice`](crate::SharedBytes::as_slice) if you trust the peer.
    ///
    /// ```
    /// # fn demo(conn: &mut shmlink::Connection) -> shmlink::Result<()> {
    /// let msg = conn.recv_ref()?;
    /// println!("{} bytes, first {:?}", msg.len(), msg.bytes().get(0));
    /// drop(msg); // frees the ring space
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn recv_ref(&mut self) -> Result<RecvBuf<'_>> {
        let n = self.next()?;
        self.count_in(n);
        Ok(RecvBuf { conn: self })
    }

    /// For `crate::tokio`: makes the next message current and counts it, like
    /// [`recv_ref`](Self::recv_ref) without the guard; [`lend`](Self::lend) then lends it.
    /// (An async `recv_ref` cannot return a guard from inside its retry loop.)
    #[cfg(feature = "tokio")]
    #[inline]
    pub(crate) fn recv_begin(&mut self) -> Result<usize> {
        let n = self.next()?;
        self.count_in(n);
        Ok(n)
    }

    /// For `crate::tokio`: the guard over the message [`recv_begin`](Self::recv_begin)
    /// made current.
    #[cfg(feature = "tokio")]
    #[inline]
    pub(crate) fn lend(&mut self) -> RecvBuf<'_> {
        RecvBuf { conn: self }
    }

    /// Reserves like [`reserve`](Self::reserve) without the guard, for callers that keep
    /// a reservation open across calls of their own (`crate::tokio`, whose retry loop
    /// cannot return a guard; the Python binding, which lends the room to Python code
    /// until its `commit()`). [`lend_reserved`](Self::lend_reserved) then lends the room;
    /// until that guard commits or drops it, the room stays where it is as long as no
    /// other call sends on this connection (receiving is fine).
    #[inline]
    pub fn reserve_begin(&mut self, n: usize) -> Result<()> {
        self.check_open()?;
        self.check_size(n)?;
        with_conn!(&mut self.ops, |c| c.reserve(n, !self.nonblocking))
    }

    /// The guard over the room [`reserve_begin`](Self::reserve_begin) reserved for `n`
    /// bytes (`n` as asked then; it is what the counters count on commit). Without an open
    /// reservation the guard lends no bytes and its commit sends nothing.
    #[inline]
    pub fn lend_reserved(&mut self, n: usize) -> SendBuf<'_> {
        SendBuf {
            conn: self,
            len: n,
            done: false,
        }
    }

    /// Whether [`reserve`](Self::reserve) of `n` bytes lends room in the ring itself
    /// (`shm:` between processes, a message within one record), whose commit never
    /// waits. Otherwise the room is a staging buffer and a non-blocking commit may fail
    /// with [`ErrorKind::WouldBlock`] (the message is then lost), so callers in
    /// non-blocking mode (`crate::tokio`, the Python binding) stage in a buffer of their
    /// own and send it.
    #[inline]
    pub fn reserves_in_place(&self, n: usize) -> bool {
        match &self.ops {
            crate::transport::Conn::Shm(c) => c.fits_in_place(n),
            crate::transport::Conn::Dyn(_) => false,
        }
    }

    /// For `crate::tokio`'s bounded spin: `Some(true)` when a receive would find a
    /// message or the end of the stream without waiting, `Some(false)` when not,
    /// `None` when the transport cannot tell without a system call (every transport but
    /// `shm:`). Announces nothing and takes no doorbell.
    #[cfg(feature = "tokio")]
    #[inline]
    pub(crate) fn recv_hint(&mut self) -> Option<bool> {
        match &mut self.ops {
            crate::transport::Conn::Shm(c) => Some(c.recv_hint()),
            crate::transport::Conn::Dyn(_) => None,
        }
    }

    /// The controls only `shm:` connections have (spinning before a sleep, shared wait
    /// tokens, doorbell groups, what the peer has yet to take): `Some` on `shm:` between
    /// processes, `None` on every other transport and on in-process connections
    /// ([`Options::in_process`]). See [`ShmControl`](crate::shm::ShmControl).
    #[inline]
    pub fn shm(&mut self) -> Option<crate::shm::ShmControl<'_>> {
        match &mut self.ops {
            crate::transport::Conn::Shm(c) => Some(crate::shm::ShmControl::new(c)),
            crate::transport::Conn::Dyn(_) => None,
        }
    }

    /// Pushes out, without blocking, what a non-blocking send left in this process; true
    /// once nothing is left (the next non-blocking send will be accepted).
    pub(crate) fn writable(&mut self) -> Result<bool> {
        self.check_open()?;
        with_conn!(&mut self.ops, |c| c.writable())
    }

    /// Switches non-blocking mode.
    pub fn set_nonblocking(&mut self, nonblocking: bool) {
        self.nonblocking = nonblocking;
    }

    /// Whether the connection is in non-blocking mode.
    pub fn is_nonblocking(&self) -> bool {
        self.nonblocking
    }

    /// Closes gracefully: the peer receives every message sent before, then
    /// [`ErrorKind::EndOfStream`]. Messages that a non-blocking `send` accepted but could
    /// not yet hand to the transport are delivered first, waiting for the peer as long as
    /// it makes progress: on every transport `close` fails with [`ErrorKind::TimedOut`]
    /// once the peer has taken nothing of them for 30 seconds (the close linger; the clock
    /// restarts whenever the peer takes some), and the peer then sees
    /// [`ErrorKind::ConnectionReset`] instead of the end of stream. A peer that stays
    /// connected but never reads cannot hold `close` longer than that.
    ///
    /// Dropping a connection closes it too, but never blocks: such queued messages are
    /// then delivered in the background on `ux:`/`tcp:`/`tls:` (until the process exits)
    /// and lost on `shm:` (the peer sees [`ErrorKind::ConnectionReset`]). Call `close` to
    /// be sure.
    pub fn close(mut self) -> Result<()> {
        self.closed = true;
        with_conn!(&mut self.ops, |c| c.close(true))
    }

    /// Message and byte counters. The listener that accepted the connection reads the
    /// same counters when `shmlink ls` asks it (see [`inspect`](crate::inspect())).
    pub fn counters(&self) -> Counters {
        self.counters.get()
    }

    /// Largest message `send` accepts on this connection (both sides' limits applied).
    pub fn max_msg_size(&self) -> usize {
        with_conn!(&self.ops, |c| c.max_send_size())
    }

    /// What the messages travel over: [`Transport::Shm`], [`Transport::Ux`],
    /// [`Transport::Tcp`] or [`Transport::Tls`] (an `auto:` connection reports the one it
    /// settled on, never [`Transport::Auto`]).
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Our address.
    pub fn local_addr(&self) -> String {
        with_conn!(&self.ops, |c| c.local_addr())
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> String {
        with_conn!(&self.ops, |c| c.peer_addr())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if !self.closed {
            self.closed = true;
            let _ = with_conn!(&mut self.ops, |c| c.close(false));
        }
    }
}

impl AsFd for Connection {
    fn as_fd(&self) -> BorrowedFd<'_> {
        with_conn!(&self.ops, |c| c.fd())
    }
}

impl AsRawFd for Connection {
    fn as_raw_fd(&self) -> RawFd {
        with_conn!(&self.ops, |c| c.fd()).as_raw_fd()
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .field("counters", &self.counters())
            .finish()
    }
}

/// Room for one outgoing message, written in place; [`commit`](SendBuf::commit) sends it,
/// dropping it sends nothing.
///
/// `Send`, not `Sync`: it borrows the [`Connection`] mutably.
pub struct SendBuf<'a> {
    conn: &'a mut Connection,
    len: usize,
    done: bool,
}

impl SendBuf<'_> {
    /// Sends the message.
    #[inline]
    pub fn commit(mut self) -> Result<()> {
        self.done = true;
        with_conn!(&mut self.conn.ops, |c| c.commit())?;
        self.conn.counters.count_out(self.len);
        Ok(())
    }

    /// Sends only the first `len` bytes (`len` at most the reserved length; more is an
    /// [`ErrorKind::InvalidInput`] error and sends nothing).
    pub fn commit_len(mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("commit of {len} bytes on a reservation of {}", self.len),
            ));
        }
        self.len = len;
        with_conn!(&mut self.conn.ops, |c| c.truncate_reserved(len));
        self.commit()
    }
}

impl Deref for SendBuf<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        with_conn!(&self.conn.ops, |c| c.reserved())
    }
}

impl DerefMut for SendBuf<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        with_conn!(&mut self.conn.ops, |c| c.reserved_mut())
    }
}

impl Drop for SendBuf<'_> {
    fn drop(&mut self) {
        if !self.done {
            with_conn!(&mut self.conn.ops, |c| c.abort_reserve());
        }
    }
}

/// Messages sent together (see [`Connection::batch`]); dropping it (or
/// [`finish`](Batch::finish)) publishes what it holds.
///
/// `Send`, not `Sync`: it borrows the [`Connection`] mutably.
pub struct Batch<'a> {
    conn: &'a mut Connection,
}

impl Batch<'_> {
    /// Sends one message, as [`Connection::send`] does, published with the batch.
    #[inline]
    pub fn send(&mut self, msg: &[u8]) -> Result<()> {
        self.conn.send(msg)
    }

    /// Reserves room for one message, as [`Connection::reserve`] does; its
    /// [`SendBuf::commit`] publishes it with the batch.
    #[inline]
    pub fn reserve(&mut self, n: usize) -> Result<SendBuf<'_>> {
        self.conn.reserve(n)
    }

    /// Ends the batch: everything sent through it is published.
    #[inline]
    pub fn finish(self) {}
}

impl Drop for Batch<'_> {
    #[inline]
    fn drop(&mut self) {
        self.conn.end_batch();
    }
}

/// A received message lent in place; consumed when dropped.
///
/// `Send`, not `Sync`: it borrows the [`Connection`] mutably.
pub struct RecvBuf<'a> {
    conn: &'a mut Connection,
}

impl RecvBuf<'_> {
    /// The message's bytes, to copy out (see [`SharedBytes`]).
    #[inline]
    pub fn bytes(&self) -> SharedBytes<'_> {
        with_conn!(&self.conn.ops, |c| c.current())
    }

    /// The message length.
    #[inline]
    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    /// Whether the message is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for RecvBuf<'_> {
    #[inline]
    fn drop(&mut self) {
        with_conn!(&mut self.conn.ops, |c| c.release());
    }
}
