//! `shm-spin`, `shm-eventfd`, `shm-futex`, `shm-signal`: the primitive floor. Shared
//! memory with one byte ring per direction ([`region`]); messages are an 8-byte length
//! and the bytes, copied in by the sender and out by the receiver. The four differ only
//! in how a waiting end waits ([`wake`]).
//!
//! Each end caches the other side's position on its rings (rtrb's `cached_head` /
//! `cached_tail`) and reloads the shared atomic only when the cached value says there is
//! not enough room or data, so the fast path touches no line the other core writes.

mod region;
mod wake;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;

use region::{data_slot, head, space_slot, tail, Region, CAP};
pub use wake::block_signal;
use wake::Wake;

use crate::method::{arg, Ctx, Endpoint, Method, Prepared};
use crate::sys::{ctx, err, inherited_fd, syscall};

/// Which waiting primitive.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Spin,
    EventFd,
    Futex,
    Signal,
}

pub struct Shm {
    kind: Kind,
}

pub const SPIN: Shm = Shm { kind: Kind::Spin };
pub const EVENTFD: Shm = Shm {
    kind: Kind::EventFd,
};
pub const FUTEX: Shm = Shm { kind: Kind::Futex };
pub const SIGNAL: Shm = Shm { kind: Kind::Signal };

/// One end: sends on ring `tx`, receives on ring `rx`.
struct ShmEnd {
    reg: Region,
    wake: Wake,
    tx: usize,
    rx: usize,
    /// Write position on `tx` (ahead of the published tail while a message is copied).
    tx_pos: u64,
    /// The reader's head on `tx` as last loaded (at most the real head).
    tx_head: u64,
    /// Read position on `rx` (ahead of the published head until released).
    rx_pos: u64,
    rx_published: u64,
    /// The writer's tail on `rx` as last loaded (at most the real tail).
    rx_tail: u64,
}

impl ShmEnd {
    fn new(reg: Region, wake: Wake, me: usize) -> ShmEnd {
        // End 0 (the driver) sends on ring 0.
        let (tx, rx) = if me == 0 { (0, 1) } else { (1, 0) };
        reg.u32_at(region::pid(me))
            .store(std::process::id(), Ordering::Relaxed);
        // SYNC POINT: Acquire pairs with the other end's Release stores (the ring is fresh
        // here, so these are all 0 in practice).
        let tx_pos = reg.u64_at(tail(tx)).load(Ordering::Acquire);
        let tx_head = reg.u64_at(head(tx)).load(Ordering::Acquire);
        let rx_pos = reg.u64_at(head(rx)).load(Ordering::Acquire);
        let rx_tail = reg.u64_at(tail(rx)).load(Ordering::Acquire);
        ShmEnd {
            tx_pos,
            tx_head,
            rx_pos,
            rx_published: rx_pos,
            rx_tail,
            reg,
            wake,
            tx,
            rx,
        }
    }

    /// Releases what was read so far and wakes a writer waiting for space.
    fn release(&mut self) -> io::Result<()> {
        if self.rx_published != self.rx_pos {
            self.rx_published = self.rx_pos;
            // SYNC POINT: Release pairs with the writer's Acquire load of head.
            self.reg
                .u64_at(head(self.rx))
                .store(self.rx_pos, Ordering::Release);
            self.wake.notify(&self.reg, space_slot(self.rx))?;
        }
        Ok(())
    }

    /// Copies exactly `dst.len()` bytes out of the receive ring, waiting for them.
    fn take(&mut self, dst: &mut [u8]) -> io::Result<()> {
        let mut got = 0;
        while got < dst.len() {
            let mut avail = (self.rx_tail - self.rx_pos) as usize;
            if avail < dst.len() - got {
                // The cached tail says too little: reload it.
                // SYNC POINT: Acquire pairs with the writer's Release store of tail.
                self.rx_tail = self.reg.u64_at(tail(self.rx)).load(Ordering::Acquire);
                avail = (self.rx_tail - self.rx_pos) as usize;
            }
            if avail == 0 {
                // Release first: a writer may wait for the space we hold.
                self.release()?;
                let pos = self.rx_pos;
                let tail_at = self.reg.u64_at(tail(self.rx));
                self.wake.wait(&self.reg, data_slot(self.rx), || {
                    tail_at.load(Ordering::Acquire) != pos
                })?;
                continue;
            }
            let n = avail.min(dst.len() - got);
            self.reg.read(self.rx, self.rx_pos, &mut dst[got..got + n]);
            self.rx_pos += n as u64;
            got += n;
            if self.rx_pos - self.rx_published >= (CAP / 2) as u64 {
                self.release()?;
            }
        }
        Ok(())
    }
}

impl Endpoint for ShmEnd {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        let len = (msg.len() as u64).to_le_bytes();
        let parts: [&[u8]; 2] = [&len, msg];
        let (mut part, mut off) = (0, 0);
        let head_at = self.reg.u64_at(head(self.tx));
        let tail_at = self.reg.u64_at(tail(self.tx));
        let mut left = 8 + msg.len();
        while part < parts.len() {
            let mut free = CAP - (self.tx_pos - self.tx_head) as usize;
            if free < left.min(CAP) {
                // The cached head says too little room: reload it.
                // SYNC POINT: Acquire pairs with the reader's Release store of head.
                self.tx_head = head_at.load(Ordering::Acquire);
                free = CAP - (self.tx_pos - self.tx_head) as usize;
            }
            if free == 0 {
                let pos = self.tx_pos;
                self.wake.wait(&self.reg, space_slot(self.tx), || {
                    pos - head_at.load(Ordering::Acquire) < CAP as u64
                })?;
                continue;
            }
            let mut room = free;
            while room > 0 && part < parts.len() {
                let n = room.min(parts[part].len() - off);
                self.reg
                    .write(self.tx, self.tx_pos, &parts[part][off..off + n]);
                self.tx_pos += n as u64;
                left -= n;
                room -= n;
                off += n;
                if off == parts[part].len() {
                    part += 1;
                    off = 0;
                }
            }
            // SYNC POINT: Release pairs with the reader's Acquire load of tail.
            tail_at.store(self.tx_pos, Ordering::Release);
            self.wake.notify(&self.reg, data_slot(self.tx))?;
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let mut len = [0u8; 8];
        self.take(&mut len)?;
        let len = u64::from_le_bytes(len);
        if len != buf.len() as u64 {
            return Err(err(format!(
                "received a {len}-byte message, expected {} bytes",
                buf.len()
            )));
        }
        self.take(buf)?;
        self.release()
    }
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes plain integers.
    let fd = syscall!(eventfd(0, libc::EFD_CLOEXEC)).map_err(ctx("eventfd"))?;
    // SAFETY: a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Shm {
    /// The wake-up of this method when it needs nothing passed between the processes
    /// (all but eventfd, whose descriptors the driver creates and the peer inherits).
    fn local_wake(&self, c: &Ctx) -> io::Result<Option<Wake>> {
        Ok(Some(match self.kind {
            Kind::Spin => Wake::Spin {
                yield_: c.same_core,
            },
            Kind::Futex => Wake::Futex,
            Kind::Signal => {
                block_signal()?;
                Wake::Signal
            }
            Kind::EventFd => return Ok(None),
        }))
    }
}

impl Method for Shm {
    fn name(&self) -> &'static str {
        match self.kind {
            Kind::Spin => "shm-spin",
            Kind::EventFd => "shm-eventfd",
            Kind::Futex => "shm-futex",
            Kind::Signal => "shm-signal",
        }
    }

    fn about(&self) -> &'static str {
        match self.kind {
            Kind::Spin => "shared-memory rings, busy polling (sched_yield when sharing a CPU)",
            Kind::EventFd => "shared-memory rings, sleep on an eventfd per wait slot",
            Kind::Futex => "shared-memory rings, sleep on a futex word per wait slot",
            Kind::Signal => "shared-memory rings, SIGUSR1 + sigwaitinfo to wake",
        }
    }

    fn busy_polls(&self) -> bool {
        self.kind == Kind::Spin
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        let (reg, memfd) = Region::create()?;
        let mut args = vec![memfd.as_raw_fd().to_string()];
        let mut inherit = vec![memfd];
        let wake = match self.local_wake(c)? {
            Some(wake) => wake,
            None => {
                let fds = [eventfd()?, eventfd()?, eventfd()?, eventfd()?];
                for fd in &fds {
                    let theirs = fd.try_clone()?;
                    args.push(theirs.as_raw_fd().to_string());
                    inherit.push(theirs);
                }
                Wake::EventFd(fds)
            }
        };
        Ok(Prepared::ready(args, inherit, ShmEnd::new(reg, wake, 0)))
    }

    fn connect(&self, c: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        let memfd = inherited_fd(arg(args, 0, "memfd")?)?;
        let reg = Region::map(&memfd)?;
        let wake = match self.local_wake(c)? {
            Some(wake) => wake,
            None => {
                let fd = |i| inherited_fd(arg(args, i, "eventfd")?);
                Wake::EventFd([fd(1)?, fd(2)?, fd(3)?, fd(4)?])
            }
        };
        Ok(Box::new(ShmEnd::new(reg, wake, 1)))
    }
}
