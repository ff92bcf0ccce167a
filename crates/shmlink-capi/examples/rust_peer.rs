//! The Rust end of the C interop tests (tests/c.rs): a C client against a Rust server,
//! a Rust client against the C echo server (examples/echo_server.c).
//!
//! `rust_peer server ADDR`: binds ADDR, prints the bound address on a line of its own,
//! echoes every message of one connection until the client closes.
//! `rust_peer client ADDR COUNT`: connects (retried for 20 s while nobody listens),
//! sends COUNT messages of varying sizes (0 B to 1 MiB, or to MAX_SIZE) with known
//! contents, checks that each comes back intact, closes.

use std::io::Write;
use std::time::{Duration, Instant};

use shmlink::{Connection, ErrorKind, Listener, Options};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["server", addr] => server(addr),
        ["client", addr, count] => client(addr, count.parse()?, usize::MAX),
        ["client", addr, count, max] => client(addr, count.parse()?, max.parse()?),
        _ => Err("usage: rust_peer server ADDR | rust_peer client ADDR COUNT [MAX_SIZE]".into()),
    }
}

fn server(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut listener = Listener::bind(addr, &Options::default())?;
    println!("{}", listener.local_addr());
    std::io::stdout().flush()?;
    let mut conn = listener.accept()?;
    loop {
        match conn.recv_vec() {
            Ok(msg) => conn.send(&msg)?,
            Err(e) if e.kind() == ErrorKind::EndOfStream => break,
            Err(e) => return Err(e.into()),
        }
    }
    conn.close()?;
    Ok(())
}

/// Message `i`: its size (at most `max`) and its bytes.
fn message(i: u64, max: usize) -> Vec<u8> {
    let len = match i % 10 {
        0 => 0,
        9 => 1 << 20,
        k => (i as usize * 7919 + k as usize * 131) % 70_000,
    }
    .min(max);
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn client(addr: &str, count: u64, max: usize) -> Result<(), Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut conn = loop {
        match Connection::connect(addr, &Options::default()) {
            Ok(c) => break c,
            Err(e) if e.kind() == ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(e.into()),
        }
    };
    for i in 0..count {
        let msg = message(i, max);
        conn.send(&msg)?;
        let back = conn.recv_vec()?;
        if back != msg {
            return Err(format!("message {i} ({} bytes) came back changed", msg.len()).into());
        }
    }
    conn.close()?;
    println!("rust client: {count} messages echoed intact by {addr}");
    Ok(())
}
