//! The calling process and thread: stop signals taken synchronously (blocked, then
//! waited for by one thread), dying with the parent, signalling a child, what a child
//! inherits, the clocks, and this thread's `errno` (for the C API, which reports errors
//! through it).

use std::io;
use std::os::fd::RawFd;

/// A set of signals blocked in the thread that made it (and in the threads it starts
/// afterwards), waited for with [`Signals::wait`].
#[derive(Clone, Copy)]
pub struct Signals {
    set: libc::sigset_t,
}

// SAFETY: a sigset_t is plain data (a bit mask); the set is only read after creation.
unsafe impl Send for Signals {}

impl Signals {
    /// Blocks SIGTERM and SIGINT in the calling thread, so they stay pending until
    /// [`Signals::wait`] takes them.
    pub fn block_stop() -> io::Result<Signals> {
        // SAFETY: an all-zero sigset_t is a valid value to hand to sigemptyset.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t; SIGTERM and SIGINT are valid signals; a
        // null old-set pointer is allowed.
        let rc = unsafe {
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(Signals { set })
    }

    /// Waits until one of the signals is pending and takes it; returns its number.
    pub fn wait(&self) -> i32 {
        loop {
            let mut sig = 0;
            // SAFETY: `set` is an initialised sigset_t and `sig` a valid out pointer,
            // both living across the call.
            if unsafe { libc::sigwait(&self.set, &mut sig) } == 0 {
                return sig;
            }
        }
    }
}

/// The name of a stop signal ("SIGTERM", "SIGINT"), or "signal N".
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGINT => "SIGINT".into(),
        n => format!("signal {n}"),
    }
}

/// Makes the kernel send SIGKILL to this process when the thread that forked it exits
/// (`PR_SET_PDEATHSIG`).
pub fn kill_with_parent() -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and no pointers; the unused
    // arguments are zero as prctl(2) asks.
    crate::syscall!(prctl(
        libc::PR_SET_PDEATHSIG,
        libc::SIGKILL as libc::c_ulong,
        0 as libc::c_ulong,
        0 as libc::c_ulong,
        0 as libc::c_ulong,
    ))
    .map(drop)
}

/// This process's soft limit on open files (`RLIMIT_NOFILE`): one above the highest
/// descriptor number it may open.
pub fn fd_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    crate::syscall!(getrlimit(libc::RLIMIT_NOFILE, &mut lim))?;
    Ok(lim.rlim_cur)
}

/// Sets this process's soft limit on open files (`RLIMIT_NOFILE`) to `soft`, which must
/// not be above the hard limit (tests that need a small descriptor table).
pub fn set_fd_limit(soft: u64) -> io::Result<()> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    crate::syscall!(getrlimit(libc::RLIMIT_NOFILE, &mut lim))?;
    lim.rlim_cur = soft;
    // SAFETY: `lim` is a valid rlimit; setrlimit refuses a soft limit above the hard one.
    crate::syscall!(setrlimit(libc::RLIMIT_NOFILE, &lim))?;
    Ok(())
}

/// Raises this process's soft limit on open files (`RLIMIT_NOFILE`) to its hard limit
/// and returns the limit now in force (soft, hard). A process that holds many
/// connections calls it; raising the hard limit itself needs privilege and is left to
/// whoever starts the process.
pub fn raise_fd_limit() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    crate::syscall!(getrlimit(libc::RLIMIT_NOFILE, &mut lim))?;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit; the soft limit is not above the hard one.
        crate::syscall!(setrlimit(libc::RLIMIT_NOFILE, &lim))?;
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// Sets this thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: errno is this thread's own variable.
    unsafe { *libc::__errno_location() = e };
}

/// This thread's `errno`.
pub fn errno() -> i32 {
    // SAFETY: errno is this thread's own variable.
    unsafe { *libc::__errno_location() }
}

/// Sends `sig` to process `pid`.
pub fn kill(pid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: kill takes plain integers.
    crate::syscall!(kill(pid as libc::pid_t, sig)).map(drop)
}

/// SIGKILL's number (for [`kill`]).
pub const SIGKILL: i32 = libc::SIGKILL;

/// Clears `fd`'s close-on-exec flag, so a program this process execs inherits it.
/// Async-signal-safe (one `fcntl`): usable between `fork` and `exec`.
pub fn clear_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl with F_SETFD takes an integer; an invalid fd is reported as EBADF.
    crate::syscall!(fcntl(fd, libc::F_SETFD, 0)).map(drop)
}

/// A clock [`clock_ns`] reads.
#[derive(Clone, Copy, Debug)]
pub enum Clock {
    /// `CLOCK_MONOTONIC`: the same clock in every process of the machine.
    Monotonic,
    /// `CLOCK_PROCESS_CPUTIME_ID`: CPU time of this process, all threads.
    ProcessCpu,
    /// `CLOCK_THREAD_CPUTIME_ID`: CPU time of the calling thread.
    ThreadCpu,
}

/// `clock`'s reading in ns (a vDSO call for the monotonic clock).
#[inline]
pub fn clock_ns(clock: Clock) -> u64 {
    let id = match clock {
        Clock::Monotonic => libc::CLOCK_MONOTONIC,
        Clock::ProcessCpu => libc::CLOCK_PROCESS_CPUTIME_ID,
        Clock::ThreadCpu => libc::CLOCK_THREAD_CPUTIME_ID,
    };
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to fill in; these clock ids exist on every Linux.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fd_limit_is_raised_to_the_hard_one() {
        let (soft, hard) = raise_fd_limit().unwrap();
        assert_eq!(soft, hard);
        assert!(soft >= 3, "{soft}");
        // A second call finds it raised and changes nothing.
        assert_eq!(raise_fd_limit().unwrap(), (soft, hard));
    }

    #[test]
    fn errno_round_trips_per_thread() {
        set_errno(libc::EIO);
        assert_eq!(errno(), libc::EIO);
        std::thread::spawn(|| {
            set_errno(libc::EINVAL);
            assert_eq!(errno(), libc::EINVAL);
        })
        .join()
        .unwrap();
        assert_eq!(errno(), libc::EIO);
    }

    #[test]
    fn a_blocked_stop_signal_is_taken_by_wait() {
        // In a thread of its own, so the test harness's other threads keep their masks.
        std::thread::spawn(|| {
            let s = Signals::block_stop().unwrap();
            // SAFETY: raising a signal at this thread, where it is blocked: it pends.
            unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGINT) };
            assert_eq!(s.wait(), libc::SIGINT);
            assert_eq!(signal_name(libc::SIGINT), "SIGINT");
        })
        .join()
        .unwrap();
    }
}
