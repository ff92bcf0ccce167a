//! Errors: one [`Error`] type whose [`ErrorKind`] says what went wrong and whose message
//! says with which address, option or operation.

use std::fmt;
use std::io;

/// What kind of failure an [`Error`] is.
///
/// Kinds that have an equivalent in [`std::io::ErrorKind`] map to it through
/// [`ErrorKind::io_kind`] (and `From<Error> for io::Error`); the others are shmlink's own.
///
/// `Send`, `Sync`, `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Non-blocking mode: the operation would have to wait. Retry when the connection's
    /// fd becomes readable.
    WouldBlock,
    /// Nobody listens at the address, or the listener refused the handshake.
    ConnectionRefused,
    /// The peer died or broke the connection without closing it.
    ConnectionReset,
    /// The peer closed the connection gracefully and every message it sent has been
    /// received. Zero-length messages are valid, so end-of-stream is never a length of 0.
    EndOfStream,
    /// A deadline (connect or handshake timeout) passed.
    TimedOut,
    /// An argument or option is invalid (the message names which).
    InvalidInput,
    /// The address is malformed or names an unknown transport.
    InvalidAddress,
    /// The listener's credential policy refused this process, the OS denied access, or
    /// (`tls:`) a certificate was refused: the listener's by this client (unknown CA,
    /// not valid for the server name, expired) or this client's by the listener (missing
    /// or not signed by a CA it trusts). The message says which.
    PermissionDenied,
    /// Another listener already serves this address.
    AddrInUse,
    /// The peer speaks another protocol version.
    VersionMismatch,
    /// The peer wrote something that breaks the protocol (shared-memory indices, record
    /// headers, handshake bytes, TLS records). The connection is unusable afterwards.
    ProtocolViolation,
    /// The message is larger than the connection's maximum, or than the caller's buffer.
    MessageTooLarge,
    /// The connection was already closed by this side.
    Closed,
    /// Publish/subscribe, `overwrite` policy: the publisher overwrote messages this
    /// subscriber had not read yet. [`Error::missed`] says exactly how many it lost; the
    /// subscription goes on with the oldest message still in the ring, so the next
    /// `recv` returns a message again.
    Lagged,
    /// Publish/subscribe, `block` policy: the publisher detached this subscriber because
    /// it made no progress for the stall timeout while the publisher waited for it (or
    /// because it broke the protocol). The subscription is over; connect again to
    /// resubscribe.
    Detached,
    /// Publish/subscribe, a subscriber with
    /// [`PubSubOptions::resubscribe`](crate::PubSubOptions::resubscribe): its publisher
    /// closed the topic, died or detached it, and the subscriber has subscribed again to
    /// the publisher now bound at the same address. What was published in between was not
    /// received (a gap; nothing is repeated or reordered), and positions now count the new
    /// publisher's messages. The subscription goes on: the next `recv` returns a message.
    Resubscribed,
    /// What the address names does not exist: a directory or path to bind in, or a host
    /// name that does not resolve. (A client that finds no listener gets
    /// [`ErrorKind::ConnectionRefused`], also when the rendezvous directory is missing.)
    NotFound,
    /// Any other operating-system error.
    Other,
}

impl ErrorKind {
    /// The closest [`std::io::ErrorKind`].
    pub fn io_kind(self) -> io::ErrorKind {
        match self {
            ErrorKind::WouldBlock => io::ErrorKind::WouldBlock,
            ErrorKind::ConnectionRefused => io::ErrorKind::ConnectionRefused,
            ErrorKind::ConnectionReset => io::ErrorKind::ConnectionReset,
            ErrorKind::EndOfStream => io::ErrorKind::UnexpectedEof,
            ErrorKind::TimedOut => io::ErrorKind::TimedOut,
            ErrorKind::InvalidInput | ErrorKind::InvalidAddress => io::ErrorKind::InvalidInput,
            ErrorKind::PermissionDenied => io::ErrorKind::PermissionDenied,
            ErrorKind::AddrInUse => io::ErrorKind::AddrInUse,
            ErrorKind::VersionMismatch | ErrorKind::ProtocolViolation => io::ErrorKind::InvalidData,
            ErrorKind::MessageTooLarge => io::ErrorKind::InvalidInput,
            ErrorKind::Closed => io::ErrorKind::NotConnected,
            ErrorKind::Lagged => io::ErrorKind::Other,
            ErrorKind::Detached => io::ErrorKind::ConnectionAborted,
            ErrorKind::Resubscribed => io::ErrorKind::Other,
            ErrorKind::NotFound => io::ErrorKind::NotFound,
            ErrorKind::Other => io::ErrorKind::Other,
        }
    }

    fn from_io(kind: io::ErrorKind) -> ErrorKind {
        match kind {
            io::ErrorKind::WouldBlock => ErrorKind::WouldBlock,
            io::ErrorKind::ConnectionRefused => ErrorKind::ConnectionRefused,
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => ErrorKind::ConnectionReset,
            io::ErrorKind::TimedOut => ErrorKind::TimedOut,
            io::ErrorKind::InvalidInput => ErrorKind::InvalidInput,
            io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            io::ErrorKind::AddrInUse => ErrorKind::AddrInUse,
            io::ErrorKind::NotFound => ErrorKind::NotFound,
            _ => ErrorKind::Other,
        }
    }
}

/// A shmlink error: a kind, a message with context, and the OS error behind it if any.
///
/// `Send` and `Sync` (so it converts into `Box<dyn std::error::Error + Send + Sync>`
/// and [`std::io::Error`]).
pub struct Error {
    kind: ErrorKind,
    msg: String,
    source: Option<io::Error>,
    /// For [`ErrorKind::Lagged`]: how many messages were lost.
    missed: u64,
}

/// `Result` with shmlink's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error of `kind` with a context message.
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Error {
        Error {
            kind,
            msg: msg.into(),
            source: None,
            missed: 0,
        }
    }

    /// An OS error with context (`"connect shm:foo"`); the kind follows the OS error.
    pub fn io(context: impl Into<String>, err: io::Error) -> Error {
        Error {
            kind: ErrorKind::from_io(err.kind()),
            msg: context.into(),
            source: Some(err),
            missed: 0,
        }
    }

    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// For [`ErrorKind::Lagged`]: exactly how many messages the subscriber lost since the
    /// message it received last. `None` for every other kind.
    pub fn missed(&self) -> Option<u64> {
        (self.kind == ErrorKind::Lagged).then_some(self.missed)
    }

    /// The context message (without the OS error).
    pub fn message(&self) -> &str {
        &self.msg
    }

    /// The same error with `prefix: ` put before its message.
    pub(crate) fn context(mut self, prefix: impl fmt::Display) -> Error {
        self.msg = format!("{prefix}: {}", self.msg);
        self
    }

    pub(crate) fn would_block() -> Error {
        Error::new(ErrorKind::WouldBlock, "operation would block")
    }

    pub(crate) fn reset(what: impl Into<String>) -> Error {
        Error::new(ErrorKind::ConnectionReset, what)
    }

    pub(crate) fn violation(what: impl Into<String>) -> Error {
        Error::new(ErrorKind::ProtocolViolation, what)
    }

    pub(crate) fn lagged(missed: u64, context: impl fmt::Display) -> Error {
        let mut e = Error::new(
            ErrorKind::Lagged,
            format!("{context}: lagged behind the publisher and missed {missed} messages"),
        );
        e.missed = missed;
        e
    }

    pub(crate) fn eos() -> Error {
        Error::new(ErrorKind::EndOfStream, "peer closed the connection")
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({:?}, {self})", self.kind)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)?;
        if let Some(src) = &self.source {
            write!(f, ": {src}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        io::Error::new(e.kind.io_kind(), e)
    }
}

/// A ring's [`Violation`](shmlink_ring::Violation) is the peer's protocol violation, with
/// the ring's message.
impl From<shmlink_ring::Violation> for Error {
    fn from(v: shmlink_ring::Violation) -> Error {
        Error::violation(v.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_keep_their_kind_and_context() {
        let e = Error::io(
            "connect shm:x",
            io::Error::from_raw_os_error(crate::sys::errno::ECONNREFUSED),
        );
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
        assert!(e.to_string().starts_with("connect shm:x: "));
        let io: io::Error = e.into();
        assert_eq!(io.kind(), io::ErrorKind::ConnectionRefused);
    }

    #[test]
    fn shmlink_kinds_map_to_io_kinds() {
        assert_eq!(
            ErrorKind::ProtocolViolation.io_kind(),
            io::ErrorKind::InvalidData
        );
        assert_eq!(
            ErrorKind::EndOfStream.io_kind(),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            ErrorKind::Detached.io_kind(),
            io::ErrorKind::ConnectionAborted
        );
    }

    #[test]
    fn lagged_errors_carry_the_exact_count() {
        let e = Error::lagged(17, "shm:t");
        assert_eq!(e.kind(), ErrorKind::Lagged);
        assert_eq!(e.missed(), Some(17));
        assert!(e.to_string().contains("missed 17 messages"), "{e}");
        assert_eq!(Error::eos().missed(), None);
    }
}
