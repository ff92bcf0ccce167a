//! The shmlink [`Endpoint`]: a [`Connection`] as the drivers see it, in one of three
//! [`Access`] ways, and the failure notice a giving-up end sends over it.

use std::io;

use shmlink::{Connection, ErrorKind, RecvBuf};

use crate::endpoint::{Endpoint, InPlace};
use crate::sys::err;

/// The first bytes of a failure notice (the reason follows as UTF-8). No data message,
/// control message or ack of a run starts with them: as a little-endian `u64` they are
/// far above any sequence number or count and below the control tags.
pub const FAILURE_TAG: &[u8; 8] = b"PEERFAIL";
/// Longest reason sent in a failure notice.
const MAX_REASON: usize = 4096;
/// Most queued messages [`Endpoint::peer_failure`] looks through.
const PEEK_LIMIT: usize = 4096;

/// How an endpoint moves messages between the drivers and the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// `send` and `recv`, which copy, like every other IPC method.
    Copy,
    /// `reserve`/`commit` and `recv_ref`: written in place; read in place when the
    /// message is in this process's memory, else copied once into a scratch buffer
    /// first, because the peer could change it while it is read (see
    /// [`shmlink::SharedBytes`]); [`ShmlinkEndpoint::trusting`] reads it where it lies.
    InPlace,
}

/// A [`Connection`] as an [`Endpoint`].
pub struct ShmlinkEndpoint {
    conn: Connection,
    access: Access,
    /// In place, a message in the peer's shared ring is read where it lies (made only by
    /// the `unsafe` [`ShmlinkEndpoint::trusting`]).
    trusting: bool,
    /// `InPlace`: the copy of a message in the peer's memory.
    scratch: Vec<u8>,
    /// The connection stays inside a batch ([`Connection::begin_batch`]): what it sends
    /// is published by [`Endpoint::flush`] or before any wait.
    batching: bool,
}

/// The reason of failure notice `msg`, if it is one.
pub fn failure_reason(msg: &[u8]) -> Option<String> {
    let reason = msg.strip_prefix(FAILURE_TAG)?;
    Some(String::from_utf8_lossy(&reason[..reason.len().min(MAX_REASON)]).into_owned())
}

/// The bytes of a failure notice with `reason` (cut to at most 4 KiB).
pub fn failure_notice(reason: &str) -> Vec<u8> {
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    [FAILURE_TAG.as_slice(), &reason.as_bytes()[..end]].concat()
}

/// The error a received failure notice becomes.
fn peer_failed(reason: String) -> io::Error {
    err(format!("peer failed: {reason}"))
}

fn io_err(e: shmlink::Error) -> io::Error {
    let kind = match e.kind() {
        ErrorKind::WouldBlock => io::ErrorKind::WouldBlock,
        ErrorKind::TimedOut => io::ErrorKind::TimedOut,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e.to_string())
}

fn wrong_length(n: usize, want: usize) -> io::Error {
    err(format!(
        "received a {n}-byte message, expected {want} bytes"
    ))
}

impl ShmlinkEndpoint {
    /// `conn`, moving messages as `access` says.
    pub fn new(conn: Connection, access: Access) -> ShmlinkEndpoint {
        ShmlinkEndpoint {
            conn,
            access,
            trusting: false,
            scratch: Vec::new(),
            batching: false,
        }
    }

    /// `conn`, read in place even where a message lies in the peer's shared ring (the
    /// bench's zero-copy row, which measures that read).
    ///
    /// # Safety
    ///
    /// The peer must leave every record it committed alone until this end has released
    /// it, which it does before the next receive; in particular it must be the same
    /// program as this one (the bench's driver and peer), never a process that might
    /// write what it sent. Otherwise safe code would read bytes that change under it.
    pub unsafe fn trusting(conn: Connection) -> ShmlinkEndpoint {
        ShmlinkEndpoint {
            conn,
            access: Access::InPlace,
            trusting: true,
            scratch: Vec::new(),
            batching: false,
        }
    }

    /// Keeps the connection inside a batch ([`Connection::begin_batch`]): messages are
    /// published together by [`Endpoint::flush`] (or before the connection waits),
    /// the bench's `-batch` rows.
    pub fn batched(mut self) -> ShmlinkEndpoint {
        self.conn.begin_batch();
        self.batching = true;
        self
    }

    /// The connection, for what a run does around the drivers (a handshake, a report).
    pub fn conn(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The connection back.
    pub fn into_inner(self) -> Connection {
        self.conn
    }
}

/// Runs `read` over received `msg`, after turning a failure notice into its error: in
/// place, or over a copy in `scratch` where the message lies in the peer's memory and
/// the peer is not `trusting`'s.
fn read_msg(
    trusting: bool,
    scratch: &mut Vec<u8>,
    msg: &RecvBuf<'_>,
    read: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let bytes = msg.bytes();
    let local = if trusting {
        // SAFETY: `ShmlinkEndpoint::trusting`'s contract: the peer leaves the record alone
        // until it is released, which happens after `read` returns (`msg` outlives this
        // call).
        Some(unsafe { bytes.as_slice() })
    } else {
        bytes.as_local()
    };
    let msg = match local {
        Some(local) => local,
        None => {
            scratch.resize(bytes.len(), 0);
            bytes.copy_to(scratch);
            scratch
        }
    };
    if let Some(reason) = failure_reason(msg) {
        return Err(peer_failed(reason));
    }
    read(msg)
}

impl Endpoint for ShmlinkEndpoint {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        self.conn.send(msg).map_err(io_err)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.batching {
            self.conn.end_batch();
            self.conn.begin_batch();
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if self.access == Access::InPlace {
            let want = buf.len();
            return self.recv_in_place(&mut |msg| {
                if msg.len() != want {
                    return Err(wrong_length(msg.len(), want));
                }
                buf.copy_from_slice(msg);
                Ok(())
            });
        }
        match self.conn.recv(buf) {
            Ok(n) if n == buf.len() => Ok(()),
            Ok(n) => {
                Err(failure_reason(&buf[..n])
                    .map_or_else(|| wrong_length(n, buf.len()), peer_failed))
            }
            // Still queued: a failure notice says more than its length.
            Err(e) if e.kind() == ErrorKind::MessageTooLarge => match self.conn.recv_vec() {
                Ok(msg) => Err(failure_reason(&msg).map_or_else(|| io_err(e), peer_failed)),
                Err(_) => Err(io_err(e)),
            },
            Err(e) => Err(io_err(e)),
        }
    }

    fn in_place(&mut self) -> Option<&mut dyn InPlace> {
        match self.access {
            Access::Copy => None,
            Access::InPlace => Some(self),
        }
    }

    fn tell_failure(&mut self, reason: &str) {
        let _ = self.conn.send(&failure_notice(reason));
    }

    fn peer_failure(&mut self) -> Option<String> {
        self.conn.set_nonblocking(true);
        let mut found = None;
        for _ in 0..PEEK_LIMIT {
            let Ok(msg) = self.conn.recv_vec() else {
                break;
            };
            found = failure_reason(&msg);
            if found.is_some() {
                break;
            }
        }
        self.conn.set_nonblocking(false);
        found
    }
}

impl InPlace for ShmlinkEndpoint {
    fn send_in_place(&mut self, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> io::Result<()> {
        let mut buf = self.conn.reserve(len).map_err(io_err)?;
        fill(&mut buf);
        buf.commit().map_err(io_err)
    }

    fn recv_in_place(&mut self, read: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<()> {
        let msg = self.conn.recv_ref().map_err(io_err)?;
        read_msg(self.trusting, &mut self.scratch, &msg, read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_notice_carries_its_reason() {
        let notice = failure_notice("message #3 failed");
        assert!(notice.starts_with(FAILURE_TAG));
        assert_eq!(
            failure_reason(&notice).as_deref(),
            Some("message #3 failed")
        );
        assert_eq!(failure_reason(&7u64.to_le_bytes()), None, "an ack");
        assert_eq!(failure_reason(b"PEERFAI"), None, "too short");
    }

    #[test]
    fn a_long_reason_is_cut_at_a_char_boundary() {
        let long = "é".repeat(3000); // 6000 bytes
        let reason = failure_reason(&failure_notice(&long)).unwrap();
        assert!(reason.len() <= MAX_REASON && reason.len() >= MAX_REASON - 1);
        assert!(reason.chars().all(|c| c == 'é'));
    }

    #[test]
    fn no_data_message_or_control_tag_looks_like_a_notice() {
        let tag = u64::from_le_bytes(*FAILURE_TAG);
        assert!(tag > 1 << 62, "above any sequence number or count");
        assert!(tag < crate::protocol::FLUSH, "below the control tags");
    }
}
