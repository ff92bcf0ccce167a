//! [`Connection::split`]: a send half and a receive half that two threads use at once.
//!
//! # How it works, and what it costs
//!
//! Both halves share the connection behind a mutex and only ever call it in
//! non-blocking mode, so neither holds the lock while it waits: a half whose call would
//! block releases the lock and sleeps in `epoll_wait` on the connection's fd and on a
//! wake-up flag of its own (an eventfd). That is correct on every transport, whatever the
//! transport keeps in the connection (a TLS session's state, a framed connection's queue,
//! the two directions of `shm:`'s rings and their shared control socket), at these
//! costs compared with one thread owning the [`Connection`]:
//!
//! - each call takes an uncontended-or-briefly-contended lock;
//! - a half that waits sleeps at once, without the spin and yield phases of the
//!   [`WaitPolicy`](crate::WaitPolicy): expect the latency of a wake-up from sleep
//!   (microseconds) where a spinning connection answers in a fraction of one;
//! - the two directions share one fd and, on `shm:`, one control socket whose doorbells
//!   do not say which direction they are for. A half's call can therefore take the
//!   readiness the other half sleeps for. The half that made the call then sets the
//!   other's flag, so it looks again; a half woken by the fd for the other direction
//!   yields to it for up to [`YIELD`] instead of spinning on a level-triggered fd; and
//!   as a backstop every sleep re-checks after [`RECHECK`].
//!
//! A lock-free split of `shm:` (each thread owning its ring) needs doorbells that name
//! their direction; this split is the one that is correct for every transport today.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::conn::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::status::Counters;
use crate::sys::stream::EventFlag;
use crate::sys::{poll_fd, Epoll, Event, Interest, Token};

/// How long a half sleeps before it looks at the connection again even though nothing
/// woke it: the backstop against a readiness the other half's call took.
pub(crate) const RECHECK: Duration = Duration::from_millis(20);
/// How long a half that the connection's fd woke for nothing (the readiness was the
/// other direction's) waits for the other half to act before it watches the fd again.
pub(crate) const YIELD: Duration = Duration::from_millis(1);

const SEND: usize = 0;
const RECV: usize = 1;
const TOKEN_CONN: Token = Token(0);
const TOKEN_KICK: Token = Token(1);

/// What ended a half's sleep.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// Nothing yet: the first attempt of a call.
    Fresh,
    /// The connection's fd.
    Conn,
    /// The other half set our flag.
    Kick,
    /// The re-check interval passed.
    Timeout,
}

/// What the halves share.
struct Shared {
    state: Mutex<State>,
    /// Per half (`SEND`, `RECV`): its wake-up flag and the epoll set it sleeps in (the
    /// connection's fd and that flag).
    sleep: [Sleep; 2],
    /// A duplicate of the connection's fd (the same epoll set or socket), for event
    /// loops ([`AsFd`]) and the halves' own epoll sets.
    conn_fd: OwnedFd,
    /// Whether the connection was in non-blocking mode before the split.
    was_nonblocking: bool,
}

struct State {
    conn: Connection,
    /// Which half sleeps (or is about to) and wants a wake-up when the other calls.
    waiting: [bool; 2],
}

struct Sleep {
    kick: EventFlag,
    epoll: Epoll,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in another thread while it held the lock leaves the connection as
        // consistent as any error would: keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `op` (a non-blocking call) for half `me` until it does not fail with
    /// [`ErrorKind::WouldBlock`], sleeping between attempts.
    fn run<T>(
        &self,
        me: usize,
        events: &mut Vec<Event>,
        mut op: impl FnMut(&mut Connection) -> Result<T>,
    ) -> Result<T> {
        let other = 1 - me;
        let mut woke = Wake::Fresh;
        loop {
            let mut st = self.lock();
            let res = op(&mut st.conn);
            let would_block = matches!(&res, Err(e) if e.kind() == ErrorKind::WouldBlock);
            // Our call may have taken what the other half sleeps for (a doorbell, a
            // flag): make it look again. Not after a retry that only the other half's
            // wake-up prompted and that found nothing, so that two waiting halves do not
            // wake each other in turn forever.
            if st.waiting[other] && !(would_block && woke == Wake::Kick) {
                st.waiting[other] = false;
                self.sleep[other]
                    .kick
                    .set()
                    .map_err(|e| Error::io("wake the other half of a split connection", e))?;
            }
            if !would_block {
                st.waiting[me] = false;
                return res;
            }
            st.waiting[me] = true;
            drop(st);
            woke = self.sleep(me, woke == Wake::Conn, events)?;
        }
    }

    /// Sleeps until the connection's fd or the other half wakes half `me`, or the
    /// re-check interval passes. `yield_to_other`: the fd woke us last time and our call
    /// still found nothing, so the fd's readiness is the other direction's: wait for the
    /// other half only, for [`YIELD`].
    fn sleep(&self, me: usize, yield_to_other: bool, events: &mut Vec<Event>) -> Result<Wake> {
        let s = &self.sleep[me];
        let ctx = |e| Error::io("wait on a split connection", e);
        if yield_to_other {
            let got = poll_fd(
                s.kick.fd(),
                Interest::READABLE,
                Some(Instant::now() + YIELD),
            )
            .map_err(ctx)?;
            if !got {
                return Ok(Wake::Timeout);
            }
            s.kick.clear().map_err(ctx)?;
            return Ok(Wake::Kick);
        }
        events.clear();
        s.epoll
            .wait(Some(Instant::now() + RECHECK), events)
            .map_err(ctx)?;
        let mut wake = Wake::Timeout;
        for token in events.iter().map(Event::token) {
            if token == TOKEN_KICK {
                s.kick.clear().map_err(ctx)?;
                if wake == Wake::Timeout {
                    wake = Wake::Kick;
                }
            } else if token == TOKEN_CONN {
                wake = Wake::Conn;
            }
        }
        Ok(wake)
    }
}

impl Connection {
    /// Splits the connection into a [`SendHalf`] and a [`RecvHalf`], so that one thread
    /// sends while another receives. Both block like a blocking connection (whatever
    /// mode the connection was in); [`SendHalf::reunite`] gives the connection back.
    ///
    /// Every transport supports it. The halves share the connection behind a lock and
    /// sleep without spinning, so a message costs somewhat more than on a connection one
    /// thread owns: see the costs in the [module docs](crate::SendHalf#costs).
    /// The end of the stream and a peer's death reach both halves: the receive half gets
    /// [`ErrorKind::EndOfStream`] after the last message (or
    /// [`ErrorKind::ConnectionReset`]), the send half [`ErrorKind::ConnectionReset`].
    ///
    /// ```
    /// # std::env::set_var("SHMLINK_DIR", std::env::temp_dir().join(format!("shmlink-doc-{}", std::process::id())));
    /// use shmlink::{Connection, ErrorKind, Listener, Options};
    /// let mut listener = Listener::bind("shm:doc-split", &Options::default())?;
    /// let echo = std::thread::spawn(move || -> shmlink::Result<()> {
    ///     let mut conn = listener.accept()?;
    ///     loop {
    ///         match conn.recv_vec() {
    ///             Ok(m) => conn.send(&m)?,
    ///             Err(e) if e.kind() == ErrorKind::EndOfStream => return Ok(()),
    ///             Err(e) => return Err(e),
    ///         }
    ///     }
    /// });
    /// let conn = Connection::connect("shm:doc-split", &Options::default())?;
    /// let (mut tx, mut rx) = conn.split()?;
    /// let sender = std::thread::spawn(move || -> shmlink::Result<shmlink::SendHalf> {
    ///     for i in 0..1000u32 {
    ///         tx.send(&i.to_le_bytes())?;
    ///     }
    ///     Ok(tx)
    /// });
    /// for i in 0..1000u32 {
    ///     assert_eq!(rx.recv_vec()?, i.to_le_bytes());
    /// }
    /// let tx = sender.join().unwrap()?;
    /// tx.reunite(rx).expect("halves of one connection").close()?;
    /// echo.join().unwrap()?;
    /// # Ok::<(), shmlink::Error>(())
    /// ```
    pub fn split(mut self) -> Result<(SendHalf, RecvHalf)> {
        let ctx = |e| Error::io("split a connection", e);
        let was_nonblocking = self.is_nonblocking();
        self.set_nonblocking(true);
        let conn_fd = self.as_fd().try_clone_to_owned().map_err(ctx)?;
        let sleep = |_| -> Result<Sleep> {
            let kick = EventFlag::new().map_err(ctx)?;
            let epoll = Epoll::new().map_err(ctx)?;
            epoll
                .add(conn_fd.as_raw_fd(), Interest::READABLE, TOKEN_CONN)
                .map_err(ctx)?;
            epoll
                .add(kick.fd().as_raw_fd(), Interest::READABLE, TOKEN_KICK)
                .map_err(ctx)?;
            Ok(Sleep { kick, epoll })
        };
        let sleep = [sleep(SEND)?, sleep(RECV)?];
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                conn: self,
                waiting: [false; 2],
            }),
            sleep,
            conn_fd,
            was_nonblocking,
        });
        Ok((
            SendHalf {
                shared: shared.clone(),
                events: Vec::with_capacity(2),
            },
            RecvHalf {
                shared,
                events: Vec::with_capacity(2),
            },
        ))
    }
}

/// The sending half of a [`Connection::split`].
///
/// `Send` and `Sync` (its calls take `&mut self`; the connection inside is behind a
/// lock). Dropping both halves drops the connection (see [`Connection`] on dropping);
/// to close it gracefully, [`reunite`](Self::reunite) the halves and call
/// [`Connection::close`].
///
/// # Costs
///
/// The halves share the connection behind a lock and sleep in the kernel as soon as
/// they wait (no spinning), so each call costs a lock and a wait costs a wake-up from
/// sleep. The two directions share one fd (on `shm:` one control socket whose doorbells
/// do not name a direction), so a half's call can take the readiness the other sleeps
/// for; it then wakes the other half through an eventfd, and every sleep re-checks the
/// connection after 20 ms at the latest. A half that a readiness for the other
/// direction woke waits up to 1 ms for the other half to act rather than spin.
pub struct SendHalf {
    shared: Arc<Shared>,
    events: Vec<Event>,
}

/// The receiving half of a [`Connection::split`].
///
/// `Send` and `Sync`, like [`SendHalf`] (whose docs say what the split costs).
pub struct RecvHalf {
    shared: Arc<Shared>,
    events: Vec<Event>,
}

impl SendHalf {
    /// Sends one message, waiting while the peer's receive window is full, and returns
    /// once the whole message is handed to the transport (as a blocking
    /// [`Connection::send`] does).
    pub fn send(&mut self, msg: &[u8]) -> Result<()> {
        self.shared.run(SEND, &mut self.events, |c| c.send(msg))?;
        // A non-blocking send may have accepted the message with part of it still in
        // this process (a framed queue, the rest of a split `shm:` message): push it out.
        self.shared
            .run(SEND, &mut self.events, |c| match c.writable()? {
                true => Ok(()),
                false => Err(Error::would_block()),
            })
    }

    /// Largest message [`send`](Self::send) accepts.
    pub fn max_msg_size(&self) -> usize {
        self.shared.lock().conn.max_msg_size()
    }

    /// The connection's counters (both directions).
    pub fn counters(&self) -> Counters {
        self.shared.lock().conn.counters()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> String {
        self.shared.lock().conn.peer_addr()
    }

    /// Puts the halves back together into the connection, in the blocking mode it had
    /// before the split. Fails, handing both back, if `recv` is another connection's.
    pub fn reunite(self, recv: RecvHalf) -> std::result::Result<Connection, ReuniteError> {
        if !Arc::ptr_eq(&self.shared, &recv.shared) {
            return Err(ReuniteError { send: self, recv });
        }
        let was_nonblocking = self.shared.was_nonblocking;
        drop(recv);
        let shared = Arc::into_inner(self.shared).expect("both halves were given");
        let mut conn = shared
            .state
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .conn;
        conn.set_nonblocking(was_nonblocking);
        Ok(conn)
    }
}

impl RecvHalf {
    /// Receives one message into `buf`, waiting for one; returns its length. If it does
    /// not fit, fails with [`ErrorKind::MessageTooLarge`] and leaves it queued (as
    /// [`Connection::recv`] does).
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        self.shared.run(RECV, &mut self.events, |c| c.recv(buf))
    }

    /// Receives one message into a new vector, waiting for one.
    pub fn recv_vec(&mut self) -> Result<Vec<u8>> {
        self.shared.run(RECV, &mut self.events, |c| c.recv_vec())
    }

    /// The connection's counters (both directions).
    pub fn counters(&self) -> Counters {
        self.shared.lock().conn.counters()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> String {
        self.shared.lock().conn.peer_addr()
    }

    /// Puts the halves back together (see [`SendHalf::reunite`]).
    pub fn reunite(self, send: SendHalf) -> std::result::Result<Connection, ReuniteError> {
        send.reunite(self)
    }
}

/// The connection's fd: readable when either half may make progress (for event loops
/// that watch a split connection; the halves themselves always block).
impl AsFd for SendHalf {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.conn_fd.as_fd()
    }
}

/// See [`SendHalf`]'s `AsFd`.
impl AsFd for RecvHalf {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.conn_fd.as_fd()
    }
}

impl fmt::Debug for SendHalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendHalf")
            .field("peer", &self.peer_addr())
            .finish()
    }
}

impl fmt::Debug for RecvHalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvHalf")
            .field("peer", &self.peer_addr())
            .finish()
    }
}

/// [`SendHalf::reunite`] was given halves of two different connections; both are handed
/// back. `Send` and `Sync`.
pub struct ReuniteError {
    /// The send half given.
    pub send: SendHalf,
    /// The receive half given.
    pub recv: RecvHalf,
}

impl fmt::Debug for ReuniteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReuniteError")
            .field("send", &self.send)
            .field("recv", &self.recv)
            .finish()
    }
}

impl fmt::Display for ReuniteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot reunite halves of two connections (to {} and to {})",
            self.send.peer_addr(),
            self.recv.peer_addr()
        )
    }
}

impl std::error::Error for ReuniteError {}
