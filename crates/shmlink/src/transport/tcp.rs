//! The `tcp:` transport (being written).

use crate::addr::Address;
use crate::error::{Error, ErrorKind, Result};
use crate::options::Options;
use crate::transport::{ConnOps, ListenerOps, Transport};

pub(crate) const TRANSPORT: Transport = Transport {
    name: "tcp",
    connect,
    bind,
};

fn connect(addr: &Address, _opts: &Options) -> Result<Box<dyn ConnOps>> {
    Err(Error::new(ErrorKind::Other, format!("{addr}: not implemented yet")))
}

fn bind(addr: &Address, _opts: &Options) -> Result<Box<dyn ListenerOps>> {
    Err(Error::new(ErrorKind::Other, format!("{addr}: not implemented yet")))
}
