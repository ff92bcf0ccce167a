//! One TCP connection moved onto shared memory: a byte stream over shmlink messages,
//! one non-blocking step at a time (the blocking calls around them are `stream`'s).
//!
//! Each `write` sends its bytes as messages of at most [`CHUNK`] bytes (each one fits a
//! ring record, so a non-blocking send is all or nothing per chunk); a read takes a
//! message into the caller's buffer, or into [`Sock::rbuf`] when it does not fit, from
//! where later reads take the rest. A zero-length message is the FIN of
//! `shutdown(SHUT_WR)`; a closed connection is the end of the stream too.
//!
//! The peer's exec switch message (`switch`) is met in order, after its data: then our
//! bytes it had not consumed go again over the TCP socket underneath, and the
//! connection continues there (`crate::exec` says how; moving the program's fds is
//! left to the callers, which know the fd table: [`Sock::retarget_due`]).

use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::c_int;
use shmlink::{Connection, ErrorKind};

use crate::state::{self, FORKS};
use crate::switch::{self, CHUNK};
use crate::{debug, real, tcp, Guard};

/// How long the peer may take to send its unconsumed bytes again over TCP.
const RESEND_WAIT: Duration = Duration::from_secs(5);

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
        let _g = Guard::enter();
        state::set_internal(&[self.ctl, self.tcp.as_raw_fd()], false);
        self.end();
        if inode(self.tcp.as_raw_fd()) == self.tcp_ino {
            // SAFETY: dropped once, here; nothing uses `tcp` after.
            unsafe { ManuallyDrop::drop(&mut self.tcp) };
        } else {
            // Not our TCP socket any more: the number belongs to someone else now.
            debug!(
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
            debug!(
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
        debug!("closed shm connection {}", self.name);
    }
}

impl Sock {
    pub(crate) fn conn(&mut self) -> &mut Connection {
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
                self.peer_switched(&v);
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
                    debug!("{}: {e}; the stream ends", self.name);
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
            None => self.conn().shm().is_some_and(|mut c| c.peer_unread()),
        };
        self.gone = if unread {
            Gone::Reset { reported: false }
        } else {
            Gone::Fin { wrote: false }
        };
        let how = if died { "died" } else { "closed" };
        debug!("{}: peer {how}, as a TCP {:?}", self.name, self.gone);
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
        debug!("{}: reset: {why}", self.name);
        let _g = Guard::enter();
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
    pub(crate) fn recv_direct(&mut self, dst: &mut [u8]) -> Option<usize> {
        if self.buffered() > 0 || self.rd_shut || self.read_end == ReadEnd::Eof || self.switched {
            return None;
        }
        // Nothing in the ring: `fill` announces the wait (one announcement, not two).
        if self.conn().shm().map(|mut c| c.recv_ready()) == Some(false) {
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
                self.peer_switched(&msg);
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
    pub(crate) fn take(&mut self, dst: &mut [u8], peek: bool) -> usize {
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
                    self.peer_switched(&v);
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
                        self.peer_switched_at_close(&v);
                    } else {
                        self.peer_switched(&v);
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
        match self.tcp_send(rest) {
            Ok(n) => Ok(done + n),
            Err(_) if done > 0 => Ok(done),
            Err(e) => Err(e),
        }
    }

    /// One non-blocking attempt to send `src`: bytes taken (possibly fewer), or errno.
    pub(crate) fn send_some(&mut self, src: &[u8]) -> Result<usize, c_int> {
        if self.switched {
            return self.tcp_send(src);
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
                    debug!("{}: send: {e}", self.name);
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

/// What [`Sock::reset_both`] sends the peer: longer than a doorbell (one byte), so the
/// peer's library takes it for what it is, a broken connection.
const RESET_PACKET: &[u8] = b"shmlink-preload: connection reset";

/// Once the peer is gone: takes what is left on the control socket; the length of the
/// first packet that is no doorbell (one byte, 1 or 2), if any.
fn foreign_packet(ctl: RawFd) -> Option<usize> {
    let _g = Guard::enter();
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

impl Sock {
    /// The peer's switch message arrived (in order, after all it wrote): sends again over
    /// TCP what it had not consumed and marks our fds as due to move onto TCP. On any
    /// inconsistency the connection is broken (the program sees the end of the stream or
    /// a reset).
    pub(crate) fn peer_switched(&mut self, msg: &[u8]) {
        let _g = Guard::enter();
        let fail = |s: &mut Sock, why: &str| {
            debug!("{}: peer's exec switch unusable ({why})", s.name);
            s.notice_gone(true);
            s.read_end = ReadEnd::Eof;
        };
        let Some((consumed, wrote, returned)) = switch::decode(msg) else {
            return fail(self, "malformed");
        };
        if wrote != self.rx_total {
            return fail(self, "byte counts differ");
        }
        // Our bytes it had not consumed, over TCP first.
        let unsent = match self.resend(consumed, returned) {
            Ok(n) => n,
            Err(why) => return fail(self, &why),
        };
        tcp::shut_like(self.tcp.as_raw_fd(), self.rd_shut, self.wr_shut);
        self.switched = true;
        debug!(
            "{}: peer exec'd: continues over TCP ({unsent} bytes sent again, {} read ahead)",
            self.name,
            self.buffered()
        );
        // Bytes it sent before the switch may wait in `rbuf`: the fds move once they are
        // read (`exec::retarget_now`), reads take them first, writes go to TCP already.
        self.retarget_due = true;
    }

    /// The peer's switch message, found as our program closes the connection: sends
    /// again over TCP what it had not consumed (our TCP socket then closes with the
    /// `Sock`).
    pub(crate) fn peer_switched_at_close(&mut self, msg: &[u8]) {
        let _g = Guard::enter();
        let Some((consumed, _wrote, returned)) = switch::decode(msg) else {
            return;
        };
        let unsent = match self.resend(consumed, returned) {
            Ok(n) => n,
            Err(why) => {
                debug!("{}: peer exec'd before our close: {why}", self.name);
                return;
            }
        };
        self.switched = true;
        debug!(
            "{}: peer exec'd before our close: {unsent} bytes sent again over TCP",
            self.name
        );
    }

    /// Sends over TCP, to a peer that exec'd, our bytes from stream offset `consumed`
    /// on, which its program had not read: `returned` (what its library had taken from
    /// the ring, sent back in the switch message), then the rest of what our send ring
    /// still holds. Returns how many bytes went, or why it could not.
    fn resend(&mut self, consumed: u64, returned: &[u8]) -> Result<usize, String> {
        let Some(ring) = self.conn.as_mut().and_then(|c| c.shm()?.unconsumed_sent()) else {
            return Err("our send ring is unreadable".into());
        };
        // The ring holds our stream from `held` on; the peer took it up to `taken`.
        let held = self.tx_total - ring.len() as u64;
        let taken = consumed.checked_add(returned.len() as u64);
        let skip = match taken {
            Some(t) if (held..=self.tx_total).contains(&t) => (t - held) as usize,
            _ => return Err("byte counts differ".into()),
        };
        let deadline = Instant::now() + RESEND_WAIT;
        let fd = self.tcp.as_raw_fd();
        tcp::send_all(fd, returned, deadline).map_err(|e| format!("resend: errno {e}"))?;
        tcp::send_all(fd, &ring[skip..], deadline).map_err(|e| format!("resend: errno {e}"))?;
        Ok(returned.len() + ring.len() - skip)
    }

    /// A non-blocking send attempt from inside the shm write path after a switch (the
    /// blocking wait, if any, is `stream::write`'s, which sees `switched` on its next
    /// turn).
    fn tcp_send(&mut self, src: &[u8]) -> Result<usize, c_int> {
        match tcp::send(self.tcp.as_raw_fd(), src, libc::MSG_DONTWAIT) {
            Err(libc::EAGAIN) => Ok(0),
            r => r,
        }
    }
}
