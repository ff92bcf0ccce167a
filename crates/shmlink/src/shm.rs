//! Controls that only `shm:` connections have, behind [`Connection::shm`]: spinning
//! before sleeping, withdrawing or sharing wait announcements, grouping doorbells per
//! peer process, and reading what the peer has yet to take. Event loops that sleep on
//! many connections at once (the preload library) use them; other transports (and the
//! in-process connections of [`Options::in_process`](crate::Options::in_process)) have no
//! such controls, so [`Connection::shm`] returns `None` there, as std's `os::unix`
//! extensions exist only where the platform has them.

use std::sync::Arc;

use crate::transport::shm::ShmConn;
#[cfg(doc)]
use crate::{Connection, ErrorKind};

/// A group of connections to one peer process that ring one doorbell per shared wait
/// token ([`ShmControl::set_wake_group`]).
pub use shmlink_ring::spsc::WakeGroup;

/// The `shm:`-only controls of one [`Connection`], from [`Connection::shm`]. It borrows
/// the connection mutably: take it for a call or a few, then let it go.
///
/// ```
/// # std::env::set_var("SHMLINK_DIR", std::env::temp_dir().join(format!("shmlink-doc-shm-{}", std::process::id())));
/// use shmlink::{Connection, Listener, Options};
///
/// // Between processes (here: with the in-process shortcut off).
/// let opts = Options::default().in_process(false);
/// let mut listener = Listener::bind("shm:controls", &opts)?;
/// let accept = std::thread::spawn(move || listener.accept());
/// let mut client = Connection::connect("shm:controls", &opts)?;
/// let mut server = accept.join().unwrap()?;
///
/// // Nothing sent yet: a receive would wait.
/// assert_eq!(server.shm().map(|mut s| s.recv_ready()), Some(false));
/// client.send(b"hi")?;
/// assert_eq!(server.shm().map(|mut s| s.recv_ready()), Some(true));
/// assert_eq!(server.recv_vec()?, b"hi");
///
/// // Other transports, and `shm:` connections within one process, have no such controls.
/// let mut listener = Listener::bind("shm:controls-local", &Options::default())?;
/// let accept = std::thread::spawn(move || listener.accept());
/// let mut local = Connection::connect("shm:controls-local", &Options::default())?;
/// assert!(local.shm().is_none());
/// # drop(accept.join().unwrap()?);
/// # Ok::<(), shmlink::Error>(())
/// ```
pub struct ShmControl<'a> {
    conn: &'a mut ShmConn,
}

impl<'a> ShmControl<'a> {
    pub(crate) fn new(conn: &'a mut ShmConn) -> ShmControl<'a> {
        ShmControl { conn }
    }

    /// Whether a receive would return at once — a message, the end of the stream or an
    /// error — found by reading shared memory only: no system call, no announcement, no
    /// doorbell taken. For callers that spin for a bounded time before they sleep on the
    /// connection's fd (the preload library's `SHMLINK_SPIN_US`).
    #[inline]
    pub fn recv_ready(&mut self) -> bool {
        self.conn.recv_hint()
    }

    /// The messages this end sent that the peer has not taken from the ring yet, their
    /// bytes concatenated in order: for a peer that asked to have them sent again
    /// another way (the preload library's `exec`, which continues a connection over
    /// TCP). `None` when a reservation is open, or when one of those messages was split
    /// into fragments or is still partly queued here (their boundaries would be lost),
    /// or when the peer's position is invalid.
    pub fn unconsumed_sent(&mut self) -> Option<Vec<u8>> {
        self.conn.unconsumed_sent()
    }

    /// Records that this end is about to wait on the CPU it runs on, and returns whether
    /// the peer last waited on that same CPU: then spinning cannot help (the peer cannot
    /// run until this end stops), so a caller that spins before it sleeps on the fd
    /// should sleep at once. Also what the peer's own check reads.
    pub fn shares_cpu_with_peer(&mut self) -> bool {
        self.conn.shares_cpu_with_peer()
    }

    /// Withdraws the wait that a non-blocking receive announced when it returned
    /// [`ErrorKind::WouldBlock`], so the peer rings no doorbell for it: for an event loop
    /// that found work elsewhere and will not sleep on this connection's fd before it
    /// receives (or polls with a receive) again. After this the fd does not signal a new
    /// message until a receive returns `WouldBlock` again. A doorbell already rung may
    /// still make the fd readable once.
    pub fn withdraw_wait(&mut self) {
        self.conn.withdraw_wait();
    }

    /// Makes the non-blocking receives that find nothing announce `token` instead of a
    /// count of this connection's own, until called with `None`: for an event loop that
    /// sleeps on many connections' fds at once (the preload library's `epoll_wait`) and
    /// announces the same token on each. A peer process that groups its connections to us
    /// ([`set_wake_group`](Self::set_wake_group)) then rings one doorbell per token, not
    /// one per connection that got a message while we slept. In exchange the caller
    /// must, once woken, look at every connection it announced the token on before it
    /// sleeps again, and use a new token for each sleep: a value this process never
    /// announced before (the low 62 bits count; a token that is not above the
    /// connection's last announcement is replaced by a count, which costs only the
    /// skip). Blocking receives keep their own counts.
    pub fn set_wait_token(&mut self, token: Option<u64>) {
        self.conn.set_wait_token(token);
    }

    /// Puts the connection into `group`, one per peer process (`None`: no group, the
    /// default): a message for a peer that sleeps with a shared wait token
    /// ([`set_wait_token`](Self::set_wait_token)) rings its doorbell only if no
    /// connection of the group rang for that token yet. The peer's token values decide
    /// only whether the group's connections ring, so a group must not span processes that
    /// do not trust each other.
    pub fn set_wake_group(&mut self, group: Option<Arc<WakeGroup>>) {
        self.conn.set_wake_group(group);
    }

    /// Whether the peer has yet to take some of the messages sent to it, found by reading
    /// shared memory only. For callers that mirror TCP once the peer is gone (the preload
    /// library: a peer that died with unread data is a reset, else an end of stream).
    pub fn peer_unread(&mut self) -> bool {
        self.conn.peer_unread()
    }
}

impl std::fmt::Debug for ShmControl<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmControl").finish_non_exhaustive()
    }
}
