//! Endpoints over file descriptors: a byte stream (pipes, FIFOs, stream sockets) and a
//! message socket (seqpacket and datagram sockets).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};

use crate::method::Endpoint;
use crate::sys::{err, syscall};

/// A byte stream: `send` writes the whole message, `recv` reads exactly the expected
/// length (both ends know it, so no framing is added).
pub struct StreamEnd {
    rx: File,
    tx: File,
}

impl StreamEnd {
    /// Reads from `rx`, writes to `tx` (the same fd twice for a socket).
    pub fn new(rx: OwnedFd, tx: OwnedFd) -> StreamEnd {
        StreamEnd {
            rx: File::from(rx),
            tx: File::from(tx),
        }
    }

    /// One bidirectional fd (a stream socket).
    pub fn socket(fd: OwnedFd) -> io::Result<StreamEnd> {
        let tx = fd.try_clone()?;
        Ok(StreamEnd::new(fd, tx))
    }
}

impl Endpoint for StreamEnd {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        self.tx.write_all(msg)
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.rx.read_exact(buf)
    }
}

/// A message socket: one `send(2)` per message; `recv(2)` with `MSG_TRUNC` so a message
/// of the wrong length is noticed, not silently cut.
pub struct MsgEnd {
    fd: OwnedFd,
}

impl MsgEnd {
    pub fn new(fd: OwnedFd) -> MsgEnd {
        MsgEnd { fd }
    }
}

impl Endpoint for MsgEnd {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        // SAFETY: `msg` is valid for reads of its length.
        let n = syscall!(send(
            self.fd.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            libc::MSG_NOSIGNAL
        ))?;
        if n as usize != msg.len() {
            return Err(err(format!("sent {n} of {} bytes", msg.len())));
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        // SAFETY: `buf` is valid for writes of its length.
        let n = syscall!(recv(
            self.fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_TRUNC
        ))?;
        match n as usize {
            0 if !buf.is_empty() => Err(io::ErrorKind::UnexpectedEof.into()),
            n if n == buf.len() => Ok(()),
            n => Err(err(format!(
                "received a {n}-byte message, expected {} bytes",
                buf.len()
            ))),
        }
    }
}
