//! `fifo`: two named pipes, one per direction, that the peer opens by path.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::fdio::StreamEnd;
use crate::method::{arg, Ctx, Endpoint, Method, Prepared};
use crate::sys::{ctx, err, syscall};

pub struct Fifo;

fn mkfifo(path: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| err(format!("path {} contains a NUL byte", path.display())))?;
    // SAFETY: `c` is a valid NUL-terminated path.
    syscall!(mkfifo(c.as_ptr(), 0o600)).map_err(ctx(format!("mkfifo {}", path.display())))?;
    Ok(())
}

fn open(path: &Path, write: bool) -> io::Result<OwnedFd> {
    let f: File = OpenOptions::new()
        .read(!write)
        .write(write)
        .open(path)
        .map_err(ctx(format!("open {}", path.display())))?;
    Ok(f.into())
}

impl Method for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }

    fn about(&self) -> &'static str {
        "two named pipes (mkfifo), opened by path in each process"
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        let dir = std::env::temp_dir().join(&c.tag);
        std::fs::create_dir(&dir).map_err(ctx(format!("create {}", dir.display())))?;
        let (a2b, b2a) = (dir.join("a2b"), dir.join("b2a"));
        mkfifo(&a2b)?;
        mkfifo(&b2a)?;
        let args = vec![a2b.display().to_string(), b2a.display().to_string()];
        let finish = move || -> io::Result<Box<dyn Endpoint>> {
            // Opening a FIFO waits for the other end; both open a2b first, then b2a.
            let res = open(&a2b, true).and_then(|tx| Ok((tx, open(&b2a, false)?)));
            let _ = std::fs::remove_dir_all(&dir);
            let (tx, rx) = res?;
            Ok(Box::new(StreamEnd::new(rx, tx)))
        };
        Ok(Prepared {
            args,
            inherit: Vec::new(),
            finish: Box::new(finish),
        })
    }

    fn connect(&self, _c: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        let a2b = PathBuf::from(arg(args, 0, "a2b path")?);
        let b2a = PathBuf::from(arg(args, 1, "b2a path")?);
        let rx = open(&a2b, false)?;
        let tx = open(&b2a, true)?;
        Ok(Box::new(StreamEnd::new(rx, tx)))
    }
}
