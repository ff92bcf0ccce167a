//! The region's backing file on the host: who may have made it and who may read it.
//!
//! Whoever can read a region file reads every message that passes through the region,
//! and whoever can write it can forge messages or shrink the file (every process that
//! mapped it then dies of SIGBUS). So a host process maps a region file only if it is a
//! regular file (opened with `O_NOFOLLOW`: not a symbolic link), owned by this uid, root
//! or an expected uid ([`Options::expect_uids`]), and neither readable nor writable by
//! others — by group only if the options name the file's group
//! ([`Options::vm_region_group`]). Its directory must not let anyone else replace it:
//! owned by a trusted uid and writable by nobody else, unless it is sticky (`/dev/shm`,
//! `/tmp`: there others may create names but not remove or rename ours). `vm-host`
//! creates the file with `O_CREAT | O_EXCL | O_NOFOLLOW` and mode `0600` (`0660` with
//! the group), so a name planted first is never taken over: it is checked like any
//! existing file, and refused with the reason.
//!
//! Every check is made on the open descriptor (`fstat`), not on the path, so the file
//! checked is the file mapped.

use std::fs::File;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::error::{Error, ErrorKind, Result};
use crate::options::Options;
use crate::sys;

/// Who may own and share a region file, from the options. Public (hidden, as
/// `shmlink::vm_host_hooks::RegionPolicy`) for the doorbell server's crate, which creates
/// the region file and admits peers under the same policy.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// Owners trusted besides this uid and root.
    pub(crate) uids: Vec<u32>,
    /// The group that may read and write the file besides its owner.
    pub(crate) gid: Option<u32>,
}

impl Policy {
    /// The policy the options ask for.
    pub fn of(opts: &Options) -> Policy {
        Policy {
            uids: opts.expect_uids.clone(),
            gid: opts.vm_region_gid,
        }
    }

    /// Whether `uid` may own the file or connect: this uid, root or an expected uid.
    pub fn trusts(&self, uid: u32) -> bool {
        uid == sys::euid() || uid == 0 || self.uids.contains(&uid)
    }

    /// The trusted uids, for error messages.
    pub fn trusted_text(&self) -> String {
        let me = sys::euid();
        let mut t = if me == 0 {
            "uid 0 (ours, root)".to_string()
        } else {
            format!("uid {me} (ours) and uid 0 (root)")
        };
        for u in &self.uids {
            t += &format!(", uid {u}");
        }
        t
    }

    /// The group that shares the file, if the options name one.
    pub fn gid(&self) -> Option<u32> {
        self.gid
    }

    /// The mode a new region file gets.
    pub fn create_mode(&self) -> u32 {
        if self.gid.is_some() {
            0o660
        } else {
            0o600
        }
    }
}

fn refuse(path: &Path, why: String) -> Error {
    Error::new(
        ErrorKind::PermissionDenied,
        format!("vm: region {}: {why}", path.display()),
    )
}

/// Opens the existing region file at `path` read-write and checks it (module docs).
pub(crate) fn open(path: &Path, policy: &Policy) -> Result<File> {
    check_dir(path, policy)?;
    let f = sys::file::open_rw_nofollow(path).map_err(|e| open_error(path, e))?;
    check(&f, path, policy)?;
    Ok(f)
}

/// Creates the region file at `path` (mode `0600`, or `0660` with the policy's group), or
/// opens and checks the one already there; true if it was created. Public (hidden, as
/// `shmlink::vm_host_hooks::create_or_open_region`) for the doorbell server's crate.
pub fn create_or_open(path: &Path, policy: &Policy) -> Result<(File, bool)> {
    check_dir(path, policy)?;
    match sys::file::create_rw_exclusive(path, policy.create_mode()) {
        Ok(f) => {
            if let Some(gid) = policy.gid {
                sys::file::set_group(&f, gid).map_err(|e| {
                    let _ = std::fs::remove_file(path);
                    Error::io(
                        format!("vm: giving region {} to group {gid}", path.display()),
                        e,
                    )
                })?;
            }
            Ok((f, true))
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let f = sys::file::open_rw_nofollow(path).map_err(|e| open_error(path, e))?;
            check(&f, path, policy)?;
            Ok((f, false))
        }
        Err(e) => Err(Error::io(
            format!("vm: creating region {}", path.display()),
            e,
        )),
    }
}

fn open_error(path: &Path, e: io::Error) -> Error {
    if sys::file::is_symlink_error(&e) {
        return refuse(
            path,
            "is a symbolic link, which whoever made it can point at another file; name \
             the real file"
                .into(),
        );
    }
    Error::io(format!("vm: opening region {}", path.display()), e)
}

/// Checks the open region file (module docs).
fn check(f: &File, path: &Path, policy: &Policy) -> Result<()> {
    let m = f
        .metadata()
        .map_err(|e| Error::io(format!("vm: fstat of region {}", path.display()), e))?;
    if !m.file_type().is_file() {
        return Err(refuse(
            path,
            "is not a regular file (a region is a file QEMU and host processes map)".into(),
        ));
    }
    if !policy.trusts(m.uid()) {
        return Err(refuse(
            path,
            format!(
                "belongs to uid {}, not to a trusted uid ({}): its owner can read every \
                 message and shrink it under the processes that map it. Remove it and \
                 let `shmlink vm-host` create it, or trust that uid \
                 (Options::expect_uids, `shmlink vm-host --trust-uid`)",
                m.uid(),
                policy.trusted_text()
            ),
        ));
    }
    let mode = m.permissions().mode() & 0o7777;
    if mode & 0o007 != 0 {
        return Err(refuse(
            path,
            format!(
                "has mode {mode:#o}: every local user may {} it. Run `chmod o-rwx {}`",
                if mode & 0o002 != 0 {
                    "write (forge messages) or read"
                } else {
                    "read every message in"
                },
                path.display()
            ),
        ));
    }
    if mode & 0o070 != 0 && policy.gid != Some(m.gid()) {
        return Err(refuse(
            path,
            format!(
                "has mode {mode:#o} and group {}: members of that group may read or write \
                 every message. Run `chmod g-rwx {}`, or name the group that may share it \
                 (Options::vm_region_group, `shmlink vm-host --group`)",
                m.gid(),
                path.display()
            ),
        ));
    }
    Ok(())
}

/// Checks the directory of the region file: nobody untrusted may remove or replace the
/// file in it (module docs). A guest's sysfs path passes (root's, not writable).
fn check_dir(path: &Path, policy: &Policy) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let m = std::fs::metadata(dir)
        .map_err(|e| Error::io(format!("vm: stat of {}", dir.display()), e))?;
    let mode = m.permissions().mode() & 0o7777;
    let sticky = mode & 0o1000 != 0;
    let why = if !policy.trusts(m.uid()) {
        format!(
            "belongs to uid {}, not to a trusted uid ({})",
            m.uid(),
            policy.trusted_text()
        )
    } else if mode & 0o022 != 0 && !sticky {
        format!("has mode {mode:#o} without the sticky bit: other users may write it")
    } else {
        return Ok(());
    };
    Err(Error::new(
        ErrorKind::PermissionDenied,
        format!(
            "vm: region {}: its directory {} {why}, so they could replace the region file. \
             Put the region in a directory of your own (or a sticky one such as /dev/shm)",
            path.display(),
            dir.display()
        ),
    ))
}
