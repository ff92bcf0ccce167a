//! [`Listener`], [`Incoming`] and [`Connection`] on tokio's reactor.

use std::fmt;
use std::future::poll_fn;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ::tokio::io::unix::AsyncFd;

use super::{poll_until_done, register, Fd};
use crate::conn::RecvBuf;
use crate::error::{Error, ErrorKind, Result};
use crate::options::Options;
use crate::status::Counters;
use crate::Transport;

/// An async listener: [`crate::Listener`] in non-blocking mode on tokio's reactor.
///
/// ```
/// # std::env::set_var("SHMLINK_DIR", std::env::temp_dir().join(format!("shmlink-doc-{}", std::process::id())));
/// # ::tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use futures_util::StreamExt;
/// use shmlink::tokio::{Connection, Listener};
/// use shmlink::Options;
///
/// let listener = Listener::bind("shm:doc-async-incoming", &Options::default())?;
/// let client = ::tokio::spawn(Connection::connect("shm:doc-async-incoming", &Options::default()));
/// let mut incoming = listener.into_incoming();
/// let conn = incoming.next().await.unwrap()?;
/// assert_eq!(conn.transport(), shmlink::Transport::Shm);
/// client.await.unwrap()?;
/// # Ok::<(), shmlink::Error>(())
/// # }).unwrap();
/// ```
///
/// `Send`, not `Sync` (`accept` takes `&mut self`). Must be created inside a tokio
/// runtime (it registers with the runtime's reactor).
pub struct Listener {
    // Declared before `inner`: the registration goes before the fd it names.
    fd: AsyncFd<Fd>,
    inner: crate::Listener,
    spin: Duration,
}

impl Listener {
    /// Binds `addr` like [`crate::Listener::bind`] (which waits for nothing but the bind
    /// itself, and a name lookup for `tcp:`/`tls:` host names). Accepted connections
    /// spin for `opts`' [`WaitPolicy::spin`](crate::WaitPolicy::spin) before they await
    /// the reactor (see the [module docs](crate::tokio#how-it-waits)).
    pub fn bind(addr: &str, opts: &Options) -> Result<Listener> {
        let inner = crate::Listener::bind(addr, &symmetric(opts))?;
        Listener::from_std(inner, opts.wait.spin)
    }

    /// Wraps a bound listener (switched to non-blocking mode); accepted connections
    /// spin for `spin` before they await the reactor. Bind it with
    /// [`WaitPolicy::BLOCKING`](crate::WaitPolicy::BLOCKING) (see
    /// [`Connection::from_std`]).
    pub fn from_std(mut inner: crate::Listener, spin: Duration) -> Result<Listener> {
        inner.set_nonblocking(true);
        let fd = register(inner.as_raw_fd())?;
        Ok(Listener { fd, inner, spin })
    }

    /// Waits for the next client and completes its handshake without blocking the
    /// runtime (the handshakes of several clients proceed together, each within the
    /// listener's handshake timeout). Refused clients are skipped.
    ///
    /// Cancel safe: a dropped future accepted nothing.
    pub async fn accept(&mut self) -> Result<Connection> {
        poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// Polls for the next connection (what [`accept`](Self::accept) awaits).
    pub fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Result<Connection>> {
        poll_until_done(&self.fd, cx, || self.inner.accept())
            .map(|r| r.and_then(|c| Connection::from_std_spin(c, self.spin)))
    }

    /// An endless [`Stream`](futures_core::Stream) of accepted connections, owning the
    /// listener (what tonic's `serve_with_incoming` and hyper's accept loops take).
    pub fn into_incoming(self) -> Incoming {
        Incoming { listener: self }
    }

    /// The bound address (for `tcp:HOST:0`, with the port the OS chose).
    pub fn local_addr(&self) -> String {
        self.inner.local_addr()
    }

    /// The blocking listener inside.
    pub fn get_ref(&self) -> &crate::Listener {
        &self.inner
    }

    /// Gives the blocking listener back (in blocking mode).
    pub fn into_std(self) -> crate::Listener {
        let Listener { fd, mut inner, .. } = self;
        drop(fd);
        inner.set_nonblocking(false);
        inner
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("shmlink::tokio::Listener")
            .field("addr", &self.local_addr())
            .finish()
    }
}

/// The endless stream of accepted connections of [`Listener::into_incoming`]. Items are
/// what [`Listener::accept`] returns; an error is the listener's own (refused clients
/// never appear) and the stream goes on after it.
///
/// `Send`, not `Sync`.
#[derive(Debug)]
pub struct Incoming {
    listener: Listener,
}

impl Incoming {
    /// The listener inside.
    pub fn get_mut(&mut self) -> &mut Listener {
        &mut self.listener
    }

    /// Gives the listener back.
    pub fn into_inner(self) -> Listener {
        self.listener
    }
}

impl futures_core::Stream for Incoming {
    type Item = Result<Connection>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Connection>>> {
        self.get_mut().listener.poll_accept(cx).map(Some)
    }
}

/// An async connection: [`crate::Connection`] in non-blocking mode on tokio's reactor.
///
/// Every method takes `&mut self`: one task owns the connection. To send from one task
/// while another receives, [`split`](Self::split) it. Cancel safety per method: see the
/// [table](crate::tokio#cancel-safety).
///
/// `Send`, not `Sync`. Must be created inside a tokio runtime.
pub struct Connection {
    // Declared before `inner`: the registration goes before the fd it names.
    pub(super) fd: AsyncFd<Fd>,
    pub(super) inner: crate::Connection,
    pub(super) spin: Spin,
}

impl Connection {
    /// Connects to `addr`. The handshake (bounded by the connect timeout) runs on tokio's
    /// blocking pool. The receive spin is `opts`' [`WaitPolicy::spin`](crate::WaitPolicy::spin).
    ///
    /// Not cancel safe: a dropped future lets the handshake finish on the blocking pool,
    /// then drops the connection.
    ///
    /// The future owns copies of `addr` and `opts`: it is `'static` (spawn it as is).
    pub fn connect(
        addr: &str,
        opts: &Options,
    ) -> impl std::future::Future<Output = Result<Connection>> + Send + 'static {
        let spin = opts.wait.spin;
        let (addr, opts) = (addr.to_owned(), symmetric(opts));
        async move {
            let conn =
                ::tokio::task::spawn_blocking(move || crate::Connection::connect(&addr, &opts))
                    .await
                    .map_err(|e| {
                        Error::new(ErrorKind::Other, format!("connect task failed: {e}"))
                    })??;
            Connection::from_std_spin(conn, spin)
        }
    }

    /// Wraps a connection (switched to non-blocking mode), with the default receive spin
    /// (20 µs, [`WaitPolicy::default`](crate::WaitPolicy)).
    ///
    /// Prefer [`connect`](Self::connect) and [`Listener::bind`]: they ask the `shm:`
    /// handshake for the symmetric fence whatever the library offers by default (design
    /// §4.3: the asymmetric one costs a `membarrier` per `WouldBlock` here, and the
    /// library does not offer it for now because non-blocking receivers lost wake-ups
    /// under it).
    pub fn from_std(conn: crate::Connection) -> Result<Connection> {
        Connection::from_std_spin(conn, crate::WaitPolicy::default().spin)
    }

    fn from_std_spin(mut inner: crate::Connection, spin: Duration) -> Result<Connection> {
        inner.set_nonblocking(true);
        let fd = register(inner.as_raw_fd())?;
        Ok(Connection {
            fd,
            inner,
            spin: Spin::new(spin),
        })
    }

    /// Sets how long a receive may busy-poll the ring before it awaits the reactor
    /// (`shm:` only; zero: never spin). The spin adapts below this budget (see the
    /// [module docs](crate::tokio#how-it-waits)).
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = Spin::new(spin);
    }

    /// The receive spin budget.
    pub fn spin(&self) -> Duration {
        self.spin.max()
    }

    /// Runs the non-blocking `op` until it does not fail with `WouldBlock`, awaiting the
    /// reactor in between. `recv`: spin first while the ring is empty.
    pub(super) fn poll_op<T>(
        &mut self,
        cx: &mut Context<'_>,
        recv: bool,
        mut op: impl FnMut(&mut crate::Connection) -> Result<T>,
    ) -> Poll<Result<T>> {
        if recv && !self.spin.max().is_zero() && self.inner.recv_hint() == Some(false) {
            self.spin.spin(&mut self.inner);
        }
        poll_until_done(&self.fd, cx, || op(&mut self.inner))
    }

    /// Sends one message, awaiting room while the peer's window is full (flow control).
    /// The message is taken whole or not at all. A message larger than half the ring
    /// (`shm:`) may be accepted before all of it reached the ring: the rest moves on
    /// with the next calls; [`flush`](Self::flush) or [`close`](Self::close) waits for it.
    ///
    /// Cancel safe: a dropped future sent nothing.
    pub async fn send(&mut self, msg: &[u8]) -> Result<()> {
        poll_fn(|cx| self.poll_send(cx, msg)).await
    }

    /// Polls to send `msg` (what [`send`](Self::send) awaits).
    pub fn poll_send(&mut self, cx: &mut Context<'_>, msg: &[u8]) -> Poll<Result<()>> {
        self.poll_op(cx, false, |c| c.send(msg))
    }

    /// Reserves room for a message of `n` bytes to fill in place, awaiting room like
    /// [`send`](Self::send); [`SendBuf::commit`] sends it, dropping the guard sends
    /// nothing. On `shm:` a message that fits in one record (half the ring) is written
    /// straight into the ring and its commit never waits; larger ones, and every message
    /// on the other transports, are staged in a buffer of the guard's and sent by the
    /// commit (which may then wait like `send`).
    ///
    /// Cancel safe: a dropped future reserved nothing.
    pub async fn reserve(&mut self, n: usize) -> Result<SendBuf<'_>> {
        if n > self.inner.max_msg_size() || !self.inner.reserves_in_place(n) {
            if n > self.inner.max_msg_size() {
                // The library's own message.
                self.inner.reserve_begin(n)?;
            }
            return Ok(SendBuf(Room::Staged {
                conn: self,
                buf: vec![0; n],
            }));
        }
        poll_fn(|cx| self.poll_op(cx, false, |c| c.reserve_begin(n))).await?;
        Ok(SendBuf(Room::InPlace(self.inner.lend_reserved(n))))
    }

    /// Receives one message into `buf`; returns its length. A message that does not fit
    /// fails with [`ErrorKind::MessageTooLarge`] and stays queued.
    ///
    /// Cancel safe: a dropped future received nothing; the message stays queued.
    pub async fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        poll_fn(|cx| self.poll_op(cx, true, |c| c.recv(buf))).await
    }

    /// Receives one message into a new vector.
    ///
    /// Cancel safe: a dropped future received nothing.
    pub async fn recv_vec(&mut self) -> Result<Vec<u8>> {
        poll_fn(|cx| self.poll_recv_vec(cx)).await
    }

    /// Polls to receive one message into a new vector (what [`recv_vec`](Self::recv_vec)
    /// awaits).
    pub fn poll_recv_vec(&mut self, cx: &mut Context<'_>) -> Poll<Result<Vec<u8>>> {
        self.poll_op(cx, true, |c| c.recv_vec())
    }

    /// Receives one message and lends it in place (in the ring on `shm:`); it is
    /// consumed when the guard drops. See [`crate::Connection::recv_ref`].
    ///
    /// Cancel safe: a dropped future received nothing.
    pub async fn recv_ref(&mut self) -> Result<RecvBuf<'_>> {
        poll_fn(|cx| self.poll_op(cx, true, |c| c.recv_begin())).await?;
        Ok(self.inner.lend())
    }

    /// Waits until the messages that non-blocking sends accepted but could not yet hand
    /// to the transport have been handed over (the next send will not wait for them).
    ///
    /// Cancel safe: what was accepted stays queued.
    pub async fn flush(&mut self) -> Result<()> {
        poll_fn(|cx| self.poll_flush(cx)).await
    }

    /// Polls [`flush`](Self::flush).
    pub fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.poll_op(cx, false, |c| {
            if c.writable()? {
                Ok(())
            } else {
                Err(Error::would_block())
            }
        })
    }

    /// Closes gracefully: flushes, then closes like [`crate::Connection::close`] (on
    /// the blocking pool, where it may wait for the peer within the close linger). The
    /// peer receives every message sent before, then [`ErrorKind::EndOfStream`].
    ///
    /// Not cancel safe: a future dropped while flushing drops the connection (queued
    /// messages may be lost, as on a drop); one dropped later lets the close finish on
    /// the blocking pool.
    pub async fn close(mut self) -> Result<()> {
        self.flush().await?;
        let inner = self.into_std();
        ::tokio::task::spawn_blocking(move || inner.close())
            .await
            .map_err(|e| Error::new(ErrorKind::Other, format!("close task failed: {e}")))?
    }

    /// The blocking connection inside (for its counters, addresses, …).
    pub fn get_ref(&self) -> &crate::Connection {
        &self.inner
    }

    /// Gives the blocking connection back (in blocking mode).
    pub fn into_std(self) -> crate::Connection {
        let Connection { fd, mut inner, .. } = self;
        drop(fd);
        inner.set_nonblocking(false);
        inner
    }

    /// What the messages travel over.
    pub fn transport(&self) -> Transport {
        self.inner.transport()
    }

    /// Our address.
    pub fn local_addr(&self) -> String {
        self.inner.local_addr()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> String {
        self.inner.peer_addr()
    }

    /// Message and byte counters.
    pub fn counters(&self) -> Counters {
        self.inner.counters()
    }

    /// Largest message `send` accepts.
    pub fn max_msg_size(&self) -> usize {
        self.inner.max_msg_size()
    }
}

/// `opts` for a connection or listener of this module: the library's own wait policy
/// set to [`WaitPolicy::BLOCKING`](crate::WaitPolicy::BLOCKING). This module spins by
/// itself (the policy's `spin` is its budget) and never makes a blocking call, so the
/// policy's only effect would be to let the `shm:` handshake choose the asymmetric fence
/// (design §4.3), which moves the fence's cost to every announcement — a `membarrier`
/// interrupting every CPU, on every `WouldBlock` — the common case here. (Under it the
/// 64-connection echo test lost wake-ups; the library does not offer it for now.)
fn symmetric(opts: &Options) -> Options {
    opts.clone().wait_policy(crate::WaitPolicy::BLOCKING)
}

/// The receive spin budget, adaptive: a spin that ends empty-handed halves the next
/// one, one that finds a message doubles it back (up to the configured budget). When
/// spinning does not pay — the peer answers slowly, or it waits for the very CPU we spin
/// on (more runnable threads than CPUs) — the budget falls to nothing and only every
/// 16th wait tries a quarter of it, so a spinning connection costs little more than one
/// that never spins.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spin {
    max: Duration,
    cur: Duration,
    skipped: u32,
}

impl Spin {
    pub(super) fn new(max: Duration) -> Spin {
        Spin {
            max,
            cur: max,
            skipped: 0,
        }
    }

    pub(super) fn max(&self) -> Duration {
        self.max
    }

    /// Busy-polls (shared memory only) until a receive would not wait or the budget
    /// passed.
    #[inline(never)]
    pub(super) fn spin(&mut self, conn: &mut crate::Connection) {
        let budget = if self.cur.is_zero() {
            self.skipped = self.skipped.wrapping_add(1);
            if self.skipped % 16 != 0 {
                return;
            }
            self.max / 4
        } else {
            self.cur
        };
        let until = Instant::now() + budget;
        loop {
            for _ in 0..32 {
                std::hint::spin_loop();
                if conn.recv_hint() != Some(false) {
                    self.cur = (self.cur * 2 + Duration::from_micros(1)).min(self.max);
                    return;
                }
            }
            if Instant::now() >= until {
                self.cur /= 2;
                if self.cur < Duration::from_micros(1) {
                    self.cur = Duration::ZERO;
                }
                return;
            }
        }
    }
}

impl AsFd for Connection {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl AsRawFd for Connection {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("shmlink::tokio::Connection")
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .field("spin", &self.spin)
            .finish()
    }
}

/// Room for one outgoing message from [`Connection::reserve`], written in place;
/// [`commit`](SendBuf::commit) sends it, dropping it sends nothing.
///
/// `Send`, not `Sync`: it borrows the connection mutably.
pub struct SendBuf<'a>(Room<'a>);

enum Room<'a> {
    /// In the ring.
    InPlace(crate::SendBuf<'a>),
    /// In a buffer of ours, sent by `commit`.
    Staged {
        conn: &'a mut Connection,
        buf: Vec<u8>,
    },
}

impl SendBuf<'_> {
    /// Sends the message. In place it is published at once; a staged message is sent
    /// like [`Connection::send`] (awaiting room).
    ///
    /// Cancel safe in the sense of `send`: a dropped future sent nothing (the message
    /// is dropped with it).
    pub async fn commit(self) -> Result<()> {
        match self.0 {
            Room::InPlace(b) => b.commit(),
            Room::Staged { conn, buf } => conn.send(&buf).await,
        }
    }
}

impl std::ops::Deref for SendBuf<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Room::InPlace(b) => b,
            Room::Staged { buf, .. } => buf,
        }
    }
}

impl std::ops::DerefMut for SendBuf<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Room::InPlace(b) => b,
            Room::Staged { buf, .. } => buf,
        }
    }
}

impl fmt::Debug for SendBuf<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendBuf")
            .field("len", &self.len())
            .field("in_place", &matches!(self.0, Room::InPlace(_)))
            .finish()
    }
}
