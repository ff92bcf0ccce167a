//! The `shm:` transport: two SPSC rings in two sealed memfds per connection, one per side,
//! each holding what only its creator writes and mapped read-only by the peer, exchanged
//! over a Unix `SOCK_SEQPACKET` rendezvous socket that stays open for doorbells and
//! liveness (docs/design.md §3–5).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use crate::addr::{Address, UnixName};
use crate::error::{Error, ErrorKind, Result};
use crate::options::{Options, WaitPolicy, MAX_RING_SIZE, MIN_RING_SIZE};
use crate::rendezvous::{bind_rendezvous, remove_socket_file, socket_of, SocketFile};
use crate::status::ProcessCred;
use crate::sys::socket::PeerCred;
use crate::sys::{self, socket, Epoll, Event, Interest};
use crate::transport::inproc::{self, Inbox};
use crate::transport::{Accepted, ConnOps, ListenerOps, Transport};
use crate::trust;

mod bell;
mod conn;
pub(crate) mod handshake;
mod registry;
pub(crate) mod segment;
pub(crate) mod tickets;

use crate::ring::FenceMode;

use bell::{ClientRing, PipeBell};
pub(crate) use conn::{Setup, ShmConn};
use handshake::{
    Packet, Params, RefuseCode, Token, FEATURE_ASYM_FENCE, FEATURE_PIPE_BELL, MAX_PACKET,
};
use registry::Registry;
use segment::{Half, Segment, Side};

pub(crate) const TRANSPORT: Transport = Transport {
    name: "shm",
    connect,
    bind,
};

/// Most clients that may sit between connect and hello at once; the oldest is dropped
/// beyond this, so a flood of silent clients cannot exhaust descriptors.
const MAX_PENDING: usize = 128;
const LISTEN_TOKEN: u64 = u64::MAX;
/// Most answer segments a listener keeps made ahead (design §5.1b). One is taken per
/// client; clients that connect back to back find the listener busy and take one each
/// before it next has nothing to do and refills the pool. Each costs a descriptor, two
/// mappings and two resident pages (its header and its ring's first page).
const MAX_SPARES: usize = 4;
/// The in-process inbox's eventfd in the listener's epoll set.
const INPROC_TOKEN: u64 = u64::MAX - 1;

/// Whether a handshake offers the asymmetric fence. Off: the kernel's global expedited
/// membarrier can pass over a CPU that runs the waker (a per-CPU copy of "runs a
/// registered process" left stale by registration while the CPU idled), and non-blocking
/// receivers then lost wake-ups (tests/conformance.rs `epoll_serves_64_connections`, 5 of
/// 20 runs; 0 of 10 with the waker's fence put back). docs/design.md §4.3 has the evidence.
const OFFER_ASYM_FENCE: bool = false;

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
///
/// Not offered for now ([`OFFER_ASYM_FENCE`]): under it, non-blocking receivers in event
/// loops lost wake-ups that the symmetric fence never loses (docs/design.md §4.3).
///
/// Doorbell pipes (`FEATURE_PIPE_BELL`, `bell.rs`) are offered unless the options say
/// the program closes descriptors it did not open (`Options::prepare_ahead(false)`, the
/// preload library's): a connection then keeps its one descriptor, the socket.
fn own_features(opts: &Options) -> u64 {
    let asym = OFFER_ASYM_FENCE && opts.wait != WaitPolicy::BLOCKING && sys::membarrier_register();
    let pipes = opts.prepare_ahead;
    (if pipes { FEATURE_PIPE_BELL } else { 0 }) | if asym { FEATURE_ASYM_FENCE } else { 0 }
}

/// Whether `e` says the process (`EMFILE`) or the system (`ENFILE`) has no descriptor
/// left.
fn is_fd_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(n) if n == sys::errno::EMFILE || n == sys::errno::ENFILE)
}

fn fence_mode(features: u64) -> FenceMode {
    if features & FEATURE_ASYM_FENCE != 0 {
        FenceMode::Asymmetric
    } else {
        FenceMode::Symmetric
    }
}

fn connect(addr: &Address, opts: &Options) -> Result<Box<dyn ConnOps>> {
    trust::check_addr_dir(addr, opts)?;
    if opts.in_process {
        let socket = socket_of(addr);
        if let Some(conn) = inproc::connect(&inproc_key(socket), || file_id(socket), opts) {
            return conn;
        }
    }
    client(
        socket_of(addr),
        &addr.to_string(),
        opts,
        Ask::Hello,
        Instant::now() + opts.connect_timeout,
    )
    .map(|(conn, _)| conn)
}

/// The key of a rendezvous socket in the table of in-process listeners.
fn inproc_key(socket: &UnixName) -> String {
    match socket {
        UnixName::Path(p) => format!("path:{}", p.display()),
        UnixName::Abstract(name) => format!("abstract:{name}"),
    }
}

/// What a socket path leads to now: its (device, inode); `None` for an abstract name
/// (or a path that leads nowhere, which then matches no file-bound listener).
fn file_id(socket: &UnixName) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    match socket {
        UnixName::Path(p) => std::fs::symlink_metadata(p)
            .ok()
            .map(|m| (m.dev(), m.ino())),
        UnixName::Abstract(_) => None,
    }
}

/// How a client asks a listener for a connection.
#[derive(Clone, Copy)]
pub(crate) enum Ask {
    /// A plain hello.
    Hello,
    /// `auto:`'s upgrade: the token it got over TCP, and the proof the listener must
    /// answer with.
    Upgrade(Token, Token),
    /// `auto:`'s resumption: a ticket an earlier connection brought, and its proof.
    Resume(Token, Token),
}

/// A client's new connection, and the next resumption ticket with its proof when it
/// resumed.
pub(crate) type Connected = (Box<dyn ConnOps>, Option<(Token, Token)>);

/// `auto:`'s upgrade or resumption (`ask`): connects to the listener's upgrade socket at
/// `path` and checks that the listener answers with the proof. A resumption also
/// returns the next ticket and its proof.
pub(crate) fn connect_upgrade(
    path: &std::path::Path,
    opts: &Options,
    ask: Ask,
    deadline: Instant,
) -> Result<Connected> {
    let name = UnixName::Path(path.to_path_buf());
    let text = format!("shm:{}", path.display());
    client(&name, &text, opts, ask, deadline)
}

/// The client's side of a handshake with the listener at `socket`, asking as `ask`
/// says; with the next ticket when it resumed.
fn client(
    socket: &UnixName,
    name: &str,
    opts: &Options,
    ask: Ask,
    deadline: Instant,
) -> Result<Connected> {
    // Before connecting: registering can take milliseconds in a multi-threaded process,
    // which must not eat into the listener's handshake window.
    let offered = own_features(opts);
    // Our segment, ready before connecting so that it travels with the hello (one packet
    // each way instead of three, design §5.1b) and the listener, which reads a new
    // client's hello as soon as it accepts it, finds it there: the one made ahead while
    // this process's last connect waited for its answer, or a new one. Nothing is
    // written in it until the listener's answer checked out. Without it (no memory now),
    // the hello goes alone and the segment follows the answer, as before.
    let pid = std::process::id();
    let early = take_spare(opts, pid).or_else(|| Half::create(Side::Client, opts.ring_size).ok());
    if let Some((own, _)) = &early {
        own.set_cpu(sys::current_cpu());
    }
    let sock = socket::connect(socket, deadline).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => Error::new(
            ErrorKind::ConnectionRefused,
            format!("no listener at {name} ({e})"),
        ),
        io::ErrorKind::PermissionDenied => Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "no permission to reach {name} ({e}): a listener admits only its own uid and \
                 root unless its options allow other uids or gids"
            ),
        ),
        _ => Error::io("rendezvous socket", e),
    })?;
    // An upgrade or a resumption needs no uid: the listener proves below that it is the
    // one the client reached over TCP (or that issued its ticket), whoever runs it.
    if let Ask::Hello = ask {
        trust::check_server(sock.as_fd(), opts, &format!("the listener at {name}"))?;
    }
    // Doorbell pipes only while this process has descriptors to spare for them (§4.4).
    let offered = match bell::pipes_fit(sock.as_fd()) {
        true => offered,
        false => offered & !FEATURE_PIPE_BELL,
    };
    let want = Params {
        features: offered,
        ring_c2s: opts.ring_size as u64,
        ring_s2c: opts.ring_size as u64,
        max_msg: opts.max_msg_size as u64,
    };
    let hello = match ask {
        Ask::Hello => Packet::Hello(want),
        Ask::Upgrade(token, _) => Packet::Upgrade(want, token),
        Ask::Resume(ticket, _) => Packet::Resume(want, ticket),
    };
    // The segment goes out only to a listener whose credentials checked out (above), or,
    // on an `auto:` upgrade or resumption, with the token or ticket: that listener proves
    // itself only in its answer, but the segment is sealed read-only for it and holds
    // nothing yet (header, zeros), and a wrong proof drops it unused (design §5.3).
    let with_hello = early.as_ref().map(|(_, fd)| fd.as_raw_fd());
    match with_hello {
        Some(fd) => socket::send_with_fds(sock.as_fd(), &hello.encode(), &[fd]),
        None => socket::send(sock.as_fd(), &hello.encode()),
    }
    .map_err(|e| Error::io("send hello", e))?;
    // While the listener works on its answer: the next connect's segment.
    refill_spare(opts, pid);
    let mut buf = [0u8; MAX_PACKET];
    let mut fds = Vec::new();
    let n = recv_answer(sock.as_fd(), &mut buf, &mut fds, &opts.wait, deadline).map_err(|e| {
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
    let (params, next) = match (Packet::decode(&buf[..n])?, ask) {
        (Packet::Accept(p), Ask::Hello) => (p, None),
        (Packet::Upgraded(p, proof), Ask::Upgrade(_, want)) if proof == want => (p, None),
        (Packet::Resumed(p, proof, ticket, next), Ask::Resume(_, want)) if proof == want => {
            (p, Some((ticket, next)))
        }
        (Packet::Upgraded(..), Ask::Upgrade(..)) => {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("the listener at {name} is not the one reached over TCP (wrong proof)"),
            ))
        }
        (Packet::Resumed(..), Ask::Resume(..)) => {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("the listener at {name} did not issue this ticket (wrong proof)"),
            ))
        }
        (Packet::Refuse(code, reason), _) => {
            return Err(Error::new(
                code.kind(),
                format!("refused by listener: {reason}"),
            ))
        }
        (other, _) => {
            return Err(Error::violation(format!(
                "listener answered the handshake with {other:?}"
            )))
        }
    };
    check_accept(&params, opts.ring_size, offered)?;
    // The memfd, and the doorbell pipes if the listener kept FEATURE_PIPE_BELL.
    let (memfd, bell) = bell::answer_fds(fds, params.features)?;
    let peer = Half::attach(&memfd, Side::Server, params.ring_s2c as usize)?;
    // A listener that took the segment sent with the hello answers with its ring size;
    // one with a smaller cap answers with that and waits for a segment of that size.
    let own = match early {
        Some((own, _)) if with_hello.is_some() && params.ring_c2s == opts.ring_size as u64 => own,
        early => {
            let (own, own_fd) = match early {
                Some(early) if params.ring_c2s == opts.ring_size as u64 => early,
                _ => Half::create(Side::Client, params.ring_c2s as usize)?,
            };
            socket::send_with_fds(
                sock.as_fd(),
                &Packet::Segment.encode(),
                &[own_fd.as_raw_fd()],
            )
            .map_err(|e| Error::io("send our segment to the listener", e))?;
            own
        }
    };
    let name = name.to_string();
    let conn = Box::new(ShmConn::new(Setup {
        seg: Segment::new(own, peer).retire(opts.prepare_ahead),
        fence: fence_mode(params.features),
        sock,
        // `socket::connect` made it with SOCK_NONBLOCK.
        sock_nonblocking: Some(true),
        bell,
        wait: opts.wait,
        max_send: opts.max_msg_size.min(params.max_msg as usize),
        max_recv: opts.max_msg_size,
        copy_ahead: opts.copy_ahead,
        local: name.clone(),
        peer: name,
    }));
    Ok((conn, next))
}

/// Waits for the listener's answer the way a receive waits for data (`policy`): polls
/// the socket for the spin and yield budget, then sleeps until `deadline`. The listener
/// usually answers within tens of microseconds; a client that sleeps meanwhile costs a
/// cross-CPU wake-up, and its peer, which polls for the first message just as long after
/// the answer, then sleeps too and costs another (docs/benchmarks.md, conn round).
fn recv_answer(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    policy: &WaitPolicy,
    deadline: Instant,
) -> io::Result<usize> {
    let mut got = None;
    let policy = crate::notify::setup_policy(policy);
    let _ = crate::notify::spin_then_yield(&policy, || {
        match socket::recv_with_fds(sock, buf, fds) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Meanwhile, unmap a closed connection's half (design §5.1b).
                segment::reap_one();
                return Ok(false);
            }
            other => got = Some(other),
        }
        Ok(true)
    });
    match got {
        Some(answer) => answer,
        None => socket::recv_until(sock, buf, fds, deadline),
    }
}

/// A client segment made ahead and never sent to anyone: the process that made it (a
/// `fork` child must not use its parent's: both would write one segment), its ring size,
/// and the segment.
type Spare = (u32, usize, (Half, OwnedFd));

/// This process's spare client segment (at most one: its memory, one header page and
/// one ring of the last size asked for, is what it costs).
static SPARE: std::sync::Mutex<Option<Spare>> = std::sync::Mutex::new(None);

fn spare_slot() -> std::sync::MutexGuard<'static, Option<Spare>> {
    SPARE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The spare client segment, if this process (`pid`, ours) made it for a ring of
/// `opts.ring_size` bytes and `opts` let it (`Options::prepare_ahead`).
fn take_spare(opts: &Options, pid: u32) -> Option<(Half, OwnedFd)> {
    if !opts.prepare_ahead {
        return None;
    }
    let ring = opts.ring_size;
    let mut slot = spare_slot();
    match slot.take() {
        Some((made_by, size, seg)) if made_by == pid && size == ring => Some(seg),
        Some(other) if other.0 == pid => {
            *slot = Some(other); // another size: keep it for its users
            None
        }
        _ => None, // none, or a fork parent's: dropped
    }
}

/// Makes the next connect's segment for a ring of `opts.ring_size` bytes unless one waits
/// already or `opts` says not to (best effort: without memory now, the next connect makes
/// its own). `pid` is this process's.
fn refill_spare(opts: &Options, pid: u32) {
    if !opts.prepare_ahead {
        return;
    }
    let ring = opts.ring_size;
    let ready =
        |slot: &Option<Spare>| matches!(slot, Some((p, size, _)) if *p == pid && *size == ring);
    if ready(&spare_slot()) {
        return;
    }
    // Made outside the lock: other threads' connects take or skip the slot meanwhile.
    if let Ok(seg) = Half::create(Side::Client, ring) {
        let mut slot = spare_slot();
        if !ready(&slot) {
            *slot = Some((pid, ring, seg));
        }
    }
}

/// Checks the numbers a listener chose in its answer against what the client asked for
/// (rings of at most `ring_size` bytes, features out of `offered`).
pub(crate) fn check_accept(params: &Params, ring_size: usize, offered: u64) -> Result<()> {
    if !valid_ring(params.ring_c2s)
        || !valid_ring(params.ring_s2c)
        || params.ring_c2s > ring_size as u64
        || params.ring_s2c > ring_size as u64
    {
        return Err(Error::violation(format!(
            "listener chose ring sizes {} and {} (asked for at most {ring_size})",
            params.ring_c2s, params.ring_s2c
        )));
    }
    if params.features & !offered != 0 {
        return Err(Error::violation(format!(
            "listener chose features {:#x}, we offered {offered:#x}",
            params.features
        )));
    }
    Ok(())
}

/// How a listener refuses a client's segment that [`Half::attach`] rejected.
fn segment_refusal(e: Error) -> (RefuseCode, String) {
    let code = match e.kind() {
        ErrorKind::ProtocolViolation => RefuseCode::Protocol,
        ErrorKind::VersionMismatch => RefuseCode::Version,
        _ => RefuseCode::Resources,
    };
    (code, e.message().to_string())
}

/// How a connection a listener set up came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Came {
    /// A hello (or from this process).
    Hello,
    /// `auto:`'s upgrade, with its token.
    Upgrade(Token),
    /// `auto:`'s resumption with a ticket.
    Resume,
}

/// A connection a listener set up, and how it came.
pub(crate) type Stepped = (Came, Accepted);

/// What a listener answers a client that asked with a token or a ticket.
#[derive(Clone, Copy)]
enum Via {
    Hello,
    /// An upgrade: its token and proof.
    Upgrade(Token, Token),
    /// A resumption: the ticket's proof, then the next ticket and its proof.
    Resume(Token, (Token, Token)),
}

/// A client between connect and a completed handshake.
struct Pending {
    sock: OwnedFd,
    deadline: Instant,
    /// The client's uid (`SO_PEERCRED` at accept), and whether the listener admits it.
    uid: u32,
    admitted: bool,
    /// The client's credentials as `SO_PEERCRED` gave them at accept (or why not): the
    /// hello's check uses them rather than asking the kernel again.
    cred: std::result::Result<PeerCred, String>,
    /// Whether its socket is in the listener's epoll set: a new client's hello is looked
    /// for at once, and the socket is watched only when it has not arrived yet.
    watched: bool,
    /// Set once its hello was answered: our side, waiting for the client's segment.
    accepted: Option<Box<Handshake>>,
}

/// What a successful hello set up on the listener's side.
struct Handshake {
    /// Our segment (the server → client ring); its memfd goes out with the answer.
    own: Half,
    memfd: OwnedFd,
    accept: Params,
    client_max_msg: u64,
    /// How the client asked.
    via: Via,
    cred: PeerCred,
    /// The client's segment, when it came with the hello and has the size we answer
    /// with: checked, and mapped once the answer is out, which completes the connection.
    peer: Option<OwnedFd>,
    /// With `FEATURE_PIPE_BELL`: our doorbell pipes, and the client's write end until
    /// the answer carried it.
    bell: Option<(PipeBell, Option<ClientRing>)>,
}

/// How the listener answers a client's first packet, unless it refuses.
enum Answer {
    /// Answer with our segment, then wait for the client's.
    Connect(Box<Handshake>),
    /// Answer a query with the listener's status.
    Status,
    /// Refuse a resumption ticket, and why: an admitted client whose ticket this listener
    /// does not know (issued by its predecessor, pushed out, expired, or never issued),
    /// which then negotiates over TCP. Routine, so neither counted as a refusal nor
    /// logged above `debug`.
    NoResume(&'static str),
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
    file: SocketFile,
    events: Vec<Event>,
    /// `events` holds what the last [`ShmListener::wait`] returned, not yet looked at by
    /// [`ShmListener::step`] (which then need not ask epoll again).
    events_fresh: bool,
    /// An `auto:` listener's upgrade socket: the tokens handed out over TCP and their
    /// proofs. Such a listener accepts only upgrades with a token from this book, and
    /// resumptions with a ticket from `tickets`.
    pub(crate) upgrades: Option<HashMap<Token, Token>>,
    /// An `auto:` listener's resumption tickets (`None`: it issues none).
    pub(crate) tickets: Option<tickets::Tickets>,
    /// The connections accepted, for queries.
    pub(crate) registry: Registry,
    /// With [`Options::in_process`]: this listener's entry in the table of in-process
    /// listeners, and its key.
    inproc: Option<(String, Arc<Inbox>)>,
    /// Segments made ahead, while the listener had nothing else to do, with a ring of
    /// the listener's ring size (what a client that asks for at least that gets): a
    /// hello's answer takes one instead of making one while the client waits. At most
    /// [`MAX_SPARES`].
    spares: Vec<(Half, OwnedFd)>,
    /// Doorbell pipes made ahead like [`ShmListener::spares`], at most one pair: two
    /// pipes and two `fcntl`s fewer while a client waits for its answer.
    spare_bell: Option<(PipeBell, ClientRing)>,
}

fn bind(addr: &Address, opts: &Options) -> Result<Box<dyn ListenerOps>> {
    Ok(Box::new(ShmListener::bind(addr, opts)?))
}

impl ShmListener {
    pub(crate) fn bind(addr: &Address, opts: &Options) -> Result<ShmListener> {
        let (listen, file) = bind_rendezvous(addr, opts)?;
        let epoll = Epoll::new().map_err(|e| Error::io("epoll", e))?;
        epoll
            .add(
                listen.as_raw_fd(),
                Interest::READABLE,
                sys::Token(LISTEN_TOKEN),
            )
            .map_err(|e| Error::io("epoll", e))?;
        let inproc = if opts.in_process {
            let key = inproc_key(socket_of(addr));
            let id = file.as_ref().map(|(_, dev, ino)| (*dev, *ino));
            let inbox = inproc::register(key.clone(), &addr.to_string(), opts, id)?;
            epoll
                .add(
                    inbox.fd().as_raw_fd(),
                    Interest::READABLE,
                    sys::Token(INPROC_TOKEN),
                )
                .map_err(|e| Error::io("epoll", e))?;
            Some((key, inbox))
        } else {
            None
        };
        Ok(ShmListener {
            listen,
            epoll,
            pending: Vec::new(),
            opts: opts.clone(),
            addr: addr.to_string(),
            file,
            events: Vec::new(),
            events_fresh: false,
            upgrades: None,
            tickets: None,
            registry: Registry::new(),
            inproc,
            spares: Vec::new(),
            spare_bell: None,
        })
    }
}

impl ShmListener {
    /// Accepts a client waiting in the backlog into `pending` (one per step: the listening
    /// socket stays readable while more wait, so a flood of connections cannot keep the
    /// listener from the handshakes of those already accepted, and a lone client costs no
    /// second `accept` that finds nobody). Returns the new client's socket (as an epoll
    /// token); the socket is not watched yet ([`ShmListener::watch`]): its hello is
    /// usually there already.
    fn accept_backlog(&mut self) -> Result<Option<u64>> {
        // In blocking mode, what the connection's socket needs (`ShmConn::new`); every call
        // of the handshake says MSG_DONTWAIT.
        let Some(sock) =
            socket::accept_blocking(self.listen.as_fd()).map_err(|e| Error::io("accept", e))?
        else {
            return Ok(None);
        };
        let cred = socket::peer_cred(sock.as_fd()).map_err(|e| e.to_string());
        let (uid, admitted) = match &cred {
            Ok(c) => (c.uid, trust::check_client(&self.opts, c.uid, c.gid).is_ok()),
            Err(_) => (u32::MAX, false),
        };
        if self.pending.len() >= MAX_PENDING {
            let victim = trust::eviction_victim(self.pending.iter().map(|p| (p.uid, p.admitted)));
            let old = self.pending.remove(victim);
            self.unwatch(&old);
        }
        let fd = sock.as_raw_fd();
        self.pending.push(Pending {
            sock,
            deadline: Instant::now() + self.opts.handshake_timeout,
            uid,
            admitted,
            cred,
            watched: false,
            accepted: None,
        });
        Ok(Some(fd as u64))
    }

    /// Puts pending client `i`'s socket in the epoll set, if it is not there yet; a client
    /// that cannot be watched is dropped.
    fn watch(&mut self, i: usize) {
        let p = &mut self.pending[i];
        if p.watched {
            return;
        }
        let fd = p.sock.as_raw_fd();
        match self
            .epoll
            .add(fd, Interest::READABLE, sys::Token(fd as u64))
        {
            Ok(()) => p.watched = true,
            Err(_) => drop(self.pending.swap_remove(i)),
        }
    }

    /// Takes a pending client's socket out of the epoll set, if it is there.
    fn unwatch(&self, p: &Pending) {
        if p.watched {
            let _ = self.epoll.delete(p.sock.as_raw_fd());
        }
    }

    /// Runs the next handshake step with pending client `i` if its packet has arrived: a
    /// hello (or query) is answered, a segment completes the connection. The client
    /// leaves `pending` unless it has not spoken yet or waits to send its segment; a
    /// query is answered and the client dropped.
    fn try_handshake(&mut self, i: usize) -> Option<Stepped> {
        let mut buf = [0u8; MAX_PACKET];
        let mut fds = Vec::new();
        let res = socket::recv_with_fds(self.pending[i].sock.as_fd(), &mut buf, &mut fds);
        if matches!(&res, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            self.watch(i);
            return None;
        }
        let mut p = self.pending.swap_remove(i);
        self.unwatch(&p);
        if let Some(h) = p.accepted.take() {
            let verdict = match res {
                Ok(0) => return None, // the client left
                Ok(n) => Self::client_segment(&h, &buf[..n], fds),
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    Err((RefuseCode::Protocol, format!("segment rejected: {e}")))
                }
                Err(_) => return None,
            };
            return match verdict {
                Ok(peer) => Some(self.connected(p.sock, *h, peer)),
                Err((code, reason)) => {
                    self.refuse(&p, code, reason);
                    None
                }
            };
        }
        let verdict = match res {
            Ok(0) => return None, // the client left
            Ok(n) => self.handshake(&p, &buf[..n], fds),
            // Truncated (oversized) packet or too many descriptors: tell the client why.
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                Err((RefuseCode::Protocol, format!("hello rejected: {e}")))
            }
            Err(_) => return None,
        };
        match verdict {
            Ok(Answer::Status) => {
                let status = self.registry.status(&self.addr);
                let _ = socket::send(p.sock.as_fd(), &Packet::Status(status).encode());
                None
            }
            Ok(Answer::NoResume(why)) => {
                crate::trace::event!(
                    debug,
                    listener = %self.addr,
                    reason = why,
                    "resumption refused, the client negotiates over TCP"
                );
                let refusal = Packet::Refuse(RefuseCode::Permission, why.into());
                let _ = socket::send(p.sock.as_fd(), &refusal.encode());
                None
            }
            Ok(Answer::Connect(mut h)) => {
                let answer = match h.via {
                    Via::Hello => Packet::Accept(h.accept),
                    Via::Upgrade(_, proof) => Packet::Upgraded(h.accept, proof),
                    Via::Resume(proof, (ticket, next)) => {
                        Packet::Resumed(h.accept, proof, ticket, next)
                    }
                };
                if let (Some(book), Via::Upgrade(token, _)) = (&mut self.upgrades, h.via) {
                    book.remove(&token); // used once
                }
                let mut fds = vec![h.memfd.as_raw_fd()];
                if let Some((bell, Some(ring))) = &h.bell {
                    fds.extend(bell.client_fds(ring));
                }
                socket::send_with_fds(p.sock.as_fd(), &answer.encode(), &fds).ok()?;
                // The client's write end is the client's alone from now on: a sleep on
                // our pipe ends with end-of-file when the client is gone.
                if let Some((_, ring)) = &mut h.bell {
                    *ring = None;
                }
                if let Some(fd) = h.peer.take() {
                    // The client's segment came with its hello, checked above: mapped
                    // now, while the client maps ours. A client that changed its header
                    // since is dropped (it sees the connection end). Then, while the
                    // client checks our answer before it sends (tens of microseconds), the
                    // next answer's segment, if none is ready: clients that connect back
                    // to back find the listener busy, never before it sleeps, where the
                    // pool is refilled otherwise (design §5.1b).
                    let peer = match Half::attach(&fd, Side::Client, h.accept.ring_c2s as usize) {
                        Ok(peer) => peer,
                        Err(_e) => {
                            crate::trace::event!(
                                warn,
                                listener = %self.addr,
                                reason = %_e,
                                "client dropped after the answer"
                            );
                            return None;
                        }
                    };
                    self.first_spare();
                    return Some(self.connected(p.sock, *h, peer));
                }
                // Now the client's segment, within the same deadline.
                let fd = p.sock.as_raw_fd();
                self.epoll
                    .add(fd, Interest::READABLE, sys::Token(fd as u64))
                    .ok()?;
                self.pending.push(Pending {
                    accepted: Some(h),
                    watched: true,
                    ..p
                });
                None
            }
            Err((code, reason)) => {
                self.refuse(&p, code, reason);
                None
            }
        }
    }

    /// Tells a pending client why it is refused (best effort: it may be gone), and logs it.
    fn refuse(&mut self, p: &Pending, code: RefuseCode, reason: String) {
        crate::trace::event!(
            warn,
            listener = %self.addr,
            ?code,
            reason = %reason,
            "client refused"
        );
        self.registry.refused(code);
        let _ = socket::send(p.sock.as_fd(), &Packet::Refuse(code, reason).encode());
    }

    /// Checks the packet that must follow our answer: the client's segment, exactly one
    /// memfd, sealed so that only the client writes it, of the size we agreed on.
    fn client_segment(
        h: &Handshake,
        packet: &[u8],
        fds: Vec<OwnedFd>,
    ) -> std::result::Result<Half, (RefuseCode, String)> {
        match Packet::decode(packet) {
            Ok(Packet::Segment) => {}
            Ok(_) => {
                return Err((
                    RefuseCode::Protocol,
                    "expected the client's segment after the answer".into(),
                ))
            }
            Err(e) if e.kind() == ErrorKind::VersionMismatch => {
                return Err((RefuseCode::Version, e.message().to_string()))
            }
            Err(e) => return Err((RefuseCode::Protocol, e.message().to_string())),
        }
        let [fd] = <[OwnedFd; 1]>::try_from(fds).map_err(|fds| {
            (
                RefuseCode::Protocol,
                format!(
                    "the segment packet carried {} descriptors, expected 1",
                    fds.len()
                ),
            )
        })?;
        Half::attach(&fd, Side::Client, h.accept.ring_c2s as usize).map_err(segment_refusal)
    }

    /// Builds our side of a connection whose handshake completed.
    fn connected(&mut self, sock: OwnedFd, h: Handshake, peer: Half) -> Stepped {
        let conn = Box::new(ShmConn::new(Setup {
            seg: Segment::new(h.own, peer).retire(self.opts.prepare_ahead),
            fence: fence_mode(h.accept.features),
            sock,
            // `accept_backlog` accepted it in blocking mode.
            sock_nonblocking: Some(false),
            bell: h.bell.map(|(bell, _)| bell),
            wait: self.opts.wait,
            max_send: h.client_max_msg.min(self.opts.max_msg_size as u64) as usize,
            max_recv: self.opts.max_msg_size,
            copy_ahead: self.opts.copy_ahead,
            local: self.addr.clone(),
            peer: self.addr.clone(),
        }));
        let counters = self
            .registry
            .track("shm", Some(ProcessCred::from(h.cred)), None);
        let came = match h.via {
            Via::Hello => Came::Hello,
            Via::Upgrade(token, _) => Came::Upgrade(token),
            Via::Resume(..) => Came::Resume,
        };
        (
            came,
            Accepted {
                conn,
                counters: Some(counters),
            },
        )
    }

    /// The client's credentials (as `SO_PEERCRED` gave them at accept), if the options
    /// allow it to connect.
    fn client_cred(&self, p: &Pending) -> std::result::Result<PeerCred, (RefuseCode, String)> {
        let cred = p
            .cred
            .clone()
            .map_err(|e| (RefuseCode::Permission, format!("no peer credentials: {e}")))?;
        if !p.admitted {
            // Checked at accept; asked again for the reason.
            trust::check_client(&self.opts, cred.uid, cred.gid)
                .map_err(|why| (RefuseCode::Permission, format!("{why} on {}", self.addr)))?;
        }
        Ok(cred)
    }

    /// Checks a client's hello (or query) and credentials and sets up its segment; a
    /// hello may carry the client's segment (one descriptor), which is checked here like
    /// a `Segment` packet's.
    fn handshake(
        &mut self,
        p: &Pending,
        hello: &[u8],
        fds: Vec<OwnedFd>,
    ) -> std::result::Result<Answer, (RefuseCode, String)> {
        if fds.len() > 1 {
            return Err((
                RefuseCode::Protocol,
                format!(
                    "a hello carries at most one descriptor (the client's segment), this one {}",
                    fds.len()
                ),
            ));
        }
        let (want, via) = match (Packet::decode(hello), &self.upgrades) {
            // The same gate as a connection: who may not connect learns nothing.
            (Ok(Packet::Query), _) if fds.is_empty() => {
                return self.client_cred(p).map(|_| Answer::Status)
            }
            (Ok(Packet::Query), _) => {
                return Err((
                    RefuseCode::Protocol,
                    "a query must not carry descriptors".into(),
                ))
            }
            (Ok(Packet::Hello(p)), None) => (p, Via::Hello),
            (Ok(Packet::Resume(params, ticket)), Some(_)) => {
                // Who may not connect is refused as such, whatever its ticket.
                self.client_cred(p)?;
                let Some(tickets) = &mut self.tickets else {
                    return Ok(Answer::NoResume(
                        "this listener issues no resumption tickets",
                    ));
                };
                let Some(proof) = tickets.redeem(&ticket) else {
                    return Ok(Answer::NoResume(
                        "unknown, expired or already used resumption ticket",
                    ));
                };
                let next = tickets
                    .issue()
                    .map_err(|e| (RefuseCode::Resources, e.to_string()))?;
                (params, Via::Resume(proof, next))
            }
            (Ok(Packet::Upgrade(p, token)), Some(book)) => match book.get(&token) {
                Some(proof) => (p, Via::Upgrade(token, *proof)),
                None => {
                    return Err((
                        RefuseCode::Permission,
                        "unknown or already used upgrade token".into(),
                    ))
                }
            },
            (Ok(_), None) => return Err((RefuseCode::Protocol, "expected a hello".into())),
            (Ok(_), Some(_)) => {
                return Err((
                    RefuseCode::Protocol,
                    "this is an auto: upgrade socket: expected an upgrade".into(),
                ))
            }
            (Err(e), _) if e.kind() == ErrorKind::VersionMismatch => {
                return Err((RefuseCode::Version, e.message().to_string()))
            }
            (Err(e), _) => return Err((RefuseCode::Protocol, e.message().to_string())),
        };
        let cred = self.client_cred(p)?;
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
        let mut accept = Params {
            features: want.features & own_features(&self.opts),
            ring_c2s: want.ring_c2s.min(cap),
            ring_s2c: want.ring_s2c.min(cap),
            max_msg: self.opts.max_msg_size as u64,
        };
        // The client's segment, if it came along and the listener keeps its ring size
        // (one larger than our cap is dropped: the answer asks for a smaller one).
        let peer = match fds.into_iter().next() {
            Some(fd) if accept.ring_c2s == want.ring_c2s => {
                Half::check(&fd, Side::Client, accept.ring_c2s as usize)
                    .map_err(segment_refusal)?;
                Some(fd)
            }
            _ => None,
        };
        let spare = match accept.ring_s2c == cap {
            true => self.spares.pop(),
            false => None,
        };
        let (own, memfd) = match spare {
            Some(spare) => spare,
            None => Half::create(Side::Server, accept.ring_s2c as usize)
                .map_err(|e| (RefuseCode::Resources, e.to_string()))?,
        };
        own.set_cpu(sys::current_cpu());
        // Doorbell pipes only while this process has descriptors to spare (design §4.4);
        // a table that is full after all (the socket's number undercounts when lower
        // descriptors were closed) costs this connection its pipes, not its existence.
        let bell = match accept.features & FEATURE_PIPE_BELL {
            0 => None,
            _ if !bell::pipes_fit(p.sock.as_fd()) => None,
            _ => match self
                .spare_bell
                .take()
                .map_or_else(PipeBell::for_listener, Ok)
            {
                Ok(bell) => Some(bell),
                Err(e) if is_fd_exhaustion(&e) => None,
                Err(e) => return Err((RefuseCode::Resources, format!("doorbell pipes: {e}"))),
            },
        };
        if bell.is_none() {
            accept.features &= !FEATURE_PIPE_BELL;
        }
        Ok(Answer::Connect(Box::new(Handshake {
            own,
            memfd,
            accept,
            client_max_msg: want.max_msg,
            via,
            cred,
            peer,
            bell: bell.map(|(bell, ring)| (bell, Some(ring))),
        })))
    }

    /// Takes waiting clients and runs the handshakes whose hello has arrived, without
    /// blocking; returns the first connection set up (with its upgrade token). Queries
    /// (`shmlink ls`) are answered here too: a listener answers while its process
    /// accepts or polls it.
    pub(crate) fn step(&mut self) -> Result<Option<Stepped>> {
        if let Some(conn) = self.inproc.as_ref().and_then(|(_, inbox)| inbox.take()) {
            // The peer is this process: its ids (the effective gid as `/proc/self`'s
            // owner says, as SO_PEERCRED would).
            let me = ProcessCred {
                pid: std::process::id(),
                uid: sys::euid(),
                gid: {
                    use std::os::unix::fs::MetadataExt;
                    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.gid())
                },
            };
            let counters = self.registry.track("shm", Some(me), None);
            return Ok(Some((
                Came::Hello,
                Accepted {
                    conn,
                    counters: Some(counters),
                },
            )));
        }
        let mut events = std::mem::take(&mut self.events);
        // What `wait` just returned, else a look that does not block (level-triggered:
        // an event `wait` saw is still true, or the call it leads to finds nothing).
        if !std::mem::take(&mut self.events_fresh) {
            self.epoll
                .wait(Some(Instant::now()), &mut events)
                .map_err(|e| Error::io("epoll", e))?;
        }
        // Only when the listening socket says a client waits: an `accept` that finds
        // none is a system call per step for nothing.
        let mut tokens: Vec<u64> = events.iter().map(|e| e.token().0).collect();
        if tokens.contains(&LISTEN_TOKEN) {
            // A client's hello is usually there by the time we accept it: look at once
            // rather than after another round through epoll.
            tokens.extend(self.accept_backlog()?);
        }
        let mut found = None;
        for token in tokens {
            if token == LISTEN_TOKEN || token == INPROC_TOKEN || found.is_some() {
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
        // New clients not looked at (a connection was found first): watched from now.
        for i in (0..self.pending.len()).rev() {
            self.watch(i);
        }
        self.expire(Instant::now());
        Ok(found)
    }

    /// Waits until a client or a hello arrives, a pending client's deadline passes, or
    /// `until`.
    pub(crate) fn wait(&mut self, until: Option<Instant>) -> Result<()> {
        // Before sleeping: unmap closed connections' segments and refill the pool of
        // answer segments, one at a time, and stop as soon as something arrived (a client
        // then waits for at most one segment's making, as with a single spare).
        self.first_spare();
        loop {
            let more = self.opts.prepare_ahead && self.spares.len() < MAX_SPARES;
            if !more && !segment::any_retired() {
                break;
            }
            self.epoll
                .wait(Some(Instant::now()), &mut self.events)
                .map_err(|e| Error::io("epoll", e))?;
            if !self.events.is_empty() {
                self.events_fresh = true;
                return Ok(());
            }
            if segment::reap_one() {
                continue;
            }
            if !more {
                break;
            }
            match Half::create(Side::Server, self.opts.ring_size) {
                Ok(spare) => self.spares.push(spare),
                Err(_) => break,
            }
        }
        let deadline = self.pending.iter().map(|p| p.deadline).chain(until).min();
        self.epoll
            .wait(deadline, &mut self.events)
            .map_err(|e| Error::io("epoll", e))?;
        self.events_fresh = true;
        Ok(())
    }

    /// Makes the next answer's segment, unless one is ready or the options say not to
    /// (`Options::prepare_ahead`): for a listener with nothing else to do (before it
    /// sleeps, or when a non-blocking accept found nobody; [`ShmListener::wait`] then
    /// fills the rest of the pool). Best effort: a failure here is met again, and
    /// reported to the client, when a hello needs the segment. Closed connections'
    /// mappings waiting on this process's list are unmapped here too (an `auto:`
    /// listener's upgrade socket has no [`ShmListener::wait`] of its own).
    pub(crate) fn prepare(&mut self) {
        self.first_spare();
        while segment::reap_one() {}
    }

    /// Makes a spare segment, and spare doorbell pipes if the listener offers them, if
    /// there are none (and the options allow it). Pipes that would leave the process
    /// short of descriptors (their last end's number tells, as a client's socket does in
    /// [`bell::pipes_fit`]) are not kept.
    fn first_spare(&mut self) {
        if !self.opts.prepare_ahead {
            return;
        }
        if self.spares.is_empty() {
            if let Ok(spare) = Half::create(Side::Server, self.opts.ring_size) {
                self.spares.push(spare);
            }
        }
        if self.spare_bell.is_none() && own_features(&self.opts) & FEATURE_PIPE_BELL != 0 {
            self.spare_bell = PipeBell::for_listener()
                .ok()
                .filter(|(_, ring)| bell::pipes_fit(ring.fd()));
        }
    }

    /// Drops clients that did not say hello, or send their segment, in time.
    fn expire(&mut self, now: Instant) {
        let epoll = &self.epoll;
        self.pending.retain(|p| {
            let keep = p.deadline > now;
            if !keep && p.watched {
                let _ = epoll.delete(p.sock.as_raw_fd());
            }
            keep
        });
    }
}

impl ListenerOps for ShmListener {
    fn accept(&mut self, blocking: bool) -> Result<Accepted> {
        loop {
            if let Some((_, accepted)) = self.step()? {
                return Ok(accepted);
            }
            if !blocking {
                self.prepare();
                return Err(Error::would_block());
            }
            self.wait(None)?;
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
        if let Some((key, inbox)) = &self.inproc {
            inproc::unregister(key, inbox);
        }
        remove_socket_file(&self.file);
    }
}
