//! The calls that move bytes between two fds in the kernel: `sendfile`, `sendfile64`,
//! `splice`. With a shm connection on either side there is no kernel path: the bytes are
//! copied through a buffer between the ring and the other fd.

use libc::{c_int, size_t, ssize_t};

use super::{hook, shm, sigpipe};
use crate::sock::Entry;
use crate::stream::{self, ReadFlags};
use crate::{debug, errno, fail, real, table, Guard};

/// sendfile into a shm connection: the file's bytes copied into the ring.
unsafe fn shm_sendfile(e: &Entry, inp: c_int, off: *mut i64, count: size_t) -> ssize_t {
    let _g = Guard::enter();
    let mut buf = vec![0u8; count.min(256 * 1024)];
    if buf.is_empty() {
        return 0;
    }
    let n = if off.is_null() {
        // SAFETY: `buf` is writable for its length.
        unsafe { real::read(inp, buf.as_mut_ptr().cast(), buf.len()) }
    } else {
        // SAFETY: `off` is the caller's offset; `buf` is writable.
        unsafe { libc::pread64(inp, buf.as_mut_ptr().cast(), buf.len(), *off) }
    };
    if n <= 0 {
        return n;
    }
    let n = n as usize;
    match stream::write(e, &buf[..n], false) {
        Ok(sent) => {
            if off.is_null() {
                if sent < n {
                    // Give back what did not go (the file position moved by `n`).
                    // SAFETY: lseek on the caller's fd.
                    unsafe { libc::lseek64(inp, -((n - sent) as i64), libc::SEEK_CUR) };
                }
            } else {
                // SAFETY: the caller's offset.
                unsafe { *off += sent as i64 };
            }
            sent as ssize_t
        }
        Err(errno) => {
            if errno == libc::EPIPE {
                sigpipe();
            }
            fail(errno)
        }
    }
}

hook! {
    fn sendfile(out: c_int, inp: c_int, off: *mut libc::off_t, n: size_t) -> ssize_t;
    if let Some(e) = shm(out) => {
        // SAFETY: off_t is i64 on the 64-bit targets this crate builds for.
        unsafe { shm_sendfile(&e, inp, off.cast::<i64>(), n) }
    }
}

hook! {
    fn sendfile64(out: c_int, inp: c_int, off: *mut libc::off64_t, n: size_t) -> ssize_t;
    if let Some(e) = shm(out) => {
        // SAFETY: off64_t is i64.
        unsafe { shm_sendfile(&e, inp, off, n) }
    }
}

/// splice with a shm connection on one side: the bytes are copied through a buffer.
unsafe fn shm_splice(
    fd_in: c_int,
    off_in: *mut libc::loff_t,
    fd_out: c_int,
    off_out: *mut libc::loff_t,
    len: size_t,
    nonblocking: bool,
) -> ssize_t {
    let _g = Guard::enter();
    let mut buf = vec![0u8; len.min(64 * 1024)];
    if buf.is_empty() {
        return 0;
    }
    let n = if let Some(e) = table::sock(fd_in) {
        let flags = ReadFlags {
            dontwait: nonblocking,
            ..ReadFlags::default()
        };
        match stream::read(&e, &mut buf, flags) {
            Ok(n) => n,
            Err(errno) => return fail(errno),
        }
    } else {
        // SAFETY: `buf` is writable; `off_in` is the caller's.
        let r = unsafe {
            if off_in.is_null() {
                real::read(fd_in, buf.as_mut_ptr().cast(), buf.len())
            } else {
                libc::pread64(fd_in, buf.as_mut_ptr().cast(), buf.len(), *off_in)
            }
        };
        if r < 0 {
            return r;
        }
        r as usize
    };
    if n == 0 {
        return 0;
    }
    let mut done = 0;
    if let Some(e) = table::sock(fd_out) {
        match stream::write(&e, &buf[..n], false) {
            Ok(k) => done = k,
            Err(errno) => {
                if errno == libc::EPIPE {
                    sigpipe();
                }
                return fail(errno);
            }
        }
    } else {
        // The bytes already left the ring: write them all (waiting for room on a
        // non-blocking output), or they would be lost.
        while done < n {
            // SAFETY: `buf[done..n]` is readable; `off_out` is the caller's.
            let r = unsafe {
                if off_out.is_null() {
                    real::write(fd_out, buf[done..n].as_ptr().cast(), n - done)
                } else {
                    libc::pwrite64(
                        fd_out,
                        buf[done..n].as_ptr().cast(),
                        n - done,
                        *off_out + done as i64,
                    )
                }
            };
            if r > 0 {
                done += r as usize;
                continue;
            }
            match errno() {
                libc::EINTR => {}
                libc::EAGAIN => {
                    real::poll_one(fd_out, libc::POLLOUT, -1);
                }
                _ => break,
            }
        }
    }
    // SAFETY: the caller's offsets.
    unsafe {
        if !off_in.is_null() {
            *off_in += done as i64;
        }
        if !off_out.is_null() {
            *off_out += done as i64;
        }
    }
    if done < n {
        debug!("splice: {} bytes read but not written", n - done);
    }
    done as ssize_t
}

hook! {
    fn splice(
        fd_in: c_int,
        off_in: *mut libc::loff_t,
        fd_out: c_int,
        off_out: *mut libc::loff_t,
        len: size_t,
        flags: libc::c_uint,
    ) -> ssize_t;
    if shm(fd_in).is_some() || shm(fd_out).is_some() => {
        let nonblocking = flags & libc::SPLICE_F_NONBLOCK != 0;
        // SAFETY: the caller's arguments.
        unsafe { shm_splice(fd_in, off_in, fd_out, off_out, len, nonblocking) }
    }
}
