//! The publisher's control thread: admits subscribers on the rendezvous socket (versioned
//! handshake, credentials checked with the `shm:` listener's rules) and removes them the
//! moment their socket hangs up — so a subscriber that dies frees its slot at once, and
//! never holds the publisher up, even while the publisher is not publishing.
//!
//! # Joining (`block` policy)
//!
//! Under the table lock the thread picks the newcomer's start `s` from `written` and the
//! history it may replay, lowers `cached_min` to `s`, issues a SeqCst fence and reads
//! `written` again (`w1`). The publisher may be writing message `w1` with an older
//! minimum — which overwrites `w1 - slots` — so the start moves up to at least
//! `w1 + 1 - slots`. Every later write the publisher checks against a minimum it loads
//! after the SeqCst fence following its previous commit; since our load of `written`
//! did not see that commit, our fence came first, and the publisher sees the lowered
//! minimum. The start is final before the subscriber gets its page.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::handshake::{
    Packet, Subscribe, Subscribed, FEATURE_BACKGROUND, MAX_PACKET, POLICY_BLOCK, POLICY_OVERWRITE,
};
use super::options::{Policy, PubSubOptions};
use super::ring::LastRing;
use super::segment::{header_len, BellSegment, CursorSegment, TopicSegment};
use super::topic::{sub_token, token_sub, Leave, Sub, Table, Topic, CHANGED_TOKEN, TIMER_TOKEN};
use crate::addr::Address;
use crate::error::{Error, Result};
use crate::rendezvous::{bind_rendezvous, remove_socket_file, SocketFile};
use crate::sync::{fence, AtomicU64, AtomicUsize, Ordering};
use crate::sys::{self, socket, Epoll, Event, Interest, TimerFd};
use crate::transport::shm::handshake::{RefuseCode, Token};
use crate::trust;

const LISTEN_TOKEN: u64 = u64::MAX;
const STOP_TOKEN: u64 = u64::MAX - 1;
const INJECT_TOKEN: u64 = u64::MAX - 2;
const PENDING_BIT: u64 = 1 << 63;
/// Most clients that may sit between connect and their request at once; the oldest is
/// dropped beyond this, so a flood of silent clients cannot exhaust descriptors.
const MAX_PENDING: usize = 128;

/// A client between connect and its request.
struct Pending {
    sock: OwnedFd,
    deadline: Instant,
    /// Injected by the fan-out thread: a ring reader for a network subscriber.
    remote: bool,
    /// The client's uid (`SO_PEERCRED` at accept), and whether the topic admits it.
    uid: u32,
    admitted: bool,
}

/// Whom the topic's rendezvous socket serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LocalAccess {
    /// A `shm:` topic: every subscriber the credential check admits.
    Open,
    /// An `auto:` topic: only a subscriber that presents a token the fan-out thread
    /// handed out over its network subscription (and passes the credential check), so
    /// that the shared-memory path grants nothing the network path (TLS client
    /// certificates included) would not.
    Tokens,
    /// A `tcp:` or `tls:` topic: no rendezvous socket at all (its only path is the
    /// network listener; the fan-out's ring readers join over a socket pair).
    None,
}

struct Control {
    topic: Arc<Topic>,
    /// The rendezvous socket, unless [`LocalAccess::None`].
    listen: Option<OwnedFd>,
    file: SocketFile,
    /// Read end of the stop signal (registered in the epoll set; kept open here).
    _stop: OwnedFd,
    pending: Vec<Pending>,
    events: Vec<Event>,
}

/// Creates the topic, binds its socket at `addr` (unless `access` is
/// [`LocalAccess::None`]; `addr` then only names the topic) and starts the control
/// thread. Returns the shared topic, the stop signal's write end and the thread.
pub(crate) fn start(
    addr: &Address,
    access: LocalAccess,
    opts: &PubSubOptions,
) -> Result<(Arc<Topic>, OwnedFd, JoinHandle<()>)> {
    let geom = opts.geometry();
    let policy = opts.policy;
    let wire_policy = match policy {
        Policy::Block => POLICY_BLOCK,
        Policy::Overwrite => POLICY_OVERWRITE,
    };
    let (seg, seg_fd) = TopicSegment::create(geom, wire_policy, opts.allow_writable_topic)?;
    let (bell, bell_fd) = BellSegment::create("shmlink-bell")?;
    let epoll = || Epoll::new().map_err(|e| Error::io("epoll", e));
    let (pub_epoll, ctl_epoll) = (epoll()?, epoll()?);
    let timer = TimerFd::new().map_err(|e| Error::io("timerfd", e))?;
    pub_epoll
        .add(
            timer.fd().as_raw_fd(),
            Interest::READABLE,
            sys::Token(TIMER_TOKEN),
        )
        .map_err(|e| Error::io("epoll", e))?;
    let changed = socket::seqpacket_pair().map_err(|e| Error::io("socketpair", e))?;
    pub_epoll
        .add(
            changed.1.as_raw_fd(),
            Interest::READABLE,
            sys::Token(CHANGED_TOKEN),
        )
        .map_err(|e| Error::io("epoll", e))?;
    let (listen, file) = match access {
        LocalAccess::None => (None, None),
        LocalAccess::Open | LocalAccess::Tokens => {
            let (listen, file) = bind_rendezvous(addr, &opts.base)?;
            (Some(listen), file)
        }
    };
    let (stop_tx, stop) = socket::seqpacket_pair().map_err(|e| Error::io("socketpair", e))?;
    let ctl_err = |e| Error::io("epoll", e);
    if let Some(listen) = &listen {
        ctl_epoll
            .add(
                listen.as_raw_fd(),
                Interest::READABLE,
                sys::Token(LISTEN_TOKEN),
            )
            .map_err(ctl_err)?;
    }
    ctl_epoll
        .add(stop.as_raw_fd(), Interest::READABLE, sys::Token(STOP_TOKEN))
        .map_err(ctl_err)?;
    let inject = socket::seqpacket_pair().map_err(|e| Error::io("socketpair", e))?;
    ctl_epoll
        .add(
            inject.1.as_raw_fd(),
            Interest::READABLE,
            sys::Token(INJECT_TOKEN),
        )
        .map_err(ctl_err)?;
    let topic = Arc::new(Topic {
        addr: addr.to_string(),
        opts: opts.clone(),
        geom,
        policy,
        seg,
        seg_fd,
        bell,
        bell_fd,
        cached_min: AtomicU64::new(u64::MAX),
        members: AtomicUsize::new(0),
        table: Mutex::new(Table {
            subs: (0..opts.max_subscribers).map(|_| None).collect(),
            next_slot: 0,
            next_gen: 1,
            count: 0,
            joined: 0,
            left: 0,
            detached: 0,
            closed: false,
        }),
        joins: Condvar::new(),
        pub_epoll,
        ctl_epoll,
        timer,
        changed,
        remotes: Mutex::new(std::collections::HashMap::new()),
        inject,
        tokens: (access == LocalAccess::Tokens).then(|| Mutex::new(HashMap::new())),
    });
    let mut control = Control {
        topic: topic.clone(),
        listen,
        file,
        _stop: stop,
        pending: Vec::new(),
        events: Vec::new(),
    };
    let thread = std::thread::Builder::new()
        .name("shmlink-publisher".into())
        .spawn(move || control.run())
        .map_err(|e| Error::io("spawn the publisher's control thread", e))?;
    Ok((topic, stop_tx, thread))
}

impl Control {
    fn run(&mut self) {
        loop {
            let deadline = self.pending.iter().map(|p| p.deadline).min();
            let mut events = std::mem::take(&mut self.events);
            if self.topic.ctl_epoll.wait(deadline, &mut events).is_err() {
                // EINTR is retried inside; anything else leaves nothing to do but wait
                // for the stop signal.
                events.clear();
            }
            for token in events.iter().map(|e| e.token().0) {
                match token {
                    STOP_TOKEN => {
                        remove_socket_file(&self.file);
                        return;
                    }
                    LISTEN_TOKEN => self.accept_backlog(),
                    INJECT_TOKEN => self.take_injected(),
                    t if t & PENDING_BIT != 0 => self.pending_ready((t & !PENDING_BIT) as i32),
                    t => {
                        // A subscriber's socket hung up (the only events asked for).
                        let (slot, gen) = token_sub(t);
                        let mut table = self.topic.lock();
                        if matches!(table.subs.get(slot), Some(Some(s)) if s.gen == gen) {
                            self.topic.remove(&mut table, slot, Leave::Gone);
                        }
                    }
                }
            }
            self.events = events;
            let now = Instant::now();
            let epoll = &self.topic.ctl_epoll;
            self.pending.retain(|p| {
                let keep = p.deadline > now;
                if !keep {
                    let _ = epoll.delete(p.sock.as_raw_fd());
                }
                keep
            });
        }
    }

    /// Accepts waiting clients, at most [`MAX_PENDING`] per call, so that a flood of
    /// connections cannot keep the thread from the requests of those already accepted.
    fn accept_backlog(&mut self) {
        for _ in 0..MAX_PENDING {
            let Some(Ok(Some(sock))) = self.listen.as_ref().map(|l| socket::accept(l.as_fd()))
            else {
                return;
            };
            self.add_pending(sock, false);
        }
    }

    /// Takes the sockets the fan-out thread passed in (one end of a socket pair each,
    /// whose other end runs the subscriber handshake in this process): they join like
    /// accepted clients, without the rendezvous socket file.
    fn take_injected(&mut self) {
        for _ in 0..16 {
            let mut buf = [0u8; 8];
            let mut fds = Vec::new();
            match socket::recv_with_fds(self.topic.inject.1.as_fd(), &mut buf, &mut fds) {
                Ok(n) if n > 0 => fds.into_iter().for_each(|fd| self.add_pending(fd, true)),
                _ => return,
            }
        }
    }

    /// A client between connect and its request; `remote` if the fan-out thread passed it.
    fn add_pending(&mut self, sock: OwnedFd, remote: bool) {
        let (uid, admitted) = match socket::peer_cred(sock.as_fd()) {
            Ok(c) => (
                c.uid,
                trust::check_client(&self.topic.opts.base, c.uid, c.gid).is_ok(),
            ),
            Err(_) => (u32::MAX, false),
        };
        if self.pending.len() >= MAX_PENDING {
            let victim = trust::eviction_victim(self.pending.iter().map(|p| (p.uid, p.admitted)));
            let old = self.pending.remove(victim);
            let _ = self.topic.ctl_epoll.delete(old.sock.as_raw_fd());
        }
        let fd = sock.as_raw_fd();
        if self
            .topic
            .ctl_epoll
            .add(fd, Interest::READABLE, sys::Token(PENDING_BIT | fd as u64))
            .is_ok()
        {
            self.pending.push(Pending {
                sock,
                deadline: Instant::now() + self.topic.opts.base.handshake_timeout,
                remote,
                uid,
                admitted,
            });
        }
    }

    /// A pending client's request arrived (or it left): answer it.
    fn pending_ready(&mut self, fd: i32) {
        let Some(i) = self.pending.iter().position(|p| p.sock.as_raw_fd() == fd) else {
            return;
        };
        let mut buf = [0u8; MAX_PACKET];
        let mut fds = Vec::new();
        let res = socket::recv_with_fds(self.pending[i].sock.as_fd(), &mut buf, &mut fds);
        if matches!(&res, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock) {
            return;
        }
        let p = self.pending.swap_remove(i);
        let _ = self.topic.ctl_epoll.delete(p.sock.as_raw_fd());
        let (sock, remote) = (p.sock, p.remote);
        // The topic, for the refusal's event (`tracing` feature).
        let _topic = self.topic.clone();
        let refuse = |sock: &OwnedFd, code: RefuseCode, reason: String| {
            crate::trace::event!(
                warn,
                topic = %_topic.addr,
                ?code,
                reason = %reason,
                "subscriber refused"
            );
            let _ = socket::send(sock.as_fd(), &Packet::Refuse(code, reason).encode());
        };
        let n = match res {
            Ok(0) => return, // the client left
            Ok(n) => n,
            // Truncated (oversized) packet or too many descriptors: say why.
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return refuse(
                    &sock,
                    RefuseCode::Protocol,
                    format!("request rejected: {e}"),
                )
            }
            Err(_) => return,
        };
        let decoded = Packet::decode(&buf[..n]);
        if matches!(decoded, Ok(Packet::ShmClient)) {
            // A point-to-point `shm:` client (whose hello may carry its segment): tell it
            // what it reached rather than what its hello carried.
            let why = format!(
                "{} is a publish/subscribe topic: connect with Subscriber::connect",
                self.topic.addr
            );
            return refuse(&sock, RefuseCode::Protocol, why);
        }
        if !fds.is_empty() {
            let why = "a subscribe request must not carry descriptors".to_string();
            return refuse(&sock, RefuseCode::Protocol, why);
        }
        if !remote && super::status::is_query(&buf[..n]) {
            return super::status::answer(&self.topic, &sock, p.admitted);
        }
        match decoded {
            // The fan-out's ring readers come over a socket pair, never the socket file.
            Ok(Packet::Subscribe(req)) if remote || self.topic.tokens.is_none() => {
                if let Err((sock, code, why)) = self.join(sock, req, remote, None) {
                    refuse(&sock, code, why);
                }
            }
            Ok(Packet::Subscribe(_)) => {
                let why = format!(
                    "{} is the shared-memory side of an auto: topic: it admits only \
                     subscribers that present the token the publisher handed them over the \
                     network (subscribe at the topic's auto: address)",
                    self.topic.addr
                );
                refuse(&sock, RefuseCode::Permission, why);
            }
            Ok(Packet::Upgrade(req, token)) if !remote && self.topic.tokens.is_some() => {
                // Used once, whatever comes of it.
                let Some(proof) = self.topic.take_token(&token) else {
                    let why = "unknown or already used upgrade token".to_string();
                    return refuse(&sock, RefuseCode::Permission, why);
                };
                if let Err((sock, code, why)) = self.join(sock, req, remote, Some(proof)) {
                    refuse(&sock, code, why);
                }
            }
            Ok(Packet::Upgrade(..)) => {
                let why = format!(
                    "{} is not the shared-memory side of an auto: topic: expected a subscribe request",
                    self.topic.addr
                );
                refuse(&sock, RefuseCode::Protocol, why);
            }
            Ok(other) => {
                let why = format!("expected a subscribe request, got {other:?}");
                refuse(&sock, RefuseCode::Protocol, why);
            }
            Err(e) if e.kind() == crate::ErrorKind::VersionMismatch => {
                refuse(&sock, RefuseCode::Version, e.message().to_string());
            }
            Err(e) => refuse(&sock, RefuseCode::Protocol, e.message().to_string()),
        }
    }

    /// Admits a subscriber: checks it, gives it a slot, a cursor page and its start.
    /// `remote`: a ring reader of the fan-out thread, bounded by `max_remote_subscribers`.
    /// `proof`: the proof of the upgrade token it presented (`auto:`), sent with the answer.
    fn join(
        &mut self,
        sock: OwnedFd,
        req: Subscribe,
        remote: bool,
        proof: Option<Token>,
    ) -> std::result::Result<(), (OwnedFd, RefuseCode, String)> {
        let topic = &*self.topic;
        let geom = topic.geom;
        let refuse = |sock, code, why: String| Err((sock, code, why));
        let cred = match socket::peer_cred(sock.as_fd()) {
            Ok(c) => c,
            Err(e) => {
                return refuse(
                    sock,
                    RefuseCode::Permission,
                    format!("no peer credentials: {e}"),
                )
            }
        };
        if let Err(why) = trust::check_client(&topic.opts.base, cred.uid, cred.gid) {
            return refuse(
                sock,
                RefuseCode::Permission,
                format!("{why} on {}", topic.addr),
            );
        }
        if req.max_msg != 0 && (geom.max_msg as u64) > req.max_msg {
            return refuse(
                sock,
                RefuseCode::Invalid,
                format!(
                    "{} carries messages of up to {} bytes, more than the subscriber's maximum of {}",
                    topic.addr, geom.max_msg, req.max_msg
                ),
            );
        }
        let (page, page_fd) = match CursorSegment::create("shmlink-cursor") {
            Ok(x) => x,
            Err(e) => return refuse(sock, RefuseCode::Resources, e.to_string()),
        };
        let mut table = topic.lock();
        if table.closed {
            return refuse(sock, RefuseCode::Resources, "the topic is closing".into());
        }
        let slots = table.subs.len();
        let free = (0..slots)
            .map(|i| (table.next_slot + i) % slots)
            .find(|&i| table.subs[i].is_none());
        let Some(slot) = free else {
            let n = table.subs.len();
            return refuse(
                sock,
                RefuseCode::Resources,
                format!("{} already has its maximum of {n} subscribers", topic.addr),
            );
        };
        // Network clients must not take every slot: the rest stays for local subscribers.
        let max_remote = topic.opts.configured_max_remote_subscribers();
        if remote && table.subs.iter().flatten().filter(|s| s.remote).count() >= max_remote {
            return refuse(
                sock,
                RefuseCode::Resources,
                format!(
                    "the topic already serves its maximum of {max_remote} remote subscribers \
                     (option max_remote_subscribers; its other {} slots are kept for local \
                     subscribers)",
                    slots.saturating_sub(max_remote)
                ),
            );
        }
        let ring = topic.ring();
        let n = geom.slots;
        let history = req.history.min(topic.opts.publisher_history());
        let w0 = ring.written();
        let mut start = w0.saturating_sub(history).max((w0 + 1).saturating_sub(n));
        if topic.policy == Policy::Block {
            // SYNC POINT (join): pairs with the SeqCst fence in `Ring::sleepers` after
            // each commit, before the publisher loads `cached_min` for its next write
            // (see the module docs). Under the lock, like the publisher's rescans.
            topic.cached_min.fetch_min(start, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            let w1 = ring.written();
            start = start.max((w1 + 1).saturating_sub(n));
        }
        page.get().init(start);
        topic.bell.get().init(slot);
        let gen = table.next_gen;
        let token = sub_token(slot, gen);
        let fd = sock.as_raw_fd();
        let registered = topic
            .pub_epoll
            .add(fd, Interest::READABLE, sys::Token(token))
            .and_then(|()| {
                topic
                    .ctl_epoll
                    .add(fd, Interest::READ_CLOSED, sys::Token(token))
            });
        let subscribed = Subscribed {
            slot: slot as u32,
            policy: topic.seg.policy(),
            slots: n,
            slot_size: geom.slot_size as u64,
            max_msg: geom.max_msg as u64,
            header_len: header_len() as u64,
            start,
        };
        let answer = match proof {
            None => Packet::Subscribed(subscribed),
            Some(proof) => Packet::Upgraded(subscribed, proof),
        };
        // SYNC POINT (members): counted before the answer goes out, so a subscriber
        // that has its answer is counted; Release pairs with the Acquire load in
        // `Publisher::subscriber_count`, which takes no lock.
        topic.members.store(table.count + 1, Ordering::Release);
        let sent = registered.is_ok()
            && socket::send_with_fds(
                sock.as_fd(),
                &answer.encode(),
                &[
                    topic.seg_fd.as_raw_fd(),
                    topic.bell_fd.as_raw_fd(),
                    page_fd.as_raw_fd(),
                ],
            )
            .is_ok();
        if !sent {
            topic.members.store(table.count, Ordering::Release);
            let _ = topic.pub_epoll.delete(fd);
            let _ = topic.ctl_epoll.delete(fd);
            ring.clear_bell(topic.bell.get(), slot);
            return Ok(()); // the client left; nobody to tell
        }
        table.next_gen += 1;
        table.next_slot = slot + 1;
        crate::trace::event!(
            info,
            topic = %topic.addr,
            slot,
            remote,
            pid = cred.pid,
            uid = cred.uid,
            "subscriber joined"
        );
        table.subs[slot] = Some(Sub {
            gen,
            page,
            sock,
            cred,
            remote,
            known: start,
            stall: None,
            last_ring: LastRing::NONE,
            background: req.features & FEATURE_BACKGROUND != 0,
        });
        table.count += 1;
        table.joined += 1;
        drop(table);
        topic.joins.notify_all();
        Ok(())
    }
}
