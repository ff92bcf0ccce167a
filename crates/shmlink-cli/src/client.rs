//! The client end of a run: sends the hello, drives the latency or throughput loop,
//! collects the server's report.

use std::time::{Duration, Instant};

use shmlink::Connection;

use crate::conn_io::{peer_reason, recv_control, recv_data, send_control, send_data};
use crate::error::{Result, RunError};
use crate::report::{CpuPerMsg, RunResult};
use crate::wire::{Control, Hello, Mode, Report};
use shmlink_bench::stats::Percentiles;

/// Most round-trip samples allocated up front (more grow the vector as needed).
const MAX_PREALLOC: u64 = 10_000_000;

/// What the client measured.
struct Measured {
    /// Round-trip times in ns (latency mode).
    rtts: Option<Vec<u64>>,
    /// Wall time of the measured part.
    elapsed: Duration,
    /// This process's CPU time during the measured part.
    cpu: Duration,
}

/// Runs `hello` on `conn` and returns the result.
pub fn run(conn: &mut Connection, hello: Hello) -> Result<RunResult> {
    let size = usize::try_from(hello.size).expect("size was checked by the parser");
    if size > conn.max_msg_size() {
        return Err(RunError::new(format!(
            "{size}-byte messages exceed the connection's maximum of {} bytes",
            conn.max_msg_size()
        )));
    }
    let (m, report) = exchange(conn, &hello, size).map_err(|e| peer_reason(conn, e))?;

    let total = hello.total();
    if report.msgs != total || report.bytes != total * hello.size {
        return Err(RunError::new(format!(
            "server verified {} messages ({} bytes), client sent {total} ({} bytes)",
            report.msgs,
            report.bytes,
            total * hello.size
        )));
    }
    let per_msg_us = |ns: f64| ns / 1000.0 / hello.count as f64;
    let secs = m.elapsed.as_secs_f64();
    let throughput = |n: u64| (hello.mode == Mode::Throughput).then(|| n as f64 / secs);
    Ok(RunResult {
        transport: conn.transport().to_string(),
        size,
        count: hello.count,
        window: hello.window,
        rtt_ns: m.rtts.and_then(|mut v| Percentiles::of(&mut v)),
        msgs_per_s: throughput(hello.count),
        bytes_per_s: throughput(hello.count * hello.size),
        cpu_us_per_msg: CpuPerMsg {
            client: per_msg_us(m.cpu.as_nanos() as f64),
            server: per_msg_us(report.cpu_ns as f64),
        },
    })
}

/// Hello, the measured loop, and the server's report.
fn exchange(conn: &mut Connection, hello: &Hello, size: usize) -> Result<(Measured, Report)> {
    send_control(conn, &Control::Hello(*hello))?;
    match recv_control(conn, "ready")? {
        Control::Ready => {}
        other => return Err(unexpected("ready", &other)),
    }
    let m = match hello.mode {
        Mode::Latency => latency(conn, hello, size)?,
        Mode::Throughput => throughput(conn, hello, size)?,
    };
    match recv_control(conn, "report")? {
        Control::Report(r) => Ok((m, r)),
        other => Err(unexpected("report", &other)),
    }
}

fn unexpected(expected: &str, got: &Control) -> RunError {
    RunError::new(format!(
        "protocol error: expected {expected}, got {}",
        got.name()
    ))
}

/// One message in flight; every round trip timed.
fn latency(conn: &mut Connection, h: &Hello, size: usize) -> Result<Measured> {
    let mut rtts = Vec::with_capacity(h.count.min(MAX_PREALLOC) as usize);
    let mut start = Instant::now();
    let mut cpu0 = Duration::ZERO;
    for seq in 0..h.total() {
        if seq == h.warmup {
            cpu0 = shmlink::cpu_time();
            start = Instant::now();
        }
        let t0 = Instant::now();
        send_data(conn, seq, size)?;
        recv_data(conn, seq, size)?;
        let rtt = t0.elapsed();
        if seq >= h.warmup {
            rtts.push(rtt.as_nanos() as u64);
        }
    }
    Ok(Measured {
        rtts: Some(rtts),
        elapsed: start.elapsed(),
        cpu: shmlink::cpu_time().saturating_sub(cpu0),
    })
}

/// Up to `window` messages in flight; timed from the first measured message to the
/// acknowledgement of the last, after the warm-up has been acknowledged.
fn throughput(conn: &mut Connection, h: &Hello, size: usize) -> Result<Measured> {
    let total = h.total();
    let mut acked = 0;
    let mut start = Instant::now();
    let mut cpu0 = Duration::ZERO;
    for seq in 0..total {
        if seq == h.warmup {
            while acked < seq {
                acked = recv_ack(conn, acked, seq)?;
            }
            cpu0 = shmlink::cpu_time();
            start = Instant::now();
        }
        while seq - acked >= h.window {
            acked = recv_ack(conn, acked, seq)?;
        }
        send_data(conn, seq, size)?;
    }
    while acked < total {
        acked = recv_ack(conn, acked, total)?;
    }
    Ok(Measured {
        rtts: None,
        elapsed: start.elapsed(),
        cpu: shmlink::cpu_time().saturating_sub(cpu0),
    })
}

/// Receives the next cumulative ack, which must lie in `acked+1 ..= sent`.
fn recv_ack(conn: &mut Connection, acked: u64, sent: u64) -> Result<u64> {
    match recv_control(conn, "ack")? {
        Control::Ack(n) if n > acked && n <= sent => Ok(n),
        Control::Ack(n) => Err(RunError::new(format!(
            "protocol error: ack for {n} messages after {acked} acknowledged and {sent} sent"
        ))),
        other => Err(unexpected("ack", &other)),
    }
}
