//! The `shm:` transport: a sealed memfd per connection holding two SPSC rings, handed
//! over a Unix `SOCK_SEQPACKET` rendezvous socket that stays open for doorbells and
//! liveness (DESIGN §3–5).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::addr::{Address, UnixName};
use crate::error::{Error, ErrorKind, Result};
use crate::options::{Options, WaitPolicy, MAX_RING_SIZE, MIN_RING_SIZE};
use crate::sys::{self, socket, Epoll};
use crate::transport::{ConnOps, ListenerOps, Transport};

mod conn;
pub(crate) mod handshake;
pub(crate) mod segment;

use crate::ring::FenceMode;

pub(crate) use conn::{Setup, ShmConn};
use handshake::{Packet, Params, RefuseCode, FEATURE_ASYM_FENCE, MAX_PACKET};
use segment::{Segment, C2S, S2C};

pub(crate) const TRANSPORT: Transport = Transport {
    name: "shm",
    connect,
    bind,
};

/// Most clients that may sit between connect and hello at once; the oldest is dropped
/// beyond this, so a flood of silent clients cannot exhaust descriptors.
const MAX_PENDING: usize = 128;
const LISTEN_TOKEN: u64 = u64::MAX;

fn socket_of(addr: &Address) -> &UnixName {
    match addr {
        Address::Shm { socket, .. } => socket,
        _ => unreachable!("the registry only hands shm: addresses to the shm transport"),
    }
}

fn valid_ring(size: u64) -> bool {
    size.is_power_of_two()
        && (MIN_RING_SIZE as u64..=MAX_RING_SIZE as u64).contains(&size)
        && size as usize % sys::page_size() == 0
}

/// The features this side offers. The asymmetric fence moves the cost of ordering from
/// every message to every park, where it is a `membarrier` that interrupts each CPU
/// running a registered process: worth it when parks are rare (the wait policy spins
/// first), not with the blocking policy, whose every wait parks and whose system calls
/// per message dwarf a fence anyway.
fn own_features(opts: &Options) -> u64 {
    if opts.wait != WaitPolicy::BLOCKING && sys::membarrier_register() {
        FEATURE_ASYM_FENCE
    } else {
        0
    }
}

fn fence_mode(features: u64) -> FenceMode {
    if features & FEATURE_ASYM_FENCE != 0 {
        FenceMode::Asymmetric
    } else {
        FenceMode::Symmetric
    }
}

fn connect(addr: &Address, opts: &Options) -> Result<Box<dyn ConnOps>> {
    // Before connecting: registering can take milliseconds in a multi-threaded process,
    // which must not eat into the listener's handshake window.
    let offered = own_features(opts);
    let deadline = Instant::now() + opts.connect_timeout;
    let sock = socket::connect(socket_of(addr), deadline).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => Error::new(
            ErrorKind::ConnectionRefused,
            format!("no listener at {addr} ({e})"),
        ),
        _ => Error::io("rendezvous socket", e),
    })?;
    let hello = Packet::Hello(Params {
        features: offered,
        ring_c2s: opts.ring_size as u64,
        ring_s2c: opts.ring_size as u64,
        max_msg: opts.max_msg_size as u64,
    });
    socket::send(sock.as_fd(), &hello.encode()).map_err(|e| Error::io("send hello", e))?;
    let mut buf = [0u8; MAX_PACKET];
    let mut fds = Vec::new();
    let n = socket::recv_until(sock.as_fd(), &mut buf, &mut fds, deadline).map_err(|e| {
        if e.kind() == io::ErrorKind::TimedOut {
            Error::new(ErrorKind::TimedOut, "listener did not answer the handshake")
        } else {
            Error::io("receive handshake answer", e)
        }
    })?;
    if n == 0 {
        return Err(Error::new(
            ErrorKind::ConnectionRefused,
            "listener closed the connection during the handshake",
        ));
    }
    let params = match Packet::decode(&buf[..n])? {
        Packet::Accept(p) => p,
        Packet::Refuse(code, reason) => {
            return Err(Error::new(
                code.kind(),
                format!("refused by listener: {reason}"),
            ))
        }
        Packet::Hello(_) => return Err(Error::violation("listener answered with a hello")),
    };
    if !valid_ring(params.ring_c2s)
        || !valid_ring(params.ring_s2c)
        || params.ring_c2s > opts.ring_size as u64
        || params.ring_s2c > opts.ring_size as u64
    {
        return Err(Error::violation(format!(
            "listener chose ring sizes {} and {} (asked for at most {})",
            params.ring_c2s, params.ring_s2c, opts.ring_size
        )));
    }
    if params.features & !offered != 0 {
        return Err(Error::violation(format!(
            "listener chose features {:#x}, we offered {offered:#x}",
            params.features
        )));
    }
    let [memfd] = <[OwnedFd; 1]>::try_from(fds).map_err(|fds| {
        Error::violation(format!(
            "accept carried {} descriptors, expected 1",
            fds.len()
        ))
    })?;
    let seg = Segment::attach(&memfd, [params.ring_c2s as usize, params.ring_s2c as usize])?;
    let name = addr.to_string();
    Ok(Box::new(ShmConn::new(Setup {
        seg,
        tx_ring: C2S,
        rx_ring: S2C,
        fence: fence_mode(params.features),
        sock,
        wait: opts.wait,
        max_send: opts.max_msg_size.min(params.max_msg as usize),
        max_recv: opts.max_msg_size,
        local: name.clone(),
        peer: name,
    })))
}

/// A client between connect and a completed handshake.
struct Pending {
    sock: OwnedFd,
    deadline: Instant,
}

/// What a successful handshake set up on the listener's side.
struct Handshake {
    seg: Segment,
    memfd: OwnedFd,
    accept: Params,
    client_max_msg: u64,
}

/// A bound `shm:` listener.
pub(crate) struct ShmListener {
    listen: OwnedFd,
    /// Readable when the listening socket or a pending client is: the listener's fd.
    epoll: Epoll,
    pending: Vec<Pending>,
    opts: Options,
    addr: String,
    /// The socket file and its (device, inode), removed on drop if still ours.
    file: Option<(PathBuf, u64, u64)>,
    events: Vec<(u64, u32)>,
}

fn bind(addr: &Address, opts: &Options) -> Result<Box<dyn ListenerOps>> {
    let name = socket_of(addr);
    if let UnixName::Path(path) = name {
        prepare_path(addr, path)?;
    }
    let listen = socket::listen(name, 128).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            Error::new(ErrorKind::AddrInUse, format!("{addr} is already bound"))
        } else {
            Error::io("bind rendezvous socket", e)
        }
    })?;
    let file = match name {
        UnixName::Path(p) => {
            let m = std::fs::metadata(p).map_err(|e| Error::io("stat rendezvous socket", e))?;
            Some((p.clone(), m.dev(), m.ino()))
        }
        UnixName::Abstract(_) => None,
    };
    let epoll = Epoll::new().map_err(|e| Error::io("epoll", e))?;
    epoll
        .add(listen.as_raw_fd(), libc::EPOLLIN as u32, LISTEN_TOKEN)
        .map_err(|e| Error::io("epoll", e))?;
    Ok(Box::new(ShmListener {
        listen,
        epoll,
        pending: Vec::new(),
        opts: opts.clone(),
        addr: addr.to_string(),
        file,
        events: Vec::new(),
    }))
}

/// Creates the rendezvous directory (0700) for `shm:NAME` and removes a stale socket
/// file; a live listener on the path is `AddrInUse`.
fn prepare_path(addr: &Address, path: &std::path::Path) -> Result<()> {
    let in_default_dir = matches!(addr, Address::Shm { text, .. } if !text.starts_with('/'));
    if in_default_dir {
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| {
                    Error::io(format!("create rendezvous directory {}", dir.display()), e)
                })?;
        }
    }
    if std::fs::symlink_metadata(path).is_ok() {
        let probe = socket::connect(
            &UnixName::Path(path.to_path_buf()),
            Instant::now() + Duration::from_millis(100),
        );
        match probe {
            Ok(_) => {
                return Err(Error::new(
                    ErrorKind::AddrInUse,
                    format!("{addr}: a listener already serves {}", path.display()),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path)
                    .map_err(|e| Error::io(format!("remove stale socket {}", path.display()), e))?;
            }
            Err(_) => {} // let bind report what is wrong
        }
    }
    Ok(())
}

impl ShmListener {
    /// Accepts every client waiting in the backlog into `pending`.
    fn accept_backlog(&mut self) -> Result<()> {
        while let Some(sock) =
            socket::accept(self.listen.as_fd()).map_err(|e| Error::io("accept", e))?
        {
            if self.pending.len() >= MAX_PENDING {
                let old = self.pending.remove(0);
                let _ = self.epoll.delete(old.sock.as_raw_fd());
            }
            let fd = sock.as_raw_fd();
            self.epoll
                .add(fd, libc::EPOLLIN as u32, fd as u64)
                .map_err(|e| Error::io("epoll", e))?;
            self.pending.push(Pending {
                sock,
                deadline: Instant::now() + self.opts.handshake_timeout,
            });
        }
        Ok(())
    }

    /// Runs the handshake with pending client `i` if its hello has arrived. The client
    /// leaves `pending` unless it has not spoken yet.
    fn try_handshake(&mut self, i: usize) -> Option<Box<dyn ConnOps>> {
        let mut buf = [0u8; MAX_PACKET];
        let mut fds = Vec::new();
        let res = socket::recv_with_fds(self.pending[i].sock.as_fd(), &mut buf, &mut fds);
        if matches!(&res, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            return None;
        }
        let p = self.pending.swap_remove(i);
        let _ = self.epoll.delete(p.sock.as_raw_fd());
        let verdict = match res {
            Ok(0) => return None, // the client left
            Ok(n) => self.handshake(&p.sock, &buf[..n], fds.len()),
            // Truncated (oversized) packet or too many descriptors: tell the client why.
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                Err((RefuseCode::Protocol, format!("hello rejected: {e}")))
            }
            Err(_) => return None,
        };
        match verdict {
            Ok(h) => {
                let accept = Packet::Accept(h.accept).encode();
                socket::send_with_fds(p.sock.as_fd(), &accept, &[h.memfd.as_raw_fd()]).ok()?;
                Some(Box::new(ShmConn::new(Setup {
                    seg: h.seg,
                    tx_ring: S2C,
                    rx_ring: C2S,
                    fence: fence_mode(h.accept.features),
                    sock: p.sock,
                    wait: self.opts.wait,
                    max_send: h.client_max_msg.min(self.opts.max_msg_size as u64) as usize,
                    max_recv: self.opts.max_msg_size,
                    local: self.addr.clone(),
                    peer: self.addr.clone(),
                })))
            }
            Err((code, reason)) => {
                let _ = socket::send(p.sock.as_fd(), &Packet::Refuse(code, reason).encode());
                None
            }
        }
    }

    /// Checks a client's hello and credentials and sets up its segment.
    fn handshake(
        &self,
        sock: &OwnedFd,
        hello: &[u8],
        nfds: usize,
    ) -> std::result::Result<Handshake, (RefuseCode, String)> {
        if nfds != 0 {
            return Err((
                RefuseCode::Protocol,
                "hello must not carry descriptors".into(),
            ));
        }
        let want = match Packet::decode(hello) {
            Ok(Packet::Hello(p)) => p,
            Ok(_) => return Err((RefuseCode::Protocol, "expected a hello".into())),
            Err(e) if e.kind() == ErrorKind::VersionMismatch => {
                return Err((RefuseCode::Version, e.message().to_string()))
            }
            Err(e) => return Err((RefuseCode::Protocol, e.message().to_string())),
        };
        let cred = socket::peer_cred(sock.as_fd())
            .map_err(|e| (RefuseCode::Permission, format!("no peer credentials: {e}")))?;
        let me = sys::euid();
        if cred.uid != me && cred.uid != 0 {
            return Err((
                RefuseCode::Permission,
                format!(
                    "uid {} may not connect to {} (allowed: uid {me} and root)",
                    cred.uid, self.addr
                ),
            ));
        }
        if !valid_ring(want.ring_c2s) || !valid_ring(want.ring_s2c) {
            return Err((
                RefuseCode::Invalid,
                format!(
                    "ring sizes {} and {} invalid (powers of two in {MIN_RING_SIZE}..={MAX_RING_SIZE})",
                    want.ring_c2s, want.ring_s2c
                ),
            ));
        }
        let cap = self.opts.ring_size as u64;
        let accept = Params {
            features: want.features & own_features(&self.opts),
            ring_c2s: want.ring_c2s.min(cap),
            ring_s2c: want.ring_s2c.min(cap),
            max_msg: self.opts.max_msg_size as u64,
        };
        let (seg, memfd) = Segment::create([accept.ring_c2s as usize, accept.ring_s2c as usize])
            .map_err(|e| (RefuseCode::Resources, e.to_string()))?;
        Ok(Handshake {
            seg,
            memfd,
            accept,
            client_max_msg: want.max_msg,
        })
    }

    /// Drops clients that did not say hello in time.
    fn expire(&mut self, now: Instant) {
        let epoll = &self.epoll;
        self.pending.retain(|p| {
            let keep = p.deadline > now;
            if !keep {
                let _ = epoll.delete(p.sock.as_raw_fd());
            }
            keep
        });
    }
}

impl ListenerOps for ShmListener {
    fn accept(&mut self, blocking: bool) -> Result<Box<dyn ConnOps>> {
        loop {
            self.accept_backlog()?;
            let mut events = std::mem::take(&mut self.events);
            self.epoll
                .wait(Some(Instant::now()), &mut events)
                .map_err(|e| Error::io("epoll", e))?;
            let mut found = None;
            for &(token, _) in &events {
                if token == LISTEN_TOKEN || found.is_some() {
                    continue;
                }
                if let Some(i) = self
                    .pending
                    .iter()
                    .position(|p| p.sock.as_raw_fd() as u64 == token)
                {
                    found = self.try_handshake(i);
                }
            }
            self.events = events;
            if let Some(conn) = found {
                return Ok(conn);
            }
            let now = Instant::now();
            self.expire(now);
            if !blocking {
                return Err(Error::would_block());
            }
            let deadline = self.pending.iter().map(|p| p.deadline).min();
            self.epoll
                .wait(deadline, &mut self.events)
                .map_err(|e| Error::io("epoll", e))?;
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.epoll.fd()
    }

    fn local_addr(&self) -> String {
        self.addr.clone()
    }
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        if let Some((path, dev, ino)) = &self.file {
            if let Ok(m) = std::fs::symlink_metadata(path) {
                if m.dev() == *dev && m.ino() == *ino {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
    }
}
