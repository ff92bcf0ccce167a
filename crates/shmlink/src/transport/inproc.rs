//! In-process `shm:` connections: both ends in one process (docs/design.md, "In-process
//! connections").
//!
//! A listener bound with [`Options::in_process`](crate::Options::in_process) enters an
//! [`Inbox`] in a process-wide table keyed by its rendezvous socket; a client in the same
//! process that also asks for it finds the inbox before it touches the socket, builds
//! both ends of the connection itself and leaves the listener's end in the inbox, whose
//! eventfd sits in the listener's epoll set. No memfd, no socket, no handshake packets.
//!
//! Each direction is a [`Pipe`] of `shmlink_ring::pipe`, the lock-free part (message slots,
//! flow control in bytes, the wake-up bits and the no-lost-wake-up argument, with its
//! loom model): at most the smaller of both sides' ring sizes in flight, or two messages
//! of any size. This module is how a side waits: it spins and yields per its wait
//! policy, then announces itself in its own [`Waiters`] and parks its thread (blocking
//! mode) or returns `WouldBlock` with its eventfd armed (non-blocking mode); the other
//! side, after its progress, unparks it or sets its eventfd for the bits it announced.

use std::collections::{HashMap, VecDeque};
use std::mem;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::{self, Thread, ThreadId};

use shmlink_ring::pipe::{End, Pipe, Rx, Tx, Waiters};

use crate::error::{Error, Result};
use crate::notify::spin_then_yield;
use crate::options::{Options, WaitPolicy};
use crate::sys::stream::EventFlag;
use crate::transport::ConnOps;
use crate::view::SharedBytes;

/// Wait bits a side sets in its own [`Side::wait`]: what it waits for and how to wake it.
const DATA_PARK: u8 = Waiters::DATA_PARK;
const ROOM_PARK: u8 = Waiters::ROOM_PARK;
const DATA_FD: u8 = Waiters::DATA_FD;
const ROOM_FD: u8 = Waiters::ROOM_FD;
const DATA: u8 = Waiters::DATA;
const ROOM: u8 = Waiters::ROOM;

/// [`Side::end`]: the side is live, closed gracefully, or dropped without closing.
const LIVE: u8 = End::LIVE;
const CLOSED: u8 = End::CLOSED;
const RESET: u8 = End::RESET;

/// What one end shares with the other: how it waits and whether it is still there.
struct Side {
    /// What this side waits for (`DATA_*`, `ROOM_*`); set by it, cleared by the waker.
    wait: Waiters,
    /// [`LIVE`], [`CLOSED`] or [`RESET`].
    end: End,
    /// The thread to unpark for `*_PARK`.
    thread: Mutex<Option<Thread>>,
    /// This side's fd: readable when a non-blocking call is worth making again.
    flag: EventFlag,
}

impl Side {
    fn new() -> Result<Side> {
        Ok(Side {
            // A new end starts announced for data on its fd, like a new `shm:` consumer:
            // an event loop may watch the fd before its first receive.
            wait: Waiters::new(DATA_FD),
            end: End::new(),
            thread: Mutex::new(None),
            flag: EventFlag::new().map_err(|e| Error::io("eventfd", e))?,
        })
    }

    /// Makes the fd readable. Every time, even if it is readable already: an event loop
    /// that watches it edge-triggered (tokio) wakes only for a new write.
    fn signal(&self) {
        let _ = self.flag.set();
    }

    /// Wakes this side for the `bits` it waits on, if it does (the caller published its
    /// progress with `Tx::publish` or `Rx::consume` before).
    #[inline(always)]
    fn wake(&self, bits: u8) {
        let hit = self.wait.take(bits);
        if hit != 0 {
            self.wake_slow(hit);
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_slow(&self, hit: u8) {
        if hit & (DATA_PARK | ROOM_PARK) != 0 {
            self.unpark();
        }
        if hit & (DATA_FD | ROOM_FD) != 0 {
            self.signal();
        }
    }

    fn unpark(&self) {
        let t = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = t.as_ref() {
            t.unpark();
        }
    }
}

/// Both ends' shared state. Index 0 is the client, 1 the server; pipe `i` carries what
/// side `i` sends.
struct Shared {
    pipes: [Pipe; 2],
    sides: [Side; 2],
}

/// The message `recv_next` made current: its length, or none.
type Current = Option<usize>;

/// One end of an in-process connection.
pub(crate) struct InprocConn {
    shared: Arc<Shared>,
    me: usize,
    /// Our producer position and what we last read of the consumer's.
    tx: Tx,
    /// Our consumer position and what we last read of the producer's.
    rx: Rx,
    current: Current,
    /// Bytes reserved in the slot at `tail`.
    reserved: Option<usize>,
    /// The last non-blocking send returned `WouldBlock` waiting for room for
    /// `room_need` bytes; the last non-blocking receive returned `WouldBlock` (a new end
    /// starts so). What a call of the other direction keeps the fd readable for.
    tx_waiting: bool,
    room_need: usize,
    rx_waiting: bool,
    /// The thread last registered in our `Side::thread`.
    parked_as: Option<ThreadId>,
    wait: WaitPolicy,
    max_send: usize,
    closed: bool,
    addr: String,
}

impl InprocConn {
    #[inline(always)]
    fn tx_pipe(&self) -> &Pipe {
        &self.shared.pipes[self.me]
    }

    #[inline(always)]
    fn rx_pipe(&self) -> &Pipe {
        &self.shared.pipes[1 - self.me]
    }

    #[inline(always)]
    fn own(&self) -> &Side {
        &self.shared.sides[self.me]
    }

    #[inline(always)]
    fn peer(&self) -> &Side {
        &self.shared.sides[1 - self.me]
    }

    fn peer_gone(&self) -> Error {
        Error::reset(format!(
            "{}: peer has closed or lost the connection",
            self.addr
        ))
    }

    /// Whether a message of `len` bytes fits, reading the consumer's position again if
    /// needed.
    #[inline]
    fn has_room(&mut self, len: usize) -> bool {
        self.tx.has_room(&self.shared.pipes[self.me], len)
    }

    /// Whether a message waits, reading the producer's position again if needed.
    #[inline]
    fn has_data(&mut self) -> bool {
        self.rx.has_data(&self.shared.pipes[1 - self.me])
    }

    /// Registers the calling thread as the one to unpark (only when it changed).
    fn register_thread(&mut self) {
        let id = thread::current().id();
        if self.parked_as != Some(id) {
            *self.own().thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread::current());
            self.parked_as = Some(id);
        }
    }

    /// Announces `bit` in our wait bits; `ready` then re-checks the condition.
    fn announce(&self, bit: u8) {
        self.own().wait.announce(bit);
    }

    fn retract(&self, bit: u8) {
        self.own().wait.retract(bit);
    }

    /// A non-blocking call's wait for `bit` (`DATA_FD` or `ROOM_FD`): clears the fd of
    /// cues already dealt with (so that a level-triggered event loop does not see it
    /// readable for nothing), announces `bit`, and looks again (`true`: ready after
    /// all). A cleared cue may have been the other direction's: if its caller waits and
    /// may progress, or the peer is gone (its fd stays readable from then on), the fd is
    /// set again.
    fn nonblocking_wait(&mut self, bit: u8) -> bool {
        // One `read`, only on the way to `WouldBlock`: cues written before it are for
        // states the checks below see.
        let _ = self.own().flag.clear();
        self.announce(bit);
        let ready = if bit == DATA_FD {
            self.has_data()
        } else {
            self.has_room(self.room_need)
        };
        if ready {
            self.retract(bit);
        }
        let other_ready = if bit == DATA_FD {
            self.tx_waiting && self.has_room(self.room_need)
        } else {
            self.rx_waiting && self.has_data()
        };
        // A gone peer keeps our fd readable (`End::load`).
        if other_ready || self.peer().end.load() != LIVE {
            self.own().signal();
        }
        ready
    }

    /// Parks until `ready` or the peer is gone (`bit` announced, re-checked after).
    fn park(&mut self, bit: u8, mut ready: impl FnMut(&mut Self) -> bool) {
        self.register_thread();
        loop {
            self.announce(bit);
            // After our `announce`: `finish` sets the end, then clears every bit and
            // unparks (`End::load`).
            if ready(self) || self.peer().end.load() != LIVE {
                self.retract(bit);
                return;
            }
            thread::park();
            // Unparked by the waker (which cleared the bit) or spuriously: look again.
        }
    }

    /// Room for a message of `len` bytes: `Ok(false)` when non-blocking and full.
    #[inline(always)]
    fn room(&mut self, len: usize, blocking: bool) -> Result<bool> {
        if self.has_room(len) {
            self.tx_waiting = false;
            return Ok(true);
        }
        self.wait_room(len, blocking)
    }

    #[cold]
    #[inline(never)]
    fn wait_room(&mut self, len: usize, blocking: bool) -> Result<bool> {
        if self.peer().end.load_acquire() != LIVE {
            return Err(self.peer_gone());
        }
        if !blocking {
            self.room_need = len;
            if self.nonblocking_wait(ROOM_FD) {
                self.tx_waiting = false;
                return Ok(true);
            }
            self.tx_waiting = true;
            return Ok(false);
        }
        let policy = self.wait;
        if !spin_then_yield(&policy, || Ok(self.has_room(len)))? {
            self.park(ROOM_PARK, |c| c.has_room(len));
        }
        if self.has_room(len) {
            self.tx_waiting = false;
            return Ok(true);
        }
        Err(self.peer_gone())
    }

    /// Publishes the message in the slot at `tail` (`len` bytes) and wakes the peer if it
    /// waits for data.
    #[inline(always)]
    fn publish(&mut self, len: usize) {
        self.tx.publish(&self.shared.pipes[self.me], len);
        self.peer().wake(DATA);
    }

    /// The slot at `tail`, for a message of `len` bytes (`Tx::slot`).
    #[inline(always)]
    fn tx_slot(&mut self, len: usize) -> &mut Vec<u8> {
        // SAFETY: `room` said the slot at `tail` is free: ours until `publish`, and
        // `&mut self` makes this the only reference to it.
        unsafe { self.tx.slot(&self.shared.pipes[self.me], len) }
    }

    /// Consumes the message at `head` and wakes the peer if it waits for room.
    #[inline(always)]
    fn consume(&mut self, len: usize) {
        self.rx.consume(&self.shared.pipes[1 - self.me], len);
        self.peer().wake(ROOM);
    }

    /// The length of the message at `head` (which `has_data` said is published).
    #[inline(always)]
    fn head_len(&self) -> usize {
        // SAFETY: published and not consumed: ours to read.
        unsafe { self.rx.current(self.rx_pipe()).len() }
    }

    #[cold]
    #[inline(never)]
    fn wait_data(&mut self, blocking: bool) -> Result<usize> {
        loop {
            // The end first: seeing it guarantees seeing every message before it.
            let end = self.peer().end.load();
            if self.has_data() {
                self.rx_waiting = false;
                return Ok(self.head_len());
            }
            match end {
                LIVE => {}
                CLOSED => return Err(Error::eos()),
                _ => return Err(self.peer_gone()),
            }
            if !blocking {
                if self.nonblocking_wait(DATA_FD) || self.peer().end.load() != LIVE {
                    continue;
                }
                self.rx_waiting = true;
                return Err(Error::would_block());
            }
            let policy = self.wait;
            if !spin_then_yield(&policy, || Ok(self.has_data()))? {
                self.park(DATA_PARK, |c| c.has_data());
            }
        }
    }

    /// Marks our end and wakes the peer whatever it waits for (its fd stays readable).
    fn finish(&mut self, how: u8) {
        // After our last `publish`: the peer sees every message before the end.
        self.own().end.set(how);
        let peer = self.peer();
        peer.wait.take_all();
        peer.unpark();
        peer.signal();
    }
}

impl ConnOps for InprocConn {
    #[inline]
    fn send(&mut self, msg: &[u8], blocking: bool) -> Result<()> {
        if !self.room(msg.len(), blocking)? {
            return Err(Error::would_block());
        }
        let v = self.tx_slot(msg.len());
        v.clear();
        v.extend_from_slice(msg);
        self.publish(msg.len());
        Ok(())
    }

    #[inline]
    fn reserve(&mut self, n: usize, blocking: bool) -> Result<()> {
        if !self.room(n, blocking)? {
            return Err(Error::would_block());
        }
        let v = self.tx_slot(n);
        // Old bytes may stay: they are the caller's to overwrite.
        if v.len() >= n {
            v.truncate(n);
        } else {
            v.resize(n, 0);
        }
        self.reserved = Some(n);
        Ok(())
    }

    #[inline]
    fn reserved(&self) -> &[u8] {
        match self.reserved {
            // SAFETY: `reserve` made the slot at `tail` ours and `n` bytes long.
            Some(n) => unsafe { &self.tx.reserved(self.tx_pipe())[..n] },
            None => &[],
        }
    }

    #[inline]
    fn reserved_mut(&mut self) -> &mut [u8] {
        match self.reserved {
            // SAFETY: as in `reserved`; `&mut self` makes this the only reference.
            Some(n) => unsafe { &mut self.tx.reserved(&self.shared.pipes[self.me])[..n] },
            None => &mut [],
        }
    }

    #[inline]
    fn commit(&mut self) -> Result<()> {
        if let Some(n) = self.reserved.take() {
            self.publish(n);
        }
        Ok(())
    }

    #[inline]
    fn abort_reserve(&mut self) {
        self.reserved = None;
    }

    fn truncate_reserved(&mut self, len: usize) {
        if let Some(n) = self.reserved {
            let len = len.min(n);
            // SAFETY: as in `reserved_mut`: the slot at `tail` is ours until `publish`.
            unsafe { self.tx.reserved(&self.shared.pipes[self.me]) }.truncate(len);
            self.reserved = Some(len);
        }
    }

    #[inline]
    fn recv_next(&mut self, blocking: bool) -> Result<usize> {
        if let Some(n) = self.current {
            return Ok(n);
        }
        let n = if self.has_data() {
            self.rx_waiting = false;
            self.head_len()
        } else {
            self.wait_data(blocking)?
        };
        self.current = Some(n);
        Ok(n)
    }

    #[inline]
    fn current(&self) -> SharedBytes<'_> {
        match self.current {
            // SAFETY: the current message is published and not consumed: ours to read
            // until `release`, which takes `&mut self`.
            Some(_) => SharedBytes::local(unsafe { self.rx.current(self.rx_pipe()) }),
            None => SharedBytes::local(&[]),
        }
    }

    #[inline]
    fn release(&mut self) {
        if let Some(n) = self.current.take() {
            self.consume(n);
        }
    }

    fn take_current(&mut self) -> Vec<u8> {
        match self.current.take() {
            Some(n) => {
                // SAFETY: as in `current`; the slot gets an empty buffer back.
                let v = mem::take(unsafe { self.rx.current(self.rx_pipe()) });
                self.consume(n);
                v
            }
            None => Vec::new(),
        }
    }

    fn max_send_size(&self) -> usize {
        self.max_send
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.own().flag.fd()
    }

    fn close(&mut self, _wait: bool) -> Result<()> {
        // Nothing is ever queued outside the pipe: every accepted message is in it.
        if !self.closed {
            self.closed = true;
            self.finish(CLOSED);
        }
        Ok(())
    }

    fn local_addr(&self) -> String {
        self.addr.clone()
    }

    fn peer_addr(&self) -> String {
        self.addr.clone()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

impl Drop for InprocConn {
    fn drop(&mut self) {
        // Dropped without `close` (the public `Connection` always closes): a reset.
        if !self.closed {
            self.closed = true;
            self.finish(RESET);
        }
    }
}

/// Builds both ends: `(client, server)`.
fn pair(addr: &str, client: &Options, server: &Options) -> Result<(InprocConn, InprocConn)> {
    let shared = Arc::new(Shared {
        pipes: [
            Pipe::new(client.ring_size.min(server.ring_size)),
            Pipe::new(client.ring_size.min(server.ring_size)),
        ],
        sides: [Side::new()?, Side::new()?],
    });
    let max_send = client.max_msg_size.min(server.max_msg_size);
    let end = |me, wait| InprocConn {
        shared: shared.clone(),
        me,
        tx: Tx::default(),
        rx: Rx::default(),
        current: None,
        reserved: None,
        tx_waiting: false,
        room_need: 0,
        rx_waiting: true,
        parked_as: None,
        wait,
        max_send,
        closed: false,
        addr: addr.to_string(),
    };
    Ok((end(0, client.wait), end(1, server.wait)))
}

/// Most connections an inbox holds before they are accepted; beyond, the oldest is
/// dropped (its client sees a reset), like the `shm:` listener's pending handshakes.
const MAX_WAITING: usize = 128;

/// A listener's door for clients in its own process.
pub(crate) struct Inbox {
    /// The connections waiting, and whether `flag` may be set (known under the lock, so a
    /// listener's step with nobody waiting costs no `read` of the flag).
    waiting: Mutex<(VecDeque<InprocConn>, bool)>,
    /// Readable while `waiting` is not empty; in the listener's epoll set.
    flag: EventFlag,
    opts: Options,
    addr: String,
    /// The rendezvous socket file's (device, inode), if it is a file: a client checks
    /// that the path still leads to this listener.
    file: Option<(u64, u64)>,
    /// The process that entered it: a `fork` child inherits a copy of the table, whose
    /// entries lead to a listener that only the parent accepts from.
    pid: u32,
}

impl Inbox {
    /// The descriptor the listener watches.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.flag.fd()
    }

    fn lock(&self) -> MutexGuard<'_, (VecDeque<InprocConn>, bool)> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next connection a client made, if any.
    pub(crate) fn take(&self) -> Option<Box<dyn ConnOps>> {
        let mut guard = self.lock();
        let (q, flagged) = &mut *guard;
        let conn = q.pop_front();
        if q.is_empty() && std::mem::take(flagged) {
            let _ = self.flag.clear();
        }
        conn.map(|c| Box::new(c) as Box<dyn ConnOps>)
    }

    /// A client's connection to this listener: the client's end; the listener's waits.
    fn connect(&self, opts: &Options) -> Result<Box<dyn ConnOps>> {
        let (client, server) = pair(&self.addr, opts, &self.opts)?;
        let (evicted, woken) = {
            let mut guard = self.lock();
            let (q, flagged) = &mut *guard;
            let evicted = if q.len() >= MAX_WAITING {
                q.pop_front()
            } else {
                None
            };
            q.push_back(server);
            // Set under the lock, so `take` knows whether there is something to clear.
            let woken = match *flagged {
                true => Ok(()),
                false => self.flag.set().inspect(|()| *flagged = true),
            };
            (evicted, woken)
        };
        drop(evicted);
        woken.map_err(|e| Error::io("wake the listener", e))?;
        Ok(Box::new(client))
    }
}

/// The listeners of this process that take in-process clients, by rendezvous socket.
fn table() -> MutexGuard<'static, HashMap<String, Weak<Inbox>>> {
    static TABLE: OnceLock<Mutex<HashMap<String, Weak<Inbox>>>> = OnceLock::new();
    TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Enters a listener bound at `key` (its rendezvous socket, as text) with socket file
/// identity `file`; it stays entered while the returned inbox lives.
pub(crate) fn register(
    key: String,
    addr: &str,
    opts: &Options,
    file: Option<(u64, u64)>,
) -> Result<Arc<Inbox>> {
    let inbox = Arc::new(Inbox {
        waiting: Mutex::new((VecDeque::new(), false)),
        flag: EventFlag::new().map_err(|e| Error::io("eventfd", e))?,
        opts: opts.clone(),
        addr: addr.to_string(),
        file,
        pid: std::process::id(),
    });
    let mut t = table();
    t.retain(|_, w| w.strong_count() > 0);
    t.insert(key, Arc::downgrade(&inbox));
    Ok(inbox)
}

/// Leaves the table (a listener's drop), if `inbox` is still the one entered at `key`.
pub(crate) fn unregister(key: &str, inbox: &Arc<Inbox>) {
    let mut t = table();
    if t.get(key).is_some_and(|w| w.as_ptr() == Arc::as_ptr(inbox)) {
        t.remove(key);
    }
    // Clients that connected and were never accepted see a reset.
    let waiting = mem::take(&mut *inbox.lock());
    drop(waiting);
}

/// Connects in-process to the listener entered at `key`, if there is one in this
/// process; `file` is what the socket path leads to now (device, inode), if a file.
pub(crate) fn connect(
    key: &str,
    file: impl FnOnce() -> Option<(u64, u64)>,
    opts: &Options,
) -> Option<Result<Box<dyn ConnOps>>> {
    let inbox = table().get(key).and_then(Weak::upgrade)?;
    // Asked only when this process has a listener there (a `stat` of the path).
    if inbox.file != file() {
        // The path now leads elsewhere (the socket file was replaced).
        return None;
    }
    if inbox.pid != std::process::id() {
        // A copy of the parent's table in a `fork` child: the listener accepts in the
        // parent, through the socket.
        return None;
    }
    Some(inbox.connect(opts))
}
