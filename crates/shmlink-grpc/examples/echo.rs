//! gRPC over shared memory: a tonic server on a shmlink listener and a client through a
//! shmlink channel.
//!
//! ```text
//! cargo run -p shmlink-grpc --example echo -- serve shm:echo   # one terminal
//! cargo run -p shmlink-grpc --example echo -- call shm:echo    # another
//! cargo run -p shmlink-grpc --example echo                     # both, in one process
//! ```
//!
//! With `auto:0.0.0.0:50051` instead of `shm:echo`, a client on the same machine
//! (`call auto:127.0.0.1:50051`) moves to shared memory and one elsewhere stays on TCP.

use std::time::Instant;

use shmlink::Options;
use shmlink_grpc::echo::{EchoClient, EchoServer, StreamRequest};

async fn serve(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let listener = shmlink::tokio::Listener::bind(addr, &Options::default())?;
    println!("serving shmlink.echo.Echo at {}", listener.local_addr());
    tonic::transport::Server::builder()
        .add_service(EchoServer::default())
        .serve_with_incoming(shmlink_grpc::incoming(listener))
        .await?;
    Ok(())
}

async fn call(addr: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = EchoClient::new(shmlink_grpc::channel(addr, &Options::default()).await?);
    let reply = client.unary(b"hello over shared memory".to_vec()).await?;
    println!("unary: {}", String::from_utf8_lossy(&reply));
    let start = Instant::now();
    let n = 10_000;
    for _ in 0..n {
        client.unary(vec![0u8; 64]).await?;
    }
    let took = start.elapsed();
    println!(
        "{n} unary 64 B calls in {took:?} ({:.1} µs each)",
        took.as_secs_f64() * 1e6 / n as f64
    );
    let mut stream = client
        .stream(StreamRequest {
            count: 5,
            size: 16,
            interval_us: 1000,
        })
        .await?;
    while let Some(msg) = stream.message().await? {
        println!("stream: message {} ({} bytes)", msg.seq, msg.payload.len());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["serve", addr] => serve(addr).await,
        ["call", addr] => call(addr).await,
        [] => {
            let dir =
                std::env::temp_dir().join(format!("shmlink-grpc-example-{}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            let addr = format!("shm:{}/echo.sock", dir.display());
            let listener = shmlink::tokio::Listener::bind(&addr, &Options::default())?;
            let server = tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(EchoServer::default())
                    .serve_with_incoming(shmlink_grpc::incoming(listener)),
            );
            let r = call(&addr).await;
            server.abort();
            let _ = std::fs::remove_dir_all(&dir);
            r
        }
        _ => Err("usage: echo [serve ADDR | call ADDR]".into()),
    }
}
