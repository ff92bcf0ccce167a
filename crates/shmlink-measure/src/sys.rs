//! The OS calls a measurement needs that `std` does not offer: the kernel's random bytes,
//! and from `shmlink-sys` the [`syscall!`](shmlink_sys::syscall) macro, this process's
//! CPU time and pinning it to a CPU.

use std::io;

/// The one `syscall!` macro, CPU time and pinning: shmlink's OS layer's.
pub use shmlink_sys::{cpu_time, pin_to_cpu, syscall};

/// Puts what was being done in front of an I/O error.
pub fn ctx(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A new `io::Error` of kind `Other`.
pub fn err(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

/// Fills `buf` from the kernel's random source (`getrandom`).
pub fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes.
        match syscall!(getrandom(rest.as_mut_ptr().cast(), rest.len(), 0)) {
            Ok(n) => done += n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
