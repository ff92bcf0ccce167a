//! Raw eventfd counters, for doorbells whose descriptors travel between processes (the
//! `vm:` doorbell server hands them out): create one, ring it, drain it. A level flag for
//! one process's event loop is [`EventFlag`](crate::stream::EventFlag), built on these.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::{owned, syscall};

/// A new eventfd, counter zero, non-blocking and close-on-exec.
pub fn create() -> io::Result<OwnedFd> {
    // SAFETY: no pointers; valid flags.
    let fd = syscall!(eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK))?;
    // SAFETY: eventfd returned a fresh descriptor.
    Ok(unsafe { owned(fd) })
}

/// Adds 1 to the counter (rings it: the descriptor becomes readable).
pub fn ring(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one = 1u64.to_ne_bytes();
    // SAFETY: `one` is a readable 8-byte buffer, the size an eventfd write takes.
    syscall!(write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()))?;
    Ok(())
}

/// Reads and resets the counter without blocking: how many rings it held (0 if none;
/// the descriptor must be non-blocking, as [`create`] makes it).
pub fn drain(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut count = [0u8; 8];
    // SAFETY: `count` is a writable 8-byte buffer, the size an eventfd read returns.
    match syscall!(read(fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len())) {
        Ok(_) => Ok(u64::from_ne_bytes(count)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn rings_add_up_and_a_drain_takes_them_all() {
        let fd = create().unwrap();
        assert_eq!(drain(fd.as_fd()).unwrap(), 0, "a new counter is zero");
        ring(fd.as_fd()).unwrap();
        ring(fd.as_fd()).unwrap();
        let soon = Some(std::time::Instant::now());
        assert!(crate::poll_fd(fd.as_fd(), crate::Interest::READABLE, soon).unwrap());
        assert_eq!(drain(fd.as_fd()).unwrap(), 2);
        assert_eq!(drain(fd.as_fd()).unwrap(), 0);
    }
}
