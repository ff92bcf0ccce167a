//! The shared region of `vm:`: how it is found, mapped and laid out, and the process-wide
//! ticker that beats this process's heartbeats in it and drives the descriptors event
//! loops watch.
//!
//! Layout (every offset fixed, the geometry derived from the region's size alone, so a
//! guest and the host that see the same size agree without a format step):
//!
//! ```text
//! page 0            magic "SHMLVM01" (u64), written once by the first user (CAS 0 → magic);
//!                   at 8 the region id's state (u32: 0 none, 1 being written, 2 set) and
//!                   at 16 the region id (128 random bits, written once, see [`Region::id`])
//! 4096 .. 8192      LISTENERS listener entries of 128 bytes
//! 8192 .. +SLOTS*2K SLOTS (64) connection slots of 2048 bytes (state, heartbeats, 4 ring ctls)
//! HEADER_LEN ..     2 * SLOTS ring data areas of `ring_size` bytes (slot i: 2i client→server,
//!                   2i+1 server→client), each mapped twice back to back
//! ```
//!
//! Any guest that maps the region can write all of it: everything here is read into locals
//! and checked before it decides anything, and only the mapping's own geometry (computed
//! locally from the size) bounds memory accesses.

use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::sys::memfd::Mapping;
use crate::sys::stream::EventFlag;

use super::file::Policy;
use super::slot::Once;

/// "SHMLVM01", little endian.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"SHMLVM01");
/// Offset of the region id's state word (u32).
const ID_STATE: usize = 8;
/// Offset of the region id (16 bytes).
const ID_AT: usize = 16;
/// Bytes of the region id.
pub(crate) const ID_LEN: usize = 16;
/// Listener entries in a region.
pub(crate) const LISTENERS: usize = 32;
/// Connection slots in a region: at most this many connections at once.
pub(crate) const SLOTS: usize = 64;
/// Bytes of one listener entry.
pub(crate) const LISTENER_BYTES: usize = 128;
/// Bytes of one slot.
pub(crate) const SLOT_BYTES: usize = 2048;
const LISTENERS_AT: usize = 4096;
const SLOTS_AT: usize = 8192;
/// Bytes before the ring data areas (a multiple of 4 KiB).
pub(crate) const HEADER_LEN: usize = SLOTS_AT + SLOTS * SLOT_BYTES;
/// Smallest ring data area.
const MIN_RING: usize = 64 << 10;
/// Largest ring data area: larger rings only delay flow control.
const MAX_RING: usize = 4 << 20;
/// Smallest region: the header and the smallest rings.
pub(crate) const MIN_REGION: usize = HEADER_LEN + 2 * SLOTS * MIN_RING;

/// How often the ticker beats heartbeats and checks armed descriptors.
pub(crate) const TICK: Duration = Duration::from_millis(5);
/// A peer whose heartbeat did not move for this long (and for at least
/// [`DEAD_TICKS`] of our own ticks) is dead, unless `$SHMLINK_VM_DEAD_MS` says otherwise.
pub(crate) const DEFAULT_DEAD_AFTER: Duration = Duration::from_millis(80);
/// Our own ticks that must pass without the peer's heartbeat moving, so that a stall of
/// this process (a descheduled vCPU) is not taken for the peer's death.
pub(crate) const DEAD_TICKS: u32 = 8;

/// The death bound in force: `$SHMLINK_VM_DEAD_MS` (20 ms – 60 s), else the default.
pub(crate) fn dead_after() -> Duration {
    static D: OnceLock<Duration> = OnceLock::new();
    *D.get_or_init(|| {
        std::env::var("SHMLINK_VM_DEAD_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|ms| (20..=60_000).contains(ms))
            .map(Duration::from_millis)
            .unwrap_or(DEFAULT_DEAD_AFTER)
    })
}

/// Ring size for a region of `len` bytes: the largest power of two that fits, within
/// [`MIN_RING`, `MAX_RING`].
pub(crate) fn ring_size(len: usize) -> Option<usize> {
    if len < MIN_REGION {
        return None;
    }
    let per = (len - HEADER_LEN) / (2 * SLOTS);
    let mut r = MIN_RING;
    while r * 2 <= per && r * 2 <= MAX_RING {
        r *= 2;
    }
    Some(r)
}

/// The region file an address names, or the one this machine offers.
pub(crate) fn locate(region: Option<&Path>) -> Result<PathBuf> {
    if let Some(r) = region {
        return Ok(r.to_path_buf());
    }
    if let Some(r) = std::env::var_os("SHMLINK_VM_REGION").filter(|r| !r.is_empty()) {
        return Ok(PathBuf::from(r));
    }
    // A guest: the BAR 2 of QEMU's ivshmem device (PCI 1af4:1110), mapped through sysfs.
    let mut found = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/sys/bus/pci/devices") {
        for e in dir.flatten() {
            let read = |f: &str| std::fs::read_to_string(e.path().join(f)).unwrap_or_default();
            if read("vendor").trim() == "0x1af4" && read("device").trim() == "0x1110" {
                found.push(e.path().join("resource2"));
            }
        }
    }
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(Error::new(
            ErrorKind::InvalidAddress,
            "vm: no region named (vm:NAME@/path), $SHMLINK_VM_REGION unset, and no ivshmem \
             device (PCI 1af4:1110) in /sys/bus/pci/devices",
        )),
        _ => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!(
                "vm: several ivshmem devices ({}): name one as vm:NAME@/sys/bus/pci/devices/…/resource2",
                found
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

/// A mapped region.
pub(crate) struct Region {
    map: Mapping,
    ring: usize,
    path: PathBuf,
    /// Whom the file was checked against; the doorbell server is checked the same way.
    policy: Policy,
}

impl Region {
    /// Maps the region file at `path` (read-write) and checks or writes its magic.
    pub(crate) fn open(path: &Path, policy: &Policy) -> Result<Arc<Region>> {
        Region::open_as(path, true, policy)
    }

    /// Maps the region at `path`; with `format` false a region nobody has used yet (no
    /// magic) is refused instead of written to (for inspecting: `shmlink ls --vm`). The
    /// file is checked first ([`super::file`]: type, owner, mode, directory).
    pub(crate) fn open_as(path: &Path, format: bool, policy: &Policy) -> Result<Arc<Region>> {
        let ctx = |what: &str| format!("vm: {what} {}", path.display());
        let file: File = super::file::open(path, policy)?;
        let len = file
            .metadata()
            .map_err(|e| Error::io(ctx("reading the size of region"), e))?
            .len() as usize;
        let ring = ring_size(len).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "{}: {len} bytes, a region needs at least {MIN_REGION}",
                    ctx("region")
                ),
            )
        })?;
        let map = Mapping::map(file.as_fd(), HEADER_LEN, &vec![ring; 2 * SLOTS], true)
            .map_err(|e| Error::io(ctx("mapping region"), e))?;
        let region = Region {
            map,
            ring,
            path: path.to_path_buf(),
            policy: policy.clone(),
        };
        let magic = region.u64_at(0);
        // SYNC POINT (region magic): Acquire pairs with the AcqRel CAS 0 → MAGIC below, in
        // whichever process wrote the magic first.
        if !format && magic.load(Ordering::Acquire) == 0 {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("{}: nobody has used it yet (no magic)", ctx("region")),
            ));
        }
        // SYNC POINT (region magic): AcqRel CAS: the first opener's write of the magic
        // pairs with every later opener's Acquire failure (or the load above).
        match magic.compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {}
            Err(m) if m == MAGIC => {}
            Err(m) => {
                return Err(Error::new(
                    ErrorKind::VersionMismatch,
                    format!(
                        "{}: magic {m:#x} is not shmlink's vm region (expected {MAGIC:#x}); \
                         the region holds something else or another version",
                        ctx("region")
                    ),
                ))
            }
        }
        if format {
            region.ensure_id();
        }
        Ok(Arc::new(region))
    }

    /// Writes the region id if nobody has yet (the first opener wins the CAS
    /// none → writing, writes 128 random bits, then publishes them).
    fn ensure_id(&self) {
        let st = Once::new(self.u32_at(ID_STATE));
        if st.begin() {
            match crate::transport::shm::handshake::random_token() {
                Ok(id) => {
                    self.write_bytes(ID_AT, &id);
                    // Publishes the id bytes to `id` (`Once::set`).
                    st.set();
                }
                Err(_) => st.abandon(),
            }
        }
    }

    /// The region's id: 128 random bits the first user wrote into the header, the same
    /// for every mapper (host file or guest BAR). `None` while it is being written (for
    /// at most `patience`) or if the header holds no valid id state (a scribbled region:
    /// then `auto:` does not upgrade through it). Any guest can rewrite it: the id only
    /// tells two peers that they *may* share the region; the `auto:` handshake proves it.
    pub(crate) fn id(&self, patience: Duration) -> Option<[u8; ID_LEN]> {
        let start = Instant::now();
        loop {
            // Seeing SET makes the id bytes read next complete (`Once::set`).
            match Once::new(self.u32_at(ID_STATE)).load() {
                Once::SET => {
                    let mut id = [0u8; ID_LEN];
                    self.read_bytes(ID_AT, &mut id);
                    return Some(id);
                }
                Once::WRITING if start.elapsed() < patience => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                _ => return None,
            }
        }
    }

    /// The region's file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whom the region's file (and its doorbell server) must belong to.
    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Ring data size.
    pub(crate) fn ring(&self) -> usize {
        self.ring
    }

    /// The byte at `off` of the header area.
    fn at(&self, off: usize) -> NonNull<u8> {
        debug_assert!(off < HEADER_LEN);
        // SAFETY: `off` is inside the header area, which the mapping covers.
        unsafe { self.map.header().add(off) }
    }

    /// The 8-aligned word at `off` of the header area, as an atomic.
    pub(crate) fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= HEADER_LEN);
        // SAFETY: 8-aligned, inside the mapping, which lives as long as `self`; shared
        // memory is only ever accessed through atomics or volatile copies.
        unsafe { self.at(off).cast::<AtomicU64>().as_ref() }
    }

    /// The 4-aligned word at `off` of the header area, as an atomic.
    pub(crate) fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off % 4 == 0 && off + 4 <= HEADER_LEN);
        // SAFETY: as in `u64_at`.
        unsafe { self.at(off).cast::<AtomicU32>().as_ref() }
    }

    /// Offset of listener entry `i`.
    pub(crate) fn listener(i: usize) -> usize {
        LISTENERS_AT + i * LISTENER_BYTES
    }

    /// Offset of slot `i`.
    pub(crate) fn slot(i: usize) -> usize {
        SLOTS_AT + i * SLOT_BYTES
    }

    /// A pointer into the header area, for ring control blocks (128-aligned offsets).
    pub(crate) fn ptr(&self, off: usize) -> NonNull<u8> {
        self.at(off)
    }

    /// Ring `i`'s data area (mapped twice).
    pub(crate) fn data(&self, i: usize) -> NonNull<u8> {
        self.map.ring(i).0
    }

    /// Makes ring `i` read as fresh to a new connection: the ring crate finds records by
    /// headers stamped with their position, and a reused slot's data area still holds the
    /// last connection's, stamped with the positions a new one starts at. The producer
    /// zeroes each next header before it publishes a record; only the first is ours.
    pub(crate) fn clear_ring_start(&self, i: usize) {
        // SAFETY: the data area is 8-aligned (the ring crate's requirement), inside the
        // mapping, which lives as long as `self`; shared memory is only ever accessed
        // through atomics or volatile copies.
        let first = unsafe { self.data(i).cast::<AtomicU64>().as_ref() };
        // SYNC POINT (handshake): Relaxed: published with the slot by the client's Release
        // store of REQUEST in `connect`, which the listener loads with Acquire.
        first.store(0, Ordering::Relaxed);
    }

    /// Copies `out.len()` bytes from the header area at `off` (with `copy_shared`:
    /// another guest may be writing them; the caller validates what it got).
    pub(crate) fn read_bytes(&self, off: usize, out: &mut [u8]) {
        assert!(off + out.len() <= HEADER_LEN, "read past the header area");
        // SAFETY: `off..off + out.len()` is inside the header area, which the mapping
        // covers while `self` lives; `out` is a distinct, writable local buffer.
        unsafe { crate::sys::copy_shared(out.as_mut_ptr(), self.at(off).as_ptr(), out.len()) };
    }

    /// Writes bytes into the header area at `off`.
    pub(crate) fn write_bytes(&self, off: usize, src: &[u8]) {
        debug_assert!(off + src.len() <= HEADER_LEN);
        for (i, b) in src.iter().enumerate() {
            // SAFETY: inside the header area, writable (the mapping is read-write).
            unsafe { self.at(off + i).as_ptr().write_volatile(*b) };
        }
    }
}

/// Something the ticker visits every [`TICK`]: it beats heartbeats and sets descriptors.
/// Returns false once it no longer needs ticks.
pub(crate) trait Tick: Send + Sync {
    fn tick(&self, now: Instant);
    /// A doorbell rang (bell.rs): set the descriptor if what it waits for changed,
    /// without waiting for the next tick.
    fn poke(&self) {}
}

type Ticked = Mutex<Vec<Weak<dyn Tick>>>;

fn ticked() -> &'static Ticked {
    static T: OnceLock<Ticked> = OnceLock::new();
    T.get_or_init(|| {
        std::thread::Builder::new()
            .name("shmlink-vm-tick".into())
            .spawn(|| loop {
                std::thread::sleep(TICK);
                let now = Instant::now();
                let live: Vec<Arc<dyn Tick>> = {
                    let mut list = ticked().lock().unwrap_or_else(|p| p.into_inner());
                    list.retain(|w| w.strong_count() > 0);
                    list.iter().filter_map(Weak::upgrade).collect()
                };
                for t in live {
                    t.tick(now);
                }
            })
            .expect("spawning the vm: ticker thread");
        Mutex::new(Vec::new())
    })
}

/// Visits everything registered with the ticker at once (a doorbell rang).
pub(crate) fn poke_all() {
    let live: Vec<Arc<dyn Tick>> = ticked()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for t in live {
        t.poke();
    }
}

/// Registers `t` with the ticker until its last `Arc` goes.
pub(crate) fn register(t: &Arc<dyn Tick>) {
    ticked()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Arc::downgrade(t));
}

/// Watches a heartbeat counter the peer writes: dead once it has not moved for
/// [`dead_after`] of wall time and [`DEAD_TICKS`] of our ticks.
pub(crate) struct Liveness {
    last: AtomicU64,
    since: Mutex<Instant>,
    still_ticks: AtomicU32,
    dead: AtomicBool,
}

impl Liveness {
    pub(crate) fn new(seen: u64) -> Liveness {
        Liveness {
            last: AtomicU64::new(seen),
            since: Mutex::new(Instant::now()),
            still_ticks: AtomicU32::new(0),
            dead: AtomicBool::new(false),
        }
    }

    /// Starts watching afresh from `seen` (when the connection is established).
    pub(crate) fn restart(&self, seen: u64) {
        let mut since = self.since.lock().unwrap_or_else(|p| p.into_inner());
        // SYNC POINT (liveness): Relaxed: `last` and `still_ticks` are only touched under
        // the `since` lock (here and in `observe`): the mutex orders them.
        self.last.store(seen, Ordering::Relaxed);
        *since = Instant::now();
        // SYNC POINT (liveness): Relaxed, under the `since` lock, as above.
        self.still_ticks.store(0, Ordering::Relaxed);
    }

    /// One observation of the peer's counter (from the ticker).
    pub(crate) fn observe(&self, value: u64, now: Instant) {
        let mut since = self.since.lock().unwrap_or_else(|p| p.into_inner());
        // SYNC POINT (liveness): Relaxed, under the `since` lock (pairs with `restart`
        // through the mutex).
        if value != self.last.swap(value, Ordering::Relaxed) {
            *since = now;
            // SYNC POINT (liveness): Relaxed, under the `since` lock.
            self.still_ticks.store(0, Ordering::Relaxed);
            return;
        }
        // SYNC POINT (liveness): Relaxed, under the `since` lock.
        let ticks = self.still_ticks.fetch_add(1, Ordering::Relaxed) + 1;
        if ticks >= DEAD_TICKS && now.duration_since(*since) >= dead_after() {
            // SYNC POINT (liveness): Release pairs with the Acquire load in `dead`.
            self.dead.store(true, Ordering::Release);
        }
    }

    /// Whether the peer was found dead.
    pub(crate) fn dead(&self) -> bool {
        // SYNC POINT (liveness): Acquire pairs with the Release store in `observe`.
        self.dead.load(Ordering::Acquire)
    }
}

/// Samples a counter until it moves (alive) or [`dead_after`] passes (stale), for the
/// rare decisions taken without a ticker: reclaiming a stale table entry.
pub(crate) fn is_stale(counter: &AtomicU64) -> bool {
    stale(&[counter])[0]
}

/// Which of `counters` stand still for the death bound, all sampled over the same
/// interval (one wait, however many entries a full table makes us look at).
pub(crate) fn stale(counters: &[&AtomicU64]) -> Vec<bool> {
    // SYNC POINT (heartbeat): Acquire pairs with the Release `fetch_add` of the beating
    // side (`ListenShared::tick`, the connection's beat in conn.rs); only a change is
    // looked at.
    let first: Vec<u64> = counters.iter().map(|c| c.load(Ordering::Acquire)).collect();
    let mut moved = vec![false; counters.len()];
    let start = Instant::now();
    let bound = dead_after() + TICK * DEAD_TICKS;
    while start.elapsed() < bound && !moved.iter().all(|&m| m) {
        std::thread::sleep(TICK);
        for (i, c) in counters.iter().enumerate() {
            // SYNC POINT (heartbeat): Acquire, as the first sample above.
            moved[i] |= c.load(Ordering::Acquire) != first[i];
        }
    }
    moved.into_iter().map(|m| !m).collect()
}

/// Waiting without a doorbell: spin briefly, then sleep with a growing (bounded) pause.
pub(crate) struct Backoff {
    spins: u32,
    pause: Duration,
}

/// Polls of the spin phase.
const SPINS: u32 = 2_000;
/// First sleep.
const FIRST_PAUSE: Duration = Duration::from_micros(20);
/// Longest sleep: an idle waiter wakes about 1,000 times a second.
pub(crate) const MAX_PAUSE: Duration = Duration::from_millis(1);

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff {
            spins: 0,
            pause: FIRST_PAUSE,
        }
    }

    /// One wait step: a spin, or (after the spin phase) `arm`, then a sleep in `ppoll` on
    /// `flag` for the current pause. `arm` clears the flag and asks the ticker to set it
    /// when what the caller waits on changes, so the sleep ends at that tick or at the
    /// pause, whichever comes first.
    pub(crate) fn snooze(&mut self, flag: &EventFlag, arm: impl FnOnce()) {
        if self.spins < SPINS {
            self.spins += 1;
            std::hint::spin_loop();
            if self.spins % 64 == 0 {
                std::thread::yield_now();
            }
            return;
        }
        arm();
        // Any result is fine: the caller re-checks its condition.
        let _ = crate::sys::poll_for(flag.fd(), crate::sys::Interest::READABLE, self.pause);
        self.pause = (self.pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_fits_and_is_bounded() {
        assert_eq!(HEADER_LEN % 4096, 0);
        assert!(ring_size(MIN_REGION - 1).is_none());
        assert_eq!(ring_size(MIN_REGION), Some(MIN_RING));
        for mib in [16usize, 64, 256, 1024] {
            let len = mib << 20;
            let r = ring_size(len).unwrap();
            assert!(r.is_power_of_two() && r <= MAX_RING);
            assert!(HEADER_LEN + 2 * SLOTS * r <= len, "{mib} MiB");
        }
        assert_eq!(ring_size(64 << 20), Some(256 << 10));
        assert_eq!(ring_size(16 << 20), Some(64 << 10));
    }
}
