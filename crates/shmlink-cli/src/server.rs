//! The server end: serves one client's run as its hello describes it, then waits for the
//! client to close.

use std::time::Duration;

use shmlink::{Connection, ErrorKind};

use crate::conn_io::{recv_control, recv_data, send_control, send_data};
use crate::error::{Result, RunError};
use crate::wire::{Control, Hello, Mode, Report};

/// Serves one run on `conn`; returns the hello it served. On failure the client is sent
/// the reason (`Failed`) before the error is returned.
pub fn serve(conn: &mut Connection) -> Result<Hello> {
    let hello = match recv_control(conn, "hello")? {
        Control::Hello(h) => h,
        other => {
            let e = RunError::new(format!(
                "protocol error: expected hello, got {}",
                other.name()
            ));
            return Err(fail(conn, e));
        }
    };
    let size = match usize::try_from(hello.size) {
        Ok(s) if s <= conn.max_msg_size() => s,
        _ => {
            let e = RunError::new(format!(
                "{}-byte messages exceed this server's maximum of {} bytes",
                hello.size,
                conn.max_msg_size()
            ));
            return Err(fail(conn, e));
        }
    };
    send_control(conn, &Control::Ready)?;
    let res = match hello.mode {
        Mode::Latency => latency(conn, &hello, size),
        Mode::Throughput => throughput(conn, &hello, size),
    };
    match res {
        Ok(cpu) => {
            let total = hello.total();
            let report = Report {
                msgs: total,
                bytes: total * hello.size,
                cpu_ns: cpu.as_nanos() as u64,
            };
            send_control(conn, &Control::Report(report))?;
            wait_for_close(conn)?;
            Ok(hello)
        }
        Err(e) => Err(fail(conn, e)),
    }
}

/// Waits for the client to close after it got the report, so the client closes a
/// connection whose peer is still there and the server never cuts it short.
fn wait_for_close(conn: &mut Connection) -> Result<()> {
    match conn.recv_ref() {
        Err(e) if e.kind() == ErrorKind::EndOfStream => Ok(()),
        Err(e) => Err(RunError::new(format!(
            "waiting for the client to close: {e}"
        ))),
        Ok(msg) => Err(RunError::new(format!(
            "protocol error: a {}-byte message after the report",
            msg.len()
        ))),
    }
}

/// Tells the client why the run failed (best effort) and hands the error back.
fn fail(conn: &mut Connection, e: RunError) -> RunError {
    let _ = conn.send(&Control::Failed(e.to_string()).encode());
    e
}

/// Verifies and answers every message with one of the same size and sequence number.
/// Returns the CPU time of the measured part.
fn latency(conn: &mut Connection, h: &Hello, size: usize) -> Result<Duration> {
    let mut cpu0 = Duration::ZERO;
    for seq in 0..h.total() {
        if seq == h.warmup {
            cpu0 = shmlink::cpu_time();
        }
        recv_data(conn, seq, size)?;
        send_data(conn, seq, size)?;
    }
    Ok(shmlink::cpu_time().saturating_sub(cpu0))
}

/// Verifies every message; acknowledges cumulatively every `ack_every` messages, at the
/// end of the warm-up and at the last message. Returns the CPU time of the measured part.
fn throughput(conn: &mut Connection, h: &Hello, size: usize) -> Result<Duration> {
    let total = h.total();
    let every = h.ack_every();
    let mut cpu0 = Duration::ZERO;
    for seq in 0..total {
        if seq == h.warmup {
            cpu0 = shmlink::cpu_time();
        }
        recv_data(conn, seq, size)?;
        let received = seq + 1;
        if received % every == 0 || received == h.warmup || received == total {
            send_control(conn, &Control::Ack(received))?;
        }
    }
    Ok(shmlink::cpu_time().saturating_sub(cpu0))
}
