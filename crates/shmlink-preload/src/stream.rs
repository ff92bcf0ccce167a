//! The calls on one shm connection ([`Entry`]) as the hooks make them: `read`, `write`,
//! `shutdown`, FIONREAD, and what `poll`/`epoll` ask of it (readiness, hints, edges).
//!
//! The connection is always in non-blocking mode; blocking calls wait here (a bounded
//! spin, then `poll` on the control socket, which the peer's doorbells make readable)
//! with the [`Entry`] lock released, so one thread may read while another writes. Once
//! the peer exec'd (`crate::exec`), the calls go to the TCP socket underneath (`tcp`),
//! and the program's fds move onto it as soon as nothing read ahead is left
//! ([`settle`]).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libc::c_int;

use crate::sock::{Entry, Fill, Gone, ReadEnd, Sock};
use crate::stats::Stat;
use crate::{config, exec, real, tcp};

/// Flags of one read call.
#[derive(Clone, Copy, Default)]
pub(crate) struct ReadFlags {
    pub peek: bool,
    pub dontwait: bool,
    pub waitall: bool,
}

impl ReadFlags {
    pub(crate) fn from_msg(flags: c_int) -> ReadFlags {
        ReadFlags {
            peek: flags & libc::MSG_PEEK != 0,
            dontwait: flags & libc::MSG_DONTWAIT != 0,
            waitall: flags & libc::MSG_WAITALL != 0,
        }
    }

    /// The `recv(2)` flags these stand for.
    fn to_msg(self) -> c_int {
        let mut f = 0;
        if self.peek {
            f |= libc::MSG_PEEK;
        }
        if self.dontwait {
            f |= libc::MSG_DONTWAIT;
        }
        if self.waitall {
            f |= libc::MSG_WAITALL;
        }
        f
    }
}

/// After a call on the `Sock` that may have met the peer's exec switch message (which
/// only marks the fds as due to move): once nothing read ahead of the switch is left,
/// the program's fds move onto the TCP socket.
fn settle(s: &mut Sock) {
    if s.retarget_due && s.buffered() == 0 {
        exec::retarget_now(s);
    }
}

/// Sleeps until the control socket is readable (a doorbell, the peer's end), 100 ms or
/// the deadline.
fn sleep_on(ctl: RawFd, deadline: Option<Instant>) {
    // A doorbell ends the sleep; 100 ms bounds it whatever happens (a doorbell another
    // thread took, a room doorbell when we wait for data).
    let mut ms = 100;
    if let Some(d) = deadline {
        let left = d.saturating_duration_since(Instant::now());
        ms = ms.min(left.as_millis() as c_int + 1);
    }
    real::poll_one(ctl, libc::POLLIN, ms);
}

/// `read`/`recv` on a shm connection: bytes read, 0 at end of stream, or errno.
pub(crate) fn read(entry: &Entry, dst: &mut [u8], flags: ReadFlags) -> Result<usize, c_int> {
    if dst.is_empty() {
        return Ok(0);
    }
    let nonblocking = flags.dontwait || entry.nonblocking.load(Ordering::Relaxed);
    let mut got = 0;
    let mut deadline = None;
    let mut backoff = Backoff::default();
    let mut spun = false;
    'outer: loop {
        let mut s = entry.lock();
        if s.switched && s.buffered() == 0 {
            // The peer exec'd: the connection goes on over TCP.
            if s.retarget_due {
                exec::retarget_now(&mut s);
            }
            if got > 0 {
                return Ok(got);
            }
            let fd = s.tcp.as_raw_fd();
            drop(s);
            let flags = ReadFlags {
                dontwait: nonblocking,
                ..flags
            };
            return tcp::recv(fd, dst, flags.to_msg());
        }
        s.flush_fin();
        if deadline.is_none() {
            deadline = s.rcv_timeout.map(|t| Instant::now() + t);
        }
        // A blocking read with nothing there spins (bounded) before it announces the
        // wait: a peer that answers within the spin rings no doorbell.
        if !nonblocking && !spun {
            let hint = s.buffered() > 0
                || s.rd_shut
                || s.read_end == ReadEnd::Eof
                || s.conn().shm().map_or(true, |mut c| c.recv_ready());
            if !hint {
                spun = true;
                let same_cpu = s.conn().shm().is_some_and(|mut c| c.shares_cpu_with_peer());
                drop(s);
                if !same_cpu {
                    spin(|| read_hint(entry));
                }
                continue;
            }
        }
        // Take everything there is, up to the buffer's size, as TCP's read does: a
        // short read then means "nothing more now" (and the wait is announced, so the
        // next message rings a doorbell), which edge-triggered programs rely on.
        let mut more = false;
        loop {
            if got == dst.len() {
                return Ok(got);
            }
            if !flags.peek && s.buffered() == 0 {
                if let Some(n) = s.recv_direct(&mut dst[got..]) {
                    if n == 0 && s.switched {
                        continue 'outer;
                    }
                    if n == 0 {
                        return Ok(got);
                    }
                    got += n;
                    more = true;
                    continue;
                }
            }
            // Nothing in the ring: stop without announcing a wait (poll and epoll
            // announce before they sleep; a blocking read does below).
            let empty = s.buffered() == 0
                && !s.rd_shut
                && s.read_end == ReadEnd::Open
                && s.conn().shm().map(|mut c| c.recv_ready()) == Some(false);
            match if empty { Fill::Empty } else { s.fill() } {
                Fill::Data if flags.peek => {
                    // Only the current message: peeking cannot consume it to go on.
                    return Ok(got + s.take(&mut dst[got..], true));
                }
                Fill::Data => {
                    got += s.take(&mut dst[got..], false);
                    more = true;
                }
                Fill::Eof if s.switched => continue 'outer,
                Fill::Eof if got == 0 && !flags.peek => {
                    // After a reset, the first read past the data reports it.
                    return match s.take_reset() {
                        Some(e) => Err(e),
                        None => Ok(0),
                    };
                }
                Fill::Eof => return Ok(got),
                Fill::Empty => break,
            }
        }
        if more {
            backoff.reset();
        }
        // Drained: the next message is a new edge for an edge-triggered epoll.
        s.et_drained = true;
        if got > 0 && !flags.waitall {
            return Ok(got);
        }
        if nonblocking {
            return if got > 0 { Ok(got) } else { Err(libc::EAGAIN) };
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return if got > 0 { Ok(got) } else { Err(libc::EAGAIN) };
        }
        // Announce the wait before sleeping (what arrived meanwhile is taken instead).
        s.sleepers += 1;
        if s.fill() != Fill::Empty {
            s.sleepers -= 1;
            continue;
        }
        let ctl = s.ctl;
        drop(s);
        backoff.wait();
        sleep_on(ctl, deadline);
        entry.lock().sleepers -= 1;
    }
}

/// `write`/`send` on a shm connection: bytes written (all of them when blocking), or errno.
pub(crate) fn write(entry: &Entry, src: &[u8], dontwait: bool) -> Result<usize, c_int> {
    let nonblocking = dontwait || entry.nonblocking.load(Ordering::Relaxed);
    let mut done = 0;
    let mut deadline = None;
    let mut backoff = Backoff::default();
    loop {
        let mut s = entry.lock();
        if s.switched {
            // The peer exec'd: the connection goes on over TCP (the kernel blocks or
            // not as the program set O_NONBLOCK, which the switch gave the TCP socket).
            let fd = s.tcp.as_raw_fd();
            drop(s);
            let flags = if nonblocking { libc::MSG_DONTWAIT } else { 0 };
            return match tcp::send(fd, &src[done..], flags) {
                Ok(n) => Ok(done + n),
                Err(_) if done > 0 => Ok(done),
                Err(e) => Err(e),
            };
        }
        if deadline.is_none() {
            deadline = s.snd_timeout.map(|t| Instant::now() + t);
        }
        let sent = s.send_some(&src[done..]);
        settle(&mut s);
        match sent {
            Ok(n) => done += n,
            Err(e) => return if done > 0 { Ok(done) } else { Err(e) },
        }
        if done == src.len() {
            return Ok(done);
        }
        if nonblocking {
            return if done > 0 {
                Ok(done)
            } else {
                Err(libc::EAGAIN)
            };
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return if done > 0 {
                Ok(done)
            } else {
                Err(libc::EAGAIN)
            };
        }
        // A data doorbell would keep the control socket readable while we wait for room:
        // take the waiting message into the buffer (which also drains its doorbell).
        s.sleepers += 1;
        if s.buffered() == 0 {
            s.fill();
            settle(&mut s);
        }
        let ctl = s.ctl;
        drop(s);
        backoff.wait();
        sleep_on(ctl, deadline);
        entry.lock().sleepers -= 1;
    }
}

/// Growing pauses between retries that found the control socket readable but made no
/// progress (a doorbell meant for the other direction), so such a wait cannot spin hot.
#[derive(Default)]
struct Backoff {
    rounds: u32,
}

impl Backoff {
    fn reset(&mut self) {
        self.rounds = 0;
    }

    fn wait(&mut self) {
        if self.rounds > 2 {
            let us = 10u64 << (self.rounds - 2).min(7);
            std::thread::sleep(Duration::from_micros(us));
        }
        self.rounds += 1;
    }
}

/// What `poll` would say of a shm connection for `events` (POLLIN/POLLOUT/…), without
/// blocking. Reading readiness takes a waiting message into the buffer.
///
/// `announce`: when nothing is there to read, announce the wait (a doorbell will come;
/// costs a system call to drain stale ones). Without it, the read side is looked at in
/// shared memory only and nothing is announced.
pub(crate) fn readiness(entry: &Entry, events: i16, announce: bool) -> i16 {
    let mut s = entry.lock();
    let mut r = 0;
    let hint = s.buffered() > 0
        || s.rd_shut
        || s.read_end == ReadEnd::Eof
        || s.conn().shm().map_or(true, |mut c| c.recv_ready());
    let fill = if announce || hint {
        // Within a wait's announcement pass, its token (one doorbell per sleep).
        let token = if announce && !s.switched && s.conn.is_some() {
            crate::wake::current()
        } else {
            None
        };
        if token.is_some() {
            if let Some(mut c) = s.conn().shm() {
                c.set_wait_token(token);
            }
        }
        let fill = s.fill();
        if token.is_some() {
            if let Some(mut c) = s.conn().shm() {
                c.set_wait_token(None);
            }
        }
        fill
    } else {
        Fill::Empty
    };
    if s.switched {
        // The peer exec'd: the kernel's answer for the TCP socket (and what was read
        // ahead of the switch, first). Once that is read, the fds (and their epoll
        // registrations, on the hung-up control socket until then) move to TCP.
        settle(&mut s);
        let r = real::poll_one(s.tcp.as_raw_fd(), events, 0);
        let mut r = if r > 0 { r as i16 } else { 0 };
        if s.buffered() > 0 {
            r |= events & (libc::POLLIN | libc::POLLRDNORM);
        }
        return r;
    }
    if fill != Fill::Empty {
        r |= events & (libc::POLLIN | libc::POLLRDNORM);
    }
    if fill == Fill::Eof && s.read_end == ReadEnd::Eof {
        r |= events & libc::POLLRDHUP;
        if s.broken {
            r |= libc::POLLHUP;
        }
        if s.gone == (Gone::Reset { reported: false }) {
            r |= libc::POLLERR;
        }
    }
    s.flush_fin();
    if !s.tx_full || s.broken {
        r |= events & (libc::POLLOUT | libc::POLLWRNORM);
    }
    if s.broken && s.wr_shut {
        r |= libc::POLLHUP;
    }
    r
}

/// A `poll`/`epoll_wait` call's wait on its shm members. [`begin`](Waiting::begin)
/// counts the thread as a sleeper on each before it announces anything, so another
/// thread's end of wait cannot withdraw an announcement this one relies on. When the call
/// returns (drop), where no other thread still waits, the announcement a receive left
/// standing is withdrawn: the peer then rings no doorbell that nobody sleeps for (an event
/// loop over many connections otherwise takes one per idle connection after each wake-up).
/// The next wait announces again.
#[derive(Default)]
pub(crate) struct Waiting(Option<Vec<Arc<Entry>>>);

impl Waiting {
    /// Counts this thread as a sleeper on `entries`, once per call.
    pub(crate) fn begin<'a>(&mut self, entries: impl IntoIterator<Item = &'a Arc<Entry>>) {
        if self.0.is_none() {
            let v: Vec<Arc<Entry>> = entries.into_iter().cloned().collect();
            for e in &v {
                e.lock().sleepers += 1;
            }
            self.0 = Some(v);
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        for e in self.0.take().unwrap_or_default() {
            let mut s = e.lock();
            s.sleepers -= 1;
            if s.sleepers == 0 && s.armed {
                s.armed = false;
                if let Some(mut c) = s.conn().shm() {
                    c.withdraw_wait();
                }
            }
        }
    }
}

/// Whether a read would find something at once, from shared memory alone (no system
/// call): what a bounded spin checks.
pub(crate) fn read_hint(entry: &Entry) -> bool {
    let mut s = entry.lock();
    if s.buffered() > 0 || s.rd_shut || s.read_end == ReadEnd::Eof || s.switched {
        return true;
    }
    s.conn().shm().map_or(true, |mut c| c.recv_ready())
}

/// For an edge-triggered member: whether a new edge is due (a read drained the
/// connection and something arrived since, seen in shared memory); `take` consumes it.
pub(crate) fn et_edge(entry: &Entry, take: bool) -> bool {
    let mut s = entry.lock();
    if !s.et_drained {
        return false;
    }
    let due = s.buffered() > 0
        || s.rd_shut
        || s.read_end == ReadEnd::Eof
        || s.conn().shm().map_or(true, |mut c| c.recv_ready());
    if due && take {
        s.et_drained = false;
    }
    due
}

/// An edge-triggered event was reported: the next edge needs another drain.
pub(crate) fn clear_et(entry: &Entry) {
    entry.lock().et_drained = false;
}

/// An edge is due again with the next message (or now, if one waits): an edge taken by
/// [`et_edge`] was not reported (the caller's array was full), or the program added or
/// modified an edge-triggered registration.
pub(crate) fn restore_et(entry: &Entry) {
    entry.lock().et_drained = true;
}

/// Whether a write would take bytes now, as far as this side knows (no system call).
pub(crate) fn write_hint(entry: &Entry) -> bool {
    let s = entry.lock();
    !s.tx_full || s.broken || s.switched
}

/// A thread's spin budget. It spins `SHMLINK_SPIN_US` per wait; when a kernel sleep
/// that followed a spun-out wait ended soon enough that `SHMLINK_SPIN_MAX_US` of spinning
/// would have covered it ([`spin_woke`]), the next wait tries spinning that long (a
/// probe). A probe that sees data keeps the long budget for as long as spins keep seeing
/// data; the first long spin that runs out goes back to the short one. A probe that runs
/// out is not tried again for 64 sleeps, doubling with each failure up to 4096: where
/// spinning cannot help (the peer waits for this very CPU, or answers later than the
/// ceiling) the probes cost next to nothing. So a program whose peer answers within the
/// ceiling (redis-benchmark's connections, refilled in bursts by one server) stops
/// sleeping, and the peer stops paying a doorbell (a cross-CPU wake-up, ~12 µs of its
/// CPU here) per sleep; an idle program still sleeps after at most one long spin.
#[derive(Clone, Copy)]
struct SpinState {
    /// Spins get `spin_max`: the last probe or long spin saw data.
    long: bool,
    /// When the last wait's spin ran out (its kernel sleep began).
    missed_at: Option<Instant>,
    /// That sleep ended, with a shm member ready, within `spin_max` of spinning.
    soon: bool,
    /// Probes that ran out in a row.
    fails: u32,
    /// Sleeps to go before the next probe.
    countdown: u32,
}

impl SpinState {
    const NEW: SpinState = SpinState {
        long: false,
        missed_at: None,
        soon: false,
        fails: 0,
        countdown: 0,
    };

    /// The next spin's budget, and whether it is a probe.
    fn budget(&self, base: Duration, max: Duration) -> (Duration, bool) {
        let probe = !self.long && self.soon && self.countdown == 0 && max > base;
        (if self.long || probe { max } else { base }, probe)
    }

    /// A spin (a probe or not) ended at `end`: `hit` if it saw something ready.
    fn spun(&mut self, probe: bool, hit: bool, end: Instant) {
        self.soon = false;
        if hit {
            if probe {
                self.long = true;
                self.fails = 0;
            }
            return;
        }
        if probe {
            self.fails = (self.fails + 1).min(MAX_FAILS);
            self.countdown = PROBE_EVERY << self.fails;
        } else {
            self.countdown = self.countdown.saturating_sub(1);
        }
        self.long = false;
        self.missed_at = Some(end);
    }

    /// A kernel sleep ended at `now` with a shm member ready.
    fn woke(&mut self, now: Instant, base: Duration, max: Duration) {
        if let Some(t) = self.missed_at.take() {
            self.soon = base + now.saturating_duration_since(t) <= max;
        }
    }
}

thread_local! {
    static SPIN: std::cell::Cell<SpinState> = const { std::cell::Cell::new(SpinState::NEW) };
}

/// Sleeps between failed probes: this many, doubled per failure in a row...
const PROBE_EVERY: u32 = 32;
/// ...up to `PROBE_EVERY << MAX_FAILS` (4096).
const MAX_FAILS: u32 = 7;

/// Spins up to this thread's budget (see [`SpinState`]) until `ready`; whether it was.
pub(crate) fn spin(mut ready: impl FnMut() -> bool) -> bool {
    let cfg = config();
    if cfg.spin.is_zero() {
        return false;
    }
    let mut st = SPIN.with(|c| c.get());
    let (budget, probe) = st.budget(cfg.spin, cfg.spin_max);
    let start = Instant::now();
    let until = start + budget;
    let hit = loop {
        if ready() {
            break true;
        }
        if Instant::now() >= until {
            break false;
        }
        // Burn, do not yield: `sched_yield` hands the CPU to any other runnable thread
        // for its whole time slice (milliseconds), and on a busy machine every wait then
        // cost that (preloaded nginx under `wrk -c 1` fell to 266 requests/s against
        // TCP's 6 600 with a build running). A bounded burn costs at most the budget
        // when the peer waits for this very CPU (`SHMLINK_SPIN_US=0` turns it off).
        std::hint::spin_loop();
    };
    let end = Instant::now();
    st.spun(probe, hit, end);
    SPIN.with(|c| c.set(st));
    crate::stats::add(if hit { Stat::SpinHit } else { Stat::SpinMiss }, 1);
    crate::stats::add(Stat::SpinNs, (end - start).as_nanos() as u64);
    hit
}

/// Whether the peer of any of `entries` last waited on the CPU this thread runs on
/// (`ShmControl::shares_cpu_with_peer`, which also tells each peer where we wait): then
/// a spin would only keep that peer from running, and the wait sleeps at once. Found
/// for redis-benchmark `-c 1` with both ends on one CPU: every request cost two whole
/// spins, 21 000 requests/s against TCP's 115 000.
pub(crate) fn shares_cpu<'a>(entries: impl IntoIterator<Item = &'a Arc<Entry>>) -> bool {
    entries.into_iter().fold(false, |any, e| {
        let mut s = e.lock();
        let shared = s.conn.is_some()
            && !s.switched
            && s.conn().shm().is_some_and(|mut c| c.shares_cpu_with_peer());
        any | shared
    })
}

/// A kernel sleep ended with a shm member ready (not a timeout, not a plain fd alone):
/// if it followed a spun-out wait and came soon enough, the next wait may probe.
pub(crate) fn spin_woke() {
    let cfg = config();
    SPIN.with(|c| {
        let mut st = c.get();
        st.woke(Instant::now(), cfg.spin, cfg.spin_max);
        c.set(st);
    });
}

/// After a room doorbell (or a timeout) the sender may try again: POLLOUT is reported.
/// The kernel woke a wait on the control socket: a doorbell (room, data), or with `hup`
/// the peer's end. The end is noted at once, while what the peer left unread is still
/// what it left when it went (later writes of ours must not count as unread by it).
pub(crate) fn kernel_woke(entry: &Entry, hup: bool) {
    let mut s = entry.lock();
    s.tx_full = false;
    if hup && s.unread_at_hup.is_none() {
        let unread = s.conn().shm().is_some_and(|mut c| c.peer_unread());
        s.unread_at_hup = Some(unread);
    }
}

/// `shutdown` on a shm connection.
pub(crate) fn shutdown(entry: &Entry, how: c_int) -> Result<(), c_int> {
    let mut s = entry.lock();
    if s.switched {
        // The peer exec'd: the TCP socket carries the connection now.
        // SAFETY: shutdown on our TCP socket.
        if unsafe { real::shutdown(s.tcp.as_raw_fd(), how) } != 0 {
            return Err(crate::errno());
        }
    }
    match how {
        libc::SHUT_RD => s.rd_shut = true,
        libc::SHUT_WR => s.wr_shut = true,
        libc::SHUT_RDWR => {
            s.rd_shut = true;
            s.wr_shut = true;
        }
        _ => return Err(libc::EINVAL),
    }
    if !s.switched {
        s.flush_fin();
    }
    Ok(())
}

/// FIONREAD: bytes that a read returns at once (the current message's rest).
pub(crate) fn available(entry: &Entry) -> usize {
    let mut s = entry.lock();
    s.fill();
    settle(&mut s);
    if s.switched && s.buffered() == 0 {
        let mut n: c_int = 0;
        // SAFETY: FIONREAD into a valid int on our TCP socket.
        unsafe {
            real::ioctl(
                s.tcp.as_raw_fd(),
                libc::FIONREAD as _,
                &mut n as *mut c_int as usize,
            )
        };
        return n.max(0) as usize;
    }
    s.buffered()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_micros(20);
    const MAX: Duration = Duration::from_micros(200);

    /// A spin that ran out, then a kernel sleep of `sleep` that a member's data ended.
    fn miss_then_sleep(st: &mut SpinState, t: &mut Instant, sleep: Duration) {
        let (budget, probe) = st.budget(BASE, MAX);
        *t += budget;
        st.spun(probe, false, *t);
        *t += sleep;
        st.woke(*t, BASE, MAX);
    }

    #[test]
    fn a_short_sleep_makes_the_next_spin_a_probe_and_a_hit_keeps_it_long() {
        let mut st = SpinState::NEW;
        let mut t = Instant::now();
        assert_eq!(
            st.budget(BASE, MAX),
            (BASE, false),
            "a new thread spins the base"
        );
        miss_then_sleep(&mut st, &mut t, Duration::from_micros(100));
        assert_eq!(
            st.budget(BASE, MAX),
            (MAX, true),
            "120 us of waiting: probe"
        );
        st.spun(true, true, t);
        for _ in 0..3 {
            assert_eq!(
                st.budget(BASE, MAX),
                (MAX, false),
                "kept while spins see data"
            );
            st.spun(false, true, t);
        }
        // The first long spin that runs out goes back to the base at once.
        miss_then_sleep(&mut st, &mut t, Duration::from_secs(1));
        assert_eq!(
            st.budget(BASE, MAX),
            (BASE, false),
            "an idle spell: the base"
        );
    }

    #[test]
    fn a_long_sleep_never_probes() {
        let mut st = SpinState::NEW;
        let mut t = Instant::now();
        for _ in 0..10 {
            miss_then_sleep(&mut st, &mut t, Duration::from_micros(181));
            assert_eq!(st.budget(BASE, MAX), (BASE, false));
        }
    }

    #[test]
    fn failed_probes_back_off_exponentially() {
        let mut st = SpinState::NEW;
        let mut t = Instant::now();
        let short = Duration::from_micros(5);
        let mut gaps = Vec::new();
        // Where spinning cannot help (the peer waits for this CPU): every sleep is short
        // and every probe runs out.
        let mut since = 0;
        for _ in 0..20_000 {
            let (_, probe) = st.budget(BASE, MAX);
            if probe {
                gaps.push(since);
                since = 0;
            }
            since += 1;
            miss_then_sleep(&mut st, &mut t, short);
        }
        // Waits between probes (the probe itself counted): the first sleep makes the
        // second wait a probe; then 64 sleeps, doubling, up to 4096.
        assert_eq!(
            gaps[..8],
            [1, 65, 129, 257, 513, 1025, 2049, 4097],
            "{gaps:?}"
        );
        assert!(gaps[8..].iter().all(|&g| g == 4097), "{gaps:?}");
    }

    #[test]
    fn no_stretch_when_the_ceiling_is_the_base() {
        let mut st = SpinState::NEW;
        let mut t = Instant::now();
        miss_then_sleep(&mut st, &mut t, Duration::ZERO);
        assert_eq!(st.budget(BASE, BASE), (BASE, false));
    }
}
