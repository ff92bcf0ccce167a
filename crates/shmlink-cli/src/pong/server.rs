//! The server end: serves one client's run as its hello describes it, with the
//! measurement core's peer, then waits for the client to close.

use shmlink::{Connection, ErrorKind};
use shmlink_measure::link::{failure_notice, ShmlinkEndpoint};
use shmlink_measure::protocol;
use shmlink_measure::verify::Sampling;

use super::wire::{self, Hello};
use crate::error::{Context, Result, RunError};

/// Serves one run on `conn`; returns the hello it served. On failure the client is sent
/// the reason (a failure notice) before the error is returned.
pub fn serve(mut conn: Connection) -> Result<Hello> {
    let msg = conn.recv_vec().context(|| "receive hello".to_string())?;
    let hello = match Hello::decode(&msg) {
        Ok(h) => h,
        Err(e) => {
            return Err(fail(
                &mut conn,
                RunError::new(format!("protocol error: {e}")),
            ))
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
            return Err(fail(&mut conn, e));
        }
    };
    conn.send(wire::READY)
        .context(|| "send ready".to_string())?;
    let mut ep = ShmlinkEndpoint::new(conn, wire::access(&hello));
    // The core tells the client why, if it fails.
    let report = protocol::serve(
        &mut ep,
        size,
        hello.mode,
        hello.window,
        (
            Sampling {
                one_in: hello.one_in,
            },
            hello.seed,
        ),
        None,
    )?;
    let mut conn = ep.into_inner();
    conn.send(&wire::encode_report(&report))
        .context(|| "send report".to_string())?;
    wait_for_close(&mut conn)?;
    Ok(hello)
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
    let _ = conn.send(&failure_notice(&e.to_string()));
    e
}
