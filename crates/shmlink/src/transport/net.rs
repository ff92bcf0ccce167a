//! The transports as publish/subscribe's network side sees them, and all it sees of them:
//! which framed transport serves a network topic address ([`outer`]), a framed connection
//! that carries records in order ([`NetConn`]), a listener that hands them out
//! ([`NetListener`]), and the local upgrade's pieces ([`super::local`]) for `auto:`
//! topics. Pub/sub names nothing else of `transport`.

use std::os::fd::BorrowedFd;

use super::ops::{ConnOps, ListenerOps, Transport};
use super::{tcp, tls};
use crate::addr::Address;
use crate::error::Result;
use crate::options::{Options, TlsOptions};

pub(crate) use super::local::{
    boot_id, same_kernel, UpgradeSocket, MAX_BOOT_ID, MAX_NAME, MAX_PATH,
};

/// A network address resolved to the framed transport that carries it.
pub(crate) struct Outer {
    /// The `tcp:` or `tls:` address to connect to or bind.
    pub addr: Address,
    transport: &'static Transport,
    /// The address was `auto:` (the local upgrade applies).
    pub is_auto: bool,
}

/// The framed transport under a network address: `tcp:` and `tls:` as they are, `auto:`
/// over `tls:` when TLS options are set, else over `tcp:`; `None` for other addresses.
pub(crate) fn outer(addr: &Address, opts: &Options) -> Option<Outer> {
    let (addr, transport, is_auto) = match addr {
        Address::Tcp { .. } => (addr.clone(), &tcp::TRANSPORT, false),
        Address::Tls { .. } => (addr.clone(), &tls::TRANSPORT, false),
        Address::Auto { host, port } => {
            let (host, port) = (host.clone(), *port);
            if *opts.configured_tls() != TlsOptions::default() {
                (Address::Tls { host, port }, &tls::TRANSPORT, true)
            } else {
                (Address::Tcp { host, port }, &tcp::TRANSPORT, true)
            }
        }
        _ => return None,
    };
    Some(Outer {
        addr,
        transport,
        is_auto,
    })
}

impl Outer {
    /// [`Tcp`](crate::Transport::Tcp) or [`Tls`](crate::Transport::Tls).
    pub(crate) fn transport(&self) -> crate::Transport {
        self.addr.transport()
    }

    /// The transport's registry entry.
    pub(crate) fn entry(&self) -> &'static Transport {
        self.transport
    }

    /// Connects (the framed handshake included).
    pub(crate) fn connect(&self, opts: &Options) -> Result<NetConn> {
        Ok(NetConn((self.transport.connect)(&self.addr, opts)?))
    }

    /// Binds a listener.
    pub(crate) fn bind(&self, opts: &Options) -> Result<NetListener> {
        Ok(NetListener((self.transport.bind)(&self.addr, opts)?))
    }
}

/// A framed `tcp:` or `tls:` connection: messages in order, each lent in place in this
/// process's memory until released (see `ConnOps` for the rules).
pub(crate) struct NetConn(Box<dyn ConnOps>);

impl NetConn {
    /// Sends one message (at most [`NetConn::max_send_size`] bytes).
    pub(crate) fn send(&mut self, msg: &[u8], blocking: bool) -> Result<()> {
        self.0.send(msg, blocking)
    }

    /// Makes the next message current; returns its length.
    pub(crate) fn recv_next(&mut self, blocking: bool) -> Result<usize> {
        self.0.recv_next(blocking)
    }

    /// The current message (empty if none).
    pub(crate) fn current(&self) -> &[u8] {
        self.0.current_local()
    }

    /// Consumes the current message.
    pub(crate) fn release(&mut self) {
        self.0.release()
    }

    /// Writes what a non-blocking send queued; true when nothing is queued any more.
    pub(crate) fn writable(&mut self) -> Result<bool> {
        self.0.writable()
    }

    /// Largest message the peer accepts.
    pub(crate) fn max_send_size(&self) -> usize {
        self.0.max_send_size()
    }

    /// The descriptor an event loop watches.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.0.fd()
    }

    /// Closes the connection (see `ConnOps::close`).
    pub(crate) fn close(&mut self, wait: bool) -> Result<()> {
        self.0.close(wait)
    }

    /// The peer's address, with the transport prefix.
    pub(crate) fn peer_addr(&self) -> String {
        self.0.peer_addr()
    }
}

/// A bound `tcp:` or `tls:` listener.
pub(crate) struct NetListener(Box<dyn ListenerOps>);

impl NetListener {
    /// Accepts one connection whose handshake completed, without blocking.
    pub(crate) fn accept(&mut self) -> Result<NetConn> {
        Ok(NetConn(self.0.accept(false)?.conn))
    }

    /// The descriptor an event loop watches (readable when `accept` may succeed).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.0.fd()
    }

    /// The bound address, with the transport prefix and the real port.
    pub(crate) fn local_addr(&self) -> String {
        self.0.local_addr()
    }
}
