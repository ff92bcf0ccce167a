//! The `tcp:` transport's registry entry: TCP with `TCP_NODELAY`, one length-prefixed frame
//! per message, over the [`stream`](super::stream) layer it shares with `tls:`.

use super::stream::{connect_to, listen};
use crate::addr::Address;
use crate::error::{Error, ErrorKind, Result};
use crate::options::Options;
use crate::transport::{ConnOps, ListenerOps, Transport};

/// The `tcp:` entry in the transport registry.
pub(crate) const TRANSPORT: Transport = Transport {
    name: "tcp",
    connect,
    bind,
};

fn host_port(addr: &Address) -> Result<(&str, u16)> {
    match addr {
        Address::Tcp { host, port } => Ok((host, *port)),
        _ => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!("{addr} is not a tcp: address"),
        )),
    }
}

fn connect(addr: &Address, opts: &Options) -> Result<Box<dyn ConnOps>> {
    connect_with(addr, opts, None)
}

/// Connects like the registry's `connect`, sending `early` as the first message right
/// behind the hello, before the listener's hello is in (`auto:`'s negotiation: one
/// round trip fewer). The listener must accept a message of `early`'s size.
pub(crate) fn connect_with(
    addr: &Address,
    opts: &Options,
    early: Option<&[u8]>,
) -> Result<Box<dyn ConnOps>> {
    let (host, port) = host_port(addr)?;
    connect_to(host, port, None, opts, early)
}

fn bind(addr: &Address, opts: &Options) -> Result<Box<dyn ListenerOps>> {
    let (host, port) = host_port(addr)?;
    listen(host, port, None, opts)
}
