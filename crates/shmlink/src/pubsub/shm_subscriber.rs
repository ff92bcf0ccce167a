//! A subscriber over shared memory: reads the topic in place with its own cursor, sleeps
//! on its socket. The public [`Subscriber`](super::Subscriber) wraps it (or a remote one).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use super::handshake::{
    Packet, Subscribe, Subscribed, FEATURE_BACKGROUND, MAX_PACKET, POLICY_BLOCK, POLICY_OVERWRITE,
};
use super::options::{Policy, PubSubOptions};
use super::ring::{
    arm_subscriber, disarm_subscriber, Geometry, Peek, Ring, MAX_POSITION, MAX_SUBSCRIBERS,
};
use super::segment::{BellSegment, CursorSegment, TopicSegment};
use super::stats::SubscriberStats;
use super::timed_out;
use crate::addr::Address;
use crate::error::{Error, ErrorKind, Result};
use crate::notify::{self, spin_then_yield, Doorbell};
use crate::options::WaitPolicy;
use crate::rendezvous::socket_of;
use crate::sys::{self, poll_fd, socket};
use crate::transport::shm::handshake::Token;
use crate::trust;
use crate::view::SharedBytes;

/// A parked subscriber looks at the ring again after this long even without a doorbell:
/// the bell bits are shared by all subscribers, and one that clears another's bit could
/// otherwise make it miss a wake-up for good. Costs an idle subscriber ten wake-ups a
/// second.
const RECHECK: Duration = Duration::from_millis(100);

/// Maps the topic a publisher announced in `ok`, after checking every number of the
/// announcement (before any arithmetic on it) and the memfd against them.
pub(crate) fn attach_topic(ok: &Subscribed, seg_fd: &OwnedFd) -> Result<(TopicSegment, Policy)> {
    let policy = match ok.policy {
        POLICY_BLOCK => Policy::Block,
        POLICY_OVERWRITE => Policy::Overwrite,
        p => return Err(Error::violation(format!("unknown policy {p}"))),
    };
    let (Ok(slot_size), Ok(max_msg), Ok(hl)) = (
        usize::try_from(ok.slot_size),
        usize::try_from(ok.max_msg),
        usize::try_from(ok.header_len),
    ) else {
        return Err(Error::violation(format!("publisher announced {ok:?}")));
    };
    let geom = Geometry {
        slots: ok.slots,
        slot_size,
        max_msg,
    };
    let seg = TopicSegment::attach(seg_fd, geom, ok.policy, hl)?;
    Ok((seg, policy))
}

/// A subscriber attached to the topic's shared memory (see [`Subscriber`](super::Subscriber)).
pub(crate) struct ShmSubscriber {
    ring: Ring,
    /// Keeps the topic mapped; `ring` points into it.
    _seg: TopicSegment,
    bell: BellSegment,
    page: CursorSegment,
    slot: usize,
    block: bool,
    max_msg: usize,
    sock: OwnedFd,
    /// Next position to read.
    cursor: u64,
    received: u64,
    missed: u64,
    wait: WaitPolicy,
    recv_timeout: Option<Duration>,
    nonblocking: bool,
    /// Our bell bit is set (we announced sleep and have not been busy since).
    armed: bool,
    /// The socket reported end-of-file: the publisher is gone.
    peer_eof: bool,
    /// An announcement found a message at once; its doorbell may still come.
    stale_doorbell: bool,
    broken: Option<String>,
    read_only: bool,
    addr: String,
}

// SAFETY: the raw pointers in `ring` point into `_seg`, which the subscriber owns and
// moves with it.
unsafe impl Send for ShmSubscriber {}

impl ShmSubscriber {
    /// Subscribes to the topic whose rendezvous socket `parsed` (an `shm:` address) names.
    pub(crate) fn connect(
        parsed: &Address,
        addr: &str,
        opts: &PubSubOptions,
    ) -> Result<ShmSubscriber> {
        ShmSubscriber::handshake(parsed, addr, None, opts)
            .map_err(|e| e.context(format_args!("subscribe {addr}")))
    }

    /// An `auto:` subscriber's attach: presents `token` at the topic's socket `parsed` and
    /// takes the topic only if the publisher answers with `proof`. No uid check of the
    /// publisher: the proof shows that it is the publisher reached over the network,
    /// whoever runs it.
    pub(crate) fn connect_upgrade(
        parsed: &Address,
        addr: &str,
        token: Token,
        proof: Token,
        opts: &PubSubOptions,
    ) -> Result<ShmSubscriber> {
        ShmSubscriber::handshake(parsed, addr, Some((token, proof)), opts)
            .map_err(|e| e.context(format_args!("subscribe {addr}")))
    }

    /// Subscribes over `sock`, a socket already connected to the topic's control thread
    /// (the fan-out's ring readers); `addr` names the topic in errors.
    pub(crate) fn connect_on(
        sock: OwnedFd,
        addr: &str,
        opts: &PubSubOptions,
    ) -> Result<ShmSubscriber> {
        let deadline = Instant::now() + opts.base.connect_timeout;
        ShmSubscriber::handshake_on(sock, addr, None, opts, deadline)
            .map_err(|e| e.context(format_args!("subscribe {addr}")))
    }

    /// Connects to the topic's socket and subscribes; with `upgrade` = `(token, proof)`,
    /// as an `auto:` subscriber.
    fn handshake(
        parsed: &Address,
        addr: &str,
        upgrade: Option<(Token, Token)>,
        opts: &PubSubOptions,
    ) -> Result<ShmSubscriber> {
        let deadline = Instant::now() + opts.base.connect_timeout;
        if upgrade.is_none() {
            trust::check_addr_dir(parsed, &opts.base)?;
        }
        let sock = socket::connect(socket_of(parsed), deadline).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => Error::new(
                ErrorKind::ConnectionRefused,
                format!("no publisher at {addr} ({e})"),
            ),
            io::ErrorKind::PermissionDenied => Error::new(
                ErrorKind::PermissionDenied,
                format!("no permission to reach {addr} ({e})"),
            ),
            _ => Error::io("rendezvous socket", e),
        })?;
        if upgrade.is_none() {
            trust::check_server(
                sock.as_fd(),
                &opts.base,
                &format!("the publisher at {addr}"),
            )?;
        }
        ShmSubscriber::handshake_on(sock, addr, upgrade, opts, deadline)
    }

    pub(crate) fn handshake_on(
        sock: OwnedFd,
        addr: &str,
        upgrade: Option<(Token, Token)>,
        opts: &PubSubOptions,
        deadline: Instant,
    ) -> Result<ShmSubscriber> {
        let want = Subscribe {
            features: if opts.background {
                FEATURE_BACKGROUND
            } else {
                0
            },
            history: opts.subscriber_history(),
            max_msg: opts.max_msg_size.unwrap_or(0) as u64,
        };
        let req = match upgrade {
            None => Packet::Subscribe(want),
            Some((token, _)) => Packet::Upgrade(want, token),
        };
        socket::send(sock.as_fd(), &req.encode()).map_err(|e| Error::io("send request", e))?;
        let mut buf = [0u8; MAX_PACKET];
        let mut fds = Vec::new();
        let n = socket::recv_until(sock.as_fd(), &mut buf, &mut fds, deadline).map_err(|e| {
            if e.kind() == io::ErrorKind::TimedOut {
                Error::new(ErrorKind::TimedOut, "publisher did not answer the request")
            } else {
                Error::io("receive the publisher's answer", e)
            }
        })?;
        if n == 0 {
            return Err(Error::new(
                ErrorKind::ConnectionRefused,
                "publisher closed the connection during the handshake",
            ));
        }
        let ok = match (Packet::decode(&buf[..n])?, upgrade) {
            (Packet::Subscribed(ok), None) => ok,
            (Packet::Upgraded(ok, proof), Some((_, want))) if proof == want => ok,
            (Packet::Upgraded(..), Some(_)) => {
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                    "the publisher at {addr} is not the one reached over the network (wrong proof)"
                ),
                ))
            }
            (Packet::Refuse(code, reason), _) => {
                return Err(Error::new(
                    code.kind(),
                    format!("refused: {reason} (is {addr} a publisher?)"),
                ))
            }
            (other, _) => {
                return Err(Error::violation(format!(
                    "publisher answered with {other:?}"
                )))
            }
        };
        if let Some(max) = opts.max_msg_size {
            if ok.max_msg > max as u64 {
                return Err(Error::violation(format!(
                    "publisher accepted us for messages up to {} bytes, we asked for at most {max}",
                    ok.max_msg
                )));
            }
        }
        if ok.slot as usize >= MAX_SUBSCRIBERS || ok.start > MAX_POSITION {
            return Err(Error::violation(format!(
                "publisher announced slot {} and start {}",
                ok.slot, ok.start
            )));
        }
        let [seg_fd, bell_fd, page_fd] = <[OwnedFd; 3]>::try_from(fds).map_err(|fds| {
            Error::violation(format!(
                "answer carried {} descriptors, expected 3",
                fds.len()
            ))
        })?;
        let (seg, policy) = attach_topic(&ok, &seg_fd)?;
        let geom = seg.geometry();
        let bell = BellSegment::attach(&bell_fd, "bell page")?;
        let page = CursorSegment::attach(&page_fd, "cursor page")?;
        if page.get().initial_cursor() != ok.start {
            return Err(Error::violation(format!(
                "cursor page starts at {}, the answer said {}",
                page.get().initial_cursor(),
                ok.start
            )));
        }
        // Sleeping is a blocking `recv` on the socket (after `poll`); every other call on
        // it says MSG_DONTWAIT.
        let _ = sys::stream::set_blocking(sock.as_fd());
        Ok(ShmSubscriber {
            ring: seg.ring(),
            read_only: TopicSegment::read_only_for_subscribers(&seg_fd),
            _seg: seg,
            bell,
            page,
            slot: ok.slot as usize,
            block: policy == Policy::Block,
            max_msg: geom.max_msg,
            sock,
            cursor: ok.start,
            received: 0,
            missed: 0,
            wait: opts.base.wait,
            recv_timeout: opts.recv_timeout,
            nonblocking: false,
            // The publisher armed us, so the first message rings our doorbell.
            armed: true,
            peer_eof: false,
            stale_doorbell: false,
            broken: None,
            addr: addr.to_string(),
        })
    }

    /// A subscriber over segments made by hand (fuzzing): `seg` is read through its
    /// ring whatever it holds.
    pub(crate) fn over(
        seg: TopicSegment,
        bell: BellSegment,
        page: CursorSegment,
        sock: OwnedFd,
        policy: Policy,
        max_msg: usize,
    ) -> ShmSubscriber {
        ShmSubscriber {
            ring: seg.ring(),
            _seg: seg,
            bell,
            cursor: page.get().initial_cursor(),
            page,
            slot: 0,
            block: policy == Policy::Block,
            max_msg,
            sock,
            received: 0,
            missed: 0,
            wait: WaitPolicy::BLOCKING,
            recv_timeout: None,
            nonblocking: true,
            armed: true,
            peer_eof: false,
            stale_doorbell: false,
            broken: None,
            read_only: false,
            addr: "shm:fuzz".into(),
        }
    }

    /// Receives the next message into `buf`; returns its length. If it does not fit,
    /// returns [`ErrorKind::MessageTooLarge`] and leaves it queued.
    #[inline]
    pub(crate) fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        loop {
            let (ptr, len) = self.next()?;
            if len > buf.len() {
                return Err(Error::new(
                    ErrorKind::MessageTooLarge,
                    format!(
                        "message of {len} bytes does not fit the {}-byte buffer (still queued)",
                        buf.len()
                    ),
                ));
            }
            // SAFETY: `peek` validated `len` against the slot's payload area, which is
            // mapped for as long as we are; `copy_shared` may race with the publisher
            // overwriting the slot, which `intact` detects below.
            unsafe { sys::copy_shared(buf.as_mut_ptr(), ptr.as_ptr(), len) };
            if self.ring.intact(self.cursor) {
                self.consume();
                return Ok(len);
            }
            self.torn()?;
        }
    }

    /// Receives the next message into a new vector.
    pub(crate) fn recv_vec(&mut self) -> Result<Vec<u8>> {
        loop {
            let (ptr, len) = self.next()?;
            // SAFETY: as in `recv`.
            let v = unsafe { SharedBytes::shared(ptr, len) }.to_vec();
            if self.ring.intact(self.cursor) {
                self.consume();
                return Ok(v);
            }
            self.torn()?;
        }
    }

    /// Receives the next message and lends it in place, in the shared ring; it is
    /// consumed when the [`ShmSample`] drops.
    ///
    /// Under [`Policy::Block`] the publisher does not reuse the slot before then (unless
    /// it detaches this subscriber). Under [`Policy::Overwrite`] it may overwrite it at
    /// any time: the sample's copies check [`ShmSample::intact`] after copying.
    #[inline]
    pub(crate) fn recv_ref(&mut self) -> Result<ShmSample<'_>> {
        let (ptr, len) = self.next()?;
        Ok(ShmSample {
            sub: self,
            ptr,
            len,
        })
    }

    /// `block` policy, for the fan-out: hands the next message, in place, to `send`,
    /// and consumes it only if `send` succeeds — so the cursor moves (and the publisher
    /// may reuse the slot) only once the message was accepted. A message found torn
    /// after `send` (we were detached meanwhile, and the publisher overwrote it) fails
    /// with [`ErrorKind::ProtocolViolation`]: what was sent cannot be trusted.
    pub(crate) fn forward(&mut self, send: impl FnOnce(&[u8]) -> Result<()>) -> Result<()> {
        debug_assert!(self.block);
        let (ptr, len) = self.next()?;
        // SAFETY: as in `recv`; under `block` the publisher leaves the slot alone until
        // we consume it, unless it detached us, which `intact` reports below.
        send(unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) })?;
        if !self.ring.intact(self.cursor) {
            return Err(Error::violation(format!(
                "{}: message {} overwritten while it was forwarded (detached)",
                self.addr, self.cursor
            )));
        }
        self.consume();
        Ok(())
    }

    /// The slot this subscriber has in the topic.
    pub(crate) fn slot(&self) -> usize {
        self.slot
    }

    /// Whether the publisher marked us detached.
    pub(crate) fn is_detached(&self) -> bool {
        self.page.get().detached()
    }

    /// The message at the cursor, validated; or the reason there is none.
    #[inline(always)]
    fn next(&mut self) -> Result<(NonNull<u8>, usize)> {
        if let Ok(Peek::Ready { ptr, len }) = self.ring.peek(self.cursor) {
            if !self.armed && self.broken.is_none() {
                return Ok((ptr, len));
            }
        }
        self.next_slow()
    }

    #[cold]
    #[inline(never)]
    fn next_slow(&mut self) -> Result<(NonNull<u8>, usize)> {
        if let Some(msg) = &self.broken {
            return Err(Error::violation(format!(
                "{}: subscription broken earlier: {msg}",
                self.addr
            )));
        }
        loop {
            match self.ring.peek(self.cursor) {
                Ok(Peek::Ready { ptr, len }) => {
                    if self.armed {
                        // Once the publisher is gone or removed us, the slot (and the
                        // bit) may belong to someone else: leave it alone.
                        if !self.peer_eof {
                            disarm_subscriber(self.bell.get(), self.slot);
                        }
                        self.armed = false;
                    }
                    return Ok((ptr, len));
                }
                Ok(Peek::Overwritten { newer }) => return Err(self.lagged(newer)),
                Ok(Peek::Empty) => self.wait_message()?,
                Err(e) => return Err(self.fail(e)),
            }
        }
    }

    /// What was read at the cursor is no longer intact: find out why.
    #[cold]
    fn torn(&mut self) -> Result<()> {
        // An Acquire load of the stamp that broke the read (see `Ring::begin`).
        match self.ring.peek(self.cursor) {
            Ok(Peek::Overwritten { newer }) => Err(self.lagged(newer)),
            Ok(other) => Err(self.fail(Error::violation(format!(
                "message {}: slot went from complete to {other:?}",
                self.cursor
            )))),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Our message was overwritten by `newer`.
    #[cold]
    fn lagged(&mut self, newer: u64) -> Error {
        if self.block {
            // The publisher overwrites a live subscriber's message only after detaching
            // it, and the mark is visible to whoever saw the newer stamp.
            if self.page.get().detached() {
                return self.detached();
            }
            return self.fail(Error::violation(format!(
                "message {} overwritten although the publisher waits for us",
                self.cursor
            )));
        }
        let next = self.ring.skip_to(self.cursor, newer);
        if next > MAX_POSITION {
            return self.fail(Error::violation(format!(
                "the publisher claims message {next}, beyond any possible position"
            )));
        }
        let missed = next - self.cursor;
        self.cursor = next;
        self.missed += missed;
        self.page.get().advance(next, self.missed, false);
        Error::lagged(missed, &self.addr)
    }

    fn detached(&self) -> Error {
        Error::new(
            ErrorKind::Detached,
            format!(
                "{}: the publisher detached this subscriber (the publisher waited for it, and within the stall timeout it did not read what was published when the wait began); subscribe again to resume",
                self.addr
            ),
        )
    }

    /// Consumes the message at the cursor.
    #[inline(always)]
    fn consume(&mut self) {
        self.cursor += 1;
        self.received += 1;
        if self
            .page
            .get()
            .advance(self.cursor, self.missed, self.block)
        {
            // The publisher waits for us: its doorbell.
            let _ = socket::send(self.sock.as_fd(), &[1]);
        }
    }

    /// Remembers a protocol violation; every later call fails with it.
    #[cold]
    fn fail(&mut self, e: impl Into<Error>) -> Error {
        let e = e.into();
        if e.kind() == ErrorKind::ProtocolViolation && self.broken.is_none() {
            self.broken = Some(e.message().to_string());
        }
        e
    }

    /// Takes one doorbell off the socket, noticing EOF; `Ok(false)` if none was there.
    fn take_doorbell(&mut self) -> Result<bool> {
        match notify::take_doorbell(self.sock.as_fd(), false) {
            Ok(Doorbell::Packet { .. }) => return Ok(true),
            Ok(Doorbell::None) => {}
            Ok(Doorbell::Gone) => self.peer_eof = true,
            Err(e) => return Err(Error::io(format!("{}: socket", self.addr), e)),
        }
        Ok(false)
    }

    /// Drains pending doorbells (bounded), so the fd stops being readable for them.
    fn drain(&mut self) -> Result<()> {
        notify::drain(|| self.take_doorbell())
    }

    /// Waits until the slot at the cursor changes (a message, or an overwrite), or
    /// reports why there will be none.
    fn wait_message(&mut self) -> Result<()> {
        let blocking = !self.nonblocking;
        let deadline = self
            .recv_timeout
            .filter(|_| blocking)
            .map(|t| Instant::now() + t);
        if blocking {
            let (ring, cursor) = (self.ring, self.cursor);
            if spin_then_yield(&self.wait, || {
                Ok(!matches!(ring.peek(cursor), Ok(Peek::Empty)))
            })? {
                return Ok(());
            }
        }
        if !blocking || self.stale_doorbell {
            self.stale_doorbell = false;
            self.drain()?;
        }
        loop {
            if self.peer_eof || self.ring.closed() {
                return self.end();
            }
            arm_subscriber(self.page.get(), self.bell.get(), self.slot);
            self.armed = true;
            if !matches!(self.ring.peek(self.cursor), Ok(Peek::Empty)) {
                self.stale_doorbell = true;
                return Ok(());
            }
            if self.page.get().detached() {
                return Err(self.detached());
            }
            if !blocking {
                return Err(Error::would_block());
            }
            let recheck = Instant::now() + RECHECK;
            let woke = poll_fd(
                self.sock.as_fd(),
                sys::Interest::READABLE,
                Some(deadline.map_or(recheck, |d| d.min(recheck))),
            )
            .map_err(|e| Error::io(format!("{}: poll", self.addr), e))?;
            if woke {
                self.take_doorbell()?;
            }
            if !matches!(self.ring.peek(self.cursor), Ok(Peek::Empty)) {
                return Ok(());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                // Still armed: the next message rings as usual.
                return Err(timed_out(&self.addr));
            }
        }
    }

    /// The publisher closed or is gone: what it published is still read, then
    /// end-of-stream if it closed gracefully, `Detached` if it detached us, a reset if it
    /// died.
    fn end(&mut self) -> Result<()> {
        // `closed` first: seeing it guarantees seeing every message before it.
        let closed = self.ring.closed();
        match self.ring.peek(self.cursor) {
            Ok(Peek::Empty) => {}
            Ok(_) => return Ok(()),
            Err(e) => return Err(self.fail(e)),
        }
        if self.page.get().detached() {
            return Err(self.detached());
        }
        if closed {
            let written = self.ring.written();
            if written > self.cursor {
                return Err(self.fail(Error::violation(format!(
                    "topic closed with {written} messages written, but message {} is missing",
                    self.cursor
                ))));
            }
            return Err(Error::eos());
        }
        Err(Error::reset(format!(
            "{}: the publisher is gone without closing the topic",
            self.addr
        )))
    }

    /// Switches non-blocking mode.
    pub(crate) fn set_nonblocking(&mut self, nonblocking: bool) {
        self.nonblocking = nonblocking;
    }

    /// Whether the subscriber is in non-blocking mode.
    pub(crate) fn is_nonblocking(&self) -> bool {
        self.nonblocking
    }

    /// Counters: messages received and lost, and how far behind the publisher we are.
    pub(crate) fn stats(&self) -> SubscriberStats {
        SubscriberStats {
            received: self.received,
            missed: self.missed,
            lag: self.ring.written().saturating_sub(self.cursor),
        }
    }

    /// The topic's policy.
    pub(crate) fn policy(&self) -> Policy {
        if self.block {
            Policy::Block
        } else {
            Policy::Overwrite
        }
    }

    /// Largest message the topic carries.
    pub(crate) fn max_msg_size(&self) -> usize {
        self.max_msg
    }

    /// Whether the kernel keeps this subscriber (and every other) from writing the
    /// topic's messages (`F_SEAL_FUTURE_WRITE`, Linux 5.1 and later).
    pub(crate) fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Position of the next message this subscriber reads (messages are numbered from 0
    /// in the order they were published).
    pub(crate) fn position(&self) -> u64 {
        self.cursor
    }

    /// The address subscribed to.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }
}

impl AsFd for ShmSubscriber {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl AsRawFd for ShmSubscriber {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl std::fmt::Debug for ShmSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("addr", &self.addr)
            .field("slot", &self.slot)
            .field("position", &self.cursor)
            .field("stats", &self.stats())
            .finish()
    }
}

/// A message lent in place by [`ShmSubscriber::recv_ref`]; consumed when dropped.
pub(crate) struct ShmSample<'a> {
    sub: &'a mut ShmSubscriber,
    ptr: NonNull<u8>,
    len: usize,
}

impl ShmSample<'_> {
    /// Whether the publisher has left the message alone so far: `false` means it
    /// overwrote it (`overwrite` policy, or this subscriber was detached) and what was
    /// read may be torn. The message then counts as lost: the next `recv` reports it
    /// among the missed ones ([`ErrorKind::Lagged`]).
    #[inline]
    pub(crate) fn intact(&self) -> bool {
        self.sub.ring.intact(self.sub.cursor)
    }

    /// The message's position in the topic.
    pub(crate) fn position(&self) -> u64 {
        self.sub.cursor
    }
}

impl ShmSample<'_> {
    /// The payload in the slot, which the publisher may overwrite (`overwrite` policy,
    /// or after detaching us): copy it out, then check [`intact`](Self::intact).
    #[inline]
    pub(crate) fn bytes(&self) -> SharedBytes<'_> {
        // SAFETY: `peek` validated the payload inside the mapped slot, which stays mapped
        // as long as the subscriber this sample borrows.
        unsafe { SharedBytes::shared(self.ptr, self.len) }
    }
}

impl Drop for ShmSample<'_> {
    #[inline]
    fn drop(&mut self) {
        if self.sub.ring.intact(self.sub.cursor) {
            self.sub.consume();
        }
        // Otherwise the next `recv` finds the slot overwritten and reports it.
    }
}
