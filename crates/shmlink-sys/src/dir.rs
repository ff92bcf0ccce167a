//! Directories held by descriptor: opened without following a final symbolic link,
//! created and inspected relative to an open parent (`mkdirat`, `openat`, `fstat`,
//! `fchmod`), so that no path is looked up twice between a check and the action on it.
//!
//! [`create_dir_all`] is the race-free `mkdir -p` of a private directory: every component
//! it creates is made with `mkdirat` under its parent's descriptor and opened with
//! `O_NOFOLLOW`, and only a directory it made itself (and still owns) gets its mode fixed
//! with `fchmod`. A symbolic link that another user swaps in at a component's name is
//! never followed: the call fails instead.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use crate::{owned, syscall};

/// What `fstat` says about a directory: enough to check who controls it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirStat {
    /// The owner.
    pub uid: u32,
    /// The permission bits (`mode & 0o7777`).
    pub mode: u32,
    /// Device and inode: which directory it is.
    pub dev: u64,
    /// See `dev`.
    pub ino: u64,
}

/// An open directory (`O_RDONLY | O_DIRECTORY | O_CLOEXEC`).
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

fn cstring(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

const DIR_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;

impl Dir {
    /// Opens the directory at `path`; a symbolic link as its last component is refused
    /// (`ENOTDIR`), links in the components before it are followed.
    pub fn open_nofollow(path: &Path) -> io::Result<Dir> {
        let c = cstring(path.as_os_str())?;
        // SAFETY: `c` is a NUL-terminated path that lives across the call.
        let fd = syscall!(open(c.as_ptr(), DIR_FLAGS | libc::O_NOFOLLOW))?;
        // SAFETY: `open` just returned this descriptor; nothing else owns it.
        let fd = unsafe { owned(fd) };
        Ok(Dir { fd })
    }

    /// Opens `name` (one component) in this directory, never following a symbolic
    /// link there (`ENOTDIR`, as for anything else that is not a directory).
    pub fn open_at(&self, name: &OsStr) -> io::Result<Dir> {
        let c = cstring(name)?;
        // SAFETY: `self.fd` is open; `c` is a NUL-terminated name that lives across the call.
        let fd = syscall!(openat(
            self.fd.as_raw_fd(),
            c.as_ptr(),
            DIR_FLAGS | libc::O_NOFOLLOW
        ))?;
        // SAFETY: `openat` just returned this descriptor; nothing else owns it.
        let fd = unsafe { owned(fd) };
        Ok(Dir { fd })
    }

    /// Creates directory `name` (one component) in this directory with `mode` (less the
    /// umask). `AlreadyExists` if anything has that name, a symbolic link included.
    pub fn mkdir_at(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        let c = cstring(name)?;
        // SAFETY: `self.fd` is open; `c` is a NUL-terminated name that lives across the call.
        syscall!(mkdirat(
            self.fd.as_raw_fd(),
            c.as_ptr(),
            mode as libc::mode_t
        ))?;
        Ok(())
    }

    /// The directory's owner, mode and identity (`fstat`).
    pub fn stat(&self) -> io::Result<DirStat> {
        // SAFETY: stat is plain data; all-zero is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid stat buffer; `self.fd` is open.
        syscall!(fstat(self.fd.as_raw_fd(), &mut st))?;
        Ok(DirStat {
            uid: st.st_uid,
            mode: st.st_mode & 0o7777,
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }

    /// Sets the directory's mode exactly (`fchmod`: this directory, whatever its path
    /// now leads to).
    pub fn chmod(&self, mode: u32) -> io::Result<()> {
        // SAFETY: `self.fd` is open; no pointers.
        syscall!(fchmod(self.fd.as_raw_fd(), mode as libc::mode_t))?;
        Ok(())
    }

    /// The descriptor.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// `mkdir -p path` without following a symbolic link at any name it creates, and
/// without ever opening `path` itself through a symbolic link.
///
/// The walk starts at `/` (or `.`) and opens one component at a time with
/// `openat(O_NOFOLLOW)`. A missing component is made with `mkdirat(mode)` and then
/// opened the same way; one that appeared meanwhile is used if it is a real directory.
/// A symbolic link is followed only before the last component and only if root or this
/// user owns it (the rule of Linux's `fs.protected_symlinks`: `/var/run` is followed, a
/// link another user planted is not); the last component is never a link (`ENOTDIR`). If
/// this call made the last component and owns it, its mode is set to `mode` exactly
/// with `fchmod` (the umask does not apply); a directory that existed keeps its mode.
/// Returns the opened directory and whether this call made it.
pub fn create_dir_all(path: &Path, mode: u32) -> io::Result<(Dir, bool)> {
    let names: Vec<&OsStr> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    if names.is_empty()
        || path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::Prefix(_)))
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: not a plain directory path (no `..`, not empty)",
                path.display()
            ),
        ));
    }
    let base = if path.is_absolute() { "/" } else { "." };
    let c = cstring(OsStr::new(base))?;
    // SAFETY: `c` is a NUL-terminated path that lives across the call.
    let fd = syscall!(open(c.as_ptr(), DIR_FLAGS))?;
    // SAFETY: `open` just returned this descriptor; nothing else owns it.
    let fd = unsafe { owned(fd) };
    let mut dir = Dir { fd };
    let mut made = false;
    for (i, name) in names.iter().enumerate() {
        let last = i + 1 == names.len();
        made = false;
        let next = match dir.open_at(name) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                made = match dir.mkdir_at(name, mode) {
                    Ok(()) => true,
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
                    Err(e) => return Err(e),
                };
                dir.open_at(name)?
            }
            Err(e) if !last && dir.is_trusted_link(name) => {
                let _ = e;
                dir.open_following(name)?
            }
            Err(e) => return Err(e),
        };
        dir = next;
        if last && made {
            // Ours only if we own it: between mkdirat and openat another user who can
            // write the parent could have put a directory of theirs (or of a victim's)
            // in its place; never change the mode of one we did not make.
            if dir.stat()?.uid == crate::euid() {
                dir.chmod(mode)?;
            } else {
                made = false;
            }
        }
    }
    Ok((dir, made))
}

impl Dir {
    /// Whether `name` in this directory is a symbolic link owned by root or this user.
    fn is_trusted_link(&self, name: &OsStr) -> bool {
        let Ok(c) = cstring(name) else {
            return false;
        };
        // SAFETY: stat is plain data; all-zero is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `self.fd` is open; `c` lives across the call; `st` is a valid buffer.
        let r = syscall!(fstatat(
            self.fd.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW
        ));
        r.is_ok()
            && st.st_mode & libc::S_IFMT == libc::S_IFLNK
            && (st.st_uid == 0 || st.st_uid == crate::euid())
    }

    /// Opens directory `name` in this one, following a symbolic link there.
    fn open_following(&self, name: &OsStr) -> io::Result<Dir> {
        let c = cstring(name)?;
        // SAFETY: `self.fd` is open; `c` is a NUL-terminated name that lives across the call.
        let fd = syscall!(openat(self.fd.as_raw_fd(), c.as_ptr(), DIR_FLAGS))?;
        // SAFETY: `openat` just returned this descriptor; nothing else owns it.
        let fd = unsafe { owned(fd) };
        Ok(Dir { fd })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("shmlink-sys-dir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn creates_the_chain_with_the_exact_mode_of_the_last() {
        let d = scratch("chain");
        let path = d.join("a/b/c");
        let (dir, made) = create_dir_all(&path, 0o711).unwrap();
        assert!(made);
        assert_eq!(dir.stat().unwrap().mode, 0o711);
        let m = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o711);
        // Again: it exists, keeps its mode, and is not "made".
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        let (dir, made) = create_dir_all(&path, 0o711).unwrap();
        assert!(!made);
        assert_eq!(dir.stat().unwrap().mode, 0o700);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_symbolic_link_anywhere_it_creates_is_refused_and_its_target_untouched() {
        let d = scratch("link");
        let victim = d.join("victim");
        std::fs::create_dir(&victim).unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&victim, d.join("last")).unwrap();
        std::os::unix::fs::symlink(&victim, d.join("middle")).unwrap();
        // A link another user planted (made theirs when we can: as root).
        let foreign = crate::euid() == 0
            && std::os::unix::fs::lchown(d.join("middle"), Some(65534), Some(65534)).is_ok();
        let last = create_dir_all(&d.join("last"), 0o700).unwrap_err();
        let middle = create_dir_all(&d.join("middle/x"), 0o700);
        let mode = std::fs::metadata(&victim).unwrap().permissions().mode() & 0o7777;
        let entries = std::fs::read_dir(&victim).unwrap().count();
        let _ = std::fs::remove_dir_all(&d);
        // O_NOFOLLOW | O_DIRECTORY on a link: ENOTDIR (ELOOP without O_DIRECTORY).
        let refused = |e: &io::Error| matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR));
        assert!(refused(&last), "{last}");
        assert_eq!(mode, 0o755);
        if foreign {
            let e = middle.expect_err("a foreign link in the chain is refused");
            assert!(refused(&e), "{e}");
            assert_eq!(entries, 0, "nothing was made in the link's target");
        } else {
            let _ = middle;
        }
    }
}
