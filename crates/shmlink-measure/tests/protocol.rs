//! The drivers and the peer over real shmlink connections (`ux:` sockets in the temporary
//! directory, both ends in this process): exact counts, messages shorter than a control
//! tag, and a failing peer's reason reaching the driver. Timings are never asserted.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;

use shmlink::{Connection, Listener, Options};
use shmlink_measure::link::{Access, ShmlinkEndpoint};
use shmlink_measure::protocol::{self, Fault, Measured, PeerReport, Plan, Stop, Warmup};
use shmlink_measure::verify::Sampling;
use shmlink_measure::Mode;

/// A connected pair: the driver's end and the peer's thread, which serves `plan`'s run
/// (with `peer_fault`) and returns its report.
fn pair(
    plan: &Plan,
    access: Access,
    peer_fault: Option<Fault>,
) -> (ShmlinkEndpoint, JoinHandle<io::Result<PeerReport>>) {
    static N: AtomicU32 = AtomicU32::new(0);
    let path = std::env::temp_dir().join(format!(
        "shmlink-measure-test-{}-{}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let addr = format!("ux:{}", path.display());
    let opts = Options::default().max_msg_size(plan.size.max(64));
    let mut listener = Listener::bind(&addr, &opts).unwrap();
    let (size, mode, window, sampling) = (plan.size, plan.mode, plan.window, plan.sampling);
    let peer = std::thread::spawn(move || {
        let conn = Connection::connect(&addr, &opts).unwrap();
        let mut ep = ShmlinkEndpoint::new(conn, access);
        protocol::serve(&mut ep, size, mode, window, (sampling, 7), peer_fault)
    });
    let conn = listener.accept().unwrap();
    drop(listener);
    let _ = std::fs::remove_file(&path);
    (ShmlinkEndpoint::new(conn, access), peer)
}

fn plan(size: usize, mode: Mode, window: u64, warmup: u64, count: u64) -> Plan {
    Plan {
        size,
        mode,
        window,
        warmup: Warmup::Count(warmup),
        stop: Stop::Count(count),
        sampling: Sampling::ALL,
        seed: 7,
        fault: None,
    }
}

fn run(plan: &Plan, access: Access) -> (Measured, PeerReport) {
    let (mut ep, peer) = pair(plan, access, None);
    let m = protocol::drive(&mut ep, plan).unwrap();
    let report = peer.join().unwrap().unwrap();
    (m, report)
}

#[test]
fn counts_are_exact_even_off_the_ack_interval() {
    // Window 64 acknowledges every 32 messages: 1000 and 77 are not multiples of it.
    for access in [Access::Copy, Access::InPlace] {
        let (m, report) = run(&plan(64, Mode::Throughput, 64, 77, 1000), access);
        assert_eq!((m.count, report.msgs), (1000, 1000), "{access:?}");
        assert!(m.rtts.is_none());
        let (m, report) = run(&plan(64, Mode::Latency, 1, 3, 50), access);
        assert_eq!((m.count, report.msgs), (50, 50), "{access:?}");
        assert_eq!(m.rtts.unwrap().len(), 50, "every round trip timed");
    }
}

#[test]
fn no_warm_up_at_all() {
    let (m, report) = run(&plan(64, Mode::Throughput, 5, 0, 13), Access::InPlace);
    assert_eq!((m.count, report.msgs), (13, 13));
    let (m, _) = run(&plan(64, Mode::Latency, 1, 0, 5), Access::InPlace);
    assert_eq!(m.count, 5);
}

#[test]
fn messages_shorter_than_a_tag_run_in_place() {
    for size in [0, 1, 7] {
        for mode in [Mode::Latency, Mode::Throughput] {
            let window = if mode == Mode::Latency { 1 } else { 4 };
            let (m, report) = run(&plan(size, mode, window, 5, 21), Access::InPlace);
            assert_eq!((m.count, report.msgs), (21, 21), "{size} bytes, {mode:?}");
        }
    }
}

#[test]
fn a_failing_peer_tells_the_driver_why() {
    // The driver damages message #40's body in throughput mode; the peer's check fails,
    // and its reason arrives where the driver waits for an ack.
    let mut p = plan(256, Mode::Throughput, 8, 10, 100);
    p.fault = Some(Fault::Scribble(40));
    for access in [Access::Copy, Access::InPlace] {
        let (mut ep, peer) = pair(&p, access, None);
        let e = protocol::drive(&mut ep, &p).unwrap_err().to_string();
        let peer_err = peer.join().unwrap().unwrap_err().to_string();
        assert!(peer_err.contains("message #40"), "{peer_err}");
        assert!(
            e.contains("peer failed: ") && e.contains("message #40"),
            "{access:?}: {e}"
        );
    }
}

/// Copying drivers check each answer one round trip late (while the peer works on the
/// next message): a corrupt answer is still caught, the last of the warm-up (#1) and
/// the last of the run (#11) included.
#[test]
fn a_corrupt_answer_fails_the_driver() {
    let p = plan(64, Mode::Latency, 1, 2, 10);
    for access in [Access::InPlace, Access::Copy] {
        for n in [1, 4, 11] {
            let (mut ep, peer) = pair(&p, access, Some(Fault::Corrupt(n)));
            let e = protocol::drive(&mut ep, &p).unwrap_err().to_string();
            assert!(
                e.contains(&format!("message #{n} (64 bytes) failed verification")),
                "{access:?}, #{n}: {e}"
            );
            drop(ep);
            assert!(peer.join().unwrap().is_err(), "the peer sees the driver go");
        }
    }
}
