//! The fan-out thread of a topic bound at `tcp:`, `tls:` or `auto:`: it serves remote
//! subscribers from the same shared-memory ring local ones read, so the publishing path
//! does not change (one write per message, whoever reads it).
//!
//! Each remote subscriber is a framed connection ([`super::wire`] records) and an
//! in-process [`ShmSubscriber`] that joined the ring through the control thread like any
//! local subscriber (over a socket pair, not the rendezvous socket): it has a cursor page and obeys `block`/`overwrite` and the
//! stall timeout the same way. The thread waits (epoll) on the listener, every
//! connection and every ring reader's doorbell socket, and moves messages from a reader
//! to its connection:
//!
//! - **Batches**: what the reader has ready goes out as one record ([`wire::BatchBuf`]:
//!   up to [`BATCH`] messages and [`BATCH_BYTES`]; a lone message as a plain `Data`
//!   record), with one `send`. Nothing waits to fill a batch, so a paced stream still
//!   goes out message by message; a fast one costs a write per batch, not per message.
//! - **Back-pressure** (`block`): a message is copied from its slot into the batch and
//!   the reader's cursor moves past it only then; a batch is built only while the
//!   connection takes it whole, and a connection whose socket is full is not read for
//!   until it drains. So a slow remote holds the
//!   publisher up through TCP flow control, and one that stalls is detached after the
//!   stall timeout like a local one; it then gets the `Detached` record after what was
//!   already sent — or, if it does not drain within another stall timeout, a reset.
//! - **Losses** (`overwrite`): a reader that was overtaken ends its batch there and
//!   forwards `Missed(n)` with the exact count, then continues.
//! - **Fairness**: one batch per remote per turn (plus a `Missed` record and what
//!   follows it).
//! - **End**: when the publisher closes, each remote gets what was published, then the
//!   connection's FIN; [`Publisher::close`](crate::Publisher::close) waits for that,
//!   aborting a remote that takes nothing for the stall timeout.
//! - **Limits**: one copy from the ring into the batch; at most [`MAX_HANDSHAKES`] clients
//!   between connect and request; at most `max_remote_subscribers` ring readers (the
//!   control thread refuses more, so the other slots stay for local subscribers); the thread wakes every [`TICK`] while it serves
//!   anyone, to look at readers parked on a doorbell and at remotes whose socket is full.
//! - **`auto:`**: a subscriber on this kernel is told where the rendezvous socket is
//!   (`Local`), with a single-use token and its proof (128 bits each, from `getrandom`),
//!   and attaches over shared memory instead, or asks again to stay here. The token is
//!   valid only while this connection waits in its handshake: it is revoked when the
//!   subscriber asks again, leaves or times out, and the control thread takes it when
//!   it is presented on the socket, which admits nobody without one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::options::{Policy, PubSubOptions};
use super::remote::framed_max;
use super::shm_subscriber::ShmSubscriber;
use super::topic::Topic;
use super::wire::{self, BatchBuf, Record, RefuseCode, BATCH_BYTES, FLAG_LOCAL_OK};
use crate::addr::Address;
use crate::error::{Error, ErrorKind, Result};
use crate::options::Role;
use crate::sys::{self, socket, Epoll, Interest};
use crate::transport::net::{self, NetConn, NetListener, UpgradeSocket};
use crate::transport::shm::handshake::Token;

/// Most messages in one batch, which is what one remote gets per turn (so that a fast
/// one cannot starve the others).
pub(crate) const BATCH: usize = 256;
/// How often the thread looks at every remote without an event: ring readers parked on
/// a doorbell (see `RECHECK` in the shared-memory subscriber), and remotes whose socket
/// is full (were they detached? are they past their deadline?).
const TICK: Duration = Duration::from_millis(100);

/// Most remotes in their handshake at once; beyond that the oldest is dropped, so that
/// clients which never send their request cannot pile up.
const MAX_HANDSHAKES: usize = 128;

const LISTEN_TOKEN: u64 = u64::MAX;
const STOP_TOKEN: u64 = u64::MAX - 1;

/// The network side of a publisher: the address, the fan-out thread and its stop signal.
pub(crate) struct NetSide {
    /// The bound address (`tcp:HOST:PORT`, `tls:…`, `auto:…`; the real port).
    pub addr: String,
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl NetSide {
    /// Asks the thread to deliver what was published to every remote, close their
    /// connections and end; waits for it (bounded by the stall timeout per remote that
    /// makes no progress).
    pub(crate) fn finish(&mut self) {
        let _ = socket::send(self.stop.as_fd(), &[1]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the fan-out needs to know to start: where the network listener is and where the
/// ring's rendezvous socket is.
pub(crate) struct NetPlan {
    pub listener: NetListener,
    /// The public address.
    pub addr: String,
    /// The topic's rendezvous socket (`auto:` subscribers on this kernel, with a token).
    pub shm: Address,
    /// The same socket as offered to `auto:` subscribers on this kernel; `None` for
    /// `tcp:` and `tls:` topics, which bind no rendezvous socket (`shm` then only names
    /// the topic).
    pub local: Option<UpgradeSocket>,
}

/// Binds the network listener of a topic at `parsed` and picks the name of its
/// rendezvous socket (`topic-PORT-RANDOM.sock` in the rendezvous directory).
pub(crate) fn plan(parsed: &Address, opts: &PubSubOptions) -> Result<NetPlan> {
    let outer = net::outer(parsed, &opts.base).expect("called for network addresses only");
    let is_auto = outer.is_auto;
    let mut base = opts
        .base
        .clone()
        .max_msg_size(framed_max(opts.configured_max_msg_size()));
    base.role = Role::Topic;
    let listener = outer.bind(&base)?;
    let bound = listener.local_addr();
    let host_port = bound.split_once(':').map_or(bound.as_str(), |(_, hp)| hp);
    let addr = if is_auto {
        format!("auto:{host_port}")
    } else {
        bound.clone()
    };
    let port = host_port.rsplit(':').next().unwrap_or("0");
    let socket = UpgradeSocket::new("topic", port)?;
    Ok(NetPlan {
        listener,
        addr,
        shm: socket.address(),
        local: is_auto.then_some(socket),
    })
}

/// Starts the fan-out thread for `topic`, whose control thread already runs (and, for
/// `auto:`, serves the rendezvous socket of `plan`).
pub(crate) fn spawn(plan: NetPlan, topic: Arc<Topic>) -> Result<NetSide> {
    let ctx = |e| Error::io("set up the fan-out thread", e);
    let (stop_tx, stop) = socket::seqpacket_pair().map_err(ctx)?;
    let epoll = Epoll::new().map_err(ctx)?;
    epoll
        .add(
            plan.listener.fd().as_raw_fd(),
            Interest::READABLE,
            sys::Token(LISTEN_TOKEN),
        )
        .map_err(ctx)?;
    epoll
        .add(stop.as_raw_fd(), Interest::READABLE, sys::Token(STOP_TOKEN))
        .map_err(ctx)?;
    let shm_text = format!("{}", plan.shm);
    let mut fanout = Fanout {
        listener: Some(plan.listener),
        topic,
        shm_text,
        local: plan.local,
        boot_id: net::boot_id(),
        epoll,
        stop,
        remotes: HashMap::new(),
        next_id: 0,
        closing: false,
        again: Vec::new(),
        batch: BatchBuf::new(),
    };
    let thread = std::thread::Builder::new()
        .name("shmlink-fanout".into())
        .spawn(move || fanout.run())
        .map_err(|e| Error::io("spawn the fan-out thread", e))?;
    Ok(NetSide {
        addr: plan.addr,
        stop: stop_tx,
        thread: Some(thread),
    })
}

/// Where a remote subscriber is.
enum State {
    /// Connected; its `Subscribe` has not come yet (or it was offered `Local`).
    Handshake,
    /// Forwarding from its ring reader.
    Streaming(Box<ShmSubscriber>),
    /// Its reader is done (end of stream, or detached): what is queued goes out, then
    /// the `Detached` record if `detached` and not yet sent, then the FIN.
    Ending { detached: bool },
}

/// One remote subscriber.
struct Remote {
    conn: NetConn,
    peer: Option<SocketAddr>,
    state: State,
    /// Since when it was in the handshake, or in `Ending`.
    since: Instant,
    /// When its connection last took a message or drained its queue.
    progress: Instant,
    /// Whether the epoll set watches its ring reader's socket.
    ring_watched: bool,
    /// Its slot in the topic while it has a reader.
    slot: Option<usize>,
    /// Messages it lost that its `Missed` record has yet to tell (`overwrite`).
    missed_owed: u64,
    /// The upgrade token it was offered with `Local`, until it is used or revoked.
    offer: Option<Token>,
}

/// What a turn decided for a remote.
enum Turn {
    /// Keep it; `more` if it stopped at the batch limit with messages left.
    Keep { more: bool },
    /// Close its connection gracefully (everything it is owed was accepted).
    Close,
    /// Drop its connection without a FIN: the subscriber sees a reset.
    Abort,
}

struct Fanout {
    listener: Option<NetListener>,
    topic: Arc<Topic>,
    /// The topic's address, for errors.
    shm_text: String,
    local: Option<UpgradeSocket>,
    boot_id: Vec<u8>,
    epoll: Epoll,
    stop: OwnedFd,
    remotes: HashMap<u64, Remote>,
    next_id: u64,
    closing: bool,
    /// Remotes that stopped at the batch limit: their next turn comes without waiting.
    again: Vec<u64>,
    /// The batch being built.
    batch: BatchBuf,
}

fn conn_token(id: u64) -> u64 {
    id << 1
}

fn ring_token(id: u64) -> u64 {
    id << 1 | 1
}

/// The socket address in a connection's address text (`tcp:1.2.3.4:5`).
fn socket_addr(text: &str) -> Option<SocketAddr> {
    text.split_once(':')?.1.parse().ok()
}

/// Moves the messages `sub` has ready into `batch` (empty on entry), stopping at
/// [`BATCH`] messages or before a message could take the record beyond
/// [`BATCH_BYTES`] or `max_record` (`Ok`), or at the first message not ready or not
/// readable: the ring is empty (`WouldBlock`), messages were lost (`Lagged`, with the
/// count), the stream ended, the reader was detached, or broke (a message torn while it
/// was copied). A message is consumed from the ring only once it is in the batch:
/// under `block` the publisher may then reuse its slot, and the caller sends the batch
/// unless the reader broke.
fn gather(sub: &mut ShmSubscriber, batch: &mut BatchBuf, max_record: usize) -> Result<()> {
    let limit = BATCH_BYTES.min(max_record);
    let max_msg = sub.max_msg_size();
    let block = sub.policy() == Policy::Block;
    while batch.count() < BATCH && (batch.count() == 0 || batch.len_with(max_msg) <= limit) {
        if block {
            sub.forward(|msg| {
                batch.push(msg);
                Ok(())
            })?;
        } else {
            batch.push_with(max_msg, |buf| sub.recv(buf))?;
        }
    }
    Ok(())
}

/// Sends a control record; the connection must be writable (see [`writable`]).
fn send_record(conn: &mut NetConn, rec: &Record<'_>) -> Result<()> {
    conn.send(&rec.encode(), false)
}

/// Whether the connection takes another message now (its queue drained).
fn writable(r: &mut Remote) -> Result<bool> {
    let ok = r.conn.writable()?;
    if ok {
        r.progress = Instant::now();
    }
    Ok(ok)
}

impl Fanout {
    fn run(&mut self) {
        let mut events = Vec::new();
        let mut next_tick = Instant::now() + TICK;
        loop {
            if self.closing && self.remotes.is_empty() {
                break;
            }
            let now = Instant::now();
            let deadline = if self.again.is_empty() {
                Some(next_tick.max(now))
            } else {
                Some(now)
            };
            if self.epoll.wait(deadline, &mut events).is_err() {
                // Nothing sensible left to do: the remotes see their connections close.
                break;
            }
            let mut turn: Vec<u64> = std::mem::take(&mut self.again);
            for token in events.iter().map(|e| e.token().0) {
                match token {
                    LISTEN_TOKEN => self.accept(),
                    STOP_TOKEN => self.start_closing(),
                    t => turn.push(t >> 1),
                }
            }
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + TICK;
                turn.extend(self.remotes.keys().copied());
            }
            turn.sort_unstable();
            turn.dedup();
            for id in turn {
                self.turn(id);
            }
        }
        // Whatever is left (an epoll failure) is dropped: a reset for those remotes.
        for (_, r) in self.remotes.drain() {
            if let Some(slot) = r.slot {
                self.topic.remotes().remove(&slot);
            }
        }
    }

    /// The publisher closes: no more subscribers; those in their handshake are refused.
    fn start_closing(&mut self) {
        let mut buf = [0u8; 16];
        let _ = socket::recv(self.stop.as_fd(), &mut buf);
        if self.closing {
            return;
        }
        self.closing = true;
        let _ = self.epoll.delete(self.stop.as_raw_fd());
        if let Some(l) = self.listener.take() {
            let _ = self.epoll.delete(l.fd().as_raw_fd());
        }
        // Every reader finds the end of the ring now, without waiting for the tick.
        self.again.extend(self.remotes.keys().copied());
    }

    /// Takes the connections the listener has completed (bounded per call).
    fn accept(&mut self) {
        for _ in 0..16 {
            let Some(listener) = self.listener.as_mut() else {
                return;
            };
            let conn = match listener.accept() {
                Ok(conn) => conn,
                Err(_) => return, // WouldBlock, or one client's failure: nobody to serve
            };
            self.limit_handshakes();
            let id = self.next_id;
            self.next_id += 1;
            if self
                .epoll
                .add(
                    conn.fd().as_raw_fd(),
                    Interest::READABLE,
                    sys::Token(conn_token(id)),
                )
                .is_err()
            {
                continue;
            }
            let now = Instant::now();
            let peer = socket_addr(&conn.peer_addr());
            self.remotes.insert(
                id,
                Remote {
                    conn,
                    peer,
                    state: State::Handshake,
                    since: now,
                    progress: now,
                    ring_watched: false,
                    slot: None,
                    missed_owed: 0,
                    offer: None,
                },
            );
            self.again.push(id);
        }
    }

    /// Drops the oldest remote in its handshake if [`MAX_HANDSHAKES`] are.
    fn limit_handshakes(&mut self) {
        let waiting = self
            .remotes
            .iter()
            .filter(|(_, r)| matches!(r.state, State::Handshake));
        if waiting.clone().count() < MAX_HANDSHAKES {
            return;
        }
        if let Some(id) = waiting.min_by_key(|(_, r)| r.since).map(|(&id, _)| id) {
            if let Some(mut r) = self.remotes.remove(&id) {
                self.forget(&mut r);
            }
        }
    }

    /// One turn of remote `id`.
    fn turn(&mut self, id: u64) {
        let Some(mut r) = self.remotes.remove(&id) else {
            return;
        };
        let res = match r.state {
            State::Handshake => self.handshake(id, &mut r),
            State::Streaming(_) => self.stream(id, &mut r),
            State::Ending { .. } => self.ending(&mut r),
        };
        match res {
            Ok(Turn::Keep { more }) => {
                if more {
                    self.again.push(id);
                }
                self.remotes.insert(id, r);
            }
            Ok(Turn::Close) => {
                self.forget(&mut r);
                let _ = r.conn.close(false);
            }
            Ok(Turn::Abort) | Err(_) => self.forget(&mut r),
        }
    }

    /// Voids the upgrade token `r` was offered, if any (taken already or not).
    fn revoke(&self, r: &mut Remote) {
        if let Some(token) = r.offer.take() {
            self.topic.take_token(&token);
        }
    }

    /// Unregisters a remote that leaves (its reader, if any, drops with it).
    fn forget(&mut self, r: &mut Remote) {
        self.revoke(r);
        let _ = self.epoll.delete(r.conn.fd().as_raw_fd());
        if let State::Streaming(sub) = &r.state {
            if r.ring_watched {
                let _ = self.epoll.delete(sub.as_raw_fd());
            }
        }
        if let Some(slot) = r.slot.take() {
            self.topic.remotes().remove(&slot);
        }
        r.state = State::Ending { detached: false };
    }

    /// Watches the ring reader's socket or not.
    fn watch_ring(&self, id: u64, r: &mut Remote, on: bool) -> Result<()> {
        if r.ring_watched == on {
            return Ok(());
        }
        let State::Streaming(sub) = &r.state else {
            return Ok(());
        };
        let fd = sub.as_raw_fd();
        let res = if on {
            self.epoll
                .add(fd, Interest::READABLE, sys::Token(ring_token(id)))
        } else {
            self.epoll.delete(fd)
        };
        res.map_err(|e| Error::io("watch a ring reader", e))?;
        r.ring_watched = on;
        Ok(())
    }

    /// Refuses a subscriber: the record, then the FIN.
    fn refuse(r: &mut Remote, code: RefuseCode, reason: &str) -> Result<Turn> {
        send_record(&mut r.conn, &Record::Refuse { code, reason })?;
        Ok(Turn::Close)
    }

    /// Waits for the `Subscribe` record and admits the subscriber.
    fn handshake(&mut self, id: u64, r: &mut Remote) -> Result<Turn> {
        let opts = &self.topic.opts;
        if r.since.elapsed() > opts.base.handshake_timeout {
            return Ok(Turn::Abort);
        }
        match r.conn.recv_next(false) {
            Ok(_) => {}
            // A closing topic does not wait for requests.
            Err(e) if e.kind() == ErrorKind::WouldBlock && !self.closing => {
                return Ok(Turn::Keep { more: false })
            }
            Err(_) => return Ok(Turn::Abort),
        }
        let (version, flags, history, max_msg, same_kernel) =
            match Record::parse(r.conn.current(), 0) {
                Ok(Record::Subscribe {
                    version,
                    flags,
                    history,
                    max_msg,
                    boot_id,
                }) => (
                    version,
                    flags,
                    history,
                    max_msg,
                    net::same_kernel(&self.boot_id, boot_id).is_ok(),
                ),
                // Anything else from a subscriber breaks the protocol.
                _ => return Ok(Turn::Abort),
            };
        r.conn.release();
        // Asking again means the subscriber stays here: its token, if any, is void.
        self.revoke(r);
        if version != wire::VERSION {
            let reason = format!(
                "the publisher speaks topic record version {}, the subscriber {version}",
                wire::VERSION
            );
            return Self::refuse(r, RefuseCode::Version, &reason);
        }
        if self.closing {
            return Self::refuse(r, RefuseCode::Closing, "the topic is closing");
        }
        if let (true, true, Some(socket)) = (flags & FLAG_LOCAL_OK != 0, same_kernel, &self.local) {
            let offer = socket.offer()?;
            // Recorded before it is sent: the subscriber may present it at once.
            self.topic.offer_token(offer.token, offer.proof);
            r.offer = Some(offer.token);
            send_record(
                &mut r.conn,
                &Record::Local {
                    token: offer.token,
                    proof: offer.proof,
                    name: &offer.name,
                    path: &offer.path,
                },
            )?;
            r.since = Instant::now();
            return Ok(Turn::Keep { more: false });
        }
        let geom = self.topic.geom;
        if (max_msg != 0 && (geom.max_msg as u64) > max_msg)
            || r.conn.max_send_size() < geom.max_msg + 1
        {
            let reason = format!(
                "the topic carries messages of up to {} bytes, the subscriber accepts at most {}",
                geom.max_msg,
                if max_msg == 0 {
                    r.conn.max_send_size().saturating_sub(1) as u64
                } else {
                    max_msg
                }
            );
            return Self::refuse(r, RefuseCode::Unsuitable, &reason);
        }
        let mut ring_opts = PubSubOptions::default().options(opts.base.clone());
        if history != u64::MAX {
            ring_opts = ring_opts.history(history);
        }
        let mut sub = match self.join_ring(&ring_opts) {
            Ok(sub) => sub,
            Err(e) => {
                let code = if e.kind() == ErrorKind::ConnectionRefused {
                    RefuseCode::Full
                } else {
                    RefuseCode::Unsuitable
                };
                return Self::refuse(r, code, &e.to_string());
            }
        };
        sub.set_nonblocking(true);
        let policy = match self.topic.policy {
            Policy::Block => wire::POLICY_BLOCK,
            Policy::Overwrite => wire::POLICY_OVERWRITE,
        };
        send_record(
            &mut r.conn,
            &Record::Welcome {
                policy,
                max_msg: geom.max_msg as u64,
                start: sub.position(),
            },
        )?;
        let slot = sub.slot();
        if let Some(peer) = r.peer {
            self.topic.remotes().insert(slot, peer);
        }
        r.slot = Some(slot);
        r.state = State::Streaming(Box::new(sub));
        r.progress = Instant::now();
        self.stream(id, r)
    }

    /// Joins the ring as a new reader, over a socket pair handed to the control thread.
    fn join_ring(&self, opts: &PubSubOptions) -> Result<ShmSubscriber> {
        let ctx = |e| Error::io("join the ring", e);
        let (ours, theirs) = socket::seqpacket_pair().map_err(ctx)?;
        socket::send_with_fds(self.topic.inject.0.as_fd(), &[0], &[theirs.as_raw_fd()])
            .map_err(ctx)?;
        drop(theirs);
        ShmSubscriber::connect_on(ours, &self.shm_text, opts)
    }

    /// Forwards what the ring reader has, one batch per turn: up to [`BATCH`] messages
    /// and [`BATCH_BYTES`], as one record written with one `send`.
    fn stream(&mut self, id: u64, r: &mut Remote) -> Result<Turn> {
        // The subscriber sends nothing after its request: input is its end or a breach.
        match r.conn.recv_next(false) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            _ => return Ok(Turn::Abort),
        }
        // A batch cut short by a loss leads to the `Missed` record, then to another batch.
        for _ in 0..3 {
            if !writable(r)? {
                return self.stream_full(id, r);
            }
            if r.missed_owed > 0 {
                send_record(&mut r.conn, &Record::Missed(r.missed_owed))?;
                r.missed_owed = 0;
                continue;
            }
            let State::Streaming(sub) = &mut r.state else {
                unreachable!()
            };
            let stop = gather(sub, &mut self.batch, r.conn.max_send_size());
            let broken = matches!(&stop, Err(e) if !matches!(e.kind(),
                ErrorKind::Lagged | ErrorKind::WouldBlock | ErrorKind::EndOfStream | ErrorKind::Detached));
            if broken {
                self.batch.clear();
                return Ok(Turn::Abort);
            }
            if self.batch.count() > 0 {
                let sent = r.conn.send(self.batch.record(), false);
                self.batch.clear();
                sent?;
            }
            let Err(e) = stop else {
                return Ok(Turn::Keep { more: true });
            };
            match e.kind() {
                ErrorKind::Lagged => r.missed_owed = e.missed().unwrap_or(0),
                ErrorKind::WouldBlock => {
                    self.watch_ring(id, r, true)?;
                    return Ok(Turn::Keep { more: false });
                }
                ErrorKind::EndOfStream => return self.end_stream(r, false),
                _ => return self.end_stream(r, true),
            }
        }
        Ok(Turn::Keep { more: true })
    }

    /// The connection is full: wait for it, not the ring; see whether the publisher gave
    /// up on this reader meanwhile.
    fn stream_full(&mut self, id: u64, r: &mut Remote) -> Result<Turn> {
        self.watch_ring(id, r, false)?;
        let State::Streaming(sub) = &r.state else {
            unreachable!()
        };
        if sub.is_detached() {
            return self.end_stream(r, true);
        }
        if self.closing && r.progress.elapsed() > self.topic.opts.stall_timeout {
            return Ok(Turn::Abort);
        }
        Ok(Turn::Keep { more: false })
    }

    /// The reader is done: drop it and deliver the rest.
    fn end_stream(&mut self, r: &mut Remote, detached: bool) -> Result<Turn> {
        if let State::Streaming(sub) = &r.state {
            if r.ring_watched {
                let _ = self.epoll.delete(sub.as_raw_fd());
                r.ring_watched = false;
            }
        }
        if let Some(slot) = r.slot.take() {
            self.topic.remotes().remove(&slot);
        }
        r.state = State::Ending { detached };
        r.since = Instant::now();
        self.ending(r)
    }

    /// Delivers the `Detached` record if owed, then closes once everything was taken;
    /// aborts a remote that takes nothing for the stall timeout.
    fn ending(&mut self, r: &mut Remote) -> Result<Turn> {
        let State::Ending { detached } = r.state else {
            unreachable!()
        };
        match r.conn.recv_next(false) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            _ => return Ok(Turn::Abort), // gone, or talking out of turn
        }
        if !writable(r)? {
            if r.progress.elapsed() > self.topic.opts.stall_timeout
                && r.since.elapsed() > self.topic.opts.stall_timeout
            {
                return Ok(Turn::Abort);
            }
            return Ok(Turn::Keep { more: false });
        }
        if detached {
            send_record(&mut r.conn, &Record::Detached)?;
            r.state = State::Ending { detached: false };
            return self.ending(r);
        }
        Ok(Turn::Close)
    }
}
