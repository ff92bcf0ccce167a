//! Unix `SOCK_SEQPACKET` sockets: connect/bind/accept, descriptor passing (SCM_RIGHTS) and
//! peer credentials (SO_PEERCRED).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Instant;

use crate::{owned, poll_fd, syscall, Interest};

/// Where a Unix socket lives: a file system path or a name in the abstract namespace.
///
/// `Send`, `Sync`, `Clone`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnixName {
    /// A socket file.
    Path(PathBuf),
    /// A name in the abstract namespace (no file; visible within one network namespace).
    Abstract(String),
}

/// Most descriptors one message may carry.
pub const MAX_FDS: usize = 8;

/// A `sockaddr_un` for `name` and its length.
fn sockaddr(name: &UnixName) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let (bytes, lead): (&[u8], usize) = match name {
        UnixName::Path(p) => (p.as_os_str().as_bytes(), 0),
        // Abstract names start with a NUL byte.
        UnixName::Abstract(n) => (n.as_bytes(), 1),
    };
    if lead + bytes.len() >= sa.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket name too long",
        ));
    }
    for (dst, &src) in sa.sun_path[lead..].iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    let base = std::mem::size_of::<libc::sa_family_t>();
    let len = match name {
        UnixName::Path(_) => base + bytes.len() + 1,
        UnixName::Abstract(_) => base + 1 + bytes.len(),
    };
    Ok((sa, len as libc::socklen_t))
}

/// Sets the mode of the socket file at `path`, which must be a socket owned by us, never
/// following a symbolic link: another user who swapped the file for a link between our
/// `bind` and this call must not get the link's target re-moded. Returns the file's
/// (device, inode). The file is opened with `O_PATH | O_NOFOLLOW` and changed through
/// `/proc/self/fd`, as glibc's `fchmodat(AT_SYMLINK_NOFOLLOW)` does.
pub fn chmod_socket_file(path: &std::path::Path, mode: u32) -> io::Result<(u64, u64)> {
    let cpath = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: `cpath` is a NUL-terminated string that outlives the call.
    let fd = syscall!(open(
        cpath.as_ptr(),
        libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC
    ))?;
    // SAFETY: open returned a fresh descriptor.
    let fd = unsafe { owned(fd) };
    // SAFETY: stat is plain data; all-zero is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid stat buffer; fstat works on O_PATH descriptors.
    syscall!(fstat(fd.as_raw_fd(), &mut st))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK || st.st_uid != super::euid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is no longer our socket (replaced by another file)",
                path.display()
            ),
        ));
    }
    let proc_path = std::ffi::CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .expect("no NUL in a number");
    // SAFETY: `proc_path` is a NUL-terminated string that outlives the call.
    syscall!(chmod(proc_path.as_ptr(), mode as libc::mode_t))?;
    Ok((st.st_dev, st.st_ino))
}

/// A new non-blocking, close-on-exec `SOCK_SEQPACKET` socket.
pub fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: no pointers; valid constants.
    let fd = syscall!(socket(
        libc::AF_UNIX,
        libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        0
    ))?;
    // SAFETY: socket returned a fresh descriptor.
    Ok(unsafe { owned(fd) })
}

/// A connected pair of non-blocking `SOCK_SEQPACKET` sockets.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors.
    syscall!(socketpair(
        libc::AF_UNIX,
        libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        0,
        fds.as_mut_ptr()
    ))?;
    // SAFETY: socketpair returned two fresh descriptors.
    Ok(unsafe { (owned(fds[0]), owned(fds[1])) })
}

/// A listening socket bound to `name`.
pub fn listen(name: &UnixName, backlog: i32) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (sa, len) = sockaddr(name)?;
    // SAFETY: `sa` is a valid sockaddr_un of `len` bytes.
    syscall!(bind(
        fd.as_raw_fd(),
        (&sa as *const libc::sockaddr_un).cast(),
        len
    ))?;
    // SAFETY: plain integer arguments.
    syscall!(listen(fd.as_raw_fd(), backlog))?;
    Ok(fd)
}

/// Connects to `name`, retrying while the listener's backlog is full, until `deadline`. The
/// socket is non-blocking (`SOCK_NONBLOCK`), with no other status flag.
pub fn connect(name: &UnixName, deadline: Instant) -> io::Result<OwnedFd> {
    let (sa, len) = sockaddr(name)?;
    loop {
        let fd = seqpacket()?;
        // SAFETY: `sa` is a valid sockaddr_un of `len` bytes.
        match syscall!(connect(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_un).cast(),
            len
        )) {
            Ok(_) => return Ok(fd),
            // A full backlog on a non-blocking Unix socket gives EAGAIN; the listener is
            // alive, so wait a little and try again.
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "listener backlog stayed full",
                    ));
                }
                std::thread::sleep(std::time::Duration::from_micros(500));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Accepts one pending connection, non-blocking; `Ok(None)` when none is pending. The new
/// socket is non-blocking too.
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    accept_flags(listener, libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK)
}

/// [`accept`], but the new socket is in blocking mode (calls that must not wait say
/// `MSG_DONTWAIT`): what a `shm:` connection's socket ends up as, without an `fcntl`.
pub fn accept_blocking(listener: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    accept_flags(listener, libc::SOCK_CLOEXEC)
}

fn accept_flags(listener: BorrowedFd<'_>, flags: libc::c_int) -> io::Result<Option<OwnedFd>> {
    loop {
        // SAFETY: null address pointers are allowed; the flags are valid.
        match syscall!(accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            flags
        )) {
            // SAFETY: accept4 returned a fresh descriptor.
            Ok(fd) => return Ok(Some(unsafe { owned(fd) })),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // The client gave up before we accepted: try the next one.
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Sends one packet carrying `data` and the descriptors `fds`, without blocking and without
/// SIGPIPE.
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    assert!(fds.len() <= MAX_FDS);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // u64 storage keeps the control buffer aligned for cmsghdr.
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds);
        // SAFETY: CMSG_SPACE only computes a size.
        let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
        assert!(space <= std::mem::size_of_val(&cbuf));
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `space` writable, aligned bytes, enough for one
        // header with `bytes` of data (CMSG_SPACE), so CMSG_FIRSTHDR is non-null and the
        // writes below stay inside `cbuf`.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    loop {
        // SAFETY: `msg` points at live iovec and control buffers for the call.
        match syscall!(sendmsg(
            sock.as_raw_fd(),
            &msg,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL
        )) {
            Ok(n) => return Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Receives one packet, non-blocking, into `buf`, and any descriptors into `fds`.
/// Returns the packet's length (0 = end of stream). Errors if the packet or its
/// descriptors were truncated (descriptors received are closed in that case).
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: `msg` points at live, writable iovec and control buffers of the sizes
        // it declares.
        match syscall!(recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC
        )) {
            Ok(n) => break n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    // Take ownership of every descriptor the kernel installed before judging the packet,
    // so none leaks whatever happens next.
    // SAFETY: the kernel filled `msg`'s control buffer; CMSG_FIRSTHDR/NXTHDR walk only
    // headers inside msg_controllen, and SCM_RIGHTS payloads are arrays of fds that are
    // now ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let count =
                    ((*c).cmsg_len - (data as usize - c as usize)) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = data.cast::<RawFd>().add(i).read_unaligned();
                    fds.push(owned(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        fds.clear();
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "too many descriptors in one packet",
        ));
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        fds.clear();
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("packet larger than {} bytes", buf.len()),
        ));
    }
    Ok(n)
}

/// Sends one packet without blocking and without SIGPIPE.
pub fn send(sock: BorrowedFd<'_>, data: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `data` is a valid readable buffer of its length.
        match syscall!(send(
            sock.as_raw_fd(),
            data.as_ptr().cast(),
            data.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL
        )) {
            Ok(n) => return Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Receives one packet without blocking; `Ok(0)` is end of stream. `MSG_TRUNC` makes the
/// return value the packet's real length, so callers can detect truncation.
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    recv_flags(sock, buf, libc::MSG_DONTWAIT)
}

/// Copies the first waiting packet without taking it off the socket (`MSG_PEEK`), without
/// blocking; `Ok(0)` is end of stream.
pub fn peek(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    recv_flags(sock, buf, libc::MSG_DONTWAIT | libc::MSG_PEEK)
}

/// Receives one packet, waiting for it if the socket is in blocking mode.
pub fn recv_wait(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    recv_flags(sock, buf, 0)
}

fn recv_flags(sock: BorrowedFd<'_>, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is a valid writable buffer of its length.
        match syscall!(recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            flags | libc::MSG_TRUNC
        )) {
            Ok(n) => return Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Receives one packet, waiting until `deadline`.
pub fn recv_until(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    deadline: Instant,
) -> io::Result<usize> {
    loop {
        match recv_with_fds(sock, buf, fds) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !poll_fd(sock, Interest::READABLE, Some(deadline))? {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no answer before the deadline",
                    ));
                }
            }
            other => return other,
        }
    }
}

/// Shuts both directions of a socket down: the peer sees end-of-file at once, even while
/// other descriptors of the socket stay open in this process.
pub fn shutdown(sock: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    syscall!(shutdown(sock.as_raw_fd(), libc::SHUT_RDWR))?;
    Ok(())
}

/// Credentials of the process at the other end of a Unix socket, as the kernel saw them at
/// connect time (translated into our namespaces).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id (0 if the peer is in a PID namespace we cannot see into).
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// The peer's credentials (SO_PEERCRED).
pub fn peer_cred(sock: BorrowedFd<'_>) -> io::Result<PeerCred> {
    // SAFETY: ucred is plain data; all-zero is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` describe a writable ucred buffer.
    syscall!(getsockopt(
        sock.as_raw_fd(),
        libc::SOL_SOCKET,
        libc::SO_PEERCRED,
        (&mut cred as *mut libc::ucred).cast(),
        &mut len
    ))?;
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn a_socket_swapped_for_a_symlink_is_not_followed() {
        let dir = std::env::temp_dir().join(format!("shmlink-chmod-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let sock = dir.join("s.sock");
        let _listener = listen(&UnixName::Path(sock.clone()), 1).unwrap();
        let (dev, ino) = chmod_socket_file(&sock, 0o600).unwrap();
        let m = std::fs::symlink_metadata(&sock).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!((m.dev(), m.ino()), (dev, ino));
        // Another user swaps the socket for a link to a file of the victim's.
        let victim = dir.join("victim");
        std::fs::write(&victim, b"secret").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::remove_file(&sock).unwrap();
        std::os::unix::fs::symlink(&victim, &sock).unwrap();
        let err = chmod_socket_file(&sock, 0o666).unwrap_err();
        let mode = std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777;
        // A regular file in the socket's place is refused as well.
        std::fs::remove_file(&sock).unwrap();
        std::fs::write(&sock, b"").unwrap();
        let not_socket = chmod_socket_file(&sock, 0o666).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        // (O_PATH | O_NOFOLLOW opens the link itself, which is not our socket.)
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert_eq!(mode, 0o600, "the link's target was re-moded");
        assert_eq!(not_socket.kind(), io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn descriptors_cross_a_socket() {
        let (a, b) = seqpacket_pair().unwrap();
        let (x, _y) = seqpacket_pair().unwrap();
        send_with_fds(a.as_fd(), b"hi", &[x.as_raw_fd()]).unwrap();
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let n = recv_with_fds(b.as_fd(), &mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..n], b"hi");
        assert_eq!(fds.len(), 1);
        assert_ne!(fds[0].as_raw_fd(), x.as_raw_fd());
        let cred = peer_cred(a.as_fd()).unwrap();
        assert_eq!(cred.uid, crate::euid());
    }

    #[test]
    fn truncated_packets_are_errors() {
        let (a, b) = seqpacket_pair().unwrap();
        send(a.as_fd(), &[1u8; 100]).unwrap();
        let mut buf = [0u8; 10];
        let err = recv_with_fds(b.as_fd(), &mut buf, &mut Vec::new()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
