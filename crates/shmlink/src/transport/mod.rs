//! Transports behind one interface, chosen by address prefix (XCM's `xcm_tp_ops`).
//!
//! A transport implements [`ConnOps`] for connections and [`ListenerOps`] for listeners
//! and registers a [`Transport`] in [`REGISTRY`]. The public [`Connection`] and
//! [`Listener`] wrappers add what every transport shares (counters, blocking mode,
//! argument checks), so a transport only moves messages.
//!
//! [`Connection`]: crate::Connection
//! [`Listener`]: crate::Listener

use crate::addr::Address;
use crate::error::{Error, ErrorKind, Result};

pub(crate) mod auto;
pub(crate) mod framed;
pub(crate) mod local;
pub(crate) mod net;
mod ops;
pub(crate) mod shm;
pub(crate) mod stream;
pub(crate) mod tcp;
pub(crate) mod tls;
pub(crate) mod ux;

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

/// Every transport, by prefix.
pub(crate) static REGISTRY: &[Transport] = &[
    shm::TRANSPORT,
    ux::TRANSPORT,
    tcp::TRANSPORT,
    tls::TRANSPORT,
    auto::TRANSPORT,
];

/// The transport that serves `addr`.
pub(crate) fn lookup(addr: &Address) -> Result<&'static Transport> {
    REGISTRY
        .iter()
        .find(|t| t.name == addr.transport())
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidAddress,
                format!("{addr}: transport not available in this build"),
            )
        })
}
