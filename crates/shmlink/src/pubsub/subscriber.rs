//! The public subscriber: over shared memory ([`ShmSubscriber`]) or over the network
//! ([`NetSubscriber`]), one type for both.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

use super::options::{Policy, PubSubOptions};
use super::remote::{self, Connected, NetSubscriber};
use super::shm_subscriber::{ShmSample, ShmSubscriber};
use super::stats::SubscriberStats;
use crate::addr::{Address, Transport};
use crate::error::{Error, ErrorKind, Result};
use crate::view::SharedBytes;

/// The receiving end of a topic.
///
/// Each subscriber reads every message the publisher writes from the moment it joined
/// (or from up to `history` messages before), in order. Over `shm:` it reads them in
/// place in shared memory that it maps read-only; over `tcp:` and `tls:` the publisher's
/// fan-out thread forwards them on a connection of its own; an `auto:` subscriber uses
/// shared memory when it shares a kernel (and the rendezvous directory) with the
/// publisher and the network otherwise ([`transport`](Self::transport) says which).
///
/// An `auto:` subscriber moves to shared memory only with the single-use token the
/// publisher hands it over the network subscription (TCP, or TLS with its certificate
/// checks), and only to a socket that answers with the proof that goes with the token:
/// another process's socket found at that name is never taken (the subscriber stays on
/// the network). The socket of an `auto:` topic admits nobody without a token, and a
/// `tcp:`/`tls:` topic has no local socket, so a `shm:` subscription never skips what the
/// network path checks.
///
/// Blocking by default; in non-blocking mode `recv` fails with
/// [`ErrorKind::WouldBlock`] and the subscriber's fd ([`AsRawFd`]) becomes readable
/// when a message arrives or the publisher goes away. Errors that end the subscription:
/// [`ErrorKind::EndOfStream`] (the publisher closed, everything was read),
/// [`ErrorKind::ConnectionReset`] (the publisher died), [`ErrorKind::Detached`] (the
/// publisher stopped waiting for us). [`ErrorKind::Lagged`] does not end it.
///
/// # Iteration
///
/// [`iter`](Self::iter) (or `for msg in &mut subscriber`) yields the messages as
/// vectors: `Some(Ok(msg))` for each message; `Some(Err(e))` for
/// [`ErrorKind::Lagged`] (the count lost is in [`Error::missed`]) and, in non-blocking
/// mode, [`ErrorKind::WouldBlock`], after which the iteration goes on; `None` at
/// [`ErrorKind::EndOfStream`]; and for any other error (the publisher died, this
/// subscriber was detached, …) that error once, then `None`.
///
/// ```no_run
/// # fn demo() -> shmlink::Result<()> {
/// use shmlink::{ErrorKind, PubSubOptions, Subscriber};
/// let mut sub = Subscriber::connect("shm:prices", &PubSubOptions::default())?;
/// for msg in sub.iter() {
///     match msg {
///         Ok(msg) => println!("{} bytes", msg.len()),
///         Err(e) if e.kind() == ErrorKind::Lagged => eprintln!("lost {:?}", e.missed()),
///         Err(e) => return Err(e), // the subscription is over
///     }
/// }
/// // The publisher closed the topic and everything was read.
/// # Ok(()) }
/// ```
///
/// `Send`, not `Sync` (every call takes `&mut self`). See [`Publisher`](crate::Publisher)
/// for an example with both ends.
pub struct Subscriber {
    inner: Inner,
    /// What it subscribed to, as asked: the address and options a resubscription uses.
    origin: Box<(String, PubSubOptions)>,
}

enum Inner {
    Shm(ShmSubscriber),
    Net(NetSubscriber),
}

/// Runs `$body` with `$s` bound to the subscriber inside, whatever its kind.
macro_rules! with_sub {
    ($sub:expr, |$s:ident| $body:expr) => {
        match $sub {
            Inner::Shm($s) => $body,
            Inner::Net($s) => $body,
        }
    };
}

impl Subscriber {
    /// Subscribes to the topic a [`Publisher`](crate::Publisher) bound at `addr`: `shm:`
    /// (as for [`Connection::connect`](crate::Connection::connect)), `tcp:HOST:PORT`,
    /// `tls:HOST:PORT` (TLS settings in the [`Options`](crate::Options) of `opts`) or
    /// `auto:HOST:PORT`.
    pub fn connect(addr: &str, opts: &PubSubOptions) -> Result<Subscriber> {
        Ok(Subscriber {
            inner: subscribe(addr, opts)?,
            origin: Box::new((addr.to_owned(), opts.clone())),
        })
    }

    /// Subscribes again, once, to the address and with the options of
    /// [`connect`](Self::connect): to the publisher now bound there, after the last one
    /// closed, died or detached this subscriber (see [`PubSubOptions::resubscribe`]).
    /// On success the old subscription is dropped and the fd ([`AsRawFd`]) is a new one;
    /// non-blocking mode carries over. Fails as `connect` does, e.g. with
    /// [`ErrorKind::ConnectionRefused`] while no publisher is bound, and then leaves the
    /// subscriber as it was.
    pub fn resubscribe(&mut self) -> Result<()> {
        let nonblocking = self.is_nonblocking();
        let (addr, opts) = &*self.origin;
        let mut inner = subscribe(addr, opts)?;
        with_sub!(&mut inner, |s| s.set_nonblocking(nonblocking));
        self.inner = inner;
        Ok(())
    }

    /// After an error of a blocking receive: with [`PubSubOptions::resubscribe`], an end
    /// of the subscription becomes a wait for the next publisher and
    /// [`ErrorKind::Resubscribed`]; any other error is returned as it is.
    #[cold]
    fn after(&mut self, e: Error) -> Error {
        note(&e);
        let ended = matches!(
            e.kind(),
            ErrorKind::EndOfStream | ErrorKind::ConnectionReset | ErrorKind::Detached
        );
        if !ended || !self.origin.1.resubscribe || self.is_nonblocking() {
            return e;
        }
        let mut pause = Duration::from_millis(10);
        loop {
            match self.resubscribe() {
                Ok(()) => break,
                // Nobody bound yet, or a publisher that closed while this subscriber
                // connected (its listener still queued the connection, then reset it
                // unanswered): both mean "not there yet".
                Err(again)
                    if matches!(
                        again.kind(),
                        ErrorKind::ConnectionRefused
                            | ErrorKind::ConnectionReset
                            | ErrorKind::EndOfStream
                    ) =>
                {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(250));
                }
                Err(other) => return other,
            }
        }
        let what = match e.kind() {
            ErrorKind::EndOfStream => "closed the topic",
            ErrorKind::ConnectionReset => "died",
            _ => "detached this subscriber",
        };
        let r = Error::new(
            ErrorKind::Resubscribed,
            format!(
                "{}: the publisher {what}; subscribed again to the next one (messages \
                 published in between were not received)",
                self.origin.0
            ),
        );
        crate::trace::event!(info, error = %r, "subscriber resubscribed");
        r
    }

    /// Receives the next message into `buf`; returns its length. If it does not fit,
    /// returns [`ErrorKind::MessageTooLarge`] and leaves it queued.
    #[inline]
    pub fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        with_sub!(&mut self.inner, |s| s.recv(buf)).map_err(|e| self.after(e))
    }

    /// Receives the next message into a new vector.
    pub fn recv_vec(&mut self) -> Result<Vec<u8>> {
        with_sub!(&mut self.inner, |s| s.recv_vec()).map_err(|e| self.after(e))
    }

    /// The messages, until the end of the stream (see "Iteration" above).
    pub fn iter(&mut self) -> Messages<'_> {
        Messages {
            sub: self,
            done: false,
        }
    }

    /// Receives the next message and lends it: over `shm:` in place, in the shared ring
    /// (it is consumed when the [`Sample`] drops); over the network from a buffer the
    /// subscriber keeps (it is consumed at once).
    ///
    /// Under [`Policy::Block`] the publisher does not reuse a shared slot before the
    /// sample drops (unless it detaches this subscriber). Under [`Policy::Overwrite`] it
    /// may overwrite it at any time, even while you read: the sample's copies
    /// ([`Sample::copy_to`], [`Sample::to_vec`]) check afterwards that the bytes were
    /// intact and give `None` when they were not, so torn bytes are never kept.
    #[inline]
    pub fn recv_ref(&mut self) -> Result<Sample<'_>> {
        let res = match &mut self.inner {
            Inner::Shm(s) => s.recv_ref().map(|s| Sample(Lent::Shm(s))),
            Inner::Net(n) => n
                .recv_lent()
                .map(|(bytes, position)| Sample(Lent::Net { bytes, position })),
        };
        if let Err(e) = &res {
            note(e);
        }
        res
    }

    /// Switches non-blocking mode.
    pub fn set_nonblocking(&mut self, nonblocking: bool) {
        with_sub!(&mut self.inner, |s| s.set_nonblocking(nonblocking))
    }

    /// Whether the subscriber is in non-blocking mode.
    pub fn is_nonblocking(&self) -> bool {
        with_sub!(&self.inner, |s| s.is_nonblocking())
    }

    /// Counters: messages received and lost, and how far behind the publisher we are.
    pub fn stats(&self) -> SubscriberStats {
        with_sub!(&self.inner, |s| s.stats())
    }

    /// The topic's policy.
    pub fn policy(&self) -> Policy {
        with_sub!(&self.inner, |s| s.policy())
    }

    /// Largest message the topic carries.
    pub fn max_msg_size(&self) -> usize {
        with_sub!(&self.inner, |s| s.max_msg_size())
    }

    /// Whether the kernel keeps this subscriber (and every other) from writing the
    /// topic's messages (`F_SEAL_FUTURE_WRITE`, Linux 5.1 and later). Over the network:
    /// true, the messages are copies.
    pub fn is_read_only(&self) -> bool {
        match &self.inner {
            Inner::Shm(s) => s.is_read_only(),
            Inner::Net(_) => true,
        }
    }

    /// Position of the next message this subscriber reads (messages are numbered from 0
    /// in the order they were published).
    pub fn position(&self) -> u64 {
        with_sub!(&self.inner, |s| s.position())
    }

    /// The address subscribed to (over shared memory after an `auto:` subscription: the
    /// topic's rendezvous socket).
    pub fn addr(&self) -> &str {
        with_sub!(&self.inner, |s| s.addr())
    }

    /// What the messages travel over: [`Transport::Shm`], [`Transport::Tcp`] or
    /// [`Transport::Tls`] (an `auto:` subscription reports the one it settled on).
    pub fn transport(&self) -> Transport {
        match &self.inner {
            Inner::Shm(_) => Transport::Shm,
            Inner::Net(n) => n.transport(),
        }
    }
}

/// Subscribes to `addr`: the work of [`Subscriber::connect`] and of a resubscription.
fn subscribe(addr: &str, opts: &PubSubOptions) -> Result<Inner> {
    opts.validate()?;
    let parsed = Address::parse(addr)?;
    Ok(match parsed {
        Address::Shm { .. } => Inner::Shm(ShmSubscriber::connect(&parsed, addr, opts)?),
        Address::Ux(_) => {
            return Err(Error::new(
                ErrorKind::InvalidAddress,
                format!("publish/subscribe does not serve ux: addresses ({addr})"),
            ))
        }
        _ => match remote::connect(&parsed, addr, opts)
            .map_err(|e| e.context(format_args!("subscribe {addr}")))?
        {
            Connected::Net(n) => Inner::Net(n),
            Connected::Shm(s) => Inner::Shm(s),
        },
    })
}

/// Reports, with the `tracing` feature, what an error says about the subscription (its
/// message names the topic).
#[cold]
fn note(e: &Error) {
    match e.kind() {
        ErrorKind::Lagged => crate::trace::event!(
            warn,
            missed = e.missed().unwrap_or(0),
            error = %e,
            "subscriber lagged: messages overwritten before it read them"
        ),
        ErrorKind::Detached => {
            crate::trace::event!(warn, error = %e, "subscriber detached by the publisher")
        }
        ErrorKind::ConnectionReset => {
            crate::trace::event!(warn, error = %e, "subscriber: the publisher died")
        }
        _ => {}
    }
    let _ = e;
}

/// The iterator [`Subscriber::iter`] returns (see "Iteration" on [`Subscriber`]).
///
/// `Send`, like the [`Subscriber`] it borrows.
#[derive(Debug)]
pub struct Messages<'a> {
    sub: &'a mut Subscriber,
    done: bool,
}

impl Iterator for Messages<'_> {
    type Item = Result<Vec<u8>>;

    fn next(&mut self) -> Option<Result<Vec<u8>>> {
        if self.done {
            return None;
        }
        match self.sub.recv_vec() {
            Ok(msg) => Some(Ok(msg)),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Lagged | ErrorKind::WouldBlock | ErrorKind::Resubscribed
                ) =>
            {
                Some(Err(e))
            }
            Err(e) => {
                self.done = true;
                (e.kind() != ErrorKind::EndOfStream).then_some(Err(e))
            }
        }
    }
}

impl std::iter::FusedIterator for Messages<'_> {}

impl<'a> IntoIterator for &'a mut Subscriber {
    type Item = Result<Vec<u8>>;
    type IntoIter = Messages<'a>;

    fn into_iter(self) -> Messages<'a> {
        self.iter()
    }
}

impl AsFd for Subscriber {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match &self.inner {
            Inner::Shm(s) => s.as_fd(),
            Inner::Net(n) => n.fd(),
        }
    }
}

impl AsRawFd for Subscriber {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("addr", &self.addr())
            .field("transport", &self.transport())
            .field("position", &self.position())
            .field("stats", &self.stats())
            .finish()
    }
}

/// A message lent by [`Subscriber::recv_ref`]: copy it out with [`copy_to`](Self::copy_to)
/// or [`to_vec`](Self::to_vec), which tell whether the publisher left it intact, or
/// borrow it with the `unsafe` [`as_slice`](Self::as_slice).
///
/// ```
/// # fn demo(sub: &mut shmlink::Subscriber) -> shmlink::Result<()> {
/// let sample = sub.recv_ref()?;
/// let mut head = [0u8; 16];
/// match sample.copy_to(&mut head) {
///     Some(n) => println!("{} bytes, head {:?}", sample.len(), &head[..n]),
///     None => println!("overwritten while read: counted as lost"),
/// }
/// # Ok(()) }
/// ```
///
/// Neither `Send` nor `Sync`: a slot of shared memory lent to the thread that called
/// [`Subscriber::recv_ref`].
pub struct Sample<'a>(Lent<'a>);

enum Lent<'a> {
    Shm(ShmSample<'a>),
    Net { bytes: &'a [u8], position: u64 },
}

impl Sample<'_> {
    /// Whether the publisher has left the message alone so far: `false` means it
    /// overwrote it (`overwrite` policy, or this subscriber was detached) and what was
    /// read may be torn. The message then counts as lost: the next `recv` reports it
    /// among the missed ones ([`ErrorKind::Lagged`]). Always true over the network.
    #[inline]
    pub fn intact(&self) -> bool {
        match &self.0 {
            Lent::Shm(s) => s.intact(),
            Lent::Net { .. } => true,
        }
    }

    /// The message's position in the topic.
    pub fn position(&self) -> u64 {
        match &self.0 {
            Lent::Shm(s) => s.position(),
            Lent::Net { position, .. } => *position,
        }
    }
}

impl Sample<'_> {
    fn bytes(&self) -> SharedBytes<'_> {
        match &self.0 {
            Lent::Shm(s) => s.bytes(),
            Lent::Net { bytes, .. } => SharedBytes::local(bytes),
        }
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

    /// Copies the first `min(len, dst.len())` bytes into `dst` and returns how many, if
    /// the publisher left the message intact while they were copied; `None` if it
    /// overwrote it (what `dst` holds then is torn: discard it; the message counts as
    /// lost and the next `recv` reports it).
    #[inline]
    pub fn copy_to(&self, dst: &mut [u8]) -> Option<usize> {
        let n = self.bytes().copy_to(dst);
        self.intact().then_some(n)
    }

    /// A copy of the message, if the publisher left it intact while it was copied
    /// (see [`copy_to`](Self::copy_to)).
    pub fn to_vec(&self) -> Option<Vec<u8>> {
        let v = self.bytes().to_vec();
        self.intact().then_some(v)
    }

    /// The bytes, borrowed in place.
    ///
    /// # Safety
    /// Over `shm:` the bytes are in the publisher's memory. They must not change while
    /// the slice is used: the publisher must be trusted, its policy must be
    /// [`Policy::Block`], and this subscriber must not be detached meanwhile (check
    /// [`intact`](Self::intact) after use). Under [`Policy::Overwrite`] an honest
    /// publisher overwrites slots at will, so this is never sound there while it
    /// publishes.
    #[inline]
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: forwarded to the caller.
        unsafe { self.bytes().as_slice() }
    }
}
