//! The kernel's TCP socket under a shm connection, used where the connection continues
//! over it (an exec on either side, `crate::exec`): sends, receives, its flags and
//! shutdowns. A leaf: it knows fds and the C library, nothing of the library's state.

use std::os::fd::RawFd;
use std::time::Instant;

use libc::c_int;

use crate::{errno, real};

/// Sets or clears O_NONBLOCK on the file behind `fd`.
pub(crate) fn set_nonblocking(fd: RawFd, on: bool) {
    // SAFETY: fcntl on an fd of ours.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    if fl >= 0 {
        let new = if on {
            fl | libc::O_NONBLOCK
        } else {
            fl & !libc::O_NONBLOCK
        };
        // SAFETY: as above.
        unsafe { real::fcntl(fd, libc::F_SETFL, new as usize) };
    }
}

/// Gives TCP socket `tcp` the shutdowns the program made on the shm connection
/// (`rd_shut`, `wr_shut`: its FIN, after the bytes sent again).
pub(crate) fn shut_like(tcp: RawFd, rd_shut: bool, wr_shut: bool) {
    let how = match (rd_shut, wr_shut) {
        (true, true) => libc::SHUT_RDWR,
        (false, true) => libc::SHUT_WR,
        (true, false) => libc::SHUT_RD,
        (false, false) => return,
    };
    // SAFETY: shutdown on our TCP socket.
    unsafe { real::shutdown(tcp, how) };
}

/// Sends all of `buf` on TCP socket `fd` before `deadline` (waiting for room).
pub(crate) fn send_all(fd: RawFd, mut buf: &[u8], deadline: Instant) -> Result<(), c_int> {
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for its length.
        let r = unsafe {
            real::send(
                fd,
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if r > 0 {
            buf = &buf[r as usize..];
            continue;
        }
        let e = errno();
        if r < 0 && (e == libc::EAGAIN || e == libc::EINTR) && Instant::now() < deadline {
            real::poll_one(fd, libc::POLLOUT, 50);
            continue;
        }
        return Err(if r < 0 { e } else { libc::EPIPE });
    }
    Ok(())
}

/// A read on a connection the peer moved to TCP: the kernel's, with the call's
/// `MSG_PEEK`, `MSG_DONTWAIT`, `MSG_WAITALL` (`flags`).
pub(crate) fn recv(fd: RawFd, dst: &mut [u8], flags: c_int) -> Result<usize, c_int> {
    loop {
        // SAFETY: `dst` is valid for its length.
        let r = unsafe { real::recv(fd, dst.as_mut_ptr().cast(), dst.len(), flags) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

/// A write on a connection the peer moved to TCP (`flags`: MSG_DONTWAIT or 0). SIGPIPE
/// is the caller's (it raises it on EPIPE as for a shm connection).
pub(crate) fn send(fd: RawFd, src: &[u8], flags: c_int) -> Result<usize, c_int> {
    loop {
        // SAFETY: `src` is valid for its length.
        let r = unsafe {
            real::send(
                fd,
                src.as_ptr().cast(),
                src.len(),
                flags | libc::MSG_NOSIGNAL,
            )
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}
