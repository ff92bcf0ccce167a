//! Minimal round-trip timer between two processes, using only the library:
//! `cargo run --release --example pingpong -- [ADDR] [COUNT]`.
//! The parent binds ADDR, re-runs itself as the child (the echoing client), and prints
//! round-trip percentiles of 64-byte messages.

use std::time::Instant;

use shmlink::{Connection, Listener, Options};

fn main() -> shmlink::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--stream-child") {
        shmlink::pin_to_cpu(1).ok();
        let mut c = Connection::connect(&args[2], &Options::default())?;
        let mut n = 0u64;
        while let Ok(m) = c.recv_ref() {
            n += m[0] as u64;
        }
        println!("child received sum {n}");
        return Ok(());
    }
    if args.get(1).map(String::as_str) == Some("--stream") {
        shmlink::pin_to_cpu(0).ok();
        let addr = format!("shm:stream-{}", std::process::id());
        let mut l = Listener::bind(&addr, &Options::default())?;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--stream-child", &l.local_addr()])
            .spawn()
            .expect("spawn child");
        let mut conn = l.accept()?;
        let n = 20_000_000u64;
        let t = Instant::now();
        for _ in 0..n {
            let mut b = conn.reserve(64)?;
            b[0] = 1;
            b.commit()?;
        }
        conn.close()?;
        child.wait().ok();
        println!("stream: {:.1} M msgs/s", n as f64 / t.elapsed().as_secs_f64() / 1e6);
        return Ok(());
    }
    if args.get(1).map(String::as_str) == Some("--child") {
        shmlink::pin_to_cpu(1).ok();
        let mut c = Connection::connect(&args[2], &Options::default())?;
        loop {
            let msg = match c.recv_ref() {
                Ok(m) => m.to_vec(),
                Err(_) => return Ok(()),
            };
            c.send(&msg)?;
        }
    }
    let addr = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| format!("shm:pingpong-{}", std::process::id()));
    let count: usize = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(200_000);
    shmlink::pin_to_cpu(0).ok();
    let mut l = Listener::bind(&addr, &Options::default())?;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--child", &l.local_addr()])
        .spawn()
        .expect("spawn child");
    let mut conn = l.accept()?;
    let msg = [7u8; 64];
    let mut rtts = Vec::with_capacity(count);
    for i in 0..count + 10_000 {
        let t = Instant::now();
        conn.send(&msg)?;
        let back = conn.recv_ref()?;
        assert_eq!(back.len(), 64);
        drop(back);
        if i >= 10_000 {
            rtts.push(t.elapsed().as_nanos() as u64);
        }
    }
    conn.close()?;
    child.wait().ok();
    rtts.sort_unstable();
    let p = |q: f64| rtts[((rtts.len() - 1) as f64 * q) as usize];
    println!(
        "{addr}: {count} round trips of 64 B: p50 {} ns, p90 {} ns, p99 {} ns, p99.9 {} ns, max {} ns",
        p(0.5), p(0.9), p(0.99), p(0.999), p(1.0)
    );
    Ok(())
}
