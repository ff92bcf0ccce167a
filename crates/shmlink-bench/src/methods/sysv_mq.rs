//! `sysv-mq`: two System V message queues (msgsnd/msgrcv), one per direction. Message
//! size is capped by `kernel.msgmax`, queue bytes by `kernel.msgmnb`. The API wants the
//! message behind a `long mtype`, so each end stages messages in a buffer of its own.

use std::io;
use std::sync::Mutex;

use crate::method::{arg, Ctx, Endpoint, Method, Prepared, SizeLimit};
use crate::sys::{ctx, err, proc_sys, syscall};

pub struct SysvMq;

/// Bytes of the `mtype` field in front of every message.
const MTYPE: usize = std::mem::size_of::<libc::c_long>();

/// A queue id; removed on drop if this end created it.
struct Queue {
    id: libc::c_int,
    owned: bool,
}

impl Drop for Queue {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: IPC_RMID takes no buffer.
            unsafe { libc::msgctl(self.id, libc::IPC_RMID, std::ptr::null_mut()) };
        }
    }
}

/// Queues this process created, for [`remove_all`].
static CREATED: Mutex<Vec<libc::c_int>> = Mutex::new(Vec::new());

fn create() -> io::Result<Queue> {
    // SAFETY: msgget takes plain integers.
    let id = syscall!(msgget(libc::IPC_PRIVATE, libc::IPC_CREAT | 0o600)).map_err(ctx("msgget"))?;
    CREATED.lock().unwrap_or_else(|e| e.into_inner()).push(id);
    Ok(Queue { id, owned: true })
}

/// Removes every queue this process created (for an exit that skips destructors; a
/// queue removed twice only gets EINVAL).
pub fn remove_all() {
    for id in CREATED.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        // SAFETY: IPC_RMID takes no buffer.
        unsafe { libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
    }
}

struct SysvEnd {
    tx: Queue,
    rx: Queue,
    /// `mtype` followed by the message.
    stage: Vec<u8>,
}

impl SysvEnd {
    fn new(tx: Queue, rx: Queue, size: usize) -> SysvEnd {
        let mut stage = vec![0u8; MTYPE + size.max(8)];
        stage[..MTYPE].copy_from_slice(&(1 as libc::c_long).to_ne_bytes());
        SysvEnd { tx, rx, stage }
    }
}

impl Endpoint for SysvEnd {
    fn send(&mut self, msg: &[u8]) -> io::Result<()> {
        self.stage[MTYPE..MTYPE + msg.len()].copy_from_slice(msg);
        // SAFETY: `stage` holds an mtype and at least `msg.len()` bytes after it.
        syscall!(msgsnd(self.tx.id, self.stage.as_ptr().cast(), msg.len(), 0))?;
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let room = self.stage.len() - MTYPE;
        // SAFETY: `stage` has room for an mtype and `room` bytes.
        let n = syscall!(msgrcv(
            self.rx.id,
            self.stage.as_mut_ptr().cast(),
            room,
            0,
            0
        ))? as usize;
        if n != buf.len() {
            return Err(err(format!(
                "received a {n}-byte message, expected {} bytes",
                buf.len()
            )));
        }
        buf.copy_from_slice(&self.stage[MTYPE..MTYPE + n]);
        Ok(())
    }
}

impl Method for SysvMq {
    fn name(&self) -> &'static str {
        "sysv-mq"
    }

    fn about(&self) -> &'static str {
        "two System V message queues (msgsnd/msgrcv)"
    }

    fn size_limit(&self) -> Option<SizeLimit> {
        Some(SizeLimit {
            max: proc_sys("/proc/sys/kernel/msgmax").unwrap_or(8192),
            why: "kernel.msgmax",
        })
    }

    fn prepare(&self, c: &Ctx) -> io::Result<Prepared> {
        let tx = create()?;
        let rx = create()?;
        let args = vec![tx.id.to_string(), rx.id.to_string()];
        Ok(Prepared::ready(
            args,
            Vec::new(),
            SysvEnd::new(tx, rx, c.size),
        ))
    }

    fn connect(&self, c: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        let id = |i, what| -> io::Result<Queue> {
            let text = arg(args, i, what)?;
            let id = text
                .parse()
                .map_err(|_| err(format!("invalid queue id {text:?}")))?;
            Ok(Queue { id, owned: false })
        };
        Ok(Box::new(SysvEnd::new(id(1, "b2a")?, id(0, "a2b")?, c.size)))
    }
}
