//! The client end of a run: the hello, the measurement core's driver, the server's
//! report.

use shmlink::Connection;
use shmlink_measure::link::{failure_reason, ShmlinkEndpoint};
use shmlink_measure::protocol::{self, Measured, PeerReport, Plan, Stop, Warmup};
use shmlink_measure::stats::Percentiles;
use shmlink_measure::verify::Sampling;
use shmlink_measure::Mode;

use super::report::{CpuPerMsg, RunResult};
use super::wire::{self, Hello};
use crate::error::{Context, Result, RunError};

/// Runs `hello` on `conn`, closes it, and returns the result.
pub fn run(conn: Connection, hello: Hello) -> Result<RunResult> {
    let size = usize::try_from(hello.size).expect("size was checked by the parser");
    if size > conn.max_msg_size() {
        return Err(RunError::new(format!(
            "{size}-byte messages exceed the connection's maximum of {} bytes",
            conn.max_msg_size()
        )));
    }
    let transport = conn.transport().to_string();
    let mut ep = ShmlinkEndpoint::new(conn, wire::access(&hello));
    // A server that gave up says why: the core's driver and `recv_control` put its
    // reason first.
    let (m, report) = exchange(&mut ep, &hello, size)?;
    ep.into_inner().close().context(|| "close".to_string())?;

    if report.msgs != m.count || m.count != hello.count {
        return Err(RunError::new(format!(
            "server verified {} measured messages, client sent {} of {}",
            report.msgs, m.count, hello.count
        )));
    }
    let per_msg_us = |ns: f64| ns / 1000.0 / m.count as f64;
    let secs = m.elapsed.as_secs_f64();
    let throughput = |n: u64| (hello.mode == Mode::Throughput).then(|| n as f64 / secs);
    Ok(RunResult {
        transport,
        size,
        count: m.count,
        window: hello.window,
        rtt_ns: m.rtts.and_then(|mut v| Percentiles::of(&mut v)),
        msgs_per_s: throughput(m.count),
        bytes_per_s: throughput(m.count * hello.size),
        cpu_us_per_msg: CpuPerMsg {
            client: per_msg_us(m.cpu.as_nanos() as f64),
            server: per_msg_us(report.cpu_ns as f64),
        },
    })
}

/// Hello, the measured run, and the server's report.
fn exchange(
    ep: &mut ShmlinkEndpoint,
    hello: &Hello,
    size: usize,
) -> Result<(Measured, PeerReport)> {
    ep.conn()
        .send(&hello.encode())
        .context(|| "send hello".to_string())?;
    let ready = recv_control(ep.conn(), "ready")?;
    if ready != wire::READY {
        return Err(RunError::new(format!(
            "protocol error: a {}-byte message where ready was expected",
            ready.len()
        )));
    }
    let plan = Plan {
        size,
        mode: hello.mode,
        window: hello.window,
        warmup: Warmup::Count(hello.warmup),
        stop: Stop::Count(hello.count),
        // Round trips whose messages are checksummed in full are not timed
        // (shmlink_measure::verify); with `--verify all` every one is, checks included.
        sampling: Sampling {
            one_in: hello.one_in,
        },
        seed: hello.seed,
        fault: None,
    };
    let m = protocol::drive(ep, &plan)?;
    let report = recv_control(ep.conn(), "report")?;
    let report =
        wire::decode_report(&report).map_err(|e| RunError::new(format!("protocol error: {e}")))?;
    Ok((m, report))
}

/// Receives a control message; a failure notice becomes the error.
fn recv_control(conn: &mut Connection, expected: &str) -> Result<Vec<u8>> {
    let msg = conn.recv_vec().context(|| format!("receive {expected}"))?;
    match failure_reason(&msg) {
        Some(reason) => Err(RunError::new(format!("peer failed: {reason}"))),
        None => Ok(msg),
    }
}
