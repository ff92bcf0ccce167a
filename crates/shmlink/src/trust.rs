//! Who may be at the other end of a local connection, and which rendezvous directories
//! can be trusted (docs/threat-model.md).
//!
//! - A listener or publisher admits a client whose `SO_PEERCRED` uid is its own, root's,
//!   or one its options allow ([`check_client`]).
//! - A client or subscriber accepts a listener or publisher whose uid is its own, root's,
//!   or one it expects ([`check_server`]): anyone in the network namespace can bind an
//!   abstract name, and anyone who can write a directory can bind a socket in it.
//! - The rendezvous directory of `shm:NAME` must be a real directory (not a symbolic
//!   link), owned by this uid, root or an expected uid, and writable by nobody else —
//!   unless the options declare it shared ([`check_dir`]). Another user who can write
//!   the directory could delete a listener's socket and bind an impostor in its place.

use std::os::fd::BorrowedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::addr::{Address, UnixName};
use crate::error::{Error, ErrorKind, Result};
use crate::options::Options;
use crate::sys::{self, socket};

fn list(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

/// Whether a client with `uid` and primary `gid` may connect: the listener's own uid,
/// root, and the uids and gids the options allow.
pub(crate) fn check_client(opts: &Options, uid: u32, gid: u32) -> std::result::Result<(), String> {
    let me = sys::euid();
    if uid == me || uid == 0 || opts.allow_uids.contains(&uid) || opts.allow_gids.contains(&gid) {
        return Ok(());
    }
    let mut allowed = if me == 0 {
        "root".to_string()
    } else {
        format!("uid {me} and root")
    };
    if !opts.allow_uids.is_empty() {
        allowed += &format!(", uids {}", list(&opts.allow_uids));
    }
    if !opts.allow_gids.is_empty() {
        allowed += &format!(", gids {}", list(&opts.allow_gids));
    }
    Err(format!(
        "uid {uid} (gid {gid}) may not connect (allowed: {allowed}); the listener admits \
         it with Options::allow_uids (`--allow-uid {uid}` on shmlink's command line)"
    ))
}

/// Which client to drop from a listener's full queue of clients between connect and
/// handshake, given each one's `(uid, admitted)` in arrival order: the oldest one the
/// listener would refuse anyway, else the oldest of the uid with the most clients
/// waiting. So a flood from another uid (possible on abstract names and on sockets open
/// to other uids) never evicts an admitted client, and a flood from one admitted uid
/// evicts its own clients first.
pub(crate) fn eviction_victim(mut waiting: impl Iterator<Item = (u32, bool)> + Clone) -> usize {
    if let Some(i) = waiting.clone().position(|(_, admitted)| !admitted) {
        return i;
    }
    let mut counts: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    for (uid, _) in waiting.clone() {
        *counts.entry(uid).or_default() += 1;
    }
    let busiest = counts
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .map(|(uid, _)| uid);
    waiting
        .position(|(uid, _)| Some(uid) == busiest)
        .unwrap_or(0)
}

/// Whether `uid` is one a client trusts to serve it or to own its rendezvous directory:
/// its own, root's, or an expected one.
fn trusted(opts: &Options, uid: u32) -> bool {
    uid == sys::euid() || uid == 0 || opts.expect_uids.contains(&uid)
}

/// The uids a client trusts, for error messages.
fn trusted_text(opts: &Options) -> String {
    let me = sys::euid();
    let mut text = if me == 0 {
        "uid 0 (ours, root)".to_string()
    } else {
        format!("uid {me} (ours) and uid 0 (root)")
    };
    if !opts.expect_uids.is_empty() {
        text += &format!(", expected uids {}", list(&opts.expect_uids));
    }
    text
}

/// Checks the uid of the process that bound the socket `sock` is connected to (the
/// listener's or publisher's, as the kernel recorded it at `listen`); `what` names it.
pub(crate) fn check_server(sock: BorrowedFd<'_>, opts: &Options, what: &str) -> Result<()> {
    let cred = socket::peer_cred(sock).map_err(|e| Error::io("SO_PEERCRED", e))?;
    if trusted(opts, cred.uid) {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::PermissionDenied,
        format!(
            "{what} runs as uid {}, which this side does not trust (trusted: {}); if it \
             is genuine, list its uid with Options::expect_uids",
            cred.uid,
            trusted_text(opts)
        ),
    ))
}

/// Checks the rendezvous directory of `addr` if it is a `shm:NAME` address (one that
/// names a path or an abstract socket has none to check).
pub(crate) fn check_addr_dir(addr: &Address, opts: &Options) -> Result<()> {
    match addr {
        Address::Shm {
            socket: UnixName::Path(path),
            ..
        } if addr.in_rendezvous_dir() => match path.parent() {
            Some(dir) => check_dir(dir, opts),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Checks the rendezvous directory `dir` of a `shm:NAME` address before binding or
/// connecting in it. A missing directory passes (a binder creates it; a connect finds
/// no listener).
pub(crate) fn check_dir(dir: &Path, opts: &Options) -> Result<()> {
    let refuse = |why: String| {
        Error::new(
            ErrorKind::PermissionDenied,
            format!("rendezvous directory {}: {why}", dir.display()),
        )
    };
    let m = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("stat {}", dir.display()), e)),
    };
    if m.file_type().is_symlink() {
        return Err(refuse(
            "is a symbolic link, which whoever controls its target can point elsewhere; \
             set SHMLINK_DIR to the real directory"
                .into(),
        ));
    }
    if !m.is_dir() {
        return Err(refuse("is not a directory".into()));
    }
    check_dir_owner(dir, m.uid(), m.permissions().mode() & 0o7777, opts)
}

/// Checks the owner and mode of rendezvous directory `dir` (what `fstat` of its open
/// descriptor says, or `lstat` of its path), as [`check_dir`].
pub(crate) fn check_dir_owner(dir: &Path, uid: u32, mode: u32, opts: &Options) -> Result<()> {
    let refuse = |why: String| {
        Error::new(
            ErrorKind::PermissionDenied,
            format!("rendezvous directory {}: {why}", dir.display()),
        )
    };
    if opts.shared_dir {
        return Ok(()); // declared shared: owner and mode are the deployment's business
    }
    if !trusted(opts, uid) {
        return Err(refuse(format!(
            "belongs to uid {}, not to a trusted uid ({}): its owner could replace the \
             sockets in it. Use a directory of your own, or declare a deliberately shared \
             one with Options::shared_rendezvous_dir(true)",
            uid,
            trusted_text(opts)
        )));
    }
    if mode & 0o022 != 0 {
        return Err(refuse(format!(
            "has mode {mode:#o}: other users may write it, so they could replace the \
             sockets in it. Run `chmod go-w {}`, or declare a deliberately shared \
             directory with Options::shared_rendezvous_dir(true)",
            dir.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempDir(std::path::PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn temp(name: &str, mode: u32) -> TempDir {
        let d = std::env::temp_dir().join(format!("shmlink-trust-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
        TempDir(d)
    }

    fn refusal(dir: &Path, opts: &Options) -> String {
        let e = check_dir(dir, opts).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
        e.to_string()
    }

    #[test]
    fn a_private_directory_passes_and_a_missing_one_is_left_to_the_caller() {
        let d = temp("private", 0o700);
        check_dir(&d.0, &Options::default()).unwrap();
        check_dir(&d.0.join("missing"), &Options::default()).unwrap();
    }

    #[test]
    fn writable_by_others_or_a_symlink_is_refused_unless_declared_shared() {
        let open = temp("open", 0o777);
        assert!(refusal(&open.0, &Options::default()).contains("mode 0o777"));
        assert!(refusal(&open.0, &Options::default()).contains("chmod go-w"));
        let group = temp("group", 0o770);
        assert!(refusal(&group.0, &Options::default()).contains("mode 0o770"));
        let shared = Options::default().shared_rendezvous_dir(true);
        check_dir(&open.0, &shared).unwrap();

        let target = temp("target", 0o700);
        let link = std::env::temp_dir().join(format!("shmlink-trust-link-{}", std::process::id()));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target.0, &link).unwrap();
        let why = refusal(&link, &Options::default());
        // Declaring the directory shared does not make a link acceptable.
        let why_shared = refusal(&link, &shared);
        std::fs::remove_file(&link).unwrap();
        assert!(why.contains("symbolic link"), "{why}");
        assert!(why_shared.contains("symbolic link"), "{why_shared}");
    }
}
