//! The two ends of `--pattern async`'s runs: the client (this process, pinned; round
//! trips and tonic calls, every echo compared with what was sent) and the server process
//! (this program re-executed, [`PEER_CMD`]), and what they share: addresses,
//! options, runtimes, the messages and the injected fault.

use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use shmlink::{Options, WaitPolicy};
use shmlink_grpc::echo::{EchoClient, EchoServer};
use shmlink_measure::protocol::Fault;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};
use tokio_util::codec::{Framed, LengthDelimitedCodec};

/// The hidden subcommand of the server process.
pub const PEER_CMD: &str = "__async-peer";

#[derive(Serialize, Clone, Debug)]
pub(super) struct Row {
    pub(super) kind: &'static str,
    pub(super) method: String,
    pub(super) size: usize,
    pub(super) callers: usize,
    /// Round trips or calls measured per round.
    pub(super) count: u64,
    pub(super) rounds: u32,
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
    pub(super) mean_us: f64,
    pub(super) per_s: f64,
    pub(super) error: Option<String>,
}

fn stats(
    kind: &'static str,
    method: &str,
    size: usize,
    callers: usize,
    mut ns: Vec<u64>,
    wall: Duration,
) -> Row {
    ns.sort_unstable();
    let pct = |p: f64| ns[((ns.len() as f64 - 1.0) * p).round() as usize] as f64 / 1000.0;
    let mean = ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0;
    Row {
        kind,
        method: method.to_string(),
        size,
        callers,
        count: ns.len() as u64,
        rounds: 1,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        mean_us: mean,
        per_s: ns.len() as f64 / wall.as_secs_f64(),
        error: None,
    }
}

pub(super) fn failed(
    kind: &'static str,
    method: &str,
    size: usize,
    callers: usize,
    e: String,
) -> Row {
    Row {
        kind,
        method: method.to_string(),
        size,
        callers,
        count: 0,
        rounds: 1,
        p50_us: f64::NAN,
        p99_us: f64::NAN,
        mean_us: f64::NAN,
        per_s: f64::NAN,
        error: Some(e),
    }
}

/// A server process: started with its method and address, it prints `ready ADDR` once
/// it listens; it exits when its stdin closes (or with the bench).
pub(super) struct Peer {
    child: Child,
    addr: String,
}

impl Peer {
    fn start(
        exe: &std::path::Path,
        method: &str,
        addr: &str,
        cpu: Option<usize>,
    ) -> Result<Peer, String> {
        let mut cmd = Command::new(exe);
        if let Some(cpu) = cpu {
            cmd.env(PEER_CPU_ENV, cpu.to_string());
        }
        let mut child = cmd
            .args([PEER_CMD, method, addr])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start the server: {e}"))?;
        let out = child.stdout.take().expect("piped");
        let mut line = String::new();
        BufReader::new(out)
            .read_line(&mut line)
            .map_err(|e| format!("read the server's address: {e}"))?;
        let Some(addr) = line.trim().strip_prefix("ready ") else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the server did not start (said {line:?})"));
        };
        Ok(Peer {
            addr: addr.to_string(),
            child,
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn scratch_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("shmlink-bench-async-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d
}

fn addr_for(method: &str) -> String {
    let dir = scratch_dir();
    match method {
        "shmlink-async" | "shmlink-async-nospin" | "shmlink-async-stream" | "tonic-shm" => {
            format!("shm:{}/{method}.sock", dir.display())
        }
        "tokio-uds" | "tonic-uds" => format!("{}/{method}.uds", dir.display()),
        _ => "127.0.0.1:0".to_string(),
    }
}

fn shm_opts(method: &str) -> Options {
    if method == "shmlink-async-nospin" {
        Options::default().wait_policy(WaitPolicy::BLOCKING)
    } else {
        Options::default()
    }
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The payload of message `i`: `size` bytes starting with `i`.
pub(super) fn message(i: u64, size: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..size)
        .map(|k| (k as u64).wrapping_add(i) as u8)
        .collect();
    let n = size.min(8);
    m[..n].copy_from_slice(&i.to_le_bytes()[..n]);
    m
}

/// What message `msg`, #`i`, goes out as: itself, or a damaged copy where `fault` hits it
/// (the echo, compared with `msg`, then differs).
fn outgoing(msg: &[u8], i: u64, fault: Option<Fault>) -> std::borrow::Cow<'_, [u8]> {
    match fault {
        Some(f) if f.hits(i) => {
            let mut v = msg.to_vec();
            f.damage(&mut v, i);
            std::borrow::Cow::Owned(v)
        }
        _ => std::borrow::Cow::Borrowed(msg),
    }
}

/// The corrupt:N or scribble:N in `SHMLINK_BENCH_FAULT` (main refused the others).
fn fault() -> Option<Fault> {
    crate::fault::data_fault()
}

/// The environment variable that tells the server process which CPU to pin itself to.
const PEER_CPU_ENV: &str = "SHMLINK_BENCH_ASYNC_PEER_CPU";

/// [`run_rtt`] on a thread pinned to the first allowed CPU, with the server on the second.
pub(super) fn run_rtt_pinned(exe: &std::path::Path, method: &str, size: usize, n: u64) -> Row {
    let exe = exe.to_path_buf();
    pinned("round-trip", method, size, 1, move |m, cpu| {
        run_rtt(&exe, m, size, n, cpu)
    })
}

/// [`run_tonic`] pinned like [`run_rtt_pinned`].
pub(super) fn run_tonic_pinned(
    exe: &std::path::Path,
    method: &str,
    size: usize,
    callers: usize,
    calls: u64,
) -> Row {
    let exe = exe.to_path_buf();
    pinned("tonic-unary", method, size, callers, move |m, cpu| {
        run_tonic(&exe, m, size, callers, calls, cpu)
    })
}

/// Runs `run(method, server CPU)` on a thread pinned to the first allowed CPU; the server
/// CPU is the second (the first when there is only one).
pub(super) fn pinned(
    kind: &'static str,
    method: &str,
    size: usize,
    callers: usize,
    run: impl FnOnce(&str, Option<usize>) -> Row + Send + 'static,
) -> Row {
    let cpus = shmlink_measure::cpus::allowed_cpus();
    let (client, server) = match cpus[..] {
        [a, b, ..] => (Some(a), Some(b)),
        [a] => (Some(a), Some(a)),
        [] => (None, None),
    };
    let method = method.to_string();
    std::thread::spawn(move || {
        if let Some(cpu) = client {
            if let Err(e) = shmlink_measure::sys::pin_to_cpu(cpu) {
                return failed(
                    kind,
                    &method,
                    size,
                    callers,
                    format!("pin to CPU {cpu}: {e}"),
                );
            }
        }
        run(&method, server)
    })
    .join()
    .unwrap_or_else(|_| failed(kind, "?", size, callers, "panicked".into()))
}

fn run_rtt(exe: &std::path::Path, method: &str, size: usize, n: u64, cpu: Option<usize>) -> Row {
    let peer = match Peer::start(exe, method, &addr_for(method), cpu) {
        Ok(p) => p,
        Err(e) => return failed("round-trip", method, size, 1, e),
    };
    let warm = (n / 10).max(200);
    let fault = fault();
    if let Err(e) = crate::fault::reached(fault, warm + n) {
        return failed("round-trip", method, size, 1, e);
    }
    let res = current_thread().block_on(async {
        match method {
            "shmlink-async" | "shmlink-async-nospin" => {
                let mut c = shmlink::tokio::Connection::connect(&peer.addr, &shm_opts(method))
                    .await
                    .map_err(|e| e.to_string())?;
                let mut ns = Vec::with_capacity(n as usize);
                let mut buf = vec![0u8; size];
                let t0 = Instant::now();
                for i in 0..warm + n {
                    if i == warm {
                        ns.clear();
                    }
                    let msg = message(i, size);
                    let out = outgoing(&msg, i, fault);
                    let t = Instant::now();
                    c.send(&out).await.map_err(|e| e.to_string())?;
                    let k = c.recv(&mut buf).await.map_err(|e| e.to_string())?;
                    ns.push(t.elapsed().as_nanos() as u64);
                    if buf[..k] != msg[..] {
                        return Err(format!("round trip {i}: wrong echo"));
                    }
                }
                let _ = t0;
                c.close().await.map_err(|e| e.to_string())?;
                Ok(ns)
            }
            "shmlink-async-stream" => {
                let c = shmlink::tokio::Connection::connect(&peer.addr, &Options::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let s = c.into_byte_stream();
                codec_rtt(s, size, warm, n, fault).await
            }
            "tokio-uds" => {
                let s = tokio::net::UnixStream::connect(&peer.addr)
                    .await
                    .map_err(|e| e.to_string())?;
                codec_rtt(s, size, warm, n, fault).await
            }
            _ => {
                let s = tokio::net::TcpStream::connect(&peer.addr)
                    .await
                    .map_err(|e| e.to_string())?;
                s.set_nodelay(true).map_err(|e| e.to_string())?;
                codec_rtt(s, size, warm, n, fault).await
            }
        }
    });
    match res {
        Ok(ns) => {
            let wall = Duration::from_nanos(ns.iter().sum());
            stats("round-trip", method, size, 1, ns, wall)
        }
        Err(e) => failed("round-trip", method, size, 1, e),
    }
}

async fn codec_rtt<T>(
    stream: T,
    size: usize,
    warm: u64,
    n: u64,
    fault: Option<Fault>,
) -> Result<Vec<u64>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut f = Framed::new(stream, LengthDelimitedCodec::new());
    let mut ns = Vec::with_capacity(n as usize);
    for i in 0..warm + n {
        if i == warm {
            ns.clear();
        }
        let msg = message(i, size);
        let out = outgoing(&msg, i, fault).into_owned();
        let t = Instant::now();
        f.send(bytes::Bytes::from(out))
            .await
            .map_err(|e| e.to_string())?;
        let back = f
            .next()
            .await
            .ok_or("the server closed")?
            .map_err(|e| e.to_string())?;
        ns.push(t.elapsed().as_nanos() as u64);
        if back[..] != msg[..] {
            return Err(format!("round trip {i}: wrong echo"));
        }
    }
    Ok(ns)
}

fn run_tonic(
    exe: &std::path::Path,
    method: &str,
    size: usize,
    callers: usize,
    calls: u64,
    cpu: Option<usize>,
) -> Row {
    let peer = match Peer::start(exe, method, &addr_for(method), cpu) {
        Ok(p) => p,
        Err(e) => return failed("tonic-unary", method, size, callers, e),
    };
    let warm = (calls / 10).max(100);
    let fault = fault();
    if let Err(e) = crate::fault::reached(fault, warm + calls * callers as u64) {
        return failed("tonic-unary", method, size, callers, e);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let res: Result<(Vec<u64>, Duration), String> = rt.block_on(async {
        let channel = match method {
            "tonic-shm" => shmlink_grpc::channel(&peer.addr, &Options::default())
                .await
                .map_err(|e| format!("{e}: {:?}", std::error::Error::source(&e)))?,
            "tonic-uds" => {
                let path = peer.addr.clone();
                let ch = tonic::transport::Endpoint::from_static("http://uds.invalid")
                    .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                                tokio::net::UnixStream::connect(path).await?,
                            ))
                        }
                    }))
                    .await
                    .map_err(|e| e.to_string())?;
                shmlink_grpc::ShmChannel::new(ch)
            }
            _ => {
                let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", peer.addr))
                    .map_err(|e| e.to_string())?
                    .tcp_nodelay(true)
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?;
                shmlink_grpc::ShmChannel::new(ch)
            }
        };
        let client = EchoClient::new(channel);
        // Warm-up.
        {
            let mut c = client.clone();
            for i in 0..warm {
                let msg = message(i, size);
                let back = c
                    .unary(outgoing(&msg, i, fault).into_owned())
                    .await
                    .map_err(|e| e.to_string())?;
                if back != msg {
                    return Err(format!("warm-up call {i}: wrong echo"));
                }
            }
        }
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for k in 0..callers {
            let mut c = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut ns = Vec::with_capacity(calls as usize);
                for i in 0..calls {
                    let seq = warm + i * callers as u64 + k as u64;
                    let msg = message(seq, size);
                    let out = outgoing(&msg, seq, fault).into_owned();
                    let t = Instant::now();
                    let back = c.unary(out).await.map_err(|e| e.to_string())?;
                    ns.push(t.elapsed().as_nanos() as u64);
                    if back != msg {
                        return Err(format!("caller {k}, call {i} (message #{seq}): wrong echo"));
                    }
                }
                Ok::<_, String>(ns)
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.map_err(|e| e.to_string())??);
        }
        Ok((all, t0.elapsed()))
    });
    match res {
        Ok((ns, wall)) => stats("tonic-unary", method, size, callers, ns, wall),
        Err(e) => failed("tonic-unary", method, size, callers, e),
    }
}

/// The server process: `PEER_CMD METHOD ADDR`.
pub(super) fn peer_main(method: &str, addr: &str) -> ExitCode {
    // Exit when the bench goes away (stdin closes).
    std::thread::spawn(|| {
        let mut s = String::new();
        let _ = std::io::stdin().read_line(&mut s);
        std::process::exit(0);
    });
    if let Some(cpu) = std::env::var(PEER_CPU_ENV)
        .ok()
        .and_then(|c| c.parse().ok())
    {
        if let Err(e) = shmlink_measure::sys::pin_to_cpu(cpu) {
            eprintln!("shmlink-bench: pin the server to CPU {cpu}: {e}");
            return ExitCode::from(1);
        }
    }
    let res: Result<(), String> = match method {
        "shmlink-async" | "shmlink-async-nospin" => current_thread().block_on(async {
            let mut l = shmlink::tokio::Listener::bind(addr, &shm_opts(method))
                .map_err(|e| e.to_string())?;
            ready(&l.local_addr());
            loop {
                let mut c = l.accept().await.map_err(|e| e.to_string())?;
                let mut buf = vec![0u8; 1 << 20];
                while let Ok(n) = c.recv(&mut buf).await {
                    if c.send(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }),
        "shmlink-async-stream" => current_thread().block_on(async {
            let mut l = shmlink::tokio::Listener::bind(addr, &Options::default())
                .map_err(|e| e.to_string())?;
            ready(&l.local_addr());
            loop {
                let c = l.accept().await.map_err(|e| e.to_string())?;
                codec_echo(Framed::new(
                    c.into_byte_stream(),
                    LengthDelimitedCodec::new(),
                ))
                .await;
            }
        }),
        "tokio-uds" => current_thread().block_on(async {
            let _ = std::fs::remove_file(addr);
            let l = tokio::net::UnixListener::bind(addr).map_err(|e| e.to_string())?;
            ready(addr);
            loop {
                let (s, _) = l.accept().await.map_err(|e| e.to_string())?;
                codec_echo(Framed::new(s, LengthDelimitedCodec::new())).await;
            }
        }),
        "tokio-tcp" => current_thread().block_on(async {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| e.to_string())?;
            ready(&l.local_addr().map_err(|e| e.to_string())?.to_string());
            loop {
                let (s, _) = l.accept().await.map_err(|e| e.to_string())?;
                let _ = s.set_nodelay(true);
                codec_echo(Framed::new(s, LengthDelimitedCodec::new())).await;
            }
        }),
        "tonic-shm" | "tonic-uds" | "tonic-tcp" => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
            .block_on(async {
                let router = tonic::transport::Server::builder().add_service(EchoServer::default());
                match method {
                    "tonic-shm" => {
                        let l = shmlink::tokio::Listener::bind(addr, &Options::default())
                            .map_err(|e| e.to_string())?;
                        ready(&l.local_addr());
                        router
                            .serve_with_incoming(shmlink_grpc::incoming(l))
                            .await
                            .map_err(|e| e.to_string())
                    }
                    "tonic-uds" => {
                        let _ = std::fs::remove_file(addr);
                        let l = tokio::net::UnixListener::bind(addr).map_err(|e| e.to_string())?;
                        ready(addr);
                        router
                            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(l))
                            .await
                            .map_err(|e| e.to_string())
                    }
                    _ => {
                        let l = tokio::net::TcpListener::bind(addr)
                            .await
                            .map_err(|e| e.to_string())?;
                        ready(&l.local_addr().map_err(|e| e.to_string())?.to_string());
                        let incoming = tokio_stream::wrappers::TcpListenerStream::new(l).map(|s| {
                            s.inspect(|s| {
                                let _ = s.set_nodelay(true);
                            })
                        });
                        router
                            .serve_with_incoming(incoming)
                            .await
                            .map_err(|e| e.to_string())
                    }
                }
            }),
        other => Err(format!("unknown method {other}")),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("error {e}");
            ExitCode::from(1)
        }
    }
}

fn ready(addr: &str) {
    let mut out = std::io::stdout();
    let _ = writeln!(out, "ready {addr}");
    let _ = out.flush();
}

async fn codec_echo<T>(mut f: Framed<T, LengthDelimitedCodec>)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    while let Some(Ok(m)) = f.next().await {
        if f.send(m.freeze()).await.is_err() {
            break;
        }
    }
}
