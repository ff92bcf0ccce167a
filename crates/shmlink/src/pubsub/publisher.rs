//! The publisher: the topic's memory, the subscriber table, the publishing path and its
//! waits. The control thread ([`super::control`]) admits subscribers and notices their
//! death; everything else happens in the calls of the thread that owns the
//! [`Publisher`].
//!
//! # The subscriber table and the cached minimum (`block` policy)
//!
//! The publisher may write message `pos` once every live subscriber's cursor is past
//! `pos - slots`. It keeps `cached_min`, the lowest cursor seen at the last rescan, and
//! rescans the cursor pages (under the table lock) only when `cached_min` says the write
//! would block — Shimmy's slowest-consumer scanner, run on demand, so a publisher whose
//! subscribers keep up reads no cursor page at all on most messages.
//!
//! A joining subscriber must not be overtaken between the moment the control thread
//! picks its start position and the moment the publisher learns of it. The control
//! thread lowers `cached_min` to the start (`fetch_min`), issues a SeqCst fence and reads
//! `written` again; the publisher reads `cached_min` for its next write only after the
//! SeqCst fence that follows each commit ([`Ring::sleepers`]). Of the two fences one is
//! first: either the control thread sees the newer `written` and moves the start past
//! what the publisher may overwrite, or the publisher sees the lowered minimum and
//! rescans before overwriting (Dekker's pattern; see [`super::control`]).
//!
//! # The stall rule (`block` policy)
//!
//! When a rescan finds a subscriber holding the slot the publisher needs, the publisher
//! opens a *stall window* for it: from then on the subscriber has `stall_timeout` to read
//! every message that was published when the window opened (at most a ring's worth), or
//! it is detached the next time it is found holding the publisher up. Moving its cursor
//! does not restart the clock — reaching the window's target does. A subscriber that
//! advanced by one just before each timeout used to hold the publisher to one message
//! per `stall_timeout` forever; now any subscriber the publisher waits on must sustain
//! `slots` messages per `stall_timeout`, which is also the least a hostile subscriber can
//! hold the publisher to. A window whose subscriber got out of the way and then held
//! nobody up for `stall_timeout` (the publisher was idle or kept ahead) is forgotten.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::control::LocalAccess;
use super::fanout::NetSide;
use super::options::{Policy, PubSubOptions};
use super::ring::{LastRing, Ring, MAX_SUBSCRIBERS};
use super::topic::{token_sub, Leave, StallWindow, Sub, Topic, CHANGED_TOKEN, TIMER_TOKEN};
use crate::addr::Address;
use crate::error::{Error, ErrorKind, Result};
use crate::notify::spin_then_yield;
use crate::sync::Ordering;
use crate::sys::{self, socket, Event};

impl Sub {
    /// Rings its doorbell if it announced sleep and the doorbell rule asks for one.
    fn wake(&mut self, ring: &Ring, next: u64) {
        if let Some(rung) = ring.take_sleeper(self.page.get(), self.last_ring, next) {
            self.last_ring = if doorbell(self.sock.as_fd()) {
                rung
            } else {
                LastRing::NONE
            };
        }
    }
}

/// The slots whose bits are set in a bell bit set, lowest first.
fn slots(bits: [u64; 2]) -> impl Iterator<Item = usize> {
    bits.into_iter().enumerate().flat_map(|(w, mut word)| {
        std::iter::from_fn(move || {
            (word != 0).then(|| {
                let bit = word.trailing_zeros() as usize;
                word &= word - 1;
                w * 64 + bit
            })
        })
    })
}

/// Rings a subscriber's doorbell: one byte on its socket. Whether a doorbell is now in
/// the socket: sent, or the socket is full of doorbells not taken yet. A closed socket
/// belongs to a subscriber the control thread is about to remove.
fn doorbell(sock: BorrowedFd<'_>) -> bool {
    match socket::send(sock, &[1]) {
        Ok(_) => true,
        Err(e) => e.kind() == io::ErrorKind::WouldBlock,
    }
}

/// Publisher statistics.
///
/// `Send`, `Sync`, `Copy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Messages published.
    pub published: u64,
    /// Subscribers now.
    pub subscribers: usize,
    /// Subscribers admitted since the topic was bound.
    pub joined: u64,
    /// Subscribers that went away (unsubscribed, exited or died).
    pub left: u64,
    /// Subscribers the publisher detached (stalled, or broke the protocol).
    pub detached: u64,
}

/// One subscriber as the publisher sees it.
///
/// `Send`, `Sync`, `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubscriberInfo {
    /// Its slot in the topic (0..128).
    pub slot: usize,
    /// Its process id (0 if it lives in a PID namespace the publisher cannot see into).
    pub pid: i32,
    /// Its user id.
    pub uid: u32,
    /// Messages published that it has not read yet.
    pub lag: u64,
    /// Messages it lost to overwriting (`overwrite` policy), as it reports them.
    pub missed: u64,
    /// For a subscriber over `tcp:`/`tls:`/`auto:`, its network address (its `pid` and
    /// `uid` are then the publisher's own: the fan-out thread reads for it).
    pub remote: Option<SocketAddr>,
}

/// The publishing end of a topic.
///
/// `bind` creates the topic — a sealed memfd that subscribers map read-only — and a
/// rendezvous socket at the address; a background thread admits subscribers there and
/// notices when they go. Each message is written once, whatever the number of
/// subscribers. With [`Policy::Block`] a full ring makes `publish` wait for the slowest
/// subscriber (or, in non-blocking mode, fail with [`ErrorKind::WouldBlock`]; the
/// publisher's fd becomes readable when it may try again); with [`Policy::Overwrite`]
/// it never waits.
///
/// # Remote subscribers
///
/// A publisher bound at `tcp:`, `tls:` (TLS settings in [`PubSubOptions::options`](crate::PubSubOptions::options)) or
/// `auto:` still creates the ring — the publishing path does not change — and also a
/// framed listener whose hello announces a topic (a point-to-point
/// [`Connection`](crate::Connection) that reaches it, or a subscriber that reaches a
/// plain [`Listener`](crate::Listener), fails at once with
/// [`ErrorKind::ProtocolViolation`]). A fan-out
/// thread joins the ring once per remote subscriber, as an ordinary reader with a cursor
/// page, and forwards its messages on that subscriber's connection:
///
/// - `block`: a message leaves the ring (the reader's cursor advances) only once the
///   connection accepted it, so a slow remote slows the publisher through TCP flow
///   control, and one that stalls is detached after the stall timeout and then told so
///   ([`ErrorKind::Detached`]) after what it was already sent
///   — or reset, if it takes nothing for another stall timeout.
/// - `overwrite`: a remote whose socket stays full loses messages in the ring like a
///   local one and learns the exact count ([`ErrorKind::Lagged`]).
/// - The publisher's death resets every remote
///   ([`ErrorKind::ConnectionReset`]); `close`
///   delivers what was published, then end of stream, waiting for each remote until it
///   takes nothing for the stall timeout.
/// - An `auto:` subscriber on the publisher's kernel (same boot id) is pointed to the
///   topic's rendezvous socket (`topic-PORT-RANDOM.sock` in the rendezvous directory)
///   with a single-use token and a proof (128 bits each) sent over its network
///   subscription, and subscribes there over shared memory: it presents the token, the
///   publisher answers with the proof, which the subscriber checks, and the usual
///   credential check applies; when any of that fails it stays on the network
///   ([`Subscriber::transport`](crate::Subscriber::transport) tells which). As with the
///   point-to-point `auto:` upgrade, the token names that network subscription (it is
///   void once the subscriber asks again, leaves or times out) and the proof shows the
///   subscriber that the socket belongs to the publisher it reached over TCP/TLS.
/// - **The rule**: the shared-memory path grants nothing the network path does not. The
///   socket of an `auto:` topic admits only subscribers holding a token (a plain
///   subscription there is refused with [`ErrorKind::PermissionDenied`], whatever the
///   allow lists say); a `tcp:` or `tls:` topic binds no local socket at all, so a local
///   user admitted by `allow_uids`/`allow_gids` still needs a client certificate for a
///   `tls:` topic.
///
/// Limits: one thread serves every remote (one batch per remote per turn);
/// remote subscribers count against the topic's
/// [`max_subscribers`](crate::PubSubOptions::max_subscribers), and at most
/// [`max_remote_subscribers`](crate::PubSubOptions::max_remote_subscribers) of them
/// (default half) may be remote, so that network clients cannot take the slots of local
/// subscribers (one beyond the bound is refused with a reason); a remote receives
/// copies (`recv_ref` lends from a buffer of the subscriber's); its
/// [`SubscriberStats::lag`](crate::SubscriberStats::lag) is 0 (not known on its side), and [`SubscriberInfo`] shows it
/// with the publisher's own pid and uid and its network address; its `lag` there counts
/// the messages not yet handed to its connection (what waits in socket buffers is not
/// known). The fan-out sends what waits in the ring in batches (one `send` for up to 256
/// messages or 64 KiB; it never waits to fill one). The hellos of both ends announce at
/// least 64 KiB (a full batch), whatever `max_msg_size`.
///
/// ```
/// # std::env::set_var("SHMLINK_DIR", std::env::temp_dir().join(format!("shmlink-doc-{}", std::process::id())));
/// use std::time::Duration;
/// use shmlink::{Publisher, PubSubOptions, Subscriber};
///
/// let opts = PubSubOptions::default().slots(256).max_msg_size(64);
/// let mut publisher = Publisher::bind("shm:doc-prices", &opts)?;
/// let mut subscriber = Subscriber::connect("shm:doc-prices", &PubSubOptions::default())?;
/// publisher.wait_for_subscribers(1, Duration::from_secs(5))?;
///
/// publisher.publish(b"EURUSD 1.0842")?;
/// let mut loan = publisher.loan(13)?; // zero-copy: fill the slot in place
/// loan.copy_from_slice(b"EURUSD 1.0843");
/// loan.publish()?;
///
/// let mut buf = [0u8; 64];
/// let n = subscriber.recv(&mut buf)?;
/// assert_eq!(&buf[..n], b"EURUSD 1.0842");
/// let msg = subscriber.recv_ref()?; // lent in place
/// let mut head = [0u8; 6];
/// assert_eq!(msg.copy_to(&mut head), Some(6)); // None had the publisher overwritten it
/// assert_eq!(&head, b"EURUSD");
/// drop(msg);
///
/// publisher.close()?;
/// assert_eq!(subscriber.recv_vec().unwrap_err().kind(), shmlink::ErrorKind::EndOfStream);
/// # Ok::<(), shmlink::Error>(())
/// ```
///
/// `Send` (publish from any one thread), not `Sync`: every call that publishes takes
/// `&mut self`.
pub struct Publisher {
    topic: Arc<Topic>,
    ring: Ring,
    /// Position of the next message (`written` as we stored it).
    next: u64,
    nonblocking: bool,
    closed: bool,
    /// Write end of the control thread's stop signal: dropping it stops the thread.
    stop: Option<OwnedFd>,
    control: Option<JoinHandle<()>>,
    /// The fan-out to remote subscribers, for a topic bound at a network address.
    net: Option<NetSide>,
    events: Vec<Event>,
    /// A loan is out at `next` (its slot is stamped busy).
    loaned: bool,
}

impl Publisher {
    /// Creates the topic and binds it at `addr`:
    ///
    /// - `shm:NAME`, `shm:/path.sock` or `shm:@name` (as for
    ///   [`Listener::bind`](crate::Listener::bind)): its rendezvous socket;
    /// - `tcp:HOST:PORT`, `tls:HOST:PORT` (TLS settings in the
    ///   [`Options`](crate::Options) of `opts`) or `auto:HOST:PORT`: a listener for
    ///   remote subscribers, served by a fan-out thread (see
    ///   [Remote subscribers](Publisher#remote-subscribers)); for `auto:` also a
    ///   rendezvous socket named `topic-PORT-RANDOM.sock` in the rendezvous directory,
    ///   which `auto:` subscribers on this kernel are pointed to (it admits only those
    ///   holding a token handed out over the network). `tcp:` and `tls:` topics bind no
    ///   local socket.
    pub fn bind(addr: &str, opts: &PubSubOptions) -> Result<Publisher> {
        opts.validate_publisher()?;
        let parsed = Address::parse(addr)?;
        let ctx = |e: Error| e.context(format_args!("bind {addr}"));
        let (shm, plan) = match parsed {
            Address::Shm { .. } => (parsed, None),
            Address::Ux(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidAddress,
                    format!("publish/subscribe does not serve ux: addresses ({addr})"),
                ))
            }
            _ => {
                let plan = super::fanout::plan(&parsed, opts).map_err(ctx)?;
                (plan.shm.clone(), Some(plan))
            }
        };
        let access = match &plan {
            None => LocalAccess::Open,
            Some(plan) if plan.local.is_some() => LocalAccess::Tokens,
            Some(_) => LocalAccess::None,
        };
        let (topic, stop, control) = super::control::start(&shm, access, opts).map_err(ctx)?;
        let mut publisher = Publisher {
            ring: topic.ring(),
            topic,
            next: 0,
            nonblocking: false,
            closed: false,
            stop: Some(stop),
            control: Some(control),
            net: None,
            events: Vec::new(),
            loaned: false,
        };
        if let Some(plan) = plan {
            publisher.net = Some(super::fanout::spawn(plan, publisher.topic.clone()).map_err(ctx)?);
        }
        Ok(publisher)
    }

    #[inline]
    fn check(&self, len: usize) -> Result<()> {
        if self.closed {
            return Err(Error::new(ErrorKind::Closed, "publisher already closed"));
        }
        let max = self.topic.geom.max_msg;
        if len > max {
            return Err(Error::new(
                ErrorKind::MessageTooLarge,
                format!(
                    "message of {len} bytes exceeds the maximum of {max} bytes on {}",
                    self.topic.addr
                ),
            ));
        }
        Ok(())
    }

    /// Publishes one message to every subscriber. Under [`Policy::Block`] waits while the
    /// slowest subscriber holds the oldest slot; a subscriber it waits for that does not
    /// read, within the stall timeout, everything published when the wait began is
    /// detached (see [`PubSubOptions::stall_timeout`]).
    #[inline]
    pub fn publish(&mut self, msg: &[u8]) -> Result<()> {
        self.check(msg.len())?;
        let dst = self.reserve()?;
        // SAFETY: `reserve` stamped the slot busy and returned its payload area of
        // `max_msg` bytes, which `check` bounds `msg.len()` by; nobody else writes it.
        unsafe { sys::copy_to_shared(dst.as_ptr(), msg.as_ptr(), msg.len()) };
        self.commit(msg.len());
        Ok(())
    }

    /// Lends the next slot to be filled in place (zero-copy); [`Loan::publish`] publishes
    /// it, dropping the loan publishes nothing. Waits like [`publish`](Self::publish).
    #[inline]
    pub fn loan(&mut self, len: usize) -> Result<Loan<'_>> {
        self.check(len)?;
        let ptr = self.reserve()?;
        self.loaned = true;
        Ok(Loan {
            publisher: self,
            ptr,
            len,
            done: false,
        })
    }

    /// Room for the next message: its slot stamped busy, its payload area.
    #[inline(always)]
    fn reserve(&mut self) -> Result<NonNull<u8>> {
        let pos = self.next;
        if self.topic.policy == Policy::Block {
            // SYNC POINT (join): Relaxed suffices — the load follows the SeqCst fence in
            // `Ring::sleepers` after our previous commit, which pairs with the fence in
            // the control thread's join (see the module docs).
            let min = self.topic.cached_min.load(Ordering::Relaxed);
            if pos.saturating_sub(min) >= self.topic.geom.slots && !self.loaned {
                self.wait_room()?;
            }
        }
        Ok(self.ring.begin(pos))
    }

    /// Publishes the message at `next` and wakes subscribers that sleep.
    #[inline(always)]
    fn commit(&mut self, len: usize) {
        self.ring.commit(self.next, len);
        self.next += 1;
        self.loaned = false;
        let bits = self.ring.sleepers(self.topic.bell.get());
        if bits != [0, 0] {
            self.wake(bits);
        }
    }

    /// Rings the doorbells of the subscribers that armed: background subscribers after
    /// the others (each doorbell is a system call that delays the next).
    #[cold]
    #[inline(never)]
    fn wake(&mut self, bits: [u64; 2]) {
        let mut table = self.topic.lock();
        let mut later = [0u64; 2];
        for slot in slots(bits) {
            let Some(Some(sub)) = table.subs.get_mut(slot) else {
                continue; // a forged or stale bit: nobody to wake
            };
            if sub.background {
                later[slot / 64] |= 1 << (slot % 64);
            } else {
                sub.wake(&self.ring, self.next);
            }
        }
        for slot in slots(later) {
            if let Some(Some(sub)) = table.subs.get_mut(slot) {
                sub.wake(&self.ring, self.next);
            }
        }
    }

    /// `block` policy, ring full by the cached minimum: rescan, spin, announce, sleep —
    /// until every live subscriber is past the slot, detaching those that stall.
    #[cold]
    #[inline(never)]
    fn wait_room(&mut self) -> Result<()> {
        let need = self.next + 1 - self.topic.geom.slots;
        let mut spun = false;
        loop {
            self.handle_events(Some(Instant::now()))?;
            let (blocked, deadline) = self.rescan(need);
            if !blocked {
                return Ok(());
            }
            if !self.nonblocking && !spun {
                spun = true;
                let wait = self.topic.opts.base.wait;
                if spin_then_yield(&wait, || Ok(!self.rescan(need).0))? {
                    return Ok(());
                }
            }
            // Announce to every subscriber we wait for, then look again. One that sleeps
            // is woken too: another (hostile) subscriber can clear its bell bit, and its
            // stall window must measure its reading, not a missed wake-up. (The same
            // flag protocol as `wake`, after the fence that followed our last commit.)
            {
                let mut table = self.topic.lock();
                for sub in table.subs.iter_mut().flatten() {
                    if sub.known < need {
                        sub.page.get().arm_publisher();
                        sub.wake(&self.ring, self.next);
                    }
                }
            }
            self.ring.publisher_recheck();
            let (blocked, deadline2) = self.rescan(need);
            if !blocked {
                return Ok(()); // flags left set: at most one spurious doorbell each
            }
            let deadline = deadline.min(deadline2);
            if self.nonblocking {
                let after = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                self.topic
                    .timer
                    .set(after)
                    .map_err(|e| Error::io("stall timer", e))?;
                return Err(Error::would_block());
            }
            self.handle_events(deadline)?;
        }
    }

    /// Reads every live cursor (validated), detaches subscribers that stalled, updates
    /// the cached minimum. Returns whether some subscriber still holds a slot before
    /// `need`, and the earliest stall deadline among those that do.
    fn rescan(&self, need: u64) -> (bool, Option<Instant>) {
        let topic = &*self.topic;
        let now = Instant::now();
        let stall_timeout = topic.opts.stall_timeout;
        let mut table = topic.lock();
        let mut min = u64::MAX;
        let mut blocked = false;
        let mut deadline: Option<Instant> = None;
        for slot in 0..table.subs.len() {
            let Some(sub) = table.subs[slot].as_mut() else {
                continue;
            };
            // Read once, validate, then use: the subscriber may write anything here.
            let c = sub.page.get().load_cursor();
            if c < sub.known || c > self.next {
                topic.remove(&mut table, slot, Leave::Violation);
                continue;
            }
            sub.known = c;
            // The stall rule (module docs): moving does not restart the clock; reading
            // everything published when the window opened closes the window.
            if sub.stall.is_some_and(|w| c >= w.target) {
                sub.stall = None;
            }
            if c < need {
                // Out of the way, and holding nobody up for a whole timeout since: this is
                // a new wait, not the old one going on.
                if sub.stall.is_some_and(|w| {
                    w.freed
                        .is_some_and(|f| now.duration_since(f) >= stall_timeout)
                }) {
                    sub.stall = None;
                }
                let w = sub.stall.get_or_insert(StallWindow {
                    since: now,
                    target: self.next,
                    freed: None,
                });
                w.freed = None;
                if now.duration_since(w.since) >= stall_timeout {
                    topic.remove(&mut table, slot, Leave::Stalled);
                    continue;
                }
                blocked = true;
                let d = w.since + stall_timeout;
                deadline = Some(deadline.map_or(d, |x| x.min(d)));
            } else if let Some(w) = sub.stall.as_mut() {
                w.freed.get_or_insert(now);
            }
            min = min.min(c);
        }
        // SYNC POINT (join): under the lock, like the control thread's `fetch_min`.
        topic.cached_min.store(min, Ordering::Relaxed);
        (blocked, deadline)
    }

    /// Takes what the sleep set reports (doorbells, hang-ups, the timer), waiting until
    /// `deadline` (`None`: until something happens).
    fn handle_events(&mut self, deadline: Option<Instant>) -> Result<()> {
        let topic = &*self.topic;
        topic
            .pub_epoll
            .wait(deadline, &mut self.events)
            .map_err(|e| Error::io("epoll", e))?;
        if self.events.is_empty() {
            return Ok(());
        }
        let mut table = topic.lock();
        for token in self.events.iter().map(|e| e.token().0) {
            if token == TIMER_TOKEN {
                let _ = topic.timer.set(None);
                continue;
            }
            if token == CHANGED_TOKEN {
                let mut buf = [0u8; 64];
                for _ in 0..64 {
                    if socket::recv(topic.changed.1.as_fd(), &mut buf).is_err() {
                        break;
                    }
                }
                continue;
            }
            let (slot, gen) = token_sub(token);
            let Some(Some(sub)) = table.subs.get(slot) else {
                continue;
            };
            if sub.gen != gen {
                continue;
            }
            let mut gone = false;
            let mut buf = [0u8; 64];
            // Bounded: a subscriber that keeps ringing cannot keep us here.
            for _ in 0..16 {
                match socket::recv(sub.sock.as_fd(), &mut buf) {
                    Ok(0) => gone = true,
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => gone = true,
                }
                break;
            }
            if gone {
                topic.remove(&mut table, slot, Leave::Gone);
            }
        }
        Ok(())
    }

    /// Switches non-blocking mode: `publish` and `loan` fail with
    /// [`ErrorKind::WouldBlock`] instead of waiting for a slow subscriber, and the
    /// publisher's fd becomes readable when it is worth trying again (a subscriber moved
    /// on or went away, or a stall timeout passed — call `publish` again to apply it).
    pub fn set_nonblocking(&mut self, nonblocking: bool) {
        self.nonblocking = nonblocking;
    }

    /// Waits until at least `n` subscribers are subscribed, or `timeout` passes
    /// ([`ErrorKind::TimedOut`]).
    pub fn wait_for_subscribers(&self, n: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut table = self.topic.lock();
        while table.count < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "{}: {} of {n} subscribers after {timeout:?}",
                        self.topic.addr, table.count
                    ),
                ));
            }
            table = self
                .topic
                .joins
                .wait_timeout(table, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }

    /// Subscribers now.
    pub fn subscriber_count(&self) -> usize {
        // SYNC POINT (members): Acquire pairs with the Release stores made under the
        // table's lock at each join and removal; no lock taken here.
        self.topic.members.load(Ordering::Acquire)
    }

    /// Every subscriber now, with its lag and the losses it reports.
    pub fn subscribers(&self) -> Vec<SubscriberInfo> {
        let table = self.topic.lock();
        let remotes = self.topic.remotes();
        table
            .views(self.next)
            .map(|v| SubscriberInfo {
                slot: v.slot,
                pid: v.sub.cred.pid,
                uid: v.sub.cred.uid,
                lag: v.lag,
                missed: v.missed,
                remote: remotes.get(&v.slot).copied(),
            })
            .collect()
    }

    /// Counters.
    pub fn stats(&self) -> PublisherStats {
        let table = self.topic.lock();
        PublisherStats {
            published: self.next,
            subscribers: table.count,
            joined: table.joined,
            left: table.left,
            detached: table.detached,
        }
    }

    /// Largest message `publish` accepts.
    pub fn max_msg_size(&self) -> usize {
        self.topic.geom.max_msg
    }

    /// The number of slots in the ring.
    pub fn slots(&self) -> usize {
        self.topic.geom.slots as usize
    }

    /// The topic's policy.
    pub fn policy(&self) -> Policy {
        self.topic.policy
    }

    /// The bound address (for `tcp:HOST:0`, with the port chosen).
    pub fn local_addr(&self) -> String {
        match &self.net {
            Some(net) => net.addr.clone(),
            None => self.topic.addr.clone(),
        }
    }

    /// Closes the topic gracefully: every subscriber receives what was published, then
    /// [`ErrorKind::EndOfStream`]; the address is free again. Dropping the publisher
    /// closes it too. Remote subscribers are waited for until their connections took
    /// everything; one that takes nothing for the stall timeout is reset instead.
    pub fn close(mut self) -> Result<()> {
        self.shutdown();
        Ok(())
    }

    fn shutdown(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        // After the last message; every subscriber sees it before its socket closes.
        self.ring.close();
        // Remote subscribers get the rest and their FIN (bounded by the stall timeout).
        if let Some(mut net) = self.net.take() {
            net.finish();
        }
        drop(self.stop.take()); // stops the control thread, which removes the socket file
        if let Some(control) = self.control.take() {
            let _ = control.join();
        }
        let topic = &*self.topic;
        let mut table = topic.lock();
        table.closed = true;
        for slot in 0..table.subs.len() {
            if let Some(sub) = &table.subs[slot] {
                doorbell(sub.sock.as_fd());
            }
            topic.remove(&mut table, slot, Leave::Gone);
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl AsFd for Publisher {
    /// Readable when a `publish` that would block may succeed now (see
    /// [`set_nonblocking`](Publisher::set_nonblocking)).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.topic.pub_epoll.fd()
    }
}

impl AsRawFd for Publisher {
    fn as_raw_fd(&self) -> RawFd {
        self.topic.pub_epoll.fd().as_raw_fd()
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("addr", &self.topic.addr)
            .field("policy", &self.topic.policy)
            .field("published", &self.next)
            .finish()
    }
}

/// A slot lent by [`Publisher::loan`], written in place; [`publish`](Loan::publish)
/// publishes it, dropping it publishes nothing.
///
/// Neither `Send` nor `Sync`: a slot of shared memory lent to the thread that called
/// [`Publisher::loan`].
pub struct Loan<'a> {
    publisher: &'a mut Publisher,
    ptr: NonNull<u8>,
    len: usize,
    done: bool,
}

impl Loan<'_> {
    /// Publishes the message (all `len` bytes of the loan).
    #[inline]
    pub fn publish(mut self) -> Result<()> {
        self.done = true;
        self.publisher.commit(self.len);
        Ok(())
    }

    /// Publishes only the first `len` bytes (`len` at most the loan's length).
    pub fn publish_len(mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("publish_len({len}) on a loan of {} bytes", self.len),
            ));
        }
        self.len = len;
        self.publish()
    }
}

impl std::ops::Deref for Loan<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: `reserve` gave us the slot's payload area (at least `len` bytes, checked
        // against max_msg); subscribers only read it, and only after `commit` (the kernel
        // keeps them from writing it with F_SEAL_FUTURE_WRITE; a topic without the seal
        // exists only if the publisher trusted its subscribers: `allow_writable_topic`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for Loan<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Loan<'_> {
    fn drop(&mut self) {
        // Not published: the slot stays stamped busy for `next`, which the next `publish`
        // or `loan` reuses without waiting again (`loaned` stays set). Its previous
        // message is gone either way.
        debug_assert!(self.done || self.publisher.loaned);
    }
}

const _: () = assert!(MAX_SUBSCRIBERS <= 256); // slots fit the low byte of a token
