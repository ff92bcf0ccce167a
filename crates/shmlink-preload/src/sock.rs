//! One TCP connection moved onto shared memory: a byte stream over shmlink messages.
//!
//! Each `write` sends its bytes as messages of at most [`CHUNK`] bytes (each one fits a
//! ring record, so a non-blocking send is all or nothing per chunk); a read takes a
//! message into the caller's buffer, or into [`Sock::rbuf`] when it does not fit, from
//! where later reads take the rest. A zero-length message is the FIN of
//! `shutdown(SHUT_WR)`; a closed connection is the end of the stream too.
//!
//! The connection is always in non-blocking mode; blocking calls wait here (a bounded
//! spin, then `poll` on the control socket, which the peer's doorbells make readable)
//! with the [`Entry`] lock released, so one thread may read while another writes.

use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::c_int;
use shmlink::{Connection, ErrorKind};

use crate::stats::Stat;
use crate::{config, real};

/// The largest message one write puts into the ring (a quarter of the smallest ring we
/// configure, so it always fits one record).
pub(crate) const CHUNK: usize = 16 * 1024;

/// Bumped in the parent before every `fork`: a connection created before it may be held
/// by two processes, so closing it in one must not end it for the other.
pub(crate) static FORKS: AtomicU64 = AtomicU64::new(0);

/// The read side's state.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ReadEnd {
    Open,
    /// The peer sent its FIN or closed: reads return 0.
    Eof,
}

/// Outcome of trying to make bytes available to read.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Fill {
    /// `rbuf` holds unread bytes.
    Data,
    /// End of stream: reads return 0.
    Eof,
    /// Nothing yet (the connection announced that it waits: a doorbell will come).
    Empty,
}

/// How the peer went away, once this side noticed (what its TCP socket would have told).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Gone {
    /// The peer is there (or its end was not noticed yet).
    No,
    /// It closed, or died with nothing of ours unread: its kernel would have sent a FIN.
    /// Reads return 0 after the data; one more write is taken (TCP's answer to it is
    /// the reset), later ones fail with `EPIPE`.
    Fin { wrote: bool },
    /// It died with bytes of ours unread: its kernel would have sent a reset. The next
    /// read (after the data it sent) or write fails once with `ECONNRESET`; then reads
    /// return 0 and writes fail with `EPIPE`.
    Reset { reported: bool },
}

/// A connection on shared memory and the stream state around it.
pub(crate) struct Sock {
    pub conn: Option<Connection>,
    /// The library's control socket (its fd number; the application's fd is a dup).
    pub ctl: RawFd,
    /// Unread bytes of the last message: `rbuf[rpos..]`.
    pub rbuf: Vec<u8>,
    pub rpos: usize,
    pub read_end: ReadEnd,
    /// `shutdown(SHUT_RD)`: reads return 0.
    pub rd_shut: bool,
    /// `shutdown(SHUT_WR)` was called; `fin_sent` once its empty message is in the ring.
    pub wr_shut: bool,
    pub fin_sent: bool,
    /// The peer is gone or the connection failed: writes fail (see [`Gone`]).
    pub broken: bool,
    /// How the peer went away.
    pub gone: Gone,
    /// Whether the peer had bytes of ours unread when a wait saw its control socket
    /// hang up (the moment of its end, as near as this side can know).
    pub unread_at_hup: Option<bool>,
    /// The last send found the ring full (POLLOUT waits for a room doorbell).
    pub tx_full: bool,
    /// The last receive found nothing and announced it: a doorbell will come.
    pub armed: bool,
    /// Threads between announcing a wait on this connection and the end of that wait
    /// (poll, epoll, a blocking read or write). Only with none left is an announcement
    /// withdrawn: a sleeping thread relies on it.
    pub sleepers: u32,
    /// A read drained the connection since the last edge-triggered event: the next
    /// message is a new edge.
    pub et_drained: bool,
    pub rcv_timeout: Option<Duration>,
    pub snd_timeout: Option<Duration>,
    /// The real TCP socket, kept open underneath (addresses, socket options); closed
    /// by `Drop` if its number still names it.
    pub tcp: ManuallyDrop<OwnedFd>,
    /// `FORKS` when this connection was made.
    pub born: u64,
    /// Human-readable `local -> peer` for the log.
    pub name: String,
    /// Payload bytes taken from the ring (the peer's stream), and sent into it (ours):
    /// what an exec switch to TCP counts with (`crate::exec`).
    pub rx_total: u64,
    pub tx_total: u64,
    /// The peer moved the connection onto the TCP socket underneath (it exec'd): writes
    /// and, once `rbuf` is empty, reads go to that socket.
    pub switched: bool,
    /// After a switch: the program's fds still name the control socket (they move onto
    /// the TCP socket when `rbuf`, read ahead, is empty).
    pub retarget_due: bool,
    /// [`Sock::reset_both`] told the peer (once is enough).
    pub reset_sent: bool,
    /// The inodes of `ctl` and `tcp` when the connection was made: at the end, a number
    /// that names another file now (the program closed ours behind the library's back, a
    /// raw `close_range`, and reused the number) is left alone, not closed.
    pub ctl_ino: u64,
    pub tcp_ino: u64,
}

/// The inode behind `fd` (0 if it is not open).
pub(crate) fn inode(fd: RawFd) -> u64 {
    // SAFETY: stat is plain data; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-parameter.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return 0;
    }
    st.st_ino
}

/// What the fd table holds for each fd number that names a shm connection (dups share
/// it, like they share a file description).
pub(crate) struct Entry {
    pub sock: Mutex<Sock>,
    /// O_NONBLOCK as the application set it (the kernel file stays blocking).
    pub nonblocking: AtomicBool,
}

impl Entry {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Sock> {
        self.sock.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Sock {
    fn drop(&mut self) {
        let _g = crate::Guard::enter();
        crate::table::set_internal(&[self.ctl, self.tcp.as_raw_fd()], false);
        self.end();
        if inode(self.tcp.as_raw_fd()) == self.tcp_ino {
            // SAFETY: dropped once, here; nothing uses `tcp` after.
            unsafe { ManuallyDrop::drop(&mut self.tcp) };
        } else {
            // Not our TCP socket any more: the number belongs to someone else now.
            crate::debug!(
                "{}: the TCP socket's number was reused; left open",
                self.name
            );
        }
    }
}

impl Sock {
    /// The body of `Drop` before the TCP socket closes.
    fn end(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if inode(self.ctl) != self.ctl_ino {
            // Our control socket was closed past the library and its number reused: do
            // not close the new file (the connection's mapping is leaked instead).
            crate::debug!(
                "{}: the control socket's number was reused; left open",
                self.name
            );
            std::mem::forget(conn);
            return;
        }
        if self.born != FORKS.load(Ordering::Relaxed) {
            // Another process may hold this connection (fork): leave the ring and the
            // peer alone; only this process's fds go. The peer sees the end when the
            // last holder is gone.
            let fd = conn.as_raw_fd();
            std::mem::forget(conn);
            // SAFETY: `fd` was the forgotten connection's own control socket; nothing
            // else in this process uses that number.
            unsafe { real::close(fd) };
            return;
        }
        if !self.switched && !self.broken {
            // The peer may have exec'd: what it had not consumed of ours goes over TCP
            // before our TCP socket closes (our program closed without reading further).
            self.conn = Some(conn);
            self.seek_switch(true);
            let Some(c) = self.conn.take() else { return };
            if self.switched {
                return;
            }
            return self.close_shm(c);
        }
        self.close_shm(conn);
    }
}

impl Sock {
    /// The graceful close of the shm connection (the end of `Drop`).
    fn close_shm(&mut self, conn: Connection) {
        if self.wr_shut && !self.fin_sent {
            let mut conn = conn;
            let _ = conn.send(&[]);
            drop(conn);
        } else {
            // Dropping is a graceful close that never blocks: what is in the ring stays
            // readable for the peer, then it reads end-of-stream.
            drop(conn);
        }
        crate::debug!("closed shm connection {}", self.name);
    }
}

impl Sock {
    fn conn(&mut self) -> &mut Connection {
        self.conn.as_mut().expect("a live Sock has its connection")
    }

    /// Unread bytes buffered.
    pub(crate) fn buffered(&self) -> usize {
        self.rbuf.len() - self.rpos
    }

    /// Tries to make bytes available without blocking.
    pub(crate) fn fill(&mut self) -> Fill {
        if self.buffered() > 0 {
            return Fill::Data;
        }
        if self.rd_shut || self.read_end == ReadEnd::Eof || self.switched {
            if !self.switched && !self.broken {
                // After the peer's FIN, or our SHUT_RD (whose data nobody reads), look
                // for its exec's switch message.
                self.seek_switch(false);
            }
            return Fill::Eof;
        }
        match self.conn().recv_vec() {
            Ok(v) if v.is_empty() => {
                self.read_end = ReadEnd::Eof;
                Fill::Eof
            }
            Ok(v) if v.len() > CHUNK => {
                // Not data (data messages are at most CHUNK bytes): the peer's exec.
                crate::exec::peer_switched(self, &v);
                Fill::Eof
            }
            Ok(v) => {
                self.rx_total += v.len() as u64;
                self.armed = false;
                self.rbuf = v;
                self.rpos = 0;
                Fill::Data
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                self.armed = true;
                Fill::Empty
            }
            Err(e) if e.kind() == ErrorKind::ProtocolViolation => {
                self.reset_both(&e.to_string());
                Fill::Eof
            }
            Err(e) => {
                // Close or death of the peer. TCP's reader sees the end of the stream
                // (the dead process's kernel sends a FIN), or a reset when the peer
                // died with data of ours unread.
                if e.kind() != ErrorKind::EndOfStream {
                    crate::debug!("{}: {e}; the stream ends", self.name);
                }
                self.notice_gone(e.kind() != ErrorKind::EndOfStream);
                self.read_end = ReadEnd::Eof;
                Fill::Eof
            }
        }
    }

    /// The peer is gone (`died`: without closing, e.g. killed): decides, once, what its
    /// TCP socket would have sent — a reset if it left bytes of ours unread, else a FIN.
    /// The same rule for a close as for a death: TCP's `close` with unread data sends a
    /// reset too (sockperf's server relies on it to drop a half-received message).
    pub(crate) fn notice_gone(&mut self, died: bool) {
        self.broken = true;
        if self.gone != Gone::No {
            return;
        }
        if let Some(n) = foreign_packet(self.ctl) {
            // The peer reset the connection (or bytes not of its library came with its
            // end): never a clean end.
            return self.reset_both(&format!("a {n}-byte packet that is no doorbell"));
        }
        // Seen at the hang-up: TCP's rule for any end, a close included (a socket
        // closed with unread data sends a reset).
        let unread = match self.unread_at_hup {
            Some(u) => u,
            None => self.conn().peer_unread().unwrap_or(false),
        };
        self.gone = if unread {
            Gone::Reset { reported: false }
        } else {
            Gone::Fin { wrote: false }
        };
        let how = if died { "died" } else { "closed" };
        crate::debug!("{}: peer {how}, as a TCP {:?}", self.name, self.gone);
    }

    /// Bytes that are not the library's came in on the control socket: the peer's
    /// program wrote on its fd past the library (a raw `syscall(SYS_write)`, `io_uring`,
    /// a process it passed the fd to without the `sendmsg` hook), so its stream has a
    /// hole; or the peer reset the connection for that reason. Never carry on: both
    /// sides see a reset. This side: the next read or write fails with `ECONNRESET`
    /// (`POLLERR` until then). The peer: a packet that is no doorbell, then the control
    /// socket's hang-up (which also wakes our program's waits on its fd).
    pub(crate) fn reset_both(&mut self, why: &str) {
        self.broken = true;
        self.read_end = ReadEnd::Eof;
        if !matches!(self.gone, Gone::Reset { .. }) {
            self.gone = Gone::Reset { reported: false };
        }
        if self.reset_sent {
            return;
        }
        self.reset_sent = true;
        crate::debug!("{}: reset: {why}", self.name);
        let _g = crate::Guard::enter();
        // SAFETY: a valid buffer; `ctl` is our control socket (MSG_DONTWAIT: a full
        // socket only loses the packet, the hang-up below still tells).
        unsafe {
            real::send(
                self.ctl,
                RESET_PACKET.as_ptr().cast(),
                RESET_PACKET.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        // SAFETY: shutdown of our control socket: the peer sees it hang up.
        unsafe { real::shutdown(self.ctl, libc::SHUT_RDWR) };
    }

    /// The error a read reports once the data is drained: `ECONNRESET` once after a
    /// reset, else `None` (end of stream).
    pub(crate) fn take_reset(&mut self) -> Option<c_int> {
        if self.gone == (Gone::Reset { reported: false }) {
            self.gone = Gone::Reset { reported: true };
            return Some(libc::ECONNRESET);
        }
        None
    }

    /// A write to a peer that is gone: `ECONNRESET` once after a reset; after a FIN the
    /// first write is taken (bytes dropped, as the dead end's kernel drops them); then
    /// `EPIPE`.
    fn write_gone(&mut self, len: usize) -> Result<usize, c_int> {
        match self.gone {
            Gone::Reset { reported: false } => {
                self.gone = Gone::Reset { reported: true };
                Err(libc::ECONNRESET)
            }
            Gone::Fin { wrote: false } if !self.wr_shut && len > 0 => {
                self.gone = Gone::Fin { wrote: true };
                Ok(len)
            }
            _ => Err(libc::EPIPE),
        }
    }

    /// Receives straight into `dst` when the next message fits (no intermediate copy).
    /// `None`: nothing done, use [`fill`](Self::fill).
    fn recv_direct(&mut self, dst: &mut [u8]) -> Option<usize> {
        if self.buffered() > 0 || self.rd_shut || self.read_end == ReadEnd::Eof || self.switched {
            return None;
        }
        // Nothing in the ring: `fill` announces the wait (one announcement, not two).
        if self.conn().recv_ready() == Some(false) {
            return None;
        }
        match self.conn().recv(dst) {
            Ok(0) => {
                self.read_end = ReadEnd::Eof;
                Some(0)
            }
            Ok(n) if n > CHUNK => {
                // Not data: the peer's exec (see `fill`). `dst` past the bytes this
                // read returns is scratch, as read(2) allows.
                let msg = dst[..n].to_vec();
                crate::exec::peer_switched(self, &msg);
                Some(0)
            }
            Ok(n) => {
                self.armed = false;
                self.rx_total += n as u64;
                Some(n)
            }
            Err(e) if e.kind() == ErrorKind::ProtocolViolation => {
                self.reset_both(&e.to_string());
                None
            }
            Err(_) => None,
        }
    }

    /// Copies buffered bytes out; `peek` leaves them.
    fn take(&mut self, dst: &mut [u8], peek: bool) -> usize {
        let n = dst.len().min(self.buffered());
        dst[..n].copy_from_slice(&self.rbuf[self.rpos..self.rpos + n]);
        if !peek {
            self.rpos += n;
            if self.rpos == self.rbuf.len() {
                self.rbuf.clear();
                self.rpos = 0;
            }
        }
        n
    }

    /// Takes every message waiting in the ring into `rbuf` (a byte stream: reads take
    /// from it in order), up to the peer's exec switch message, which it acts on.
    pub(crate) fn read_ahead(&mut self) {
        if self.switched || self.broken || self.read_end == ReadEnd::Eof {
            if self.read_end == ReadEnd::Eof && !self.switched && !self.broken {
                self.seek_switch(false);
            }
            return;
        }
        loop {
            let Some(conn) = self.conn.as_mut() else {
                return;
            };
            match conn.recv_vec() {
                Ok(v) if v.len() > CHUNK => {
                    crate::exec::peer_switched(self, &v);
                    return;
                }
                Ok(v) if v.is_empty() => {
                    self.read_end = ReadEnd::Eof;
                    self.seek_switch(false);
                    return;
                }
                Ok(v) => {
                    self.rx_total += v.len() as u64;
                    if self.rpos > 0 {
                        self.rbuf.drain(..self.rpos);
                        self.rpos = 0;
                    }
                    self.rbuf.extend_from_slice(&v);
                }
                Err(e) if e.kind() == ErrorKind::ProtocolViolation => {
                    return self.reset_both(&e.to_string());
                }
                Err(_) => return,
            }
        }
    }

    /// Takes the messages waiting in the ring, dropping data (nobody will read it: after
    /// SHUT_RD, or at close), until the peer's exec switch message, which it acts on
    /// (`closing`: only sends our unconsumed bytes again, the fds are going away).
    pub(crate) fn seek_switch(&mut self, closing: bool) {
        if closing || self.rd_shut || self.read_end != ReadEnd::Eof {
            // Data may come first, which this drops: only once the peer is gone (it
            // exec'd, closed or died), so that while it lives it still sees what we left
            // unread (its reset-or-FIN rule).
            let r = real::poll_one(self.ctl, libc::POLLIN | libc::POLLRDHUP, 0);
            if r <= 0 || r as i16 & libc::POLLHUP == 0 {
                return;
            }
        }
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        loop {
            match conn.recv_vec() {
                Ok(v) if v.len() > CHUNK => {
                    if closing {
                        crate::exec::peer_switched_at_close(self, &v);
                    } else {
                        crate::exec::peer_switched(self, &v);
                    }
                    return;
                }
                Ok(v) if v.is_empty() => self.read_end = ReadEnd::Eof,
                Ok(v) if self.rd_shut || closing => self.rx_total += v.len() as u64,
                // Data after a FIN: not from this library; leave it.
                Ok(_) => return,
                Err(e) if e.kind() == ErrorKind::ProtocolViolation => {
                    return self.reset_both(&e.to_string());
                }
                Err(_) => return,
            }
        }
    }

    /// Sends FIN if `shutdown(SHUT_WR)` could not yet.
    pub(crate) fn flush_fin(&mut self) {
        if self.wr_shut && !self.fin_sent && !self.broken {
            match self.conn().send(&[]) {
                Ok(()) => self.fin_sent = true,
                Err(e) if e.kind() == ErrorKind::WouldBlock => self.tx_full = true,
                Err(e) if e.kind() == ErrorKind::ProtocolViolation => {
                    self.reset_both(&e.to_string())
                }
                Err(_) => self.broken = true,
            }
        }
    }

    /// The rest of a send after the peer switched to TCP (it exec'd): `done` bytes went
    /// into the ring before, the rest goes over TCP.
    fn send_switched(&mut self, rest: &[u8], done: usize) -> Result<usize, c_int> {
        match crate::exec::tcp_send(self, rest) {
            Ok(n) => Ok(done + n),
            Err(_) if done > 0 => Ok(done),
            Err(e) => Err(e),
        }
    }

    /// One non-blocking attempt to send `src`: bytes taken (possibly fewer), or errno.
    fn send_some(&mut self, src: &[u8]) -> Result<usize, c_int> {
        if self.switched {
            return crate::exec::tcp_send(self, src);
        }
        if self.wr_shut {
            return Err(libc::EPIPE);
        }
        if !self.broken && self.unread_at_hup.is_some() {
            // A wait saw the peer's end: writes answer as TCP's would from now on.
            self.notice_gone(true);
        }
        if self.broken {
            return self.write_gone(src.len());
        }
        let mut done = 0;
        while done < src.len() {
            let n = (src.len() - done).min(CHUNK);
            match self.conn().send(&src[done..done + n]) {
                Ok(()) => {
                    self.tx_total += n as u64;
                    done += n;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.tx_full = true;
                    // A full ring and a hung-up control socket: the peer closed or died
                    // and will never make room.
                    let r = real::poll_one(self.ctl, libc::POLLIN | libc::POLLRDHUP, 0);
                    if r > 0 && r as i16 & (libc::POLLHUP | libc::POLLRDHUP) != 0 {
                        // Or it exec'd and switched to TCP: its switch message follows
                        // what it sent that our program has not read yet (read ahead).
                        self.read_ahead();
                        if self.switched {
                            return self.send_switched(&src[done..], done);
                        }
                        // A full ring: the peer left bytes of ours unread.
                        self.notice_gone(true);
                        if done == 0 {
                            return self.write_gone(src.len());
                        }
                    }
                    break;
                }
                Err(e) if e.kind() == ErrorKind::ProtocolViolation => {
                    self.reset_both(&e.to_string());
                    if done == 0 {
                        return self.write_gone(src.len());
                    }
                    break;
                }
                Err(e) => {
                    // The peer may have exec'd (its switch follows what it sent).
                    self.read_ahead();
                    if self.switched {
                        return self.send_switched(&src[done..], done);
                    }
                    crate::debug!("{}: send: {e}", self.name);
                    self.notice_gone(true);
                    if done == 0 {
                        return self.write_gone(src.len());
                    }
                    break;
                }
            }
        }
        if done > 0 {
            self.tx_full = false;
        }
        Ok(done)
    }
}

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
}

/// What [`Sock::reset_both`] sends the peer: longer than a doorbell (one byte), so the
/// peer's library takes it for what it is, a broken connection.
const RESET_PACKET: &[u8] = b"shmlink-preload: connection reset";

/// Once the peer is gone: takes what is left on the control socket; the length of the
/// first packet that is no doorbell (one byte, 1 or 2), if any.
fn foreign_packet(ctl: RawFd) -> Option<usize> {
    let _g = crate::Guard::enter();
    let mut buf = [0u8; 16];
    // Bounded: the socket's queue holds at most a few hundred packets.
    for _ in 0..4096 {
        // SAFETY: `buf` is valid for its length; our control socket.
        let n = unsafe {
            real::recv(
                ctl,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        match n {
            1 if buf[0] == 1 || buf[0] == 2 => {}
            n if n > 0 => return Some(n as usize),
            _ => return None,
        }
    }
    None
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
                crate::exec::retarget_now(&mut s);
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
            return crate::exec::tcp_recv(fd, dst, flags);
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
                || s.conn().recv_ready().unwrap_or(true);
            if !hint {
                spun = true;
                let same_cpu = s.conn().shares_cpu_with_peer();
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
                && s.conn().recv_ready() == Some(false);
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
            return match crate::exec::tcp_send_fd(fd, &src[done..], flags) {
                Ok(n) => Ok(done + n),
                Err(_) if done > 0 => Ok(done),
                Err(e) => Err(e),
            };
        }
        if deadline.is_none() {
            deadline = s.snd_timeout.map(|t| Instant::now() + t);
        }
        match s.send_some(&src[done..]) {
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
        || s.conn().recv_ready().unwrap_or(true);
    let fill = if announce || hint {
        // Within a wait's announcement pass, its token (one doorbell per sleep).
        let token = if announce && !s.switched && s.conn.is_some() {
            crate::wake::current()
        } else {
            None
        };
        if token.is_some() {
            s.conn().set_wait_token(token);
        }
        let fill = s.fill();
        if token.is_some() {
            s.conn().set_wait_token(None);
        }
        fill
    } else {
        Fill::Empty
    };
    if s.switched {
        // The peer exec'd: the kernel's answer for the TCP socket (and what was read
        // ahead of the switch, first). Once that is read, the fds (and their epoll
        // registrations, on the hung-up control socket until then) move to TCP.
        if s.retarget_due && s.buffered() == 0 {
            crate::exec::retarget_now(&mut s);
        }
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
                s.conn().withdraw_wait();
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
    s.conn().recv_ready().unwrap_or(true)
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
        || s.conn().recv_ready().unwrap_or(true);
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
/// (`Connection::shares_cpu_with_peer`, which also tells each peer where we wait): then
/// a spin would only keep that peer from running, and the wait sleeps at once. Found
/// for redis-benchmark `-c 1` with both ends on one CPU: every request cost two whole
/// spins, 21 000 requests/s against TCP's 115 000.
pub(crate) fn shares_cpu<'a>(entries: impl IntoIterator<Item = &'a Arc<Entry>>) -> bool {
    entries.into_iter().fold(false, |any, e| {
        let mut s = e.lock();
        let shared = s.conn.is_some() && !s.switched && s.conn().shares_cpu_with_peer();
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
        let unread = s.conn().peer_unread().unwrap_or(false);
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
