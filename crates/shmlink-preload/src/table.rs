//! Which fd numbers this library looks after: shm connections (dups share one [`Entry`]),
//! registered listening sockets, per epoll instance the shm connections in it, and the
//! program's view of FD_CLOEXEC on shm fds.
//!
//! Lookups are what every hooked call on a plain fd pays, so an empty table costs one
//! atomic load. The library's one lock (`state`, which `fork` holds) guards it all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use libc::c_int;

use crate::peer::Registration;
use crate::sock::Entry;
use crate::state::{self, Shared};

/// One shm connection in one epoll set, as the application registered it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EpollReg {
    pub events: u32,
    pub data: u64,
    /// EPOLLONESHOT fired: no more events until EPOLL_CTL_MOD.
    pub disabled: bool,
    /// In the set as the program sees it (a DEL keeps the kernel's registration).
    pub app_added: bool,
    /// The EPOLLET/ONESHOT/EXCLUSIVE/WAKEUP flags of the kernel's registration.
    pub kflags: u32,
}

/// epoll fd → (shm fd → registration). Plain fds are the kernel's business alone.
pub(crate) type Epolls = HashMap<c_int, HashMap<c_int, EpollReg>>;

/// A shm member of an epoll set as one `epoll_wait` sees it.
pub(crate) type Member = (c_int, EpollReg, Arc<Entry>);

/// What `epoll_wait` works from, built once per change of the set rather than on every
/// call: a server that answers fifty connections per wait paid more for collecting them
/// (a lookup, an `Arc` clone and four vectors per call) than for looking at them.
pub(crate) struct EpollSnapshot {
    /// Every shm fd the kernel holds for the set, also those the program deleted.
    pub regs: Vec<(c_int, EpollReg)>,
    /// Level-triggered members the program has in the set (not disabled).
    pub level: Vec<Member>,
    /// Edge-triggered members the program has in the set (not disabled).
    pub edge: Vec<Member>,
}

impl EpollSnapshot {
    /// The registration of shm fd `fd`, if the set holds one.
    pub fn reg(&self, fd: c_int) -> Option<EpollReg> {
        self.regs.iter().find(|(f, _)| *f == fd).map(|(_, r)| *r)
    }

    /// The connection behind member `fd`, if it is one.
    pub fn entry(&self, fd: c_int) -> Option<&Arc<Entry>> {
        self.level
            .iter()
            .chain(&self.edge)
            .find(|(f, ..)| *f == fd)
            .map(|(.., e)| e)
    }
}

#[derive(Default)]
struct Tables {
    socks: Option<HashMap<c_int, Arc<Entry>>>,
    listeners: Option<HashMap<c_int, Arc<Registration>>>,
    epolls: Option<Epolls>,
    /// The program's view of FD_CLOEXEC on each shm fd. In the kernel every shm fd has
    /// FD_CLOEXEC: a shm connection cannot cross `exec` (the new image would get the
    /// control socket), so there it closes instead (see docs/transparent.md).
    cloexec: Option<HashMap<c_int, bool>>,
    /// Per epoll fd, the snapshot built from `epolls` and `socks` as they were; cleared
    /// whenever either changes. It holds entries: a closed fd's snapshot is dropped
    /// with it (outside the lock), so the cache never keeps a connection open.
    snapshots: Option<HashMap<c_int, Arc<EpollSnapshot>>>,
}

static TABLES: Shared<Tables> = Shared::new(Tables {
    socks: None,
    listeners: None,
    epolls: None,
    cloexec: None,
    snapshots: None,
});

/// Number of fds in the socket and listener maps: 0 makes every lookup free.
static TRACKED: AtomicUsize = AtomicUsize::new(0);

fn with<R>(f: impl FnOnce(&mut Tables) -> R) -> R {
    TABLES.with(f)
}

/// Whether anything is tracked at all (cheap pre-check for hooks).
#[inline]
pub(crate) fn any() -> bool {
    TRACKED.load(Ordering::Relaxed) != 0
}

/// The shm connection behind `fd`, if any.
#[inline]
pub(crate) fn sock(fd: c_int) -> Option<Arc<Entry>> {
    if !any() {
        return None;
    }
    with(|t| t.socks.as_ref()?.get(&fd).cloned())
}

/// Every fd number that names a shm connection.
pub(crate) fn sock_fds() -> Vec<c_int> {
    if !any() {
        return Vec::new();
    }
    with(|t| t.socks.as_ref().map(|m| m.keys().copied().collect())).unwrap_or_default()
}

/// The registration behind listening socket `fd`, if any.
pub(crate) fn listener(fd: c_int) -> Option<Arc<Registration>> {
    if !any() {
        return None;
    }
    with(|t| t.listeners.as_ref()?.get(&fd).cloned())
}

/// Makes `fd` name `entry`; returns what it named before (the caller drops it outside).
pub(crate) fn insert_sock(fd: c_int, entry: Arc<Entry>) -> Option<Arc<Entry>> {
    let (old, stale) = with(|t| {
        let old = t.socks.get_or_insert_with(HashMap::new).insert(fd, entry);
        (old, t.snapshots.take())
    });
    drop(stale);
    if old.is_none() {
        TRACKED.fetch_add(1, Ordering::Relaxed);
    }
    old
}

pub(crate) fn insert_listener(fd: c_int, reg: Arc<Registration>) -> Option<Arc<Registration>> {
    let old = with(|t| t.listeners.get_or_insert_with(HashMap::new).insert(fd, reg));
    if old.is_none() {
        TRACKED.fetch_add(1, Ordering::Relaxed);
    }
    old
}

/// What `fd` named, removed from the table (dropped by the caller, outside the lock).
pub(crate) enum Removed {
    Sock(Arc<Entry>),
    Listener(Arc<Registration>),
}

/// Forgets `fd` (it is being closed or replaced): what it named, if anything.
pub(crate) fn remove(fd: c_int) -> Option<Removed> {
    if !any() {
        return None;
    }
    let (removed, stale) = with(|t| {
        let removed = if let Some(e) = t.socks.as_mut().and_then(|m| m.remove(&fd)) {
            Some(Removed::Sock(e))
        } else {
            t.listeners
                .as_mut()
                .and_then(|m| m.remove(&fd))
                .map(Removed::Listener)
        };
        if removed.is_some() {
            if let Some(m) = t.epolls.as_mut() {
                for set in m.values_mut() {
                    set.remove(&fd);
                }
            }
            if let Some(m) = t.cloexec.as_mut() {
                m.remove(&fd);
            }
        }
        (removed, t.snapshots.take())
    });
    // The caller holds what `fd` named: dropping the snapshots here closes nothing.
    drop(stale);
    if removed.is_some() {
        TRACKED.fetch_sub(1, Ordering::Relaxed);
    }
    removed
}

/// Makes `new` name what `old` names (dup): true if `old` is tracked.
pub(crate) fn alias(old: c_int, new: c_int) -> bool {
    if let Some(e) = sock(old) {
        drop(insert_sock(new, e));
        return true;
    }
    if let Some(r) = listener(old) {
        drop(insert_listener(new, r));
        return true;
    }
    false
}

/// What the program set FD_CLOEXEC to on shm fd `fd`.
pub(crate) fn app_cloexec(fd: c_int) -> bool {
    with(|t| t.cloexec.as_ref().and_then(|m| m.get(&fd).copied())).unwrap_or(false)
}

pub(crate) fn set_app_cloexec(fd: c_int, on: bool) {
    with(|t| {
        t.cloexec.get_or_insert_with(HashMap::new).insert(fd, on);
    });
}

/// Runs `f` on the epoll registrations, under the lock (`f` must not call hooks). The
/// snapshots are rebuilt afterwards: `f` may have changed any set.
pub(crate) fn with_epolls<R>(f: impl FnOnce(&mut Epolls) -> R) -> R {
    let (r, stale) = with(|t| {
        (
            f(t.epolls.get_or_insert_with(HashMap::new)),
            t.snapshots.take(),
        )
    });
    drop(stale);
    r
}

/// The snapshot of epoll set `epfd` (empty if it has no shm fds): the cached one, or one
/// built now from the registrations and the connections behind them.
pub(crate) fn epoll_snapshot(epfd: c_int) -> Arc<EpollSnapshot> {
    with(|t| {
        if let Some(snap) = t.snapshots.as_ref().and_then(|m| m.get(&epfd)) {
            return snap.clone();
        }
        let regs: Vec<(c_int, EpollReg)> = t
            .epolls
            .as_ref()
            .and_then(|m| m.get(&epfd))
            .map(|set| set.iter().map(|(fd, r)| (*fd, *r)).collect())
            .unwrap_or_default();
        let members = |et: bool| -> Vec<Member> {
            regs.iter()
                .filter(|(_, r)| r.app_added && !r.disabled)
                .filter(|(_, r)| (r.events & libc::EPOLLET as u32 != 0) == et)
                .filter_map(|(fd, r)| {
                    let e = t.socks.as_ref()?.get(fd)?;
                    Some((*fd, *r, e.clone()))
                })
                .collect()
        };
        let snap = Arc::new(EpollSnapshot {
            level: members(false),
            edge: members(true),
            regs,
        });
        t.snapshots
            .get_or_insert_with(HashMap::new)
            .insert(epfd, snap.clone());
        snap
    })
}

/// Whether `fd` is one of the library's own fds (`state::set_internal`).
pub(crate) fn is_internal(fd: c_int) -> bool {
    any() && state::is_internal(fd)
}

/// Every fd number the table knows: shm connections, listeners, epoll instances.
pub(crate) fn tracked_fds() -> Vec<c_int> {
    with(|t| {
        let mut v: Vec<c_int> = Vec::new();
        if let Some(m) = t.socks.as_ref() {
            v.extend(m.keys());
        }
        if let Some(m) = t.listeners.as_ref() {
            v.extend(m.keys());
        }
        if let Some(m) = t.epolls.as_ref() {
            v.extend(m.keys());
        }
        v
    })
}
