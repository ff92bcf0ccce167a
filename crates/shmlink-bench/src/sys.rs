//! The OS calls the methods need that `std` does not offer: small fd helpers, over the
//! measurement core's [`syscall!`] and error helpers.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub use shmlink_measure::sys::{ctx, err};
pub(crate) use shmlink_sys::syscall;

/// Takes ownership of an fd number this process inherited from its parent.
pub fn inherited_fd(text: &str) -> io::Result<OwnedFd> {
    let fd: RawFd = text
        .parse()
        .map_err(|_| err(format!("invalid inherited fd {text:?}")))?;
    // F_GETFD fails with EBADF unless the fd is open.
    // SAFETY: F_GETFD reads the fd's flags and touches no memory.
    syscall!(fcntl(fd, libc::F_GETFD)).map_err(ctx(format!("inherited fd {fd}")))?;
    // SAFETY: the parent passed this open fd for this process to own; nothing else in
    // this process refers to it (it was inherited, not opened here).
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A pipe: (read end, write end), both close-on-exec.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two fds pipe2 writes.
    syscall!(pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC)).map_err(ctx("pipe2"))?;
    // SAFETY: pipe2 succeeded, so both are new fds that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A connected pair of Unix sockets of `ty` (`SOCK_STREAM`, `SOCK_SEQPACKET`,
/// `SOCK_DGRAM`), close-on-exec.
pub fn socketpair(ty: libc::c_int) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two fds socketpair writes.
    syscall!(socketpair(
        libc::AF_UNIX,
        ty | libc::SOCK_CLOEXEC,
        0,
        fds.as_mut_ptr()
    ))
    .map_err(ctx("socketpair"))?;
    // SAFETY: socketpair succeeded, so both are new fds that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sets an `int` socket option.
pub fn setsockopt_int(
    fd: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option value is a valid c_int of the size passed.
    syscall!(setsockopt(
        fd.as_raw_fd(),
        level,
        name,
        (&value as *const libc::c_int).cast(),
        std::mem::size_of::<libc::c_int>() as libc::socklen_t
    ))?;
    Ok(())
}

/// Reads an `int` socket option.
pub fn getsockopt_int(fd: &impl AsRawFd, level: libc::c_int, name: libc::c_int) -> io::Result<i32> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for getsockopt to write an int into.
    syscall!(getsockopt(
        fd.as_raw_fd(),
        level,
        name,
        (&mut value as *mut libc::c_int).cast(),
        &mut len
    ))?;
    Ok(value)
}

/// A C string from a path or name without NUL bytes.
pub fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| err(format!("name {s:?} contains a NUL byte")))
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    shmlink_sys::euid() == 0
}

/// Reads an integer from a `/proc/sys` file.
pub fn proc_sys(path: &str) -> Option<usize> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Runs `f` with the calling thread allowed on `cpus` (the threads `f` starts keep that
/// mask: a library's helper threads, not pinned with the caller), then gives the thread
/// its own mask back.
#[cfg_attr(not(feature = "zmq"), allow(dead_code))] // only ZeroMQ uses it
pub(crate) fn with_cpus<T>(cpus: &[usize], f: impl FnOnce() -> T) -> io::Result<T> {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut own: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `own` is a valid cpu_set_t of `size` bytes for the kernel to fill.
    syscall!(sched_getaffinity(0, size, &mut own)).map_err(ctx("sched_getaffinity"))?;
    // SAFETY: as above.
    let mut wide: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `cpu` is below CPU_SETSIZE (filtered above).
        unsafe { libc::CPU_SET(cpu, &mut wide) };
    }
    // SAFETY: `wide` is a valid cpu_set_t of `size` bytes.
    syscall!(sched_setaffinity(0, size, &wide)).map_err(ctx("sched_setaffinity (widen)"))?;
    let out = f();
    // SAFETY: `own` is a valid cpu_set_t of `size` bytes.
    syscall!(sched_setaffinity(0, size, &own)).map_err(ctx("sched_setaffinity (restore)"))?;
    Ok(out)
}

/// The CPUs this process could run on before [`pin`] narrowed them.
static UNPINNED: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();

/// Pins the calling thread (the process's main thread: its mask is the process's in
/// `/proc/self/status`) to `cpu`, after noting the CPUs it had ([`unpinned_cpus`]).
pub(crate) fn pin(cpu: Option<usize>) -> io::Result<()> {
    if let Some(cpu) = cpu {
        UNPINNED.get_or_init(shmlink_measure::cpus::allowed_cpus);
        shmlink_measure::sys::pin_to_cpu(cpu)?;
    }
    Ok(())
}

/// The CPUs this process could run on before [`pin`] pinned it (all it may run on if it
/// was not pinned): where a library's own threads run, like the unpinned processes of
/// the library's own benchmark (ZeroMQ's I/O thread, see `methods::zmq`).
#[cfg_attr(not(feature = "zmq"), allow(dead_code))] // only ZeroMQ uses it
pub(crate) fn unpinned_cpus() -> Vec<usize> {
    UNPINNED
        .get()
        .cloned()
        .unwrap_or_else(shmlink_measure::cpus::allowed_cpus)
}
