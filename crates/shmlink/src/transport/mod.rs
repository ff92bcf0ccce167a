//! Transports behind one interface, chosen by address prefix (XCM's `xcm_tp_ops`).
//!
//! A transport implements [`ConnOps`] for connections and [`ListenerOps`] for listeners
//! and registers a [`Transport`] in [`entry`]. The public [`Connection`] and
//! [`Listener`] wrappers add what every transport shares (counters, blocking mode,
//! argument checks), so a transport only moves messages.
//!
//! [`Connection`]: crate::Connection
//! [`Listener`]: crate::Listener

use crate::addr::Address;

pub(crate) mod auto;
pub(crate) mod framed;
pub(crate) mod inproc;
pub(crate) mod local;
pub(crate) mod net;
mod ops;
pub(crate) mod shm;
pub(crate) mod stream;
pub(crate) mod tcp;
pub(crate) mod tls;
pub(crate) mod ux;
pub(crate) mod vm;

pub(crate) use ops::{Accepted, ConnOps, ListenerOps, Transport, CLOSE_LINGER};

/// A connection's transport half as the public API holds it: `shm:` by its concrete type,
/// so its per-message path is dispatched statically and inlined into the public calls;
/// every other transport through the trait object.
pub(crate) enum Conn {
    Shm(Box<shm::ShmConn>),
    Dyn(Box<dyn ConnOps>),
}

impl From<Box<dyn ConnOps>> for Conn {
    fn from(ops: Box<dyn ConnOps>) -> Conn {
        if !ops.as_any().is::<shm::ShmConn>() {
            return Conn::Dyn(ops);
        }
        match ops.into_any().downcast::<shm::ShmConn>() {
            Ok(shm) => Conn::Shm(shm),
            Err(_) => unreachable!("as_any said this is a ShmConn"),
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
        T::Vm => &vm::TRANSPORT,
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
