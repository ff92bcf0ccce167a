//! [`FramedListener`]: accepts clients of an [`Acceptor`] and runs the listener's half of
//! their handshakes side by side, so that a slow or hostile client holds up no one.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use super::hello::{may_be_hello, parse_hello, send_hello, HELLO_LEN};
use super::{FramedConn, Wire};
use crate::error::{Error, ErrorKind, Result};
use crate::options::Options;
use crate::sys::Epoll;
use crate::transport::{ConnOps, ListenerOps};

/// Most clients a listener keeps in the middle of their handshake; beyond that the oldest
/// is dropped, so a flood of idle clients cannot exhaust descriptors.
const MAX_PENDING: usize = 128;

/// Epoll token of a listener's listening socket; pending clients count up from 1.
const TOKEN_LISTEN: u64 = 0;

/// How a transport's listening socket hands out clients.
pub(crate) trait Acceptor: Send + 'static {
    /// The wire accepted connections speak.
    type Wire: Wire;
    /// The listening socket.
    fn listen_fd(&self) -> BorrowedFd<'_>;
    /// Takes one waiting client without blocking: its socket and address text. `None`
    /// when nobody waits.
    fn accept(&mut self) -> io::Result<Option<(OwnedFd, String)>>;
    /// The bound address, as text with the transport prefix.
    fn local_addr(&self) -> String;
}

/// A client whose hello has not arrived yet.
struct Pending {
    sock: OwnedFd,
    peer: String,
    deadline: Instant,
    hello: Vec<u8>,
}

/// A listener over a framed socket transport: accepts sockets, runs their handshakes
/// without letting a slow or hostile client hold up others, and hands out connections.
pub(crate) struct FramedListener<A: Acceptor> {
    acceptor: A,
    /// Holds the listening socket and every pending client ([`ListenerOps::fd`]).
    epoll: Epoll,
    pending: HashMap<u64, Pending>,
    next_token: u64,
    events: Vec<(u64, u32)>,
    max_msg: usize,
    handshake_timeout: Duration,
}

impl<A: Acceptor> FramedListener<A> {
    /// Serves clients of `acceptor` with the limits in `opts`.
    pub(crate) fn new(acceptor: A, opts: &Options) -> Result<FramedListener<A>> {
        let ctx = |e| Error::io("create the listener's epoll set", e);
        let epoll = Epoll::new().map_err(ctx)?;
        epoll
            .add(
                acceptor.listen_fd().as_raw_fd(),
                libc::EPOLLIN as u32,
                TOKEN_LISTEN,
            )
            .map_err(ctx)?;
        Ok(FramedListener {
            acceptor,
            epoll,
            pending: HashMap::new(),
            next_token: TOKEN_LISTEN + 1,
            events: Vec::new(),
            max_msg: opts.max_msg_size,
            handshake_timeout: opts.handshake_timeout,
        })
    }

    /// An OS error of this listener, naming its address.
    fn error(&self, what: &str, e: io::Error) -> Error {
        Error::io(format!("{what} on {}", self.acceptor.local_addr()), e)
    }

    /// Takes one new client into the pending set and tries its handshake at once.
    fn accept_new(&mut self) -> Result<Option<Box<dyn ConnOps>>> {
        let Some((sock, peer)) = self
            .acceptor
            .accept()
            .map_err(|e| self.error("accept", e))?
        else {
            return Ok(None);
        };
        if self.pending.len() >= MAX_PENDING {
            let oldest = self
                .pending
                .iter()
                .min_by_key(|(_, p)| p.deadline)
                .map(|(&t, _)| t);
            if let Some(t) = oldest {
                self.pending.remove(&t);
            }
        }
        let token = self.next_token;
        self.next_token += 1;
        self.epoll
            .add(sock.as_raw_fd(), libc::EPOLLIN as u32, token)
            .map_err(|e| self.error("watch a new client", e))?;
        self.pending.insert(
            token,
            Pending {
                sock,
                peer,
                deadline: Instant::now() + self.handshake_timeout,
                hello: Vec::with_capacity(HELLO_LEN),
            },
        );
        self.advance(token)
    }

    /// Reads what a pending client sent; returns its connection once its hello is
    /// complete and valid. Bad clients are dropped (closing a socket also removes it from
    /// the epoll set), those that send garbage as soon as it arrives.
    fn advance(&mut self, token: u64) -> Result<Option<Box<dyn ConnOps>>> {
        let Some(p) = self.pending.get_mut(&token) else {
            return Ok(None);
        };
        match <A::Wire as Wire>::recv_hello(p.sock.as_fd(), &mut p.hello) {
            Ok(0) => {
                self.pending.remove(&token);
                return Ok(None);
            }
            Ok(_) if !may_be_hello(&p.hello) => {
                self.pending.remove(&token);
                return Ok(None);
            }
            Ok(_) if p.hello.len() < HELLO_LEN => return Ok(None),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(_) => {
                self.pending.remove(&token);
                return Ok(None);
            }
        }
        let p = self.pending.remove(&token).expect("looked up above");
        let peer_max = match parse_hello(p.hello[..].try_into().expect("HELLO_LEN bytes")) {
            Ok(max) => max,
            Err(e) => {
                if e.kind() == ErrorKind::VersionMismatch {
                    // Tell the client which version we speak; it reports the mismatch.
                    let _ = send_hello(p.sock.as_fd(), self.max_msg);
                }
                return Ok(None);
            }
        };
        // The socket moves to the connection's own epoll set.
        self.epoll
            .delete(p.sock.as_raw_fd())
            .map_err(|e| self.error("unwatch a client", e))?;
        if send_hello(p.sock.as_fd(), self.max_msg).is_err() {
            return Ok(None);
        }
        let conn = FramedConn::<A::Wire>::new(
            p.sock,
            self.max_msg,
            peer_max,
            self.acceptor.local_addr(),
            p.peer,
        )
        .map_err(|e| self.error("set up an accepted connection", e))?;
        Ok(Some(Box::new(conn)))
    }

    /// Handles one batch of readiness events.
    fn handle(&mut self, events: &[(u64, u32)]) -> Result<Option<Box<dyn ConnOps>>> {
        for &(token, _) in events {
            let conn = if token == TOKEN_LISTEN {
                self.accept_new()?
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
    fn accept(&mut self, blocking: bool) -> Result<Box<dyn ConnOps>> {
        loop {
            let now = Instant::now();
            self.pending.retain(|_, p| p.deadline > now);
            let deadline = if blocking {
                self.pending.values().map(|p| p.deadline).min()
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
            if let Some(conn) = res? {
                return Ok(conn);
            }
            if !blocking {
                return Err(Error::would_block());
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
