//! What the socket transports (`ux:`, `tcp:`, `tls:`) share: the hello exchanged on
//! connect, the connection state machine, and the listener with its handshake queue.
//!
//! A transport supplies a [`Link`] (the connected socket, or a TLS session on one), a
//! [`Wire`] (how a frame is written to the link and how frames are read back) and an
//! [`Acceptor`] (how the listening socket hands out clients). Every wire carries the same
//! two frame kinds: data (one message of any length up to the receiver's maximum, zero
//! included) and FIN, which a graceful close sends last.
//!
//! | file             | what it holds                                                     |
//! |------------------|-------------------------------------------------------------------|
//! | `mod.rs`         | the [`Link`] and [`Wire`] traits, frame kinds, buffer helpers     |
//! | `hello.rs`       | the hello: its format, its checks, the client's handshake         |
//! | `conn.rs`        | [`FramedConn`]: sending, receiving, readiness, closing            |
//! | `listener.rs`    | `ServerHandshake`, [`FramedListener`] and its [`Acceptor`]        |
//! | `conformance.rs` | the behaviour every framed transport must show (test bodies)      |
//!
//! # Handshake
//!
//! Right after connecting — and, on `tls:`, after the TLS handshake, which the link runs
//! first ([`Link::handshake`]) — the client sends a [`HELLO_LEN`]-byte hello: the magic
//! `SLNK`, the protocol version, three reserved bytes, and the largest message it accepts
//! (`u64`, little-endian). The listener answers with its own hello once the client's is
//! valid (also when only the version differs, so the client can report the mismatch);
//! clients that send anything else, fail the link's handshake, or complete neither within
//! the handshake timeout, are dropped without an answer while the listener goes on serving
//! others. Each side then sends messages up to the smaller of the two maxima.
//!
//! # End of stream
//!
//! The receiver reports every message sent before a FIN, then [`ErrorKind::EndOfStream`];
//! end of stream or `ECONNRESET` without a FIN means the peer died
//! ([`ErrorKind::ConnectionReset`]).
//!
//! Closing never blocks. It writes what the socket takes at once; when the peer's full
//! buffers leave part of a queued message or the FIN (or, on `tls:`, encrypted records)
//! unwritten, a short-lived thread writes the rest (as the kernel does for a closed TCP
//! socket) and gives up after [`CLOSE_LINGER`](crate::transport::CLOSE_LINGER) without progress. A
//! process that exits right after closing can lose that rest, and its peer then sees a
//! reset.
//!
//! # Readiness
//!
//! The descriptor a connection exposes is a private epoll set. It holds the socket for
//! input always, the socket for output while bytes wait in user space for room in the
//! socket (the rest of a message a non-blocking send accepted, or TLS records), and an
//! eventfd that is set while input waits in user space: complete frames (a stream read can
//! return several) or, on `tls:`, decrypted bytes the socket's readiness cannot announce.
//! So it is readable exactly when a call may make progress.
//!
//! [`ErrorKind::EndOfStream`]: crate::error::ErrorKind::EndOfStream
//! [`ErrorKind::ConnectionReset`]: crate::error::ErrorKind::ConnectionReset

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::sys::stream;

#[cfg(test)]
pub(crate) mod conformance;
mod conn;
mod hello;
mod listener;

#[cfg(test)]
pub(crate) use conn::close_threads;
pub(crate) use conn::FramedConn;
pub(crate) use hello::{client_handshake, HELLO_LEN};
#[cfg(all(test, feature = "tls"))]
pub(crate) use listener::ServerHandshake;
pub(crate) use listener::{Acceptor, FramedListener};

/// Vectors larger than this are freed after use instead of kept for the next message.
const RETAIN_MAX: usize = 4 << 20;

/// The kind of a frame being written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// One message.
    Data,
    /// The sender closes gracefully; nothing follows.
    Fin,
}

/// What one attempt to receive found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// A whole message of this length is current.
    Message(usize),
    /// The peer's FIN.
    Fin,
    /// The socket's end of stream (not preceded by a FIN).
    Eof,
    /// Nothing yet (non-blocking).
    Empty,
}

/// What a wire's frames travel over: a connected socket, or a TLS session on one.
///
/// A plain socket ([`OwnedFd`]) passes bytes straight to the kernel. A TLS link keeps
/// some of them in user space: records it encrypted but the socket had no room for
/// ([`pending_output`](Link::pending_output)) and bytes it decrypted that nobody read yet
/// ([`buffered_input`](Link::buffered_input)); the connection watches both so that its
/// descriptor stays truthful.
pub(crate) trait Link: Send + Sized + 'static {
    /// The socket underneath.
    fn sock(&self) -> BorrowedFd<'_>;
    /// Advances a handshake that runs below the hello (TLS) without blocking; true once
    /// it is complete. Errors end the connection: `PermissionDenied` when the peer's
    /// certificate was refused or ours was, `InvalidData` when the peer broke the
    /// protocol.
    fn handshake(&mut self) -> io::Result<bool> {
        Ok(true)
    }
    /// Sends `head`, then `body` (one packet on a packet socket). Returns the number of
    /// bytes taken; in blocking mode they are in the kernel when this returns.
    fn send_parts(&mut self, head: &[u8], body: &[u8], blocking: bool) -> io::Result<usize>;
    /// Receives up to `max` bytes of a stream into `buf`'s spare capacity. Returns the
    /// number of bytes appended; 0 is end of stream.
    fn recv_append(&mut self, buf: &mut Vec<u8>, max: usize, blocking: bool) -> io::Result<usize>;
    /// Whether bytes an earlier send took still wait in user space for room in the socket.
    fn pending_output(&self) -> bool {
        false
    }
    /// Writes what waits in user space. Returns true when nothing is left.
    fn flush(&mut self, _blocking: bool) -> io::Result<bool> {
        Ok(true)
    }
    /// Whether received input waits in user space, where the socket's readiness cannot
    /// announce it.
    fn buffered_input(&self) -> bool {
        false
    }
    /// Ends the sending direction after the FIN frame (TLS: queues `close_notify`).
    fn close_notify(&mut self) {}
    /// A link that carries on this one's sending in another thread (a closing connection
    /// hands its unwritten rest to it); this one is not used for I/O again.
    fn detach(&mut self) -> io::Result<Self>;
}

impl Link for OwnedFd {
    fn sock(&self) -> BorrowedFd<'_> {
        self.as_fd()
    }

    fn send_parts(&mut self, head: &[u8], body: &[u8], blocking: bool) -> io::Result<usize> {
        stream::send_parts(self.as_fd(), head, body, blocking)
    }

    fn recv_append(&mut self, buf: &mut Vec<u8>, max: usize, blocking: bool) -> io::Result<usize> {
        stream::recv_append(self.as_fd(), buf, max, blocking)
    }

    fn detach(&mut self) -> io::Result<OwnedFd> {
        self.try_clone()
    }
}

/// How a transport puts frames on its link and takes them off.
///
/// Errors of kind `InvalidData` mean the peer broke the protocol; the connection reports
/// them as [`ErrorKind::ProtocolViolation`].
///
/// [`ErrorKind::ProtocolViolation`]: crate::error::ErrorKind::ProtocolViolation
pub(crate) trait Wire: Send + Sized + 'static {
    /// What the frames travel over.
    type Link: Link;
    /// A receiver that accepts messages up to `max_recv` bytes.
    fn new(max_recv: usize) -> Self;
    /// Writes one frame from `*sent` (bytes of the frame already written) on, advancing
    /// `*sent`. Returns true when the frame is complete, false when a non-blocking write
    /// found the link full.
    fn write(
        link: &mut Self::Link,
        frame: Frame,
        payload: &[u8],
        sent: &mut usize,
        blocking: bool,
    ) -> io::Result<bool>;
    /// Reads until a message is complete (it becomes current), a FIN or end of stream
    /// arrives, or (non-blocking) the link has nothing more. Not called while a message
    /// is current.
    fn read(&mut self, link: &mut Self::Link, blocking: bool) -> io::Result<Incoming>;
    /// The current message.
    fn current(&self) -> &[u8];
    /// Consumes the current message.
    fn release(&mut self);
    /// Consumes the current message, handing it over without a copy where possible.
    fn take_current(&mut self) -> Vec<u8>;
    /// Whether a whole frame beyond the current message waits in the wire's buffer,
    /// where the socket's readiness cannot announce it.
    fn buffered(&self) -> bool {
        false
    }
    /// Reads part of a hello without blocking, appending to `got` (never beyond
    /// [`HELLO_LEN`]). Returns the bytes read, 0 at end of stream.
    fn recv_hello(link: &mut Self::Link, got: &mut Vec<u8>) -> io::Result<usize>;
}

/// An error of kind `InvalidData`: the peer broke the protocol (see [`Wire`]).
pub(crate) fn bad_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Clears `v` for reuse, freeing it if it grew large.
pub(crate) fn recycle(v: &mut Vec<u8>) {
    v.clear();
    if v.capacity() > RETAIN_MAX {
        *v = Vec::new();
    }
}

/// Hands over the message in `v`: moves the vector when the message fills at least half
/// of it, copies it otherwise (and keeps the larger buffer for the next message).
pub(crate) fn take_vec(v: &mut Vec<u8>) -> Vec<u8> {
    if v.len() * 2 >= v.capacity() {
        std::mem::take(v)
    } else {
        let out = v.to_vec();
        recycle(v);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_vec_moves_full_buffers_and_copies_small_ones() {
        let mut v = Vec::with_capacity(100);
        v.extend_from_slice(&[1; 60]);
        let ptr = v.as_ptr();
        let taken = take_vec(&mut v);
        assert_eq!(taken.as_ptr(), ptr);
        assert_eq!(v.capacity(), 0);
        let mut v = Vec::with_capacity(100);
        v.extend_from_slice(&[1; 10]);
        assert_eq!(take_vec(&mut v), [1; 10]);
        assert!(v.is_empty() && v.capacity() >= 100);
    }
}
