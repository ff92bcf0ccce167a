//! The C library's own functions, found with `dlsym(RTLD_NEXT)` on first use: what every
//! call this library does not take over (and every call it makes itself) reaches.
//!
//! Each wrapper caches its pointer in a static. A symbol the C library lacks (a `_chk`
//! variant of an old glibc) makes the call fail with `ENOSYS` instead of crashing.

use std::sync::atomic::{AtomicUsize, Ordering};

use libc::{c_char, c_int, c_ulong, c_void, size_t, sockaddr, socklen_t, ssize_t};

/// Looks `name` (NUL-terminated) up in the libraries loaded after this one; 0 if absent.
fn resolve(name: &'static str) -> usize {
    // SAFETY: `name` is a NUL-terminated literal (the macro appends "\0"); dlsym reads it
    // and returns a pointer or null.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast::<c_char>()) as usize }
}

/// Looks a cached symbol up once; 0 if the C library does not have it.
fn cached(slot: &AtomicUsize, name: &'static str) -> usize {
    let p = slot.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    let p = resolve(name);
    slot.store(p, Ordering::Relaxed);
    p
}

fn no_symbol() {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
}

macro_rules! real_fns {
    ($( $name:ident ( $($a:ident : $t:ty),* ) -> $r:ty ; )*) => {
        $(
            /// The C library's function of this name.
            ///
            /// # Safety
            /// As for the C function: the pointers must be valid for it.
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn $name($($a: $t),*) -> $r {
                static SLOT: AtomicUsize = AtomicUsize::new(0);
                let p = cached(&SLOT, concat!(stringify!($name), "\0"));
                if p == 0 {
                    no_symbol();
                    return <$r>::from(-1i8);
                }
                // SAFETY: `p` is the address of the C library's function of this name,
                // whose C signature is the one this wrapper declares.
                let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { std::mem::transmute(p) };
                // SAFETY: the caller upholds the C function's contract.
                unsafe { f($($a),*) }
            }
        )*
    };
}

real_fns! {
    connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    listen(fd: c_int, backlog: c_int) -> c_int;
    accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t;
    write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t;
    writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t;
    recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t;
    __recv_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t;
    recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    __recvfrom_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t;
    send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
    sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
    sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t;
    sendfile(out: c_int, inp: c_int, off: *mut libc::off_t, n: size_t) -> ssize_t;
    sendfile64(out: c_int, inp: c_int, off: *mut libc::off64_t, n: size_t) -> ssize_t;
    shutdown(fd: c_int, how: c_int) -> c_int;
    sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int) -> c_int;
    recvmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int, timeout: *mut libc::timespec) -> c_int;
    splice(fd_in: c_int, off_in: *mut libc::loff_t, fd_out: c_int, off_out: *mut libc::loff_t, len: size_t, flags: libc::c_uint) -> ssize_t;
    close(fd: c_int) -> c_int;
    close_range(first: libc::c_uint, last: libc::c_uint, flags: c_int) -> c_int;
    dup(fd: c_int) -> c_int;
    dup2(old: c_int, new: c_int) -> c_int;
    dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int;
    fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int;
    ioctl(fd: c_int, req: c_ulong, arg: usize) -> c_int;
    getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int;
    __poll_chk(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int, fdslen: size_t) -> c_int;
    ppoll(fds: *mut libc::pollfd, n: libc::nfds_t, ts: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
    __ppoll_chk(fds: *mut libc::pollfd, n: libc::nfds_t, ts: *const libc::timespec, mask: *const libc::sigset_t, fdslen: size_t) -> c_int;
    epoll_pwait2(epfd: c_int, evs: *mut libc::epoll_event, max: c_int, ts: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
    select(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, t: *mut libc::timeval) -> c_int;
    pselect(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, t: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
    epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut libc::epoll_event) -> c_int;
    epoll_wait(epfd: c_int, evs: *mut libc::epoll_event, max: c_int, timeout: c_int) -> c_int;
    epoll_pwait(epfd: c_int, evs: *mut libc::epoll_event, max: c_int, timeout: c_int, mask: *const libc::sigset_t) -> c_int;
}

/// `poll` without a C library symbol of its own for an unused argument count.
pub fn poll_one(fd: c_int, events: i16, timeout_ms: c_int) -> c_int {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { poll(&mut p, 1, timeout_ms) };
    if r > 0 {
        c_int::from(p.revents)
    } else {
        r
    }
}

real_fns! {
    execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    execv(path: *const c_char, argv: *const *const c_char) -> c_int;
    execvp(file: *const c_char, argv: *const *const c_char) -> c_int;
    execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    execveat(dirfd: c_int, path: *const c_char, argv: *const *const c_char, envp: *const *const c_char, flags: c_int) -> c_int;
    fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    posix_spawn(pid: *mut libc::pid_t, path: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    posix_spawnp(pid: *mut libc::pid_t, file: *const c_char, actions: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t, argv: *const *mut c_char, envp: *const *mut c_char) -> c_int;
    system(command: *const c_char) -> c_int;
}

/// The C library's `popen` (null, with `ENOSYS`, if it has none).
///
/// # Safety
/// As for the C function: both strings valid and NUL-terminated.
pub unsafe fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    static SLOT: AtomicUsize = AtomicUsize::new(0);
    let p = cached(&SLOT, "popen\0");
    if p == 0 {
        no_symbol();
        return std::ptr::null_mut();
    }
    // SAFETY: `p` is the C library's `popen`, whose C signature this is.
    let f: unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE =
        unsafe { std::mem::transmute(p) };
    // SAFETY: the caller upholds popen's contract.
    unsafe { f(command, mode) }
}

/// Sets errno and returns -1 in the given integer type.
pub(crate) fn fail<T: From<i8>>(errno: libc::c_int) -> T {
    set_errno(errno);
    T::from(-1)
}

pub(crate) fn set_errno(errno: libc::c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = errno };
}

pub(crate) fn errno() -> libc::c_int {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() }
}
