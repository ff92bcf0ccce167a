//! One end of a connected pair, as the drivers see it: [`Endpoint`]s send and receive
//! messages, by copy or, through [`InPlace`], in the method's own buffers.

use std::io;

/// One end of a connected pair. Messages are opaque bytes; every message a run sends in
/// one direction has a length both ends know, so stream methods need no framing.
pub trait Endpoint {
    /// Sends all of `msg` as one message.
    fn send(&mut self, msg: &[u8]) -> io::Result<()>;
    /// Receives one message of exactly `buf.len()` bytes into `buf`; a message of another
    /// length is an error.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()>;
    /// The in-place interface, for methods measured in place (the bench's `-zc` rows,
    /// `shmlink pong`): the drivers then generate data messages straight into the
    /// method's buffer and check them where they arrived. Such an endpoint keeps message
    /// boundaries, which lets runs use messages shorter than a control tag
    /// ([`crate::protocol::MIN_SIZE`]).
    fn in_place(&mut self) -> Option<&mut dyn InPlace> {
        None
    }
    /// Tells the other end why this end gives up, where the method can carry a message of
    /// a length the run does not use (best effort; the default says nothing). The other
    /// end's receive then fails with that reason.
    fn tell_failure(&mut self, _reason: &str) {}
    /// Publishes what a batching endpoint held back of the messages it sent (the
    /// throughput driver calls it before it waits for an acknowledgement); the default
    /// sends every message at once and has nothing to do.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
    /// After this end failed: the reason the other end gave up, if it sent one that is
    /// still queued (looked for without waiting; what is queued may be consumed).
    fn peer_failure(&mut self) -> Option<String> {
        None
    }
}

/// Sending and receiving in the method's own buffers, without a copy.
pub trait InPlace {
    /// Sends one message of `len` bytes that `fill` writes in place.
    fn send_in_place(&mut self, len: usize, fill: &mut dyn FnMut(&mut [u8])) -> io::Result<()>;
    /// Receives one message and hands it to `read` where it lies; `read`'s error is
    /// returned after the message is released.
    fn recv_in_place(&mut self, read: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<()>;
}
