//! `shmlink metrics` against a live `shm:` connection (with a refused client) and a live
//! topic with a lagging subscriber: scraped by hand (the text format parsed, the HTTP
//! edge cases answered), and by a real Prometheus server (Debian's `prometheus`,
//! `scripts/prometheus.sh install`) queried through its HTTP API.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use shmlink::{Connection, ErrorKind, Listener, Options, PubSubOptions, Publisher, Subscriber};
use shmlink_testkit::{wait_readable, HandshakePacket, KillOnDrop as Kill, TempDir as Dir};

const BIN: &str = env!("CARGO_BIN_EXE_shmlink");
/// How long anything here may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(60);
/// Messages the client sends at first (each answered with one), and their sizes.
const FIRST: u64 = 37;
const REQUEST: usize = 100;
const REPLY: usize = 10;
/// Messages published on the topic, and how many of them the subscriber reads.
const PUBLISHED: u64 = 12;
const READ: u64 = 4;

/// A directory with a listener that answers every message of its one client (and keeps
/// accepting, so that it answers `inspect`), a client, a refused query, and a topic.
struct Live {
    dir: Dir,
    conn_addr: String,
    topic_addr: String,
    client: Connection,
    stop: Arc<AtomicBool>,
    server: Option<JoinHandle<()>>,
    _publisher: Publisher,
    _subscriber: Subscriber,
}

impl Live {
    fn new(test: &str) -> Live {
        let dir =
            Dir(std::env::temp_dir()
                .join(format!("shmlink-cli-metrics-{test}-{}", std::process::id())));
        let _ = std::fs::remove_dir_all(&dir.0);
        std::fs::create_dir_all(&dir.0).unwrap();
        let conn_addr = format!("shm:{}/conn.sock", dir.0.display());
        let topic_addr = format!("shm:{}/topic.sock", dir.0.display());
        let listener = Listener::bind(&conn_addr, &Options::default()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let server = Some(serve(listener, stop.clone()));
        let mut client = Connection::connect(&conn_addr, &Options::default()).unwrap();
        exchange(&mut client, FIRST);
        // A query with a byte too many: refused for breaking the protocol.
        let mut bad = HandshakePacket::Query.encode();
        bad.push(0);
        let (answer, _) = shmlink_testkit::raw_handshake(&conn_addr, &bad).unwrap();
        assert!(matches!(
            HandshakePacket::decode(&answer),
            Ok(HandshakePacket::Refuse(..))
        ));

        let opts = PubSubOptions::default();
        let mut publisher = Publisher::bind(&topic_addr, &opts).unwrap();
        let mut subscriber = Subscriber::connect(&topic_addr, &opts).unwrap();
        let deadline = Instant::now() + DEADLINE;
        while publisher.subscriber_count() < 1 {
            assert!(Instant::now() < deadline, "the subscriber never joined");
            std::thread::sleep(Duration::from_millis(5));
        }
        for i in 0..PUBLISHED {
            publisher
                .publish(format!("message {i}").as_bytes())
                .unwrap();
        }
        for i in 0..READ {
            assert_eq!(
                subscriber.recv_vec().unwrap(),
                format!("message {i}").as_bytes()
            );
        }
        Live {
            dir,
            conn_addr,
            topic_addr,
            client,
            stop,
            server,
            _publisher: publisher,
            _subscriber: subscriber,
        }
    }

    /// Starts `shmlink metrics DIR --listen 127.0.0.1:0`; returns it and where it serves.
    fn metrics(&self) -> (Kill, SocketAddr) {
        let mut child = Command::new(BIN)
            .arg("metrics")
            .arg(&self.dir.0)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start shmlink metrics");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .rsplit_once(" on http://")
            .unwrap_or_else(|| panic!("shmlink metrics said {line:?}"))
            .1;
        let addr = url.strip_suffix("/metrics").unwrap().parse().unwrap();
        (Kill(child), addr)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(s) = self.server.take() {
            let _ = s.join();
        }
    }
}

/// Sends `n` requests and takes the `n` replies.
fn exchange(client: &mut Connection, n: u64) {
    for _ in 0..n {
        client.send(&[7; REQUEST]).unwrap();
        assert_eq!(client.recv_vec().unwrap().len(), REPLY);
    }
}

/// Accepts until stopped (answering queries) and answers each message of its clients.
fn serve(mut listener: Listener, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        listener.set_nonblocking(true);
        let mut conns: Vec<Connection> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            for c in &mut conns {
                loop {
                    match c.recv_vec() {
                        Ok(_) => c.send(&[1; REPLY]).unwrap(),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(_) => break,
                    }
                }
            }
            match listener.accept() {
                Ok(mut c) => {
                    c.set_nonblocking(true);
                    conns.push(c);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    wait_readable(&listener, Duration::from_millis(2));
                }
                // The refused query.
                Err(e) if e.kind() == ErrorKind::ProtocolViolation => {}
                Err(e) => panic!("accept: {e}"),
            }
        }
    })
}

/// One HTTP/1.1 request `raw` to `addr`; the status and the body.
fn http(addr: SocketAddr, raw: &[u8]) -> (u16, String) {
    try_http(addr, raw).unwrap_or_else(|e| panic!("{addr}: {e}"))
}

/// [`http`], or why there was no answer.
fn try_http(addr: SocketAddr, raw: &[u8]) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(DEADLINE))?;
    s.write_all(raw)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let out = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    Ok((status, body.to_string()))
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
    )
}

/// A sample of the text format: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the Prometheus text format strictly enough for what `shmlink metrics` writes:
/// `# HELP`/`# TYPE` lines, and `name{label="value",...} number` samples.
fn parse(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line:?}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line:?}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), BTreeMap::new()),
            Some((name, rest)) => {
                let rest = rest.strip_suffix('}').unwrap_or_else(|| panic!("{line:?}"));
                let mut labels = BTreeMap::new();
                let mut rest = rest;
                while !rest.is_empty() {
                    let (k, v) = rest.split_once("=\"").unwrap_or_else(|| panic!("{line:?}"));
                    // Values here carry no quotes or backslashes (paths, numbers).
                    let end = v.find('"').unwrap_or_else(|| panic!("{line:?}"));
                    labels.insert(k.to_string(), v[..end].to_string());
                    rest = v[end + 1..].strip_prefix(',').unwrap_or(&v[end + 1..]);
                }
                (name.to_string(), labels)
            }
        };
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line:?}"
        );
        samples.push((name, labels, value));
    }
    samples
}

/// The one sample of `name` whose labels include `with`.
fn value(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    let found: Vec<_> = samples
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && with
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(v))
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {with:?}: {found:?}");
    found[0].2
}

#[test]
fn a_scrape_has_the_counters_of_a_live_connection_and_topic() {
    let live = Live::new("scrape");
    let (_metrics, addr) = live.metrics();
    let started = Instant::now();
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    eprintln!("scrape took {:?}", started.elapsed());
    let s = parse(&body);
    let conn = [("listener", live.conn_addr.as_str())];
    let me = std::process::id().to_string();
    assert_eq!(value(&s, "shmlink_up", &[]), 1.0);
    for (state, n) in [("answered", 1.0), ("topic", 1.0), ("stale", 0.0)] {
        assert_eq!(value(&s, "shmlink_sockets", &[("state", state)]), n);
    }
    assert_eq!(
        value(
            &s,
            "shmlink_listener_connections",
            &[("listener", &live.conn_addr), ("pid", &me)]
        ),
        1.0
    );
    let n = FIRST as f64;
    for (name, want) in [
        ("shmlink_connection_received_messages_total", n),
        ("shmlink_connection_sent_messages_total", n),
        (
            "shmlink_connection_received_bytes_total",
            n * REQUEST as f64,
        ),
        ("shmlink_connection_sent_bytes_total", n * REPLY as f64),
    ] {
        assert_eq!(value(&s, name, &conn), want, "{name}");
    }
    assert_eq!(
        value(
            &s,
            "shmlink_connection_received_messages_total",
            &[("peer", &me), ("transport", "shm")]
        ),
        n
    );
    assert_eq!(
        value(
            &s,
            "shmlink_listener_refusals_total",
            &[("listener", &live.conn_addr), ("reason", "protocol")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &s,
            "shmlink_listener_refusals_total",
            &[("listener", &live.conn_addr), ("reason", "permission")]
        ),
        0.0
    );
    let topic = [("topic", live.topic_addr.as_str())];
    assert_eq!(
        value(&s, "shmlink_topic_published_messages_total", &topic),
        PUBLISHED as f64
    );
    assert_eq!(value(&s, "shmlink_topic_subscribers", &topic), 1.0);
    assert_eq!(
        value(&s, "shmlink_topic_joined_subscribers_total", &topic),
        1.0
    );
    assert_eq!(
        value(&s, "shmlink_subscriber_lag_messages", &topic),
        (PUBLISHED - READ) as f64
    );
    assert_eq!(
        value(&s, "shmlink_subscriber_dropped_messages_total", &topic),
        0.0
    );

    // HEAD: the headers only. Other paths, methods and oversized or silent requests.
    let (status, body) = http(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert_eq!((status, body.as_str()), (200, ""));
    assert_eq!(get(addr, "/").0, 404);
    assert_eq!(get(addr, "/metrics/x").0, 404);
    assert_eq!(http(addr, b"POST /metrics HTTP/1.1\r\n\r\n").0, 405);
    assert_eq!(http(addr, b"GET /metrics\r\n\r\n").0, 400);
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(20_000));
    assert_eq!(http(addr, huge.as_bytes()).0, 431);
    // A client that sends half a request and waits holds no one else up.
    let mut silent = TcpStream::connect(addr).unwrap();
    silent.write_all(b"GET /metr").unwrap();
    let started = Instant::now();
    assert_eq!(get(addr, "/metrics").0, 200);
    assert!(started.elapsed() < Duration::from_secs(4));
    drop(silent);
}

/// A free loopback port (bound, read, released: Prometheus binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Percent-encodes a query string value.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Asks Prometheus `query` until a result satisfies `done`; returns the results.
fn query_until(prom: SocketAddr, query: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let path = format!("/api/v1/query?query={}", encode(query));
        // Prometheus may not listen yet.
        let (status, body) = try_http(
            prom,
            format!("GET {path} HTTP/1.1\r\nHost: {prom}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap_or_else(|e| (0, e.to_string()));
        let results = (status == 200)
            .then(|| serde_json::from_str::<Value>(&body).ok())
            .flatten()
            .and_then(|v| v["data"]["result"].as_array().cloned())
            .unwrap_or_default();
        if done(&results) {
            return results;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never answered {query} as expected: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The value of a one-result instant vector.
fn only_value(results: &[Value]) -> Option<f64> {
    match results {
        [r] => r["value"][1].as_str()?.parse().ok(),
        _ => None,
    }
}

#[test]
fn prometheus_scrapes_the_counters_of_a_live_connection_and_topic() {
    let Ok(version) = Command::new("prometheus").arg("--version").output() else {
        shmlink_testkit::skip(
            "prometheus",
            "no prometheus on PATH (scripts/prometheus.sh install)",
        );
        return;
    };
    let version = String::from_utf8_lossy(&version.stdout).into_owned()
        + &String::from_utf8_lossy(&version.stderr);
    eprintln!("{}", version.lines().next().unwrap_or_default());
    let mut live = Live::new("prom");
    let (_metrics, target) = live.metrics();
    let port = free_port();
    let prom = SocketAddr::from(([127, 0, 0, 1], port));
    let config = live.dir.0.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: shmlink\n    static_configs:\n\
             \x20     - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let started = Instant::now();
    let _prometheus = Kill(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                live.dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address={prom}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );
    let target_up = query_until(prom, "up{job=\"shmlink\"}", |r| only_value(r) == Some(1.0));
    eprintln!(
        "Prometheus scraped shmlink metrics after {:?}: {target_up:?}",
        started.elapsed()
    );
    let select = |name: &str, label: &str, value: &str| format!("{name}{{{label}=\"{value}\"}}");
    let conn = |name: &str| select(name, "listener", &live.conn_addr);
    let topic = |name: &str| select(name, "topic", &live.topic_addr);
    let n = FIRST as f64;
    for (query, want) in [
        (conn("shmlink_connection_received_messages_total"), n),
        (conn("shmlink_connection_sent_messages_total"), n),
        (
            conn("shmlink_connection_received_bytes_total"),
            n * REQUEST as f64,
        ),
        (
            conn("shmlink_connection_sent_bytes_total"),
            n * REPLY as f64,
        ),
        (conn("shmlink_listener_connections"), 1.0),
        (
            format!(
                "shmlink_listener_refusals_total{{listener=\"{}\",reason=\"protocol\"}}",
                live.conn_addr
            ),
            1.0,
        ),
        (
            topic("shmlink_topic_published_messages_total"),
            PUBLISHED as f64,
        ),
        (topic("shmlink_topic_subscribers"), 1.0),
        (
            topic("shmlink_subscriber_lag_messages"),
            (PUBLISHED - READ) as f64,
        ),
        (topic("shmlink_subscriber_dropped_messages_total"), 0.0),
    ] {
        let r = query_until(prom, &query, |r| only_value(r).is_some());
        assert_eq!(only_value(&r), Some(want), "{query}: {r:?}");
        assert_eq!(r[0]["metric"]["job"], "shmlink", "{r:?}");
    }
    // The counter moves with the connection: three more messages, seen by a later scrape.
    exchange(&mut live.client, 3);
    let q = conn("shmlink_connection_received_messages_total");
    query_until(prom, &q, |r| only_value(r) == Some(n + 3.0));
    let rate = format!("increase({q}[1m])");
    let r = query_until(prom, &rate, |r| only_value(r).is_some_and(|v| v > 0.0));
    eprintln!(
        "{rate} = {:?}; the test took {:?}",
        only_value(&r),
        started.elapsed()
    );
}
