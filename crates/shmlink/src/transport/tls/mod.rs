//! The `tls:` transport: `tcp:`'s frames inside TLS 1.3 (rustls with the *ring* provider).
//!
//! TLS is a layer between the frames and the TCP socket
//! ([`StreamLink`](super::stream::StreamLink)); framing, hello, flow control, end of stream,
//! non-blocking mode and readiness are those of `tcp:`. The TLS handshake runs first on
//! both sides: a client within its connect timeout, a listener side by side with its
//! other clients' handshakes, dropping a client that fails it or does not complete it
//! within the handshake timeout. Certificates, keys and CAs come from
//! [`TlsOptions`](crate::TlsOptions).
//!
//! | file                          | what it holds                                       |
//! |-------------------------------|-----------------------------------------------------|
//! | `tls/mod.rs`                  | the registry entry: `connect` and `bind`            |
//! | `stream/tls/config.rs`        | options turned into rustls configurations ([`ClientTls`], [`ServerTls`]) |
//! | `stream/tls/session.rs`       | `TlsSession`: rustls driven over a socket, TLS errors explained |
//!
//! The session lives under the stream layer, which holds it in its links; this module only
//! reads `tls:` addresses and hands the configurations to that layer.
//!
//! A certificate refused during the handshake — the listener's by the client (unknown
//! CA, wrong name, expired) or the client's by the listener (missing, unknown CA) — fails
//! `connect` with [`ErrorKind::PermissionDenied`] and a message that says which. With
//! TLS 1.3 the listener checks the client's certificate after the client has finished its
//! part, so the client learns of that refusal when it waits for the listener's hello.

use crate::addr::Address;
use crate::error::{Error, ErrorKind, Result};
use crate::options::Options;
use crate::transport::stream::{self, ClientTls, ServerTls};
use crate::transport::{ConnOps, ListenerOps, Transport};

/// The `tls:` entry in the transport registry.
pub(crate) const TRANSPORT: Transport = Transport {
    name: "tls",
    connect,
    bind,
};

fn host_port(addr: &Address) -> Result<(&str, u16)> {
    match addr {
        Address::Tls { host, port } => Ok((host, *port)),
        _ => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!("{addr} is not a tls: address"),
        )),
    }
}

fn connect(addr: &Address, opts: &Options) -> Result<Box<dyn ConnOps>> {
    connect_with(addr, opts, None)
}

/// `tcp::connect_with` over TLS: `early` goes right behind the hello, after the TLS
/// handshake.
pub(crate) fn connect_with(
    addr: &Address,
    opts: &Options,
    early: Option<&[u8]>,
) -> Result<Box<dyn ConnOps>> {
    let (host, port) = host_port(addr)?;
    let tls = ClientTls::new(&opts.tls, host)?;
    stream::connect_to(host, port, Some(&tls), opts, early)
}

fn bind(addr: &Address, opts: &Options) -> Result<Box<dyn ListenerOps>> {
    let (host, port) = host_port(addr)?;
    let tls = ServerTls::new(&opts.tls)?;
    stream::listen(host, port, Some(tls), opts)
}

/// TLS options for both ends of a test connection: the test listener certificate (for
/// localhost, 127.0.0.1 and ::1), its key, and the test CA — so a listener requires client
/// certificates and a client presents the same one.
#[cfg(all(test, feature = "tls"))]
pub(crate) fn test_tls() -> crate::options::TlsOptions {
    use crate::options::{Pem, TlsOptions};
    let pki = test_pki::pki();
    TlsOptions::new()
        .cert(Pem::text(&pki.server.cert))
        .key(Pem::text(&pki.server.key))
        .ca(Pem::text(&pki.ca))
}

#[cfg(all(test, feature = "tls"))]
mod test_pki;
#[cfg(all(test, feature = "tls"))]
mod tests;
