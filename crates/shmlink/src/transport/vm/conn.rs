//! A `vm:` connection: two SPSC rings of `shmlink-ring` in a slot of the shared region.

use std::any::Any;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use shmlink_ring::spsc::{
    Consumer, ConsumerCtl, FenceMode, Fragment, Producer, ProducerCtl, Reassembler, RingRef,
    CLOSED_OFFSET, HEADER, HEAD_OFFSET, TAIL_OFFSET,
};

use super::bell::{self, Bell, Wait, CAN_BE_RUNG, CAN_RING};
use super::region::{self, Liveness, Region, Tick};
use super::slot::{self, State};
use crate::error::{Error, ErrorKind, Result};
use crate::sys::stream::EventFlag;
use crate::transport::{ConnOps, CLOSE_LINGER};
use crate::view::SharedBytes;

/// What the ticker needs of a connection: its heartbeat, the peer's, and the readiness
/// that drives the descriptor.
pub(super) struct ConnShared {
    region: Arc<Region>,
    slot: usize,
    client: bool,
    established: AtomicBool,
    peer: Liveness,
    flag: EventFlag,
    armed: AtomicBool,
    /// The inbound tail and outbound head when the descriptor was armed.
    snap: Mutex<(u64, u64)>,
    /// This process's doorbell on the region, if it has one.
    bell: Option<Arc<Bell>>,
}

impl ConnShared {
    pub(super) fn new(region: Arc<Region>, slot: usize, client: bool) -> Result<Arc<ConnShared>> {
        let flag = EventFlag::new().map_err(|e| Error::io("vm: eventfd", e))?;
        let bell = bell::for_region(region.path(), region.policy());
        let s = Arc::new(ConnShared {
            region,
            slot,
            client,
            established: AtomicBool::new(false),
            peer: Liveness::new(0),
            flag,
            armed: AtomicBool::new(false),
            snap: Mutex::new((0, 0)),
            bell,
        });
        // Our bell word, before the handshake publishes the slot (the client's REQUEST
        // and the listener's ACCEPTED are Release); the client clears the listener's,
        // which the listener writes before it accepts.
        // SYNC POINT (handshake): Relaxed; published to the peer by the handshake's Release
        // store (or AcqRel exchange) of the slot state in vm/mod.rs, which the peer loads with
        // Acquire before it reads our bell word.
        s.my_bell().store(s.bell_word(), Ordering::Relaxed);
        if client {
            // SYNC POINT (handshake): Relaxed, published with our REQUEST as the store above.
            s.peer_bell().store(0, Ordering::Relaxed);
        }
        let t: Arc<dyn Tick> = s.clone();
        region::register(&t);
        Ok(s)
    }

    /// The descriptor's flag.
    pub(super) fn flag(&self) -> &EventFlag {
        &self.flag
    }

    /// The slot.
    pub(super) fn slot(&self) -> usize {
        self.slot
    }

    fn base(&self) -> usize {
        Region::slot(self.slot)
    }

    fn my_hb(&self) -> &AtomicU64 {
        let off = if self.client {
            slot::CLIENT_HB
        } else {
            slot::SERVER_HB
        };
        self.region.u64_at(self.base() + off)
    }

    fn my_bell(&self) -> &AtomicU32 {
        let off = if self.client {
            slot::CLIENT_BELL
        } else {
            slot::SERVER_BELL
        };
        self.region.u32_at(self.base() + off)
    }

    fn peer_bell(&self) -> &AtomicU32 {
        let off = if self.client {
            slot::SERVER_BELL
        } else {
            slot::CLIENT_BELL
        };
        self.region.u32_at(self.base() + off)
    }

    fn bell_word(&self) -> u32 {
        self.bell.as_ref().map_or(0, |b| b.word())
    }

    /// Rings the peer, if it can be rung and we can ring (after `commit`, `advance` or
    /// `close` found it announced sleep). The word comes from the region: a bad one
    /// rings some id in vain.
    pub(super) fn ring_peer(&self) {
        let Some(b) = &self.bell else { return };
        // SYNC POINT (bell word): Relaxed: the word only names whom to ring, after the ring's
        // fence (`take_waiter`) decided to; a stale or forged one rings some id in vain, and the
        // sleeper's wait is bounded (`RUNG_SLEEP`), so nothing is ordered by it.
        let w = self.peer_bell().load(Ordering::Relaxed);
        if w & CAN_BE_RUNG != 0 {
            b.ring(w as u16);
        }
    }

    /// Whether a sleep of ours ends by a ring: we can be rung and the peer rings.
    fn rung(&self) -> bool {
        self.bell.as_ref().is_some_and(|b| b.can_be_rung())
            // SYNC POINT (bell word): Relaxed, a hint as in `ring_peer`: a stale value changes
            // only how long a sleep lasts (`RUNG_SLEEP` or the backed-off pause).
            && self.peer_bell().load(Ordering::Relaxed) & CAN_RING != 0
    }

    fn peer_hb(&self) -> &AtomicU64 {
        let off = if self.client {
            slot::SERVER_HB
        } else {
            slot::CLIENT_HB
        };
        self.region.u64_at(self.base() + off)
    }

    /// Offsets of (inbound producer block, outbound consumer block).
    fn watch(&self) -> (usize, usize) {
        let b = self.base();
        if self.client {
            (b + slot::S2C_PROD, b + slot::C2S_CONS)
        } else {
            (b + slot::C2S_PROD, b + slot::S2C_CONS)
        }
    }

    fn snapshot(&self) -> (u64, u64) {
        let (inp, outc) = self.watch();
        (
            self.region
                // SYNC POINT (data): Acquire pairs with the peer producer's Release store of `tail`
                // (`Producer::publish`); here only compared with the armed snapshot.
                .u64_at(inp + TAIL_OFFSET)
                .load(Ordering::Acquire),
            self.region
                // SYNC POINT (data): Acquire pairs with the peer consumer's Release store of `head`
                // (`Consumer::advance`), compared likewise.
                .u64_at(outc + HEAD_OFFSET)
                .load(Ordering::Acquire),
        )
    }

    fn state(&self) -> u32 {
        self.region
            // SYNC POINT (slot state): Acquire pairs with the peer's Release/AcqRel stores of the
            // state (the handshake in vm/mod.rs, `depart`): a peer seen gone (ONE_GONE) had closed
            // its ring before, and its close mark is visible.
            .u32_at(self.base() + slot::STATE)
            .load(Ordering::Acquire)
    }

    pub(super) fn establish(&self) {
        // SYNC POINT (heartbeat): Acquire pairs with the peer's Release `fetch_add` in `tick`.
        self.peer.restart(self.peer_hb().load(Ordering::Acquire));
        // SYNC POINT (established): Release pairs with the Acquire loads in `tick` and `poke`:
        // the ticker sees the restarted liveness before it observes the peer.
        self.established.store(true, Ordering::Release);
    }

    /// Clears the descriptor and asks the ticker to set it when anything changes.
    fn arm(&self) {
        let _ = self.flag.clear();
        *self.snap.lock().unwrap_or_else(|p| p.into_inner()) = self.snapshot();
        // SYNC POINT (armed): Release pairs with the Acquire load in `check`: the ticker that
        // sees `armed` sees the cleared flag and the snapshot (also under the mutex).
        self.armed.store(true, Ordering::Release);
    }
}

impl Tick for ConnShared {
    fn tick(&self, now: Instant) {
        // SYNC POINT (heartbeat): Release pairs with the peer's Acquire loads of our heartbeat
        // (`establish`, `tick`).
        self.my_hb().fetch_add(1, Ordering::Release);
        // SYNC POINT (established): Acquire pairs with the Release in `establish`.
        if !self.established.load(Ordering::Acquire) {
            return;
        }
        self.peer
            // SYNC POINT (heartbeat): Acquire pairs with the peer's Release `fetch_add` in `tick`.
            .observe(self.peer_hb().load(Ordering::Acquire), now);
        // A bell that died (its server went) leaves our word stale: the peer would ring
        // an id nobody answers to. Rewrite it (0 then: we poll again).
        let w = self.bell_word();
        // SYNC POINT (bell word): Relaxed: only we write our word, and the peer reads it as a
        // hint (`ring_peer`).
        if self.my_bell().load(Ordering::Relaxed) != w {
            self.my_bell().store(w, Ordering::Relaxed);
        }
        self.check();
    }

    fn poke(&self) {
        // SYNC POINT (established): Acquire pairs with the Release in `establish`.
        if self.established.load(Ordering::Acquire) {
            self.check();
        }
    }
}

impl ConnShared {
    /// Sets the descriptor if it is armed and what it waits on changed.
    fn check(&self) {
        // SYNC POINT (armed): Acquire pairs with the Release stores in `arm` and `VmConn::new`.
        if !self.armed.load(Ordering::Acquire) {
            return;
        }
        let snap = *self.snap.lock().unwrap_or_else(|p| p.into_inner());
        let (inp, _) = self.watch();
        let closed = self
            .region
            // SYNC POINT (close): Acquire pairs with the Release in the peer's `Producer::close`.
            .u32_at(inp + CLOSED_OFFSET)
            .load(Ordering::Acquire)
            != 0;
        if self.snapshot() != snap
            || closed
            || self.peer.dead()
            || self.state() != State::Accepted as u32
        {
            // SYNC POINT (armed): Release, as in `arm`; disarming orders nothing the flag carries
            // (setting the flag twice, from two racing checks, is harmless: it is level-triggered).
            self.armed.store(false, Ordering::Release);
            let _ = self.flag.set();
        }
    }
}

/// The message made current by `recv_next`.
enum Current {
    None,
    /// A whole message in one record, read in place.
    InPlace {
        ptr: NonNull<u8>,
        len: usize,
        size: usize,
    },
    /// A message reassembled from fragments.
    Owned(Vec<u8>),
}

/// A message being sent in fragments.
struct Pending {
    msg: Vec<u8>,
    off: usize,
}

/// Room reserved for a message sent through `reserve`/`commit`.
///
/// The caller never gets a slice over the ring: any guest on the region can write the
/// ring's bytes, so a `&mut [u8]` over them would be undefined behaviour in safe code (and
/// what the caller wrote could change before it is sent). It writes a private buffer,
/// which `commit` copies into the room reserved in the ring — one copy, as `send` makes.
enum Reserved {
    None,
    /// Room in the ring for the payload of the next record (a message that fits one
    /// record), and the private buffer the caller writes.
    Ring {
        ptr: NonNull<u8>,
        buf: Vec<u8>,
    },
    /// A larger message, staged here and split into fragments at commit (blocking as
    /// the reservation was).
    Staged(Vec<u8>, bool),
}

/// One end of a `vm:` connection.
pub(crate) struct VmConn {
    shared: Arc<ConnShared>,
    tx: Producer,
    rx: Consumer,
    max_send: usize,
    max_recv: usize,
    current: Current,
    /// A split message as it arrives (the wire format and its checks are the ring's).
    reasm: Reassembler,
    pending: Option<Pending>,
    reserved: Reserved,
    /// The buffer of the last reservation, kept for the next one (no allocation per
    /// message).
    scratch: Vec<u8>,
    broken: Option<Error>,
    closed: bool,
    departed: bool,
    /// We waited for data since the last record we sent (`Producer::sent`).
    rx_waited: bool,
    local: String,
    peer: String,
}

// SAFETY: the raw pointers (ring and current record) point into the region, which the
// connection keeps mapped through its `Arc<Region>`; nothing is tied to a thread.
unsafe impl Send for VmConn {}

impl VmConn {
    /// The connection over slot `shared.slot`, whose handshake has completed.
    pub(super) fn new(
        shared: Arc<ConnShared>,
        max_send: usize,
        max_recv: usize,
        local: String,
        peer: String,
    ) -> VmConn {
        let region = &shared.region;
        let b = shared.base();
        let cap = region.ring();
        let ring = |prod: usize, cons: usize, data: usize| {
            // SAFETY: the control blocks are at 128-aligned offsets of the header area
            // (the slot layout), the data area is `2 * cap` doubly-mapped bytes; all of it
            // is writable and lives as long as the region, which `shared` keeps.
            unsafe {
                RingRef::new(
                    region.ptr(b + prod).cast::<ProducerCtl>(),
                    region.ptr(b + cons).cast::<ConsumerCtl>(),
                    region.data(data),
                    cap,
                )
            }
        };
        let c2s = ring(slot::C2S_PROD, slot::C2S_CONS, 2 * shared.slot);
        let s2c = ring(slot::S2C_PROD, slot::S2C_CONS, 2 * shared.slot + 1);
        let (out, inb) = if shared.client {
            (c2s, s2c)
        } else {
            (s2c, c2s)
        };
        shared.establish();
        // Armed from the start against the fresh ring's positions: the descriptor turns
        // readable when the first message arrives, before any call would have blocked
        // (an event loop registers a new connection and waits for it).
        *shared.snap.lock().unwrap_or_else(|p| p.into_inner()) = (0, 0);
        // SYNC POINT (armed): Release pairs with the Acquire load in `check`: the ticker sees
        // the snapshot stored above.
        shared.armed.store(true, Ordering::Release);
        let mut rx = Consumer::new(inb, FenceMode::Symmetric);
        // Announced from the start too, so that a peer with a doorbell rings for the first
        // message (the descriptor is armed for it above). Only the re-check can fail (a
        // hostile ring): the first receive reports that.
        let _ = rx.arm();
        VmConn {
            tx: Producer::new(out, FenceMode::Symmetric),
            rx,
            shared,
            max_send,
            max_recv,
            current: Current::None,
            reasm: Reassembler::new(),
            pending: None,
            reserved: Reserved::None,
            scratch: Vec::new(),
            broken: None,
            closed: false,
            departed: false,
            rx_waited: false,
            local,
            peer,
        }
    }

    fn violation(&mut self, what: String) -> Error {
        let e = Error::violation(format!("vm: {what}"));
        self.broken = Some(Error::violation(format!("vm: {what}")));
        e
    }

    fn check_broken(&self) -> Result<()> {
        if self.closed {
            return Err(Error::new(ErrorKind::Closed, "connection closed"));
        }
        match &self.broken {
            Some(e) => Err(Error::new(e.kind(), e.message().to_string())),
            None => Ok(()),
        }
    }

    /// The peer's side of the slot: alive and not departed, else why not.
    fn peer_check(&mut self) -> Result<()> {
        let state = self.shared.state();
        self.peer_check_state(state)
    }

    /// [`peer_check`](Self::peer_check) for a state already loaded.
    fn peer_check_state(&mut self, state: u32) -> Result<()> {
        if state == State::Accepted as u32 {
            if self.shared.peer.dead() {
                return Err(Error::reset(format!(
                    "{}: the peer's heartbeat stopped for {:?} (peer dead)",
                    self.peer,
                    region::dead_after()
                )));
            }
            return Ok(());
        }
        if state == State::OneGone as u32 {
            return Err(Error::reset(format!("{}: the peer has left", self.peer)));
        }
        Err(self.violation(format!(
            "slot {} state changed to {state} under a live connection",
            self.shared.slot
        )))
    }

    /// One step of a blocked send's wait for `need` payload bytes of room: a spin, or
    /// arm the descriptor, announce sleep in the ring, re-check, and sleep.
    fn wait_send(&mut self, wait: &mut Wait, need: usize) -> Result<()> {
        if wait.spin() {
            return Ok(());
        }
        self.shared.arm();
        let ready = match self.tx.arm(rec(need)) {
            Ok(r) => r,
            Err(e) => return Err(self.ring_err(e)),
        };
        wait.sleep(&self.shared.flag, ready, self.shared.rung());
        Ok(())
    }

    /// One step of a blocked receive's wait (as [`wait_send`](Self::wait_send)).
    fn wait_recv(&mut self, wait: &mut Wait) -> Result<()> {
        self.rx_waited = true;
        if wait.spin() {
            return Ok(());
        }
        self.shared.arm();
        let ready = match self.rx.arm() {
            Ok(r) => r,
            Err(e) => return Err(self.ring_err(e)),
        };
        wait.sleep(&self.shared.flag, ready, self.shared.rung());
        Ok(())
    }

    fn ring_err(&mut self, e: shmlink_ring::Violation) -> Error {
        self.violation(e.to_string())
    }

    /// Takes records until a message is complete (made current) or the ring is empty.
    fn try_recv(&mut self) -> Result<Option<usize>> {
        loop {
            let rec = match self.rx.peek() {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(None),
                Err(e) => return Err(self.ring_err(e)),
            };
            if rec.is_skip() {
                // Padding before a large record that restarted at the ring's start.
                if self.rx.advance(rec.size()) {
                    self.shared.ring_peer();
                }
                continue;
            }
            if !self.reasm.in_progress() && rec.flags == 0 {
                if rec.len > self.max_recv {
                    return Err(self.violation(format!(
                        "message of {} bytes, larger than the {} agreed",
                        rec.len, self.max_recv
                    )));
                }
                self.current = Current::InPlace {
                    ptr: rec.ptr,
                    len: rec.len,
                    size: rec.size(),
                };
                return Ok(Some(rec.len));
            }
            // A fragment: checked and copied out (with `copy_shared`: any guest may be
            // writing the bytes) by the ring's reassembly.
            // SAFETY: `peek` returned `rec` and it is not consumed; the region stays
            // mapped (kept by `shared`).
            let done = match unsafe { self.reasm.take(&rec, self.max_recv) } {
                Ok(done) => done,
                Err(e) => return Err(self.ring_err(e)),
            };
            if self.rx.advance(rec.size()) {
                self.shared.ring_peer();
            }
            if let Some(total) = done {
                self.current = Current::Owned(self.reasm.take_message());
                return Ok(Some(total));
            }
        }
    }

    /// Room for a payload of `len` bytes, or `None` (full).
    fn try_room(&mut self, len: usize) -> Result<Option<NonNull<u8>>> {
        match self.tx.try_reserve(len) {
            Ok(r) => Ok(r),
            Err(e) => Err(self.ring_err(e)),
        }
    }

    /// Largest payload of one record.
    fn max_payload(&self) -> usize {
        self.tx.ring().max_record() - HEADER
    }

    /// Pushes fragments of the pending message; true when it is all in the ring.
    fn flush(&mut self, blocking: bool) -> Result<bool> {
        let maxp = self.max_payload();
        let mut wait = Wait::new();
        while let Some(p) = &self.pending {
            let total = p.msg.len();
            let off = p.off;
            let frag = Fragment::next(off == 0, total - off, maxp);
            let payload = frag.len();
            let Some(dst) = self.try_room(payload)? else {
                self.peer_check()?;
                if !blocking {
                    self.shared.arm();
                    // Announced: a peer with a doorbell rings when it makes room.
                    let _ = self.tx.arm(rec(payload));
                    if self.tx.has_room(rec(payload)).unwrap_or(true) {
                        continue;
                    }
                    return Ok(false);
                }
                self.wait_send(&mut wait, payload)?;
                continue;
            };
            wait = Wait::new();
            let p = self.pending.as_mut().expect("checked above");
            // SAFETY: `dst` has room for `payload` = `frag.len()` bytes (try_reserve),
            // inside the region's mapping (kept by `shared`); any guest may write them, so
            // the copy is `copy_shared`'s. The source range is inside `p.msg`.
            unsafe { frag.write_shared(dst, total, &p.msg[off..off + frag.chunk]) };
            p.off += frag.chunk;
            if p.off >= total {
                self.pending = None;
            }
            self.commit_tx(payload, frag.flags);
        }
        Ok(true)
    }

    /// Publishes the record written last and rings the peer if it sleeps.
    fn commit_tx(&mut self, len: usize, flags: u32) {
        if self.tx.commit(len, flags) {
            self.shared.ring_peer();
        }
        self.tx
            .sent(self.rx.position(), std::mem::take(&mut self.rx_waited));
    }

    /// Leaves the slot: the last of the two to leave (or the survivor of a dead peer)
    /// frees it.
    fn depart(&mut self) {
        if self.departed {
            return;
        }
        self.departed = true;
        let st = self.shared.region.u32_at(self.shared.base() + slot::STATE);
        let dead = self.shared.peer.dead();
        // SYNC POINT (slot state): Acquire pairs with the peer's AcqRel exchanges below
        // (and the handshake's): we see whether it left first.
        let cur = st.load(Ordering::Acquire);
        if cur == State::Accepted as u32
            && !dead
            && st
                .compare_exchange(
                    cur,
                    State::OneGone as u32,
                    // SYNC POINT (slot state): AcqRel: the peer that finds ONE_GONE
                    // (Acquire) sees our ring's close mark, stored before; on failure,
                    // Acquire as above.
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        {
            return;
        }
        // SYNC POINT (slot state): Acquire, as above: the departed peer's writes come
        // before.
        let cur = st.load(Ordering::Acquire);
        if cur == State::OneGone as u32 || cur == State::Accepted as u32 {
            // SYNC POINT (slot state): AcqRel: a later owner of the freed slot (which loads
            // the state with Acquire when it binds or connects) sees what we wrote in it.
            let _ =
                st.compare_exchange(cur, State::Free as u32, Ordering::AcqRel, Ordering::Acquire);
        }
        // Any other value: someone else took or broke the slot; leave it alone.
    }
}

/// Record size of a payload (the ring's).
pub(super) fn rec(len: usize) -> usize {
    shmlink_ring::spsc::record_size(len)
}

impl ConnOps for VmConn {
    fn send(&mut self, msg: &[u8], blocking: bool) -> Result<()> {
        self.check_broken()?;
        // One load of a line that changes only at setup and teardown: a peer that has
        // left gets no more messages (they would vanish), as on the framed transports.
        if self.shared.state() != State::Accepted as u32 {
            self.peer_check()?;
        }
        if !self.flush(blocking)? {
            return Err(Error::would_block());
        }
        if msg.len() > self.max_payload() {
            self.pending = Some(Pending {
                msg: msg.to_vec(),
                off: 0,
            });
            self.flush(blocking)?;
            return Ok(());
        }
        let mut wait = Wait::new();
        loop {
            if let Some(dst) = self.try_room(msg.len())? {
                // SAFETY: room for `msg.len()` bytes at `dst` (try_reserve), inside the
                // region's mapping; any guest may write them, so the copy is
                // `copy_shared`'s, and `msg` is ours.
                unsafe { crate::sys::copy_shared(dst.as_ptr(), msg.as_ptr(), msg.len()) };
                self.commit_tx(msg.len(), 0);
                return Ok(());
            }
            self.peer_check()?;
            if !blocking {
                self.shared.arm();
                // Announced: a peer with a doorbell rings when it makes room.
                let _ = self.tx.arm(rec(msg.len()));
                if self.tx.has_room(rec(msg.len())).unwrap_or(true) {
                    continue;
                }
                return Err(Error::would_block());
            }
            self.wait_send(&mut wait, msg.len())?;
        }
    }

    fn reserve(&mut self, n: usize, blocking: bool) -> Result<()> {
        self.check_broken()?;
        self.reserved = Reserved::None;
        if self.shared.state() != State::Accepted as u32 {
            self.peer_check()?;
        }
        if !self.flush(blocking)? {
            return Err(Error::would_block());
        }
        if n > self.max_payload() {
            self.reserved = Reserved::Staged(vec![0; n], blocking);
            return Ok(());
        }
        let mut wait = Wait::new();
        loop {
            if let Some(ptr) = self.try_room(n)? {
                let mut buf = std::mem::take(&mut self.scratch);
                buf.clear();
                buf.resize(n, 0);
                self.reserved = Reserved::Ring { ptr, buf };
                return Ok(());
            }
            self.peer_check()?;
            if !blocking {
                self.shared.arm();
                // Announced: a peer with a doorbell rings when it makes room.
                let _ = self.tx.arm(rec(n));
                if self.tx.has_room(rec(n)).unwrap_or(true) {
                    continue;
                }
                return Err(Error::would_block());
            }
            self.wait_send(&mut wait, n)?;
        }
    }

    fn reserved(&self) -> &[u8] {
        match &self.reserved {
            Reserved::None => &[],
            Reserved::Ring { buf, .. } => buf,
            Reserved::Staged(v, _) => v,
        }
    }

    fn reserved_mut(&mut self) -> &mut [u8] {
        match &mut self.reserved {
            Reserved::None => &mut [],
            Reserved::Ring { buf, .. } => buf,
            Reserved::Staged(v, _) => v,
        }
    }

    fn commit(&mut self) -> Result<()> {
        match std::mem::replace(&mut self.reserved, Reserved::None) {
            Reserved::None => Ok(()),
            Reserved::Ring { ptr, buf } => {
                // SAFETY: `try_reserve` gave room for `buf.len()` bytes at `ptr`, inside
                // our ring's data area, which the mapping (kept by `shared`) covers and
                // the consumer does not read before the commit below; any guest may write
                // it, so the copy is `copy_shared`'s; `buf` is ours.
                unsafe { crate::sys::copy_shared(ptr.as_ptr(), buf.as_ptr(), buf.len()) };
                let len = buf.len();
                self.scratch = buf;
                self.commit_tx(len, 0);
                Ok(())
            }
            // Accepted whole; a blocking connection writes every fragment before it
            // returns, a non-blocking one moves the rest on later calls (as after `send`).
            Reserved::Staged(msg, blocking) => {
                self.pending = Some(Pending { msg, off: 0 });
                self.flush(blocking)?;
                Ok(())
            }
        }
    }

    fn abort_reserve(&mut self) {
        if let Reserved::Ring { buf, .. } = std::mem::replace(&mut self.reserved, Reserved::None) {
            self.scratch = buf;
        }
    }

    fn truncate_reserved(&mut self, len: usize) {
        match &mut self.reserved {
            Reserved::None => {}
            Reserved::Ring { buf: v, .. } | Reserved::Staged(v, _) => v.truncate(len),
        }
    }

    fn recv_next(&mut self, blocking: bool) -> Result<usize> {
        match &self.current {
            Current::InPlace { len, .. } => return Ok(*len),
            Current::Owned(v) => return Ok(v.len()),
            Current::None => {}
        }
        self.check_broken()?;
        let mut wait = Wait::new();
        loop {
            if let Some(n) = self.try_recv()? {
                return Ok(n);
            }
            if self.rx.peer_closed() {
                // Records published before the mark are visible once it is (Acquire).
                if let Some(n) = self.try_recv()? {
                    return Ok(n);
                }
                if self.reasm.in_progress() {
                    return Err(self.violation("stream closed inside a split message".into()));
                }
                return Err(Error::eos());
            }
            // A peer that closed and then left: its close mark was stored before it left
            // (the state's Acquire load orders it), so look at the ring again first. One
            // load of the state decides both: a peer that leaves between two loads must
            // not turn its end of stream into a reset.
            let state = self.shared.state();
            if state == State::OneGone as u32 && self.rx.peer_closed() {
                continue;
            }
            self.peer_check_state(state)?;
            if !blocking {
                self.shared.arm();
                // Announced: a peer with a doorbell rings when it sends or closes.
                let _ = self.rx.arm();
                if let Some(n) = self.try_recv()? {
                    return Ok(n);
                }
                if self.rx.peer_closed() {
                    continue; // the end of the stream, at the top of the loop
                }
                return Err(Error::would_block());
            }
            self.wait_recv(&mut wait)?;
        }
    }

    fn current(&self) -> SharedBytes<'_> {
        match &self.current {
            Current::None => SharedBytes::local(&[]),
            // SAFETY: the record stays in the mapping (kept by `shared`) and is not reused
            // by the producer before `release` advances past it.
            Current::InPlace { ptr, len, .. } => unsafe { SharedBytes::shared(*ptr, *len) },
            Current::Owned(v) => SharedBytes::local(v),
        }
    }

    fn release(&mut self) {
        if let Current::InPlace { size, .. } = std::mem::replace(&mut self.current, Current::None) {
            if self.rx.advance(size) {
                self.shared.ring_peer();
            }
        }
    }

    fn take_current(&mut self) -> Vec<u8> {
        match std::mem::replace(&mut self.current, Current::None) {
            Current::Owned(v) => v,
            other => {
                self.current = other;
                let v = self.current().to_vec();
                self.release();
                v
            }
        }
    }

    fn writable(&mut self) -> Result<bool> {
        self.check_broken()?;
        self.flush(false)
    }

    fn max_send_size(&self) -> usize {
        self.max_send
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.shared.flag.fd()
    }

    fn close(&mut self, wait: bool) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        let mut result = Ok(());
        if self.broken.is_none() {
            // Fragments of a split message still to write: with `wait`, they go into the
            // ring as the peer makes room, given up after CLOSE_LINGER without progress
            // (then the peer sees a reset, not the end of the stream).
            let mut done = self.flush(false);
            if wait {
                let mut since = Instant::now();
                let mut left = self.pending.as_ref().map(|p| p.off);
                let mut wait = Wait::new();
                while matches!(done, Ok(false)) {
                    let now = self.pending.as_ref().map(|p| p.off);
                    if now != left {
                        left = now;
                        since = Instant::now();
                    } else if since.elapsed() > CLOSE_LINGER {
                        done = Err(Error::new(
                            ErrorKind::TimedOut,
                            format!("{}: the peer took nothing for the close linger", self.peer),
                        ));
                        break;
                    }
                    // `flush(false)` armed and announced before it gave up.
                    if !wait.spin() {
                        let rung = self.shared.rung();
                        wait.sleep(&self.shared.flag, false, rung);
                    }
                    done = self.flush(false);
                }
            }
            match done {
                Ok(true) => {
                    if self.tx.close() {
                        self.shared.ring_peer();
                    }
                }
                Ok(false) => {}
                Err(e) => result = Err(e),
            }
        }
        self.closed = true;
        self.depart();
        result
    }

    fn local_addr(&self) -> String {
        self.local.clone()
    }

    fn peer_addr(&self) -> String {
        self.peer.clone()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

impl Drop for VmConn {
    fn drop(&mut self) {
        if !self.closed {
            let _ = self.close(false);
        }
    }
}
