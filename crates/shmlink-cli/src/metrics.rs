//! `shmlink metrics`: what `shmlink ls` sees ([`shmlink::inspect`]), served over HTTP in
//! the Prometheus text exposition format (0.0.4) for a Prometheus server to scrape.
//!
//! Every scrape asks the listeners and topics afresh (nothing is cached, so a scrape
//! costs what one `shmlink ls` costs: at most `--timeout`). The HTTP side is a small
//! HTTP/1.1 server on std's `TcpListener`: `GET`/`HEAD /metrics` only, one request per
//! connection, the request head bounded in size and time, a few clients at once.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use shmlink::inspect::{SocketReport, SocketState};

/// Longest request head (request line and headers) accepted.
const MAX_HEAD: usize = 8 * 1024;
/// How long a client has to send its request head, and to take the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Clients served at once; more are answered 503 and closed.
const MAX_CLIENTS: usize = 8;
/// Longest `--timeout` accepted (one minute), as `shmlink ls`.
const MAX_TIMEOUT_MS: u64 = 60_000;
/// The answer's content type: the Prometheus text format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const METRICS_LONG: &str = "\
Serve what `shmlink ls` shows as Prometheus metrics: an HTTP server on --listen IP:PORT
answers GET /metrics in the Prometheus text format, asking the listeners and topics of
the rendezvous directory afresh on every scrape (docs/operations.md).";

const METRICS_AFTER: &str = "\
Metrics (all prefixed shmlink_; the counters of a connection are its listener side's:
\"received\" are the messages its client sent):

  sockets{state}                            sockets in DIR by state: answered, topic,
                                            not_answering, stale, permission_denied, error
  listener_connections{listener,transport,pid}
                                            live connections of a listener
  listener_start_time_seconds{listener,transport,pid}
  listener_refusals_total{listener,pid,reason}
                                            clients the listener refused, by reason:
                                            version, permission, invalid, protocol,
                                            resources
  connection_{received,sent}_messages_total{listener,transport,peer,peer_uid,accepted}
  connection_{received,sent}_bytes_total{...}
                                            a connection's messages and payload bytes
                                            each way; peer is the client's PID (shm:)
                                            or address; accepted its accept time (ms)
  topic_published_messages_total{topic,pid}
  topic_subscribers{topic,pid}              subscribers now
  topic_{joined,left,detached}_subscribers_total{topic,pid}
  subscriber_lag_messages{topic,slot,pid,remote}
                                            messages published it has not read yet
  subscriber_dropped_messages_total{topic,slot,pid,remote}
                                            messages it lost to overwriting

Any other path is answered 404, other methods 405. The server prints the address it
listens on (useful with port 0) on stdout, and runs until it is killed.

Exit status: 1 if IP:PORT cannot be bound, 2 on bad arguments.";

/// `shmlink metrics`'s arguments as given.
#[derive(clap::Args, Debug)]
#[command(
    args_override_self = true,
    about = "Serve the listeners' and topics' counters to Prometheus over HTTP",
    long_about = METRICS_LONG,
    after_long_help = METRICS_AFTER
)]
pub struct MetricsCli {
    /// The directory to scan [default: the rendezvous directory, as `shmlink ls`]
    #[arg(value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Where to serve HTTP, IP:PORT (port 0: any free port)
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:9477")]
    listen: SocketAddr,
    /// How long each scrape waits for the listeners' answers, in milliseconds
    #[arg(long, value_name = "MS", default_value_t = shmlink::inspect::DEFAULT_INSPECT_TIMEOUT.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_MS))]
    timeout: u64,
}

/// What a scrape needs to know.
struct Scrape {
    dir: PathBuf,
    /// DIR was not given: a missing default directory means nothing listens yet.
    explicit_dir: bool,
    timeout: Duration,
}

/// Runs the server until the process is killed.
pub fn run(cli: &MetricsCli) -> ExitCode {
    let listener = match TcpListener::bind(cli.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("shmlink metrics: listen on {}: {e}", cli.listen);
            return ExitCode::from(1);
        }
    };
    let scrape = Arc::new(Scrape {
        dir: cli.dir.clone().unwrap_or_else(shmlink::rendezvous_dir),
        explicit_dir: cli.dir.is_some(),
        timeout: Duration::from_millis(cli.timeout),
    });
    let local = listener.local_addr().unwrap_or(cli.listen);
    println!(
        "shmlink metrics: serving {} on http://{local}/metrics",
        scrape.dir.display()
    );
    let _ = std::io::stdout().flush();
    // SYNC POINT: client count. Relaxed: a count of threads that bounds how many run at
    // once and orders nothing else (an off-by-one while a thread ends is harmless).
    let busy = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else {
            // EMFILE and the like: let a client go before accepting the next.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if busy.fetch_add(1, Ordering::Relaxed) >= MAX_CLIENTS {
            busy.fetch_sub(1, Ordering::Relaxed);
            let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
            let _ = respond(&mut stream, 503, "text/plain", b"busy\n", false);
            continue;
        }
        let (scrape, mine) = (scrape.clone(), busy.clone());
        let spawned = std::thread::Builder::new()
            .name("metrics-client".into())
            .spawn(move || {
                serve(stream, &scrape);
                mine.fetch_sub(1, Ordering::Relaxed);
            });
        if spawned.is_err() {
            busy.fetch_sub(1, Ordering::Relaxed);
        }
    }
    ExitCode::SUCCESS
}

/// Answers one client's one request, then closes the connection.
fn serve(mut stream: TcpStream, scrape: &Scrape) {
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let head = match read_head(&mut stream, Instant::now() + IO_TIMEOUT) {
        Ok(h) => h,
        Err(Some(status)) => {
            let _ = respond(&mut stream, status, "text/plain", b"bad request\n", false);
            return;
        }
        Err(None) => return, // gone or silent
    };
    let (status, head_only) = match route(&head) {
        Ok(head_only) => (200, head_only),
        Err(status) => (status, false),
    };
    if status != 200 {
        let body = format!("{status} {}\n", reason(status));
        let _ = respond(&mut stream, status, "text/plain", body.as_bytes(), false);
        return;
    }
    let body = scrape_text(scrape);
    let _ = respond(&mut stream, 200, CONTENT_TYPE, body.as_bytes(), head_only);
}

/// Reads the request head (up to the blank line) by `deadline`: `Err(Some(status))` to
/// answer with, `Err(None)` when the client left or stayed silent.
fn read_head(stream: &mut TcpStream, deadline: Instant) -> Result<Vec<u8>, Option<u16>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Some(408));
        }
        stream.set_read_timeout(Some(left)).map_err(|_| None)?;
        let n = match stream.read(&mut buf) {
            Ok(0) => return Err(None),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Some(408))
            }
            Err(_) => return Err(None),
        };
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = find_blank_line(&head) {
            head.truncate(end);
            return Ok(head);
        }
        if head.len() > MAX_HEAD {
            return Err(Some(431));
        }
    }
}

/// Where the head ends (the index of its blank line), accepting bare LF as well.
fn find_blank_line(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = bytes.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The request line's verdict: `Ok(head_only)` for `GET`/`HEAD /metrics`, else the
/// status to answer with.
fn route(head: &[u8]) -> Result<bool, u16> {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = std::str::from_utf8(line).map_err(|_| 400u16)?.trim_end();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(400);
    };
    if !version.starts_with("HTTP/1.") {
        return Err(if version.starts_with("HTTP/") {
            505
        } else {
            400
        });
    }
    let path = target.split('?').next().unwrap_or_default();
    if path != "/metrics" {
        return Err(404);
    }
    match method {
        "GET" => Ok(false),
        "HEAD" => Ok(true),
        _ => Err(405),
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

/// Writes a complete answer and closes the connection (`Connection: close`).
fn respond(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
        reason(status),
        body.len()
    );
    if status == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    if !head_only {
        bytes.extend_from_slice(body);
    }
    stream.write_all(&bytes)?;
    stream.flush()?;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    Ok(())
}

/// One scrape: the directory asked now, encoded.
fn scrape_text(scrape: &Scrape) -> String {
    let reports = match shmlink::inspect(&scrape.dir, scrape.timeout) {
        Ok(r) => r,
        Err(_) if !scrape.explicit_dir && missing(&scrape.dir) => Vec::new(),
        Err(e) => {
            // Served as a metric, so that an unreadable directory shows in Prometheus.
            eprintln!("shmlink metrics: {e}");
            return encode(&[], false);
        }
    };
    encode(&reports, true)
}

fn missing(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: String,
    transport: String,
    pid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    listener: String,
    pid: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionLabels {
    listener: String,
    transport: String,
    peer: String,
    peer_uid: String,
    accepted: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicLabels {
    topic: String,
    pid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SubscriberLabels {
    topic: String,
    slot: String,
    pid: String,
    remote: String,
}

type Counters<L> = Family<L, Counter>;
type Gauges<L> = Family<L, Gauge>;

/// Adds `v` to the counter of `labels` (two connections with the same labels add up,
/// so no series is ever written twice).
fn add<L: Clone + std::hash::Hash + Eq>(f: &Counters<L>, labels: L, v: u64) {
    f.get_or_create(&labels).inc_by(v);
}

/// Adds `v` to the gauge of `labels` (fresh gauges: the first add sets it).
fn gauge_add<L: Clone + std::hash::Hash + Eq>(f: &Gauges<L>, labels: L, v: u64) {
    f.get_or_create(&labels)
        .inc_by(i64::try_from(v).unwrap_or(i64::MAX));
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The reports as the Prometheus text format. `readable`: whether the directory could
/// be read (`shmlink_up`).
pub fn encode(reports: &[SocketReport], readable: bool) -> String {
    let mut reg = Registry::with_prefix("shmlink");
    let up = Gauge::<i64>::default();
    up.set(i64::from(readable));
    reg.register(
        "up",
        "1 if the rendezvous directory could be read at this scrape",
        up,
    );
    let sockets = Gauges::<StateLabels>::default();
    let conns = Gauges::<ListenerLabels>::default();
    let started = Gauges::<ListenerLabels>::default();
    let refusals = Counters::<RefusalLabels>::default();
    let [msgs_in, msgs_out, bytes_in, bytes_out] = [(); 4].map(|_| Counters::default());
    let published = Counters::<TopicLabels>::default();
    let subs = Gauges::<TopicLabels>::default();
    let [joined, left, detached] = [(); 3].map(|_| Counters::<TopicLabels>::default());
    let lag = Gauges::<SubscriberLabels>::default();
    let dropped = Counters::<SubscriberLabels>::default();
    for state in [
        "answered",
        "topic",
        "not_answering",
        "stale",
        "permission_denied",
        "error",
    ] {
        // Every state has its series, zero or not.
        gauge_add(
            &sockets,
            StateLabels {
                state: state.into(),
            },
            0,
        );
    }
    for r in reports {
        let pid = r.listener.map_or_else(String::new, |c| c.pid.to_string());
        let state = match &r.state {
            SocketState::Answered(_) => "answered",
            SocketState::Topic(_) => "topic",
            SocketState::NotAnswering => "not_answering",
            SocketState::Stale => "stale",
            SocketState::PermissionDenied(_) => "permission_denied",
            _ => "error",
        };
        gauge_add(
            &sockets,
            StateLabels {
                state: state.into(),
            },
            1,
        );
        match &r.state {
            SocketState::Answered(s) => {
                let l = ListenerLabels {
                    listener: s.address.clone(),
                    transport: s.transport.clone(),
                    pid: pid.clone(),
                };
                gauge_add(&conns, l.clone(), s.connections.len() as u64);
                gauge_add(&started, l, unix_ms(s.started) / 1000);
                for (reason, n) in s.refusals.iter() {
                    let labels = RefusalLabels {
                        listener: s.address.clone(),
                        pid: pid.clone(),
                        reason: reason.to_string(),
                    };
                    add(&refusals, labels, n);
                }
                for c in &s.connections {
                    let labels = ConnectionLabels {
                        listener: s.address.clone(),
                        transport: c.transport.clone(),
                        peer: match (&c.peer, &c.peer_addr) {
                            (Some(p), _) => p.pid.to_string(),
                            (None, Some(a)) => a.clone(),
                            (None, None) => String::new(),
                        },
                        peer_uid: c.peer.map_or_else(String::new, |p| p.uid.to_string()),
                        accepted: unix_ms(c.accepted).to_string(),
                    };
                    let k = &c.counters;
                    add(&msgs_in, labels.clone(), k.msgs_in);
                    add(&msgs_out, labels.clone(), k.msgs_out);
                    add(&bytes_in, labels.clone(), k.bytes_in);
                    add(&bytes_out, labels, k.bytes_out);
                }
            }
            SocketState::Topic(t) => {
                let l = TopicLabels {
                    topic: t.address.clone(),
                    pid: pid.clone(),
                };
                add(&published, l.clone(), t.published);
                gauge_add(&subs, l.clone(), t.subscribers.len() as u64);
                add(&joined, l.clone(), t.joined);
                add(&left, l.clone(), t.left);
                add(&detached, l, t.detached);
                for s in &t.subscribers {
                    let labels = SubscriberLabels {
                        topic: t.address.clone(),
                        slot: s.slot.to_string(),
                        pid: s.cred.pid.to_string(),
                        remote: s.remote.clone().unwrap_or_default(),
                    };
                    gauge_add(&lag, labels.clone(), s.lag);
                    add(&dropped, labels, s.missed);
                }
            }
            _ => {}
        }
    }
    reg.register(
        "sockets",
        "Sockets in the rendezvous directory by state",
        sockets,
    );
    reg.register(
        "listener_connections",
        "Live connections of a listener",
        conns,
    );
    reg.register(
        "listener_start_time_seconds",
        "When the listener was bound, seconds since the Unix epoch",
        started,
    );
    reg.register(
        "listener_refusals",
        "Clients the listener refused, by reason",
        refusals,
    );
    reg.register(
        "connection_received_messages",
        "Messages the listener side of a connection received (its client sent)",
        msgs_in,
    );
    reg.register(
        "connection_sent_messages",
        "Messages the listener side of a connection sent",
        msgs_out,
    );
    reg.register(
        "connection_received_bytes",
        "Payload bytes the listener side of a connection received",
        bytes_in,
    );
    reg.register(
        "connection_sent_bytes",
        "Payload bytes the listener side of a connection sent",
        bytes_out,
    );
    reg.register(
        "topic_published_messages",
        "Messages published on a topic",
        published,
    );
    reg.register("topic_subscribers", "Subscribers of a topic now", subs);
    reg.register(
        "topic_joined_subscribers",
        "Subscribers admitted since the topic was bound",
        joined,
    );
    reg.register("topic_left_subscribers", "Subscribers that went away", left);
    reg.register(
        "topic_detached_subscribers",
        "Subscribers the publisher detached (stalled, or broke the protocol)",
        detached,
    );
    reg.register(
        "subscriber_lag_messages",
        "Messages published that the subscriber has not read yet",
        lag,
    );
    reg.register(
        "subscriber_dropped_messages",
        "Messages the subscriber lost to overwriting, as it reports them",
        dropped,
    );
    let mut out = String::new();
    // Writing into a String does not fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &reg);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `shmlink metrics ARGS`, or clap's message.
    fn args(args: &str) -> Result<MetricsCli, String> {
        let argv = ["shmlink", "metrics"]
            .into_iter()
            .chain(args.split_whitespace());
        match crate::cli::parse(argv).map_err(|e| e.to_string())?.command {
            crate::cli::Command::Metrics(m) => Ok(m),
            other => panic!("not a metrics command: {other:?}"),
        }
    }

    #[test]
    fn arguments() {
        let a = args("").unwrap();
        assert_eq!(a.listen, "127.0.0.1:9477".parse().unwrap());
        assert_eq!((a.dir, a.timeout), (None, 500));
        let a = args("/d --listen [::1]:0 --timeout 20").unwrap();
        assert_eq!(a.listen, "[::1]:0".parse().unwrap());
        assert_eq!((a.dir, a.timeout), (Some("/d".into()), 20));
        for (bad, needle) in [
            (
                "--listen localhost",
                "invalid value 'localhost' for '--listen",
            ),
            ("--listen 127.0.0.1", "invalid value '127.0.0.1'"),
            ("--timeout 0", "invalid value '0' for '--timeout <MS>'"),
            ("--timeout 60001", "1..=60000"),
            ("a b", "unexpected argument 'b'"),
        ] {
            let e = args(bad).unwrap_err();
            assert!(e.contains(needle), "{bad:?}: {e:?} lacks {needle:?}");
        }
    }

    #[test]
    fn requests_are_routed_by_method_and_path() {
        assert_eq!(route(b"GET /metrics HTTP/1.1\r\nHost: x"), Ok(false));
        assert_eq!(route(b"HEAD /metrics?x=1 HTTP/1.0"), Ok(true));
        assert_eq!(route(b"GET / HTTP/1.1"), Err(404));
        assert_eq!(route(b"GET /metricsx HTTP/1.1"), Err(404));
        assert_eq!(route(b"POST /metrics HTTP/1.1"), Err(405));
        assert_eq!(route(b"GET /metrics HTTP/2.0"), Err(505));
        assert_eq!(route(b"GET /metrics"), Err(400));
        assert_eq!(route(b"GET  /metrics HTTP/1.1"), Err(400));
        assert_eq!(route(b"\xff\xfe"), Err(400));
        assert_eq!(route(b""), Err(400));
    }

    #[test]
    fn the_head_ends_at_the_first_blank_line() {
        assert_eq!(find_blank_line(b"GET / HTTP/1.1\r\n\r\nbody"), Some(14));
        assert_eq!(find_blank_line(b"GET / HTTP/1.1\n\n"), Some(14));
        assert_eq!(find_blank_line(b"GET / HTTP/1.1\r\nHost: a\r\n"), None);
    }

    #[test]
    fn an_empty_directory_has_zero_sockets_of_every_state() {
        let text = encode(&[], true);
        assert!(text.contains("shmlink_up 1\n"), "{text}");
        assert!(
            text.contains("shmlink_sockets{state=\"stale\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE shmlink_sockets gauge\n"), "{text}");
        let states = text
            .lines()
            .filter(|l| l.starts_with("shmlink_sockets{"))
            .inspect(|l| assert!(l.ends_with("} 0"), "{l}"))
            .count();
        assert_eq!(states, 6, "{text}");
        // Families without a series (no listener, no topic) are left out.
        assert!(!text.contains("connection_received"), "{text}");
        let text = encode(&[], false);
        assert!(text.contains("shmlink_up 0\n"), "{text}");
    }
}
