//! Transports behind one interface, chosen by address prefix (XCM's `xcm_tp_ops`).
//!
//! A transport implements [`ConnOps`] for connections and [`ListenerOps`] for listeners
//! and registers a [`Transport`] in [`entry`]. The public [`Connection`] and
//! [`Listener`] wrappers add what every transport shares (counters, blocking mode,
//! argument checks), so a transport only moves messages.
//!
//! [`Connection`]: crate::Connection
//! [`Listener`]: crate::Listener

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

use crate::addr::Address;
use crate::conn::SharedCounters;
#[cfg(doc)]
use crate::error::ErrorKind;
use crate::error::Result;
use crate::options::Options;
use crate::view::SharedBytes;

pub(crate) mod auto;
pub(crate) mod framed;
pub(crate) mod shm;
pub(crate) mod tcp;
pub(crate) mod tls;
pub(crate) mod ux;

/// How long a closing connection's remaining bytes wait for the peer to take some before
/// they are given up: a blocking `close` then fails with [`ErrorKind::TimedOut`] (and the
/// peer sees a reset instead of the end of stream). The clock restarts whenever the peer
/// takes something, on every transport.
pub(crate) const CLOSE_LINGER: Duration = Duration::from_secs(30);

/// One connection's transport-specific half.
///
/// Receiving is split so that a message can be read in place: [`recv_next`] makes the next
/// message *current* and returns its length, [`current`] borrows it, [`release`] consumes
/// it. Calling `recv_next` again before `release` returns the same message. Sending in
/// place is split the same way: [`reserve`], [`reserved_mut`], then [`commit`] or
/// [`abort_reserve`].
///
/// Every blocking call takes `blocking`; in non-blocking mode a call that would wait
/// returns [`ErrorKind::WouldBlock`] and arranges for [`fd`] to become readable when
/// it is worth calling again.
///
/// [`recv_next`]: ConnOps::recv_next
/// [`current`]: ConnOps::current
/// [`release`]: ConnOps::release
/// [`reserve`]: ConnOps::reserve
/// [`reserved_mut`]: ConnOps::reserved_mut
/// [`commit`]: ConnOps::commit
/// [`abort_reserve`]: ConnOps::abort_reserve
/// [`fd`]: ConnOps::fd
pub(crate) trait ConnOps: Send {
    /// Sends one message (already checked against [`ConnOps::max_send_size`]).
    fn send(&mut self, msg: &[u8], blocking: bool) -> Result<()>;
    /// Makes room for a message of `n` bytes (≤ max_send_size); [`ConnOps::reserved`]
    /// then returns exactly `n` writable bytes.
    fn reserve(&mut self, n: usize, blocking: bool) -> Result<()>;
    /// The reserved bytes.
    fn reserved(&self) -> &[u8];
    /// The reserved bytes, writable.
    fn reserved_mut(&mut self) -> &mut [u8];
    /// Sends the reserved message.
    fn commit(&mut self) -> Result<()>;
    /// Forgets the reservation; nothing is sent.
    fn abort_reserve(&mut self);
    /// Makes the next message current; returns its length.
    fn recv_next(&mut self, blocking: bool) -> Result<usize>;
    /// The current message (empty if none), lent in place.
    fn current(&self) -> SharedBytes<'_>;
    /// The current message when it lives in this process's memory, as on every framed
    /// transport; empty if none or if it is in a shared ring. For the protocol layers
    /// that only ever run over framed connections (`auto:`'s negotiation, network
    /// publish/subscribe), which parse records in place.
    fn current_local(&self) -> &[u8] {
        self.current().as_local().unwrap_or_default()
    }
    /// Consumes the current message.
    fn release(&mut self);
    /// Consumes the current message, returning it as a vector (transports that reassemble
    /// into a vector hand it over without copying).
    fn take_current(&mut self) -> Vec<u8> {
        let v = self.current().to_vec();
        self.release();
        v
    }
    /// Writes what a non-blocking send queued, without blocking; true when the next
    /// non-blocking send will be accepted (nothing is queued any more).
    fn writable(&mut self) -> Result<bool> {
        Ok(true)
    }
    /// Largest message the peer accepts (the smaller of both sides' maxima).
    fn max_send_size(&self) -> usize;
    /// The descriptor an event loop watches.
    fn fd(&self) -> BorrowedFd<'_>;
    /// Graceful close: the peer receives everything sent so far, then end-of-stream. With
    /// `wait` (an explicit `close`), messages still queued in this process are handed to
    /// the transport before it returns; without (a drop), closing never blocks.
    fn close(&mut self, wait: bool) -> Result<()>;
    /// Our address, as text with the transport prefix.
    fn local_addr(&self) -> String;
    /// The peer's address, as text with the transport prefix.
    fn peer_addr(&self) -> String;
    /// The `shm:` connection inside, if this is one (see [`Conn`]).
    fn into_shm(self: Box<Self>) -> std::result::Result<Box<shm::ShmConn>, Box<dyn ConnOps>>;
}

/// A connection's transport half as the public API holds it: `shm:` by its concrete type,
/// so its per-message path is dispatched statically and inlined into the public calls;
/// every other transport through the trait object.
pub(crate) enum Conn {
    Shm(Box<shm::ShmConn>),
    Dyn(Box<dyn ConnOps>),
}

impl From<Box<dyn ConnOps>> for Conn {
    fn from(ops: Box<dyn ConnOps>) -> Conn {
        match ops.into_shm() {
            Ok(shm) => Conn::Shm(shm),
            Err(other) => Conn::Dyn(other),
        }
    }
}

/// Runs `$body` with `$c` bound to the connection inside a [`Conn`], whatever its kind.
macro_rules! with_conn {
    ($conn:expr, |$c:ident| $body:expr) => {
        match $conn {
            $crate::transport::Conn::Shm($c) => $body,
            $crate::transport::Conn::Dyn($c) => $body,
        }
    };
}
pub(crate) use with_conn;

/// A connection a listener set up.
pub(crate) struct Accepted {
    pub conn: Box<dyn ConnOps>,
    /// The connection's counters, when the listener keeps track of the connection to
    /// report it to `shmlink ls` (`shm:` and `auto:` listeners); the new
    /// [`Connection`](crate::Connection) counts into them.
    pub counters: Option<Arc<SharedCounters>>,
}

impl Accepted {
    /// A connection the listener does not keep track of.
    pub(crate) fn untracked(conn: Box<dyn ConnOps>) -> Accepted {
        Accepted {
            conn,
            counters: None,
        }
    }
}

/// One listener's transport-specific half.
pub(crate) trait ListenerOps: Send {
    /// Accepts one connection, completing its handshake. Clients that fail the handshake
    /// are refused and skipped; they never surface here.
    fn accept(&mut self, blocking: bool) -> Result<Accepted>;
    /// The descriptor an event loop watches (readable when `accept` may succeed).
    fn fd(&self) -> BorrowedFd<'_>;
    /// The bound address, as text with the transport prefix (with the real port for
    /// `tcp:HOST:0`).
    fn local_addr(&self) -> String;
}

/// A transport's entry points.
pub(crate) struct Transport {
    /// The address prefix, without the colon.
    pub name: &'static str,
    pub connect: fn(&Address, &Options) -> Result<Box<dyn ConnOps>>,
    pub bind: fn(&Address, &Options) -> Result<Box<dyn ListenerOps>>,
}

/// The entry points of `transport`. The public [`Transport`](crate::Transport) enum is
/// the registry: this exhaustive `match` is its dispatch table, so a new variant does
/// not compile until it has an entry here.
pub(crate) fn entry(transport: crate::Transport) -> &'static Transport {
    use crate::Transport as T;
    match transport {
        T::Shm => &shm::TRANSPORT,
        T::Ux => &ux::TRANSPORT,
        T::Tcp => &tcp::TRANSPORT,
        T::Tls => &tls::TRANSPORT,
        T::Auto => &auto::TRANSPORT,
    }
}

/// The transport that serves `addr`.
pub(crate) fn lookup(addr: &Address) -> &'static Transport {
    entry(addr.transport())
}

#[cfg(test)]
mod tests {
    /// Each entry answers to its own prefix.
    #[test]
    fn entries_match_their_names() {
        for &t in crate::Transport::ALL {
            assert_eq!(super::entry(t).name, t.as_str());
        }
    }
}
