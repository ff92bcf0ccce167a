//! The exported C functions that take the place of the C library's.
//!
//! Each one passes straight to the C library unless the fd is one this library looks
//! after (a shm connection, a registered listener, an epoll set with shm members) and the
//! call does not come from the library itself ([`inside`]).
#![allow(clippy::missing_safety_doc)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Once};

use libc::{c_int, c_ulong, c_void, iovec, msghdr, size_t, sockaddr, socklen_t, ssize_t};
use shmlink::Connection;

use crate::peer;
use crate::sock::{self, Entry, ReadEnd, ReadFlags, Sock, FORKS};
use crate::table::{self, Removed};
use crate::{config, debug, errno, fail, inside, real, set_errno, wait, Guard};

/// The shm connection behind `fd`, unless the call comes from the library itself.
#[inline]
fn shm(fd: c_int) -> Option<Arc<Entry>> {
    if !table::any() || inside() {
        return None;
    }
    table::sock(fd)
}

extern "C" fn before_fork() {
    FORKS.fetch_add(1, Ordering::Relaxed);
    table::fork_prepare();
}

extern "C" fn after_fork() {
    table::fork_done();
}

extern "C" fn after_fork_child() {
    OWNER.store(std::process::id(), Ordering::Relaxed);
    crate::wake::after_fork_child();
    table::fork_done();
}

/// The process whose fd table this library's table describes: set at the first
/// connection or registration, and in a `fork` child by the atfork handler. A `vfork`
/// child (no atfork handlers run) shares the parent's memory but not its fds: there the
/// table must not change (closing fds before exec would end the parent's connections).
static OWNER: AtomicU32 = AtomicU32::new(0);

/// Whether this process owns the table (false in a `vfork` child).
fn owner() -> bool {
    let o = OWNER.load(Ordering::Relaxed);
    o == 0 || o == std::process::id()
}

/// Counts forks, and keeps the fd table's lock out of them, from the first connection
/// or registration on.
fn watch_forks() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        OWNER.store(std::process::id(), Ordering::Relaxed);
        // SAFETY: registers handlers that only touch atomics and the table's lock.
        unsafe {
            libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork_child))
        };
    });
}

/// The lowest fd number the hidden TCP sockets use, away from the numbers a program
/// expects `socket`/`accept` to give it.
fn hidden_min() -> c_int {
    // SAFETY: rlimit is plain data.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-parameter.
    let cur = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
        rl.rlim_cur
    } else {
        1024
    };
    (cur / 2).clamp(16, 4096) as c_int
}

/// Moves `fd` (a connected TCP socket) onto `conn`: the TCP socket goes to a hidden fd,
/// `fd` becomes a dup of the connection's control socket. False (and `fd` untouched) if
/// the fds cannot be arranged.
fn install(
    fd: RawFd,
    mut conn: Connection,
    nonblocking: bool,
    cloexec: bool,
    first: Option<Vec<u8>>,
    name: String,
) -> bool {
    if first.as_ref().is_some_and(|v| v.len() > sock::CHUNK) {
        // The client exec'd before we accepted: it went on over TCP, having read
        // nothing of ours (its switch message is its first): so do we.
        debug!("{name}: the client moved to TCP (exec) before the accept; stays TCP");
        return false;
    }
    watch_forks();
    // SAFETY: plain fcntl/dup3 on fds this process holds.
    let hidden = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, hidden_min() as usize) };
    if hidden < 0 {
        debug!("{name}: no fd for the TCP socket ({}); stays TCP", errno());
        return false;
    }
    // SAFETY: `hidden` is a new fd of ours.
    let tcp = unsafe { OwnedFd::from_raw_fd(hidden) };
    let ctl = conn.as_raw_fd();
    // Always FD_CLOEXEC in the kernel (the program sees what it set, `table::app_cloexec`).
    // SAFETY: both fds are open; dup3 atomically replaces `fd`.
    if unsafe { real::dup3(ctl, fd, libc::O_CLOEXEC) } < 0 {
        debug!("{name}: dup3 failed ({}); stays TCP", errno());
        return false;
    }
    conn.set_nonblocking(true);
    // Our doorbells for a peer that sleeps on many connections: one per sleep.
    conn.set_wake_group(crate::wake::group_for(ctl));
    let mut s = Sock {
        conn: Some(conn),
        ctl,
        rbuf: Vec::new(),
        rpos: 0,
        read_end: ReadEnd::Open,
        rd_shut: false,
        wr_shut: false,
        fin_sent: false,
        broken: false,
        gone: crate::sock::Gone::No,
        unread_at_hup: None,
        tx_full: false,
        armed: false,
        sleepers: 0,
        // Nothing read yet: the first message is an edge. (Starting false, a request
        // that came without a doorbell — the helper's blocking receive of the claim
        // had taken the one the ring's armed start gives — stayed invisible to an
        // edge-triggered epoll: nginx never served the connection.)
        et_drained: true,
        rcv_timeout: None,
        snd_timeout: None,
        ctl_ino: sock::inode(ctl),
        tcp_ino: sock::inode(tcp.as_raw_fd()),
        tcp: std::mem::ManuallyDrop::new(tcp),
        born: FORKS.load(Ordering::Relaxed),
        name: name.clone(),
        rx_total: 0,
        tx_total: 0,
        switched: false,
        retarget_due: false,
        reset_sent: false,
    };
    match first {
        Some(v) if v.is_empty() => s.read_end = ReadEnd::Eof,
        Some(v) => {
            s.rx_total = v.len() as u64;
            s.rbuf = v;
        }
        None => {}
    }
    let entry = Arc::new(Entry {
        sock: Mutex::new(s),
        nonblocking: AtomicBool::new(nonblocking),
    });
    table::set_internal(&[ctl, hidden], true);
    drop(table::insert_sock(fd, entry));
    table::set_app_cloexec(fd, cloexec);
    debug!("{name}: fd {fd} on shared memory");
    true
}

fn fd_nonblocking(fd: RawFd) -> bool {
    // SAFETY: F_GETFL on an open fd.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

fn fd_cloexec(fd: RawFd) -> bool {
    // SAFETY: F_GETFD on an open fd.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
    fl >= 0 && fl & libc::FD_CLOEXEC != 0
}

fn is_inet(addr: *const sockaddr, len: socklen_t) -> bool {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return false;
    }
    // SAFETY: the caller's address holds at least a family.
    let family = c_int::from(unsafe { (*addr).sa_family });
    family == libc::AF_INET || family == libc::AF_INET6
}

/// A TCP connect from a preloaded process: opens a claim connection first if a preloaded
/// listener registered the destination, connects, then claims the TCP connection.
fn connect_and_claim(fd: RawFd, addr: *const sockaddr, len: socklen_t) -> c_int {
    let intent = match peer::dest_of(addr, len) {
        Some(dest) if peer::is_tcp(fd) => peer::open(&dest),
        _ => None,
    };
    // SAFETY: the caller's arguments.
    let r = unsafe { real::connect(fd, addr, len) };
    let e = errno();
    let Some(conn) = intent else {
        set_errno(e);
        return r;
    };
    let in_progress = r == -1 && e == libc::EINPROGRESS;
    if !(r == 0 || in_progress) {
        set_errno(e);
        return r;
    }
    if in_progress {
        // The claim names the connection's addresses: wait for the handshake, which on
        // this kernel takes microseconds.
        if real::poll_one(fd, libc::POLLOUT, 1000) <= 0 {
            set_errno(e);
            return r;
        }
        let mut err: c_int = 0;
        let mut len = std::mem::size_of::<c_int>() as socklen_t;
        // SAFETY: valid out-parameters for SO_ERROR.
        unsafe {
            real::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut err as *mut c_int).cast(),
                &mut len,
            )
        };
        if err != 0 {
            // The connection failed; report it now, as a non-blocking connect may.
            return fail(err);
        }
    }
    if let Some((conn, client, server)) = peer::claim(conn, fd) {
        let name = format!("{client} -> {server}");
        install(fd, conn, fd_nonblocking(fd), fd_cloexec(fd), None, name);
    }
    set_errno(e);
    r
}

#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    if inside() || !config().enabled || !is_inet(addr, len) {
        // SAFETY: the caller's arguments.
        return unsafe { real::connect(fd, addr, len) };
    }
    if shm(fd).is_some() {
        return fail(libc::EISCONN);
    }
    let _g = Guard::enter();
    connect_and_claim(fd, addr, len)
}

#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: the caller's arguments.
    let r = unsafe { real::listen(fd, backlog) };
    if r != 0 || inside() || !config().enabled || table::listener(fd).is_some() {
        return r;
    }
    let e = errno();
    let _g = Guard::enter();
    if let Some(reg) = peer::register(fd) {
        watch_forks();
        drop(table::insert_listener(fd, reg));
    }
    set_errno(e);
    r
}

/// After `accept` returned `new` on `listener`: moves it onto shared memory if its client
/// claimed it.
fn accepted(listener: c_int, new: c_int, flags: c_int) {
    let Some(reg) = table::listener(listener) else {
        return;
    };
    let _g = Guard::enter();
    let (Some(local), Some(remote)) = (
        peer::sock_endpoint(new, false),
        peer::sock_endpoint(new, true),
    ) else {
        return;
    };
    if let Some((conn, first)) = reg.take((local, remote)) {
        let name = format!("{local} <- {remote}");
        let ok = install(
            new,
            conn,
            flags & libc::SOCK_NONBLOCK != 0,
            flags & libc::SOCK_CLOEXEC != 0,
            first,
            name,
        );
        if !ok {
            debug!("accept: fd {new} stays TCP (its client's shm connection is dropped)");
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's arguments.
    let r = unsafe { real::accept(fd, addr, len) };
    if r >= 0 && !inside() && table::any() {
        let e = errno();
        accepted(fd, r, 0);
        set_errno(e);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's arguments.
    let r = unsafe { real::accept4(fd, addr, len, flags) };
    if r >= 0 && !inside() && table::any() {
        let e = errno();
        accepted(fd, r, flags);
        set_errno(e);
    }
    r
}

/// Sends SIGPIPE to this thread, as the kernel does for a write on a broken TCP socket.
fn sigpipe() {
    // SAFETY: signals this thread.
    unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGPIPE) };
}

/// A read on a shm connection into `buf[..n]`.
unsafe fn shm_read(e: &Entry, buf: *mut c_void, n: size_t, flags: ReadFlags) -> ssize_t {
    let _g = Guard::enter();
    if n == 0 {
        return 0;
    }
    if buf.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: the caller gives `n` writable bytes at `buf`, as read(2) requires.
    let dst = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) };
    match sock::read(e, dst, flags) {
        Ok(n) => n as ssize_t,
        Err(errno) => fail(errno),
    }
}

/// A write on a shm connection of `buf[..n]`; `flags` as send(2)'s.
unsafe fn shm_write(e: &Entry, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    let _g = Guard::enter();
    if n == 0 {
        return 0;
    }
    if buf.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: the caller gives `n` readable bytes at `buf`, as write(2) requires.
    let src = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) };
    match sock::write(e, src, flags & libc::MSG_DONTWAIT != 0) {
        Ok(n) => n as ssize_t,
        Err(errno) => {
            if errno == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
                sigpipe();
            }
            fail(errno)
        }
    }
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

/// readv/recvmsg on a shm connection: one read into a buffer, scattered.
unsafe fn shm_readv(e: &Entry, iov: *const iovec, cnt: c_int, flags: ReadFlags) -> ssize_t {
    let _g = Guard::enter();
    // SAFETY: the caller's iovecs.
    let (v, total) = match unsafe { iov_total(iov, cnt) } {
        Ok(x) => x,
        Err(errno) => return fail(errno),
    };
    if total == 0 {
        return 0;
    }
    let mut tmp = vec![0u8; total.min(1 << 20)];
    let n = match sock::read(e, &mut tmp, flags) {
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
        unsafe { std::ptr::copy_nonoverlapping(tmp.as_ptr().add(off), i.iov_base.cast::<u8>(), k) };
        off += k;
    }
    n as ssize_t
}

/// writev/sendmsg on a shm connection: the iovecs gathered in chunks.
unsafe fn shm_writev(e: &Entry, iov: *const iovec, cnt: c_int, flags: c_int) -> ssize_t {
    let _g = Guard::enter();
    // SAFETY: the caller's iovecs.
    let (v, total) = match unsafe { iov_total(iov, cnt) } {
        Ok(x) => x,
        Err(errno) => return fail(errno),
    };
    if total == 0 {
        return 0;
    }
    let mut done = 0usize;
    let mut chunk: Vec<u8> = Vec::with_capacity(total.min(sock::CHUNK * 4));
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
            let src = unsafe { std::slice::from_raw_parts(i.iov_base.cast::<u8>().add(off), k) };
            chunk.extend_from_slice(src);
            cur = if off + k == i.iov_len {
                it.next().map(|i| (i, 0))
            } else {
                Some((i, off + k))
            };
        }
        match sock::write(e, &chunk, flags & libc::MSG_DONTWAIT != 0) {
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
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if let Some(e) = shm(fd) {
        // SAFETY: the caller's buffer.
        return unsafe { shm_read(&e, buf, n, ReadFlags::default()) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::read(fd, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if let Some(e) = shm(fd) {
        if n > buflen {
            // SAFETY: as the C library's own check does.
            unsafe { libc::abort() };
        }
        // SAFETY: the caller's buffer.
        return unsafe { shm_read(&e, buf, n, ReadFlags::default()) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::__read_chk(fd, buf, n, buflen) }
}

#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    if let Some(e) = shm(fd) {
        // SAFETY: the caller's buffer.
        return unsafe { shm_read(&e, buf, n, ReadFlags::from_msg(flags)) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::recv(fd, buf, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if let Some(e) = shm(fd) {
        if n > buflen {
            // SAFETY: as the C library's own check does.
            unsafe { libc::abort() };
        }
        // SAFETY: the caller's buffer.
        return unsafe { shm_read(&e, buf, n, ReadFlags::from_msg(flags)) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::__recv_chk(fd, buf, n, buflen, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if let Some(e) = shm(fd) {
        if !addr.is_null() && !len.is_null() {
            // SAFETY: the caller's out-parameter; TCP reports no source address.
            unsafe { *len = 0 };
        }
        // SAFETY: the caller's buffer.
        return unsafe { shm_read(&e, buf, n, ReadFlags::from_msg(flags)) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::recvfrom(fd, buf, n, flags, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if shm(fd).is_some() {
        if n > buflen {
            // SAFETY: as the C library's own check does.
            unsafe { libc::abort() };
        }
        // SAFETY: the caller's arguments.
        return unsafe { recvfrom(fd, buf, n, flags, addr, len) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::__recvfrom_chk(fd, buf, n, buflen, flags, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if let Some(e) = shm(fd) {
        // SAFETY: the caller's iovecs.
        return unsafe { shm_readv(&e, iov, cnt, ReadFlags::default()) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::readv(fd, iov, cnt) }
}

#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    if let Some(e) = shm(fd) {
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
        return r;
    }
    // SAFETY: the caller's arguments.
    unsafe { real::recvmsg(fd, msg, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if let Some(e) = shm(fd) {
        // SAFETY: the caller's buffer.
        return unsafe { shm_write(&e, buf, n, 0) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::write(fd, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    if let Some(e) = shm(fd) {
        // SAFETY: the caller's buffer.
        return unsafe { shm_write(&e, buf, n, flags) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::send(fd, buf, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    if let Some(e) = shm(fd) {
        // A connected TCP socket ignores the address.
        // SAFETY: the caller's buffer.
        return unsafe { shm_write(&e, buf, n, flags) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::sendto(fd, buf, n, flags, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if let Some(e) = shm(fd) {
        // SAFETY: the caller's iovecs.
        return unsafe { shm_writev(&e, iov, cnt, 0) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::writev(fd, iov, cnt) }
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

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    if let Some(e) = shm(fd) {
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
        return unsafe { shm_writev(&e, m.msg_iov, cnt, flags) };
    }
    // SAFETY: the caller's msghdr.
    if let Err(e) = unsafe { pass_rights(msg) } {
        return fail(e);
    }
    // SAFETY: the caller's arguments.
    unsafe { real::sendmsg(fd, msg, flags) }
}

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
    match sock::write(e, &buf[..n], false) {
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

#[no_mangle]
pub unsafe extern "C" fn sendfile(
    out: c_int,
    inp: c_int,
    off: *mut libc::off_t,
    n: size_t,
) -> ssize_t {
    if let Some(e) = shm(out) {
        // SAFETY: off_t is i64 on the 64-bit targets this crate builds for.
        return unsafe { shm_sendfile(&e, inp, off.cast::<i64>(), n) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::sendfile(out, inp, off, n) }
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    inp: c_int,
    off: *mut libc::off64_t,
    n: size_t,
) -> ssize_t {
    if let Some(e) = shm(out) {
        // SAFETY: off64_t is i64.
        return unsafe { shm_sendfile(&e, inp, off, n) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::sendfile64(out, inp, off, n) }
}

#[no_mangle]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: libc::c_uint,
    flags: c_int,
) -> c_int {
    if shm(fd).is_some() {
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
        return n as c_int;
    }
    if !msgs.is_null() {
        for i in 0..n.min(libc::UIO_MAXIOV as libc::c_uint) as usize {
            // SAFETY: the caller gives `n` entries.
            if let Err(e) = unsafe { pass_rights(&(*msgs.add(i)).msg_hdr) } {
                return fail(e);
            }
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::sendmmsg(fd, msgs, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: libc::c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
    if shm(fd).is_some() {
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
        return n as c_int;
    }
    // SAFETY: the caller's arguments.
    unsafe { real::recvmmsg(fd, msgs, n, flags, timeout) }
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
        match sock::read(&e, &mut buf, flags) {
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
        match sock::write(&e, &buf[..n], false) {
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

#[no_mangle]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut libc::loff_t,
    fd_out: c_int,
    off_out: *mut libc::loff_t,
    len: size_t,
    flags: libc::c_uint,
) -> ssize_t {
    if shm(fd_in).is_some() || shm(fd_out).is_some() {
        let nonblocking = flags & libc::SPLICE_F_NONBLOCK != 0;
        // SAFETY: the caller's arguments.
        return unsafe { shm_splice(fd_in, off_in, fd_out, off_out, len, nonblocking) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::splice(fd_in, off_in, fd_out, off_out, len, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    if let Some(e) = shm(fd) {
        let _g = Guard::enter();
        return match sock::shutdown(&e, how) {
            Ok(()) => 0,
            Err(errno) => fail(errno),
        };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::shutdown(fd, how) }
}

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
    let keep: Vec<c_int> = table::internal_fds().into_iter().filter(in_range).collect();
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

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: usize) -> c_int {
    if let Some(e) = shm(fd) {
        let _g = Guard::enter();
        match req {
            libc::FIONBIO => {
                if arg == 0 {
                    return fail(libc::EFAULT);
                }
                // SAFETY: FIONBIO's argument points to an int.
                let on = unsafe { *(arg as *const c_int) } != 0;
                e.nonblocking.store(on, Ordering::Relaxed);
                return 0;
            }
            libc::FIOCLEX | libc::FIONCLEX => {
                table::set_app_cloexec(fd, req == libc::FIOCLEX);
                return 0;
            }
            libc::FIONREAD => {
                if arg == 0 {
                    return fail(libc::EFAULT);
                }
                let n = sock::available(&e).min(c_int::MAX as usize) as c_int;
                // SAFETY: FIONREAD's argument points to an int.
                unsafe { *(arg as *mut c_int) = n };
                return 0;
            }
            _ => {
                let tcp = e.lock().tcp.as_raw_fd();
                // SAFETY: the caller's request, on the TCP socket underneath.
                return unsafe { real::ioctl(tcp, req, arg) };
            }
        }
    }
    // SAFETY: the caller's arguments.
    unsafe { real::ioctl(fd, req, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let fd = shm(fd).map_or(fd, |e| e.lock().tcp.as_raw_fd());
    // SAFETY: the caller's out-parameters.
    unsafe { real::getsockname(fd, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    let fd = shm(fd).map_or(fd, |e| e.lock().tcp.as_raw_fd());
    // SAFETY: the caller's out-parameters.
    unsafe { real::getpeername(fd, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if let Some(e) = shm(fd) {
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
        return unsafe { real::getsockopt(tcp, level, name, val, len) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::getsockopt(fd, level, name, val, len) }
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

#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    if let Some(e) = shm(fd) {
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
        return r;
    }
    // SAFETY: the caller's arguments.
    unsafe { real::setsockopt(fd, level, name, val, len) }
}

/// Whether any of `fds` is a shm connection (then the wait is ours).
unsafe fn poll_has_shm(fds: *const libc::pollfd, n: libc::nfds_t) -> bool {
    if !table::any() || inside() || fds.is_null() || n == 0 || n > 1 << 20 {
        return false;
    }
    // SAFETY: the caller's array of `n` pollfds.
    let v = unsafe { std::slice::from_raw_parts(fds, n as usize) };
    v.iter().any(|p| p.fd >= 0 && table::sock(p.fd).is_some())
}

#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's array.
    if unsafe { poll_has_shm(fds, n) } {
        let _g = Guard::enter();
        // SAFETY: checked non-null, `n` entries.
        let v = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        return wait::poll(v, timeout, None);
    }
    // SAFETY: the caller's arguments.
    unsafe { real::poll(fds, n, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    // SAFETY: the caller's array.
    if unsafe { poll_has_shm(fds, n) } {
        if (fdslen / std::mem::size_of::<libc::pollfd>()) < n as usize {
            // SAFETY: as the C library's own check does.
            unsafe { libc::abort() };
        }
        // SAFETY: the caller's arguments.
        return unsafe { poll(fds, n, timeout) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::__poll_chk(fds, n, timeout, fdslen) }
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

#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's array.
    if unsafe { poll_has_shm(fds, n) } {
        let _g = Guard::enter();
        // SAFETY: checked non-null, `n` entries.
        let v = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        let m = (!mask.is_null()).then_some(mask);
        return wait::poll(v, timespec_ms(ts), m);
    }
    // SAFETY: the caller's arguments.
    unsafe { real::ppoll(fds, n, ts, mask) }
}

#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
    fdslen: size_t,
) -> c_int {
    // SAFETY: the caller's array.
    if unsafe { poll_has_shm(fds, n) } {
        if (fdslen / std::mem::size_of::<libc::pollfd>()) < n as usize {
            // SAFETY: as the C library's own check does.
            unsafe { libc::abort() };
        }
        // SAFETY: the caller's arguments.
        return unsafe { ppoll(fds, n, ts, mask) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::__ppoll_chk(fds, n, ts, mask, fdslen) }
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

#[no_mangle]
pub unsafe extern "C" fn select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    x: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
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
    // SAFETY: the caller's arguments.
    unsafe { real::select(nfds, r, w, x, t) }
}

#[no_mangle]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    x: *mut libc::fd_set,
    t: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's sets.
    if unsafe { select_has_shm(nfds, [r, w, x]) } {
        let _g = Guard::enter();
        let m = (!mask.is_null()).then_some(mask);
        // SAFETY: the caller's sets.
        return unsafe { wait::select(nfds, r, w, x, timespec_ms(t), m) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::pselect(nfds, r, w, x, t, mask) }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    if shm(fd).is_some() {
        let _g = Guard::enter();
        return wait::epoll_ctl(epfd, op, fd, ev);
    }
    // SAFETY: the caller's arguments.
    unsafe { real::epoll_ctl(epfd, op, fd, ev) }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    evs: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    if table::any() && !inside() {
        let _g = Guard::enter();
        // SAFETY: the caller's arguments.
        return unsafe { wait::epoll_wait(epfd, evs, max, timeout, std::ptr::null()) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::epoll_wait(epfd, evs, max, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    evs: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    if table::any() && !inside() {
        let _g = Guard::enter();
        // SAFETY: the caller's arguments.
        return unsafe { wait::epoll_wait(epfd, evs, max, timeout, mask) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::epoll_pwait(epfd, evs, max, timeout, mask) }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    evs: *mut libc::epoll_event,
    max: c_int,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if table::any() && !inside() {
        let _g = Guard::enter();
        // Millisecond resolution (rounded up) once shm members are involved.
        // SAFETY: the caller's arguments.
        return unsafe { wait::epoll_wait(epfd, evs, max, timespec_ms(ts), mask) };
    }
    // SAFETY: the caller's arguments.
    unsafe { real::epoll_pwait2(epfd, evs, max, ts, mask) }
}

/// Before an exec: each shm connection the new image may inherit continues over the TCP
/// socket underneath (`exec`). Not in a `vfork` child (it shares our memory, not our
/// fds) nor from inside the library.
fn before_exec() {
    if table::any() && !inside() && owner() {
        crate::exec::prepare_exec();
    }
}

#[no_mangle]
pub unsafe extern "C" fn execve(path: Arg, argv: Argv, envp: Argv) -> c_int {
    before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::execve(path, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: Arg, argv: Argv) -> c_int {
    before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::execv(path, argv) }
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: Arg, argv: Argv) -> c_int {
    before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::execvp(file, argv) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(file: Arg, argv: Argv, envp: Argv) -> c_int {
    before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::execvpe(file, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn execveat(
    dirfd: c_int,
    path: Arg,
    argv: Argv,
    envp: Argv,
    flags: c_int,
) -> c_int {
    before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::execveat(dirfd, path, argv, envp, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: Argv, envp: Argv) -> c_int {
    before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::fexecve(fd, argv, envp) }
}

type Arg = *const libc::c_char;
type Argv = *const *const libc::c_char;

/// `posix_spawn`, `posix_spawnp`, `system` and `popen` start a program with the C
/// library's internal clone and exec, past the exec hooks: the shm connections the new
/// program may inherit continue over TCP first, as at an `exec` (`crate::exec`). The
/// calling process goes on over TCP too (as after a failed exec): a connection the child
/// inherits is one socket shared by both, which only the kernel's TCP socket can be.
/// A file action that `dup2`s a shm fd the program marked close-on-exec is not seen
/// (docs/transparent.md, Limits).
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: Arg,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::posix_spawn(pid, path, actions, attr, argv, envp) }
}

/// `posix_spawnp`: as [`posix_spawn`].
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: Arg,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::posix_spawnp(pid, file, actions, attr, argv, envp) }
}

/// `system`: as [`posix_spawn`] (`system(NULL)` only asks whether a shell exists).
#[no_mangle]
pub unsafe extern "C" fn system(command: Arg) -> c_int {
    if !command.is_null() {
        before_exec();
    }
    // SAFETY: the caller's argument.
    unsafe { real::system(command) }
}

/// `popen`: as [`posix_spawn`].
#[no_mangle]
pub unsafe extern "C" fn popen(command: Arg, mode: Arg) -> *mut libc::FILE {
    before_exec();
    // SAFETY: the caller's arguments.
    unsafe { real::popen(command, mode) }
}

/// The C library's `execl`, `execlp` and `execle` build an argv and call its internal
/// execve, past our hooks, so they are taken over here. They are variadic, which stable
/// Rust cannot define: on the ABIs below a variadic call passes pointer arguments
/// exactly where a call with that many pointer parameters does (registers, then the
/// stack in order), so these read up to 64 of them, stopping at the NULL terminator
/// (and, for `execle`, the envp after it); more arguments fail with `E2BIG`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod variadic {
    use super::{Arg, Argv};
    use libc::c_int;

    /// argv (with its NULL) out of the arguments after the first; `env` also takes
    /// the pointer after the NULL.
    fn split(args: &[Arg], env: bool) -> Option<(Vec<Arg>, Argv)> {
        let n = args.iter().position(|p| p.is_null())?;
        let envp = if env {
            *args.get(n + 1)? as Argv
        } else {
            std::ptr::null()
        };
        Some((args[..=n].to_vec(), envp))
    }

    fn too_many() -> c_int {
        crate::set_errno(libc::E2BIG);
        -1
    }

    /// One of the list forms: `$name($first, a0, …, a63)`, its argv split off the
    /// arguments (`$env`: an envp follows the NULL), then `$call`.
    macro_rules! list_form {
        ($name:ident, $first:ident, $env:expr, |$argv:ident, $envp:ident| $call:expr) => {
            #[no_mangle]
            #[allow(clippy::too_many_arguments)]
            pub unsafe extern "C" fn $name(
                $first: Arg,
                a0: Arg,
                a1: Arg,
                a2: Arg,
                a3: Arg,
                a4: Arg,
                a5: Arg,
                a6: Arg,
                a7: Arg,
                a8: Arg,
                a9: Arg,
                a10: Arg,
                a11: Arg,
                a12: Arg,
                a13: Arg,
                a14: Arg,
                a15: Arg,
                a16: Arg,
                a17: Arg,
                a18: Arg,
                a19: Arg,
                a20: Arg,
                a21: Arg,
                a22: Arg,
                a23: Arg,
                a24: Arg,
                a25: Arg,
                a26: Arg,
                a27: Arg,
                a28: Arg,
                a29: Arg,
                a30: Arg,
                a31: Arg,
                a32: Arg,
                a33: Arg,
                a34: Arg,
                a35: Arg,
                a36: Arg,
                a37: Arg,
                a38: Arg,
                a39: Arg,
                a40: Arg,
                a41: Arg,
                a42: Arg,
                a43: Arg,
                a44: Arg,
                a45: Arg,
                a46: Arg,
                a47: Arg,
                a48: Arg,
                a49: Arg,
                a50: Arg,
                a51: Arg,
                a52: Arg,
                a53: Arg,
                a54: Arg,
                a55: Arg,
                a56: Arg,
                a57: Arg,
                a58: Arg,
                a59: Arg,
                a60: Arg,
                a61: Arg,
                a62: Arg,
                a63: Arg,
            ) -> c_int {
                let Some(($argv, $envp)) = split(
                    &[
                        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16,
                        a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31,
                        a32, a33, a34, a35, a36, a37, a38, a39, a40, a41, a42, a43, a44, a45, a46,
                        a47, a48, a49, a50, a51, a52, a53, a54, a55, a56, a57, a58, a59, a60, a61,
                        a62, a63,
                    ],
                    $env,
                ) else {
                    return too_many();
                };
                // SAFETY: a NULL-terminated argv of the caller's strings (for `execle`,
                // with the caller's envp).
                unsafe { $call }
            }
        };
    }

    list_form!(execl, path, false, |argv, _envp| super::execv(
        path,
        argv.as_ptr()
    ));
    list_form!(execlp, file, false, |argv, _envp| super::execvp(
        file,
        argv.as_ptr()
    ));
    list_form!(execle, path, true, |argv, envp| super::execve(
        path,
        argv.as_ptr(),
        envp
    ));
}
