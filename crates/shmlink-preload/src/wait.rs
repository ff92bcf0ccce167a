//! `poll`, `select` and `epoll` over sets that hold shm connections.
//!
//! A shm connection's fd is its control socket, which the kernel makes readable on a
//! doorbell or the peer's end; a doorbell only comes after the connection announced that
//! it waits (a receive that found nothing). Bytes already in the ring or in the read
//! buffer have no doorbell, so each wait first asks every shm connection
//! ([`stream::readiness`]) and only sleeps in the kernel when none is ready. Plain fds in
//! the same set are the kernel's, untouched. Kernel sleeps are capped at 100 ms as a
//! safety net; a wake-up that brought nothing backs off, so no wait can spin hot.

use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::{c_int, epoll_event, pollfd, sigset_t};

use crate::sock::Entry;
use crate::stats::{self, Stat};
use crate::stream;
use crate::table::{self, EpollReg};
use crate::wake;
use crate::{real, set_errno};

/// The kernel sleep cap while shm connections are in the set.
const CAP_MS: c_int = 100;
/// `epoll_event.data` of a shm connection in the kernel's set: this tag | fd. Its high
/// bits make it an impossible user-space pointer, so it never collides with the data of
/// a plain fd the program registered itself.
const TAG: u64 = 0x5348_4d4c_0000_0000;
const TAG_MASK: u64 = 0xffff_ffff_0000_0000;

fn remaining_ms(deadline: Option<Instant>) -> c_int {
    match deadline {
        None => CAP_MS,
        Some(d) => {
            // Rounded up, as the kernel rounds a timeout: rounded down, the last
            // millisecond before a deadline became a loop of zero-timeout kernel waits.
            let left = d.saturating_duration_since(Instant::now());
            (left.as_micros().div_ceil(1000).min(CAP_MS as u128) as c_int).max(0)
        }
    }
}

fn deadline(timeout_ms: c_int) -> Option<Instant> {
    (timeout_ms >= 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64))
}

fn expired(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// Pauses after a kernel wake-up that brought nothing the program asked for.
struct Backoff(u32);

impl Backoff {
    fn idle(&mut self) {
        if self.0 > 1 {
            stats::add(Stat::Backoff, 1);
            std::thread::sleep(Duration::from_micros(10u64 << (self.0 - 1).min(7)));
        }
        self.0 += 1;
    }
}

/// `poll`/`ppoll` with shm connections among `fds`. `timeout_ms` < 0: forever.
pub(crate) fn poll(
    fds: &mut [pollfd],
    timeout_ms: c_int,
    sigmask: Option<*const sigset_t>,
) -> c_int {
    let shm: Vec<(usize, Arc<Entry>)> = fds
        .iter()
        .enumerate()
        .filter(|(_, p)| p.fd >= 0)
        .filter_map(|(i, p)| table::sock(p.fd).map(|e| (i, e)))
        .collect();
    let deadline = deadline(timeout_ms);
    let mut backoff = Backoff(0);
    let mut kfds: Vec<pollfd> = fds.to_vec();
    let mut spun = false;
    let mut waiting = stream::Waiting::default();
    loop {
        // Ready members seen from shared memory; then (once) a bounded spin; then the
        // wait is announced on each (their doorbells wake the kernel poll below).
        let mut user: Vec<i16> = vec![0; shm.len()];
        let mut any = false;
        for announce in [false, true] {
            if announce {
                waiting.begin(shm.iter().map(|(_, e)| e));
            }
            // One token for the members of this sleep (`wake`).
            let _pass = announce.then(wake::Announcing::new);
            for (k, (i, e)) in shm.iter().enumerate() {
                user[k] = stream::readiness(e, fds[*i].events, announce);
                any |= user[k] != 0;
            }
            if any {
                break;
            }
            if !announce && timeout_ms != 0 && !spun {
                spun = true;
                if !stream::shares_cpu(shm.iter().map(|(_, e)| e))
                    && stream::spin(|| shm.iter().any(|(_, e)| stream::read_hint(e)))
                {
                    break;
                }
            }
        }
        if !any && spun && shm.iter().any(|(_, e)| stream::read_hint(e)) {
            continue;
        }
        for (k, p) in kfds.iter_mut().enumerate() {
            p.events = fds[k].events;
            p.revents = 0;
        }
        for (i, _) in &shm {
            kfds[*i].events = libc::POLLIN;
        }
        let t = if any { 0 } else { remaining_ms(deadline) };
        // SAFETY: `kfds` is a valid array of pollfds; the mask, if any, is the caller's.
        let n = unsafe {
            match sigmask {
                None => real::poll(kfds.as_mut_ptr(), kfds.len() as libc::nfds_t, t),
                Some(mask) => {
                    let ts = libc::timespec {
                        tv_sec: libc::time_t::from(t / 1000),
                        tv_nsec: libc::c_long::from(t % 1000) * 1_000_000,
                    };
                    real::ppoll(kfds.as_mut_ptr(), kfds.len() as libc::nfds_t, &ts, mask)
                }
            }
        };
        if n < 0 {
            return n;
        }
        let mut count = 0;
        let mut k = 0;
        for (i, p) in kfds.iter().enumerate() {
            if k < shm.len() && shm[k].0 == i {
                let e = &shm[k].1;
                let mut r = user[k];
                if p.revents != 0 {
                    // A doorbell: room for a blocked sender, or data, or the end.
                    if t != 0 {
                        stream::spin_woke();
                    }
                    stream::kernel_woke(e, p.revents & libc::POLLHUP != 0);
                    r |= stream::readiness(e, fds[i].events, true);
                }
                fds[i].revents = r;
                k += 1;
            } else {
                fds[i].revents = p.revents;
            }
            if fds[i].revents != 0 {
                count += 1;
            }
        }
        if count > 0 {
            return count;
        }
        if expired(deadline) || timeout_ms == 0 {
            return 0;
        }
        if n > 0 {
            stats::add(Stat::Spurious, 1);
            backoff.idle();
        }
    }
}

/// `select`/`pselect` with shm connections in the sets: done as a `poll`.
///
/// # Safety
/// The sets, if not null, are valid `fd_set`s covering `nfds`.
pub(crate) unsafe fn select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    x: *mut libc::fd_set,
    timeout_ms: c_int,
    sigmask: Option<*const sigset_t>,
) -> c_int {
    let mut fds = Vec::new();
    for fd in 0..nfds.min(libc::FD_SETSIZE as c_int) {
        let mut events = 0;
        // SAFETY: the sets are valid and `fd` < FD_SETSIZE.
        unsafe {
            if !r.is_null() && libc::FD_ISSET(fd, r) {
                events |= libc::POLLIN;
            }
            if !w.is_null() && libc::FD_ISSET(fd, w) {
                events |= libc::POLLOUT;
            }
            if !x.is_null() && libc::FD_ISSET(fd, x) {
                events |= libc::POLLPRI;
            }
        }
        if events != 0 {
            fds.push(pollfd {
                fd,
                events,
                revents: 0,
            });
        }
    }
    let n = poll(&mut fds, timeout_ms, sigmask);
    if n < 0 {
        return n;
    }
    let mut count = 0;
    // SAFETY: as above.
    unsafe {
        for set in [r, w, x] {
            if !set.is_null() {
                libc::FD_ZERO(set);
            }
        }
        for p in &fds {
            let bad = p.revents & libc::POLLNVAL != 0;
            if bad {
                set_errno(libc::EBADF);
                return -1;
            }
            let rd = p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
            let wr = p.revents & (libc::POLLOUT | libc::POLLERR) != 0;
            let ex = p.revents & libc::POLLPRI != 0;
            if rd && !r.is_null() && p.events & libc::POLLIN != 0 {
                libc::FD_SET(p.fd, r);
                count += 1;
            }
            if wr && !w.is_null() && p.events & libc::POLLOUT != 0 {
                libc::FD_SET(p.fd, w);
                count += 1;
            }
            if ex && !x.is_null() && p.events & libc::POLLPRI != 0 {
                libc::FD_SET(p.fd, x);
                count += 1;
            }
        }
    }
    count
}

/// The epoll flags that shape the kernel's registration of a shm member (its events are
/// always EPOLLIN: doorbells and the peer's end make the control socket readable).
const KFLAGS: u32 =
    (libc::EPOLLET | libc::EPOLLONESHOT | libc::EPOLLEXCLUSIVE | libc::EPOLLWAKEUP) as u32;

/// Registers (`op` ADD or MOD) shm member `fd` with the kernel under [`TAG`].
fn kernel_ctl(epfd: c_int, op: c_int, fd: c_int, kflags: u32) -> c_int {
    let mut kev = epoll_event {
        events: libc::EPOLLIN as u32 | kflags,
        u64: TAG | fd as u32 as u64,
    };
    // SAFETY: `kev` is a valid event.
    unsafe { real::epoll_ctl(epfd, op, fd, &mut kev) }
}

/// Changes a kernel registration's flags (DEL + ADD when EPOLLEXCLUSIVE is involved:
/// the kernel refuses to MOD it).
fn kernel_reregister(epfd: c_int, fd: c_int, old: u32, new: u32) -> c_int {
    let exclusive = libc::EPOLLEXCLUSIVE as u32;
    if (old | new) & exclusive != 0 {
        // SAFETY: DEL ignores the event.
        unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
        return kernel_ctl(epfd, libc::EPOLL_CTL_ADD, fd, new);
    }
    kernel_ctl(epfd, libc::EPOLL_CTL_MOD, fd, new)
}

/// `epoll_ctl` for a shm member. The kernel holds one registration per (instance, fd),
/// readable on doorbells; what the program asks (events, data, and whether it is in the
/// set at all) lives in the table, so the program's MOD/DEL/ADD cycles (an event loop
/// switching between read and write interest) cost no system call unless the
/// registration's flags change. A DEL leaves the kernel registration, removed lazily if
/// it reports.
pub(crate) fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    let app = if ev.is_null() {
        None
    } else {
        // SAFETY: a non-null event is the caller's valid struct.
        Some(unsafe { std::ptr::read_unaligned(ev) })
    };
    if op != libc::EPOLL_CTL_DEL && app.is_none() {
        set_errno(libc::EFAULT);
        return -1;
    }
    let want = app.map_or(0, |a| a.events & KFLAGS);
    let cur = table::with_epolls(|m| m.get(&epfd).and_then(|s| s.get(&fd)).copied());
    let fail = |errno| {
        set_errno(errno);
        -1
    };
    let r = match (op, cur) {
        (libc::EPOLL_CTL_ADD, Some(r)) if r.app_added => return fail(libc::EEXIST),
        (libc::EPOLL_CTL_MOD | libc::EPOLL_CTL_DEL, Some(r)) if !r.app_added => {
            return fail(libc::ENOENT)
        }
        (libc::EPOLL_CTL_DEL, Some(_)) => {
            table::with_epolls(|m| {
                if let Some(r) = m.get_mut(&epfd).and_then(|s| s.get_mut(&fd)) {
                    r.app_added = false;
                }
            });
            return 0;
        }
        (libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD, Some(r)) => {
            if r.kflags != want || r.disabled {
                kernel_reregister(epfd, fd, r.kflags, want)
            } else {
                0
            }
        }
        (libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD | libc::EPOLL_CTL_DEL, None) => {
            // Not ours yet: the kernel decides (ENOENT, EBADF, EINVAL…).
            if op == libc::EPOLL_CTL_DEL {
                // SAFETY: DEL with the caller's arguments.
                return unsafe { real::epoll_ctl(epfd, op, fd, ev) };
            }
            kernel_ctl(epfd, op, fd, want)
        }
        _ => return fail(libc::EINVAL),
    };
    if r != 0 {
        return r;
    }
    let a = app.expect("ADD and MOD carry an event");
    if a.events & libc::EPOLLET as u32 != 0 {
        // As the kernel does for an edge-triggered ADD or MOD: a member that is ready
        // now reports once.
        if let Some(e) = table::sock(fd) {
            stream::restore_et(&e);
        }
    }
    table::with_epolls(|m| {
        m.entry(epfd).or_default().insert(
            fd,
            EpollReg {
                events: a.events,
                data: a.u64,
                disabled: false,
                app_added: true,
                kflags: want,
            },
        );
    });
    0
}

/// Forgets an epoll instance (its fd is closed).
pub(crate) fn forget_epoll(epfd: c_int) {
    table::with_epolls(|m| m.remove(&epfd));
}

fn set_disabled(epfd: c_int, fd: c_int) {
    table::with_epolls(|m| {
        if let Some(reg) = m.get_mut(&epfd).and_then(|s| s.get_mut(&fd)) {
            reg.disabled = true;
        }
    });
}

/// What a shm member reports for its registration: the ready events it asked for plus
/// the ones epoll always reports. Finding nothing announces the wait (a doorbell comes).
fn epoll_mask(e: &Entry, reg: &EpollReg, announce: bool) -> u32 {
    let want = reg.events as i16 as u16 as i16;
    let r = stream::readiness(e, want | libc::POLLIN | libc::POLLRDHUP, announce) as u16 as u32;
    let always = (libc::EPOLLERR | libc::EPOLLHUP) as u32;
    r & (reg.events | always)
}

/// Whether a level-triggered member may be ready, from shared memory alone (no system
/// call, no announcement).
fn epoll_hint(e: &Entry, reg: &EpollReg) -> bool {
    (reg.events & (libc::EPOLLIN | libc::EPOLLRDHUP) as u32 != 0 && stream::read_hint(e))
        || (reg.events & libc::EPOLLOUT as u32 != 0 && stream::write_hint(e))
}

thread_local! {
    /// Consecutive `epoll_wait` returns made from shm members alone, without asking the
    /// kernel: bounded, so plain fds in the set are never starved.
    static SKIPS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// How many returns in a row may skip the kernel.
const MAX_SKIPS: u32 = 3;

/// `epoll_wait`/`epoll_pwait` on an instance with shm members (else straight to the kernel).
///
/// # Safety
/// `events` is valid for `max` entries.
pub(crate) unsafe fn epoll_wait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout_ms: c_int,
    sigmask: *const sigset_t,
) -> c_int {
    let snap = table::epoll_snapshot(epfd);
    if snap.regs.is_empty() || max <= 0 || events.is_null() {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::epoll_pwait(epfd, events, max, timeout_ms, sigmask) };
    }
    let max = max as usize;
    let deadline = deadline(timeout_ms);
    let mut backoff = Backoff(0);
    let mut spun = false;
    // Level-triggered members the program has in the set: bytes waiting in a ring have
    // no doorbell, so they are asked directly.
    let members = &snap.level;
    // Edge-triggered members: an edge is due once a read drained the connection and a
    // message arrived since (`stream::et_edge`), seen in shared memory like the others.
    let edged = &snap.edge;
    let mut waiting = stream::Waiting::default();
    stats::add(Stat::Waits, 1);
    let mut first = true;
    loop {
        // 1. Ready members, seen from shared memory (no announcement yet).
        let mut ready: Vec<(c_int, EpollReg, u32)> = Vec::with_capacity(members.len());
        for (fd, reg, e) in members {
            if epoll_hint(e, reg) {
                let mask = epoll_mask(e, reg, false);
                if mask != 0 {
                    ready.push((*fd, *reg, mask));
                }
            }
        }
        for (fd, reg, e) in edged {
            if reg.events & (libc::EPOLLIN | libc::EPOLLRDHUP) as u32 != 0
                && stream::et_edge(e, true)
            {
                let mask = epoll_mask(e, reg, false);
                if mask != 0 {
                    ready.push((*fd, *reg, mask));
                }
            }
        }
        if first && !ready.is_empty() {
            stats::add(Stat::ReadyAtOnce, 1);
        }
        first = false;
        // 2. A bounded spin (SHMLINK_SPIN_US) before anything is announced: a peer that
        // answers within it never has to ring a doorbell.
        if ready.is_empty() && timeout_ms != 0 && !spun {
            spun = true;
            let all = members.iter().chain(edged).map(|(_, _, e)| e);
            if !stream::shares_cpu(all)
                && stream::spin(|| {
                    members.iter().any(|(_, reg, e)| epoll_hint(e, reg))
                        || edged.iter().any(|(_, _, e)| stream::et_edge(e, false))
                })
            {
                continue;
            }
        }
        // 3. Nothing: announce the wait on each member (their doorbells wake the kernel
        // wait below); what arrived meanwhile is ready after all.
        if ready.is_empty() {
            waiting.begin(members.iter().chain(edged).map(|(_, _, e)| e));
            // One token for the level-triggered members of this sleep (`wake`): what a
            // skipped doorbell would have reported, the next call finds in step 1. An
            // edge-triggered member keeps its own doorbell (an edge for a connection
            // that was not drained comes only from it).
            let pass = wake::Announcing::new();
            for (fd, reg, e) in members {
                let mask = epoll_mask(e, reg, true);
                if mask != 0 {
                    ready.push((*fd, *reg, mask));
                }
            }
            drop(pass);
            for (fd, reg, e) in edged {
                // Announce (a doorbell for the next message); a message that slipped in
                // since the drain is an edge now.
                let mask = epoll_mask(e, reg, true);
                if mask & (libc::EPOLLIN | libc::EPOLLRDHUP) as u32 != 0 && stream::et_edge(e, true)
                {
                    ready.push((*fd, *reg, mask));
                }
            }
        }
        // 4. The kernel: plain fds, doorbells, members' ends. Skipped (a bounded number of
        // times in a row) when members are ready anyway.
        let skip = !ready.is_empty() && SKIPS.with(|c| c.get()) < MAX_SKIPS;
        let mut slept = false;
        let n = if skip {
            SKIPS.with(|c| c.set(c.get() + 1));
            0
        } else {
            SKIPS.with(|c| c.set(0));
            let t = if ready.is_empty() {
                remaining_ms(deadline)
            } else {
                0
            };
            // The kernel writes into the caller's array (valid for `max` events); the shm
            // members' entries are then rewritten in place and the ready ones appended.
            // SAFETY: `events` holds `max` events.
            let n = unsafe { real::epoll_pwait(epfd, events, max as c_int, t, sigmask) };
            if n < 0 {
                return n;
            }
            if t == 0 {
                stats::add(Stat::KernelZero, 1);
            } else {
                slept = true;
                stats::add(Stat::KernelSleep, 1);
                if n == 0 {
                    stats::add(Stat::KernelTimeout, 1);
                }
            }
            n
        };
        // SAFETY: `events` holds `max` events; the kernel wrote the first `n`.
        let out = unsafe { std::slice::from_raw_parts_mut(events, max) };
        let mut w = 0;
        let mut seen: Vec<c_int> = Vec::new();
        for i in 0..n as usize {
            let kev = out[i];
            let data = kev.u64;
            if data & TAG_MASK != TAG {
                out[w] = kev;
                w += 1;
                continue;
            }
            let fd = (data & !TAG_MASK) as u32 as c_int;
            let Some(reg) = snap.reg(fd).filter(|r| r.app_added) else {
                // The program took it out of the set: now the kernel forgets it too.
                // SAFETY: DEL ignores the event.
                unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
                table::with_epolls(|m| m.get_mut(&epfd).map(|s| s.remove(&fd)));
                continue;
            };
            if reg.disabled {
                // A one-shot this call or an earlier one reported: nothing until re-armed.
                continue;
            }
            let Some(e) = snap.entry(fd) else { continue };
            stats::add(Stat::KernelWokeShm, 1);
            if slept {
                // Once per sleep: `spin_woke` forgets the spin it follows.
                stream::spin_woke();
            }
            if reg.events & libc::EPOLLONESHOT as u32 != 0 {
                set_disabled(epfd, fd);
            }
            stream::kernel_woke(e, kev.events & libc::EPOLLHUP as u32 != 0);
            let mask = epoll_mask(e, &reg, true);
            if reg.events & libc::EPOLLET as u32 != 0
                && mask & (libc::EPOLLIN | libc::EPOLLRDHUP) as u32 != 0
            {
                // An input edge is used up only when it is reported. A kernel event
                // with nothing to read (a doorbell left standing after its message was
                // taken from shared memory) reports at most EPOLLOUT: clearing the edge
                // then left the next message invisible to the shared-memory checks, and
                // with the wait's announcement withdrawn when it returned, no doorbell
                // came for it either: the connection hung (the "slow mode" of
                // `wrk -c 1` against nginx, which registers EPOLLIN|EPOLLOUT|EPOLLET).
                stream::clear_et(e);
            }
            seen.push(fd);
            if mask != 0 {
                out[w] = epoll_event {
                    events: mask,
                    u64: reg.data,
                };
                w += 1;
            }
        }
        for (fd, reg, mask) in ready {
            if w >= max {
                // Not reported after all: an edge taken for it stays due.
                if reg.events & libc::EPOLLET as u32 != 0 {
                    if let Some(e) = table::sock(fd) {
                        stream::restore_et(&e);
                    }
                }
                continue;
            }
            if seen.contains(&fd) {
                continue;
            }
            if reg.events & libc::EPOLLONESHOT as u32 != 0 {
                // Disarm the kernel side too, as a reported one-shot would be: no events
                // of interest until the program's MOD re-arms it.
                let mut kev = epoll_event {
                    events: libc::EPOLLONESHOT as u32,
                    u64: TAG | fd as u32 as u64,
                };
                // SAFETY: a valid event.
                unsafe { real::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, fd, &mut kev) };
                set_disabled(epfd, fd);
            }
            out[w] = epoll_event {
                events: mask,
                u64: reg.data,
            };
            w += 1;
        }
        if w > 0 {
            return w as c_int;
        }
        if expired(deadline) || timeout_ms == 0 {
            return 0;
        }
        if n > 0 {
            stats::add(Stat::Spurious, 1);
            backoff.idle();
        }
    }
}
