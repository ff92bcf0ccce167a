//! The calls on the fd table: `close`, `close_range`, `closefrom`, `dup`, `dup2`, `dup3`,
//! `fcntl`, `fcntl64`, `ioctl`. The library's table follows every fd number a shm
//! connection, listener or epoll instance gets or loses; its own fds (control sockets,
//! hidden TCP sockets) stay out of the program's reach; and the per-fd flags a program
//! sets on a shm fd (`O_NONBLOCK`, `FD_CLOEXEC`) are kept as the program sees them,
//! while the kernel's stay as the library needs them.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use libc::{c_int, c_ulong};

use super::{hook, shm};
use crate::sock::Entry;
use crate::state::{self, owner};
use crate::stream;
use crate::table::{self, Removed};
use crate::{debug, errno, fail, inside, real, set_errno, wait, Guard};

/// Drops what a closed or replaced fd named, inside the library.
fn release(removed: Removed) {
    let _g = Guard::enter();
    match removed {
        Removed::Sock(e) => drop(e),
        Removed::Listener(reg) => {
            // The helper holds one reference, the table one per fd naming it.
            // After a fork the other processes may still accept on it (a prefork
            // server's parent closes its copy): the helper keeps answering them.
            if Arc::strong_count(&reg) <= 2 && !reg.forked() {
                reg.stop_now();
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if inside() || !table::any() || !owner() {
        // SAFETY: the caller's fd.
        return unsafe { real::close(fd) };
    }
    if table::is_internal(fd) {
        // Not the program's: without the library this number would not be open.
        return fail(libc::EBADF);
    }
    let removed = table::remove(fd);
    {
        let _g = Guard::enter();
        wait::forget_epoll(fd);
    }
    // SAFETY: the caller's fd.
    let r = unsafe { real::close(fd) };
    let e = errno();
    if let Some(rm) = removed {
        release(rm);
    }
    set_errno(e);
    r
}

/// The kernel's `close_range` (also where the C library has no wrapper).
fn sys_close_range(first: libc::c_uint, last: libc::c_uint, flags: c_int) -> c_int {
    // SAFETY: the C library's close_range with the caller's arguments.
    let r = unsafe { real::close_range(first, last, flags) };
    if r == -1 && errno() == libc::ENOSYS {
        // SAFETY: the system call itself (Linux 5.9+; else ENOSYS again).
        return unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) } as c_int;
    }
    r
}

/// `close_range` (and `closefrom`) as `close` does it for each fd: the library's own
/// fds in the range stay open (the program never opened them: a daemon closing "every
/// fd above 2" must not pull a connection's control socket away, whose number a new
/// file would then reuse and receive doorbells, or be closed by the library later), and
/// shm connections, listeners and epoll instances in the range leave the table.
fn close_range_hooked(first: libc::c_uint, last: libc::c_uint, flags: c_int) -> c_int {
    if inside() || !table::any() || !owner() || first > last {
        return sys_close_range(first, last, flags);
    }
    let in_range = |fd: &c_int| *fd >= 0 && (first..=last).contains(&(*fd as libc::c_uint));
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0 {
        // Nothing closes: the program's view of FD_CLOEXEC on its shm fds follows.
        let r = sys_close_range(first, last, flags);
        if r == 0 {
            for fd in table::sock_fds().into_iter().filter(in_range) {
                table::set_app_cloexec(fd, true);
            }
        }
        return r;
    }
    let keep: Vec<c_int> = state::internal_fds().into_iter().filter(in_range).collect();
    let removed: Vec<Removed> = {
        let _g = Guard::enter();
        table::tracked_fds()
            .into_iter()
            .filter(in_range)
            .filter_map(|fd| {
                wait::forget_epoll(fd);
                table::remove(fd)
            })
            .collect()
    };
    // The gaps between the kept fds (sorted, each in the range).
    let mut lo = Some(first);
    let mut r = 0;
    for k in keep {
        let k = k as libc::c_uint;
        let Some(l) = lo else { break };
        if k > l {
            r = sys_close_range(l, k - 1, flags);
            if r != 0 {
                break;
            }
        }
        lo = k.checked_add(1).filter(|&n| n <= last);
    }
    if r == 0 {
        if let Some(l) = lo {
            r = sys_close_range(l, last, flags);
        }
    }
    let e = errno();
    for rm in removed {
        release(rm);
    }
    set_errno(e);
    r
}

#[no_mangle]
pub unsafe extern "C" fn close_range(
    first: libc::c_uint,
    last: libc::c_uint,
    flags: c_int,
) -> c_int {
    close_range_hooked(first, last, flags)
}

/// glibc's `closefrom` calls its internal `close_range`, past this library's hook: so
/// it is hooked itself.
#[no_mangle]
pub unsafe extern "C" fn closefrom(low: c_int) {
    let low = low.max(0) as libc::c_uint;
    if close_range_hooked(low, libc::c_uint::MAX, 0) != 0 {
        // An old kernel: close what is open, one by one, as the C library would.
        let g = Guard::enter();
        let fds: Vec<c_int> = std::fs::read_dir("/proc/self/fd")
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        drop(g);
        for fd in fds {
            if fd >= low as c_int {
                // SAFETY: the hooked close: internal fds stay, tracked ones leave the table.
                unsafe { close(fd) };
            }
        }
    }
}

/// After a successful dup onto `new`: `new` names what `old` names; `cloexec` is the
/// FD_CLOEXEC the dup gave `new` (a shm fd keeps it set in the kernel regardless).
fn after_dup(old: c_int, new: c_int, replaced: Option<Removed>, cloexec: bool) {
    let _g = Guard::enter();
    if !owner() {
        return;
    }
    // `new` no longer names an epoll instance it may have named.
    wait::forget_epoll(new);
    table::alias(old, new);
    if table::sock(new).is_some() {
        // SAFETY: F_SETFD on the fd the dup just made.
        unsafe { real::fcntl(new, libc::F_SETFD, libc::FD_CLOEXEC as usize) };
        table::set_app_cloexec(new, cloexec);
    }
    if let Some(rm) = replaced {
        release(rm);
    }
}

/// `dup2`/`dup3` onto one of the library's own fds: refused with `EBUSY` (what the
/// kernel says when the target number is being opened). Without the library the number
/// would be free and the dup would succeed; letting it replace a control socket would
/// make the library ring doorbells into the program's file (a byte in someone's stream
/// or file) and lose the connection's wake-ups, and the fd cannot be moved: its number
/// is held inside the shmlink connection. A loud error instead of silent corruption.
fn internal_target(new: c_int) -> c_int {
    debug!("dup onto fd {new}, one of the library's own: EBUSY");
    libc::EBUSY
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the caller's fd.
    let r = unsafe { real::dup(fd) };
    if r >= 0 && !inside() && table::any() {
        after_dup(fd, r, None, false);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if inside() || !table::any() || old == new || !owner() {
        // SAFETY: the caller's fds.
        return unsafe { real::dup2(old, new) };
    }
    if table::is_internal(new) {
        return fail(internal_target(new));
    }
    // SAFETY: the caller's fds.
    let r = unsafe { real::dup2(old, new) };
    if r >= 0 {
        let e = errno();
        let replaced = table::remove(new);
        after_dup(old, new, replaced, false);
        set_errno(e);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if inside() || !table::any() || !owner() {
        // SAFETY: the caller's fds.
        return unsafe { real::dup3(old, new, flags) };
    }
    if table::is_internal(new) && old != new {
        return fail(internal_target(new));
    }
    // SAFETY: the caller's fds.
    let r = unsafe { real::dup3(old, new, flags) };
    if r >= 0 {
        let e = errno();
        let replaced = table::remove(new);
        after_dup(old, new, replaced, flags & libc::O_CLOEXEC != 0);
        set_errno(e);
    }
    r
}

fn shm_fcntl(
    e: &Entry,
    fd: c_int,
    cmd: c_int,
    arg: usize,
    real_fcntl: unsafe fn(c_int, c_int, usize) -> c_int,
) -> c_int {
    match cmd {
        libc::F_GETFL => {
            // SAFETY: F_GETFL on the caller's fd.
            let fl = unsafe { real_fcntl(fd, cmd, 0) };
            if fl < 0 {
                return fl;
            }
            if e.nonblocking.load(Ordering::Relaxed) {
                fl | libc::O_NONBLOCK
            } else {
                fl & !libc::O_NONBLOCK
            }
        }
        libc::F_SETFL => {
            let nb = arg as c_int & libc::O_NONBLOCK != 0;
            // The control socket stays blocking (the library sleeps on it).
            // SAFETY: F_SETFL on the caller's fd.
            let r = unsafe { real_fcntl(fd, cmd, (arg as c_int & !libc::O_NONBLOCK) as usize) };
            if r == 0 {
                e.nonblocking.store(nb, Ordering::Relaxed);
            }
            r
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: the caller's arguments.
            let r = unsafe { real_fcntl(fd, cmd, arg) };
            if r >= 0 {
                after_dup(fd, r, None, cmd == libc::F_DUPFD_CLOEXEC);
            }
            r
        }
        libc::F_GETFD => {
            // SAFETY: F_GETFD on the caller's fd (it reports EBADF if it is not open).
            let fl = unsafe { real_fcntl(fd, cmd, 0) };
            if fl < 0 {
                return fl;
            }
            if table::app_cloexec(fd) {
                fl | libc::FD_CLOEXEC
            } else {
                fl & !libc::FD_CLOEXEC
            }
        }
        libc::F_SETFD => {
            table::set_app_cloexec(fd, arg as c_int & libc::FD_CLOEXEC != 0);
            0
        }
        // SAFETY: the caller's arguments.
        _ => unsafe { real_fcntl(fd, cmd, arg) },
    }
}

/// `fcntl` and `fcntl64`, with the C library's function of that name.
fn fcntl_with(
    fd: c_int,
    cmd: c_int,
    arg: usize,
    real_fcntl: unsafe fn(c_int, c_int, usize) -> c_int,
) -> c_int {
    if let Some(e) = shm(fd) {
        return shm_fcntl(&e, fd, cmd, arg, real_fcntl);
    }
    // SAFETY: the caller's arguments.
    let r = unsafe { real_fcntl(fd, cmd, arg) };
    if r >= 0 && matches!(cmd, libc::F_DUPFD | libc::F_DUPFD_CLOEXEC) && !inside() && table::any() {
        after_dup(fd, r, None, cmd == libc::F_DUPFD_CLOEXEC);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    fcntl_with(fd, cmd, arg, real::fcntl)
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    fcntl_with(fd, cmd, arg, real::fcntl64)
}

hook! {
    fn ioctl(fd: c_int, req: c_ulong, arg: usize) -> c_int;
    if let Some(e) = shm(fd) => {
        let _g = Guard::enter();
        match req {
            libc::FIONBIO => {
                if arg == 0 {
                    return fail(libc::EFAULT);
                }
                // SAFETY: FIONBIO's argument points to an int.
                let on = unsafe { *(arg as *const c_int) } != 0;
                e.nonblocking.store(on, Ordering::Relaxed);
                0
            }
            libc::FIOCLEX | libc::FIONCLEX => {
                table::set_app_cloexec(fd, req == libc::FIOCLEX);
                0
            }
            libc::FIONREAD => {
                if arg == 0 {
                    return fail(libc::EFAULT);
                }
                let n = stream::available(&e).min(c_int::MAX as usize) as c_int;
                // SAFETY: FIONREAD's argument points to an int.
                unsafe { *(arg as *mut c_int) = n };
                0
            }
            _ => {
                let tcp = e.lock().tcp.as_raw_fd();
                // SAFETY: the caller's request, on the TCP socket underneath.
                unsafe { real::ioctl(tcp, req, arg) }
            }
        }
    }
}
