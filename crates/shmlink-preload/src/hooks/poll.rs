//! The readiness waits: `poll`, `ppoll`, `select`, `pselect` (and the fortified
//! `__poll_chk`, `__ppoll_chk`), `epoll_ctl`, `epoll_wait`, `epoll_pwait`, `epoll_pwait2`.
//! A wait with a shm connection among its fds is the library's (`wait`): a shm fd is
//! readable when its ring holds bytes, which the kernel cannot see on the control socket
//! alone.

use libc::{c_int, size_t};

use super::{hook, shm};
use crate::{inside, table, wait, Guard};

/// Whether any of `fds` is a shm connection (then the wait is ours).
unsafe fn poll_has_shm(fds: *const libc::pollfd, n: libc::nfds_t) -> bool {
    if !table::any() || inside() || fds.is_null() || n == 0 || n > 1 << 20 {
        return false;
    }
    // SAFETY: the caller's array of `n` pollfds.
    let v = unsafe { std::slice::from_raw_parts(fds, n as usize) };
    v.iter().any(|p| p.fd >= 0 && table::sock(p.fd).is_some())
}

hook! {
    fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int;
    before_real {
        // SAFETY: the caller's array.
        if unsafe { poll_has_shm(fds, n) } {
            let _g = Guard::enter();
            // SAFETY: checked non-null, `n` entries.
            let v = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
            return wait::poll(v, timeout, None);
        }
    }
}

hook! {
    fn __poll_chk(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int, fdslen: size_t) -> c_int;
    before_real {
        // SAFETY: the caller's array.
        if unsafe { poll_has_shm(fds, n) } {
            if (fdslen / std::mem::size_of::<libc::pollfd>()) < n as usize {
                // SAFETY: as the C library's own check does.
                unsafe { libc::abort() };
            }
            // SAFETY: the caller's arguments.
            return unsafe { poll(fds, n, timeout) };
        }
    }
}

fn timespec_ms(ts: *const libc::timespec) -> c_int {
    if ts.is_null() {
        return -1;
    }
    // SAFETY: the caller's timespec.
    let t = unsafe { *ts };
    let ms = (t.tv_sec as i128) * 1000 + (t.tv_nsec as i128 + 999_999) / 1_000_000;
    ms.clamp(0, c_int::MAX as i128) as c_int
}

hook! {
    fn ppoll(
        fds: *mut libc::pollfd,
        n: libc::nfds_t,
        ts: *const libc::timespec,
        mask: *const libc::sigset_t,
    ) -> c_int;
    before_real {
        // SAFETY: the caller's array.
        if unsafe { poll_has_shm(fds, n) } {
            let _g = Guard::enter();
            // SAFETY: checked non-null, `n` entries.
            let v = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
            let m = (!mask.is_null()).then_some(mask);
            return wait::poll(v, timespec_ms(ts), m);
        }
    }
}

hook! {
    fn __ppoll_chk(
        fds: *mut libc::pollfd,
        n: libc::nfds_t,
        ts: *const libc::timespec,
        mask: *const libc::sigset_t,
        fdslen: size_t,
    ) -> c_int;
    before_real {
        // SAFETY: the caller's array.
        if unsafe { poll_has_shm(fds, n) } {
            if (fdslen / std::mem::size_of::<libc::pollfd>()) < n as usize {
                // SAFETY: as the C library's own check does.
                unsafe { libc::abort() };
            }
            // SAFETY: the caller's arguments.
            return unsafe { ppoll(fds, n, ts, mask) };
        }
    }
}

/// Whether the select sets name a shm connection.
unsafe fn select_has_shm(nfds: c_int, sets: [*mut libc::fd_set; 3]) -> bool {
    if !table::any() || inside() {
        return false;
    }
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        // SAFETY: the caller's sets cover `nfds`.
        let named = sets
            .iter()
            .any(|s| !s.is_null() && unsafe { libc::FD_ISSET(fd, *s) });
        if named && table::sock(fd).is_some() {
            return true;
        }
    }
    false
}

hook! {
    fn select(
        nfds: c_int,
        r: *mut libc::fd_set,
        w: *mut libc::fd_set,
        x: *mut libc::fd_set,
        t: *mut libc::timeval,
    ) -> c_int;
    before_real {
        // SAFETY: the caller's sets.
        if unsafe { select_has_shm(nfds, [r, w, x]) } {
            let _g = Guard::enter();
            let ms = if t.is_null() {
                -1
            } else {
                // SAFETY: the caller's timeval.
                let tv = unsafe { *t };
                ((tv.tv_sec as i128) * 1000 + (tv.tv_usec as i128 + 999) / 1000)
                    .clamp(0, c_int::MAX as i128) as c_int
            };
            // SAFETY: the caller's sets.
            let n = unsafe { wait::select(nfds, r, w, x, ms, None) };
            if !t.is_null() && n == 0 {
                // SAFETY: the caller's timeval (Linux reports the time left).
                unsafe {
                    (*t).tv_sec = 0;
                    (*t).tv_usec = 0;
                }
            }
            return n;
        }
    }
}

hook! {
    fn pselect(
        nfds: c_int,
        r: *mut libc::fd_set,
        w: *mut libc::fd_set,
        x: *mut libc::fd_set,
        t: *const libc::timespec,
        mask: *const libc::sigset_t,
    ) -> c_int;
    before_real {
        // SAFETY: the caller's sets.
        if unsafe { select_has_shm(nfds, [r, w, x]) } {
            let _g = Guard::enter();
            let m = (!mask.is_null()).then_some(mask);
            // SAFETY: the caller's sets.
            return unsafe { wait::select(nfds, r, w, x, timespec_ms(t), m) };
        }
    }
}

hook! {
    fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut libc::epoll_event) -> c_int;
    if shm(fd).is_some() => {
        let _g = Guard::enter();
        wait::epoll_ctl(epfd, op, fd, ev)
    }
}

hook! {
    fn epoll_wait(epfd: c_int, evs: *mut libc::epoll_event, max: c_int, timeout: c_int) -> c_int;
    if table::any() && !inside() => {
        let _g = Guard::enter();
        // SAFETY: the caller's arguments.
        unsafe { wait::epoll_wait(epfd, evs, max, timeout, std::ptr::null()) }
    }
}

hook! {
    fn epoll_pwait(
        epfd: c_int,
        evs: *mut libc::epoll_event,
        max: c_int,
        timeout: c_int,
        mask: *const libc::sigset_t,
    ) -> c_int;
    if table::any() && !inside() => {
        let _g = Guard::enter();
        // SAFETY: the caller's arguments.
        unsafe { wait::epoll_wait(epfd, evs, max, timeout, mask) }
    }
}

hook! {
    fn epoll_pwait2(
        epfd: c_int,
        evs: *mut libc::epoll_event,
        max: c_int,
        ts: *const libc::timespec,
        mask: *const libc::sigset_t,
    ) -> c_int;
    if table::any() && !inside() => {
        let _g = Guard::enter();
        // Millisecond resolution (rounded up) once shm members are involved.
        // SAFETY: the caller's arguments.
        unsafe { wait::epoll_wait(epfd, evs, max, timespec_ms(ts), mask) }
    }
}
