//! Pipes as doorbells: one byte written wakes a `read` blocked on the other end, and the
//! end of the last write end (its process died) wakes it with end-of-file.
//!
//! The write end is kept non-blocking (a full pipe already holds doorbells the reader has
//! not taken), the read end blocking (a sleep is one `read`). Writing never raises SIGPIPE
//! as long as the writer holds a read end of the same pipe itself, which the `shm:`
//! transport does (its "guard").

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::{owned, syscall};

/// Makes a pipe (both ends close-on-exec, both blocking): `(read end, write end)`.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: `fds` is a writable array of two ints, as pipe2 requires.
    syscall!(pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC))?;
    // SAFETY: the kernel just returned both descriptors; nothing else owns them.
    Ok(unsafe { (owned(fds[0]), owned(fds[1])) })
}

/// A doorbell pipe: [`pipe`] with its write end made non-blocking (one `fcntl`: a fresh
/// pipe's status flags are known), `(read end, write end)`.
pub fn doorbell() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = pipe()?;
    // SAFETY: plain integer arguments on a descriptor we own. F_SETFL ignores the access
    // mode; a fresh pipe end has no other status flag to keep.
    syscall!(fcntl(w.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK))?;
    Ok((r, w))
}

/// Sets `O_NONBLOCK` on the open file description of `fd` (every descriptor of it, in
/// every process, shares the flag).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain integer arguments on an open descriptor.
    let flags = syscall!(fcntl(fd.as_raw_fd(), libc::F_GETFL))?;
    set_nonblocking_with(fd, flags)
}

/// [`set_nonblocking`] for a descriptor whose status flags (`F_GETFL`) are `flags`
/// already: no `fcntl` if it is non-blocking.
pub fn set_nonblocking_with(fd: BorrowedFd<'_>, flags: libc::c_int) -> io::Result<()> {
    if flags & libc::O_NONBLOCK == 0 {
        // SAFETY: plain integer arguments on an open descriptor.
        syscall!(fcntl(
            fd.as_raw_fd(),
            libc::F_SETFL,
            flags | libc::O_NONBLOCK
        ))?;
    }
    Ok(())
}

/// Which end of a pipe a descriptor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Opened for reading only.
    Read,
    /// Opened for writing only.
    Write,
}

/// What [`check_end`] found out about a pipe end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndInfo {
    /// The pipe's identity (device, inode), equal for both ends of one pipe.
    pub id: (u64, u64),
    /// The end's file status flags (`F_GETFL`).
    pub flags: libc::c_int,
}

/// Checks that `fd` is a pipe (or FIFO) opened as `end`, for descriptors that came from
/// another process; returns the pipe's identity and the end's flags.
pub fn check_end(fd: BorrowedFd<'_>, end: End) -> io::Result<EndInfo> {
    // SAFETY: `stat` is plain data; all-zero is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a live, writable stat buffer; `fd` is open.
    syscall!(fstat(fd.as_raw_fd(), &mut st))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a pipe (file mode {:#o})", st.st_mode),
        ));
    }
    // SAFETY: plain integer arguments on an open descriptor.
    let flags = syscall!(fcntl(fd.as_raw_fd(), libc::F_GETFL))?;
    let want = match end {
        End::Read => libc::O_RDONLY,
        End::Write => libc::O_WRONLY,
    };
    if flags & libc::O_ACCMODE != want {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "not the {end:?} end of a pipe (access mode {:#o})",
                flags & libc::O_ACCMODE
            ),
        ));
    }
    Ok(EndInfo {
        id: (st.st_dev, st.st_ino),
        flags,
    })
}

/// Rings: writes one byte without blocking on a non-blocking write end. `WouldBlock`
/// means the pipe is full (of doorbells not yet taken).
pub fn ring(fd: BorrowedFd<'_>, byte: u8) -> io::Result<()> {
    loop {
        // SAFETY: one readable byte at a live address.
        match syscall!(write(fd.as_raw_fd(), (&byte as *const u8).cast(), 1)) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Reads what is in the pipe into `buf`, waiting (on a blocking read end) until there is
/// something; `Ok(0)` is end-of-file: every write end is closed.
pub fn read_wait(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is a valid writable buffer of its length.
        match syscall!(read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())) {
            Ok(n) => return Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_ring_wakes_the_reader_and_the_last_write_end_gives_eof() {
        let (r, w) = doorbell().unwrap();
        let read = check_end(r.as_fd(), End::Read).unwrap();
        let write = check_end(w.as_fd(), End::Write).unwrap();
        assert_eq!(write.id, read.id);
        assert_eq!(read.flags & libc::O_NONBLOCK, 0, "the read end blocks");
        assert_ne!(write.flags & libc::O_NONBLOCK, 0, "the write end does not");
        assert!(check_end(r.as_fd(), End::Write).is_err());
        assert!(check_end(w.as_fd(), End::Read).is_err());
        ring(w.as_fd(), 1).unwrap();
        ring(w.as_fd(), 2).unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(read_wait(r.as_fd(), &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], &[1, 2]);
        drop(w);
        assert_eq!(read_wait(r.as_fd(), &mut buf).unwrap(), 0);
        let f = std::fs::File::open("/dev/null").unwrap();
        assert!(check_end(f.as_fd(), End::Read).is_err());
    }

    #[test]
    fn a_full_pipe_does_not_block_the_ringer() {
        let (_r, w) = pipe().unwrap();
        set_nonblocking(w.as_fd()).unwrap();
        set_nonblocking(w.as_fd()).unwrap(); // once more: a no-op
        let err = loop {
            if let Err(e) = ring(w.as_fd(), 1) {
                break e;
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
    }
}
