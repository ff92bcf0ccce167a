//! The listening side: a preloaded `listen` registers its socket ([`register`]) and a
//! helper thread answers claims on it; `accept` takes the claimed connection
//! ([`Registration::take`]). A process that accepts on a socket another process
//! registered (a forked worker, an SO_REUSEPORT group) asks that process instead.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use libc::socklen_t;
use shmlink::{Connection, ErrorKind, Listener};

use super::addr::{is_tcp, netns, sock_endpoint, sockopt_int, tcp_socket_uid, Endpoint, Key};
use super::wire::{
    confirm, decode_claim, decode_query, encode_claim, encode_query, options, receive, reg_name,
    reg_path, shmlink_euid, ACCEPT_WAIT, ANSWER_TIMEOUT, CLAIM_LEN, CLAIM_TIMEOUT, DECIDED_TTL, GO,
    NO, READY, YES,
};
use crate::state::{self, FORKS};
use crate::{config, debug, real, Guard};

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
            return worker_query(self, key).map(|c| (c, None));
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
        // A second claim of a connection already claimed is not the client's (only one
        // client socket has these four addresses): no, and the first stands.
        let again = st.pending.contains_key(&key) || st.claimed.contains_key(&key);
        let yes = self.live() && self.serves(&key.0) && !again && st.decided.remove(&key).is_none();
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
        Some(key)
            if !key.0.is_loopback()
                && key.0.ip != key.1.ip
                && tcp_socket_uid(&key.0, &key.1).is_none() =>
        {
            // Not a connection this network namespace holds: a client of another one
            // (a container sharing the directory) asking every registration of the port
            // (docs/containers.md, "Transparent mode between containers"). Only such a
            // claim names two different addresses that are not loopback (within one
            // namespace a client claims only loopback or its own address), so only it
            // pays for reading the table.
            debug!(
                "claim {} <- {}: no such TCP connection in this network namespace: no",
                key.0, key.1
            );
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

// The side of a process that accepts on a listening socket whose registration another
// process holds (a forked worker, a later member of an SO_REUSEPORT group).

/// A worker's own shmlink listener.
struct WorkerState {
    pid: u32,
    listener: Listener,
    name: String,
}

/// This process's own shmlink listener, where clients sent here arrive.
static WORKER: Mutex<Option<WorkerState>> = Mutex::new(None);

/// At exit (statics are not dropped): removes this process's listener's socket file.
extern "C" fn remove_worker_at_exit() {
    let _g = Guard::enter();
    if let Ok(mut guard) = WORKER.try_lock() {
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
fn worker_query(reg: &Registration, key: Key) -> Option<Connection> {
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
    let r = worker_query_inner(reg, key);
    if r.is_none() {
        reg.refuse(key);
    }
    r
}

fn worker_query_inner(reg: &Registration, key: Key) -> Option<Connection> {
    let pid = std::process::id();
    let mut guard = WORKER.lock().unwrap_or_else(|e| e.into_inner());
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
            libc::atexit(remove_worker_at_exit);
        });
        *guard = Some(WorkerState {
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
