//! `ImportingSubscriber` in one process, over loopback (no namespaces, no root): a Zenoh
//! publisher with the bridge's attachments on one session, the importing subscriber on
//! another. Its handler gets every message in order; a local subscriber of the topic
//! gets the same messages from the next one on; gaps in an origin's sequence are counted
//! (saturating, whatever the sequence numbers say) and messages over the topic's maximum
//! are counted, not handed over; the topic has one importer per host; closing ends the
//! local subscribers' stream.

mod loopback;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use loopback::{msg, number, pair};
use shmlink::{ErrorKind, Policy, PubSubOptions, Subscriber};
use shmlink_zenoh::header::Header;
use shmlink_zenoh::{ImportingSubscriber, DEFAULT_PREFIX};
use zenoh::Wait;

/// A remote publisher putting messages with a bridge's attachment, its sequence numbers
/// chosen by the test.
struct Remote {
    publisher: zenoh::pubsub::Publisher<'static>,
    head: Header,
}

impl Remote {
    fn put(&mut self, seq: u64, m: Vec<u8>) {
        self.head.seq = seq;
        self.publisher
            .put(m)
            .attachment(self.head.encode())
            .wait()
            .unwrap();
    }
}

#[test]
fn handler_and_local_subscribers_get_the_same_ordered_stream() {
    let (dir, a, b) = pair("importing");
    let mut remote = Remote {
        publisher: a
            .declare_publisher(format!("{DEFAULT_PREFIX}imp"))
            .wait()
            .unwrap(),
        head: Header {
            origin: 7,
            seq: 0,
            policy: Policy::Block,
            max_msg: 256,
            slots: 64,
        },
    };

    let (tx, handled) = mpsc::channel();
    let opts = PubSubOptions::default().max_msg_size(256).slots(64);
    let s = ImportingSubscriber::new(&b, "imp", &opts, DEFAULT_PREFIX, move |m: &[u8]| {
        let _ = tx.send(m.to_vec());
    })
    .unwrap();
    let next = || number(&handled.recv_timeout(Duration::from_secs(10)).unwrap());
    // Until Zenoh's routes are up, puts go nowhere: send until one arrives.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    let first = loop {
        remote.put(n, msg(n, 64));
        n += 1;
        if let Ok(m) = handled.recv_timeout(Duration::from_millis(50)) {
            break number(&m);
        }
        assert!(Instant::now() < deadline, "Zenoh never delivered");
    };
    for want in first + 1..n {
        assert_eq!(next(), want);
    }
    // The messages before the first delivered went nowhere: counted as lost only if
    // the subscriber saw their origin before, which it had not.
    assert_eq!(s.stats().dropped, 0);
    let handled_before = s.stats().messages;
    assert_eq!(handled_before, n - first);

    // A second importer of the same topic on this host is refused.
    let again = ImportingSubscriber::new(&b, "imp", &opts, DEFAULT_PREFIX, |_: &[u8]| {});
    assert!(again.is_err(), "one importer per topic per host");

    // A local subscriber joins: from then on it gets what the handler gets, in order.
    let mut sub = Subscriber::connect("shm:imp", &PubSubOptions::default()).unwrap();
    let joined = n;
    for len in [64, 200, 256, 8] {
        remote.put(n, msg(n, len));
        assert_eq!(next(), n);
        n += 1;
    }
    let mut buf = [0u8; 256];
    for want in joined..n {
        let len = sub.recv(&mut buf).unwrap();
        assert_eq!(number(&buf[..len]), want);
    }

    // A gap of 5 in the origin's sequence is counted; a message over the topic's
    // maximum is refused and counted, and neither the handler nor the subscriber sees it.
    n += 5;
    remote.put(n, msg(n, 64));
    assert_eq!(next(), n);
    n += 1;
    remote.put(n, msg(n, 257));
    n += 1;
    remote.put(n, msg(n, 64));
    assert_eq!(next(), n, "the oversized message was not handed over");
    let len = sub.recv(&mut buf).unwrap();
    assert_eq!(number(&buf[..len]), n - 2);
    let len = sub.recv(&mut buf).unwrap();
    assert_eq!(number(&buf[..len]), n);
    let stats = s.stats();
    assert_eq!(stats.dropped, 5 + 1);
    assert_eq!(stats.messages, handled_before + 4 + 2);
    assert_eq!(stats.key, format!("{DEFAULT_PREFIX}imp"));

    // A second origin whose sequence number jumps to the end: the lost count saturates
    // instead of overflowing, and the messages are still handed over.
    remote.head.origin = 8;
    for seq in [0, u64::MAX] {
        n += 1;
        remote.put(seq, msg(n, 64));
        assert_eq!(next(), n);
        let len = sub.recv(&mut buf).unwrap();
        assert_eq!(number(&buf[..len]), n);
    }
    assert_eq!(s.stats().dropped, u64::MAX);

    // Closing ends the local subscribers' stream.
    s.close().unwrap();
    let end = sub.recv(&mut buf).unwrap_err();
    assert!(end.kind() == ErrorKind::EndOfStream, "{end}");
    let _ = std::fs::remove_dir_all(&dir);
}
