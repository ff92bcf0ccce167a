//! The library's own floor, without the pong tool's verification: round-trip percentiles
//! of SIZE-byte messages (64 by default), or a one-way stream of them, between two pinned
//! processes; or the CPU time an idle connected pair uses. Messages are copied in
//! (`send`) and out (`recv`), as the bench's copying rows do.
//!
//! `cargo run --release --example pingpong -- [--stream [--reserve] [--batch N] | --idle SECONDS] [ADDR] [COUNT] [SIZE]`
//!
//! `--batch N` streams through [`Connection::batch`]: N messages per batch, published
//! together (one ring position store and one fence per batch instead of per message).
//! `--reserve` streams through `reserve` + a copy + `commit` instead of `send`.
//!
//! The parent binds ADDR (default `shm:pingpong-PID`), re-runs itself as the child (the
//! echoing or draining end), and prints what it measured.

use std::process::{Child, Command};
use std::time::Instant;

use shmlink::{Connection, Listener, Options};

fn main() -> shmlink::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--child") => return child(&args[1], false, size_arg(&args, 2)),
        Some("--stream-child") => return child(&args[1], true, size_arg(&args, 2)),
        Some("--idle") => return idle(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10)),
        Some("--idle-child") => {
            return idle_child(
                &args[1],
                args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10),
            )
        }
        _ => {}
    }
    let stream = args.first().is_some_and(|a| a == "--stream");
    if stream {
        args.remove(0);
    }
    let reserve = args.first().is_some_and(|a| a == "--reserve");
    if reserve {
        args.remove(0);
    }
    let mut batch = 1;
    if args.first().is_some_and(|a| a == "--batch") {
        batch = args
            .get(1)
            .and_then(|n| n.parse().ok())
            .filter(|&n| n > 0)
            .expect("--batch N: N > 0");
        args.drain(..2);
    }
    let addr = args
        .first()
        .cloned()
        .unwrap_or_else(|| format!("shm:pingpong-{}", std::process::id()));
    let size = size_arg(&args, 2);
    let default = if stream { 20_000_000 } else { 200_000 };
    let count = args
        .get(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(default * 64 / size.max(64));
    shmlink_sys::pin_to_cpu(0).ok();
    let mut listener = Listener::bind(&addr, &options(size))?;
    let role = if stream { "--stream-child" } else { "--child" };
    let mut child: Child = Command::new(std::env::current_exe().expect("own path"))
        .args([role, &listener.local_addr(), &size.to_string()])
        .spawn()
        .expect("spawn the child");
    let result = listener.accept().and_then(|mut conn| {
        if stream {
            stream_to(conn, count, size, batch, reserve)
        } else {
            ping(&mut conn, count, size)
        }
    });
    child.wait().expect("wait for the child");
    let line = result?;
    println!("{addr}: {line}");
    Ok(())
}

/// The message size argument at `i` (64 if absent).
fn size_arg(args: &[String], i: usize) -> usize {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(64)
}

/// The default options, with room for `size`-byte messages.
fn options(size: usize) -> Options {
    let opts = Options::default();
    let max = opts.configured_max_msg_size().max(size);
    opts.max_msg_size(max)
}

/// The child: echo every message, or drain them, until the parent closes.
fn child(addr: &str, drain: bool, size: usize) -> shmlink::Result<()> {
    shmlink_sys::pin_to_cpu(1).ok();
    let mut conn = Connection::connect(addr, &options(size))?;
    let mut buf = vec![0u8; size];
    loop {
        let n = match conn.recv(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == shmlink::ErrorKind::EndOfStream => return Ok(()),
            Err(e) => return Err(e),
        };
        if !drain {
            conn.send(&buf[..n])?;
        }
    }
}

fn ping(conn: &mut Connection, count: usize, size: usize) -> shmlink::Result<String> {
    let warmup = (10_000 * 64 / size.max(64)).max(10);
    let msg = vec![7u8; size];
    let mut back = vec![0u8; size];
    let mut rtts = Vec::with_capacity(count);
    for i in 0..warmup + count {
        let t = Instant::now();
        conn.send(&msg)?;
        conn.recv(&mut back)?;
        if i >= warmup {
            rtts.push(t.elapsed().as_nanos() as u64);
        }
    }
    rtts.sort_unstable();
    let p = |q: f64| rtts[((rtts.len() - 1) as f64 * q) as usize];
    Ok(format!(
        "{count} round trips of {size} B: p50 {} ns, p90 {} ns, p99 {} ns, p99.9 {} ns, max {} ns",
        p(0.5),
        p(0.9),
        p(0.99),
        p(0.999),
        p(1.0)
    ))
}

fn stream_to(
    mut conn: Connection,
    count: usize,
    size: usize,
    batch: usize,
    reserve: bool,
) -> shmlink::Result<String> {
    let mut msg = vec![7u8; size];
    let t = Instant::now();
    let mut i = 0;
    while i < count && batch == 1 {
        // Per message: each `send` (or `reserve` + `commit`) published on its own.
        msg[..8.min(size)].copy_from_slice(&(i as u64).to_le_bytes()[..8.min(size)]);
        if reserve {
            let mut buf = conn.reserve(size)?;
            buf.copy_from_slice(&msg);
            buf.commit()?;
        } else {
            conn.send(&msg)?;
        }
        i += 1;
    }
    while i < count {
        let mut b = conn.batch();
        for _ in 0..batch.min(count - i) {
            msg[..8.min(size)].copy_from_slice(&(i as u64).to_le_bytes()[..8.min(size)]);
            if reserve {
                let mut buf = b.reserve(size)?;
                buf.copy_from_slice(&msg);
                buf.commit()?;
            } else {
                b.send(&msg)?;
            }
            i += 1;
        }
        b.finish();
    }
    conn.close()?;
    let secs = t.elapsed().as_secs_f64();
    Ok(format!(
        "{count} messages of {size} B streamed (batches of {batch}{}): {:.3} M msgs/s, {:.0} MiB/s",
        if reserve { ", reserve + commit" } else { "" },
        count as f64 / secs / 1e6,
        (count * size) as f64 / secs / (1 << 20) as f64
    ))
}

/// Each end in turn blocks in `recv` for `secs` seconds while the other sleeps; each
/// reports the CPU time its process used while blocked.
fn idle(secs: u64) -> shmlink::Result<()> {
    let addr = format!("shm:idle-{}", std::process::id());
    let mut listener = Listener::bind(&addr, &Options::default())?;
    let mut child: Child = Command::new(std::env::current_exe().expect("own path"))
        .args(["--idle-child", &listener.local_addr(), &secs.to_string()])
        .spawn()
        .expect("spawn the child");
    let result = listener.accept().and_then(|mut conn| {
        let before = shmlink_sys::cpu_time();
        let msg = conn.recv_vec()?; // the child sends after `secs`
        let used = shmlink_sys::cpu_time() - before;
        println!("{addr}: listener side blocked in recv for {secs} s used {used:?} of CPU");
        std::thread::sleep(std::time::Duration::from_secs(secs)); // the child's turn
        conn.send(&msg)
    });
    child.wait().expect("wait for the child");
    result
}

/// The connecting end of `--idle`.
fn idle_child(addr: &str, secs: u64) -> shmlink::Result<()> {
    let mut conn = Connection::connect(addr, &Options::default())?;
    std::thread::sleep(std::time::Duration::from_secs(secs)); // the listener's turn
    conn.send(b"wake")?;
    let before = shmlink_sys::cpu_time();
    conn.recv_vec()?;
    let used = shmlink_sys::cpu_time() - before;
    println!("{addr}: connecting side blocked in recv for {secs} s used {used:?} of CPU");
    Ok(())
}
