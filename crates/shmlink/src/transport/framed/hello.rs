//! The hello both sides send on connect (format in the [parent module](super)), its
//! checks, and the client's half of the handshake. The listener's half runs in
//! [`FramedListener`](super::FramedListener), which must not block on any one client.

use std::io;
use std::time::Instant;

use super::{Frame, Link, Wire};
use crate::error::{Error, ErrorKind, Result};
use crate::options::{Options, Role};
use crate::sys::stream::{self, Ready};

/// First bytes of every hello.
const HELLO_MAGIC: [u8; 4] = *b"SLNK";
/// Version of the framed protocol.
pub(super) const PROTOCOL_VERSION: u8 = 1;
/// Length of a hello: magic, version, role, two reserved bytes, largest message accepted.
pub(crate) const HELLO_LEN: usize = 16;

/// A hello announcing `max_msg`, for a point-to-point connection.
#[cfg(test)]
pub(super) fn hello(max_msg: usize) -> [u8; HELLO_LEN] {
    hello_as(max_msg, Role::Connection)
}

/// A hello announcing `max_msg` and what this side is.
pub(super) fn hello_as(max_msg: usize, role: Role) -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..4].copy_from_slice(&HELLO_MAGIC);
    h[4] = PROTOCOL_VERSION;
    h[5] = role as u8;
    h[8..].copy_from_slice(&(max_msg as u64).to_le_bytes());
    h
}

/// What a role is called in errors.
fn role_name(role: u8) -> &'static str {
    match role {
        0 => "a point-to-point peer (Connection/Listener)",
        1 => "a publish/subscribe topic (Publisher/Subscriber)",
        _ => "an unknown kind of peer",
    }
}

/// Checks a peer's hello, which must announce `role`; returns the largest message the
/// peer accepts.
pub(super) fn parse_hello_as(h: &[u8; HELLO_LEN], role: Role) -> Result<usize> {
    let max = parse_hello(h)?;
    if h[5] != role as u8 {
        return Err(Error::violation(format!(
            "the peer is {}, this side is {}",
            role_name(h[5]),
            role_name(role as u8)
        )));
    }
    Ok(max)
}

/// Checks a peer's hello (all but its role); returns the largest message the peer
/// accepts.
pub(super) fn parse_hello(h: &[u8; HELLO_LEN]) -> Result<usize> {
    if h[..4] != HELLO_MAGIC {
        return Err(Error::violation(format!(
            "the peer is not a shmlink peer (hello starts with {:02x?})",
            &h[..4]
        )));
    }
    if h[4] != PROTOCOL_VERSION {
        return Err(Error::new(
            ErrorKind::VersionMismatch,
            format!(
                "the peer speaks framed protocol version {}, this side speaks {PROTOCOL_VERSION}",
                h[4]
            ),
        ));
    }
    let max = u64::from_le_bytes(h[8..].try_into().expect("8 bytes"));
    Ok(usize::try_from(max).unwrap_or(usize::MAX))
}

/// Whether the first bytes of a hello, `got`, can still begin a shmlink hello: false as
/// soon as they differ from the magic, so that garbage is refused without waiting for
/// the rest (or for the handshake deadline). The version is judged only on the whole
/// hello, since a client of another version is answered.
pub(super) fn may_be_hello(got: &[u8]) -> bool {
    let n = got.len().min(HELLO_MAGIC.len());
    got[..n] == HELLO_MAGIC[..n]
}

/// Sends our hello on a fresh link, whose empty send buffer always takes it whole.
pub(super) fn send_hello<L: Link>(link: &mut L, max_msg: usize, role: Role) -> io::Result<()> {
    if link.send_parts(&hello_as(max_msg, role), &[], false)? != HELLO_LEN || !link.flush(false)? {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "hello did not fit a fresh socket",
        ));
    }
    Ok(())
}

/// An error of the link's handshake or of the hello exchange, as the client reports it.
fn handshake_error(what: &str, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::InvalidData => Error::violation(format!("{what}: {e}")),
        // TLS: a certificate was refused, ours or the listener's; the message says which.
        io::ErrorKind::PermissionDenied => {
            Error::new(ErrorKind::PermissionDenied, format!("{what}: {e}"))
        }
        _ => Error::io(what, e),
    }
}

/// Waits until `link` may make progress: input, or room for output that waits.
fn wait_for<L: Link>(link: &L, deadline: Instant) -> io::Result<bool> {
    let ready = if link.pending_output() {
        Ready::ReadWrite
    } else {
        Ready::Read
    };
    stream::wait(link.sock(), ready, Some(deadline))
}

/// Runs the client's half of the handshake on a connected link — the link's own
/// handshake (TLS) first, then the hello — and returns the largest message the listener
/// accepts. The listener must be of `opts.role`.
///
/// `early`, if given, goes out as the connection's first data frame right behind the
/// hello, before the listener's hello is in: a protocol that speaks first on the new
/// connection (`auto:`'s negotiation) saves a round trip. The caller must know that the
/// listener accepts a message of its size.
pub(crate) fn client_handshake<W: Wire>(
    link: &mut W::Link,
    opts: &Options,
    early: Option<&[u8]>,
    deadline: Instant,
) -> Result<usize> {
    let (max_msg, role) = (opts.max_msg_size, opts.role);
    while !link
        .handshake()
        .map_err(|e| handshake_error("TLS handshake", e))?
    {
        if !wait_for(link, deadline).map_err(|e| Error::io("wait for the TLS handshake", e))? {
            return Err(Error::new(
                ErrorKind::TimedOut,
                "no TLS handshake with the listener within the connect timeout",
            ));
        }
    }
    send_hello(link, max_msg, role).map_err(|e| handshake_error("send hello", e))?;
    if let Some(msg) = early {
        // Like the hello, a small frame that a fresh link's send buffer takes whole.
        W::write(link, Frame::Data, msg, &mut 0, true)
            .and_then(|done| match done && link.flush(false)? {
                true => Ok(()),
                false => Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "it did not fit a fresh socket",
                )),
            })
            .map_err(|e| handshake_error("send the first message", e))?;
    }
    let mut got = Vec::with_capacity(HELLO_LEN);
    let mut polled = false;
    while got.len() < HELLO_LEN {
        match W::recv_hello(link, &mut got) {
            Ok(0) => {
                return Err(Error::new(
                    ErrorKind::ConnectionRefused,
                    "the listener closed the connection during the handshake",
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let _ = link.flush(false);
                // The listener answers within microseconds: look for its hello for the
                // wait policy's spin and yield budget before sleeping, as a `shm:` client
                // does for its answer (a client that sleeps pays a cross-CPU wake-up;
                // docs/design.md §5.1b).
                if !polled && !link.pending_output() {
                    polled = true;
                    let readable = || {
                        Ok(stream::wait(link.sock(), Ready::Read, Some(Instant::now()))
                            .unwrap_or(true))
                    };
                    let policy = crate::notify::setup_policy(&opts.wait);
                    if crate::notify::spin_then_yield(&policy, readable)? {
                        continue;
                    }
                }
                if !wait_for(link, deadline).map_err(|e| Error::io("wait for hello", e))? {
                    return Err(Error::new(
                        ErrorKind::TimedOut,
                        "no hello from the listener within the connect timeout",
                    ));
                }
            }
            // TLS 1.3: a listener refuses the client's certificate after the client
            // finished its part of the TLS handshake, so the refusal arrives here.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                return Err(handshake_error("TLS handshake", e))
            }
            Err(e) => return Err(handshake_error("receive the listener's hello", e)),
        }
    }
    parse_hello_as(got[..].try_into().expect("HELLO_LEN bytes"), role)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_rejects_garbage() {
        assert_eq!(parse_hello(&hello(12345)).unwrap(), 12345);
        let mut bad = hello(1);
        bad[0] = b'X';
        assert_eq!(
            parse_hello(&bad).unwrap_err().kind(),
            ErrorKind::ProtocolViolation
        );
        let mut newer = hello(1);
        newer[4] = PROTOCOL_VERSION + 1;
        let e = parse_hello(&newer).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::VersionMismatch);
        assert!(e.to_string().contains("version 2"), "{e}");
    }

    #[test]
    fn a_topic_and_a_connection_refuse_each_other_by_role() {
        let topic = hello_as(7, Role::Topic);
        assert_eq!(parse_hello_as(&topic, Role::Topic).unwrap(), 7);
        let e = parse_hello_as(&topic, Role::Connection).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ProtocolViolation);
        assert!(e.to_string().contains("publish/subscribe"), "{e}");
        let e = parse_hello_as(&hello(7), Role::Topic).unwrap_err();
        assert!(e.to_string().contains("point-to-point"), "{e}");
        let mut odd = hello(7);
        odd[5] = 9;
        assert!(parse_hello_as(&odd, Role::Connection).is_err());
    }

    #[test]
    fn garbage_is_recognised_from_its_first_byte() {
        let good = hello(1);
        for n in 0..=HELLO_LEN {
            assert!(may_be_hello(&good[..n]), "{n} bytes of a good hello");
        }
        let mut newer = hello(1);
        newer[4] = PROTOCOL_VERSION + 1;
        assert!(
            may_be_hello(&newer),
            "another version is answered, not dropped"
        );
        assert!(!may_be_hello(b"G"));
        assert!(!may_be_hello(b"GET / HTTP/1.1\r\n"));
        assert!(!may_be_hello(b"SLN\0"));
    }
}
