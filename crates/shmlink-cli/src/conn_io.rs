//! Sending and receiving pong messages on a [`Connection`]: data messages are written in
//! place (`reserve`) and received in place (`recv_ref`). A message in the peer's shared
//! ring is copied once into a scratch buffer before it is verified — pong does not trust
//! the process it measures with a reference into that process's memory (see
//! `shmlink::SharedBytes`); elsewhere it is verified where it lies.

use std::cell::RefCell;

use shmlink::{Connection, RecvBuf};

use crate::error::{Context, Result, RunError};
use crate::wire::Control;
use shmlink_bench::payload;

/// Writes data message `seq` of `size` bytes straight into the connection and sends it.
pub fn send_data(conn: &mut Connection, seq: u64, size: usize) -> Result<()> {
    let mut buf = conn
        .reserve(size)
        .context(|| format!("send message #{seq}"))?;
    payload::write(&mut buf, seq);
    buf.commit().context(|| format!("send message #{seq}"))
}

/// Runs `f` over the bytes of `msg`: in place when they are in this process's memory,
/// else over a copy in a scratch buffer kept between calls.
fn with_bytes<R>(msg: &RecvBuf<'_>, f: impl FnOnce(&[u8]) -> R) -> R {
    thread_local!(static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) });
    let bytes = msg.bytes();
    if let Some(local) = bytes.as_local() {
        return f(local);
    }
    SCRATCH.with_borrow_mut(|scratch| {
        scratch.resize(bytes.len(), 0);
        bytes.copy_to(scratch);
        f(scratch)
    })
}

/// Receives data message `seq` of `size` bytes and verifies every byte of it. A peer
/// that failed sends `Failed` in its place; its reason becomes the error.
pub fn recv_data(conn: &mut Connection, seq: u64, size: usize) -> Result<()> {
    let msg = conn
        .recv_ref()
        .context(|| format!("receive message #{seq}"))?;
    with_bytes(&msg, |msg| {
        if let Err(e) = payload::verify(msg, seq, size) {
            if let Ok(Control::Failed(reason)) = Control::decode(msg) {
                return Err(RunError::new(format!("peer failed: {reason}")));
            }
            return Err(e.into());
        }
        Ok(())
    })
}

/// Sends a control message.
pub fn send_control(conn: &mut Connection, c: &Control) -> Result<()> {
    conn.send(&c.encode())
        .context(|| format!("send {}", c.name()))
}

/// Receives a control message; a peer's `Failed` becomes the error.
pub fn recv_control(conn: &mut Connection, expected: &str) -> Result<Control> {
    let msg = conn.recv_vec().context(|| format!("receive {expected}"))?;
    match Control::decode(&msg).context(|| format!("receive {expected}"))? {
        Control::Failed(reason) => Err(RunError::new(format!("peer failed: {reason}"))),
        c => Ok(c),
    }
}

/// Most queued messages [`peer_reason`] looks through.
const PEEK_LIMIT: usize = 4096;

/// Explains a failed run: a peer that gave up sent `Failed` with its reason before it
/// closed, and that reason says more than the broken send or receive that followed.
/// Looks through what is still queued, without waiting.
pub fn peer_reason(conn: &mut Connection, err: RunError) -> RunError {
    conn.set_nonblocking(true);
    for _ in 0..PEEK_LIMIT {
        let Ok(msg) = conn.recv_vec() else {
            break;
        };
        if let Ok(Control::Failed(reason)) = Control::decode(&msg) {
            return RunError::new(format!("peer failed: {reason} (here: {err})"));
        }
    }
    conn.set_nonblocking(false);
    err
}
