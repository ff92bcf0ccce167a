//! [`FramedConn`]: one connection over a framed socket transport — sending (with the
//! queue a non-blocking send leaves), receiving through the [`Wire`], the readiness of its
//! epoll set, and the close that never blocks (see the [parent module](super)).

use crate::sync::{AtomicUsize, Ordering};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Instant;

use super::{recycle, Frame, Incoming, Link, Wire};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::stream::{self, EventFlag, Ready};
use crate::sys::{Epoll, Interest, Token};
use crate::transport::{ConnOps, CLOSE_LINGER};
use crate::view::SharedBytes;

/// Epoll tokens of a connection's set.
const TOKEN_SOCKET: u64 = 0;
const TOKEN_FLAG: u64 = 1;

/// A terminal state remembered so that every later call reports it again.
struct Ended {
    kind: ErrorKind,
    msg: String,
}

impl Ended {
    fn of(e: &Error) -> Ended {
        Ended {
            kind: e.kind(),
            msg: e.to_string(),
        }
    }

    fn error(&self) -> Error {
        Error::new(self.kind, self.msg.clone())
    }
}

/// A message a non-blocking send could not write whole.
struct Queued {
    payload: Vec<u8>,
    /// Bytes of its frame already written.
    sent: usize,
}

/// Writes one frame, waiting for room in blocking mode. Returns false when a non-blocking
/// write found the link full.
fn write_frame<W: Wire>(
    link: &mut W::Link,
    frame: Frame,
    payload: &[u8],
    sent: &mut usize,
    blocking: bool,
) -> io::Result<bool> {
    loop {
        if W::write(link, frame, payload, sent, blocking)? {
            return Ok(true);
        }
        if !blocking {
            return Ok(false);
        }
        // The socket is in blocking mode, so the kernel waits for room itself; should it
        // ever report EAGAIN anyway, wait here rather than spin.
        stream::wait(link.sock(), Ready::Write, None)?;
    }
}

/// A connection over a framed socket transport.
pub(crate) struct FramedConn<W: Wire> {
    link: W::Link,
    wire: W,
    /// The pollable descriptor ([`ConnOps::fd`]).
    epoll: Epoll,
    /// Set while input waits in user space (created on first need).
    flag: Option<EventFlag>,
    flag_set: bool,
    /// Whether the epoll set watches the socket for output (exactly while output waits
    /// in user space: `queued`, or the link's pending output).
    out_watched: bool,
    queued: Option<Queued>,
    /// The message being built in place; its capacity is reused.
    staging: Vec<u8>,
    staged_blocking: bool,
    /// Length of the current received message.
    current: Option<usize>,
    rx_end: Option<Ended>,
    tx_end: Option<Ended>,
    max_send: usize,
    local: String,
    peer: String,
}

impl<W: Wire> FramedConn<W> {
    /// Wraps a link whose handshake is done. `max_recv` is our limit, `peer_max` the
    /// peer's.
    pub(crate) fn new(
        link: W::Link,
        max_recv: usize,
        peer_max: usize,
        local: String,
        peer: String,
    ) -> io::Result<FramedConn<W>> {
        stream::set_blocking(link.sock())?;
        let epoll = Epoll::new()?;
        epoll.add(
            link.sock().as_raw_fd(),
            Interest::READABLE,
            Token(TOKEN_SOCKET),
        )?;
        let mut conn = FramedConn {
            link,
            wire: W::new(max_recv),
            epoll,
            flag: None,
            flag_set: false,
            out_watched: false,
            queued: None,
            staging: Vec::new(),
            staged_blocking: true,
            current: None,
            rx_end: None,
            tx_end: None,
            max_send: max_recv.min(peer_max),
            local,
            peer,
        };
        // The link may hold input that arrived with the end of its handshake.
        conn.sync_flag().map_err(io::Error::from)?;
        Ok(conn)
    }

    /// Whether output waits in user space: the rest of a queued frame, or bytes the link
    /// took but could not write yet (TLS records).
    fn backlog(&self) -> bool {
        self.queued.is_some() || self.link.pending_output()
    }

    fn send_error(&self, e: io::Error) -> Error {
        Error::io(format!("send to {}", self.peer), e)
    }

    fn recv_error(&self, e: io::Error) -> Error {
        if e.kind() == io::ErrorKind::InvalidData {
            Error::violation(format!("receive from {}: {e}", self.peer))
        } else {
            Error::io(format!("receive from {}", self.peer), e)
        }
    }

    /// Remembers a send-side failure; every later send reports it.
    fn end_tx(&mut self, e: Error) -> Error {
        self.tx_end = Some(Ended::of(&e));
        self.queued = None;
        e
    }

    /// Remembers how the receive side ended; every later receive reports it.
    fn end_rx(&mut self, e: Error) -> Error {
        self.rx_end = Some(Ended::of(&e));
        e
    }

    /// Fails if sending can no longer succeed.
    fn check_tx(&self) -> Result<()> {
        if let Some(end) = &self.tx_end {
            return Err(end.error());
        }
        match &self.rx_end {
            Some(end) if end.kind == ErrorKind::EndOfStream => Err(Error::reset(format!(
                "send to {}: the peer closed the connection",
                self.peer
            ))),
            Some(end) => Err(end.error()),
            None => Ok(()),
        }
    }

    /// Makes the epoll set watch the socket for output exactly while output waits in
    /// user space.
    fn sync_output(&mut self) -> Result<()> {
        let on = self.backlog();
        if on != self.out_watched {
            let mut events = Interest::READABLE;
            if on {
                events |= Interest::WRITABLE;
            }
            self.epoll
                .modify(self.link.sock().as_raw_fd(), events, Token(TOKEN_SOCKET))
                .map_err(|e| Error::io(format!("watch the connection to {}", self.peer), e))?;
            self.out_watched = on;
        }
        Ok(())
    }

    /// Makes the eventfd flag mirror whether input waits in user space: whole frames in
    /// the wire's buffer, or bytes the link decrypted.
    fn sync_flag(&mut self) -> Result<()> {
        let want = self.wire.buffered() || self.link.buffered_input();
        if want == self.flag_set {
            return Ok(());
        }
        let ctx = |e| Error::io(format!("flag buffered input from {}", self.peer), e);
        if self.flag.is_none() {
            let flag = EventFlag::new().map_err(ctx)?;
            self.epoll
                .add(flag.fd().as_raw_fd(), Interest::READABLE, Token(TOKEN_FLAG))
                .map_err(ctx)?;
            self.flag = Some(flag);
        }
        let flag = self.flag.as_ref().expect("created above");
        if want { flag.set() } else { flag.clear() }.map_err(ctx)?;
        self.flag_set = want;
        Ok(())
    }

    /// Writes what waits in user space: the rest of a queued frame, then what the link
    /// holds. Returns true when no frame is queued (the link may still hold bytes; it
    /// pushes back on its own).
    fn flush(&mut self, blocking: bool) -> Result<bool> {
        if let Some(q) = &mut self.queued {
            match write_frame::<W>(
                &mut self.link,
                Frame::Data,
                &q.payload,
                &mut q.sent,
                blocking,
            ) {
                Ok(true) => {
                    let q = self.queued.take().expect("checked above");
                    if self.staging.capacity() < q.payload.capacity() {
                        self.staging = q.payload;
                        recycle(&mut self.staging);
                    }
                }
                Ok(false) => {}
                Err(e) => return Err(self.send_failed(e)),
            }
        }
        if self.link.pending_output() {
            if let Err(e) = self.link.flush(blocking) {
                return Err(self.send_failed(e));
            }
        }
        self.sync_output()?;
        Ok(self.queued.is_none())
    }

    /// Ends the send side after a failed write.
    fn send_failed(&mut self, e: io::Error) -> Error {
        let e = self.send_error(e);
        let e = self.end_tx(e);
        // The send side is over; failing to unwatch its output changes nothing.
        let _ = self.sync_output();
        e
    }

    /// Gets ready to send one more message: the queue must drain first.
    fn before_send(&mut self, blocking: bool) -> Result<()> {
        self.check_tx()?;
        if !self.flush(blocking)? {
            return Err(Error::would_block());
        }
        Ok(())
    }

    /// Queues what a non-blocking write left of a frame.
    fn enqueue(&mut self, payload: Vec<u8>, sent: usize) -> Result<()> {
        self.queued = Some(Queued { payload, sent });
        self.sync_output()
    }

    /// Sends the staged message.
    fn send_staged(&mut self) -> Result<()> {
        let mut sent = 0;
        match write_frame::<W>(
            &mut self.link,
            Frame::Data,
            &self.staging,
            &mut sent,
            self.staged_blocking,
        ) {
            Ok(true) => {
                recycle(&mut self.staging);
                self.sync_output()
            }
            Ok(false) => {
                let frame = std::mem::take(&mut self.staging);
                self.enqueue(frame, sent)
            }
            Err(e) => Err(self.send_failed(e)),
        }
    }

    /// Delivers the queue and a FIN (and, on `tls:`, `close_notify`). With `wait`, in this
    /// thread, failing when the peer is gone or takes nothing for [`CLOSE_LINGER`];
    /// without, what the peer's full buffers do not take now is left to a thread, so that
    /// dropping never blocks (like the kernel, which delivers a closed TCP socket's buffer
    /// in the background).
    fn finish(&mut self, wait: bool) -> Result<()> {
        let mut fin_sent = 0;
        let mut fin_done = false;
        if self.flush(false)? {
            fin_done = W::write(&mut self.link, Frame::Fin, &[], &mut fin_sent, false)
                .map_err(|e| self.send_error(e))?;
            if fin_done {
                self.link.close_notify();
                if self.link.flush(false).map_err(|e| self.send_error(e))? {
                    stream::discard_input(self.link.sock());
                    return Ok(());
                }
            }
        }
        let queued = self.queued.take();
        let fin = (!fin_done).then_some(fin_sent);
        if wait {
            return match linger::<W>(&mut self.link, queued, fin, None) {
                Ok(true) => Ok(()),
                Ok(false) => Err(Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "{}: close: the peer took nothing for {CLOSE_LINGER:?}",
                        self.peer
                    ),
                )),
                Err(e) => Err(self.send_error(e)),
            };
        }
        // A peer that never reads, or trickles, must not pile up threads: each lives at
        // most CLOSE_LINGER in all, and beyond MAX_CLOSE_THREADS of them what is still
        // queued here is dropped (the kernel still delivers its own socket buffer).
        if CLOSE_THREADS.fetch_add(1, Ordering::Relaxed) >= MAX_CLOSE_THREADS {
            CLOSE_THREADS.fetch_sub(1, Ordering::Relaxed);
            return Ok(());
        }
        let mut link = self
            .link
            .detach()
            .map_err(|e| Error::io("keep the socket for closing", e))?;
        let deadline = Instant::now() + CLOSE_LINGER;
        let spawned = std::thread::Builder::new()
            .name("shmlink-close".into())
            .spawn(move || {
                let _ = linger::<W>(&mut link, queued, fin, Some(deadline));
                CLOSE_THREADS.fetch_sub(1, Ordering::Relaxed);
            });
        if spawned.is_err() {
            CLOSE_THREADS.fetch_sub(1, Ordering::Relaxed);
        }
        spawned
            .map(drop)
            .map_err(|e| Error::io("start the closing thread", e))
    }
}

/// Most threads finishing dropped connections at once, in the whole process.
const MAX_CLOSE_THREADS: usize = 256;

/// Threads finishing dropped connections now.
static CLOSE_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Threads finishing dropped connections now (for tests).
#[cfg(test)]
pub(crate) fn close_threads() -> usize {
    CLOSE_THREADS.load(Ordering::Relaxed)
}

/// Writes what a closed connection has left: the queue, the FIN unless it is written
/// (`fin` holds the bytes of it written so far), and what the link holds. `Ok(false)` when
/// the peer takes nothing for [`CLOSE_LINGER`], or when `deadline` passes.
fn linger<W: Wire>(
    link: &mut W::Link,
    queued: Option<Queued>,
    fin: Option<usize>,
    deadline: Option<Instant>,
) -> io::Result<bool> {
    let room = |link: &W::Link| {
        let idle = Instant::now() + CLOSE_LINGER;
        let until = deadline.map_or(idle, |d| d.min(idle));
        stream::wait(link.sock(), Ready::Write, Some(until))
    };
    if let Some(mut q) = queued {
        while !W::write(link, Frame::Data, &q.payload, &mut q.sent, false)? {
            if !room(link)? {
                return Ok(false);
            }
        }
    }
    if let Some(mut sent) = fin {
        while !W::write(link, Frame::Fin, &[], &mut sent, false)? {
            if !room(link)? {
                return Ok(false);
            }
        }
        link.close_notify();
    }
    while !link.flush(false)? {
        if !room(link)? {
            return Ok(false);
        }
    }
    stream::discard_input(link.sock());
    Ok(true)
}

impl<W: Wire> ConnOps for FramedConn<W> {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }

    fn send(&mut self, msg: &[u8], blocking: bool) -> Result<()> {
        self.before_send(blocking)?;
        let mut sent = 0;
        match write_frame::<W>(&mut self.link, Frame::Data, msg, &mut sent, blocking) {
            // A TLS link may hold records of it that the socket had no room for.
            Ok(true) => self.sync_output(),
            Ok(false) => {
                // Accepted: the rest goes out on later calls.
                let mut frame = std::mem::take(&mut self.staging);
                frame.clear();
                frame.extend_from_slice(msg);
                self.enqueue(frame, sent)
            }
            Err(e) => Err(self.send_failed(e)),
        }
    }

    fn reserve(&mut self, n: usize, blocking: bool) -> Result<()> {
        self.before_send(blocking)?;
        self.staging.clear();
        self.staging.resize(n, 0);
        self.staged_blocking = blocking;
        Ok(())
    }

    fn reserved(&self) -> &[u8] {
        &self.staging
    }

    fn reserved_mut(&mut self) -> &mut [u8] {
        &mut self.staging
    }

    fn commit(&mut self) -> Result<()> {
        self.send_staged()
    }

    fn abort_reserve(&mut self) {
        recycle(&mut self.staging);
    }

    fn truncate_reserved(&mut self, len: usize) {
        self.staging.truncate(len);
    }

    fn recv_next(&mut self, blocking: bool) -> Result<usize> {
        if let Some(n) = self.current {
            return Ok(n);
        }
        if let Some(end) = &self.rx_end {
            return Err(end.error());
        }
        // A failed flush is remembered for the next send; the peer's messages may still
        // be waiting here.
        let _ = self.flush(false);
        loop {
            // With output waiting, a blocking read must also wake for output room, or two
            // peers could wait for each other.
            let backlog = self.backlog();
            let kernel_blocking = blocking && !backlog;
            let res = self.wire.read(&mut self.link, kernel_blocking);
            if self.backlog() != backlog {
                // Reading made the link answer (TLS: an alert or a key update).
                self.sync_output()?;
            }
            match res {
                Ok(Incoming::Message(n)) => {
                    self.current = Some(n);
                    self.sync_flag()?;
                    return Ok(n);
                }
                Ok(Incoming::Fin) => {
                    self.sync_flag()?;
                    return Err(self.end_rx(Error::eos()));
                }
                Ok(Incoming::Eof) => {
                    let e = Error::reset(format!(
                        "receive from {}: the peer closed the connection without FIN \
                         (it crashed or was killed)",
                        self.peer
                    ));
                    return Err(self.end_rx(e));
                }
                Ok(Incoming::Empty) if blocking => {
                    let ready = if self.backlog() {
                        Ready::ReadWrite
                    } else {
                        Ready::Read
                    };
                    stream::wait(self.link.sock(), ready, None).map_err(|e| self.recv_error(e))?;
                    let _ = self.flush(false);
                }
                Ok(Incoming::Empty) => {
                    self.sync_flag()?;
                    return Err(Error::would_block());
                }
                Err(e) => {
                    let e = self.recv_error(e);
                    return Err(self.end_rx(e));
                }
            }
        }
    }

    fn current(&self) -> SharedBytes<'_> {
        SharedBytes::local(if self.current.is_some() {
            self.wire.current()
        } else {
            &[]
        })
    }

    fn release(&mut self) {
        if self.current.take().is_some() {
            self.wire.release();
        }
    }

    fn take_current(&mut self) -> Vec<u8> {
        if self.current.take().is_some() {
            self.wire.take_current()
        } else {
            Vec::new()
        }
    }

    fn writable(&mut self) -> Result<bool> {
        self.check_tx()?;
        self.flush(false)
    }

    fn max_send_size(&self) -> usize {
        self.max_send
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.epoll.fd()
    }

    fn close(&mut self, wait: bool) -> Result<()> {
        if self.tx_end.is_some() || self.rx_end.is_some() {
            // The peer is gone or finished (or broke the protocol): nothing to deliver.
            stream::discard_input(self.link.sock());
            return Ok(());
        }
        self.finish(wait)
    }

    fn local_addr(&self) -> String {
        self.local.clone()
    }

    fn peer_addr(&self) -> String {
        self.peer.clone()
    }
}
