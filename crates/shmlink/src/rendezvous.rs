//! The rendezvous socket of a `shm:` address: binding it (the directory created, a stale
//! socket file taken over, a live one refused, the file's mode set for the access
//! options), removing its file, and sweeping the stale sockets other listeners left in the
//! rendezvous directory. Shared by the `shm:` listener, `auto:`'s upgrade socket and the
//! publish/subscribe publisher; below all of them.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::addr::{rendezvous_dir, Address, UnixName};
use crate::error::{Error, ErrorKind, Result};
use crate::options::Options;
use crate::sys::dirlock::DirLock;
use crate::sys::socket;
use crate::trust;

/// The rendezvous socket's name in a `shm:` address.
pub(crate) fn socket_of(addr: &Address) -> &UnixName {
    match addr {
        Address::Shm { socket, .. } => socket,
        _ => unreachable!("the registry only hands shm: addresses to the shm transport"),
    }
}

/// A bound rendezvous socket file: its path and (device, inode), so that it is removed
/// on drop only if it is still ours (a later listener may have replaced it).
pub(crate) type SocketFile = Option<(PathBuf, u64, u64)>;

/// Binds the rendezvous socket of a `shm:` address: creates the directory for `shm:NAME`
/// (mode `opts.dir_mode`), takes over a stale socket file, refuses a live one
/// (`AddrInUse`), and gives the socket file the mode the access options need. Shared by
/// the `shm:` listener and the publish/subscribe publisher.
pub(crate) fn bind_rendezvous(addr: &Address, opts: &Options) -> Result<(OwnedFd, SocketFile)> {
    let name = socket_of(addr);
    // Held until our socket listens: see `prepare_path`.
    let _takeover = match name {
        UnixName::Path(path) => prepare_path(addr, path, opts)?,
        UnixName::Abstract(_) => None,
    };
    // Bind and chmod in the directory that was checked and locked, through its
    // descriptor, not by its path again: a link swapped in at the directory's name
    // meanwhile is not followed.
    let at = match (name, &_takeover) {
        (UnixName::Path(p), Some(lock)) if addr.in_rendezvous_dir() => {
            through_fd(lock, p).map(UnixName::Path)
        }
        _ => None,
    };
    let at = at.as_ref().unwrap_or(name);
    let listen = socket::listen(at, 128).map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            Error::new(ErrorKind::AddrInUse, format!("{addr} is already bound"))
        } else {
            Error::io("bind rendezvous socket", e)
        }
    })?;
    let file = match (name, at) {
        (UnixName::Path(p), UnixName::Path(bound)) => {
            // Connecting needs write permission on the socket file: the owner only, unless
            // the options allow others (then the credential check is the gate).
            let others = !opts.allow_uids.is_empty() || !opts.allow_gids.is_empty();
            let mode = if others { 0o666 } else { 0o600 };
            let (dev, ino) = socket::chmod_socket_file(bound, mode)
                .map_err(|e| Error::io("set the rendezvous socket's mode", e))?;
            Some((p.clone(), dev, ino))
        }
        _ => None,
    };
    Ok((listen, file))
}

/// `/proc/self/fd/N/FILE`: the socket file `path` reached through the locked directory's
/// descriptor `N` (the kernel resolves it to that very directory). `None` without
/// `/proc`, or when the name would not fit a socket address.
fn through_fd(lock: &DirLock, path: &std::path::Path) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    let file = path.file_name()?;
    let dir = PathBuf::from(format!("/proc/self/fd/{}", lock.fd().as_raw_fd()));
    let p = dir.join(file);
    (p.as_os_str().len() < 100 && dir.is_dir()).then_some(p)
}

/// Removes a socket file `bind_rendezvous` created, if it is still the same file.
pub(crate) fn remove_socket_file(file: &SocketFile) {
    if let Some((path, dev, ino)) = file {
        if let Ok(m) = std::fs::symlink_metadata(path) {
            if m.dev() == *dev && m.ino() == *ino {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// Creates the rendezvous directory (0700) for `shm:NAME` and removes a stale socket
/// file; a live listener on the path is `AddrInUse`.
///
/// Taking over a stale socket is probe, unlink, bind, listen: two binders doing that at
/// once could both find it stale, and the second unlink would delete the first's live
/// socket (which then listens on a name nobody reaches); a prober between bind and listen
/// would also take a new socket for stale. So the steps run under an exclusive `flock` on
/// the directory, returned here and held by the caller until its socket listens; every
/// binder and stale-socket sweeper of shmlink takes it. Where the directory cannot be
/// opened or locked (no read permission, a file system without `flock`), the takeover
/// runs unlocked as before.
fn prepare_path(addr: &Address, path: &std::path::Path, opts: &Options) -> Result<Option<DirLock>> {
    let mut opened = None;
    if addr.in_rendezvous_dir() {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            opened = open_rendezvous_dir(dir, opts)?;
        }
    }
    trust::check_addr_dir(addr, opts)?;
    // The lock on the very directory checked above, else (a path of the caller's) by path.
    let lock = match opened {
        Some(dir) => DirLock::lock_fd(dir.into_fd()).ok(),
        None => lock_parent(path),
    };
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
    Ok(lock)
}

/// Creates (mode `opts.dir_mode`, parents as needed) or opens the rendezvous directory
/// `dir` through descriptors and checks the directory it opened (`fstat`): no path is
/// followed twice, so a symbolic link swapped in at any name it creates is refused, and
/// only a directory it made itself gets its mode set (`fchmod`). See
/// [`crate::sys::dir::create_dir_all`].
/// `None` for an existing directory this user may use but not open (no read
/// permission): it is then checked and locked by path, as before.
fn open_rendezvous_dir(
    dir: &std::path::Path,
    opts: &Options,
) -> Result<Option<crate::sys::dir::Dir>> {
    let d = match crate::sys::dir::create_dir_all(dir, opts.dir_mode) {
        Ok((d, _made)) => d,
        Err(e) => {
            // A symbolic link or another file in its place: the path check says so.
            trust::check_dir(dir, opts)?;
            let unreadable = e.kind() == io::ErrorKind::PermissionDenied
                && std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
            if unreadable {
                return Ok(None);
            }
            return Err(Error::io(
                format!("create rendezvous directory {}", dir.display()),
                e,
            ));
        }
    };
    let st = d
        .stat()
        .map_err(|e| Error::io(format!("stat rendezvous directory {}", dir.display()), e))?;
    trust::check_dir_owner(dir, st.uid, st.mode, opts)?;
    Ok(Some(d))
}

/// Locks the directory that holds `path` (see [`prepare_path`]), if it can.
pub(crate) fn lock_parent(path: &std::path::Path) -> Option<DirLock> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    DirLock::lock(dir).ok()
}

/// Removes the sockets named `PREFIX….sock` in the rendezvous directory that nobody
/// listens on any more (their owner died); live ones answer and are kept. Under the
/// directory's lock, like every takeover of a stale socket, so that a socket another
/// binder has bound but not yet made listen is not taken for stale.
pub(crate) fn remove_stale_sockets(prefix: &str) {
    let dir = rendezvous_dir();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let _lock = lock_parent(&dir.join("_"));
    for path in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        let ours = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".sock"));
        if !ours {
            continue;
        }
        let probe = socket::connect(
            &UnixName::Path(path.clone()),
            Instant::now() + Duration::from_millis(100),
        );
        if matches!(&probe, Err(e) if e.kind() == io::ErrorKind::ConnectionRefused) {
            let _ = std::fs::remove_file(&path);
        }
    }
}
