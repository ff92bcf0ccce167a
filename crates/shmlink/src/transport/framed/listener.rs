//! [`FramedListener`]: accepts clients of an [`Acceptor`] and runs the listener's half of
//! their handshakes ([`ServerHandshake`]) side by side, so that a slow or hostile client
//! holds up no one.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Instant;

use super::hello::{may_be_hello, parse_hello_as, send_hello, HELLO_LEN};
use super::{bad_data, FramedConn, Link, Wire};
use crate::error::{Error, ErrorKind, Result};
use crate::options::{Options, Role};
use crate::sys::stream;
use crate::sys::{Epoll, Event, Interest, TimerFd, Token};
use crate::transport::{Accepted, ConnOps, ListenerOps};

/// Most clients a listener keeps in the middle of their handshake; beyond that the oldest
/// is dropped, so a flood of idle clients cannot exhaust descriptors.
const MAX_PENDING: usize = 128;

/// Epoll token of a listener's listening socket; pending clients count up from 1.
const TOKEN_LISTEN: u64 = 0;
/// The deadline timer's token in the listener's epoll set.
const TOKEN_TIMER: u64 = 1;

/// How a transport's listening socket hands out clients.
pub(crate) trait Acceptor: Send + 'static {
    /// The wire accepted connections speak.
    type Wire: Wire;
    /// The listening socket.
    fn listen_fd(&self) -> BorrowedFd<'_>;
    /// Takes one waiting client without blocking: its link (whose own handshake, if any,
    /// has not started) and address text. `None` when nobody waits.
    #[allow(clippy::type_complexity)]
    fn accept(&mut self) -> io::Result<Option<(<Self::Wire as Wire>::Link, String)>>;
    /// The bound address, as text with the transport prefix.
    fn local_addr(&self) -> String;
}

/// The listener's half of one client's handshake — the link's own (TLS), then the
/// hello — driven without blocking: call [`advance`](Self::advance) whenever the socket
/// is ready as [`wants_write`](Self::wants_write) says, until it returns true or fails or
/// the [`deadline`](Self::deadline) passes, then [`finish`](Self::finish).
///
/// [`FramedListener`] keeps many of these side by side; a transport that accepts its
/// sockets itself (such as `auto:`, which looks at a client's first bytes before it
/// picks `tcp:` or `tls:`) can drive them the same way.
pub(crate) struct ServerHandshake<W: Wire> {
    link: W::Link,
    local: String,
    peer: String,
    deadline: Instant,
    hello: Vec<u8>,
    max_msg: usize,
    role: Role,
}

impl<W: Wire> ServerHandshake<W> {
    /// Starts the handshake of a client on `link`, with the limits in `opts`.
    pub(crate) fn new(link: W::Link, local: String, peer: String, opts: &Options) -> Self {
        ServerHandshake {
            link,
            local,
            peer,
            deadline: Instant::now() + opts.handshake_timeout,
            hello: Vec::with_capacity(HELLO_LEN),
            max_msg: opts.max_msg_size,
            role: opts.role,
        }
    }

    /// The socket to watch.
    pub(crate) fn sock(&self) -> BorrowedFd<'_> {
        self.link.sock()
    }

    /// Whether to watch the socket for output too (the link's handshake has records to
    /// write that did not fit the socket).
    pub(crate) fn wants_write(&self) -> bool {
        self.link.pending_output()
    }

    /// When the client is dropped if it has not completed its handshake.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Reads what the client sent and answers the link's handshake, without blocking.
    /// Returns true once its hello is complete. An error means the client is to be
    /// dropped: it failed the link's handshake, sent something that is not a hello (found
    /// out as soon as it arrives), or left.
    pub(crate) fn advance(&mut self) -> io::Result<bool> {
        if !self.link.handshake()? {
            return Ok(false);
        }
        while self.hello.len() < HELLO_LEN {
            match W::recv_hello(&mut self.link, &mut self.hello) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the client left during the handshake",
                    ))
                }
                Ok(_) if !may_be_hello(&self.hello) => {
                    return Err(bad_data("the client's first bytes are not a hello".into()))
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Checks the complete hello, answers it and returns the connection; `None` when the
    /// client is refused (one of another protocol version is sent our hello first, so
    /// that it can report the mismatch) or has left. Errors are this side's own failures.
    pub(crate) fn finish(mut self) -> Result<Option<FramedConn<W>>> {
        let hello = self.hello[..].try_into().expect("advance returned true");
        let peer_max = match parse_hello_as(hello, self.role) {
            Ok(max) => max,
            Err(e) => {
                crate::trace::event!(
                    warn,
                    listener = %self.local,
                    peer = %self.peer,
                    reason = %e,
                    "client refused"
                );
                // Another version or the other role: our hello tells the client why.
                if matches!(
                    e.kind(),
                    ErrorKind::VersionMismatch | ErrorKind::ProtocolViolation
                ) && may_be_hello(&self.hello)
                {
                    let _ = send_hello(&mut self.link, self.max_msg, self.role);
                }
                // What the client sent behind its hello is read first, as in `refuse`.
                stream::discard_input(self.link.sock());
                return Ok(None);
            }
        };
        if send_hello(&mut self.link, self.max_msg, self.role).is_err() {
            stream::discard_input(self.link.sock());
            return Ok(None);
        }
        FramedConn::new(self.link, self.max_msg, peer_max, self.local, self.peer)
            .map(Some)
            .map_err(|e| Error::io("set up an accepted connection", e))
    }

    /// Drops the client, first reading what it sent, so that closing the socket does not
    /// make TCP reset the connection (which can destroy a TLS alert still in flight that
    /// tells the client why).
    pub(crate) fn refuse(self) {
        stream::discard_input(self.link.sock());
    }
}

/// A client in the middle of its handshake, as the listener watches it.
struct Pending<W: Wire> {
    handshake: ServerHandshake<W>,
    /// Whether the epoll set watches its socket for output.
    out_watched: bool,
}

/// What the epoll set watches a pending client's socket for: input, and room for output
/// while the handshake has some waiting.
fn interest(wants_write: bool) -> Interest {
    match wants_write {
        true => Interest::READABLE | Interest::WRITABLE,
        false => Interest::READABLE,
    }
}

/// A listener over a framed socket transport: accepts sockets, runs their handshakes
/// without letting a slow or hostile client hold up others, and hands out connections.
pub(crate) struct FramedListener<A: Acceptor> {
    acceptor: A,
    /// Holds the listening socket, `timer` and every pending client ([`ListenerOps::fd`]).
    epoll: Epoll,
    /// Fires at the earliest handshake deadline, so that an event loop calls `accept`
    /// (which drops the late client) even when nothing else happens.
    timer: TimerFd,
    /// The deadline `timer` is set to, if any.
    armed: Option<Instant>,
    pending: HashMap<u64, Pending<A::Wire>>,
    next_token: u64,
    events: Vec<Event>,
    opts: Options,
}

impl<A: Acceptor> FramedListener<A> {
    /// Serves clients of `acceptor` with the limits in `opts`.
    pub(crate) fn new(acceptor: A, opts: &Options) -> Result<FramedListener<A>> {
        let ctx = |e| Error::io("create the listener's epoll set", e);
        let epoll = Epoll::new().map_err(ctx)?;
        epoll
            .add(
                acceptor.listen_fd().as_raw_fd(),
                Interest::READABLE,
                Token(TOKEN_LISTEN),
            )
            .map_err(ctx)?;
        let timer = TimerFd::new().map_err(ctx)?;
        epoll
            .add(
                timer.fd().as_raw_fd(),
                Interest::READABLE,
                Token(TOKEN_TIMER),
            )
            .map_err(ctx)?;
        Ok(FramedListener {
            acceptor,
            epoll,
            timer,
            armed: None,
            pending: HashMap::new(),
            next_token: TOKEN_TIMER + 1,
            events: Vec::new(),
            opts: opts.clone(),
        })
    }

    /// An OS error of this listener, naming its address.
    fn error(&self, what: &str, e: io::Error) -> Error {
        Error::io(format!("{what} on {}", self.acceptor.local_addr()), e)
    }

    /// Takes one new client and tries its handshake at once: most clients' hello is
    /// already there, and such a client never joins the epoll set (two `epoll_ctl`
    /// fewer); the others wait in the pending set.
    fn accept_new(&mut self) -> Result<Option<Box<dyn ConnOps>>> {
        let Some((link, peer)) = self
            .acceptor
            .accept()
            .map_err(|e| self.error("accept", e))?
        else {
            return Ok(None);
        };
        let mut handshake =
            ServerHandshake::new(link, self.acceptor.local_addr(), peer, &self.opts);
        match handshake.advance() {
            Ok(true) => return self.finish(handshake),
            Ok(false) => {}
            Err(e) => {
                self.refuse(handshake, e);
                return Ok(None);
            }
        }
        if self.pending.len() >= MAX_PENDING {
            let oldest = self
                .pending
                .iter()
                .min_by_key(|(_, p)| p.handshake.deadline())
                .map(|(&t, _)| t);
            if let Some(t) = oldest {
                self.pending.remove(&t);
            }
        }
        let token = self.next_token;
        self.next_token += 1;
        let out_watched = handshake.wants_write();
        self.epoll
            .add(
                handshake.sock().as_raw_fd(),
                interest(out_watched),
                Token(token),
            )
            .map_err(|e| self.error("watch a new client", e))?;
        self.pending.insert(
            token,
            Pending {
                handshake,
                out_watched,
            },
        );
        Ok(None)
    }

    /// Advances a pending client's handshake; returns its connection once it is
    /// complete. Bad clients are dropped (closing a socket also removes it from the epoll
    /// set), those that send garbage as soon as it arrives.
    fn advance(&mut self, token: u64) -> Result<Option<Box<dyn ConnOps>>> {
        let Some(p) = self.pending.get_mut(&token) else {
            return Ok(None);
        };
        match p.handshake.advance() {
            Ok(true) => {}
            Ok(false) => {
                let want = p.handshake.wants_write();
                if want != p.out_watched {
                    let fd = p.handshake.sock().as_raw_fd();
                    p.out_watched = want;
                    if let Err(e) = self.epoll.modify(fd, interest(want), Token(token)) {
                        return Err(self.error("watch a client", e));
                    }
                }
                return Ok(None);
            }
            Err(e) => {
                let p = self.pending.remove(&token).expect("looked up above");
                self.refuse(p.handshake, e);
                return Ok(None);
            }
        }
        let p = self.pending.remove(&token).expect("looked up above");
        // The socket moves to the connection's own epoll set.
        self.epoll
            .delete(p.handshake.sock().as_raw_fd())
            .map_err(|e| self.error("unwatch a client", e))?;
        self.finish(p.handshake)
    }

    /// A completed handshake's connection.
    fn finish(&self, handshake: ServerHandshake<A::Wire>) -> Result<Option<Box<dyn ConnOps>>> {
        match handshake.finish() {
            Ok(conn) => Ok(conn.map(|c| Box::new(c) as Box<dyn ConnOps>)),
            Err(e) => Err(e.context(format_args!("on {}", self.acceptor.local_addr()))),
        }
    }

    /// Drops a client whose handshake failed.
    fn refuse(&self, handshake: ServerHandshake<A::Wire>, _e: io::Error) {
        crate::trace::event!(
            warn,
            listener = %self.acceptor.local_addr(),
            peer = %handshake.peer,
            reason = %_e,
            "client refused"
        );
        handshake.refuse();
    }

    /// Handles one batch of readiness events.
    fn handle(&mut self, events: &[Event]) -> Result<Option<Box<dyn ConnOps>>> {
        for token in events.iter().map(|e| e.token().0) {
            let conn = if token == TOKEN_LISTEN {
                self.accept_new()?
            } else if token == TOKEN_TIMER {
                // `accept` drops the late clients and re-arms the timer.
                continue;
            } else {
                self.advance(token)?
            };
            if conn.is_some() {
                // Events not handled yet are reported again (level-triggered).
                return Ok(conn);
            }
        }
        Ok(None)
    }
}

impl<A: Acceptor> ListenerOps for FramedListener<A> {
    fn accept(&mut self, blocking: bool) -> Result<Accepted> {
        loop {
            let now = Instant::now();
            self.pending.retain(|_, p| p.handshake.deadline() > now);
            let deadline = if blocking {
                self.pending.values().map(|p| p.handshake.deadline()).min()
            } else {
                Some(now)
            };
            let mut events = std::mem::take(&mut self.events);
            let res = self
                .epoll
                .wait(deadline, &mut events)
                .map_err(|e| self.error("wait for clients", e))
                .and_then(|()| self.handle(&events));
            self.events = events;
            let conn = res?;
            // Re-arming also clears an expiry that brought us here; a timer already set
            // for the same deadline, still in the future, is left alone (`accept` runs at
            // every look of an `auto:` listener, most of which change no deadline).
            let next = self.pending.values().map(|p| p.handshake.deadline()).min();
            if next != self.armed || self.armed.is_some_and(|a| a <= Instant::now()) {
                self.timer
                    .set(next.map(|d| d.saturating_duration_since(Instant::now())))
                    .map_err(|e| self.error("arm the handshake deadline timer", e))?;
                self.armed = next;
            }
            match conn {
                Some(conn) => return Ok(Accepted::untracked(conn)),
                None if !blocking => return Err(Error::would_block()),
                None => {}
            }
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.epoll.fd()
    }

    fn local_addr(&self) -> String {
        self.acceptor.local_addr()
    }
}
