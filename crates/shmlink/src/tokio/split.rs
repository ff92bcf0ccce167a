//! [`Connection::split`](super::Connection::split): owned send and receive halves for two
//! tasks.

use std::fmt;
use std::future::{poll_fn, Future};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

use ::tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use ::tokio::sync::Notify;

use super::{reactor_error, would_block, Connection, Fd};
use crate::error::{Error, Result};

// Here, not in conn.rs, so that the connection does not name its halves (no import
// circle: tests/layering.rs).
impl Connection {
    /// Splits the connection into owned halves that two tasks use at once;
    /// [`SendHalf::reunite`] gives it back. See [`SendHalf`] for the costs.
    pub fn split(self) -> (SendHalf, RecvHalf) {
        halves(self)
    }
}

const SEND: usize = 0;
const RECV: usize = 1;

/// What ended a half's wait.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// The first attempt of a call.
    Fresh,
    /// The reactor: the fd is readable.
    Conn,
    /// The other half's call may have taken our readiness.
    Kick,
}

struct Shared {
    // Declared before `state`: the registration goes before the fd it names.
    fd: AsyncFd<Fd>,
    state: Mutex<State>,
    /// Per half: the other half's call may have taken its readiness (a doorbell both
    /// directions share on `shm:`, an event of the framed transports' fd).
    kick: [Notify; 2],
}

struct State {
    conn: crate::Connection,
    spin: std::time::Duration,
    /// Which half awaits (or is about to) and wants to hear of the other's calls.
    waiting: [bool; 2],
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in another task while it held the lock leaves the connection as
        // consistent as any error would: keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs the non-blocking `op` for half `me` until it does not fail with
    /// `WouldBlock`. The lock is never held across an await. Cancel safe: `op` runs
    /// within one poll, and a result is returned in the poll that produced it.
    async fn run<T>(
        &self,
        me: usize,
        mut op: impl FnMut(&mut crate::Connection) -> Result<T>,
    ) -> Result<T> {
        let other = 1 - me;
        let mut woke = Wake::Fresh;
        let mut guard: Option<AsyncFdReadyGuard<'_, Fd>> = None;
        loop {
            let blocked = {
                let mut st = self.lock();
                let res = op(&mut st.conn);
                let blocked = would_block(&res);
                // Our call may have taken what the other half awaits (drained its
                // doorbell, or our guard is about to clear the readiness it needs): make
                // it look again. Not after a retry that only the other half's kick
                // prompted and that found nothing, so two waiting halves do not kick
                // each other forever; such a retry holds no readiness guard and clears
                // nothing.
                if st.waiting[other] && !(blocked && woke == Wake::Kick) {
                    st.waiting[other] = false;
                    self.kick[other].notify_one();
                }
                if !blocked {
                    st.waiting[me] = false;
                    return res;
                }
                st.waiting[me] = true;
                blocked
            };
            debug_assert!(blocked);
            // Taken before the attempt: tokio clears only if no event came since.
            if let Some(mut g) = guard.take() {
                g.clear_ready();
            }
            let kicked = self.kick[me].notified();
            let readable = self.fd.readable();
            let mut kicked = std::pin::pin!(kicked);
            let mut readable = std::pin::pin!(readable);
            // The kick first: it is the cheaper retry.
            let event = poll_fn(|cx| {
                if kicked.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                readable.as_mut().poll(cx).map(Some)
            })
            .await;
            match event {
                None => woke = Wake::Kick,
                Some(g) => {
                    guard = Some(g.map_err(reactor_error)?);
                    woke = Wake::Conn;
                }
            }
        }
    }
}

fn halves(conn: Connection) -> (SendHalf, RecvHalf) {
    let spin = conn.spin();
    let Connection { fd, inner, .. } = conn;
    let shared = Arc::new(Shared {
        fd,
        state: Mutex::new(State {
            conn: inner,
            spin,
            waiting: [false; 2],
        }),
        kick: [Notify::new(), Notify::new()],
    });
    (
        SendHalf {
            shared: shared.clone(),
        },
        RecvHalf { shared },
    )
}

/// The sending half of a split [`Connection`]: owned, `Send`, used from its own task.
///
/// # Costs
///
/// Both halves share the connection behind a lock that no await holds, and the one fd
/// (on `shm:`, one control socket whose doorbells do not say which direction they are
/// for). A half whose call finds nothing may therefore take the readiness the other half
/// awaits; it then wakes the other half ([`Notify`]), which looks again. Halves never
/// spin: each wait goes through the reactor.
pub struct SendHalf {
    shared: Arc<Shared>,
}

/// The receiving half of a split [`Connection`]: owned, `Send`, used from its own task.
/// See [`SendHalf`] for the costs.
pub struct RecvHalf {
    shared: Arc<Shared>,
}

impl SendHalf {
    /// Sends one message (see [`Connection::send`]).
    ///
    /// Cancel safe: a dropped future sent nothing.
    pub async fn send(&mut self, msg: &[u8]) -> Result<()> {
        self.shared.run(SEND, |c| c.send(msg)).await
    }

    /// Waits until what sends accepted has been handed to the transport (see
    /// [`Connection::flush`]).
    ///
    /// Cancel safe.
    pub async fn flush(&mut self) -> Result<()> {
        self.shared
            .run(SEND, |c| {
                if c.writable()? {
                    Ok(())
                } else {
                    Err(Error::would_block())
                }
            })
            .await
    }

    /// Puts the halves back together. Fails (giving both back) if they are not halves
    /// of the same connection.
    pub fn reunite(self, recv: RecvHalf) -> std::result::Result<Connection, (SendHalf, RecvHalf)> {
        if !Arc::ptr_eq(&self.shared, &recv.shared) {
            return Err((self, recv));
        }
        drop(recv);
        let shared = match Arc::try_unwrap(self.shared) {
            Ok(s) => s,
            Err(_) => unreachable!("both halves were given back"),
        };
        let Shared { fd, state, .. } = shared;
        let st = state.into_inner().unwrap_or_else(|p| p.into_inner());
        Ok(Connection {
            fd,
            inner: st.conn,
            spin: super::conn::Spin::new(st.spin),
        })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> String {
        self.shared.lock().conn.peer_addr()
    }
}

impl RecvHalf {
    /// Receives one message into `buf` (see [`Connection::recv`]).
    ///
    /// Cancel safe: a dropped future received nothing.
    pub async fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        self.shared.run(RECV, |c| c.recv(buf)).await
    }

    /// Receives one message into a new vector.
    ///
    /// Cancel safe: a dropped future received nothing.
    pub async fn recv_vec(&mut self) -> Result<Vec<u8>> {
        self.shared.run(RECV, |c| c.recv_vec()).await
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> String {
        self.shared.lock().conn.peer_addr()
    }
}

impl fmt::Debug for SendHalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("shmlink::tokio::SendHalf")
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for RecvHalf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("shmlink::tokio::RecvHalf")
            .finish_non_exhaustive()
    }
}
