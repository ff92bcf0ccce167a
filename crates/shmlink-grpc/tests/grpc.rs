//! gRPC (tonic) over shmlink: a server on `serve_with_incoming(shmlink listener)`, clients
//! through `Endpoint::connect_with_connector`, at `shm:` and `auto:` addresses (upgraded
//! to shared memory, and left on TCP). Unary and server-streaming RPCs, 10,000 calls
//! each way, and a server killed with SIGKILL mid-stream: the client gets `Unavailable`,
//! not a hang.
//!
//! The killed server is this test binary run again as `--ignored --exact server_child`
//! with the address in [`ADDR_VAR`].

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use shmlink::tokio::Listener;
use shmlink::Options;
use shmlink_grpc::echo::{stream_payload, EchoClient, EchoServer, StreamRequest};
use tonic::Code;

const ADDR_VAR: &str = "SHMLINK_GRPC_CHILD_ADDR";
const READY: &str = "SHMLINK-GRPC-CHILD: serving";
const DEADLINE: Duration = Duration::from_secs(120);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .enable_all()
        .build()
        .unwrap()
}

fn test_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("shmlink-grpc-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn shm_addr(name: &str) -> String {
    format!("shm:{}/{name}.sock", test_dir().display())
}

/// Binds `addr`, serves the echo service on it in the background; returns the address
/// clients use (with the port for `auto:HOST:0`).
fn serve(addr: &str) -> String {
    let listener = Listener::bind(addr, &Options::default()).unwrap();
    let local = listener.local_addr();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(EchoServer::default())
            .serve_with_incoming(shmlink_grpc::incoming(listener))
            .await
            .unwrap();
    });
    local
}

/// 10,000 unary calls from 16 concurrent callers on one channel, each reply checked.
async fn unary_calls(client: &EchoClient, total: usize) {
    let callers = 16;
    let mut tasks = Vec::new();
    for caller in 0..callers {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..total / callers {
                let msg: Vec<u8> = format!("caller {caller} call {i} ")
                    .into_bytes()
                    .into_iter()
                    .chain((0..(i % 200) as u8).map(|b| b.wrapping_mul(7)))
                    .collect();
                let back = client.unary(msg.clone()).await.unwrap();
                assert_eq!(back, msg);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Connects to `addr` and makes 2,000 unary calls and two streams of 1,000 messages.
async fn short_exchange(addr: &str) {
    let client = EchoClient::new(
        shmlink_grpc::channel(addr, &Options::default())
            .await
            .unwrap(),
    );
    unary_calls(&client, 2_000).await;
    streams(&client, 2, 1_000, 100).await;
}

/// Server-streaming: `streams` concurrent streams of `count` messages, each message's
/// sequence number and bytes checked, and the stream's end.
async fn streams(client: &EchoClient, streams: usize, count: u64, size: u32) {
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = client
                .stream(StreamRequest {
                    count,
                    size,
                    interval_us: 0,
                })
                .await
                .unwrap();
            let mut seq = 0;
            while let Some(m) = s.message().await.unwrap() {
                assert_eq!(m.seq, seq);
                assert!(
                    m.payload == stream_payload(seq, size as usize),
                    "message {seq}"
                );
                seq += 1;
            }
            assert_eq!(seq, count);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[test]
fn unary_and_streaming_over_shm() {
    runtime().block_on(async {
        tokio::time::timeout(DEADLINE, async {
            let addr = serve(&shm_addr("echo"));
            let channel = shmlink_grpc::channel(&addr, &Options::default())
                .await
                .unwrap();
            let client = EchoClient::new(channel);
            unary_calls(&client, 10_000).await;
            // 10,000 streamed messages over 4 concurrent streams, plus 1 MiB messages.
            streams(&client, 4, 2_500, 64).await;
            streams(&client, 2, 20, 1 << 20).await;
            // Many short streaming calls.
            for _ in 0..200 {
                streams(&client, 1, 3, 10).await;
            }
        })
        .await
        .expect("gRPC over shm: hung");
    });
}

#[test]
fn unary_and_streaming_over_auto_upgraded_and_tcp() {
    runtime().block_on(async {
        tokio::time::timeout(DEADLINE, async {
            // Upgraded to shared memory (same kernel, same rendezvous directory).
            let addr = serve("auto:127.0.0.1:0");
            short_exchange(&addr).await;

            // Left on TCP: its upgrade socket is gone, as for a client on another machine.
            let addr = serve("auto:127.0.0.1:0");
            let port = addr.rsplit(':').next().unwrap().to_string();
            for e in std::fs::read_dir(shmlink::rendezvous_dir()).unwrap() {
                let e = e.unwrap();
                if e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("auto-{port}-"))
                {
                    std::fs::remove_file(e.path()).unwrap();
                }
            }
            short_exchange(&addr).await;
        })
        .await
        .expect("gRPC over auto: hung");
    });
}

/// The server process is killed with SIGKILL while it streams: the client's next read
/// fails with `Unavailable` within seconds (no hang), and so does a new call.
#[test]
fn server_killed_mid_stream_gives_unavailable() {
    let addr = shm_addr("killed");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "server_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ADDR_VAR, &addr)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains(READY));
    assert!(ready, "the server child never served");
    runtime().block_on(async {
        let channel = shmlink_grpc::channel(&addr, &Options::default())
            .await
            .unwrap();
        let mut client = EchoClient::new(channel);
        assert_eq!(client.unary(b"before".to_vec()).await.unwrap(), b"before");
        let mut s = client
            .stream(StreamRequest {
                count: 10_000_000,
                size: 64,
                interval_us: 100,
            })
            .await
            .unwrap();
        for seq in 0..100 {
            let m = s.message().await.unwrap().unwrap();
            assert_eq!(m.seq, seq);
        }
        child.kill().unwrap();
        let killed = std::time::Instant::now();
        let status = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match s.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("the stream ended cleanly after the server was killed"),
                    Err(status) => return status,
                }
            }
        })
        .await
        .expect("the client hung after the server was killed");
        eprintln!("stream error after {:?}: {status:?}", killed.elapsed());
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        let again = tokio::time::timeout(Duration::from_secs(10), client.unary(b"after".to_vec()))
            .await
            .expect("a new call hung after the server was killed")
            .unwrap_err();
        assert_eq!(again.code(), Code::Unavailable, "{again:?}");
    });
    child.wait().unwrap();
}

/// The server role of [`server_killed_mid_stream_gives_unavailable`].
#[test]
#[ignore = "a child process's role: run by server_killed_mid_stream_gives_unavailable"]
fn server_child() {
    let Ok(addr) = std::env::var(ADDR_VAR) else {
        return;
    };
    runtime().block_on(async move {
        let listener = Listener::bind(&addr, &Options::default()).unwrap();
        println!("{READY}");
        let stop = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        });
        tokio::select! {
            r = tonic::transport::Server::builder()
                .add_service(EchoServer::default())
                .serve_with_incoming(shmlink_grpc::incoming(listener)) => r.unwrap(),
            _ = stop => {}
        }
    });
}
