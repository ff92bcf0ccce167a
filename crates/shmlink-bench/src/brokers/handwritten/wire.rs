//! One TCP connection to a broker with an input buffer: the parsers in [`super::resp`] and
//! [`super::frame`] look at [`Wire::data`], say how much they used, and ask for more.

use std::io::{self, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How much one `read` asks for at least.
const READ_CHUNK: usize = 256 * 1024;

/// A connected stream, the bytes read but not yet consumed, and whether the stream is in
/// non-blocking mode.
pub(crate) struct Wire {
    stream: TcpStream,
    peer: SocketAddr,
    /// Which broker, for error messages ("redis", "rabbitmq").
    broker: &'static str,
    /// `buf[start..end]` is read and not consumed; `buf[end..]` is initialised spare room
    /// (the vector never shrinks, so no read zeroes memory again).
    buf: Vec<u8>,
    start: usize,
    end: usize,
    nonblocking: bool,
}

impl Wire {
    /// Connects to `peer` (giving up after `timeout`) with `TCP_NODELAY`.
    pub(crate) fn connect(
        peer: SocketAddr,
        broker: &'static str,
        timeout: Duration,
    ) -> io::Result<Wire> {
        let stream = TcpStream::connect_timeout(&peer, timeout)
            .map_err(|e| io::Error::new(e.kind(), format!("{broker}: connect to {peer}: {e}")))?;
        stream.set_nodelay(true)?;
        Ok(Wire {
            stream,
            peer,
            broker,
            buf: Vec::new(),
            start: 0,
            end: 0,
            nonblocking: false,
        })
    }

    pub(crate) fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// The bytes read and not yet consumed.
    pub(crate) fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Marks the first `n` bytes of [`data`](Self::data) as used.
    pub(crate) fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.end - self.start);
        self.start += n.min(self.end - self.start);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// A protocol violation, naming the broker and its address.
    pub(crate) fn invalid(&self, what: impl std::fmt::Display) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} at {}: {what}", self.broker, self.peer),
        )
    }

    /// Puts the broker, its address and `what` in front of `e`.
    pub(crate) fn context(&self, what: &str, e: io::Error) -> io::Error {
        io::Error::new(
            e.kind(),
            format!("{} at {}: {what}: {e}", self.broker, self.peer),
        )
    }

    /// Reads once (at least one byte) and appends to [`data`](Self::data). In non-blocking
    /// mode, `WouldBlock` when nothing is there; the end of the stream is `UnexpectedEof`.
    pub(crate) fn fill(&mut self) -> io::Result<()> {
        if self.start > 0 && self.buf.len() - self.end < READ_CHUNK {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < READ_CHUNK {
            self.buf.resize(self.end + READ_CHUNK, 0);
        }
        loop {
            match self.stream.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    let partial = if self.end > self.start {
                        " in the middle of a message"
                    } else {
                        ""
                    };
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "{} at {} closed the connection{partial}",
                            self.broker, self.peer
                        ),
                    ));
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Nothing there in non-blocking mode: the plain error, no message to format.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.nonblocking => {
                    return Err(e);
                }
                // A read timeout passed (Linux reports EAGAIN).
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(self.context("read timed out", e));
                }
                Err(e) => return Err(self.context("read", e)),
            }
        }
    }

    /// Like [`fill`](Self::fill) but never blocks: `Ok(false)` when nothing is readable.
    pub(crate) fn try_fill(&mut self) -> io::Result<bool> {
        let was_blocking = !self.nonblocking;
        if was_blocking {
            self.set_nonblocking(true)?;
        }
        let res = self.fill();
        if was_blocking {
            self.set_nonblocking(false)?;
        }
        match res {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn set_nonblocking(&mut self, nonblocking: bool) -> io::Result<()> {
        self.stream.set_nonblocking(nonblocking)?;
        self.nonblocking = nonblocking;
        Ok(())
    }

    pub(crate) fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.stream.set_read_timeout(timeout)
    }

    /// Writes all of `bufs`. Publishers' streams stay blocking; a subscriber writes only
    /// while connecting (blocking) and in best-effort replies to a close, where a
    /// `WouldBlock` of a non-blocking stream is ignored.
    pub(crate) fn write_all(&mut self, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        // Skip leading empty slices so that `write_vectored` returning 0 means a real
        // failure.
        IoSlice::advance_slices(&mut bufs, 0);
        while !bufs.is_empty() {
            match self.stream.write_vectored(bufs) {
                Ok(0) => {
                    return Err(self.context("write", io::ErrorKind::WriteZero.into()));
                }
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.context("write", e)),
            }
        }
        Ok(())
    }
}
