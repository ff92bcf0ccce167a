//! The `tracing` feature: a listener reports the clients it refuses, with the reason
//! (nothing else on the listener's side shows them: `accept` skips them), the
//! connections it accepts, a subscriber's lag and a peer's death. A minimal subscriber of
//! our own records the events.

mod common;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex, Once};
use std::thread;

use shmlink::{Connection, Listener, Options};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata};

/// One event: its level, target and fields (`message` among them), as text.
#[derive(Debug, Clone)]
struct Seen {
    level: Level,
    target: String,
    fields: BTreeMap<String, String>,
}

impl Seen {
    fn field(&self, name: &str) -> &str {
        self.fields.get(name).map_or("", |s| s.as_str())
    }
}

/// The events one test collects (from its own thread only: see [`Router`]).
#[derive(Clone, Default)]
struct Collector {
    seen: Arc<Mutex<Vec<Seen>>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

thread_local! {
    /// The collector of the test running on this thread, while it collects.
    static CURRENT: RefCell<Option<Collector>> = const { RefCell::new(None) };
}

/// The process's one subscriber: hands each event to the collector of the thread that
/// emitted it. (Scoped per-thread subscribers would race with the tests running in
/// parallel: `tracing` caches a call site's interest when it is first hit, and one hit
/// while no subscriber exists anywhere would silence that site for good.) Knows no
/// spans.
struct Router;

impl tracing::Subscriber for Router {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        CURRENT.with(|c| {
            if let Some(collector) = &*c.borrow() {
                let mut fields = BTreeMap::new();
                event.record(&mut Fields(&mut fields));
                collector.seen.lock().unwrap().push(Seen {
                    level: *event.metadata().level(),
                    target: event.metadata().target().to_string(),
                    fields,
                });
            }
        });
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

impl Collector {
    /// A collector, with the [`Router`] installed as the process's subscriber.
    fn new() -> Collector {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| tracing::subscriber::set_global_default(Router).unwrap());
        Collector::default()
    }

    fn events(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Runs `body`, collecting the events this thread emits meanwhile into `collector`.
fn collecting<T>(collector: &Collector, body: impl FnOnce() -> T) -> T {
    CURRENT.with(|c| *c.borrow_mut() = Some(collector.clone()));
    let out = body();
    CURRENT.with(|c| *c.borrow_mut() = None);
    out
}

/// Checks that the events hold one refusal (with `reason` containing `why`) followed by
/// one accept.
fn check_refusal_then_accept(events: &[Seen], why: &str) {
    let refused: Vec<_> = events
        .iter()
        .filter(|e| e.field("message") == "client refused")
        .collect();
    assert_eq!(refused.len(), 1, "one refusal expected: {events:#?}");
    let r = refused[0];
    assert_eq!(r.level, Level::WARN);
    assert_eq!(r.target, "shmlink");
    assert!(
        r.field("reason").contains(why),
        "the refusal's reason should say {why:?}: {r:#?}"
    );
    assert!(!r.field("listener").is_empty(), "{r:#?}");
    let accepted: Vec<_> = events
        .iter()
        .filter(|e| e.field("message") == "accepted")
        .collect();
    assert_eq!(accepted.len(), 1, "one accept expected: {events:#?}");
    assert_eq!(accepted[0].level, Level::INFO);
}

/// `shm:`: a client whose hello is garbage is refused; the event carries the reason the
/// client is told.
#[test]
fn shm_refusal_is_an_event_with_the_reason() {
    let addr = common::fresh_addr("shm");
    let collector = Collector::new();
    let mut listener = Listener::bind(&addr, &Options::default()).unwrap();
    let client_addr = addr.clone();
    let clients = thread::spawn(move || {
        let (answer, _) = shmlink_testkit::raw_handshake(&client_addr, b"not a hello").unwrap();
        let conn = Connection::connect(&client_addr, &Options::default()).unwrap();
        (answer, conn)
    });
    let conn = collecting(&collector, || listener.accept().unwrap());
    let (answer, _client) = clients.join().unwrap();
    drop(conn);
    let events = collector.events();
    check_refusal_then_accept(&events, "bad magic");
    // The listener's log says what the client was told.
    let r = events
        .iter()
        .find(|e| e.field("message") == "client refused")
        .unwrap();
    let told = String::from_utf8_lossy(&answer);
    assert!(
        told.contains(r.field("reason")),
        "client told {told:?}; {r:#?}"
    );
}

/// `tcp:`: a client whose first bytes are not a hello is refused; the event names the
/// listener, the client and the reason.
#[test]
fn tcp_refusal_is_an_event_with_the_reason() {
    let collector = Collector::new();
    let mut listener = Listener::bind("tcp:127.0.0.1:0", &Options::default()).unwrap();
    let addr = listener.local_addr();
    let client_addr = addr.clone();
    let clients = thread::spawn(move || {
        let port = client_addr.rsplit(':').next().unwrap();
        let mut raw = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).unwrap();
        raw.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        // The listener drops us: read until it closes.
        let mut rest = Vec::new();
        let _ = raw.read_to_end(&mut rest);
        Connection::connect(&client_addr, &Options::default()).unwrap()
    });
    let conn = collecting(&collector, || listener.accept().unwrap());
    let _client = clients.join().unwrap();
    drop(conn);
    let events = collector.events();
    check_refusal_then_accept(&events, "hello");
    let r = events
        .iter()
        .find(|e| e.field("message") == "client refused")
        .unwrap();
    assert!(r.field("peer").contains("127.0.0.1"), "{r:#?}");
}

/// A subscriber that the publisher overwrote reports its lag, with the count lost.
#[test]
fn lag_is_an_event_with_the_count() {
    use shmlink::{Policy, PubSubOptions, Publisher, Subscriber};
    let collector = Collector::new();
    let addr = format!("shm:{}/lag-event.sock", common::test_dir().display());
    let opts = PubSubOptions::default().slots(8).policy(Policy::Overwrite);
    let mut publisher = Publisher::bind(&addr, &opts).unwrap();
    let mut sub = Subscriber::connect(&addr, &opts).unwrap();
    publisher
        .wait_for_subscribers(1, std::time::Duration::from_secs(30))
        .unwrap();
    for i in 0..100u32 {
        publisher.publish(&i.to_le_bytes()).unwrap();
    }
    let e = collecting(&collector, || sub.recv_vec().unwrap_err());
    assert_eq!(e.kind(), shmlink::ErrorKind::Lagged, "{e}");
    let events = collector.events();
    let lagged: Vec<_> = events
        .iter()
        .filter(|e| e.field("message").starts_with("subscriber lagged"))
        .collect();
    assert_eq!(lagged.len(), 1, "{events:#?}");
    assert_eq!(
        lagged[0].field("missed"),
        e.missed().unwrap().to_string(),
        "{events:#?}"
    );
}

/// A peer that goes away without closing (`shm:`: its socket closes with no end mark, as
/// when a process dies) is reported once, when the reset surfaces. (A dropped
/// `Connection` closes gracefully: what it queued is delivered, then the end of stream.)
#[test]
fn peer_reset_is_one_event() {
    let collector = Collector::new();
    let (mut listener, addr) = common::bind("shm", &Options::default().ring_size(4096));
    let peer = thread::spawn(move || shmlink_testkit::HostilePeer::connect(&addr, 4096).unwrap());
    let mut server = listener.accept().unwrap();
    drop(peer.join().unwrap());
    collecting(&collector, || {
        for _ in 0..2 {
            let e = server.recv_vec().unwrap_err();
            assert_eq!(e.kind(), shmlink::ErrorKind::ConnectionReset, "{e}");
        }
    });
    let events = collector.events();
    let resets: Vec<_> = events
        .iter()
        .filter(|e| e.field("message").starts_with("peer died"))
        .collect();
    assert_eq!(resets.len(), 1, "reported once: {events:#?}");
    assert!(!resets[0].field("peer").is_empty(), "{events:#?}");
}
