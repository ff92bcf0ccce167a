//! `vm:` — connections through a memory region shared between virtual machines and their
//! host: QEMU's `ivshmem-plain` device (a PCI BAR backed by a host file), mapped in a
//! guest through sysfs (`/sys/bus/pci/devices/…/resource2`: no driver needed) and on the
//! host from the backing file (docs/vms.md).
//!
//! There is no socket across VMs, so everything lives in the region ([`region`]): a table
//! of listeners (name, nonce, heartbeat), connection slots with a handshake by atomic
//! state changes ([`slot`]), and in each slot the control blocks of two SPSC rings of
//! `shmlink-ring` whose data areas follow the header. A waiter spins, announces sleep in
//! the ring, then sleeps until rung where doorbells exist ([`bell`]: `ivshmem-doorbell`
//! and `shmlink vm-host`), else polls with a bounded backoff (at most 1 ms between
//! polls); a process-wide ticker thread beats heartbeats every 5 ms, declares a peer dead
//! when its heartbeat stands still (`ConnectionReset`), and sets the eventfd an event loop watches when what
//! a connection or listener waits for has changed.

use crate::sync::{AtomicU64, Ordering};
use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::addr::Address;
use crate::error::{Error, ErrorKind, Result};
use crate::options::{Options, MAX_MSG_SIZE_LIMIT};
use crate::sys::stream::EventFlag;
use crate::transport::{Accepted, ConnOps, ListenerOps, Transport};

pub(crate) mod bell;
pub(crate) mod conn;
pub(crate) mod file;
pub(crate) mod inspect;
pub(crate) mod region;
pub(crate) mod slot;

use conn::{ConnShared, VmConn};
use region::{Backoff, Region, Tick, LISTENERS, SLOTS};
use slot::{Entry, Slot, State};

/// The `vm:` entry of the transport table.
pub(crate) static TRANSPORT: Transport = Transport {
    name: "vm",
    connect,
    bind,
};

/// The region `auto:` offers to peers in other VMs (docs/vms.md, "auto: between guests"):
/// `$SHMLINK_AUTO_VM` names it — a path (the host's backing file, a guest's
/// `…/resource2`), or `1`/`auto` for the region `vm:NAME` finds (`$SHMLINK_VM_REGION`, else
/// the one ivshmem device). Unset, empty or `0`: `auto:` does not look for a region.
pub(crate) fn auto_region() -> Option<Result<std::path::PathBuf>> {
    let v = std::env::var_os("SHMLINK_AUTO_VM")?;
    match v.to_str() {
        Some("" | "0") => None,
        Some("1" | "auto") => Some(region::locate(None)),
        _ => Some(Ok(std::path::PathBuf::from(v))),
    }
}

/// The id of the region at `path` (mapping it, writing the id if it has none yet).
pub(crate) fn region_id(path: &std::path::Path, opts: &Options) -> Result<[u8; region::ID_LEN]> {
    Region::open(path, &file::Policy::of(opts))?
        .id(std::time::Duration::from_secs(1))
        .ok_or_else(|| {
            Error::new(
                ErrorKind::ProtocolViolation,
                format!("vm: region {} holds no valid region id", path.display()),
            )
        })
}

/// The `vm:` address of listener `name` in the region at `path`.
pub(crate) fn address(name: &str, path: &std::path::Path) -> Address {
    Address::Vm {
        name: name.to_string(),
        region: Some(path.to_path_buf()),
    }
}

fn parts(addr: &Address) -> Result<(String, std::path::PathBuf)> {
    match addr {
        Address::Vm { name, region } => Ok((name.clone(), region::locate(region.as_deref())?)),
        _ => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!("{addr} is not a vm: address"),
        )),
    }
}

/// A fresh non-zero nonce.
fn nonce() -> Result<u64> {
    let t = crate::transport::shm::handshake::random_token()?;
    let n = u64::from_le_bytes(t[..8].try_into().expect("a token has 8 bytes"));
    Ok(n.max(1))
}

/// The name in listener entry `i`, if it is live: (name, nonce).
fn listener_entry(region: &Region, i: usize) -> Option<(Vec<u8>, u64)> {
    let b = Region::listener(i);
    // `Entry::load` is the Acquire half of `Entry::publish`: a live entry's name and
    // nonce are complete.
    if Entry::new(region.u32_at(b + slot::L_STATE)).load() != Entry::LIVE {
        return None;
    }
    // SYNC POINT (bind): Acquire, after the state (peer-written: bounds-checked next).
    let n = region.u32_at(b + slot::L_NAME_LEN).load(Ordering::Acquire) as usize;
    if n == 0 || n > slot::L_NAME_MAX {
        return None;
    }
    let mut name = vec![0u8; n];
    region.read_bytes(b + slot::L_NAME, &mut name);
    // SYNC POINT (bind): Acquire, after the state, as the name length.
    let nonce = region.u64_at(b + slot::L_NONCE).load(Ordering::Acquire);
    Some((name, nonce))
}

fn max_of(opts: &Options) -> usize {
    opts.max_msg_size.clamp(1, MAX_MSG_SIZE_LIMIT)
}

fn connect(addr: &Address, opts: &Options) -> Result<Box<dyn ConnOps>> {
    let (name, path) = parts(addr)?;
    let region = Region::open(&path, &file::Policy::of(opts))?;
    let (li, lnonce) = (0..LISTENERS)
        .find_map(|i| match listener_entry(&region, i) {
            Some((n, nonce)) if n == name.as_bytes() => Some((i, nonce)),
            _ => None,
        })
        .ok_or_else(|| {
            Error::new(
                ErrorKind::ConnectionRefused,
                format!("vm: nobody listens as {name:?} in {}", path.display()),
            )
        })?;
    let si = claim_slot(&region)?;
    let b = Region::slot(si);
    region.write_bytes(b + slot::CLIENT_HB, &[0; 8]);
    region.write_bytes(b + slot::SERVER_HB, &[0; 8]);
    region.write_bytes(b + slot::C2S_PROD, &[0; slot::CTL_END - slot::C2S_PROD]);
    region.clear_ring_start(2 * si);
    region.clear_ring_start(2 * si + 1);
    region
        .u32_at(b + slot::LISTENER)
        // SYNC POINT (handshake): Relaxed: a request field, published by the Release store
        // of REQUEST below, which the listener loads with Acquire
        // (`ListenShared::pending`).
        .store(li as u32, Ordering::Relaxed);
    region
        .u64_at(b + slot::LISTENER_NONCE)
        // SYNC POINT (handshake): Relaxed: a request field, published by the Release store
        // of REQUEST below, which the listener loads with Acquire
        // (`ListenShared::pending`).
        .store(lnonce, Ordering::Relaxed);
    let ours = max_of(opts);
    region
        .u64_at(b + slot::CLIENT_MAX)
        // SYNC POINT (handshake): Relaxed: a request field, published by the Release store
        // of REQUEST below, which the listener loads with Acquire
        // (`ListenShared::pending`).
        .store(ours as u64, Ordering::Relaxed);
    region
        .u64_at(b + slot::SERVER_MAX)
        // SYNC POINT (handshake): Relaxed: a request field, published by the Release store
        // of REQUEST below, which the listener loads with Acquire
        // (`ListenShared::pending`).
        .store(0, Ordering::Relaxed);
    region
        .u32_at(b + slot::CLIENT_PID)
        // SYNC POINT (handshake): Relaxed: a request field, published by the Release store
        // of REQUEST below, which the listener loads with Acquire
        // (`ListenShared::pending`).
        .store(std::process::id(), Ordering::Relaxed);
    region
        .u32_at(b + slot::SERVER_PID)
        // SYNC POINT (handshake): Relaxed: a request field, published by the Release store
        // of REQUEST below, which the listener loads with Acquire
        // (`ListenShared::pending`).
        .store(0, Ordering::Relaxed);
    let shared = ConnShared::new(region.clone(), si, true)?;
    let st = Slot::new(region.u32_at(b + slot::STATE));
    // Publishes the zeroed blocks and our request fields (`Slot::request`).
    st.request();

    let deadline = Instant::now() + opts.connect_timeout;
    let mut backoff = Backoff::new();
    // The listener's heartbeat: a listener whose process died leaves a LIVE entry that
    // nobody serves; refuse once it stands still as long as a dead peer's would.
    let lhb = region.u64_at(Region::listener(li) + slot::L_HB);
    // SYNC POINT (heartbeat): Acquire pairs with the listener's Release `fetch_add` in
    // `ListenShared::tick`; only a change is looked at.
    let (mut last_hb, mut hb_since) = (lhb.load(Ordering::Acquire), Instant::now());
    let stale_after = region::dead_after() + region::TICK * region::DEAD_TICKS;
    let refuse = |why: String| {
        // Withdraw the request; if the listener accepted it meanwhile, this fails and
        // the slot is left to the listener's side (which sees us never beat: reset).
        st.withdraw();
        why
    };
    loop {
        // Seeing ACCEPTED makes the listener's maximum visible (`Slot::accept`).
        let s = st.load();
        if s == State::Accepted as u32 {
            break;
        }
        if s == State::Refused as u32 {
            let why = refuse(format!("vm: the listener {name:?} refused the connection"));
            return Err(Error::new(ErrorKind::ConnectionRefused, why));
        }
        if s != State::Request as u32 {
            return Err(Error::violation(format!(
                "vm: slot {si} changed to state {s} during the handshake"
            )));
        }
        if listener_entry(&region, li).map(|(_, n)| n) != Some(lnonce) {
            let why = refuse(format!("vm: the listener {name:?} went away"));
            return Err(Error::new(ErrorKind::ConnectionRefused, why));
        }
        // SYNC POINT (heartbeat): Acquire pairs with the listener's Release `fetch_add` in
        // `ListenShared::tick`.
        let hb = lhb.load(Ordering::Acquire);
        if hb != last_hb {
            (last_hb, hb_since) = (hb, Instant::now());
        } else if hb_since.elapsed() > stale_after {
            let why = refuse(format!(
                "vm: the listener {name:?} does not beat (its process is gone)"
            ));
            return Err(Error::new(ErrorKind::ConnectionRefused, why));
        }
        if Instant::now() >= deadline {
            let why = refuse(format!(
                "vm: the listener {name:?} did not accept within {:?}",
                opts.connect_timeout
            ));
            // An accept that raced our withdrawal.
            if st.load() == State::Accepted as u32 {
                break;
            }
            return Err(Error::new(ErrorKind::TimedOut, why));
        }
        backoff.snooze(shared.flag(), || {});
    }
    // SYNC POINT (handshake): Acquire, after the state load that saw ACCEPTED (the listener
    // stored SERVER_MAX before its AcqRel CAS).
    let theirs = region.u64_at(b + slot::SERVER_MAX).load(Ordering::Acquire);
    if theirs == 0 || theirs > MAX_MSG_SIZE_LIMIT as u64 {
        st.abandon(State::Accepted as u32);
        return Err(Error::violation(format!(
            "vm: the listener's maximum message size {theirs} is out of range"
        )));
    }
    let local = format!("vm:{name}@{}#{si}", path.display());
    let peer = format!("vm:{name}@{}", path.display());
    Ok(Box::new(VmConn::new(
        shared,
        ours.min(theirs as usize),
        ours,
        local,
        peer,
    )))
}

/// Takes a free slot, reclaiming one whose users both stopped beating if none is free.
fn claim_slot(region: &Region) -> Result<usize> {
    let take =
        |i: usize, from: u32| Slot::new(region.u32_at(Region::slot(i) + slot::STATE)).claim(from);
    if let Some(i) = (0..SLOTS).find(|&i| take(i, State::Free as u32)) {
        return Ok(i);
    }
    // No free slot: one whose two users both stopped beating is reclaimed (sampled all
    // at once: one wait of the death bound).
    // A snapshot of the states; the CAS in `take` decides.
    let states: Vec<u32> = (0..SLOTS)
        .map(|i| Slot::new(region.u32_at(Region::slot(i) + slot::STATE)).load())
        .collect();
    let beats: Vec<&AtomicU64> = (0..SLOTS)
        .flat_map(|i| {
            let b = Region::slot(i);
            [
                region.u64_at(b + slot::CLIENT_HB),
                region.u64_at(b + slot::SERVER_HB),
            ]
        })
        .collect();
    let still = region::stale(&beats);
    for i in 0..SLOTS {
        if still[2 * i] && still[2 * i + 1] && take(i, states[i]) {
            return Ok(i);
        }
    }
    Err(Error::new(
        ErrorKind::ConnectionRefused,
        format!(
            "vm: all {SLOTS} connection slots of {} are in use",
            region.path().display()
        ),
    ))
}

/// What the ticker needs of a listener. The ticker also completes handshakes (the
/// listener's backlog), so that a client's `connect` returns whether or not the
/// application is in `accept` at that moment.
struct ListenShared {
    region: Arc<Region>,
    index: usize,
    nonce: u64,
    name: String,
    max: usize,
    flag: EventFlag,
    /// Accepted connections not yet taken by `accept`: (slot, the client's maximum).
    backlog: Mutex<VecDeque<(Arc<ConnShared>, usize)>>,
}

impl ListenShared {
    /// A request for this listener, if one waits: its slot.
    fn pending(&self) -> Option<usize> {
        (0..SLOTS).find(|&i| {
            let b = Region::slot(i);
            // Seeing REQUEST makes the request fields visible (`Slot::request`).
            Slot::new(self.region.u32_at(b + slot::STATE)).load() == State::Request as u32
                && self
                    .region
                    .u32_at(b + slot::LISTENER)
                    // SYNC POINT (handshake): Acquire, after the state (the client wrote it
                    // before REQUEST).
                    .load(Ordering::Acquire)
                    == self.index as u32
                && self
                    .region
                    .u64_at(b + slot::LISTENER_NONCE)
                    // SYNC POINT (handshake): Acquire, after the state, as the listener
                    // index.
                    .load(Ordering::Acquire)
                    == self.nonce
        })
    }

    fn hb(&self) -> &AtomicU64 {
        self.region
            .u64_at(Region::listener(self.index) + slot::L_HB)
    }

    fn backlog(&self) -> std::sync::MutexGuard<'_, VecDeque<(Arc<ConnShared>, usize)>> {
        self.backlog.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Completes the handshakes of the requests waiting for this listener (or refuses
    /// bad ones); true if any joined the backlog.
    fn take_requests(&self) -> bool {
        let mut any = false;
        while let Some(si) = self.pending() {
            if self.backlog().len() >= SLOTS {
                break;
            }
            let b = Region::slot(si);
            let st = Slot::new(self.region.u32_at(b + slot::STATE));
            let theirs = self
                .region
                .u64_at(b + slot::CLIENT_MAX)
                // SYNC POINT (handshake): Acquire, after `pending` loaded REQUEST with
                // Acquire; peer-written: checked next.
                .load(Ordering::Acquire);
            if theirs == 0 || theirs > MAX_MSG_SIZE_LIMIT as u64 {
                st.refuse();
                continue;
            }
            self.region
                .u64_at(b + slot::SERVER_MAX)
                // SYNC POINT (handshake): Relaxed: published by the AcqRel CAS to ACCEPTED
                // below, which the client loads with Acquire.
                .store(self.max as u64, Ordering::Relaxed);
            self.region
                .u32_at(b + slot::SERVER_PID)
                // SYNC POINT (handshake): Relaxed, published by the CAS to ACCEPTED, as
                // SERVER_MAX.
                .store(std::process::id(), Ordering::Relaxed);
            let Ok(shared) = ConnShared::new(self.region.clone(), si, false) else {
                break; // out of descriptors: the client times out or we retry next tick
            };
            // Publishes our maximum to the client (`Slot::accept`).
            if st.accept() {
                self.backlog().push_back((shared, theirs as usize));
                any = true;
            }
        }
        any
    }
}

impl Tick for ListenShared {
    fn tick(&self, _now: Instant) {
        // SYNC POINT (heartbeat): Release pairs with the Acquire samples of `region::stale`
        // and `connect`'s listener heartbeat loads.
        self.hb().fetch_add(1, Ordering::Release);
        self.take_requests();
        let b = self.backlog();
        if !b.is_empty() {
            let _ = self.flag.set();
        }
    }
}

struct VmListener {
    shared: Arc<ListenShared>,
}

fn bind(addr: &Address, opts: &Options) -> Result<Box<dyn ListenerOps>> {
    let (name, path) = parts(addr)?;
    if name.len() > slot::L_NAME_MAX {
        return Err(Error::new(
            ErrorKind::InvalidAddress,
            format!("vm: name longer than {} bytes", slot::L_NAME_MAX),
        ));
    }
    let region = Region::open(&path, &file::Policy::of(opts))?;
    let state = |i: usize| Entry::new(region.u32_at(Region::listener(i) + slot::L_STATE));
    let busy = |i: usize, from: u32| state(i).take(from);
    let in_use = || {
        Error::new(
            ErrorKind::AddrInUse,
            format!("vm: {name:?} is already served in {}", path.display()),
        )
    };
    let mut index = None;
    // The same name, live: ours only if its listener stopped beating.
    for i in 0..LISTENERS {
        if let Some((n, _)) = listener_entry(&region, i) {
            if n == name.as_bytes() {
                if !region::is_stale(region.u64_at(Region::listener(i) + slot::L_HB)) {
                    return Err(in_use());
                }
                if busy(i, Entry::LIVE) {
                    index = Some(i);
                    break;
                }
                return Err(in_use());
            }
        }
    }
    let index = match index {
        Some(i) => i,
        None => (0..LISTENERS)
            .find(|&i| busy(i, Entry::FREE))
            .or_else(|| {
                // A full table: take an entry whose listener stopped beating (all sampled
                // over one wait of the death bound).
                let states: Vec<u32> = (0..LISTENERS).map(|i| state(i).load()).collect();
                let beats: Vec<&AtomicU64> = (0..LISTENERS)
                    .map(|i| region.u64_at(Region::listener(i) + slot::L_HB))
                    .collect();
                let still = region::stale(&beats);
                (0..LISTENERS).find(|&i| still[i] && busy(i, states[i]))
            })
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::AddrInUse,
                    format!(
                        "vm: all {LISTENERS} listener entries of {} are in use",
                        path.display()
                    ),
                )
            })?,
    };
    let b = Region::listener(index);
    let nonce = nonce()?;
    region
        .u64_at(b + slot::L_NONCE)
        // SYNC POINT (bind): Relaxed: published by the `Entry::publish` below
        // (loaded with Acquire in `listener_entry`).
        .store(nonce, Ordering::Relaxed);
    region
        .u32_at(b + slot::L_NAME_LEN)
        // SYNC POINT (bind): Relaxed, published by the `Entry::publish` below.
        .store(name.len() as u32, Ordering::Relaxed);
    region
        .u32_at(b + slot::L_PID)
        // SYNC POINT (bind): Relaxed, published by the `Entry::publish` below.
        .store(std::process::id(), Ordering::Relaxed);
    region.write_bytes(b + slot::L_NAME, name.as_bytes());
    // Publishes the name and nonce: a client that sees LIVE sees them (`Entry::publish`).
    state(index).publish();
    // Two listeners that bound the same name at once: the lower entry keeps it.
    if (0..index).any(|i| listener_entry(&region, i).is_some_and(|(n, _)| n == name.as_bytes())) {
        state(index).release();
        return Err(in_use());
    }
    let flag = EventFlag::new().map_err(|e| Error::io("vm: eventfd", e))?;
    let shared = Arc::new(ListenShared {
        region,
        index,
        nonce,
        name,
        max: max_of(opts),
        flag,
        backlog: Mutex::new(VecDeque::new()),
    });
    let t: Arc<dyn Tick> = shared.clone();
    region::register(&t);
    Ok(Box::new(VmListener { shared }))
}

impl ListenerOps for VmListener {
    fn accept(&mut self, blocking: bool) -> Result<Accepted> {
        let s = &self.shared;
        let mut backoff = Backoff::new();
        loop {
            s.take_requests();
            let next = {
                // Under the backlog's lock, as the ticker sets the flag: it stays set
                // exactly while connections wait.
                let mut b = s.backlog();
                let next = b.pop_front();
                if b.is_empty() {
                    let _ = s.flag.clear();
                }
                next
            };
            if let Some((shared, theirs)) = next {
                let path = s.region.path().display().to_string();
                let si = shared.slot();
                let conn = VmConn::new(
                    shared,
                    s.max.min(theirs),
                    s.max,
                    format!("vm:{}@{path}", s.name),
                    format!("vm:{}@{path}#{si}", s.name),
                );
                return Ok(Accepted::untracked(Box::new(conn)));
            }
            if !blocking {
                return Err(Error::would_block());
            }
            backoff.snooze(&s.flag, || {});
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.shared.flag.fd()
    }

    fn local_addr(&self) -> String {
        format!(
            "vm:{}@{}",
            self.shared.name,
            self.shared.region.path().display()
        )
    }
}

impl Drop for VmListener {
    fn drop(&mut self) {
        let s = &self.shared;
        let b = Region::listener(s.index);
        // SYNC POINT (bind): Acquire pairs with the Relaxed nonce store in `bind`,
        // published by its `Entry::publish`: the entry is still ours.
        if s.region.u64_at(b + slot::L_NONCE).load(Ordering::Acquire) == s.nonce {
            Entry::new(s.region.u32_at(b + slot::L_STATE)).unpublish();
        }
    }
}
