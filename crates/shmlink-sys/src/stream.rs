//! Socket I/O for the framed transports (`ux:`, `tcp:`, `tls:`): gather writes, reads straight into
//! a vector's spare capacity, readiness waits, and the eventfd flag that keeps a
//! connection's pollable fd readable while frames wait in user space.
//!
//! The sockets are kept in blocking mode; each call says whether it may block, and
//! non-blocking calls pass `MSG_DONTWAIT`. A blocking message exchange thus costs one
//! system call per side, and a blocked call returns as soon as the peer dies. Sends never
//! raise SIGPIPE (`MSG_NOSIGNAL`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use crate::{poll_fd, syscall, Interest};

fn dontwait(blocking: bool) -> libc::c_int {
    if blocking {
        0
    } else {
        libc::MSG_DONTWAIT
    }
}

/// Clears `O_NONBLOCK`, so calls without `MSG_DONTWAIT` wait in the kernel.
pub fn set_blocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain integer arguments on an open descriptor.
    let flags = syscall!(fcntl(fd.as_raw_fd(), libc::F_GETFL))?;
    if flags & libc::O_NONBLOCK != 0 {
        // SAFETY: plain integer arguments on an open descriptor.
        syscall!(fcntl(
            fd.as_raw_fd(),
            libc::F_SETFL,
            flags & !libc::O_NONBLOCK
        ))?;
    }
    Ok(())
}

/// Clears `O_NONBLOCK` on a socket whose only status flag is `O_NONBLOCK` (one made with
/// `SOCK_NONBLOCK` and never changed since): one `fcntl`, where [`set_blocking`] needs
/// two.
pub fn set_blocking_fresh(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain integer arguments on an open descriptor. F_SETFL ignores the access
    // mode; the caller knows there is no other status flag to keep.
    syscall!(fcntl(fd.as_raw_fd(), libc::F_SETFL, 0))?;
    Ok(())
}

/// Sends `head` followed by `body` with one `sendmsg` (one packet on a packet socket).
/// Returns the number of bytes the kernel took (all of them on a packet socket).
pub fn send_parts(
    sock: BorrowedFd<'_>,
    head: &[u8],
    body: &[u8],
    blocking: bool,
) -> io::Result<usize> {
    send_vectored(
        sock,
        &[io::IoSlice::new(head), io::IoSlice::new(body)],
        blocking,
    )
}

/// Sends the buffers in order with one `sendmsg`. Returns the number of bytes the kernel
/// took.
pub fn send_vectored(
    sock: BorrowedFd<'_>,
    bufs: &[io::IoSlice<'_>],
    blocking: bool,
) -> io::Result<usize> {
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // `IoSlice` is guaranteed to be ABI-compatible with `iovec` on Unix.
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len().min(libc::UIO_MAXIOV as usize);
    loop {
        // SAFETY: `msg` points at `msg_iovlen` iovecs (the caller's IoSlices) describing
        // live, readable buffers of the lengths they declare; the kernel only reads them.
        match syscall!(sendmsg(
            sock.as_raw_fd(),
            &msg,
            libc::MSG_NOSIGNAL | dontwait(blocking)
        )) {
            Ok(n) => return Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Receives up to `buf.len()` bytes from a stream socket into `buf`. Returns the number of
/// bytes received; 0 is end of stream.
pub fn recv_into(sock: BorrowedFd<'_>, buf: &mut [u8], blocking: bool) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is a valid writable buffer of its length.
        match syscall!(recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            dontwait(blocking)
        )) {
            Ok(n) => return Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Receives up to `max` bytes from a stream socket, appending them to `buf` (at most its
/// spare capacity). Returns the number of bytes appended; 0 is end of stream.
pub fn recv_append(
    sock: BorrowedFd<'_>,
    buf: &mut Vec<u8>,
    max: usize,
    blocking: bool,
) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    let len = spare.len().min(max);
    let n = loop {
        // SAFETY: `spare` is writable memory of at least `len` bytes owned by `buf`; the
        // kernel writes at most `len` bytes into it.
        match syscall!(recv(
            sock.as_raw_fd(),
            spare.as_mut_ptr().cast(),
            len,
            dontwait(blocking)
        )) {
            Ok(n) => break n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    // SAFETY: the kernel initialised the first `n ≤ len` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// Receives one packet: its first `head.len()` bytes into `head`, the rest appended to
/// `body` (up to `max_body` bytes of its spare capacity), with one `recvmsg`. Returns the
/// packet's full length, which exceeds `head.len() + max_body` if it was truncated; 0 is end
/// of stream (or an empty packet).
pub fn recv_packet(
    sock: BorrowedFd<'_>,
    head: &mut [u8],
    body: &mut Vec<u8>,
    max_body: usize,
    blocking: bool,
) -> io::Result<usize> {
    let spare = body.spare_capacity_mut();
    let body_len = spare.len().min(max_body);
    let mut iov = [
        libc::iovec {
            iov_base: head.as_mut_ptr().cast(),
            iov_len: head.len(),
        },
        libc::iovec {
            iov_base: spare.as_mut_ptr().cast(),
            iov_len: body_len,
        },
    ];
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len();
    let n = loop {
        // SAFETY: `msg` points at two iovecs describing live, writable buffers of the
        // lengths they declare (`head`, and `body_len` bytes of `body`'s spare capacity).
        // MSG_TRUNC only changes the return value to the packet's real length.
        match syscall!(recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_TRUNC | dontwait(blocking)
        )) {
            Ok(n) => break n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    let written = n.saturating_sub(head.len()).min(body_len);
    // SAFETY: the kernel filled the iovecs in order, so `written ≤ body_len` bytes of the
    // spare capacity are initialised.
    unsafe { body.set_len(body.len() + written) };
    Ok(n)
}

/// Most bytes [`discard_input`] reads before it gives up on a peer that keeps sending.
pub const DISCARD_LIMIT: usize = 1 << 20;

/// Reads and drops what the socket holds, without blocking, up to [`DISCARD_LIMIT`]
/// bytes. A socket closed with unread input makes TCP send a reset (which can destroy
/// data still in flight) and Unix sockets report `ECONNRESET` to the peer, so a graceful
/// close drains first; the bound keeps a peer that floods us from holding the close in
/// this loop (it gets its reset).
pub fn discard_input(sock: BorrowedFd<'_>) {
    let mut scratch = [0u8; 16 << 10];
    for _ in 0..DISCARD_LIMIT / scratch.len() {
        // SAFETY: `scratch` is a writable buffer of its length.
        match syscall!(recv(
            sock.as_raw_fd(),
            scratch.as_mut_ptr().cast(),
            scratch.len(),
            libc::MSG_DONTWAIT
        )) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// What [`wait`] waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ready {
    /// Input (or end of stream).
    Read,
    /// Room to send.
    Write,
    /// Either.
    ReadWrite,
}

/// Waits until `sock` is ready as asked, has an error or hang-up, or `deadline` passes.
/// Returns false on timeout.
pub fn wait(sock: BorrowedFd<'_>, ready: Ready, deadline: Option<Instant>) -> io::Result<bool> {
    let interest = match ready {
        Ready::Read => Interest::READABLE,
        Ready::Write => Interest::WRITABLE,
        Ready::ReadWrite => Interest::READABLE | Interest::WRITABLE,
    };
    poll_fd(sock, interest, deadline)
}

/// A level flag with a descriptor that is readable while the flag is set (an eventfd).
pub struct EventFlag {
    fd: OwnedFd,
}

impl EventFlag {
    /// A new, clear flag.
    pub fn new() -> io::Result<EventFlag> {
        Ok(EventFlag {
            fd: crate::eventfd::create()?,
        })
    }

    /// Sets the flag (the descriptor becomes readable).
    pub fn set(&self) -> io::Result<()> {
        crate::eventfd::ring(self.fd.as_fd())
    }

    /// Clears the flag.
    pub fn clear(&self) -> io::Result<()> {
        crate::eventfd::drain(self.fd.as_fd()).map(drop)
    }

    /// The descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::socket::seqpacket_pair;
    use std::time::Duration;

    #[test]
    fn discarding_input_ends_while_the_peer_keeps_flooding() {
        let (ours, theirs) = seqpacket_pair().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let (started, flooding) = std::sync::mpsc::channel();
        let flooder = std::thread::spawn(move || {
            let chunk = [7u8; 4096];
            let mut sent = 0usize;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                // SAFETY: `chunk` is a readable buffer of its length.
                let n = unsafe {
                    libc::send(theirs.as_raw_fd(), chunk.as_ptr().cast(), chunk.len(), 0)
                };
                if n > 0 {
                    if sent == 0 {
                        let _ = started.send(());
                    }
                    sent += n as usize;
                }
            }
            sent
        });
        flooding.recv().unwrap();
        // However fast the flood, discarding returns.
        discard_input(ours.as_fd());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        drop(ours); // unblocks a send waiting for room
        assert!(flooder.join().unwrap() > 0);
    }

    #[test]
    fn packets_split_into_head_and_body() {
        let (a, b) = seqpacket_pair().unwrap();
        assert_eq!(send_parts(a.as_fd(), &[7], b"payload", false).unwrap(), 8);
        let mut head = [0u8; 1];
        let mut body = Vec::with_capacity(16);
        body.push(b'>');
        let n = recv_packet(b.as_fd(), &mut head, &mut body, 16, false).unwrap();
        assert_eq!((n, head[0], &body[..]), (8, 7, &b">payload"[..]));
    }

    #[test]
    fn truncated_packets_report_their_real_length() {
        let (a, b) = seqpacket_pair().unwrap();
        send_parts(a.as_fd(), &[1], &[9; 100], false).unwrap();
        let mut head = [0u8; 1];
        let mut body = Vec::with_capacity(200);
        let n = recv_packet(b.as_fd(), &mut head, &mut body, 10, false).unwrap();
        assert_eq!((n, body.len()), (101, 10));
    }

    #[test]
    fn recv_append_fills_only_spare_capacity() {
        let (a, b) = seqpacket_pair().unwrap();
        send_parts(a.as_fd(), b"abc", b"", false).unwrap();
        let mut buf = Vec::with_capacity(8);
        assert_eq!(recv_append(b.as_fd(), &mut buf, 8, false).unwrap(), 3);
        assert_eq!(buf, b"abc");
        let e = recv_append(b.as_fd(), &mut buf, 8, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn event_flag_is_level_triggered() {
        let flag = EventFlag::new().unwrap();
        let soon = || Some(Instant::now() + Duration::from_millis(1));
        assert!(!wait(flag.fd(), Ready::Read, soon()).unwrap());
        flag.set().unwrap();
        flag.set().unwrap();
        assert!(wait(flag.fd(), Ready::Read, soon()).unwrap());
        assert!(wait(flag.fd(), Ready::Read, soon()).unwrap());
        flag.clear().unwrap();
        flag.clear().unwrap();
        assert!(!wait(flag.fd(), Ready::Read, soon()).unwrap());
    }
}
