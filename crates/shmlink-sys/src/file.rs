//! Opening files another user may have planted: never through a symbolic link, and
//! creating only what did not exist (`O_EXCL`), so that what the caller then checks with
//! `fstat` is the file it holds.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens the existing file at `path` read-write, refusing a symbolic link as the last
/// component (`O_NOFOLLOW`: the error is `ELOOP`, see [`is_symlink_error`]) and never
/// blocking on a FIFO (`O_NONBLOCK`, which a regular file ignores).
pub fn open_rw_nofollow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// Creates the file at `path` read-write with exactly `mode` (the umask cannot widen it,
/// and the mode is set again on the descriptor so that it cannot narrow it either), only if
/// nothing of that name exists: `O_CREAT | O_EXCL | O_NOFOLLOW`, so neither a planted file
/// nor a symbolic link (even a dangling one) is followed; the error is then
/// `AlreadyExists`.
pub fn create_rw_exclusive(path: &Path, mode: u32) -> io::Result<File> {
    use std::os::unix::fs::PermissionsExt;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(f)
}

/// Whether `e` is what [`open_rw_nofollow`] returns for a symbolic link (`ELOOP`).
pub fn is_symlink_error(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ELOOP)
}

/// Changes the group of an open file (`fchown(fd, -1, gid)`).
pub fn set_group(f: &File, gid: u32) -> io::Result<()> {
    std::os::unix::fs::fchown(f, None, Some(gid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn exclusive_creation_refuses_links_and_existing_files() {
        let dir = std::env::temp_dir().join(format!("shmlink-sys-file-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let p = dir.join("f");
        let f = create_rw_exclusive(&p, 0o600).unwrap();
        assert_eq!(f.metadata().unwrap().mode() & 0o7777, 0o600);
        assert_eq!(
            create_rw_exclusive(&p, 0o600).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        let link = dir.join("link");
        std::os::unix::fs::symlink(dir.join("missing"), &link).unwrap();
        assert_eq!(
            create_rw_exclusive(&link, 0o600).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert!(
            !dir.join("missing").exists(),
            "a dangling link was followed"
        );
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(is_symlink_error(&open_rw_nofollow(&link).unwrap_err()));
        open_rw_nofollow(&p).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
