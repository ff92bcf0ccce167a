//! `shmlink vm-host`: the doorbell server of the `vm:` transport, a daemon of its own.
//!
//! QEMU's `ivshmem-doorbell` devices (`-chardev socket,path=…`) and the host processes
//! that use `vm:` on a region connect to it; it owns the region (a file it creates if
//! missing), gives every peer its id, the region's descriptor and everybody's eventfds,
//! and announces arrivals and departures. The protocol (QEMU's
//! docs/specs/ivshmem-spec.rst) and the peers' side of it are described in the library's
//! `transport/vm/bell.rs`; docs/vms.md tells how to run it.
//!
//! A crate of its own so that the library's API carries no daemon. It needs two things of
//! the library's internals, reached through the hidden `shmlink::vm_host_hooks`: the
//! region file's trust policy (who may own the file and connect, and how a new file is
//! created) and the protocol's constants shared with the peers (version, vectors, ids,
//! the smallest region). The command-line front end is `shmlink vm-host`
//! (crates/shmlink-cli/src/vm_host.rs); the library's `vm:` tests run the server
//! in-process.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use shmlink::vm_host_hooks::{
    create_or_open_region, RegionPolicy as Policy, MAX_ID, MAX_VECTORS, MIN_REGION,
    PROTOCOL_VERSION,
};
use shmlink::{Error, ErrorKind, Result};
use shmlink_sys::eventfd::create as eventfd;
use shmlink_sys::Interest;

/// Most peers a [`VmHost`] serves at once by default.
pub const DEFAULT_MAX_PEERS: usize = 64;
/// How long the server waits for a peer to take a message before dropping it.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// Sends one protocol message (with at most one descriptor), waiting at most
/// [`SEND_TIMEOUT`] for room.
fn send_msg(sock: BorrowedFd<'_>, v: i64, fd: Option<RawFd>) -> io::Result<()> {
    let bytes = v.to_le_bytes();
    let fds: Vec<RawFd> = fd.into_iter().collect();
    let deadline = Instant::now() + SEND_TIMEOUT;
    loop {
        match shmlink_sys::socket::send_with_fds(sock, &bytes, &fds) {
            Ok(8) => return Ok(()),
            // A stream socket takes all 8 bytes or none when it has room; a partial
            // send would desynchronize the peer: treat it as a broken peer.
            Ok(_) => return Err(io::Error::new(io::ErrorKind::WriteZero, "partial send")),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the peer takes no messages",
                    ));
                }
                let _ = shmlink_sys::poll_for(sock, Interest::WRITABLE, Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}

struct Peer {
    id: u16,
    sock: UnixStream,
    fds: Vec<OwnedFd>,
}

/// What [`VmHost::serve`] did, for logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostEvent {
    /// A peer joined with this id.
    Joined(u16),
    /// A peer left (its socket closed).
    Left(u16),
    /// A peer was dropped: it wrote to the socket (peers never do), or took no messages.
    Dropped(u16, String),
    /// A connection was refused: the table of peers is full.
    Refused(String),
}

/// `shmlink vm-host`: the server QEMU's `ivshmem-doorbell` (`-chardev socket,path=…`)
/// and host processes connect to. It owns the region (a file it creates if missing),
/// gives every peer its id, the region's descriptor and everybody's eventfds, and
/// announces arrivals and departures (module docs, docs/vms.md).
pub struct VmHost {
    listener: UnixListener,
    socket: PathBuf,
    region: std::fs::File,
    vectors: u32,
    max_peers: usize,
    peers: Vec<Peer>,
    /// Who may own the region and connect (uids, the sharing group).
    policy: Policy,
    /// Where the search for a free id starts: ids go round 0..65,535 rather than
    /// reusing the lowest free one, as QEMU's own ivshmem-server does. QEMU (7.2's
    /// `close_peer_eventfds`) frees a departed peer's eventfd array but keeps the pointer,
    /// so a new peer that gets a departed peer's id makes every other QEMU write to freed
    /// memory (seen: `malloc(): unsorted double linked list corrupted`, QEMU aborts).
    next_id: usize,
}

impl VmHost {
    /// Creates (or opens) the region file at `region` with `size` bytes (an existing file
    /// keeps its size if it is at least as large) and listens on `socket` (a stale socket
    /// file nobody listens on is replaced). `vectors`: eventfds per peer (QEMU's
    /// `vectors=`, 1–64). [`bind_with`](Self::bind_with) with the default options.
    pub fn bind(socket: &Path, region: &Path, size: u64, vectors: u32) -> Result<VmHost> {
        VmHost::bind_with(socket, region, size, vectors, &shmlink::Options::default())
    }

    /// [`bind`](Self::bind) with options: the region file is created with
    /// `O_CREAT | O_EXCL | O_NOFOLLOW` and mode `0600`, or `0660` and the group
    /// [`Options::vm_region_group`](shmlink::Options::vm_region_group) names; an existing one
    /// is used only if it is a regular file owned by this uid, root or an
    /// [`Options::expect_uids`](shmlink::Options::expect_uids) uid, with no permission for
    /// others (nor for group unless it is that group), in a directory nobody else can
    /// replace it in — otherwise the error says which of these failed. The socket gets the
    /// same mode and group, and admits only peers of a trusted uid (with a group named,
    /// the socket's mode is the gate).
    pub fn bind_with(
        socket: &Path,
        region: &Path,
        size: u64,
        vectors: u32,
        opts: &shmlink::Options,
    ) -> Result<VmHost> {
        let policy = Policy::of(opts);
        if vectors == 0 || vectors > MAX_VECTORS {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("vm-host: vectors must be 1..={MAX_VECTORS}, not {vectors}"),
            ));
        }
        if !size.is_power_of_two() || size < MIN_REGION as u64 {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "vm-host: the region size must be a power of two (QEMU's rule) of at least {} bytes, not {size}",
                    MIN_REGION
                ),
            ));
        }
        let (file, _created) = create_or_open_region(region, &policy)?;
        let have = file
            .metadata()
            .map_err(|e| Error::io("vm-host: region size", e))?
            .len();
        if have < size {
            file.set_len(size)
                .map_err(|e| Error::io(format!("vm-host: sizing {}", region.display()), e))?;
        }
        if socket.exists() {
            if UnixStream::connect(socket).is_ok() {
                return Err(Error::new(
                    ErrorKind::AddrInUse,
                    format!("vm-host: a server already listens on {}", socket.display()),
                ));
            }
            let _ = std::fs::remove_file(socket);
        }
        let listener = UnixListener::bind(socket)
            .map_err(|e| Error::io(format!("vm-host: binding {}", socket.display()), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("vm-host: non-blocking listener", e))?;
        // Whoever can connect gets the region's descriptor: the socket is as private as
        // the region file.
        let restrict = || -> io::Result<()> {
            use std::os::unix::fs::PermissionsExt;
            if let Some(gid) = policy.gid() {
                std::os::unix::fs::chown(socket, None, Some(gid))?;
            }
            std::fs::set_permissions(
                socket,
                std::fs::Permissions::from_mode(policy.create_mode()),
            )
        };
        restrict().map_err(|e| {
            let _ = std::fs::remove_file(socket);
            Error::io(format!("vm-host: mode of {}", socket.display()), e)
        })?;
        Ok(VmHost {
            listener,
            socket: socket.to_path_buf(),
            region: file,
            vectors,
            max_peers: DEFAULT_MAX_PEERS,
            peers: Vec::new(),
            policy,
            next_id: 0,
        })
    }

    /// Changes the most peers served at once (1 – 65,535; beyond it connections are
    /// closed at once).
    pub fn set_max_peers(&mut self, n: usize) {
        self.max_peers = n.clamp(1, MAX_ID);
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The ids of the peers connected now.
    pub fn peer_ids(&self) -> Vec<u16> {
        self.peers.iter().map(|p| p.id).collect()
    }

    /// Serves until `stop` is set (checked at least every 100 ms), reporting each event
    /// to `log`.
    pub fn serve(&mut self, stop: &AtomicBool, mut log: impl FnMut(&HostEvent)) -> Result<()> {
        // SYNC POINT (host stop): Relaxed: the caller's stop flag orders no data; its store
        // is the other half, seen within one step.
        while !stop.load(Ordering::Relaxed) {
            for e in self.step(Duration::from_millis(100))? {
                log(&e);
            }
        }
        Ok(())
    }

    /// Waits up to `timeout` for something to do and does it: accepts new peers,
    /// notices departures and misbehaving peers.
    pub fn step(&mut self, timeout: Duration) -> Result<Vec<HostEvent>> {
        let watched: Vec<BorrowedFd<'_>> = std::iter::once(self.listener.as_fd())
            .chain(self.peers.iter().map(|p| p.sock.as_fd()))
            .collect();
        let mut events = Vec::new();
        let fds = match shmlink_sys::poll_many(&watched, Interest::READABLE, Some(timeout)) {
            Ok(fds) => fds,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(events),
            Err(e) => return Err(Error::io("vm-host: poll", e)),
        };
        // Peers first (their indexes are those of this poll), then new ones.
        let mut gone: Vec<(u16, Option<String>)> = Vec::new();
        for (i, p) in fds.iter().enumerate().skip(1) {
            if !p.is_ready() {
                continue;
            }
            let peer = &self.peers[i - 1];
            // Peers never write: any byte (or descriptor) is a broken or hostile peer.
            let mut buf = [0u8; 64];
            let mut fds = Vec::new();
            match shmlink_sys::socket::recv_with_fds(peer.sock.as_fd(), &mut buf, &mut fds) {
                Ok(0) => gone.push((peer.id, None)),
                Ok(n) => {
                    let mut first = [0u8; 8];
                    first[..n.min(8)].copy_from_slice(&buf[..n.min(8)]);
                    gone.push((
                        peer.id,
                        Some(format!(
                            "wrote {n} bytes ({:#x}…) and {} descriptors: peers never write",
                            i64::from_le_bytes(first),
                            fds.len()
                        )),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if p.is_read_closed() || p.is_error() {
                        gone.push((peer.id, None));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => gone.push((peer.id, None)),
                Err(e) => gone.push((peer.id, Some(format!("bad input: {e}")))),
            }
        }
        for (id, why) in gone {
            self.remove(id, &mut events);
            events.push(match why {
                None => HostEvent::Left(id),
                Some(w) => HostEvent::Dropped(id, w),
            });
        }
        if fds[0].is_ready() {
            loop {
                match self.listener.accept() {
                    Ok((sock, _)) => self.admit(sock, &mut events),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        // EMFILE and the like: refuse this round, keep serving.
                        events.push(HostEvent::Refused(format!("accept: {e}")));
                        break;
                    }
                }
            }
        }
        Ok(events)
    }

    /// Removes peer `id` and tells the others; peers that cannot be told are removed too.
    fn remove(&mut self, id: u16, events: &mut Vec<HostEvent>) {
        let Some(i) = self.peers.iter().position(|p| p.id == id) else {
            return;
        };
        self.peers.remove(i);
        let mut broken = Vec::new();
        for p in &self.peers {
            if send_msg(p.sock.as_fd(), id as i64, None).is_err() {
                broken.push(p.id);
            }
        }
        for b in broken {
            self.remove(b, events);
            events.push(HostEvent::Dropped(b, "took no messages".into()));
        }
    }

    fn admit(&mut self, sock: UnixStream, events: &mut Vec<HostEvent>) {
        // A peer gets the region's descriptor: only trusted uids (or, with a sharing
        // group, whoever the socket's mode let in).
        if self.policy.gid().is_none() {
            match shmlink_sys::socket::peer_cred(sock.as_fd()) {
                Ok(c) if self.policy.trusts(c.uid) => {}
                Ok(c) => {
                    events.push(HostEvent::Refused(format!(
                        "uid {} may not use the region (trusted: {})",
                        c.uid,
                        self.policy.trusted_text()
                    )));
                    return;
                }
                Err(e) => {
                    events.push(HostEvent::Refused(format!("SO_PEERCRED: {e}")));
                    return;
                }
            }
        }
        if self.peers.len() >= self.max_peers {
            events.push(HostEvent::Refused(format!(
                "{} peers already (the most this server takes)",
                self.max_peers
            )));
            return; // dropping the socket closes it: QEMU reports the failure
        }
        let Some(id) = (0..MAX_ID)
            .map(|k| (self.next_id + k) % MAX_ID)
            .find(|&i| !self.peers.iter().any(|p| p.id as usize == i))
            .map(|i| i as u16)
        else {
            return;
        };
        self.next_id = (id as usize + 1) % MAX_ID;
        let fds: io::Result<Vec<OwnedFd>> = (0..self.vectors).map(|_| eventfd()).collect();
        let fds = match fds {
            Ok(f) => f,
            Err(e) => {
                events.push(HostEvent::Refused(format!("eventfd: {e}")));
                return;
            }
        };
        let _ = sock.set_nonblocking(true);
        let s = sock.as_fd();
        let setup = || -> io::Result<()> {
            send_msg(s, PROTOCOL_VERSION, None)?;
            send_msg(s, id as i64, None)?;
            send_msg(s, -1, Some(self.region.as_raw_fd()))?;
            for p in &self.peers {
                for f in &p.fds {
                    send_msg(s, p.id as i64, Some(f.as_raw_fd()))?;
                }
            }
            for f in &fds {
                send_msg(s, id as i64, Some(f.as_raw_fd()))?;
            }
            Ok(())
        };
        if let Err(e) = setup() {
            events.push(HostEvent::Refused(format!("setup of peer {id}: {e}")));
            return;
        }
        let mut broken = Vec::new();
        for p in &self.peers {
            for f in &fds {
                if send_msg(p.sock.as_fd(), id as i64, Some(f.as_raw_fd())).is_err() {
                    broken.push(p.id);
                    break;
                }
            }
        }
        self.peers.push(Peer { id, sock, fds });
        events.push(HostEvent::Joined(id));
        for b in broken {
            self.remove(b, events);
            events.push(HostEvent::Dropped(b, "took no messages".into()));
        }
    }
}

impl Drop for VmHost {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}
