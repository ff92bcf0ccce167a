//! `uds-stream`, `uds-seqpacket`, `uds-dgram`: a connected pair of Unix domain sockets
//! (socketpair), one end inherited by the peer.
//!
//! Seqpacket and datagram sockets carry a message only if it fits the send buffer
//! (`len <= SO_SNDBUF - 32` in `unix_dgram_sendmsg`); both get a send buffer of
//! [`MSG_SNDBUF`] (the kernel caps it at `net.core.wmem_max` and doubles it).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use super::fdio::{MsgEnd, StreamEnd};
use crate::method::{arg, Ctx, Endpoint, Method, Prepared, SizeLimit};
use crate::sys::{ctx, getsockopt_int, inherited_fd, setsockopt_int, socketpair};

/// Send (and receive) buffer asked for on message sockets.
const MSG_SNDBUF: i32 = 4 << 20;

pub struct Uds {
    name: &'static str,
    ty: libc::c_int,
}

pub const STREAM: Uds = Uds {
    name: "uds-stream",
    ty: libc::SOCK_STREAM,
};
pub const SEQPACKET: Uds = Uds {
    name: "uds-seqpacket",
    ty: libc::SOCK_SEQPACKET,
};
pub const DGRAM: Uds = Uds {
    name: "uds-dgram",
    ty: libc::SOCK_DGRAM,
};

impl Uds {
    fn pair(&self) -> io::Result<(OwnedFd, OwnedFd)> {
        let (a, b) = socketpair(self.ty)?;
        if self.ty != libc::SOCK_STREAM {
            for fd in [&a, &b] {
                for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
                    setsockopt_int(fd, libc::SOL_SOCKET, opt, MSG_SNDBUF)
                        .map_err(ctx("setsockopt(SO_SNDBUF/SO_RCVBUF)"))?;
                }
            }
        }
        Ok((a, b))
    }

    fn end(&self, fd: OwnedFd) -> io::Result<Box<dyn Endpoint>> {
        Ok(if self.ty == libc::SOCK_STREAM {
            Box::new(StreamEnd::socket(fd)?)
        } else {
            Box::new(MsgEnd::new(fd))
        })
    }
}

impl Method for Uds {
    fn name(&self) -> &'static str {
        self.name
    }

    fn about(&self) -> &'static str {
        match self.ty {
            libc::SOCK_STREAM => "AF_UNIX SOCK_STREAM socketpair, read/write",
            libc::SOCK_SEQPACKET => "AF_UNIX SOCK_SEQPACKET socketpair, send/recv",
            _ => "AF_UNIX SOCK_DGRAM socketpair, send/recv",
        }
    }

    fn size_limit(&self) -> Option<SizeLimit> {
        if self.ty == libc::SOCK_STREAM {
            return None;
        }
        let (a, _b) = self.pair().ok()?;
        let sndbuf = getsockopt_int(&a, libc::SOL_SOCKET, libc::SO_SNDBUF).ok()?;
        Some(SizeLimit {
            max: (sndbuf as usize).saturating_sub(32),
            why: "SO_SNDBUF - 32 (net.core.wmem_max)",
        })
    }

    fn prepare(&self, _c: &Ctx) -> io::Result<Prepared> {
        let (mine, theirs) = self.pair()?;
        let args = vec![theirs.as_raw_fd().to_string()];
        let end = self.end(mine)?;
        Ok(Prepared {
            args,
            inherit: vec![theirs],
            finish: Box::new(move || Ok(end)),
        })
    }

    fn connect(&self, _c: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        self.end(inherited_fd(arg(args, 0, "socket fd")?)?)
    }
}
