//! `exec` with a shm connection open: the connection continues over the real TCP socket
//! kept underneath, so the new image (preloaded or not: setuid, static, `LD_PRELOAD`
//! dropped) finds a plain TCP socket on its fd number.
//!
//! The exec'ing side ([`prepare_exec`], from the exec hooks), for each shm connection
//! with an fd the program left inheritable (its own view of `FD_CLOEXEC`):
//! 1. sends a *switch* message into the ring, after everything it wrote: "my program
//!    consumed C bytes of your stream, I wrote W bytes to you, and here are the bytes of
//!    yours I had taken from the ring but my program had not read" (what the library
//!    buffered, at most a message or two). It is longer than any data message
//!    (`switch::CHUNK`), which is how the peer tells it from data;
//! 2. puts the TCP socket onto each of the connection's fd numbers (`dup3`, `FD_CLOEXEC`
//!    as the program set it, `O_NONBLOCK` as the program set it, epoll registrations
//!    moved over), and closes the shm connection.
//!
//! The peer (`Sock::peer_switched`) meets the switch message in order, after all the data
//! the exec'ing side wrote (its program reads those first, from the ring), checks W,
//! sends again over TCP what the exec'ing program had not read: the bytes returned in
//! the switch message, then those of its own messages still in its send ring (the ring
//! keeps every message the reader has not taken, `ShmControl::unconsumed_sent`; no copy
//! of what is sent is kept), moves its own fds onto its TCP socket the same way, and from
//! then on both directions are TCP: no byte lost, duplicated or reordered. If the exec
//! fails, the exec'ing program goes on over TCP.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::c_int;

use crate::sock::{inode, Entry, Gone, Sock};
use crate::switch::{self, MAX_RETURNED};
use crate::table::{self, Removed};
use crate::tcp::{self, set_nonblocking};
use crate::{debug, real, Guard};

/// How long the exec'ing side waits for ring room for its switch message.
const ROOM_WAIT: Duration = Duration::from_secs(1);

/// Puts TCP socket `tcp` onto the program's fd numbers `fds` (all naming one shm
/// connection): epoll registrations follow, FD_CLOEXEC as the program set it. Returns
/// what the table held for them (dropped by the caller, outside any entry lock... or
/// inside: the caller holds its own reference).
fn retarget(fds: &[c_int], tcp: RawFd) -> Vec<Removed> {
    let mut removed = Vec::new();
    for &fd in fds {
        let cloexec = table::app_cloexec(fd);
        let regs: Vec<(c_int, table::EpollReg)> = table::with_epolls(|m| {
            m.iter()
                .filter_map(|(ep, set)| set.get(&fd).map(|r| (*ep, *r)))
                .collect()
        });
        for (ep, _) in &regs {
            // SAFETY: DEL of the control socket's registration (fd still names it).
            unsafe { real::epoll_ctl(*ep, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
        }
        let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
        // SAFETY: both fds are open; dup3 atomically replaces `fd`.
        if unsafe { real::dup3(tcp, fd, flags) } < 0 {
            debug!(
                "fd {fd}: dup3 of the TCP socket failed ({})",
                crate::errno()
            );
        }
        if let Some(rm) = table::remove(fd) {
            removed.push(rm);
        }
        for (ep, reg) in regs {
            if !reg.app_added {
                continue;
            }
            let mut ev = libc::epoll_event {
                events: if reg.disabled {
                    libc::EPOLLONESHOT as u32
                } else {
                    reg.events
                },
                u64: reg.data,
            };
            // SAFETY: a valid event for the program's registration, now on TCP.
            unsafe { real::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        }
    }
    removed
}

/// The program's fd numbers that name the connection whose control socket is `ctl`.
fn fds_of(ctl: RawFd) -> Vec<c_int> {
    let ino = inode(ctl);
    if ino == 0 {
        return Vec::new();
    }
    table::sock_fds()
        .into_iter()
        .filter(|&fd| fd != ctl && inode(fd) == ino)
        .collect()
}

/// Called by the exec hooks before the C library's exec: moves each shm connection the
/// new image may inherit onto its TCP socket (see the module's docs).
pub(crate) fn prepare_exec() {
    let _g = Guard::enter();
    let mut groups: Vec<(Arc<Entry>, Vec<c_int>)> = Vec::new();
    for fd in table::sock_fds() {
        let Some(e) = table::sock(fd) else { continue };
        match groups.iter_mut().find(|(g, _)| Arc::ptr_eq(g, &e)) {
            Some((_, fds)) => fds.push(fd),
            None => groups.push((e, vec![fd])),
        }
    }
    for (entry, fds) in groups {
        if fds.iter().all(|&fd| table::app_cloexec(fd)) {
            continue; // Closed by the exec, as the program asked.
        }
        switch_out(&entry, &fds);
    }
}

/// Called by the `sendmsg` hooks before the program passes `fd` to another process with
/// `SCM_RIGHTS`: a shm connection cannot follow its fd there (the receiver's library, if
/// any, does not know it; its reads and writes would reach our control socket), so it
/// continues over TCP as at an exec, here and in the receiver (one kernel socket shared,
/// as without the library). `Err(errno)` if it cannot (then nothing is passed and the
/// connection stays as it was): its peer has gone, more than a switch message returns
/// was read ahead, or the ring had no room for the switch message within 1 s.
///
/// A peer that is gone cannot send again what it wrote: then the fds go onto the TCP
/// socket (whose end the receiver reads, as it would have) only if nothing of the peer's
/// stream is left unread here and no reset is due; else `ENOBUFS`, since the TCP socket
/// cannot carry those bytes or that error.
pub(crate) fn prepare_pass(fd: c_int) -> Result<(), c_int> {
    let _g = Guard::enter();
    let Some(entry) = table::sock(fd) else {
        return Ok(());
    };
    let fds: Vec<c_int> = table::sock_fds()
        .into_iter()
        .filter(|&f| table::sock(f).is_some_and(|e| Arc::ptr_eq(&e, &entry)))
        .collect();
    let mut s = entry.lock();
    let hung_up = !s.switched && {
        let r = real::poll_one(s.ctl, libc::POLLIN | libc::POLLRDHUP, 0);
        r > 0 && r as i16 & libc::POLLHUP != 0
    };
    if hung_up || s.broken {
        // The peer is gone (or exec'd: then `read_ahead` meets its switch message).
        if !s.broken && !s.switched {
            s.read_ahead();
            if s.retarget_due && s.buffered() == 0 {
                retarget_now(&mut s);
            }
        }
        if !s.switched && s.conn.is_some() {
            s.notice_gone(true);
        }
        if s.buffered() > 0 || s.gone == (Gone::Reset { reported: false }) {
            debug!(
                "{}: peer gone with {} bytes unread here (or a reset due): fd {fd} not passed",
                s.name,
                s.buffered()
            );
            return Err(libc::ENOBUFS);
        }
        if s.switched {
            if s.retarget_due {
                retarget_now(&mut s);
            }
            return Ok(());
        }
        let tcp = s.tcp.as_raw_fd();
        tcp::shut_like(tcp, s.rd_shut, s.wr_shut);
        set_nonblocking(tcp, entry.nonblocking.load(Ordering::Relaxed));
        let removed = retarget(&fds, tcp);
        s.switched = true;
        debug!("{}: peer gone, all read: fds {fds:?} on TCP", s.name);
        drop(s);
        drop(removed);
        return Ok(());
    }
    drop(s);
    switch_out(&entry, &fds);
    if table::sock(fd).is_some() {
        debug!("fd {fd}: cannot continue over TCP; not passed (SCM_RIGHTS)");
        return Err(libc::ENOBUFS);
    }
    debug!("fd {fd}: passed with SCM_RIGHTS; continues over TCP");
    Ok(())
}

fn switch_out(entry: &Entry, fds: &[c_int]) {
    let mut s = entry.lock();
    if s.switched || s.broken || s.conn.is_none() {
        debug!("{}: exec with an ended connection: it closes", s.name);
        return;
    }
    // A FIN we could not send yet goes first (the switch follows it in the ring).
    s.flush_fin();
    if s.wr_shut && !s.fin_sent {
        debug!(
            "{}: exec: no room for the FIN; the connection closes",
            s.name
        );
        return;
    }
    let consumed = s.rx_total - s.buffered() as u64;
    if s.buffered() > MAX_RETURNED {
        debug!(
            "{}: exec: {} bytes read ahead, more than a switch returns; the connection closes",
            s.name,
            s.buffered()
        );
        return;
    }
    let msg = switch::encode(consumed, s.tx_total, &s.rbuf[s.rpos..]);
    let deadline = Instant::now() + ROOM_WAIT;
    loop {
        let Some(conn) = s.conn.as_mut() else { return };
        match conn.send(&msg) {
            Ok(()) => break,
            Err(e) if e.kind() == shmlink::ErrorKind::WouldBlock && Instant::now() < deadline => {
                real::poll_one(s.ctl, libc::POLLIN, 10);
            }
            Err(e) => {
                debug!(
                    "{}: exec: no switch message ({e}); the connection closes",
                    s.name
                );
                return;
            }
        }
    }
    let tcp = s.tcp.as_raw_fd();
    tcp::shut_like(tcp, s.rd_shut, s.wr_shut);
    set_nonblocking(tcp, entry.nonblocking.load(Ordering::Relaxed));
    let removed = retarget(fds, tcp);
    s.switched = true;
    debug!(
        "{}: exec: fds {fds:?} continue over TCP (consumed {consumed}, wrote {})",
        s.name, s.tx_total
    );
    drop(s);
    // Closes the shm connection (the peer reads the switch first) and the hidden fds.
    drop(removed);
}

/// Moves the program's fds of a switched connection onto its TCP socket.
pub(crate) fn retarget_now(s: &mut Sock) {
    let _g = Guard::enter();
    s.retarget_due = false;
    let tcp = s.tcp.as_raw_fd();
    let fds = fds_of(s.ctl);
    let nonblocking = fds
        .first()
        .and_then(|&fd| table::sock(fd))
        .is_some_and(|e| e.nonblocking.load(Ordering::Relaxed));
    set_nonblocking(tcp, nonblocking);
    let removed = retarget(&fds, tcp);
    debug!("{}: fds {fds:?} on TCP", s.name);
    // The callers hold their own reference: these are not the last.
    drop(removed);
}
