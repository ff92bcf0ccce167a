//! shmlink's operating-system layer: the one crate of the project that calls libc (the
//! rings reach the kernel only through [`membarrier_global`]).
//!
//! Every raw call goes through [`syscall!`], which turns `-1`/`errno` into `io::Result`, and
//! every new descriptor becomes an [`OwnedFd`] at once. Event loops are typed: an
//! [`Epoll`] set watches descriptors for an [`Interest`] and reports [`Event`]s carrying
//! the [`Token`] they were registered with (mio's shape), and [`poll_fd`] waits for one
//! descriptor with the same [`Interest`].
//!
//! Linux only: memfd seals (`F_SEAL_FUTURE_WRITE` needs Linux 5.1), `SOCK_SEQPACKET`,
//! epoll, timerfd and membarrier.
//!
//! ```
//! use shmlink_sys::{poll_fd, socket, Interest};
//! use std::os::fd::AsFd;
//! use std::time::{Duration, Instant};
//!
//! let (a, b) = socket::seqpacket_pair()?;
//! let soon = Some(Instant::now() + Duration::from_millis(10));
//! assert!(!poll_fd(b.as_fd(), Interest::READABLE, soon)?, "nothing sent yet");
//! socket::send(a.as_fd(), b"ping")?;
//! assert!(poll_fd(b.as_fd(), Interest::READABLE, None)?);
//! # Ok::<(), std::io::Error>(())
//! ```

#![warn(missing_docs)]

#[cfg(not(target_os = "linux"))]
compile_error!("shmlink-sys supports Linux only (memfd seals, epoll, membarrier)");

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

pub mod cache;
mod copy;
pub mod dir;
pub mod dirlock;
pub mod errno;
mod event;
pub mod eventfd;
pub mod file;
pub mod memfd;
pub mod pipe;
pub mod process;
pub mod socket;
pub mod stream;
pub mod vfio;

pub use copy::{copy_shared, copy_to_shared};
pub use event::{Event, Interest, Token};

/// The libc this crate was built against, for [`syscall!`]'s expansion in other crates.
#[doc(hidden)]
pub use libc;

/// Calls a libc function and maps `-1` to `Err(io::Error::last_os_error())`.
///
/// `syscall!(close(fd))` expands to an `unsafe` call of `libc::close(fd)`: the caller
/// states in its own `// SAFETY:` comment why the arguments are valid for the function.
/// The crate using the macro needs no dependency on libc of its own.
#[macro_export]
macro_rules! syscall {
    ($fn:ident ( $($arg:expr),* $(,)? )) => {{
        // The arguments are expanded inside the unsafe block: that is the macro's contract
        // (every call site carries a SAFETY comment for them), so the lint against it is
        // allowed here rather than at each call.
        #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
        // SAFETY: the caller of the macro guarantees the arguments are valid for `$fn`;
        // each call site states why in its own SAFETY comment.
        let res = unsafe { $crate::libc::$fn($($arg),*) };
        if res == -1 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(res)
        }
    }};
}

/// Wraps a descriptor a syscall just returned.
///
/// # Safety
/// `fd` must be a valid, open descriptor that nothing else owns.
pub(crate) unsafe fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: forwarded to the caller.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The time left until `deadline`, as a poll timeout in ms (`-1` = forever), rounded up so a
/// wait never ends before the deadline.
fn poll_timeout(deadline: Option<Instant>) -> libc::c_int {
    match deadline {
        None => -1,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            let ms = left.as_micros().div_ceil(1000);
            ms.min(libc::c_int::MAX as u128) as libc::c_int
        }
    }
}

/// Waits until `fd` is ready for `interest` (or reports an error or hang-up, which ends
/// every wait) or `deadline` passes (`None`: forever). Returns whether it became ready:
/// `false` only on timeout. Retries on `EINTR`.
pub fn poll_fd(
    fd: BorrowedFd<'_>,
    interest: Interest,
    deadline: Option<Instant>,
) -> io::Result<bool> {
    loop {
        match poll_fd_once(fd, interest, deadline) {
            Ok(false) if deadline.is_some_and(|d| Instant::now() < d) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

/// One `poll` of `fd` for `interest` until `deadline`: [`poll_fd`] without its retries,
/// for a caller that must look at signals between two waits (Python's). Returns whether
/// `fd` became ready; a signal ends the wait with [`io::ErrorKind::Interrupted`], and the
/// kernel may end it a little early.
pub fn poll_fd_once(
    fd: BorrowedFd<'_>,
    interest: Interest,
    deadline: Option<Instant>,
) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: interest.poll_events(),
        revents: 0,
    };
    // SAFETY: `pfd` is one valid pollfd that lives across the call.
    syscall!(poll(&mut pfd, 1, poll_timeout(deadline))).map(|_| pfd.revents != 0)
}

/// Waits on several descriptors at once, each for `interest`, until one is ready (or
/// reports an error or hang-up) or `timeout` passes (`None`: forever; a timeout is kept to
/// the nanosecond, `ppoll`). Returns one [`Event`] per descriptor, in order, its token the
/// descriptor's index; all of them empty ([`Event::is_ready`] false) on timeout. One call:
/// `EINTR` is returned as an `Interrupted` error, for the caller to look again.
pub fn poll_many(
    fds: &[BorrowedFd<'_>],
    interest: Interest,
    timeout: Option<Duration>,
) -> io::Result<Vec<Event>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: interest.poll_events(),
            revents: 0,
        })
        .collect();
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds` is a valid array of pollfd of the length given, `ts_ptr` null or a
    // live timespec; no signal mask.
    syscall!(ppoll(
        pfds.as_mut_ptr(),
        pfds.len() as libc::nfds_t,
        ts_ptr,
        std::ptr::null()
    ))?;
    Ok(pfds
        .iter()
        .enumerate()
        .map(|(i, p)| Event::from_poll(Token(i as u64), p.revents))
        .collect())
}

/// Waits once until `fd` is ready for `interest` (or reports an error or hang-up) or
/// `timeout` passes, to the nanosecond: whether it became ready. An interrupted wait
/// returns the `Interrupted` error; callers that only sleep until they look again may
/// ignore every error.
pub fn poll_for(fd: BorrowedFd<'_>, interest: Interest, timeout: Duration) -> io::Result<bool> {
    Ok(poll_many(&[fd], interest, Some(timeout))?[0].is_ready())
}

/// Whether the page holding `addr` is resident in memory (`mincore`). An address this
/// process has not mapped is an error (`ENOMEM`), not undefined behaviour.
pub fn page_resident(addr: *const u8) -> io::Result<bool> {
    let page = page_size();
    let start = (addr as usize & !(page - 1)) as *mut libc::c_void;
    let mut vec = [0u8; 1];
    // SAFETY: the kernel checks that `start..start + page` is mapped (ENOMEM if not);
    // `vec` has room for the one page's byte.
    syscall!(mincore(start, page, vec.as_mut_ptr()))?;
    Ok(vec[0] & 1 != 0)
}

/// The CPU the calling thread runs on (`u32::MAX - 1` if the kernel cannot tell).
pub fn current_cpu() -> u32 {
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).unwrap_or(u32::MAX - 1)
}

/// Gives the CPU to another runnable thread, if any.
pub fn yield_now() {
    // SAFETY: sched_yield has no preconditions.
    unsafe { libc::sched_yield() };
}

/// The size of a memory page.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

/// This process's real uid.
pub fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// This process's effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// An epoll instance: the single readable fd that stands for several (XCM's model).
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    /// A new, empty epoll set.
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: no pointers; the flag is valid.
        let fd = syscall!(epoll_create1(libc::EPOLL_CLOEXEC))?;
        // SAFETY: epoll_create1 returned a fresh descriptor.
        let fd = unsafe { owned(fd) };
        Ok(Epoll { fd })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: Token) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events,
            u64: token.0,
        };
        // SAFETY: `ev` is a valid epoll_event for the call; the fds are open.
        syscall!(epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev))?;
        Ok(())
    }

    /// Watches `fd` for `interest`; its events will carry `token`.
    pub fn add(&self, fd: RawFd, interest: Interest, token: Token) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, interest.epoll_events(), token)
    }

    /// Changes what `fd` is watched for, and the token its events carry.
    pub fn modify(&self, fd: RawFd, interest: Interest, token: Token) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, interest.epoll_events(), token)
    }

    /// Stops watching `fd`.
    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, Token(0))
    }

    /// Waits for events until `deadline` (None = forever) and puts them in `out` (which it
    /// clears first; at most 32 per call). Empty on timeout. Retries on `EINTR`.
    pub fn wait(&self, deadline: Option<Instant>, out: &mut Vec<Event>) -> io::Result<()> {
        out.clear();
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 32];
        loop {
            // SAFETY: `evs` has room for the 32 events we allow the kernel to write.
            let n = match syscall!(epoll_wait(
                self.fd.as_raw_fd(),
                evs.as_mut_ptr(),
                evs.len() as libc::c_int,
                poll_timeout(deadline)
            )) {
                Ok(n) => n as usize,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            out.extend(
                evs[..n]
                    .iter()
                    .map(|e| Event::from_epoll(Token(e.u64), e.events)),
            );
            return Ok(());
        }
    }

    /// The epoll descriptor itself.
    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }
}

/// A monotonic-clock timer descriptor: readable once its deadline has passed (until
/// re-armed), so that an event loop wakes for a deadline of ours.
pub struct TimerFd {
    fd: OwnedFd,
}

impl TimerFd {
    /// A new, disarmed, non-blocking timer.
    pub fn new() -> io::Result<TimerFd> {
        // SAFETY: no pointers; valid constants.
        let fd = syscall!(timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_CLOEXEC | libc::TFD_NONBLOCK
        ))?;
        // SAFETY: timerfd_create returned a fresh descriptor.
        let fd = unsafe { owned(fd) };
        Ok(TimerFd { fd })
    }

    /// Arms the timer to fire `after` from now (at least 1 ns), or disarms it (`None`).
    /// Re-arming also clears an expiry that was not read yet.
    pub fn set(&self, after: Option<Duration>) -> io::Result<()> {
        let value = match after {
            None => libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            Some(d) => {
                let d = d.max(Duration::from_nanos(1));
                libc::timespec {
                    tv_sec: d.as_secs().min(i32::MAX as u64) as libc::time_t,
                    tv_nsec: d.subsec_nanos() as libc::c_long,
                }
            }
        };
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        // SAFETY: `spec` is a valid itimerspec; a null old-value pointer is allowed.
        syscall!(timerfd_settime(
            self.fd.as_raw_fd(),
            0,
            &spec,
            std::ptr::null_mut()
        ))?;
        Ok(())
    }

    /// The descriptor, for epoll.
    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }
}

/// Pins the calling thread to one CPU (threads it starts afterwards inherit the mask).
/// Benchmarks use it to place both sides of a measurement.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cpu {cpu} out of range"),
        ));
    }
    // SAFETY: `cpu` is below CPU_SETSIZE, checked above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    syscall!(sched_setaffinity(
        0,
        std::mem::size_of::<libc::cpu_set_t>(),
        &set
    ))?;
    Ok(())
}

/// How many CPUs the calling thread may run on (its affinity mask); `None` if the kernel
/// does not tell.
pub fn allowed_cpus() -> Option<usize> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    syscall!(sched_getaffinity(
        0,
        std::mem::size_of::<libc::cpu_set_t>(),
        &mut set
    ))
    .ok()?;
    // SAFETY: `set` was filled in by the kernel above.
    Some(unsafe { libc::CPU_COUNT(&set) } as usize)
}

/// User and system CPU time this process has used so far (zero if the kernel cannot
/// tell), for CPU-per-message accounting.
pub fn cpu_time() -> Duration {
    // SAFETY: rusage is plain data; all-zero is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid rusage to fill in.
    if syscall!(getrusage(libc::RUSAGE_SELF, &mut ru)).is_err() {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// `membarrier(2)` commands (from `linux/membarrier.h`).
const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;

fn membarrier(cmd: libc::c_int) -> io::Result<libc::c_long> {
    // SAFETY: membarrier takes plain integers; unknown commands fail with EINVAL.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Registers this process as a target of other processes' global expedited membarriers
/// (once per process). Returns whether the kernel supports them; containers whose
/// seccomp profile blocks membarrier get `false`.
pub fn membarrier_register() -> bool {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REGISTERED.get_or_init(|| {
        let supported = membarrier(MEMBARRIER_CMD_QUERY)
            .is_ok_and(|mask| mask & MEMBARRIER_CMD_GLOBAL_EXPEDITED as libc::c_long != 0);
        supported && membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED).is_ok()
    })
}

/// Makes every CPU that runs a registered process execute a full memory barrier before
/// this returns (the heavy half of an asymmetric fence).
pub fn membarrier_global() -> io::Result<()> {
    membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work() {
        let t0 = cpu_time();
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(30);
        let mut x = 0u64;
        while std::time::Instant::now() < deadline {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(cpu_time() > t0, "30 ms of spinning used no CPU time");
    }

    #[test]
    fn poll_many_reports_each_descriptor_in_order() {
        use std::os::fd::AsFd;
        let (a, b) = socket::seqpacket_pair().unwrap();
        let (c, d) = socket::seqpacket_pair().unwrap();
        let short = Some(Duration::from_millis(5));
        let none = poll_many(&[b.as_fd(), d.as_fd()], Interest::READABLE, short).unwrap();
        assert!(none.iter().all(|e| !e.is_ready()), "nothing sent yet");
        socket::send(c.as_fd(), b"x").unwrap();
        let ev = poll_many(&[b.as_fd(), d.as_fd()], Interest::READABLE, None).unwrap();
        assert!(!ev[0].is_ready() && ev[1].is_readable());
        assert_eq!(ev[1].token(), Token(1));
        drop(a);
        assert!(poll_for(b.as_fd(), Interest::READABLE, Duration::from_secs(1)).unwrap());
    }

    #[test]
    fn a_touched_page_is_resident_and_an_unmapped_one_an_error() {
        let v = vec![1u8; 3 * page_size()];
        assert!(page_resident(v[page_size()..].as_ptr()).unwrap());
        assert!(page_resident(std::ptr::null()).is_err());
    }

    #[test]
    fn pinning_to_an_absurd_cpu_is_refused() {
        let e = pin_to_cpu(1 << 20).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
