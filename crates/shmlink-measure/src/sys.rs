//! The OS calls a measurement needs that `std` does not offer: a [`syscall!`](crate::syscall)
//! macro that turns `-1/errno` into `io::Result`, the kernel's random bytes, this
//! process's CPU time and pinning it to a CPU.

use std::io;
use std::time::Duration;

/// Calls a libc function and turns a `-1` return into the `errno` error. The caller puts
/// a `// SAFETY:` comment on the call that says why its arguments are valid: the
/// arguments are expanded inside the macro's `unsafe` block, which is the point.
#[macro_export]
macro_rules! syscall {
    ($fn:ident ( $($arg:expr),* $(,)? )) => {{
        #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
        // SAFETY: the caller of the macro guarantees the arguments are valid for `$fn`;
        // each call site states why in its own SAFETY comment.
        let res = unsafe { libc::$fn($($arg),*) };
        if res == -1 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(res)
        }
    }};
}
pub use crate::syscall;

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

/// User and system CPU time this process has used so far (`getrusage`); zero if the
/// kernel does not say.
pub fn cpu_time() -> Duration {
    // SAFETY: rusage is plain data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage for the kernel to fill in.
    if syscall!(getrusage(libc::RUSAGE_SELF, &mut ru)).is_err() {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Pins the calling thread (the whole process, when it has one thread) to `cpu`
/// (`sched_setaffinity`).
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "CPU {cpu} is out of range (at most {})",
                libc::CPU_SETSIZE - 1
            ),
        ));
    }
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above), so CPU_SET stays inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is this thread.
    syscall!(sched_setaffinity(
        0,
        std::mem::size_of::<libc::cpu_set_t>(),
        &set
    ))
    .map_err(|e| io::Error::new(e.kind(), format!("pin to CPU {cpu}: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work() {
        let t0 = cpu_time();
        let deadline = std::time::Instant::now() + Duration::from_millis(30);
        let mut x = 0u64;
        while std::time::Instant::now() < deadline {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(cpu_time() > t0, "30 ms of spinning used no CPU time");
    }

    #[test]
    fn pinning_to_an_absurd_cpu_is_refused() {
        let e = pin_to_cpu(1 << 20).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
