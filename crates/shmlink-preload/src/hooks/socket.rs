//! The calls that make and end connections: `connect`, `listen`, `accept`, `accept4`,
//! `shutdown`. `listen` registers a preloaded listener (`peer`), `connect` claims the new
//! TCP connection over shared memory when the other end is a preloaded listener, and
//! `accept` hands the accepted fd to its claim; [`install`] then re-points the fd at the
//! shmlink connection.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use libc::{c_int, sockaddr, socklen_t};
use shmlink::Connection;

use super::{hook, shm, watch_forks};
use crate::peer;
use crate::sock::{self, Entry, Gone, ReadEnd, Sock};
use crate::state::{self, FORKS};
use crate::stream;
use crate::switch::CHUNK;
use crate::{config, debug, errno, fail, inside, real, set_errno, table, Guard};

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
    if first.as_ref().is_some_and(|v| v.len() > CHUNK) {
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
    if let Some(mut c) = conn.shm() {
        c.set_wake_group(crate::wake::group_for(ctl));
    }
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
        gone: Gone::No,
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
    state::set_internal(&[ctl, hidden], true);
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

hook! {
    fn shutdown(fd: c_int, how: c_int) -> c_int;
    if let Some(e) = shm(fd) => {
        let _g = Guard::enter();
        match stream::shutdown(&e, how) {
            Ok(()) => 0,
            Err(errno) => fail(errno),
        }
    }
}
