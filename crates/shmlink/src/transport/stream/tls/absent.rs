//! The stand-in for TLS in a build without the `tls` cargo feature: the same names as the
//! real configurations and session, so the stream layer compiles unchanged, but a
//! configuration cannot be built (the error names the feature) and a session cannot
//! exist (an empty enum), so nothing is ever sent in the clear where TLS was asked for.

use std::io;
use std::os::fd::BorrowedFd;

use crate::error::{Error, ErrorKind, Result};
use crate::options::TlsOptions;

/// Why every TLS configuration fails here.
fn absent() -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        "TLS was asked for (a tls: address, or TLS options on auto:), but this build of \
         shmlink has no TLS: turn on its `tls` cargo feature (on by default)",
    )
}

/// A client configuration, which this build cannot make.
pub(crate) enum ClientTls {}

impl ClientTls {
    pub(crate) fn new(_tls: &TlsOptions, _host: &str) -> Result<ClientTls> {
        Err(absent())
    }

    pub(crate) fn session(&self) -> io::Result<TlsSession> {
        match *self {}
    }
}

/// A listener configuration, which this build cannot make.
#[derive(Clone)]
pub(crate) enum ServerTls {}

impl ServerTls {
    pub(crate) fn new(_tls: &TlsOptions) -> Result<ServerTls> {
        Err(absent())
    }

    pub(crate) fn session(&self) -> io::Result<TlsSession> {
        match *self {}
    }
}

/// A session, which cannot exist in this build.
pub(crate) enum TlsSession {}

impl TlsSession {
    pub(crate) fn handshake(&mut self, _sock: BorrowedFd<'_>) -> io::Result<bool> {
        match *self {}
    }

    pub(crate) fn send(
        &mut self,
        _sock: BorrowedFd<'_>,
        _head: &[u8],
        _body: &[u8],
        _blocking: bool,
    ) -> io::Result<usize> {
        match *self {}
    }

    pub(crate) fn recv_append(
        &mut self,
        _sock: BorrowedFd<'_>,
        _buf: &mut Vec<u8>,
        _max: usize,
        _blocking: bool,
    ) -> io::Result<usize> {
        match *self {}
    }

    pub(crate) fn pending_output(&self) -> bool {
        match *self {}
    }

    pub(crate) fn flush(&mut self, _sock: BorrowedFd<'_>, _blocking: bool) -> io::Result<bool> {
        match *self {}
    }

    pub(crate) fn buffered_input(&self) -> bool {
        match *self {}
    }

    pub(crate) fn close_notify(&mut self) {
        match *self {}
    }
}

#[cfg(test)]
mod tests {
    use crate::{Connection, ErrorKind, Listener, Options, TlsOptions};

    /// Without the feature a `tls:` address, and `auto:` with TLS settings, fail at once
    /// with an error that names the feature; plain `tcp:` still works.
    #[test]
    fn tls_is_refused_and_names_the_feature() {
        let opts = Options::default();
        for addr in ["tls:127.0.0.1:0", "tls:localhost:1"] {
            let bind = Listener::bind(addr, &opts).err();
            let connect = Connection::connect(addr, &opts).err();
            for e in [bind, connect] {
                let e = e.expect("a tls: address without TLS must fail");
                assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
                assert!(e.to_string().contains("`tls` cargo feature"), "{e}");
            }
        }
        let with_tls = Options::default().tls(TlsOptions::new().server_name("localhost"));
        let e = Connection::connect("auto:127.0.0.1:1", &with_tls).unwrap_err();
        assert!(e.to_string().contains("`tls` cargo feature"), "{e}");
        let l = Listener::bind("tcp:127.0.0.1:0", &opts).expect("tcp: works without TLS");
        drop(l);
    }
}
