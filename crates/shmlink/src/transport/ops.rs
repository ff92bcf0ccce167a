//! What every transport implements: [`ConnOps`] for a connection, [`ListenerOps`] for a
//! listener, and the [`Transport`] entry that names its `connect` and `bind`. A leaf below
//! every transport; `transport`'s own file lists the transports and picks one by prefix.

use std::any::Any;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

use crate::addr::Address;
use crate::error::Result;
use crate::options::Options;
use crate::status::SharedCounters;
use crate::view::SharedBytes;

/// How long a closing connection's remaining bytes wait for the peer to take some before
/// they are given up: a blocking `close` then fails with [`ErrorKind::TimedOut`](crate::ErrorKind::TimedOut) (and the
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
/// returns [`ErrorKind::WouldBlock`](crate::ErrorKind::WouldBlock) and arranges for [`fd`] to become readable when
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
    /// Shortens the reservation to its first `len` bytes (`len` ≤ the reserved length,
    /// checked by the caller): [`ConnOps::commit`] then sends only those.
    fn truncate_reserved(&mut self, len: usize);
    /// Sends that follow, until [`ConnOps::end_batch`], may be published together (the
    /// same messages, order and flow control). Transports that have nothing to batch send
    /// each message at once (the default).
    fn begin_batch(&mut self) {}
    /// Publishes whatever the batch holds back; the connection sends one by one again.
    fn end_batch(&mut self) {}
    /// Makes the next message current; returns its length.
    fn recv_next(&mut self, blocking: bool) -> Result<usize>;
    /// Receives the next message straight into `buf` where the transport does better
    /// than [`ConnOps::recv_next`] and a copy (`shm:` lands a split message's fragments
    /// in `buf`, with no reassembly buffer); `Ok(None)`: not here, nothing was taken.
    fn recv_into(&mut self, _buf: &mut [u8], _blocking: bool) -> Result<Option<usize>> {
        Ok(None)
    }
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
    /// This connection as [`Any`], so that the layer above can hold a connection whose
    /// concrete type it knows (`shm:`'s, see `transport::Conn`) by that type.
    fn as_any(&self) -> &dyn Any;
    /// This connection as [`Any`], by value (see [`ConnOps::as_any`]).
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

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
