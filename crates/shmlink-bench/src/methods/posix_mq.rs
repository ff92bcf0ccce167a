//! `posix-mq`: two POSIX message queues, one per direction, opened by name in the peer.
//! Message size is capped by `fs.mqueue.msgsize_max`, queue depth by `fs.mqueue.msg_max`.

use std::ffi::CString;
use std::io;
use std::sync::Mutex;

use crate::method::{arg, Ctx, Endpoint, Method, Prepared, SizeLimit};
use crate::sys::{cstring, ctx, err, proc_sys, syscall};

/// Most messages per queue asked for (the kernel's default `msg_max`).
const MAX_MSGS: usize = 10;

pub struct PosixMq;

fn msgsize(c: &Ctx) -> usize {
    c.size.max(8)
}

/// An open queue descriptor.
struct Mqd(libc::mqd_t);

impl Drop for Mqd {
    fn drop(&mut self) {
        // SAFETY: the descriptor is open and owned by this value.
        unsafe { libc::mq_close(self.0) };
    }
}

fn open(name: &CString, create: Option<usize>) -> io::Result<Mqd> {
    let mqd = match create {
        Some(msgsize) => {
            // SAFETY: mq_attr is plain data; all-zero is valid.
            let mut attr: libc::mq_attr = unsafe { std::mem::zeroed() };
            attr.mq_maxmsg =
                MAX_MSGS.min(proc_sys("/proc/sys/fs/mqueue/msg_max").unwrap_or(10)) as libc::c_long;
            attr.mq_msgsize = msgsize as libc::c_long;
            CREATED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(name.clone());
            // SAFETY: `name` is a valid C string and `attr` a valid mq_attr for O_CREAT.
            syscall!(mq_open(
                name.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o600 as libc::mode_t,
                &mut attr as *mut libc::mq_attr
            ))
        }
        // SAFETY: `name` is a valid C string.
        None => syscall!(mq_open(name.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC)),
    };
    Ok(Mqd(mqd.map_err(ctx(format!("mq_open {name:?}")))?))
}

struct MqEnd {
    tx: Mqd,
    rx: Mqd,
    msgsize: usize,
    /// For receiving messages shorter than the queue's message size (mq_receive wants a
    /// buffer of at least mq_msgsize).
    scratch: Vec<u8>,
    /// Names to unlink once the peer has certainly opened them (its first message).
    unlink: Vec<CString>,
}

/// Queue names this process created, for [`unlink_all`].
static CREATED: Mutex<Vec<CString>> = Mutex::new(Vec::new());

/// Unlinks every queue this process created (for an exit that skips destructors).
pub fn unlink_all() {
    for name in CREATED.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        // SAFETY: `name` is a valid C string.
        unsafe { libc::mq_unlink(name.as_ptr()) };
    }
}

impl MqEnd {
    fn unlink_names(&mut self) {
        for name in self.unlink.drain(..) {
            // SAFETY: `name` is a valid C string.
            unsafe { libc::mq_unlink(name.as_ptr()) };
        }
    }
}

impl Drop for MqEnd {
    fn drop(&mut self) {
        self.unlink_names();
    }
}

impl Endpoint for MqEnd {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        // SAFETY: `msg` is valid for reads of its length.
        syscall!(mq_send(self.tx.0, msg.as_ptr().cast(), msg.len(), 0))?;
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let direct = buf.len() >= self.msgsize;
        let dst: &mut [u8] = if direct { buf } else { &mut self.scratch };
        // SAFETY: `dst` is valid for writes of its length.
        let n = syscall!(mq_receive(
            self.rx.0,
            dst.as_mut_ptr().cast(),
            dst.len(),
            std::ptr::null_mut()
        ))? as usize;
        if n != buf.len() {
            return Err(err(format!(
                "received a {n}-byte message, expected {} bytes",
                buf.len()
            )));
        }
        if !direct {
            buf.copy_from_slice(&self.scratch[..n]);
        }
        if !self.unlink.is_empty() {
            self.unlink_names();
        }
        Ok(())
    }
}

impl Method for PosixMq {
    fn name(&self) -> &'static str {
        "posix-mq"
    }

    fn about(&self) -> &'static str {
        "two POSIX message queues (mq_send/mq_receive), 10 messages deep"
    }

    fn size_limit(&self) -> Option<SizeLimit> {
        Some(SizeLimit {
            max: proc_sys("/proc/sys/fs/mqueue/msgsize_max").unwrap_or(8192),
            why: "fs.mqueue.msgsize_max",
        })
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        let a2b = cstring(&format!("/{}-a2b", c.tag))?;
        let b2a = cstring(&format!("/{}-b2a", c.tag))?;
        let tx = open(&a2b, Some(msgsize(c)))?;
        let rx = open(&b2a, Some(msgsize(c))).inspect_err(|_| {
            // SAFETY: `a2b` is a valid C string.
            unsafe { libc::mq_unlink(a2b.as_ptr()) };
        })?;
        let args = vec![
            a2b.to_string_lossy().into_owned(),
            b2a.to_string_lossy().into_owned(),
        ];
        let end = MqEnd {
            tx,
            rx,
            msgsize: msgsize(c),
            scratch: vec![0; msgsize(c)],
            unlink: vec![a2b, b2a],
        };
        Ok(Prepared::ready(args, Vec::new(), end))
    }

    fn connect(&self, c: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        let rx = open(&cstring(arg(args, 0, "a2b queue")?)?, None)?;
        let tx = open(&cstring(arg(args, 1, "b2a queue")?)?, None)?;
        Ok(Box::new(MqEnd {
            tx,
            rx,
            msgsize: msgsize(c),
            scratch: vec![0; msgsize(c)],
            unlink: Vec::new(),
        }))
    }
}
