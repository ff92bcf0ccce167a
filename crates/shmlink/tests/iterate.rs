//! The iterators of the public API: `Subscriber::iter` (messages until the end of the
//! stream; lag reported in between) and `Listener::incoming`.

mod common;

use std::time::Duration;

use shmlink::{
    Connection, ErrorKind, Listener, Options, Policy, PubSubOptions, Publisher, Subscriber,
    Transport,
};

/// A topic on `addr` with one subscriber, `count` messages published (message `i` is
/// `i` as 4 bytes), the publisher closed; returns the subscriber.
fn published(addr: &str, opts: &PubSubOptions, count: u32) -> Subscriber {
    let mut publisher = Publisher::bind(addr, opts).unwrap();
    let sub = Subscriber::connect(&publisher.local_addr(), opts).unwrap();
    publisher
        .wait_for_subscribers(1, Duration::from_secs(30))
        .unwrap();
    for i in 0..count {
        publisher.publish(&i.to_le_bytes()).unwrap();
    }
    publisher.close().unwrap();
    sub
}

/// Every message in order, then the end of the stream ends the iteration (it is not an
/// error item); a new iteration ends at once.
#[test]
fn subscriber_iterates_until_end_of_stream() {
    for (addr, transport) in [
        (
            format!("shm:{}/iter.sock", common::test_dir().display()),
            Transport::Shm,
        ),
        ("tcp:127.0.0.1:0".to_string(), Transport::Tcp),
    ] {
        let opts = PubSubOptions::default().slots(256);
        let mut sub = published(&addr, &opts, 200);
        assert_eq!(sub.transport(), transport);
        let mut next = 0u32;
        for msg in &mut sub {
            assert_eq!(msg.unwrap(), next.to_le_bytes(), "{addr}");
            next += 1;
        }
        assert_eq!(next, 200, "{addr}: every message");
        assert!(sub.iter().next().is_none(), "{addr}: ended");
    }
}

/// Under `Overwrite`, messages lost to a slow subscriber come as one `Lagged` item with
/// the count, and the iteration goes on with what the ring still holds.
#[test]
fn lag_is_an_item_and_the_iteration_goes_on() {
    let addr = format!("shm:{}/lag.sock", common::test_dir().display());
    let opts = PubSubOptions::default().slots(8).policy(Policy::Overwrite);
    let mut sub = published(&addr, &opts, 100);
    let (mut received, mut missed, mut last) = (0u64, 0u64, None);
    for item in sub.iter() {
        match item {
            Ok(msg) => {
                let seq = u32::from_le_bytes(msg[..4].try_into().unwrap());
                assert!(last.map_or(true, |l| seq > l), "in order");
                last = Some(seq);
                received += 1;
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Lagged, "{e}");
                missed += e.missed().unwrap();
            }
        }
    }
    assert!(missed > 0, "a ring of 8 cannot hold 100 messages");
    assert_eq!(
        received + missed,
        100,
        "each message received or counted lost"
    );
    assert_eq!(last, Some(99), "the newest message arrives");
}

/// `incoming` yields one connection per client, like `accept`.
#[test]
fn incoming_yields_each_client() {
    let mut listener = Listener::bind("tcp:127.0.0.1:0", &Options::default()).unwrap();
    let addr = listener.local_addr();
    let clients = std::thread::spawn(move || {
        (0..3u8)
            .map(|i| {
                let mut c = Connection::connect(&addr, &Options::default()).unwrap();
                c.send(&[i]).unwrap();
                c
            })
            .collect::<Vec<_>>()
    });
    let mut seen: Vec<u8> = listener
        .incoming()
        .take(3)
        .map(|c| c.unwrap().recv_vec().unwrap()[0])
        .collect();
    seen.sort();
    assert_eq!(seen, [0, 1, 2]);
    drop(clients.join().unwrap());
}
