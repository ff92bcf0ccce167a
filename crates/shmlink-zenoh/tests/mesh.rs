//! Three "hosts" (network namespaces) joined in a triangle (a veth pair between each
//! two), a bridge on each that exports and imports every topic matching `t*` (peer mode,
//! explicit endpoints):
//!
//! - **exactly once, no loops**: `ta` published on A reaches subscribers on B and C,
//!   `tc` published on C reaches B and A, every message once and in order, and no bridge
//!   exports a topic it imported (B, which publishes nothing of its own, exports nothing);
//! - **two publishers on two hosts, one subscriber, a wildcard**: `tw` is published on A
//!   and on C; B's bridge, importing `t*`, publishes both streams into its local `tw`,
//!   whose subscriber gets both, each in order;
//! - **allow-list**: `secret`, published on A, is not on the list and never leaves A;
//! - **a line** A — B — C through B's bridge in router mode (A and C in client mode):
//!   every message once on each other host.

mod support;

use std::time::Duration;

use support::hosts::{bridge_exe, unavailable, Net, Proc};
use support::msg::ORIGIN_STEP;
use support::roles::publish_round;

const COUNT: u64 = 1000;

/// A peer process of these tests (`SHZ_ROLE` set); in a plain run, checks the codec.
#[test]
fn peer() {
    if !support::roles::run_role() {
        support::msg::self_check();
    }
}

fn env(topic: &str, extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut v = vec![
        ("SHZ_TOPIC", topic.to_owned()),
        ("SHZ_COUNT", COUNT.to_string()),
        ("SHZ_POLICY", "block".to_owned()),
        ("SHZ_SIZES", "small".to_owned()),
        ("SHZ_LINGER_MS", "1500".to_owned()),
    ];
    v.extend_from_slice(extra);
    v
}

/// Three hosts with links A–B and B–C: the net and the addresses of A and B on the first
/// and of B on the second; `None` (the test skipped) where namespaces cannot be made.
fn three_hosts() -> Option<(Net, String, String, String)> {
    if let Some((category, why)) = unavailable() {
        shmlink_testkit::skip(category, why);
        return None;
    }
    let net = Net::new(3);
    let (a_ab, b_ab) = net.link(0, 1, 0);
    let (b_bc, _c_bc) = net.link(1, 2, 1);
    Some((net, a_ab, b_ab, b_bc))
}

/// `--listen` or `--connect` with the Zenoh TCP endpoint at `ip`.
fn endpoint(flag: &str, ip: &str) -> [String; 2] {
    [flag.to_owned(), format!("tcp/{ip}:7447")]
}

/// Starts a bridge exporting and importing `t*` on each host given, with that host's
/// extra arguments, and waits until each is ready.
fn start_bridges(net: &Net, bridges: Vec<(usize, &str, Vec<String>)>) -> Vec<Proc> {
    let exe = bridge_exe();
    let common = [
        "--export",
        "t*",
        "--import",
        "t*",
        "--stall-timeout",
        "10000",
    ];
    bridges
        .into_iter()
        .map(|(h, name, extra)| {
            let mut args: Vec<&str> = common.to_vec();
            args.extend(extra.iter().map(String::as_str));
            let mut b = net.spawn(h, name, &exe, &args, &[]);
            b.expect("ready", Duration::from_secs(20));
            b
        })
        .collect()
}

/// Stops the bridges and returns each one's `stats` lines.
fn stop_bridges(bridges: &mut [Proc]) -> Vec<Vec<String>> {
    bridges
        .iter_mut()
        .map(|b| {
            b.stop(Duration::from_secs(10))
                .into_iter()
                .filter(|l| l.starts_with("stats "))
                .collect()
        })
        .collect()
}

#[test]
fn triangle_exactly_once_wildcards_and_allow_list() {
    let Some((net, a_ab, b_ab, b_bc)) = three_hosts() else {
        return;
    };
    let (a_ac, _c_ac) = net.link(0, 2, 2);
    // Publishers first: a bridge importing `tw` must not take the name on A or C.
    let mut pubs: Vec<Proc> = vec![
        net.role(0, "pub-ta", "pub", &env("ta", &[("SHZ_SUBS", "1".into())])),
        net.role(
            0,
            "pub-tw-a",
            "pub",
            &env("tw", &[("SHZ_SUBS", "1".into())]),
        ),
        net.role(
            0,
            "pub-secret",
            "pub",
            &env("secret", &[("SHZ_SUBS", "0".into())]),
        ),
        net.role(2, "pub-tc", "pub", &env("tc", &[("SHZ_SUBS", "1".into())])),
        net.role(
            2,
            "pub-tw-c",
            "pub",
            &env(
                "tw",
                &[
                    ("SHZ_SUBS", "1".into()),
                    ("SHZ_SEQ_BASE", ORIGIN_STEP.to_string()),
                ],
            ),
        ),
    ];
    let mut bridges = start_bridges(
        &net,
        vec![
            (
                0,
                "bridge-a",
                [endpoint("--listen", &a_ab), endpoint("--listen", &a_ac)].concat(),
            ),
            (
                1,
                "bridge-b",
                [
                    endpoint("--listen", &b_ab),
                    endpoint("--listen", &b_bc),
                    endpoint("--connect", &a_ab),
                ]
                .concat(),
            ),
            (
                2,
                "bridge-c",
                [endpoint("--connect", &a_ac), endpoint("--connect", &b_bc)].concat(),
            ),
        ],
    );
    for p in &mut pubs {
        p.expect("bound", Duration::from_secs(40));
    }
    let two = [
        ("SHZ_EXPECT", (2 * COUNT).to_string()),
        ("SHZ_ORIGINS", "2".into()),
    ];
    let mut subs: Vec<Proc> = vec![
        net.role(1, "sub-b-ta", "sub", &env("ta", &[])),
        net.role(1, "sub-b-tc", "sub", &env("tc", &[])),
        net.role(1, "sub-b-tw", "sub", &env("tw", &two)),
        net.role(0, "sub-a-tc", "sub", &env("tc", &[])),
        net.role(2, "sub-c-ta", "sub", &env("ta", &[])),
    ];
    publish_round(&mut pubs, &mut subs, |name| {
        if name.starts_with("sub-b-tw") {
            2 * COUNT
        } else {
            COUNT
        }
    });
    let stats = stop_bridges(&mut bridges);
    let outs = |i: usize| -> Vec<String> {
        let mut v: Vec<String> = stats[i]
            .iter()
            .filter(|l| l.split_whitespace().nth(2) == Some("out"))
            .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
            .collect();
        v.sort();
        v
    };
    // Each host exports only what is published there, never what it imported.
    assert_eq!(outs(0), ["ta", "tw"], "{:?}", stats[0]);
    assert!(outs(1).is_empty(), "{:?}", stats[1]);
    assert_eq!(outs(2), ["tc", "tw"], "{:?}", stats[2]);
    // `secret` never left A: no bridge saw it, no socket of that name on B or C.
    for (i, s) in stats.iter().enumerate() {
        assert!(!s.iter().any(|l| l.contains("secret")), "bridge {i}: {s:?}");
    }
    for h in &net.hosts[1..] {
        let names: Vec<String> = std::fs::read_dir(&h.dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.iter().any(|n| n.contains("secret")),
            "{}: {names:?}",
            h.ns
        );
    }
    eprintln!("triangle: {:?} | {:?} | {:?}", stats[0], stats[1], stats[2]);
}

/// A line of three hosts, A — B — C, with no link between A and C: B's bridge runs in
/// router mode, A's and C's in client mode, and B routes between them. (With A and C in
/// peer mode and scouting off, nothing crosses B: Zenoh assumes peers reach each other
/// directly.) Every message once on each other host, nothing re-exported.
#[test]
fn line_through_a_router_bridge_exactly_once() {
    let Some((net, _, b_ab, b_bc)) = three_hosts() else {
        return;
    };
    let mut pubs: Vec<Proc> = vec![
        net.role(0, "pub-ta", "pub", &env("ta", &[("SHZ_SUBS", "1".into())])),
        net.role(2, "pub-tc", "pub", &env("tc", &[("SHZ_SUBS", "1".into())])),
    ];
    let mode = |m: &str| ["--mode".to_owned(), m.to_owned()];
    let mut bridges = start_bridges(
        &net,
        vec![
            (
                1,
                "bridge-b",
                [
                    mode("router"),
                    endpoint("--listen", &b_ab),
                    endpoint("--listen", &b_bc),
                ]
                .concat(),
            ),
            (
                0,
                "bridge-a",
                [mode("client"), endpoint("--connect", &b_ab)].concat(),
            ),
            (
                2,
                "bridge-c",
                [mode("client"), endpoint("--connect", &b_bc)].concat(),
            ),
        ],
    );
    for p in &mut pubs {
        p.expect("bound", Duration::from_secs(40));
    }
    let mut subs: Vec<Proc> = vec![
        net.role(1, "sub-b-ta", "sub", &env("ta", &[])),
        net.role(2, "sub-c-ta", "sub", &env("ta", &[])),
        net.role(0, "sub-a-tc", "sub", &env("tc", &[])),
        net.role(1, "sub-b-tc", "sub", &env("tc", &[])),
    ];
    publish_round(&mut pubs, &mut subs, |_| COUNT);
    let outs: Vec<Vec<String>> = bridges
        .iter_mut()
        .map(|b| {
            b.stop(Duration::from_secs(10))
                .into_iter()
                .filter(|l| l.starts_with("stats ") && l.split_whitespace().nth(2) == Some("out"))
                .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
                .collect()
        })
        .collect();
    // Bridges in the order started: B, A, C.
    assert!(
        outs[0].is_empty(),
        "B exported what it imported: {:?}",
        outs[0]
    );
    assert_eq!(outs[1], ["ta"]);
    assert_eq!(outs[2], ["tc"]);
}

/// A publisher that exports its own topic (`ExportingPublisher`, its Zenoh session
/// connected to B's bridge) on a host whose bridge exports `t*` too: A's bridge leaves the
/// topic alone (it is marked exported), so each message reaches a subscriber on A and one
/// on B exactly once and in order, and `inspect` shows the mark and the publisher's
/// status file.
#[test]
fn exporting_publisher_once_per_host() {
    let Some((net, a_ab, b_ab, _)) = three_hosts() else {
        return;
    };
    let mut pubs = vec![net.role(
        0,
        "pub-te",
        "pub",
        &env(
            "te",
            &[
                ("SHZ_SUBS", "1".into()),
                ("SHZ_ZENOH_CONNECT", format!("tcp/{b_ab}:7447")),
            ],
        ),
    )];
    let mut bridges = start_bridges(
        &net,
        vec![
            (0, "bridge-a", endpoint("--listen", &a_ab).to_vec()),
            (
                1,
                "bridge-b",
                [endpoint("--listen", &b_ab), endpoint("--connect", &a_ab)].concat(),
            ),
        ],
    );
    let mut subs: Vec<Proc> = vec![net.role(0, "sub-a-te", "sub", &env("te", &[]))];
    pubs[0].expect("bound", Duration::from_secs(40));
    subs.push(net.role(1, "sub-b-te", "sub", &env("te", &[])));
    let dir = &net.hosts[0].dir;
    let topics = shmlink::inspect(dir, Duration::from_secs(2)).unwrap();
    let te = topics
        .iter()
        .find_map(|r| match &r.state {
            shmlink::inspect::SocketState::Topic(t) if t.address == "shm:te" => Some(t),
            _ => None,
        })
        .expect("topic te on A");
    assert!(te.exported, "{te:?}");
    let files = shmlink::inspect::bridges(dir).unwrap();
    assert!(
        files.iter().any(|f| f
            .topics
            .iter()
            .any(|t| t.export && t.topic == "te" && t.key == "shmlink/te")),
        "{files:?}"
    );
    publish_round(&mut pubs, &mut subs, |_| COUNT);
    let stats = stop_bridges(&mut bridges);
    assert!(
        !stats[0].iter().any(|l| l.starts_with("stats te ")),
        "A's bridge touched te: {:?}",
        stats[0]
    );
    assert!(
        stats[1].iter().any(|l| l.starts_with("stats te in ")),
        "{:?}",
        stats[1]
    );
}
