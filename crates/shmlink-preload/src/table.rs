//! Which fd numbers this library looks after: shm connections (dups share one [`Entry`]),
//! registered listening sockets, and per epoll instance the shm connections in it.
//!
//! Lookups are what every hooked call on a plain fd pays, so an empty table costs one
//! atomic load; locks are never held while the library runs (which may call hooks).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use libc::c_int;

use crate::peer::Registration;
use crate::sock::Entry;

/// Number of fds in [`SOCKS`] plus [`LISTENERS`]: 0 makes every lookup free.
static TRACKED: AtomicUsize = AtomicUsize::new(0);

static SOCKS: RwLock<Option<HashMap<c_int, Arc<Entry>>>> = RwLock::new(None);
static LISTENERS: RwLock<Option<HashMap<c_int, Arc<Registration>>>> = RwLock::new(None);

/// One shm connection in one epoll set, as the application registered it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EpollReg {
    pub events: u32,
    pub data: u64,
    /// EPOLLONESHOT fired: no more events until EPOLL_CTL_MOD.
    pub disabled: bool,
}

/// epoll fd → (shm fd → registration). Plain fds are the kernel's business alone.
static EPOLLS: Mutex<Option<HashMap<c_int, HashMap<c_int, EpollReg>>>> = Mutex::new(None);

/// The program's view of FD_CLOEXEC on each shm fd. In the kernel every shm fd has
/// FD_CLOEXEC: a shm connection cannot cross `exec` (the new image would get the control
/// socket), so there it closes instead (see docs/transparent.md).
static APP_CLOEXEC: Mutex<Option<HashMap<c_int, bool>>> = Mutex::new(None);

fn app_cloexec_map() -> MutexGuard<'static, Option<HashMap<c_int, bool>>> {
    APP_CLOEXEC.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the program set FD_CLOEXEC to on shm fd `fd`.
pub(crate) fn app_cloexec(fd: c_int) -> bool {
    app_cloexec_map()
        .as_ref()
        .and_then(|m| m.get(&fd).copied())
        .unwrap_or(false)
}

pub(crate) fn set_app_cloexec(fd: c_int, on: bool) {
    app_cloexec_map()
        .get_or_insert_with(HashMap::new)
        .insert(fd, on);
}

fn read<T>(l: &RwLock<Option<T>>) -> std::sync::RwLockReadGuard<'_, Option<T>> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<Option<T>>) -> std::sync::RwLockWriteGuard<'_, Option<T>> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn epolls() -> MutexGuard<'static, Option<HashMap<c_int, HashMap<c_int, EpollReg>>>> {
    EPOLLS.lock().unwrap_or_else(|e| e.into_inner())
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
    read(&SOCKS).as_ref()?.get(&fd).cloned()
}

/// The registration behind listening socket `fd`, if any.
pub(crate) fn listener(fd: c_int) -> Option<Arc<Registration>> {
    if !any() {
        return None;
    }
    read(&LISTENERS).as_ref()?.get(&fd).cloned()
}

/// Makes `fd` name `entry`; returns what it named before (the caller drops it outside).
pub(crate) fn insert_sock(fd: c_int, entry: Arc<Entry>) -> Option<Arc<Entry>> {
    let old = write(&SOCKS)
        .get_or_insert_with(HashMap::new)
        .insert(fd, entry);
    if old.is_none() {
        TRACKED.fetch_add(1, Ordering::Relaxed);
    }
    old
}

pub(crate) fn insert_listener(fd: c_int, reg: Arc<Registration>) -> Option<Arc<Registration>> {
    let old = write(&LISTENERS)
        .get_or_insert_with(HashMap::new)
        .insert(fd, reg);
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
    let removed = if let Some(e) = write(&SOCKS).as_mut().and_then(|m| m.remove(&fd)) {
        Some(Removed::Sock(e))
    } else {
        write(&LISTENERS)
            .as_mut()
            .and_then(|m| m.remove(&fd))
            .map(Removed::Listener)
    };
    if removed.is_some() {
        TRACKED.fetch_sub(1, Ordering::Relaxed);
        if let Some(m) = app_cloexec_map().as_mut() {
            m.remove(&fd);
        }
        if let Some(m) = epolls().as_mut() {
            for set in m.values_mut() {
                set.remove(&fd);
            }
        }
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
