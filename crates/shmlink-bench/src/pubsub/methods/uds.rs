//! `uds`: one Unix `SOCK_SEQPACKET` socket pair per subscriber; the publisher sends each
//! message on every one of them in turn (the kernel copies it once per subscriber), and
//! a subscriber polls with `MSG_DONTWAIT` for a moment, then blocks in `recv`.
//!
//! A message must fit in the send buffer (`len <= SO_SNDBUF - 32`); the sockets ask for
//! 4 MiB (the kernel caps it at `net.core.wmem_max` and doubles it).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use super::super::{Ctx, Method, Prepared, Publish, Receive, SizeLimit};
use super::spin_then_block;
use crate::method::arg;
use crate::sys::{ctx, err, getsockopt_int, inherited_fd, setsockopt_int, socketpair, syscall};

/// Send and receive buffer asked for.
const BUF: i32 = 4 << 20;

pub struct Uds;

fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (a, b) = socketpair(libc::SOCK_SEQPACKET)?;
    for fd in [&a, &b] {
        for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
            setsockopt_int(fd, libc::SOL_SOCKET, opt, BUF)
                .map_err(ctx("setsockopt(SO_SNDBUF/SO_RCVBUF)"))?;
        }
    }
    Ok((a, b))
}

struct Pub {
    socks: Vec<OwnedFd>,
}

impl Publish for Pub {
    fn publish(&mut self, msg: &[u8]) -> io::Result<()> {
        for (i, s) in self.socks.iter().enumerate() {
            // SAFETY: `msg` is valid for reads of its length.
            let n = syscall!(send(
                s.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                libc::MSG_NOSIGNAL
            ))
            .map_err(ctx(format!("send to subscriber {i}")))?;
            if n as usize != msg.len() {
                return Err(err(format!("sent {n} of {} bytes", msg.len())));
            }
        }
        Ok(())
    }
}

struct Sub {
    sock: OwnedFd,
    buf: Vec<u8>,
    spin: Duration,
}

/// One `recv` into `buf` with `flags`; `None` if it would block.
fn recv(sock: &OwnedFd, buf: &mut [u8], flags: libc::c_int) -> io::Result<Option<usize>> {
    // SAFETY: `buf` is valid for writes of its length.
    match syscall!(recv(
        sock.as_raw_fd(),
        buf.as_mut_ptr().cast(),
        buf.len(),
        flags | libc::MSG_TRUNC
    )) {
        Ok(0) => Err(io::ErrorKind::UnexpectedEof.into()),
        Ok(n) if n as usize > buf.len() => Err(err(format!(
            "a {n}-byte message, more than the {} expected",
            buf.len()
        ))),
        Ok(n) => Ok(Some(n as usize)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

impl Receive for Sub {
    fn recv(&mut self, read: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<()> {
        let n = spin_then_block(
            self.spin,
            self,
            |s| recv(&s.sock, &mut s.buf, libc::MSG_DONTWAIT),
            |s| recv(&s.sock, &mut s.buf, 0).map(|n| n.unwrap_or(0)),
        )?;
        read(&self.buf[..n])
    }
}

impl Method for Uds {
    fn name(&self) -> &'static str {
        "uds"
    }

    fn about(&self) -> &'static str {
        "one AF_UNIX SOCK_SEQPACKET socket pair per subscriber; the publisher sends to each"
    }

    fn size_limit(&self) -> Option<SizeLimit> {
        let (a, _b) = pair().ok()?;
        let sndbuf = getsockopt_int(&a, libc::SOL_SOCKET, libc::SO_SNDBUF).ok()?;
        Some(SizeLimit {
            max: (sndbuf as usize).saturating_sub(32),
            why: "SO_SNDBUF - 32 (net.core.wmem_max)",
        })
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        let mut socks = Vec::new();
        let mut args = Vec::new();
        let mut inherit = Vec::new();
        for _ in 0..c.subscribers {
            let (mine, theirs) = pair()?;
            socks.push(mine);
            args.push(vec![theirs.as_raw_fd().to_string()]);
            inherit.push(vec![theirs]);
        }
        Ok(Prepared {
            args,
            inherit,
            finish: Box::new(move |_| Ok(Box::new(Pub { socks }) as Box<dyn Publish>)),
        })
    }

    fn subscribe(&self, c: &Ctx, args: &[String]) -> io::Result<Box<dyn Receive>> {
        let sock = inherited_fd(arg(args, 0, "socket fd")?)?;
        Ok(Box::new(Sub {
            sock,
            buf: vec![0u8; c.size],
            spin: c.spin,
        }))
    }
}
