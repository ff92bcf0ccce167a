//! The calls about the socket rather than its bytes: `getsockname`, `getpeername`,
//! `getsockopt`, `setsockopt`. On a shm connection they go to the real TCP socket kept
//! open underneath (so addresses and options are what the program expects), except
//! `SO_ERROR` (a pending reset from the peer) and the receive/send timeouts, which the
//! library's own waits honour.

use std::os::fd::AsRawFd;

use libc::{c_int, c_void, sockaddr, socklen_t};

use super::{hook, shm};
use crate::{fail, real};

hook! {
    fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    if let Some(e) = shm(fd) => {
        let tcp = e.lock().tcp.as_raw_fd();
        // SAFETY: the caller's out-parameters, for the TCP socket underneath.
        unsafe { real::getsockname(tcp, addr, len) }
    }
}

hook! {
    fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    if let Some(e) = shm(fd) => {
        let tcp = e.lock().tcp.as_raw_fd();
        // SAFETY: the caller's out-parameters, for the TCP socket underneath.
        unsafe { real::getpeername(tcp, addr, len) }
    }
}

hook! {
    fn getsockopt(
        fd: c_int,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: *mut socklen_t,
    ) -> c_int;
    if let Some(e) = shm(fd) => {
        if level == libc::SOL_SOCKET && name == libc::SO_ERROR {
            if val.is_null() || len.is_null() {
                return fail(libc::EFAULT);
            }
            // SAFETY: the caller's out-parameters.
            unsafe {
                if (*len as usize) < std::mem::size_of::<c_int>() {
                    return fail(libc::EINVAL);
                }
                // A pending reset is reported (and consumed) here, as TCP does.
                *(val as *mut c_int) = e.lock().take_reset().unwrap_or(0);
                *len = std::mem::size_of::<c_int>() as socklen_t;
            }
            return 0;
        }
        let tcp = e.lock().tcp.as_raw_fd();
        // SAFETY: the caller's arguments, on the TCP socket underneath.
        unsafe { real::getsockopt(tcp, level, name, val, len) }
    }
}

fn timeval_of(val: *const c_void, len: socklen_t) -> Option<std::time::Duration> {
    if val.is_null() || (len as usize) < std::mem::size_of::<libc::timeval>() {
        return None;
    }
    // SAFETY: checked size; the caller's value.
    let tv = unsafe { std::ptr::read_unaligned(val.cast::<libc::timeval>()) };
    if tv.tv_sec < 0 || tv.tv_usec < 0 {
        return None;
    }
    let d = std::time::Duration::from_secs(tv.tv_sec as u64)
        + std::time::Duration::from_micros(tv.tv_usec as u64);
    (!d.is_zero()).then_some(d)
}

hook! {
    fn setsockopt(
        fd: c_int,
        level: c_int,
        name: c_int,
        val: *const c_void,
        len: socklen_t,
    ) -> c_int;
    if let Some(e) = shm(fd) => {
        let mut s = e.lock();
        // SAFETY: the caller's arguments, on the TCP socket underneath (which validates
        // them as the program expects).
        let r = unsafe { real::setsockopt(s.tcp.as_raw_fd(), level, name, val, len) };
        if r == 0 && level == libc::SOL_SOCKET {
            match name {
                libc::SO_RCVTIMEO => s.rcv_timeout = timeval_of(val, len),
                libc::SO_SNDTIMEO => s.snd_timeout = timeval_of(val, len),
                _ => {}
            }
        }
        r
    }
}
