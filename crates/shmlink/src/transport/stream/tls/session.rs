//! [`TlsSession`]: a rustls connection driven over a socket the way the framed transports
//! drive sockets — each call says whether it may block — with the bytes it keeps in user
//! space (records not yet written, plaintext not yet read) visible to the connection's
//! readiness, and its failures turned into errors that say what was refused.

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::BorrowedFd;

use rustls::{AlertDescription, CertificateError, Connection};

use crate::sys::stream::{self, Ready};

/// The socket as rustls reads and writes it.
struct SockIo<'a> {
    sock: BorrowedFd<'a>,
    blocking: bool,
}

impl Read for SockIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        stream::recv_into(self.sock, buf, self.blocking)
    }
}

impl Write for SockIo<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        stream::send_vectored(self.sock, &[IoSlice::new(buf)], self.blocking)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        stream::send_vectored(self.sock, bufs, self.blocking)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One side of a TLS session over a connected socket (which the caller owns and passes
/// to every call).
pub(crate) struct TlsSession {
    conn: Connection,
    /// Decrypted bytes not read yet.
    plain: usize,
    /// The peer's `close_notify` has been processed: nothing more will come.
    peer_closed: bool,
    /// The socket reported end of stream.
    eof: bool,
}

impl TlsSession {
    pub(super) fn new(conn: Connection) -> TlsSession {
        TlsSession {
            conn,
            plain: 0,
            peer_closed: false,
            eof: false,
        }
    }

    fn is_client(&self) -> bool {
        matches!(self.conn, Connection::Client(_))
    }

    /// Decrypts what was read. On failure rustls has queued an alert that tells the peer
    /// why; it is sent before the error is returned.
    fn process(&mut self, sock: BorrowedFd<'_>) -> io::Result<()> {
        match self.conn.process_new_packets() {
            Ok(state) => {
                self.plain = state.plaintext_bytes_to_read();
                self.peer_closed = state.peer_has_closed();
                Ok(())
            }
            Err(e) => {
                let _ = self.flush(sock, false);
                Err(tls_error(e, self.is_client()))
            }
        }
    }

    /// Reads records from the socket and decrypts them. Ok(false) at end of stream.
    fn read_more(&mut self, sock: BorrowedFd<'_>, blocking: bool) -> io::Result<bool> {
        loop {
            match self.conn.read_tls(&mut SockIo { sock, blocking }) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(_) => {
                    self.process(sock)?;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Advances the handshake without blocking; true once it is complete (on a client:
    /// once it may send; a listener that refuses its certificate says so in its first
    /// answer, which TLS 1.3 sends after that).
    pub(crate) fn handshake(&mut self, sock: BorrowedFd<'_>) -> io::Result<bool> {
        loop {
            self.flush(sock, false)?;
            if !self.conn.is_handshaking() {
                return Ok(true);
            }
            match self.read_more(sock, false) {
                Ok(true) => {}
                Ok(false) => {
                    let peer = if self.is_client() {
                        "the listener closed the connection during the TLS handshake (is it \
                         a tls: listener?)"
                    } else {
                        "the client closed the connection during the TLS handshake"
                    };
                    return Err(io::Error::new(io::ErrorKind::ConnectionRefused, peer));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
    }

    /// Encrypts as much of `head`, then `body`, as the session's buffer takes, and writes
    /// the records out. Returns the number of plaintext bytes taken; in blocking mode
    /// their records are in the kernel when this returns, in non-blocking mode some may
    /// remain [pending](Self::pending_output).
    pub(crate) fn send(
        &mut self,
        sock: BorrowedFd<'_>,
        head: &[u8],
        body: &[u8],
        blocking: bool,
    ) -> io::Result<usize> {
        if head.is_empty() && body.is_empty() {
            return Ok(0);
        }
        loop {
            // Records written earlier go first and make room in the buffer.
            self.flush(sock, false)?;
            let n = self
                .conn
                .writer()
                .write_vectored(&[IoSlice::new(head), IoSlice::new(body)])?;
            if n > 0 {
                self.flush(sock, blocking)?;
                return Ok(n);
            }
            if !blocking {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            stream::wait(sock, Ready::Write, None)?;
        }
    }

    /// Receives up to `max` decrypted bytes into `buf`'s spare capacity, reading records
    /// from the socket when none wait. Returns the number of bytes appended; 0 is the end
    /// of the stream (`close_notify` or the socket's end).
    pub(crate) fn recv_append(
        &mut self,
        sock: BorrowedFd<'_>,
        buf: &mut Vec<u8>,
        max: usize,
        blocking: bool,
    ) -> io::Result<usize> {
        loop {
            if self.plain > 0 {
                let n = max.min(self.plain).min(buf.capacity() - buf.len());
                let start = buf.len();
                // Only the bytes about to be overwritten are initialised.
                buf.resize(start + n, 0);
                let got = self.conn.reader().read(&mut buf[start..]);
                let got = got.inspect_err(|_| buf.truncate(start))?;
                buf.truncate(start + got);
                self.plain -= got;
                return Ok(got);
            }
            if self.peer_closed || self.eof {
                return Ok(0);
            }
            // Records we owe the peer (an alert, a key update) go out before this side
            // blocks in a read: the peer may be waiting for them.
            let kernel_blocking = blocking && !self.conn.wants_write();
            if blocking && !kernel_blocking && !self.flush(sock, false)? {
                stream::wait(sock, Ready::ReadWrite, None)?;
                self.flush(sock, false)?;
            }
            match self.read_more(sock, kernel_blocking) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && blocking => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether records wait for room in the socket.
    pub(crate) fn pending_output(&self) -> bool {
        self.conn.wants_write()
    }

    /// Writes records that wait. Returns true when none is left.
    pub(crate) fn flush(&mut self, sock: BorrowedFd<'_>, blocking: bool) -> io::Result<bool> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut SockIo { sock, blocking }) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Whether a read would return at once: decrypted bytes wait, or the peer's
    /// `close_notify` has been seen.
    pub(crate) fn buffered_input(&self) -> bool {
        self.plain > 0 || self.peer_closed
    }

    /// Queues `close_notify`: this side sends nothing more.
    pub(crate) fn close_notify(&mut self) {
        self.conn.send_close_notify();
    }
}

/// A TLS failure as an I/O error: `PermissionDenied` when a certificate was refused —
/// the peer's by this side, or this side's by the peer (its alert says so) — with a
/// message that says which and why; `InvalidData` for anything else (the peer does not
/// speak TLS, or broke it).
fn tls_error(e: rustls::Error, client: bool) -> io::Error {
    use rustls::Error as E;
    let (peer, us) = if client {
        ("the listener", "this client")
    } else {
        ("the client", "this listener")
    };
    let why = match &e {
        E::InvalidCertificate(CertificateError::UnknownIssuer) => {
            format!("{peer}'s certificate is not signed by a CA in option tls.ca")
        }
        E::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "{peer}'s certificate is not valid for the server name (the address's host, or \
             option tls.server_name)"
        ),
        E::InvalidCertificate(
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. },
        ) => format!("{peer}'s certificate has expired or is not valid yet"),
        E::InvalidCertificate(_) => format!("{peer}'s certificate was refused"),
        E::NoCertificatesPresented => {
            format!("{peer} presented no certificate, and {us} requires one (it has option tls.ca)")
        }
        E::AlertReceived(AlertDescription::CertificateRequired) => format!(
            "{peer} requires a client certificate (mutual TLS), and {us} has none \
             (options tls.cert and tls.key)"
        ),
        E::AlertReceived(AlertDescription::UnknownCA) => {
            format!("{peer} does not trust the CA that signed {us}'s certificate")
        }
        E::AlertReceived(
            AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::AccessDenied,
        ) => format!("{peer} refused {us}'s certificate"),
        _ => return io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")),
    };
    io::Error::new(io::ErrorKind::PermissionDenied, format!("{why}: {e}"))
}
