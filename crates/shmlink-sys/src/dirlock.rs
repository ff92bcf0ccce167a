//! An exclusive `flock` on a directory, for the few steps that must not interleave between
//! processes (or threads) working on the same socket file in it.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::{owned, syscall};

/// Holds the lock until dropped (closing the descriptor releases it).
pub struct DirLock {
    _fd: OwnedFd,
}

impl DirLock {
    /// Locks `dir` exclusively, waiting for whoever holds it. `flock` locks belong to the
    /// open file description, so two threads of one process exclude each other too.
    pub fn lock(dir: &Path) -> io::Result<DirLock> {
        let c = CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
        // SAFETY: `c` is a NUL-terminated path that lives across the call.
        let fd = syscall!(open(c.as_ptr(), flags))?;
        // SAFETY: `open` just returned this descriptor; nothing else owns it.
        DirLock::lock_fd(unsafe { owned(fd) })
    }

    /// The locked directory's descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self._fd.as_fd()
    }

    /// Locks the directory open at `fd` (one already opened and checked: no path is
    /// looked up again), as [`DirLock::lock`].
    pub fn lock_fd(fd: OwnedFd) -> io::Result<DirLock> {
        loop {
            // SAFETY: `fd` is an open descriptor owned above.
            match syscall!(flock(fd.as_raw_fd(), libc::LOCK_EX)) {
                Ok(_) => return Ok(DirLock { _fd: fd }),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}
