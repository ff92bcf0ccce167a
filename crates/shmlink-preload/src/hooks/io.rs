//! The byte-moving calls: `read`, `recv`, `recvfrom`, `readv`, `recvmsg`, `recvmmsg` (and
//! the fortified `__*_chk` forms), `write`, `send`, `sendto`, `writev`, `sendmsg`,
//! `sendmmsg`. On a shm connection the bytes go through the rings (`stream::read`,
//! `stream::write`); elsewhere to the C library, except that a `sendmsg` passing a shm fd
//! in `SCM_RIGHTS` first moves that connection onto TCP (`exec::prepare_pass`).

use libc::{c_int, c_void, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};

use super::{hook, shm, sigpipe};
use crate::sock::Entry;
use crate::state::owner;
use crate::stream::{self, ReadFlags};
use crate::switch::CHUNK;
use crate::{fail, inside, table, Guard};

/// Runs `op` on the `n` bytes at `buf` of a read or write on a shm connection, inside
/// the library's guard, after the checks read(2) and write(2) make: 0 bytes move
/// nothing, a NULL buffer is `EFAULT`.
fn shm_io(buf: *const c_void, n: size_t, op: impl FnOnce(*mut u8) -> ssize_t) -> ssize_t {
    let _g = Guard::enter();
    if n == 0 {
        return 0;
    }
    if buf.is_null() {
        return fail(libc::EFAULT);
    }
    op(buf.cast::<u8>().cast_mut())
}

/// A read on a shm connection into `buf[..n]`.
unsafe fn shm_read(e: &Entry, buf: *mut c_void, n: size_t, flags: ReadFlags) -> ssize_t {
    shm_io(buf, n, |buf| {
        // SAFETY: the caller gives `n` writable bytes at `buf`, as read(2) requires.
        let dst = unsafe { std::slice::from_raw_parts_mut(buf, n) };
        match stream::read(e, dst, flags) {
            Ok(n) => n as ssize_t,
            Err(errno) => fail(errno),
        }
    })
}

/// A write on a shm connection of `buf[..n]`; `flags` as send(2)'s.
unsafe fn shm_write(e: &Entry, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    shm_io(buf, n, |buf| {
        // SAFETY: the caller gives `n` readable bytes at `buf`, as write(2) requires.
        let src = unsafe { std::slice::from_raw_parts(buf, n) };
        match stream::write(e, src, flags & libc::MSG_DONTWAIT != 0) {
            Ok(n) => n as ssize_t,
            Err(errno) => {
                if errno == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
                    sigpipe();
                }
                fail(errno)
            }
        }
    })
}

/// Checks an iovec array the way the kernel does; the total length.
unsafe fn iov_total(iov: *const iovec, cnt: c_int) -> Result<(&'static [iovec], usize), c_int> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt == 0 {
        return Ok((&[], 0));
    }
    if iov.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller gives `cnt` iovecs at `iov`.
    let v = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    let mut total: usize = 0;
    for i in v {
        if i.iov_len > 0 && i.iov_base.is_null() {
            return Err(libc::EFAULT);
        }
        total = total.checked_add(i.iov_len).ok_or(libc::EINVAL)?;
    }
    if total > isize::MAX as usize {
        return Err(libc::EINVAL);
    }
    Ok((v, total))
}

/// Runs `op` on the iovecs of a readv or writev on a shm connection and their total
/// length, inside the library's guard, after the kernel's checks ([`iov_total`]): a
/// total of 0 moves nothing.
unsafe fn shm_iov_io(
    iov: *const iovec,
    cnt: c_int,
    op: impl FnOnce(&[iovec], usize) -> ssize_t,
) -> ssize_t {
    let _g = Guard::enter();
    // SAFETY: the caller's iovecs.
    let (v, total) = match unsafe { iov_total(iov, cnt) } {
        Ok(x) => x,
        Err(errno) => return fail(errno),
    };
    if total == 0 {
        return 0;
    }
    op(v, total)
}

/// readv/recvmsg on a shm connection: one read into a buffer, scattered.
unsafe fn shm_readv(e: &Entry, iov: *const iovec, cnt: c_int, flags: ReadFlags) -> ssize_t {
    let op = |v: &[iovec], total: usize| {
        let mut tmp = vec![0u8; total.min(1 << 20)];
        let n = match stream::read(e, &mut tmp, flags) {
            Ok(n) => n,
            Err(errno) => return fail(errno),
        };
        let mut off = 0;
        for i in v {
            if off == n {
                break;
            }
            let k = i.iov_len.min(n - off);
            // SAFETY: each iovec names `iov_len` writable bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(tmp.as_ptr().add(off), i.iov_base.cast::<u8>(), k)
            };
            off += k;
        }
        n as ssize_t
    };
    // SAFETY: forwarded to the caller.
    unsafe { shm_iov_io(iov, cnt, op) }
}

/// writev/sendmsg on a shm connection: the iovecs gathered in chunks.
unsafe fn shm_writev(e: &Entry, iov: *const iovec, cnt: c_int, flags: c_int) -> ssize_t {
    let op = |v: &[iovec], total: usize| {
        let mut done = 0usize;
        let mut chunk: Vec<u8> = Vec::with_capacity(total.min(CHUNK * 4));
        let mut it = v.iter().filter(|i| i.iov_len > 0);
        let mut cur: Option<(&iovec, usize)> = it.next().map(|i| (i, 0));
        while cur.is_some() {
            chunk.clear();
            while let Some((i, off)) = cur {
                let room = chunk.capacity() - chunk.len();
                if room == 0 {
                    break;
                }
                let k = (i.iov_len - off).min(room);
                // SAFETY: each iovec names `iov_len` readable bytes.
                let src =
                    unsafe { std::slice::from_raw_parts(i.iov_base.cast::<u8>().add(off), k) };
                chunk.extend_from_slice(src);
                cur = if off + k == i.iov_len {
                    it.next().map(|i| (i, 0))
                } else {
                    Some((i, off + k))
                };
            }
            match stream::write(e, &chunk, flags & libc::MSG_DONTWAIT != 0) {
                Ok(n) => {
                    done += n;
                    if n < chunk.len() {
                        break;
                    }
                }
                Err(errno) => {
                    if done > 0 {
                        break;
                    }
                    if errno == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
                        sigpipe();
                    }
                    return fail(errno);
                }
            }
        }
        done as ssize_t
    };
    // SAFETY: forwarded to the caller.
    unsafe { shm_iov_io(iov, cnt, op) }
}

hook! {
    fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    if let Some(e) = shm(fd) => {
        // SAFETY: the caller's buffer.
        unsafe { shm_read(&e, buf, n, ReadFlags::default()) }
    }
}

hook! {
    fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t;
    if let Some(e) = shm(fd) => {
        if n > buflen {
            // SAFETY: as the C library's own check does.
            unsafe { libc::abort() };
        }
        // SAFETY: the caller's buffer.
        unsafe { shm_read(&e, buf, n, ReadFlags::default()) }
    }
}

hook! {
    fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t;
    if let Some(e) = shm(fd) => {
        // SAFETY: the caller's buffer.
        unsafe { shm_read(&e, buf, n, ReadFlags::from_msg(flags)) }
    }
}

hook! {
    fn __recv_chk(
        fd: c_int,
        buf: *mut c_void,
        n: size_t,
        buflen: size_t,
        flags: c_int,
    ) -> ssize_t;
    if let Some(e) = shm(fd) => {
        if n > buflen {
            // SAFETY: as the C library's own check does.
            unsafe { libc::abort() };
        }
        // SAFETY: the caller's buffer.
        unsafe { shm_read(&e, buf, n, ReadFlags::from_msg(flags)) }
    }
}

hook! {
    fn recvfrom(
        fd: c_int,
        buf: *mut c_void,
        n: size_t,
        flags: c_int,
        addr: *mut sockaddr,
        len: *mut socklen_t,
    ) -> ssize_t;
    if let Some(e) = shm(fd) => {
        if !addr.is_null() && !len.is_null() {
            // SAFETY: the caller's out-parameter; TCP reports no source address.
            unsafe { *len = 0 };
        }
        // SAFETY: the caller's buffer.
        unsafe { shm_read(&e, buf, n, ReadFlags::from_msg(flags)) }
    }
}

hook! {
    fn __recvfrom_chk(
        fd: c_int,
        buf: *mut c_void,
        n: size_t,
        buflen: size_t,
        flags: c_int,
        addr: *mut sockaddr,
        len: *mut socklen_t,
    ) -> ssize_t;
    if shm(fd).is_some() => {
        if n > buflen {
            // SAFETY: as the C library's own check does.
            unsafe { libc::abort() };
        }
        // SAFETY: the caller's arguments.
        unsafe { recvfrom(fd, buf, n, flags, addr, len) }
    }
}

hook! {
    fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    if let Some(e) = shm(fd) => {
        // SAFETY: the caller's iovecs.
        unsafe { shm_readv(&e, iov, cnt, ReadFlags::default()) }
    }
}

hook! {
    fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    if let Some(e) = shm(fd) => {
        if msg.is_null() {
            return fail(libc::EFAULT);
        }
        // SAFETY: the caller's msghdr.
        let m = unsafe { &mut *msg };
        let Ok(cnt) = c_int::try_from(m.msg_iovlen) else {
            return fail(libc::EMSGSIZE);
        };
        // SAFETY: the caller's iovecs.
        let r = unsafe { shm_readv(&e, m.msg_iov, cnt, ReadFlags::from_msg(flags)) };
        if r >= 0 {
            m.msg_namelen = 0;
            m.msg_controllen = 0;
            m.msg_flags = 0;
        }
        r
    }
}

hook! {
    fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    if let Some(e) = shm(fd) => {
        // SAFETY: the caller's buffer.
        unsafe { shm_write(&e, buf, n, 0) }
    }
}

hook! {
    fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
    if let Some(e) = shm(fd) => {
        // SAFETY: the caller's buffer.
        unsafe { shm_write(&e, buf, n, flags) }
    }
}

hook! {
    fn sendto(
        fd: c_int,
        buf: *const c_void,
        n: size_t,
        flags: c_int,
        addr: *const sockaddr,
        len: socklen_t,
    ) -> ssize_t;
    if let Some(e) = shm(fd) => {
        // A connected TCP socket ignores the address.
        // SAFETY: the caller's buffer.
        unsafe { shm_write(&e, buf, n, flags) }
    }
}

hook! {
    fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    if let Some(e) = shm(fd) => {
        // SAFETY: the caller's iovecs.
        unsafe { shm_writev(&e, iov, cnt, 0) }
    }
}

/// Before a `sendmsg` on a socket that is not ours: each shm connection named in an
/// `SCM_RIGHTS` message continues over TCP first (`exec::prepare_pass`), so what the
/// receiver gets is the real TCP socket. Err(errno) if one cannot.
///
/// # Safety
/// `msg` is the caller's `msghdr` (null allowed).
unsafe fn pass_rights(msg: *const msghdr) -> Result<(), c_int> {
    if msg.is_null() || inside() || !table::any() || !owner() {
        return Ok(());
    }
    // SAFETY: the caller's msghdr.
    let m = unsafe { &*msg };
    if m.msg_control.is_null() || m.msg_controllen < std::mem::size_of::<libc::cmsghdr>() {
        return Ok(());
    }
    // SAFETY: the header's control buffer, walked with the C library's own rules; the
    // kernel reads the same bytes.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(m) };
    while !c.is_null() {
        // SAFETY: `c` is a header inside the control buffer (CMSG_FIRSTHDR/NXTHDR).
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN of no payload is a constant computation.
            let head = unsafe { libc::CMSG_LEN(0) } as usize;
            let n = (h.cmsg_len as usize).saturating_sub(head) / std::mem::size_of::<c_int>();
            // SAFETY: the payload of this header.
            let data = unsafe { libc::CMSG_DATA(c) }.cast::<c_int>();
            for i in 0..n {
                // SAFETY: within the header's cmsg_len, which the caller set; unaligned
                // reads because a control buffer need not be aligned for int.
                let passed = unsafe { data.add(i).read_unaligned() };
                if table::sock(passed).is_some() {
                    crate::exec::prepare_pass(passed)?;
                }
            }
        }
        // SAFETY: as above.
        c = unsafe { libc::CMSG_NXTHDR(m, c) };
    }
    Ok(())
}

hook! {
    fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    if let Some(e) = shm(fd) => {
        if msg.is_null() {
            return fail(libc::EFAULT);
        }
        // SAFETY: the caller's msghdr.
        let m = unsafe { &*msg };
        if m.msg_controllen != 0 {
            // No ancillary data on a TCP stream either.
            return fail(libc::EINVAL);
        }
        let Ok(cnt) = c_int::try_from(m.msg_iovlen) else {
            return fail(libc::EMSGSIZE);
        };
        // SAFETY: the caller's iovecs.
        unsafe { shm_writev(&e, m.msg_iov, cnt, flags) }
    }
    before_real {
        // SAFETY: the caller's msghdr.
        if let Err(e) = unsafe { pass_rights(msg) } {
            return fail(e);
        }
    }
}

hook! {
    fn sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: libc::c_uint, flags: c_int) -> c_int;
    if shm(fd).is_some() => {
        if msgs.is_null() && n > 0 {
            return fail(libc::EFAULT);
        }
        // One sendmsg per entry, as the kernel does for a stream socket; the count of
        // those sent, or the first one's error.
        let n = n.min(libc::UIO_MAXIOV as libc::c_uint);
        for i in 0..n as usize {
            // SAFETY: the caller gives `n` entries.
            let m = unsafe { &mut *msgs.add(i) };
            // SAFETY: the caller's msghdr.
            let r = unsafe { sendmsg(fd, &m.msg_hdr, flags) };
            if r < 0 {
                return if i > 0 { i as c_int } else { -1 };
            }
            m.msg_len = r as libc::c_uint;
        }
        n as c_int
    }
    before_real {
        if !msgs.is_null() {
            for i in 0..n.min(libc::UIO_MAXIOV as libc::c_uint) as usize {
                // SAFETY: the caller gives `n` entries.
                if let Err(e) = unsafe { pass_rights(&(*msgs.add(i)).msg_hdr) } {
                    return fail(e);
                }
            }
        }
    }
}

hook! {
    fn recvmmsg(
        fd: c_int,
        msgs: *mut libc::mmsghdr,
        n: libc::c_uint,
        flags: c_int,
        timeout: *mut libc::timespec,
    ) -> c_int;
    if shm(fd).is_some() => {
        if msgs.is_null() && n > 0 {
            return fail(libc::EFAULT);
        }
        // As the kernel does: one recvmsg per entry; after the first, MSG_WAITFORONE
        // turns on MSG_DONTWAIT, and the timeout is checked between entries.
        let n = n.min(libc::UIO_MAXIOV as libc::c_uint);
        let waitforone = flags & libc::MSG_WAITFORONE != 0;
        let mut flags = flags & !libc::MSG_WAITFORONE;
        let deadline = (!timeout.is_null()).then(|| {
            // SAFETY: the caller's timespec.
            let t = unsafe { *timeout };
            std::time::Instant::now()
                + std::time::Duration::new(
                    t.tv_sec.max(0) as u64,
                    t.tv_nsec.clamp(0, 999_999_999) as u32,
                )
        });
        for i in 0..n as usize {
            if i > 0 && deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return i as c_int;
            }
            // SAFETY: the caller gives `n` entries.
            let m = unsafe { &mut *msgs.add(i) };
            // SAFETY: the caller's msghdr.
            let r = unsafe { recvmsg(fd, &mut m.msg_hdr, flags) };
            if r < 0 {
                return if i > 0 { i as c_int } else { -1 };
            }
            m.msg_len = r as libc::c_uint;
            if r == 0 {
                return i as c_int + 1;
            }
            if waitforone {
                flags |= libc::MSG_DONTWAIT;
            }
        }
        n as c_int
    }
}
