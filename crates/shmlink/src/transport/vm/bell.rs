//! Doorbells for `vm:`: QEMU's `ivshmem-doorbell` and the host server that hands out its
//! eventfds (`shmlink vm-host`, a crate of its own: crates/shmlink-vmhost), and the
//! waiting built on them.
//!
//! # The server's protocol (QEMU docs/specs/ivshmem-spec.rst, written from the spec)
//!
//! A Unix stream socket. Every message is one signed 64-bit little-endian integer, perhaps
//! with one descriptor (SCM_RIGHTS). To a peer that connects, the server sends: the
//! protocol version (0, no descriptor); the peer's id (no descriptor); -1 with the shared
//! memory's descriptor; then for every other peer already there, per vector, that peer's
//! id with one of its eventfds; then the new peer's own id once per vector with its own
//! eventfds. Every other peer gets the new peer's id once per vector with the new peer's
//! eventfds. When a peer's socket closes, every other peer gets its id without a
//! descriptor (it left). Peers never write to the socket.
//!
//! A peer rings peer `id` on vector `v` by writing 1 (u64) to that peer's eventfd `v`;
//! QEMU does it for its guest when the guest writes `id << 16 | v` to the Doorbell
//! register of BAR0, and turns a write to the guest's own eventfds into MSI-X interrupt
//! `v` in the guest.
//!
//! # Who is a peer
//!
//! Each QEMU, and each host process that uses `vm:` on a region whose server socket it
//! finds (`$SHMLINK_VM_BELL`, else `REGION.bell`): a host process speaks the same protocol
//! as QEMU and gets its own id and eventfd, so a ring wakes exactly the process that
//! sleeps. The server itself needs no id. A host process ignores the memory descriptor:
//! it maps the region by its path (the server creates the region as a file).
//!
//! # Guests
//!
//! A guest *rings* by writing the Doorbell register through sysfs (`resource0` next to
//! the region's `resource2`; no driver) and learns its id from IVPosition. A guest is
//! *rung* by MSI-X only (QEMU raises no INTx for `ivshmem-doorbell`, so `uio_pci_generic`
//! sees nothing), and the Debian 6.1 guest kernel has no `CONFIG_VFIO_NOIOMMU`: so a
//! guest can be rung when it runs with a virtual IOMMU (q35 + `intel-iommu`) and the
//! device is bound to `vfio-pci` (scripts/vm.sh does both). Then the first process that
//! opens the device through VFIO ([`crate::sys::vfio::MsixIrq`]) gets vector 0 as an
//! eventfd and sleeps on it as a host peer does; other processes of that guest (the group
//! is busy) and guests without VFIO sleep by bounded-backoff polling (docs/vms.md).
//!
//! # The slot's bell words
//!
//! Each side of a connection writes a word into the slot: whether it can be rung (and as
//! which id), and whether it can ring. A waiter announces sleep through the ring's own
//! protocol (`Consumer::arm`/`Producer::arm`: count, full fence, re-check) and sleeps
//! long only if it can be rung and the peer can ring; a side whose commit, release or
//! close finds an announcement (`commit`/`advance`/`close` return true) rings the id in
//! the peer's word. The word is read from shared memory: a bad one rings some peer id in
//! vain (a spurious wake-up), nothing else.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::sync::{AtomicBool, AtomicU64, Ordering};
use crate::sys::stream::EventFlag;
use crate::sys::Interest;

use super::file::Policy;

/// Bell word: the side can be rung, as the id in the low 16 bits.
pub(crate) const CAN_BE_RUNG: u32 = 1 << 31;
/// Bell word: the side rings its peer when it finds it asleep.
pub(crate) const CAN_RING: u32 = 1 << 30;

/// The protocol version the server (`shmlink vm-host`, crates/shmlink-vmhost) speaks and
/// peers accept.
pub const PROTOCOL_VERSION: i64 = 0;
/// Largest id QEMU accepts (`IVSHMEM_MAX_PEERS`).
pub const MAX_ID: usize = u16::MAX as usize;
/// Most vectors per peer.
pub const MAX_VECTORS: u32 = 64;

/// Writes 1 to an eventfd (a ring). Errors are ignored: a full counter is still set.
fn ring_fd(fd: BorrowedFd<'_>) {
    let _ = crate::sys::eventfd::ring(fd);
}

/// Reads an eventfd's counter (non-blocking): whether it was set.
fn drain_fd(fd: BorrowedFd<'_>) -> bool {
    crate::sys::eventfd::drain(fd).is_ok_and(|n| n > 0)
}

/// Waits until `fd` is ready for `interest` or `timeout` passes.
fn poll_one(fd: BorrowedFd<'_>, interest: Interest, timeout: Duration) -> bool {
    crate::sys::poll_for(fd, interest, timeout).unwrap_or(false)
}

/// Reads protocol messages from a stream socket: whole 8-byte messages, each with the
/// descriptor that came with it (at most one; more is a protocol error).
pub(crate) struct MsgReader {
    buf: [u8; 8],
    have: usize,
    fds: Vec<OwnedFd>,
}

impl MsgReader {
    pub(crate) fn new() -> MsgReader {
        MsgReader {
            buf: [0; 8],
            have: 0,
            fds: Vec::new(),
        }
    }

    /// One message if one is complete: `Ok(None)` if more bytes are needed (would
    /// block), `Err(UnexpectedEof)` at the end of the stream.
    pub(crate) fn read(
        &mut self,
        sock: BorrowedFd<'_>,
    ) -> io::Result<Option<(i64, Option<OwnedFd>)>> {
        loop {
            let n = match crate::sys::socket::recv_with_fds(
                sock,
                &mut self.buf[self.have..],
                &mut self.fds,
            ) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "end of stream",
                ));
            }
            self.have += n;
            if self.fds.len() > 1 {
                self.fds.clear();
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "more than one descriptor with one message",
                ));
            }
            if self.have == 8 {
                self.have = 0;
                return Ok(Some((i64::from_le_bytes(self.buf), self.fds.pop())));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// A process's doorbell.

/// Counters of a process's doorbell on one region (tests and diagnostics).
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BellStats {
    /// Our peer id.
    pub id: u16,
    /// Whether we can be rung (a host peer of a live server, or a guest process that
    /// owns the device's MSI-X vector through VFIO).
    pub can_be_rung: bool,
    /// Rings sent to peers.
    pub rings: u64,
    /// Times our own eventfd woke the doorbell thread.
    pub wakes: u64,
}

enum Kind {
    /// A host process: a peer of the server.
    Host {
        /// Peer id → its vector 0 eventfd (ours included).
        peers: Mutex<Known>,
        own: OwnedFd,
    },
    /// A guest: the Doorbell register of BAR0, mapped through sysfs; and MSI-X vector 0
    /// as an eventfd if this process owns the device through VFIO.
    Guest {
        regs: crate::sys::memfd::Region,
        irq: Option<crate::sys::vfio::MsixIrq>,
    },
}

/// This process's doorbell on one region.
pub(crate) struct Bell {
    id: u16,
    kind: Kind,
    alive: AtomicBool,
    rings: AtomicU64,
    wakes: AtomicU64,
}

/// Bytes of BAR0 (ivshmem's registers) that a guest maps.
const REGS_LEN: usize = 256;
/// Byte offsets of the ivshmem registers in BAR0.
const IV_POSITION: usize = 8;
const DOORBELL: usize = 12;

impl Bell {
    /// Our bell word for a slot.
    pub(crate) fn word(&self) -> u32 {
        // SYNC POINT (bell alive): Acquire pairs with the Release stores of `false` in
        // `run`/`run_guest`: a dead bell is never offered in a new slot's bell word.
        if !self.alive.load(Ordering::Acquire) {
            return 0;
        }
        match self.kind {
            Kind::Host { .. } => CAN_BE_RUNG | CAN_RING | self.id as u32,
            Kind::Guest { irq: Some(_), .. } => CAN_BE_RUNG | CAN_RING | self.id as u32,
            Kind::Guest { irq: None, .. } => CAN_RING,
        }
    }

    /// Whether a waiter may sleep long, trusting to be rung.
    pub(crate) fn can_be_rung(&self) -> bool {
        matches!(
            self.kind,
            Kind::Host { .. } | Kind::Guest { irq: Some(_), .. } // SYNC POINT (bell alive): Acquire pairs with the Release stores of `false` in
                                                                 // `run`/`run_guest`, as in `word`.
        ) && self.alive.load(Ordering::Acquire)
    }

    /// Rings peer `id` on vector 0.
    pub(crate) fn ring(&self, id: u16) {
        // SYNC POINT (bell alive): Relaxed: a ring of a bell that just died is only a
        // spurious wake-up; the Release stores in `run`/`run_guest` are the other half.
        if !self.alive.load(Ordering::Relaxed) {
            return;
        }
        match &self.kind {
            Kind::Host { peers, .. } => {
                let p = peers.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(f) = p.first(id) {
                    ring_fd(f);
                }
            }
            // SAFETY: DOORBELL is inside the mapped BAR0 (REGS_LEN bytes, mapped as long
            // as the bell lives); a device register is written with one volatile 32-bit
            // store.
            Kind::Guest { regs, .. } => unsafe {
                regs.base()
                    .cast::<u32>()
                    .add(DOORBELL / 4)
                    .write_volatile((id as u32) << 16)
            },
        }
        // SYNC POINT (bell counters): Relaxed: a statistic; `stats` reads it, no data
        // depends on it.
        self.rings.fetch_add(1, Ordering::Relaxed);
    }

    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    fn stats(&self) -> BellStats {
        BellStats {
            id: self.id,
            can_be_rung: self.can_be_rung(),
            // SYNC POINT (bell counters): Relaxed loads of the statistics `ring` and the
            // doorbell threads add to.
            rings: self.rings.load(Ordering::Relaxed),
            wakes: self.wakes.load(Ordering::Relaxed),
        }
    }

    /// A host peer: connects to the server at `sock_path`, checks who bound it, and reads
    /// the setup.
    fn host(sock_path: &Path, policy: &Policy) -> io::Result<Arc<Bell>> {
        let sock = UnixStream::connect(sock_path)?;
        // Whoever bound the socket hands us peer ids and descriptors: only a trusted uid
        // (as every client of the library checks its server).
        let cred = crate::sys::socket::peer_cred(sock.as_fd())?;
        if !policy.trusts(cred.uid) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "the doorbell server at {} runs as uid {}, which this side does not \
                     trust (trusted: {}); if it is genuine, list its uid with \
                     Options::expect_uids",
                    sock_path.display(),
                    cred.uid,
                    policy.trusted_text()
                ),
            ));
        }
        sock.set_nonblocking(true)?;
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut r = MsgReader::new();
        let mut next = || -> io::Result<(i64, Option<OwnedFd>)> {
            loop {
                if let Some(m) = r.read(sock.as_fd())? {
                    return Ok(m);
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "setup incomplete"));
                }
                poll_one(sock.as_fd(), Interest::READABLE, left);
            }
        };
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let (v, f) = next()?;
        if v != PROTOCOL_VERSION || f.is_some() {
            return Err(bad(format!(
                "protocol version {v}, expected {PROTOCOL_VERSION}"
            )));
        }
        let (id, f) = next()?;
        if !(0..MAX_ID as i64).contains(&id) || f.is_some() {
            return Err(bad(format!("peer id {id} out of range")));
        }
        let id = id as u16;
        let (m, shm) = next()?;
        if m != -1 || shm.is_none() {
            return Err(bad(format!("expected the memory descriptor (-1), got {m}")));
        }
        drop(shm); // we map the region by its path
        let mut peers = Known::default();
        // Other peers' eventfds, then ours: until our first.
        let own = loop {
            let (p, f) = next()?;
            if !(0..MAX_ID as i64).contains(&p) {
                return Err(bad(format!("peer id {p} out of range")));
            }
            let p = p as u16;
            match f {
                Some(f) if p == id => break f,
                Some(f) => {
                    if let Err(why) = peers.add(p, f) {
                        return Err(bad(why));
                    }
                }
                None => peers.remove(p),
            }
        };
        let own2 = own.try_clone()?;
        if let Err(why) = peers.add(id, own2) {
            return Err(bad(why));
        }
        let bell = Arc::new(Bell {
            id,
            kind: Kind::Host {
                peers: Mutex::new(peers),
                own,
            },
            alive: AtomicBool::new(true),
            rings: AtomicU64::new(0),
            wakes: AtomicU64::new(0),
        });
        let b = bell.clone();
        std::thread::Builder::new()
            .name("shmlink-vm-bell".into())
            .spawn(move || b.run(sock, r))?;
        Ok(bell)
    }

    /// The doorbell thread of a host peer: wakes waiters on a ring, follows the server's
    /// announcements; when the server goes, the bell dies (waiters poll again).
    fn run(&self, sock: UnixStream, mut r: MsgReader) {
        let Kind::Host { peers, own } = &self.kind else {
            return;
        };
        loop {
            let Ok(fds) =
                crate::sys::poll_many(&[own.as_fd(), sock.as_fd()], Interest::READABLE, None)
            else {
                continue; // EINTR
            };
            if fds[0].is_ready() && drain_fd(own.as_fd()) {
                // SYNC POINT (bell counters): Relaxed: a statistic `stats` reads; the wake
                // itself is `poke_all`.
                self.wakes.fetch_add(1, Ordering::Relaxed);
                super::region::poke_all();
            }
            if fds[1].is_ready() {
                loop {
                    match r.read(sock.as_fd()) {
                        Ok(None) => break,
                        Ok(Some((p, f))) if (0..MAX_ID as i64).contains(&p) => {
                            let mut t = peers.lock().unwrap_or_else(|p| p.into_inner());
                            let sane = match f {
                                Some(f) => t.add(p as u16, f).is_ok(),
                                None => {
                                    if p as u16 != self.id {
                                        t.remove(p as u16);
                                    }
                                    true
                                }
                            };
                            if !sane {
                                // More peers or vectors than the region needs: distrust the
                                // server and close every descriptor it gave.
                                *t = Known::default();
                                drop(t);
                                // SYNC POINT (bell alive): Release pairs with the Acquire
                                // loads in `word`, `can_be_rung` and `for_region`: whoever
                                // sees the bell dead sees the peer table cleared.
                                self.alive.store(false, Ordering::Release);
                                super::region::poke_all();
                                return;
                            }
                            drop(t);
                        }
                        // Out of range or a broken socket: the server is gone or
                        // confused; stop trusting it.
                        _ => {
                            // SYNC POINT (bell alive): Release pairs with the Acquire loads
                            // in `word`, `can_be_rung` and `for_region`.
                            self.alive.store(false, Ordering::Release);
                            super::region::poke_all();
                            return;
                        }
                    }
                }
            }
        }
    }

    /// A guest: BAR0 of the ivshmem device whose BAR2 is `resource2`, if it is an
    /// `ivshmem-doorbell` (it has the MSI-X BAR1).
    fn guest(resource2: &Path) -> io::Result<Option<Arc<Bell>>> {
        let dir = resource2.parent().unwrap_or(Path::new("/"));
        if !dir.join("resource1").exists() {
            return Ok(None); // ivshmem-plain: no doorbell
        }
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.join("resource0"))?;
        // ivshmem's register BAR is 256 bytes, mapped shared.
        let regs = crate::sys::memfd::Region::map(f.as_fd(), REGS_LEN, true)?;
        // SAFETY: IV_POSITION is inside the mapping; a register read is volatile.
        let pos = unsafe {
            regs.base()
                .cast::<u32>()
                .add(IV_POSITION / 4)
                .read_volatile()
        } as i32;
        if !(0..MAX_ID as i32).contains(&pos) {
            return Ok(None); // dropping `regs` unmaps it
        }
        let irq = match crate::sys::vfio::MsixIrq::open(dir, 0) {
            Ok(irq) => Some(irq),
            Err(e) => {
                // Not bound to vfio-pci (no virtual IOMMU: the documented old machine) is
                // quiet; anything else, e.g. a second process of this guest while the
                // first owns the device (EBUSY), is said once.
                if e.kind() != io::ErrorKind::NotFound || verbose() {
                    eprintln!(
                        "shmlink: vm: guest doorbell interrupts unavailable ({e}); this \
                         process waits by polling (docs/vms.md)"
                    );
                }
                None
            }
        };
        let has_irq = irq.is_some();
        let bell = Arc::new(Bell {
            id: pos as u16,
            kind: Kind::Guest { regs, irq },
            alive: AtomicBool::new(true),
            rings: AtomicU64::new(0),
            wakes: AtomicU64::new(0),
        });
        if has_irq {
            let b = bell.clone();
            std::thread::Builder::new()
                .name("shmlink-vm-irq".into())
                .spawn(move || b.run_guest())?;
        }
        Ok(Some(bell))
    }

    /// The interrupt thread of a guest that owns the device: every MSI-X interrupt
    /// (a peer rang our id) wakes the waiters, as a host peer's eventfd does.
    fn run_guest(&self) {
        let Kind::Guest { irq: Some(irq), .. } = &self.kind else {
            return;
        };
        loop {
            let ready = match crate::sys::poll_many(&[irq.eventfd()], Interest::READABLE, None) {
                Ok(fds) => fds[0].is_ready(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // The eventfd broke: stop trusting it, waiters poll again.
                    // SYNC POINT (bell alive): Release pairs with the Acquire loads in
                    // `word`, `can_be_rung` and `for_region`.
                    self.alive.store(false, Ordering::Release);
                    super::region::poke_all();
                    return;
                }
            };
            if ready && drain_fd(irq.eventfd()) {
                // SYNC POINT (bell counters): Relaxed: a statistic `stats` reads.
                self.wakes.fetch_add(1, Ordering::Relaxed);
                super::region::poke_all();
            }
        }
    }
}

/// `$SHMLINK_VM_BELL_VERBOSE` set: say why a guest process has no doorbell interrupts
/// even when the device is simply not bound to vfio-pci.
fn verbose() -> bool {
    std::env::var_os("SHMLINK_VM_BELL_VERBOSE").is_some()
}

/// Most peers a host process keeps an eventfd for: every party on a region holds a
/// listener entry or one end of a connection slot, so a region has no use for more peer
/// ids than that; a server that announces more is not trusted (it would exhaust our
/// descriptors).
const MAX_KNOWN_PEERS: usize = super::region::LISTENERS + 2 * super::region::SLOTS;

/// The peers a host process's doorbell knows: of each, the eventfd of vector 0 (the only
/// one `vm:` rings) and how many vectors the server announced. Further vectors' eventfds
/// are closed as they arrive, so at most [`MAX_KNOWN_PEERS`] descriptors are held, and a
/// server that announces more peers, or more than [`MAX_VECTORS`] vectors for a peer, is
/// refused (its descriptors all closed).
#[derive(Default)]
struct Known(HashMap<u16, (OwnedFd, u32)>);

impl Known {
    /// Records one of peer `id`'s eventfds; an error if the server announces more peers
    /// or vectors than the region can need.
    fn add(&mut self, id: u16, fd: OwnedFd) -> std::result::Result<(), String> {
        let n = self.0.len();
        match self.0.entry(id) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let vectors = &mut e.get_mut().1;
                if *vectors >= MAX_VECTORS {
                    return Err(format!(
                        "the doorbell server announced more than {MAX_VECTORS} vectors for peer {id}"
                    ));
                }
                *vectors += 1;
                drop(fd); // vm: rings vector 0 only
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                if n >= MAX_KNOWN_PEERS {
                    return Err(format!(
                        "the doorbell server announced more than {MAX_KNOWN_PEERS} peers, \
                         more than a region of {} listeners and {} slots has parties",
                        super::region::LISTENERS,
                        super::region::SLOTS
                    ));
                }
                e.insert((fd, 1));
            }
        }
        Ok(())
    }

    fn remove(&mut self, id: u16) {
        self.0.remove(&id);
    }

    /// Peer `id`'s vector 0.
    fn first(&self, id: u16) -> Option<BorrowedFd<'_>> {
        self.0.get(&id).map(|(f, _)| f.as_fd())
    }
}

type Bells = Mutex<HashMap<PathBuf, Option<Arc<Bell>>>>;

fn bells() -> &'static Bells {
    static B: OnceLock<Bells> = OnceLock::new();
    B.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The server socket for a host region: `$SHMLINK_VM_BELL`, else `REGION.bell` if it
/// exists.
fn socket_for(region: &Path) -> Option<PathBuf> {
    if let Some(s) = std::env::var_os("SHMLINK_VM_BELL").filter(|s| !s.is_empty()) {
        return Some(PathBuf::from(s));
    }
    let mut s = region.as_os_str().to_owned();
    s.push(".bell");
    let s = PathBuf::from(s);
    s.exists().then_some(s)
}

/// This process's doorbell for the region at `path`, if it has one (found once per
/// region and process; a dead one is looked for again).
pub(crate) fn for_region(path: &Path, policy: &Policy) -> Option<Arc<Bell>> {
    if std::env::var_os("SHMLINK_VM_NO_BELL").is_some() {
        return None;
    }
    let mut t = bells().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = t.get(path) {
        match b {
            // SYNC POINT (bell alive): Acquire pairs with the Release stores of `false` in
            // `run`/`run_guest`: a dead bell is replaced.
            Some(b) if !b.alive.load(Ordering::Acquire) => {}
            other => return other.clone(),
        }
    }
    let b = if path.file_name().is_some_and(|n| n == "resource2") && path.starts_with("/sys") {
        Bell::guest(path).ok().flatten()
    } else {
        socket_for(path).and_then(|s| match Bell::host(&s, policy) {
            Ok(b) => Some(b),
            Err(e) => {
                if e.kind() != io::ErrorKind::NotFound || verbose() {
                    eprintln!(
                        "shmlink: vm: no doorbell from {} ({e}); this process waits by \
                         polling (docs/vms.md)",
                        s.display()
                    );
                }
                None
            }
        })
    };
    t.insert(path.to_path_buf(), b.clone());
    b
}

/// The counters of this process's doorbell on `region`, if it has one (connects to the
/// server the way its connections do).
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub fn bell_stats(region: &Path) -> Option<BellStats> {
    for_region(region, &Policy::default()).map(|b| b.stats())
}

/// Reads one protocol message from a stream socket, waiting at most `timeout` (tests:
/// a fake QEMU client). `Err(UnexpectedEof)` at the end of the stream, `Err(TimedOut)`.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub fn read_msg(sock: BorrowedFd<'_>, timeout: Duration) -> io::Result<(i64, Option<OwnedFd>)> {
    let deadline = Instant::now() + timeout;
    let mut r = MsgReader::new();
    loop {
        // Stream sockets here are non-blocking or polled first.
        if poll_one(
            sock,
            Interest::READABLE,
            deadline.saturating_duration_since(Instant::now()),
        ) {
            if let Some(m) = r.read(sock)? {
                return Ok(m);
            }
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no message"));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Waiting.

/// Spin polls before a blocked call sleeps: `$SHMLINK_VM_SPINS` (0 – 1,000,000), else
/// 2,000.
fn spins() -> u32 {
    static S: OnceLock<u32> = OnceLock::new();
    *S.get_or_init(|| {
        std::env::var("SHMLINK_VM_SPINS")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|&n| n <= 1_000_000)
            .unwrap_or(2_000)
    })
}

/// How long a waiter that will be rung sleeps at most: the ticker (5 ms) sets the
/// descriptor anyway when what it waits for changed, so this only bounds the cost of a
/// bell that died.
const RUNG_SLEEP: Duration = Duration::from_millis(100);
const FIRST_PAUSE: Duration = Duration::from_micros(20);

/// A blocked call's wait: spin, then announce (the caller's `arm`: count, fence,
/// re-check), then sleep on the descriptor: until rung (host peers with a ringing peer)
/// or for a pause growing from 20 µs to 1 ms (no doorbell).
pub(crate) struct Wait {
    spun: u32,
    pause: Duration,
    ready_in_a_row: u32,
}

impl Wait {
    pub(crate) fn new() -> Wait {
        Wait {
            spun: 0,
            pause: FIRST_PAUSE,
            ready_in_a_row: 0,
        }
    }

    /// One spin step if the spin phase is not over: true if it spun.
    pub(crate) fn spin(&mut self) -> bool {
        if self.spun >= spins() {
            return false;
        }
        self.spun += 1;
        std::hint::spin_loop();
        if self.spun % 64 == 0 {
            std::thread::yield_now();
        }
        true
    }

    /// Sleeps after the caller armed (announced and re-checked): `ready` is what the
    /// re-check found, `rung` whether a ring will come.
    pub(crate) fn sleep(&mut self, flag: &EventFlag, ready: bool, rung: bool) {
        if ready {
            // The re-check found what we wait for: go round without sleeping, unless it
            // keeps saying so without the caller's own check agreeing (a full ring whose
            // free bytes are split by the wrap), then a short sleep.
            self.ready_in_a_row += 1;
            if self.ready_in_a_row < 3 {
                return;
            }
        }
        self.ready_in_a_row = 0;
        let t = if rung && !ready {
            RUNG_SLEEP
        } else {
            let t = self.pause;
            self.pause = (self.pause * 2).min(super::region::MAX_PAUSE);
            t
        };
        // Any result is fine: the caller checks again.
        let _ = crate::sys::poll_for(flag.fd(), Interest::READABLE, t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::eventfd::create as eventfd;
    use std::os::fd::AsRawFd;

    #[test]
    fn reader_joins_split_messages_and_refuses_two_fds() {
        let (a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let mut r = MsgReader::new();
        // Half a message: nothing yet.
        crate::sys::socket::send_with_fds(a.as_fd(), &7i64.to_le_bytes()[..3], &[]).unwrap();
        assert!(r.read(b.as_fd()).unwrap().is_none());
        crate::sys::socket::send_with_fds(a.as_fd(), &7i64.to_le_bytes()[3..], &[]).unwrap();
        assert_eq!(r.read(b.as_fd()).unwrap().map(|m| m.0), Some(7));
        let e1 = eventfd().unwrap();
        let e2 = eventfd().unwrap();
        crate::sys::socket::send_with_fds(
            a.as_fd(),
            &1i64.to_le_bytes(),
            &[e1.as_raw_fd(), e2.as_raw_fd()],
        )
        .unwrap();
        assert_eq!(
            r.read(b.as_fd()).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        drop(a);
        let mut r = MsgReader::new();
        assert_eq!(
            r.read(b.as_fd()).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
}
