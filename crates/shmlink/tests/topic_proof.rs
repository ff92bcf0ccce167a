//! Pub/sub over the network keeps its identity checks on the shared-memory path (issue 13,
//! M3): an `auto:` subscriber on the publisher's kernel attaches to the topic's socket only
//! with the single-use token the publisher handed it over TCP/TLS, and only if the socket
//! answers with the matching proof (otherwise it stays on the network); the socket of an
//! `auto:` topic admits nobody without a token, and a `tcp:`/`tls:` topic binds no local
//! socket at all, so a local user the allow lists admit cannot skip the client
//! certificate.
//!
//! The other user is `nobody` (65534): this test binary re-runs itself under that uid (the
//! ignored test `child`), which needs root; without root the tests that have such a part
//! are skipped after the rest (`shmlink_testkit::skip`, a failure where `SHMLINK_REQUIRE`
//! names `root`).
//! Every test here uses one rendezvous directory (`SHMLINK_DIR`, mode 0755, set once
//! before any test goes on), so that `nobody` can reach the topic sockets and only the
//! token rule stands in its way.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

use shmlink::{ErrorKind, Options, Pem, PubSubOptions, Publisher, Subscriber, TlsOptions};
use shmlink_testkit::{fake_listener, raw_handshake, FakeTopic, TopicPacket, TopicSubscribe};

const NOBODY: u32 = 65534;
const ROLE: &str = "SHMLINK_PROOF_ROLE";
const ARG: &str = "SHMLINK_PROOF_ARG";
const CA: &str = "SHMLINK_PROOF_CA";
const WAIT: Duration = Duration::from_secs(10);

/// The rendezvous directory of this process and its children (set before any test uses
/// one).
fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if std::env::var_os(ROLE).is_some() {
            // A child: the parent's directory.
            return PathBuf::from(std::env::var_os("SHMLINK_DIR").unwrap());
        }
        let dir = std::env::temp_dir().join(format!("shmlink-proof-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::env::set_var("SHMLINK_DIR", &dir);
        dir
    })
}

/// Whether we are root; if not, the calling test is skipped (after what it checked as
/// ourselves: the other-uid part is what its name claims).
fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        shmlink_testkit::skip(
            "root",
            format!("needs root to run a subscriber as uid {NOBODY}"),
        );
    }
    root
}

/// The topic sockets of the publisher on `port` in the rendezvous directory.
fn topic_sockets(port: &str) -> Vec<PathBuf> {
    let prefix = format!("topic-{port}-");
    std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&prefix)
        })
        .collect()
}

fn port_of(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap()
}

/// A `Subscribe` or `Upgrade` request packet.
fn request(token: Option<[u8; 16]>) -> Vec<u8> {
    let req = TopicSubscribe {
        features: 0,
        history: 0,
        max_msg: 0,
    };
    match token {
        None => TopicPacket::Subscribe(req),
        Some(t) => TopicPacket::Upgrade(req, t),
    }
    .encode()
}

/// What the topic socket at `path` answers `packet` with: `admitted` or the refusal.
fn ask(path: &Path, packet: &[u8]) -> String {
    let (answer, _fds) = raw_handshake(&format!("shm:{}", path.display()), packet).unwrap();
    match TopicPacket::decode(&answer).unwrap() {
        TopicPacket::Refuse(code, why) => format!("refused {code:?}: {why}"),
        other => format!("admitted {other:?}"),
    }
}

/// Publishes `n` numbered messages once `subs` subscribers are in.
fn publish(p: &mut Publisher, subs: usize, n: u64) {
    p.wait_for_subscribers(subs, WAIT).unwrap();
    for i in 0..n {
        p.publish(&i.to_le_bytes()).unwrap();
    }
}

fn expect_numbers(sub: &mut Subscriber, n: u64) {
    for i in 0..n {
        assert_eq!(sub.recv_vec().unwrap(), i.to_le_bytes());
    }
}

#[test]
fn auto_subscriber_attaches_over_shm_with_its_token() {
    dir();
    let mut publisher =
        Publisher::bind("auto:127.0.0.1:0", &PubSubOptions::default().slots(64)).unwrap();
    let addr = publisher.local_addr();
    let mut sub = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap();
    assert_eq!(sub.transport(), shmlink::Transport::Shm);
    publish(&mut publisher, 1, 10);
    expect_numbers(&mut sub, 10);

    // Without a token the socket admits nobody, not even our own uid.
    let sockets = topic_sockets(port_of(&addr));
    assert_eq!(sockets.len(), 1, "{sockets:?}");
    let plain = ask(&sockets[0], &request(None));
    assert!(
        plain.starts_with("refused Permission") && plain.contains("token"),
        "{plain}"
    );
    let made_up = ask(&sockets[0], &request(Some([0x5a; 16])));
    assert!(made_up.contains("unknown or already used"), "{made_up}");
    let e = Subscriber::connect(
        &format!("shm:{}", sockets[0].display()),
        &PubSubOptions::default(),
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert_eq!(publisher.subscriber_count(), 1);
}

/// A socket at the topic's path that takes the token but answers with another proof (an
/// impostor, or another publisher's socket): the subscriber stays on TCP, and the token
/// it gave away is void at the real socket.
#[test]
fn a_wrong_proof_keeps_the_subscriber_on_the_network() {
    dir();
    let mut publisher =
        Publisher::bind("auto:127.0.0.1:0", &PubSubOptions::default().slots(64)).unwrap();
    let addr = publisher.local_addr();
    let sockets = topic_sockets(port_of(&addr));
    assert_eq!(sockets.len(), 1, "{sockets:?}");
    let real = sockets[0].with_extension("real");
    std::fs::rename(&sockets[0], &real).unwrap();
    let (tx, presented) = mpsc::channel();
    let impostor = fake_listener(&format!("shm:{}", sockets[0].display()), move |req| {
        let _ = tx.send(req.to_vec());
        let (honest, fds) = FakeTopic::honest(64, 128).answer();
        let TopicPacket::Subscribed(ok) = TopicPacket::decode(&honest).unwrap() else {
            unreachable!()
        };
        (TopicPacket::Upgraded(ok, [0xee; 16]).encode(), fds)
    })
    .unwrap();

    let mut sub = Subscriber::connect(&addr, &PubSubOptions::default()).unwrap();
    assert_eq!(sub.transport(), shmlink::Transport::Tcp);
    publish(&mut publisher, 1, 10);
    expect_numbers(&mut sub, 10);

    let req = presented.recv_timeout(WAIT).unwrap();
    let TopicPacket::Upgrade(_, token) = TopicPacket::decode(&req).unwrap() else {
        panic!("the subscriber sent {req:?}, not an upgrade");
    };
    // It asked again on TCP, which voided the token: the real socket refuses it.
    let stolen = ask(&real, &request(Some(token)));
    assert!(stolen.contains("unknown or already used"), "{stolen}");
    drop(sub);
    impostor.join().unwrap();
    std::fs::remove_file(&real).unwrap();
}

/// Binds a topic at `addr` with mutual TLS and `nobody` allowed locally.
fn tls_topic(addr: &str) -> Publisher {
    let opts = common::opts("tls").allow_uids([NOBODY]);
    Publisher::bind(addr, &PubSubOptions::default().options(opts).slots(64)).unwrap()
}

#[test]
fn other_local_users_cannot_skip_the_client_certificate() {
    dir();
    // `tls:`: no local socket at all; `nobody` without a client certificate is refused.
    let tls = tls_topic("tls:127.0.0.1:0");
    let tls_addr = tls.local_addr();
    assert_eq!(topic_sockets(port_of(&tls_addr)), Vec::<PathBuf>::new());
    // `auto:` over TLS: a socket, which wants a token; we (with a certificate) attach.
    let mut auto = tls_topic("auto:127.0.0.1:0");
    let auto_addr = auto.local_addr();
    let mut ours = Subscriber::connect(
        &auto_addr,
        &PubSubOptions::default().options(common::opts("tls")),
    )
    .unwrap();
    assert_eq!(ours.transport(), shmlink::Transport::Shm);
    publish(&mut auto, 1, 5);
    expect_numbers(&mut ours, 5);
    if !root() {
        return;
    }
    let got = run_as_nobody("tls", &tls_addr);
    eprintln!("nobody on the tls: topic: {got}");
    assert!(got.starts_with("sockets=0 tls=refused "), "{got}");
    let socket = topic_sockets(port_of(&auto_addr)).remove(0);
    let got = run_as_nobody("socket", socket.to_str().unwrap());
    eprintln!("nobody on the auto: topic socket: {got}");
    let [plain, made_up]: [&str; 2] = got
        .split(" | ")
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or_else(|_| panic!("{got}"));
    assert!(
        plain.starts_with("PermissionDenied") && plain.contains("token"),
        "{got}"
    );
    assert!(
        made_up.starts_with("refused Permission") && made_up.contains("unknown or already used"),
        "{got}"
    );
    // Neither topic took a subscriber from `nobody`.
    assert_eq!(tls.subscriber_count(), 0);
    assert_eq!(auto.subscriber_count(), 1);
}

/// Runs this binary's `child` test as `nobody` with `role` and `arg`; returns the line it
/// printed after `RESULT `.
fn run_as_nobody(role: &str, arg: &str) -> String {
    let ca = common::pki().ca.clone();
    let env = [(ROLE, role), (ARG, arg), (CA, ca.as_str())];
    common::child_result(&common::child_as(NOBODY, NOBODY, &env).output().unwrap())
}

/// `nobody`'s side, started by [`run_as_nobody`].
#[test]
#[ignore = "run by the other tests of this file as another uid"]
fn child() {
    let (Ok(role), Ok(arg)) = (std::env::var(ROLE), std::env::var(ARG)) else {
        return;
    };
    let quick = Options::default().connect_timeout(Duration::from_secs(3));
    let result = match role.as_str() {
        "tls" => {
            // Every local socket of the topic (there should be none), then the network
            // without a client certificate (we trust the publisher's CA).
            let sockets = topic_sockets(port_of(&arg)).len();
            let ca = std::env::var(CA).unwrap();
            let opts = quick.tls(TlsOptions::new().ca(Pem::text(ca)));
            let tls = match Subscriber::connect(&arg, &PubSubOptions::default().options(opts)) {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("refused {:?} {e}", e.kind()),
            };
            format!("sockets={sockets} tls={tls}")
        }
        "socket" => {
            let path = Path::new(&arg);
            let opts = PubSubOptions::default().options(quick);
            let plain = match Subscriber::connect(&format!("shm:{arg}"), &opts) {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("{:?} {e}", e.kind()),
            };
            format!("{plain} | {}", ask(path, &request(Some([0x33; 16]))))
        }
        other => panic!("unknown role {other}"),
    };
    println!("RESULT {result}");
}
