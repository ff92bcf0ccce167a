//! A hostile publisher announcing absurd topic geometries: sizes that overflow, slot
//! areas beyond any limit, header lengths that lie, memfds whose size disagrees with the
//! announcement. The subscriber must refuse each with `ProtocolViolation` before it maps
//! or reads anything — in debug builds (overflow checks on) and in release builds
//! (`scripts/test.sh` runs this file both ways), where wrapping arithmetic used to make
//! the subscriber read past its mapping.

mod common;

use std::time::Duration;

use common::fresh_addr;
use shmlink::{ErrorKind, PubSubOptions, Subscriber};
use shmlink_testkit::{fake_listener, FakeTopic};

/// Subscribes to a fake publisher that answers with `topic` (and hangs up again).
fn subscribe_to(topic: FakeTopic) -> shmlink::Result<()> {
    let addr = fresh_addr("shm");
    let fake = fake_listener(&addr, move |_request| topic.answer()).unwrap();
    let opts = PubSubOptions::default()
        .options(shmlink::Options::default().connect_timeout(Duration::from_secs(2)));
    // Dropping the subscriber hangs up, which ends the fake.
    let got = Subscriber::connect(&addr, &opts).map(drop);
    fake.join().unwrap();
    got
}

fn refused(what: &str, topic: FakeTopic) {
    match subscribe_to(topic) {
        Ok(_) => panic!("{what}: the subscriber accepted {topic:?}"),
        Err(e) => assert_eq!(
            e.kind(),
            ErrorKind::ProtocolViolation,
            "{what}: {topic:?} gave {e}"
        ),
    }
}

#[test]
fn an_honest_fake_topic_is_accepted() {
    // The fake itself is right: with every number agreeing, subscribing works, so the
    // refusals below come from the lies and nothing else.
    subscribe_to(FakeTopic::honest(4, 64)).unwrap();
}

#[test]
fn absurd_geometries_are_protocol_violations() {
    let page = FakeTopic::honest(2, 64).announced[3];
    let lie = |slots: u64, slot_size: u64, max_msg: u64, file_size: usize| {
        let numbers = [slots, slot_size, max_msg, page];
        FakeTopic {
            announced: numbers,
            in_header: numbers,
            file_size,
        }
    };
    let cases = [
        // slots × slot size + header wraps to one page.
        ("wrapping slot size", lie(1, u64::MAX - 7, 100, 4096)),
        // slot(1) would be an offset beyond isize::MAX.
        ("half-address-space slots", lie(2, (1 << 63) - 8, 100, 4096)),
        // No overflow, just far more than any topic may be.
        ("huge slots, many", lie(1 << 20, 1 << 40, 100, 4096)),
        ("more slots than allowed", lie(1 << 40, 64, 48, 4096)),
        ("slot smaller than its header", lie(2, 8, 0, 4096 + 16)),
        ("message larger than its slot", lie(2, 64, 64, 4096 + 128)),
        ("slot count not a power of two", lie(3, 64, 48, 4096 + 192)),
    ];
    for (what, topic) in cases {
        refused(what, topic);
    }
}

#[test]
fn header_lengths_and_file_sizes_that_disagree_are_protocol_violations() {
    let honest = FakeTopic::honest(4, 64);
    let mut header_lies = honest;
    header_lies.announced[3] *= 2; // the answer says two header pages
    refused("header length in the answer", header_lies);

    let mut header_disagrees = honest;
    header_disagrees.in_header[3] = 0; // the segment's own header says another
    refused("header length in the segment", header_disagrees);

    let mut geometry_disagrees = honest;
    geometry_disagrees.in_header[1] = 128; // slot size in the segment ≠ the answer's
    refused("slot size in the segment", geometry_disagrees);

    let mut small = honest;
    small.file_size -= 64; // the last slot is missing from the file
    refused("file smaller than announced", small);

    let mut large = honest;
    large.file_size += 4096; // more than announced: the two sides do not agree
    refused("file larger than announced", large);
}
