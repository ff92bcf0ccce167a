//! Out-of-band peer detection: listeners register, clients claim their TCP connection.
//!
//! A preloaded process that calls `listen` on a TCP socket binds a shmlink listener at
//! `<rendezvous dir>/tcp-<netns>-<address>-<port>.sock` and serves it from a helper
//! thread. A preloaded client whose TCP `connect` reached a local address looks for such
//! a registration (exact address, then the wildcard ones) and, if there is one, connects
//! to it (the listener's access rules apply: a client it refuses stays on TCP) and sends
//! a claim naming the TCP connection's four addresses. The helper answers yes unless the
//! server program already accepted that TCP connection (then it is plain TCP there), and
//! keeps the shmlink connection until `accept` returns the TCP connection it names. The
//! answer and the accept take one lock, so both ends always agree; no byte ever goes
//! into the TCP stream.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use libc::{c_int, sockaddr_storage, socklen_t};
use shmlink::{Connection, ErrorKind, Listener, Options};

use crate::state::{self, FORKS};
use crate::{config, debug, real, Guard};

/// A claim: magic, version, then the server's and the client's address (16-byte IPv6,
/// IPv4 mapped) and port (big-endian), as the client sees them.
const MAGIC: &[u8; 4] = b"SLPC";
const VERSION: u8 = 1;
const CLAIM_LEN: usize = 4 + 1 + 2 * (16 + 2);
const YES: u8 = 1;
const NO: u8 = 0;
/// The helper's first message: it counts the claim as in flight (the server's `accept`
/// now waits for it), so the client may make its TCP connection.
const READY: u8 = 2;
/// The answer to a claim on a shared listening socket: "the process that accepted your
/// TCP connection waits at shmlink address NAME" (the rest of the message).
const GO: u8 = 3;
/// A query, from a process that accepted a TCP connection on a listening socket it
/// shares with the registering process (fork, SO_REUSEPORT): magic, version, the key,
/// then the shmlink name where it waits for the client.
const QMAGIC: &[u8; 4] = b"SLPQ";
/// On a shared socket the answer comes at accept time, when the client may be giving up
/// (its [`ANSWER_TIMEOUT`]): the accepting process answers CONFIRM and commits only once
/// the client answers CONFIRMED (a client that gave up closed the connection instead).
const CONFIRM: u8 = 4;
const CONFIRMED: u8 = 5;
/// How long the accepting process waits for CONFIRMED (the client answers at once; a
/// client that gave up closes, which ends the wait sooner).
const CONFIRM_WAIT: Duration = Duration::from_secs(10);

/// How long a client waits for its claim's answer before staying on TCP.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the server remembers a TCP connection it accepted as plain TCP (longer than
/// any client waits for an answer).
const DECIDED_TTL: Duration = Duration::from_secs(10);
/// How long the helper waits for a client's claim after its handshake (the client makes
/// its TCP connection in between).
const CLAIM_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `accept` waits for claims in flight before taking a connection as plain TCP.
const ACCEPT_WAIT: Duration = Duration::from_secs(1);

/// An IP endpoint: address as 16 bytes (IPv4 mapped into IPv6) and port.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Endpoint {
    pub ip: [u8; 16],
    pub port: u16,
}

impl Endpoint {
    fn is_v4(&self) -> bool {
        self.ip[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
    }

    fn v6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.ip)
    }

    fn is_loopback(&self) -> bool {
        if self.is_v4() {
            self.ip[12] == 127
        } else {
            self.v6().is_loopback()
        }
    }

    fn is_unspecified(&self) -> bool {
        if self.is_v4() {
            self.ip[12..] == [0, 0, 0, 0]
        } else {
            self.v6().is_unspecified()
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_v4() {
            let b = &self.ip[12..];
            write!(f, "{}:{}", Ipv4Addr::new(b[0], b[1], b[2], b[3]), self.port)
        } else {
            write!(f, "[{}]:{}", self.v6(), self.port)
        }
    }
}

/// A connection's key: (server, client).
type Key = (Endpoint, Endpoint);

/// Decodes an AF_INET/AF_INET6 socket address.
fn endpoint(ss: &sockaddr_storage, len: socklen_t) -> Option<Endpoint> {
    match c_int::from(ss.ss_family) {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const sockaddr_storage).cast::<libc::sockaddr_in>() };
            let v4 = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(Endpoint {
                ip: v4.to_ipv6_mapped().octets(),
                port: u16::from_be(sin.sin_port),
            })
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(Endpoint {
                ip: sin6.sin6_addr.s6_addr,
                port: u16::from_be(sin6.sin6_port),
            })
        }
        _ => None,
    }
}

/// `getsockname` (`peer` false) or `getpeername` of `fd` as an endpoint.
pub(crate) fn sock_endpoint(fd: RawFd, peer: bool) -> Option<Endpoint> {
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<sockaddr_storage>() as socklen_t;
    let p = (&mut ss as *mut sockaddr_storage).cast::<libc::sockaddr>();
    // SAFETY: `ss` and `len` are valid out-parameters of the right size.
    let r = unsafe {
        if peer {
            real::getpeername(fd, p, &mut len)
        } else {
            real::getsockname(fd, p, &mut len)
        }
    };
    if r != 0 {
        return None;
    }
    endpoint(&ss, len)
}

fn sockopt_int(fd: RawFd, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: `v` and `len` are valid out-parameters for an int option.
    let r = unsafe { real::getsockopt(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// Whether `fd` is an AF_INET/AF_INET6 TCP socket (the only ones transparent mode takes).
pub(crate) fn is_tcp(fd: RawFd) -> bool {
    let domain = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN);
    let ty = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE);
    let proto = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL);
    matches!(domain, Some(libc::AF_INET | libc::AF_INET6))
        && ty == Some(libc::SOCK_STREAM)
        && proto == Some(libc::IPPROTO_TCP)
}

/// This process's network namespace (the inode of /proc/self/ns/net), 0 if unknown.
fn netns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    static NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NS.get_or_init(|| {
        std::fs::metadata("/proc/self/ns/net")
            .map(|m| m.ino())
            .unwrap_or(0)
    })
}

/// The shmlink name a listener on `ep` registers under (`shm:NAME`).
fn reg_name(ep: &Endpoint) -> String {
    let ip: String = ep.ip.iter().map(|b| format!("{b:02x}")).collect();
    format!("tcp-{:x}-{ip}-{}", netns(), ep.port)
}

/// The socket file of `reg_name(ep)` in the rendezvous directory.
fn reg_path(ep: &Endpoint) -> PathBuf {
    shmlink::rendezvous_dir().join(format!("{}.sock", reg_name(ep)))
}

fn options() -> Options {
    // Never in-process: a program's sockets outlive fork and exec (descriptors a child
    // inherits), which only the kernel path's shared memory and socket carry. Nothing made
    // ahead either: a segment kept between connections is a descriptor the program does
    // not know of, and may close (sockcheck's scenario 14 closes every fd it did not open).
    let policy = &config().policy;
    let opts = Options::default()
        .in_process(false)
        .prepare_ahead(false)
        .ring_size(config().ring_size)
        .connect_timeout(Duration::from_secs(1))
        .handshake_timeout(Duration::from_secs(1))
        // The cross-uid policy (docs/transparent.md, "Across users"): a registration
        // admits these client uids and gids (its socket file is then 0666 and
        // SO_PEERCRED the gate); a client trusts registrations bound by these uids.
        .allow_uids(policy.allow_uids.iter().copied())
        .allow_gids(policy.allow_gids.iter().copied())
        .expect_uids(policy.expect_uids.iter().copied());
    if policy.allows_others() {
        // A directory this process makes lets the allowed users reach the socket files
        // they know the names of (not list or write it).
        opts.rendezvous_dir_mode(0o711)
    } else {
        opts
    }
}

/// Why a registration's rendezvous directory keeps the users this process allows out
/// (they need search permission on it), if it does.
fn unreachable_dir(path: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dir = path.parent()?;
    let m = std::fs::metadata(dir).ok()?;
    let policy = &config().policy;
    let reachable = |uid: u32| {
        uid == 0
            || (uid == m.uid() && m.mode() & 0o100 != 0)
            || m.mode() & 0o001 != 0
            || (policy.allow_gids.contains(&m.gid()) && m.mode() & 0o010 != 0)
    };
    let out: Vec<String> = policy
        .allow_uids
        .iter()
        .filter(|&&u| !reachable(u))
        .map(u32::to_string)
        .collect();
    (!out.is_empty()).then(|| {
        format!(
            "the rendezvous directory {} (mode {:#o}, uid {}) keeps uids {} out: give \
             them search permission (chmod o+x), or use a directory the preload makes \
             (SHMLINK_DIR)",
            dir.display(),
            m.mode() & 0o7777,
            m.uid(),
            out.join(", ")
        )
    })
}

/// A registered listening socket.
pub(crate) struct Registration {
    /// The bound address (possibly a wildcard).
    pub bound: Endpoint,
    /// Its socket file: forked workers reach it by path (nginx clears their environment,
    /// `SHMLINK_DIR` with it).
    pub path: PathBuf,
    /// The effective uid that registered: a worker that changed uid (nginx's `user`)
    /// cannot reach the helper and says so through [`Self::refusals`] instead.
    pub uid: u32,
    /// A pipe (read end, write end; -1 if none) inherited by forked workers: a worker
    /// that accepted a connection it cannot take onto shared memory writes its key
    /// there, and the helper answers that claim no at once instead of letting the client
    /// wait for an answer that would never come.
    refusals: [AtomicI32; 2],
    /// The socket has SO_REUSEPORT: other processes' sockets may take its connections.
    pub reuseport: bool,
    /// Another process of the SO_REUSEPORT group holds the registration: this one has
    /// no helper and asks that process at each accept (as a forked worker does).
    pub remote: bool,
    /// An IPv6 wildcard listener that refuses IPv4 clients (IPV6_V6ONLY).
    pub v6only: bool,
    /// `FORKS` at registration: after a fork the socket may be accepted from in another
    /// process, so the helper answers a claim only when one accepts it ([`Self::shared`]).
    pub born: u64,
    /// The process that registered (and runs the helper).
    pub pid: u32,
    pub stop: AtomicBool,
    /// An eventfd that wakes the helper's wait when the program closes the socket (-1 if
    /// none could be made: the helper then notices within its 200 ms poll).
    wake: AtomicI32,
    /// The helper ended and its socket file is gone.
    ended: AtomicBool,
    pub state: Mutex<RegState>,
    /// Signalled when a claim is answered or given up.
    changed: Condvar,
}

#[derive(Default)]
pub(crate) struct RegState {
    /// Claimed, answered yes, not accepted yet.
    pending: HashMap<Key, Connection>,
    /// On a shared socket: claimed, not answered yet (the accepting process answers).
    claimed: HashMap<Key, Connection>,
    /// Accepted as plain TCP (no claim then), with when.
    decided: HashMap<Key, Instant>,
    /// Claim connections open whose claim is not answered yet.
    in_flight: usize,
}

/// One claim connection being served: counted in `in_flight` while alive.
struct InFlight(Arc<Registration>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.in_flight -= 1;
        drop(st);
        self.0.changed.notify_all();
    }
}

impl Registration {
    fn lock(&self) -> std::sync::MutexGuard<'_, RegState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state once connection `key` is claimed or pending, or no claim is in flight
    /// any more (waiting at most `ACCEPT_WAIT`).
    fn settled(&self, key: Key) -> std::sync::MutexGuard<'_, RegState> {
        let mut st = self.lock();
        let deadline = Instant::now() + ACCEPT_WAIT;
        while !st.claimed.contains_key(&key) && !st.pending.contains_key(&key) && st.in_flight > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self
                .changed
                .wait_timeout(st, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        st
    }

    /// The program closed the listening socket: ends the helper now and waits (briefly)
    /// until its socket file is gone, so that a `listen` on the same address right after
    /// (iperf3's server does that after every test) registers again.
    pub(crate) fn stop_now(&self) {
        let st = self.lock();
        self.stop.store(true, Ordering::Relaxed);
        if self.pid != std::process::id() {
            // A forked child: the helper (and its fd) is the parent's business.
            return;
        }
        let fd = self.wake.load(Ordering::Relaxed);
        if fd >= 0 {
            // Wakes the helper's poll. The helper closes this fd only under this lock.
            let one = 1u64.to_ne_bytes();
            // SAFETY: our open eventfd (checked under the lock); 8 bytes from `one`.
            unsafe { real::write(fd, one.as_ptr().cast(), 8) };
        }
        let _ = self
            .changed
            .wait_timeout_while(st, Duration::from_millis(200), |_| {
                !self.ended.load(Ordering::Relaxed)
            });
    }

    fn live(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    /// Whether the socket was shared by a fork since it registered: closing it here
    /// leaves it open in the other processes, whose accepts this helper still answers.
    pub(crate) fn forked(&self) -> bool {
        self.pid == std::process::id() && self.born != FORKS.load(Ordering::Relaxed)
    }

    /// Whether another process may accept this socket's connections (it was shared by
    /// a fork, or it is one of an SO_REUSEPORT group): then a claim is answered only
    /// when some process accepts its TCP connection, by that process.
    fn shared(&self) -> bool {
        self.reuseport || self.born != FORKS.load(Ordering::Relaxed)
    }

    /// Whether this listener could have accepted a TCP connection to `server`.
    fn serves(&self, server: &Endpoint) -> bool {
        if server.port != self.bound.port {
            return false;
        }
        if !self.bound.is_unspecified() {
            return server.ip == self.bound.ip;
        }
        if self.bound.is_v4() {
            server.is_v4()
        } else {
            !(self.v6only && server.is_v4())
        }
    }

    /// The program accepted TCP connection `key`: its shmlink connection if it was claimed
    /// (and the client still waits on it), else `None` (and the connection stays TCP).
    ///
    /// A preloaded client opens its claim connection before its TCP connect, so while
    /// claims are in flight, one of them may be this connection's: wait (bounded) for
    /// them to be answered.
    pub(crate) fn take(&self, key: (Endpoint, Endpoint)) -> Option<(Connection, Option<Vec<u8>>)> {
        if self.remote || self.pid != std::process::id() {
            // A forked child, or another process of an SO_REUSEPORT group: the helper
            // is elsewhere (and the state lock may have been held by a thread that
            // does not exist here): ask it.
            return worker::query(self, key).map(|c| (c, None));
        }
        let mut st = self.settled(key);
        if let Some(conn) = st.claimed.remove(&key) {
            drop(st);
            // A shared socket, accepted here: the answer is ours to give.
            return confirm(conn, key).map(|c| (c, None));
        }
        if let Some(mut conn) = st.pending.remove(&key) {
            drop(st);
            // The client may have given up waiting for the answer (it then went on over
            // TCP and closed this connection): check before committing.
            return match conn.recv_vec() {
                Ok(first) => Some((conn, Some(first))),
                Err(e) if e.kind() == ErrorKind::WouldBlock => Some((conn, None)),
                Err(e) => {
                    debug!(
                        "accept {} <- {}: claim dropped ({e}); stays TCP",
                        key.0, key.1
                    );
                    None
                }
            };
        }
        let now = Instant::now();
        st.decided
            .retain(|_, t| now.duration_since(*t) < DECIDED_TTL);
        st.decided.insert(key, now);
        None
    }

    /// Another process accepted TCP connection `key` on this shared socket and waits at
    /// shmlink address `name`: sends the client there if it claimed the connection
    /// (true), else marks the connection plain TCP (false). Claims in flight are waited
    /// for, as `take` does.
    fn answer_query(&self, key: Key, name: &str) -> bool {
        let mut st = self.settled(key);
        if let Some(mut conn) = st.claimed.remove(&key) {
            drop(st);
            // The client may have given up waiting (then it went on over TCP).
            match conn.recv_vec() {
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                _ => {
                    debug!("claim {} <- {}: dropped by the client; TCP", key.0, key.1);
                    return false;
                }
            }
            let mut msg = vec![GO];
            msg.extend_from_slice(name.as_bytes());
            let ok = conn.send(&msg).is_ok();
            debug!("claim {} <- {}: sent to {name} ({ok})", key.0, key.1);
            return ok;
        }
        if st.pending.contains_key(&key) {
            // Answered yes before the fork made the socket shared: the client already
            // talks to this process, which did not accept it (docs: a claim in flight
            // at a fork).
            debug!(
                "claim {} <- {}: accepted elsewhere after a yes",
                key.0, key.1
            );
        }
        let now = Instant::now();
        st.decided
            .retain(|_, t| now.duration_since(*t) < DECIDED_TTL);
        st.decided.insert(key, now);
        false
    }

    /// Reads the keys forked workers refused (see [`Self::refusals`]): each such claim is
    /// answered no at once, and the connection is known to be plain TCP.
    fn read_refusals(&self) {
        let mut buf = [0u8; CLAIM_LEN * 16];
        loop {
            let fd = self.refusals[0].load(Ordering::Relaxed);
            // SAFETY: `buf` is valid for its length; our own non-blocking pipe.
            let n = unsafe { real::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return;
            }
            for msg in buf[..n as usize].chunks(CLAIM_LEN) {
                let Some(key) = decode_claim(msg) else {
                    continue;
                };
                let mut st = self.lock();
                let now = Instant::now();
                st.decided.insert(key, now);
                if let Some(mut conn) = st.claimed.remove(&key) {
                    drop(st);
                    let _ = conn.send(&[NO]);
                    debug!(
                        "claim {} <- {}: no (its accepting process refused)",
                        key.0, key.1
                    );
                }
            }
        }
    }

    /// A worker that accepted `key` but cannot take it onto shared memory tells the
    /// helper (one write of less than PIPE_BUF bytes: atomic).
    fn refuse(&self, key: Key) {
        let fd = self.refusals[1].load(Ordering::Relaxed);
        if fd < 0 {
            return;
        }
        let msg = encode_claim(&key.0, &key.1);
        // SAFETY: `msg` is valid for its length; the inherited pipe's write end.
        unsafe { real::write(fd, msg.as_ptr().cast(), msg.len()) };
    }

    /// Answers one claim, under the lock `take` takes.
    fn answer(&self, key: Key, mut conn: Connection) {
        let mut st = self.lock();
        let yes = self.live() && self.serves(&key.0) && st.decided.remove(&key).is_none();
        if yes && self.shared() {
            // Whichever process accepts it answers (`take`, `answer_query`).
            debug!("claim {} <- {}: waits for its accept", key.0, key.1);
            st.claimed.insert(key, conn);
            drop(st);
            self.changed.notify_all();
            return;
        }
        if conn.send(&[if yes { YES } else { NO }]).is_err() || !yes {
            debug!("claim {} <- {}: no", key.0, key.1);
            return;
        }
        debug!("claim {} <- {}: yes", key.0, key.1);
        st.pending.insert(key, conn);
        drop(st);
        self.changed.notify_all();
    }
}

/// Registers listening socket `fd` if it is a TCP socket: binds the shmlink listener and
/// starts its helper thread.
pub(crate) fn register(fd: RawFd) -> Option<Arc<Registration>> {
    if !is_tcp(fd) {
        return None;
    }
    let bound = sock_endpoint(fd, false)?;
    // With SO_REUSEPORT, other sockets (other processes) may share the port and the
    // kernel spreads connections over them: claims are then answered by whichever
    // process accepts (`shared`); the first socket of the group registers, the others
    // ask it.
    let reuseport = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT).unwrap_or(0) != 0;
    let v6only =
        !bound.is_v4() && sockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY).unwrap_or(0) != 0;
    let path = reg_path(&bound);
    let addr = format!("shm:{}", reg_name(&bound));
    // SAFETY: plain geteuid.
    let uid = unsafe { libc::geteuid() };
    let new = |remote: bool, wake: RawFd| Registration {
        bound,
        path: path.clone(),
        uid,
        refusals: [AtomicI32::new(-1), AtomicI32::new(-1)],
        reuseport,
        remote,
        v6only,
        born: FORKS.load(Ordering::Relaxed),
        pid: std::process::id(),
        stop: AtomicBool::new(false),
        wake: AtomicI32::new(wake),
        ended: AtomicBool::new(remote),
        state: Mutex::new(RegState::default()),
        changed: Condvar::new(),
    };
    let listener = match Listener::bind(&addr, &options()) {
        Ok(l) => l,
        Err(e) if reuseport && std::fs::symlink_metadata(&path).is_ok() => {
            debug!("listen {bound}: SO_REUSEPORT, registered by another process ({e}); asks it");
            return Some(Arc::new(new(true, -1)));
        }
        Err(e) => {
            debug!("listen {bound}: no registration ({e}); plain TCP");
            return None;
        }
    };
    let mut refusals = [-1; 2];
    // SAFETY: a valid array of two fds.
    if unsafe { libc::pipe2(refusals.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } == 0 {
        state::set_internal(&refusals, true);
    } else {
        refusals = [-1, -1];
    }
    let reg = Arc::new(Registration {
        bound,
        path: path.clone(),
        uid,
        refusals: refusals.map(AtomicI32::new),
        reuseport,
        remote: false,
        v6only,
        born: FORKS.load(Ordering::Relaxed),
        pid: std::process::id(),
        stop: AtomicBool::new(false),
        wake: AtomicI32::new(new_wake_fd()),
        ended: AtomicBool::new(false),
        state: Mutex::new(RegState::default()),
        changed: Condvar::new(),
    });
    let r = reg.clone();
    let spawned = std::thread::Builder::new()
        .name("shmlink-preload".into())
        .spawn(move || serve(listener, r));
    if let Err(e) = spawned {
        debug!("listen {bound}: no helper thread ({e}); plain TCP");
        return None;
    }
    debug!("listen {bound}: registered at {}", path.display());
    let policy = &config().policy;
    if policy.allows_others() {
        debug!(
            "listen {bound}: admits uids {:?} and gids {:?} besides its own and root",
            policy.allow_uids, policy.allow_gids
        );
        if let Some(why) = unreachable_dir(&path) {
            debug!("listen {bound}: {why}");
        }
    }
    Some(reg)
}

/// The helper thread: accepts claim connections until the socket is closed or forked.
fn serve(mut listener: Listener, reg: Arc<Registration>) {
    let _g = Guard::enter();
    listener.set_nonblocking(true);
    while reg.live() {
        match listener.accept() {
            Ok(conn) => {
                reg.lock().in_flight += 1;
                let token = InFlight(reg.clone());
                // A thread per claim: a slow client cannot hold up the others.
                let spawned = std::thread::Builder::new()
                    .name("shmlink-claim".into())
                    .spawn(move || {
                        let _g = Guard::enter();
                        handle_claim(token, conn);
                    });
                if let Err(e) = spawned {
                    debug!("registration {}: no claim thread ({e})", reg.bound);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let mut fds = [
                    libc::pollfd {
                        fd: listener.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: reg.wake.load(Ordering::Relaxed),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: reg.refusals[0].load(Ordering::Relaxed),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                // SAFETY: three valid pollfds (a negative fd is ignored by poll).
                unsafe { real::poll(fds.as_mut_ptr(), 3, 200) };
                if fds[2].revents != 0 {
                    reg.read_refusals();
                }
            }
            Err(e) => {
                debug!("registration {}: accept: {e}", reg.bound);
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    debug!("registration {}: ended", reg.bound);
    // Dropping the listener removes its socket file; pending claims end with it.
    let mut st = reg.lock();
    drop(listener);
    st.pending.clear();
    st.claimed.clear();
    for end in &reg.refusals {
        let fd = end.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            state::set_internal(&[fd], false);
            // SAFETY: our own pipe end, swapped out: no one uses it after.
            unsafe { real::close(fd) };
        }
    }
    let wake = reg.wake.swap(-1, Ordering::Relaxed);
    if wake >= 0 {
        state::set_internal(&[wake], false);
        // SAFETY: our own eventfd, swapped out under the lock: no one writes it after.
        unsafe { real::close(wake) };
    }
    reg.ended.store(true, Ordering::Relaxed);
    drop(st);
    reg.changed.notify_all();
}

/// A non-blocking eventfd for waking a helper, hidden from the program (-1 on failure).
fn new_wake_fd() -> RawFd {
    // SAFETY: plain eventfd creation.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd >= 0 {
        state::set_internal(&[fd], true);
    }
    fd
}

fn handle_claim(token: InFlight, mut conn: Connection) {
    let reg = token.0.clone();
    conn.set_nonblocking(true);
    if conn.send(&[READY]).is_err() {
        return;
    }
    let msg = receive(&mut conn, CLAIM_TIMEOUT);
    if msg.is_empty() {
        return;
    }
    let claimant = peer_uid(conn.as_raw_fd());
    if let Some((key, name)) = decode_query(&msg) {
        // Not a claim: another process accepted a TCP connection on the shared socket.
        drop(token);
        // Only the registering uid's own processes (forked workers) ask; an allowed
        // client of another uid may not send connections elsewhere.
        if !claimant.is_some_and(|u| u == reg.uid || u == 0) {
            debug!(
                "registration {}: a query from uid {claimant:?}, not uid {}: no",
                reg.bound, reg.uid
            );
            let _ = conn.send(&[NO]);
            return;
        }
        let yes = reg.serves(&key.0) && reg.answer_query(key, &name);
        let _ = conn.send(&[if yes { YES } else { NO }]);
        return;
    }
    match decode_claim(&msg) {
        Some(key) if !claim_is_theirs(&reg, claimant, &key) => {
            let _ = conn.send(&[NO]);
        }
        Some(key) => reg.answer(key, conn),
        None => {
            debug!(
                "registration {}: malformed claim of {} bytes",
                reg.bound,
                msg.len()
            );
            let _ = conn.send(&[NO]);
        }
    }
}

/// The uid of the process at the other end of a claim connection (`SO_PEERCRED`).
fn peer_uid(fd: RawFd) -> Option<u32> {
    // SAFETY: ucred is plain data; all zeroes is a valid value.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as socklen_t;
    // SAFETY: a valid out-parameter of the size given.
    let rc = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

/// Whether the claimant may claim TCP connection `key`. A claimant of this process's
/// uid or root may (the default policy admits no one else). A client of another uid,
/// admitted by `--allow-uid`/`--allow-gid`, may claim only a connection whose client
/// socket its own uid owns (the kernel's table, `/proc/net/tcp{,6}`): otherwise it
/// could claim another client's connection by its four addresses, and the server
/// program would talk to it in that client's place.
fn claim_is_theirs(reg: &Registration, claimant: Option<u32>, key: &Key) -> bool {
    let Some(uid) = claimant else {
        debug!("claim {} <- {}: no peer credentials: no", key.0, key.1);
        return false;
    };
    if uid == 0 || uid == reg.uid || uid == shmlink_euid() {
        return true;
    }
    match tcp_socket_uid(&key.1, &key.0) {
        Some(owner) if owner == uid => true,
        owner => {
            debug!(
                "claim {} <- {}: from uid {uid}, but the connection's socket belongs to \
                 {owner:?}: no",
                key.0, key.1
            );
            false
        }
    }
}

/// The uid that owns the TCP socket from `local` to `remote` in this network namespace,
/// from `/proc/net/tcp` and `/proc/net/tcp6` (addresses as the kernel prints them: each
/// 32-bit word in host byte order, in hex).
fn tcp_socket_uid(local: &Endpoint, remote: &Endpoint) -> Option<u32> {
    let hex = |ep: &Endpoint, v6: bool| -> String {
        let words: &[u8] = if v6 { &ep.ip } else { &ep.ip[12..] };
        let mut s: String = words
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
            .collect();
        s.push_str(&format!(":{:04X}", ep.port));
        s
    };
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let both_v4 = local.is_v4() && remote.is_v4();
        if !v6 && !both_v4 {
            continue; // an IPv6 connection is only in tcp6
        }
        let (l, r) = (hex(local, v6), hex(remote, v6));
        let Ok(table) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in table.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 7 && f[1] == l && f[2] == r {
                return f[7].parse().ok();
            }
        }
    }
    None
}

/// A query: the claim's encoding under [`QMAGIC`], then the name where the accepting
/// process waits.
fn encode_query(key: &Key, name: &str) -> Vec<u8> {
    let mut v = encode_claim(&key.0, &key.1);
    v[..4].copy_from_slice(QMAGIC);
    v.extend_from_slice(name.as_bytes());
    v
}

/// A shmlink name as this library makes them (untrusted input: checked).
fn valid_name(b: &[u8]) -> Option<String> {
    let ok = !b.is_empty()
        && b.len() <= 200
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_./".contains(c))
        && !b.windows(2).any(|w| w == b"..");
    ok.then(|| String::from_utf8_lossy(b).into_owned())
}

fn decode_query(msg: &[u8]) -> Option<(Key, String)> {
    if msg.len() <= CLAIM_LEN || &msg[..4] != QMAGIC {
        return None;
    }
    let mut claim = msg[..CLAIM_LEN].to_vec();
    claim[..4].copy_from_slice(MAGIC);
    Some((decode_claim(&claim)?, valid_name(&msg[CLAIM_LEN..])?))
}

fn encode_claim(server: &Endpoint, client: &Endpoint) -> Vec<u8> {
    let mut v = Vec::with_capacity(CLAIM_LEN);
    v.extend_from_slice(MAGIC);
    v.push(VERSION);
    for ep in [server, client] {
        v.extend_from_slice(&ep.ip);
        v.extend_from_slice(&ep.port.to_be_bytes());
    }
    v
}

fn decode_claim(msg: &[u8]) -> Option<Key> {
    if msg.len() != CLAIM_LEN || &msg[..4] != MAGIC || msg[4] != VERSION {
        return None;
    }
    let ep = |b: &[u8]| Endpoint {
        ip: b[..16].try_into().expect("16 bytes"),
        port: u16::from_be_bytes([b[16], b[17]]),
    };
    Some((ep(&msg[5..23]), ep(&msg[23..41])))
}

/// Where a listener that a connection to `server` may have reached would register, the
/// ones that exist: the exact address, then the wildcards.
fn candidates(server: &Endpoint) -> Vec<String> {
    let mut eps = vec![*server];
    if server.is_v4() {
        eps.push(Endpoint {
            ip: Ipv4Addr::UNSPECIFIED.to_ipv6_mapped().octets(),
            port: server.port,
        });
    }
    eps.push(Endpoint {
        ip: [0; 16],
        port: server.port,
    });
    let mut said = false;
    eps.iter()
        .filter(|ep| match std::fs::symlink_metadata(reg_path(ep)) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && !said => {
                // Not silent: a server of another uid made the directory for itself.
                said = true;
                debug!(
                    "connect {server}: cannot look for a registration in {} ({e}): a \
                     server of another uid must allow uid {} with `shmlink run --allow-uid` \
                     (docs/transparent.md, \"Across users\"); plain TCP",
                    shmlink::rendezvous_dir().display(),
                    shmlink_euid()
                );
                false
            }
            Err(_) => false,
        })
        .map(|ep| format!("shm:{}", reg_name(ep)))
        .collect()
}

/// This process's effective uid, for messages.
fn shmlink_euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// The destination of a `connect` call, if it is an IPv4/IPv6 address.
pub(crate) fn dest_of(addr: *const libc::sockaddr, len: socklen_t) -> Option<Endpoint> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let n = (len as usize).min(std::mem::size_of::<sockaddr_storage>());
    // SAFETY: the caller's address holds `len` bytes; `ss` has room for `n`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            addr.cast::<u8>(),
            (&mut ss as *mut sockaddr_storage).cast::<u8>(),
            n,
        )
    };
    endpoint(&ss, n as socklen_t)
}

/// Before the TCP `connect` to `server`: opens a claim connection to the listener
/// registered for it, if there is one (one `stat` per candidate when there is none).
/// Opening it first tells the server a claim is coming, so its `accept` waits for it.
pub(crate) fn open(server: &Endpoint) -> Option<Connection> {
    for addr in candidates(server) {
        match Connection::connect(&addr, &options()) {
            Ok(mut c) => {
                c.set_nonblocking(true);
                if receive(&mut c, ANSWER_TIMEOUT) == [READY] {
                    return Some(c);
                }
                debug!("connect {server}: registration {addr} did not get ready");
                return None;
            }
            Err(e) if e.kind() == ErrorKind::PermissionDenied => debug!(
                "connect {server}: registration {addr} refused ({e}); plain TCP. Across \
                 users, the server's side allows this uid ({}) with `shmlink run \
                 --allow-uid`, this side trusts the server's uid with `--expect-uid` \
                 (docs/transparent.md, \"Across users\")",
                shmlink_euid()
            ),
            Err(e) => debug!("connect {server}: registration {addr} unusable ({e})"),
        }
    }
    None
}

/// One message from a non-blocking `conn` within `timeout`; empty on timeout or error.
fn receive(conn: &mut Connection, timeout: Duration) -> Vec<u8> {
    let deadline = Instant::now() + timeout;
    loop {
        match conn.recv_vec() {
            Ok(m) => return m,
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                real::poll_one(conn.as_raw_fd(), libc::POLLIN, 50);
            }
            Err(_) => return Vec::new(),
        }
    }
}

/// After the TCP `connect` of `fd` succeeded: claims it over `conn` (from [`open`]).
/// Returns the connection that replaces it if the listener said yes, else `None`
/// (stay on TCP).
pub(crate) fn claim(mut conn: Connection, fd: RawFd) -> Option<(Connection, Endpoint, Endpoint)> {
    let server = sock_endpoint(fd, true)?;
    let client = sock_endpoint(fd, false)?;
    // Only a destination on this kernel can be a preloaded listener here: loopback, or
    // one of our own addresses (the kernel then picks it as the source too).
    if !(server.is_loopback() || server.ip == client.ip) {
        return None;
    }
    let claim = encode_claim(&server, &client);
    conn.send(&claim).ok()?;
    let answer = receive(&mut conn, ANSWER_TIMEOUT);
    if answer == [YES] {
        return Some((conn, client, server));
    }
    if answer == [CONFIRM] {
        conn.send(&[CONFIRMED]).ok()?;
        return Some((conn, client, server));
    }
    if answer.first() == Some(&GO) {
        // A shared listening socket: the process that accepted our TCP connection
        // waits for us at its own address.
        let name = valid_name(&answer[1..])?;
        let mut c = match Connection::connect(&format!("shm:{name}"), &options()) {
            Ok(c) => c,
            Err(e) => {
                debug!("connect {server}: accepting process unreachable ({e}); plain TCP");
                return None;
            }
        };
        c.set_nonblocking(true);
        c.send(&claim).ok()?;
        if receive(&mut c, ANSWER_TIMEOUT) == [CONFIRM] && c.send(&[CONFIRMED]).is_ok() {
            debug!("connect {server}: claim taken by the accepting process ({name})");
            return Some((c, client, server));
        }
        debug!("connect {server}: the accepting process did not confirm; plain TCP");
        return None;
    }
    debug!("connect {server}: claim refused; plain TCP");
    None
}

/// The accepting process's yes on a shared socket: CONFIRM, then the client's CONFIRMED
/// (or its close: it gave up, the connection stays TCP).
fn confirm(mut conn: Connection, key: Key) -> Option<Connection> {
    if conn.send(&[CONFIRM]).is_err() {
        debug!("accept {} <- {}: claim dropped; stays TCP", key.0, key.1);
        return None;
    }
    if receive(&mut conn, CONFIRM_WAIT) == [CONFIRMED] {
        debug!("claim {} <- {}: yes (accepted here)", key.0, key.1);
        return Some(conn);
    }
    debug!(
        "accept {} <- {}: the client gave up; stays TCP",
        key.0, key.1
    );
    None
}

/// The side of a process that accepts on a listening socket whose registration another
/// process holds (a forked worker, a later member of an SO_REUSEPORT group).
mod worker {
    use super::*;

    struct State {
        pid: u32,
        listener: Listener,
        name: String,
    }

    /// This process's own shmlink listener, where clients sent here arrive.
    static STATE: Mutex<Option<State>> = Mutex::new(None);

    /// At exit (statics are not dropped): removes this process's listener's socket file.
    extern "C" fn remove_at_exit() {
        let _g = Guard::enter();
        if let Ok(mut guard) = STATE.try_lock() {
            if let Some(st) = guard.take() {
                if st.pid == std::process::id() {
                    drop(st);
                } else {
                    std::mem::forget(st);
                }
            }
        }
    }

    /// TCP connection `key` was accepted here: asks the registering process whether it
    /// was claimed; if so its client comes to this process's listener with the same
    /// claim and this process confirms. The connection to use, or `None` (plain TCP).
    pub(crate) fn query(reg: &Registration, key: Key) -> Option<Connection> {
        if !reg.serves(&key.0) {
            return None;
        }
        // SAFETY: plain geteuid.
        if unsafe { libc::geteuid() } != reg.uid {
            // The helper would not admit us (and our listener would not be trusted by
            // its clients): its claim, if any, is answered no at once.
            reg.refuse(key);
            debug!(
                "accept {} <- {}: another uid than the registration's; TCP",
                key.0, key.1
            );
            return None;
        }
        let r = query_inner(reg, key);
        if r.is_none() {
            reg.refuse(key);
        }
        r
    }

    fn query_inner(reg: &Registration, key: Key) -> Option<Connection> {
        let pid = std::process::id();
        let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
        if guard.as_ref().is_some_and(|s| s.pid != pid) {
            // Inherited across a fork: that listener and its socket file are the
            // parent's, not to be closed here.
            std::mem::forget(guard.take());
        }
        if guard.is_none() {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let dir = reg.path.parent().map(PathBuf::from).unwrap_or_default();
            let name = dir
                .join(format!("tcpw-{:x}-{pid}-{nanos:x}.sock", netns()))
                .display()
                .to_string();
            let mut l = match Listener::bind(&format!("shm:{name}"), &options()) {
                Ok(l) => l,
                Err(e) => {
                    debug!(
                        "accept {} <- {}: no listener of ours ({e}); TCP",
                        key.0, key.1
                    );
                    return None;
                }
            };
            l.set_nonblocking(true);
            static AT_EXIT: std::sync::Once = std::sync::Once::new();
            // SAFETY: registers a plain function.
            AT_EXIT.call_once(|| unsafe {
                libc::atexit(remove_at_exit);
            });
            *guard = Some(State {
                pid,
                listener: l,
                name,
            });
        }
        let st = guard.as_mut()?;
        let mut q = match Connection::connect(&format!("shm:{}", reg.path.display()), &options()) {
            Ok(q) => q,
            Err(e) => {
                debug!(
                    "accept {} <- {}: registration unreachable ({e}); TCP",
                    key.0, key.1
                );
                return None;
            }
        };
        q.set_nonblocking(true);
        if receive(&mut q, ANSWER_TIMEOUT) != [READY] {
            return None;
        }
        q.send(&encode_query(&key, &st.name)).ok()?;
        if receive(&mut q, ACCEPT_WAIT + Duration::from_secs(1)) != [YES] {
            debug!("accept {} <- {}: not claimed; TCP", key.0, key.1);
            return None;
        }
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        while Instant::now() < deadline {
            match st.listener.accept() {
                Ok(mut c) => {
                    c.set_nonblocking(true);
                    let m = receive(&mut c, deadline.saturating_duration_since(Instant::now()));
                    if decode_claim(&m) == Some(key) {
                        return confirm(c, key);
                    }
                    debug!(
                        "accept {} <- {}: a stray client ({} bytes)",
                        key.0,
                        key.1,
                        m.len()
                    );
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    real::poll_one(st.listener.as_raw_fd(), libc::POLLIN, 50);
                }
                Err(e) => {
                    debug!("accept {} <- {}: {e}; TCP", key.0, key.1);
                    return None;
                }
            }
        }
        debug!(
            "accept {} <- {}: the client did not come; TCP",
            key.0, key.1
        );
        None
    }
}
