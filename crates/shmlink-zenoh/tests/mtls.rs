//! Mutual TLS between bridges: A listens on a `tls/` endpoint with `--mtls` and a CA.
//! B presents a certificate that CA signed and gets A's topic (the control); C presents
//! one from another CA and gets nothing, and injects nothing: C's exported topic never
//! appears on A. Three network namespaces, B and C each linked to A.
//!
//! Access control (`acl_admits_the_named_peers_only`): A grants B (by its certificate's
//! common name) one exported topic out and one topic in. D, whose certificate the same
//! CA signed (its link is up), is granted nothing: it gets nothing and injects nothing;
//! B gets only its granted topic and injects into its granted one.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use support::hosts::{bridge_exe, unavailable, Net, Proc};
use support::msg::ORIGIN_STEP;
use support::roles::{field, publish_round};

const COUNT: u64 = 300;

/// A peer process of these tests (`SHZ_ROLE` set); in a plain run, checks the codec.
#[test]
fn peer() {
    if !support::roles::run_role() {
        support::msg::self_check();
    }
}

fn ca(name: &str) -> (Certificate, KeyPair) {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = p.self_signed(&key).unwrap();
    (cert, key)
}

/// Writes `NAME.pem` and `NAME.key` into `dir`: a leaf for addresses `sans` signed by `ca`.
fn leaf(dir: &Path, name: &str, sans: &[&str], ca: &(Certificate, KeyPair)) {
    let mut p =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = p.signed_by(&key, &ca.0, &ca.1).unwrap();
    std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
}

fn has_topic(dir: &Path, name: &str) -> bool {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with(name))
}

/// Link addresses (A's end, the other's end) of one veth pair.
type Link = (String, String);

/// Three hosts, A linked to each of the other two, and a directory for their
/// certificates; `None`, the skip reported, where the namespaces cannot be made.
fn three_hosts() -> Option<(Net, Link, Link, PathBuf)> {
    if let Some((category, why)) = unavailable() {
        shmlink_testkit::skip(category, why);
        return None;
    }
    let net = Net::new(3);
    let (ab, ac) = (net.link(0, 1, 0), net.link(0, 2, 1));
    let pki = net.root.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    Some((net, ab, ac, pki))
}

#[test]
fn mtls_admits_the_cas_peers_only() {
    mtls_case("tls");
}

/// The same over `quic/` links.
#[test]
fn mtls_admits_the_cas_peers_only_over_quic() {
    mtls_case("quic");
}

fn mtls_case(proto: &str) {
    let Some((net, (a_ab, b_ab), (a_ac, c_ac), pki)) = three_hosts() else {
        return;
    };
    let good = ca("shmlink-zenoh test CA");
    let other = ca("another CA");
    std::fs::write(pki.join("ca.pem"), good.0.pem()).unwrap();
    std::fs::write(pki.join("other-ca.pem"), other.0.pem()).unwrap();
    // A's certificate names both its addresses: C's refusal is about C's certificate,
    // not about A's name.
    leaf(&pki, "a", &[&a_ab, &a_ac], &good);
    leaf(&pki, "b", &[&b_ab], &good);
    leaf(&pki, "c", &[&c_ac], &other);
    let f = |n: &str| pki.join(n).display().to_string();
    let exe = bridge_exe();

    // A: the topic `zt` to export, a topic `zc` it would import.
    let env = |topic: &str| {
        vec![
            ("SHZ_TOPIC", topic.to_owned()),
            ("SHZ_COUNT", COUNT.to_string()),
            ("SHZ_POLICY", "block".to_owned()),
            ("SHZ_SIZES", "small".to_owned()),
            ("SHZ_SUBS", "1".to_owned()),
            ("SHZ_IDLE_MS", "3000".to_owned()),
        ]
    };
    let mut pub_a = net.role(0, "pub-zt", "pub", &env("zt"));
    let mut pub_c = net.role(2, "pub-zc", "pub", &env("zc"));
    let listen_b = format!("{proto}/{a_ab}:7447");
    let listen_c = format!("{proto}/{a_ac}:7448");
    let mut ba = net.spawn(
        0,
        "bridge-a",
        &exe,
        &[
            "--export",
            "zt",
            "--import",
            "zc",
            "--listen",
            &listen_b,
            "--listen",
            &listen_c,
            "--tls-ca",
            &f("ca.pem"),
            "--tls-cert",
            &f("a.pem"),
            "--tls-key",
            &f("a.key"),
            "--mtls",
        ],
        &[],
    );
    ba.expect("ready", Duration::from_secs(20));
    let mut bb = net.spawn(
        1,
        "bridge-b",
        &exe,
        &[
            "--import",
            "zt",
            "--connect",
            &listen_b,
            "--tls-ca",
            &f("ca.pem"),
            "--tls-cert",
            &f("b.pem"),
            "--tls-key",
            &f("b.key"),
            "--mtls",
        ],
        &[],
    );
    bb.expect("ready", Duration::from_secs(20));
    // C trusts A's CA (so C's side would accept A) but presents a certificate of another CA.
    let mut bc = net.spawn(
        2,
        "bridge-c",
        &exe,
        &[
            "--import",
            "zt",
            "--export",
            "zc",
            "--connect",
            &listen_c,
            "--tls-ca",
            &f("ca.pem"),
            "--tls-cert",
            &f("c.pem"),
            "--tls-key",
            &f("c.key"),
            "--mtls",
        ],
        &[],
    );
    let _ = bc.expect("ready", Duration::from_secs(20));
    pub_a.expect("bound", Duration::from_secs(40));
    pub_c.expect("bound", Duration::from_secs(40));
    let mut sub_b = net.role(1, "sub-b", "sub", &env("zt"));
    sub_b.expect("ready", Duration::from_secs(40));
    pub_a.tell("go");
    pub_c.tell("go");
    pub_a.expect("done", Duration::from_secs(60));
    pub_c.expect("done", Duration::from_secs(60));
    let r = sub_b.expect("result", Duration::from_secs(60));
    assert!(
        r.contains(&format!("received={COUNT} ")) && r.contains("errors=0 "),
        "B (the CA's peer): {r}"
    );
    // Give anything C might have received or sent time to show.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert!(
            !has_topic(&net.hosts[2].dir, "zt"),
            "C, refused, got topic zt"
        );
        assert!(
            !has_topic(&net.hosts[0].dir, "zc"),
            "C, refused, injected topic zc into A"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    pub_a.tell("exit");
    pub_c.tell("exit");
    let la = ba.stop(Duration::from_secs(10));
    let lc = bc.stop(Duration::from_secs(10));
    assert!(
        !la.iter().any(|l| l.starts_with("stats zc ")),
        "A imported from C: {la:?}"
    );
    assert!(
        !lc.iter().any(|l| l.starts_with("stats zt ")),
        "C imported from A: {lc:?}"
    );
    let _ = bb.stop(Duration::from_secs(10));
}

/// The role environment of a small `Block` stream of `COUNT` messages on `topic`.
fn stream(topic: &str, extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut v = vec![
        ("SHZ_TOPIC", topic.to_owned()),
        ("SHZ_COUNT", COUNT.to_string()),
        ("SHZ_POLICY", "block".to_owned()),
        ("SHZ_SIZES", "small".to_owned()),
        ("SHZ_SUBS", "1".to_owned()),
        ("SHZ_IDLE_MS", "3000".to_owned()),
    ];
    v.extend_from_slice(extra);
    v
}

/// The bridge's final `stats` line for `topic` in direction `dir`, if any.
fn stats(lines: &[String], topic: &str, dir: &str) -> Option<String> {
    lines
        .iter()
        .rev()
        .find(|l| l.starts_with(&format!("stats {topic} {dir} ")))
        .cloned()
}

/// The bridge's last `links` line.
fn links(lines: &[String]) -> String {
    lines
        .iter()
        .rev()
        .find(|l| l.starts_with("links "))
        .cloned()
        .unwrap_or_default()
}

#[test]
fn acl_admits_the_named_peers_only() {
    acl_case("tls");
}

/// The same grants over `quic/` links: Zenoh's QUIC link also names the peer by its
/// certificate's common name.
#[test]
fn acl_admits_the_named_peers_only_over_quic() {
    acl_case("quic");
}

fn acl_case(proto: &str) {
    let Some((net, (a_ab, b_ab), (a_ad, d_ad), pki)) = three_hosts() else {
        return;
    };
    let ca = ca("shmlink-zenoh test CA");
    std::fs::write(pki.join("ca.pem"), ca.0.pem()).unwrap();
    // One CA for all: D's certificate is as valid as B's, only the grants differ.
    leaf(&pki, "a", &[&a_ab, &a_ad], &ca);
    leaf(&pki, "bridge-b", &[&b_ab], &ca);
    leaf(&pki, "bridge-d", &[&d_ad], &ca);
    let f = |n: &str| pki.join(n).display().to_string();
    let exe = bridge_exe();
    let tls = |me: &str| {
        vec![
            "--tls-ca".to_owned(),
            f("ca.pem"),
            "--tls-cert".to_owned(),
            f(&format!("{me}.pem")),
            "--tls-key".to_owned(),
            f(&format!("{me}.key")),
            "--mtls".to_owned(),
        ]
    };
    let spawn = |h: usize, name: &str, args: Vec<String>| -> Proc {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut p = net.spawn(h, name, &exe, &args, &[]);
        p.expect("ready", Duration::from_secs(20));
        p
    };
    let (listen_b, listen_d) = (
        format!("{proto}/{a_ab}:7447"),
        format!("{proto}/{a_ad}:7448"),
    );
    // A exports zt and zu and imports zc; only B is granted, and only zt out and zc in.
    let mut args: Vec<String> = [
        "--export",
        "zt",
        "--export",
        "zu",
        "--import",
        "zc",
        "--listen",
        &listen_b,
        "--listen",
        &listen_d,
        "--allow-out",
        "bridge-b:zt",
        "--allow-in",
        "bridge-b:zc",
    ]
    .map(String::from)
    .to_vec();
    args.extend(tls("a"));
    let mut ba = spawn(0, "bridge-a", args);
    // B and D ask for everything A has and offer zc; neither has grants of its own.
    let peer = |connect: &str, me: &str| {
        let mut v: Vec<String> = [
            "--import",
            "zt",
            "--import",
            "zu",
            "--export",
            "zc",
            "--connect",
            connect,
        ]
        .map(String::from)
        .to_vec();
        v.extend(tls(me));
        v
    };
    let mut bb = spawn(1, "bridge-b", peer(&listen_b, "bridge-b"));
    let mut bd = spawn(2, "bridge-d", peer(&listen_d, "bridge-d"));

    // Two phases, one way at a time: messages both ways at once on a tls/ link meet
    // Zenoh 1.10.2's TLS race (eclipse-zenoh/zenoh#2557; docs/zenoh.md, "Limits"), and
    // both transports run the same phases. `quic_carries_both_ways_at_once` runs both
    // ways at once.
    // Out: A's zt (granted to B) and zu (granted to nobody).
    let mut pub_zt = net.role(0, "pub-zt", "pub", &stream("zt", &[]));
    let mut pub_zu = net.role(0, "pub-zu", "pub", &stream("zu", &[]));
    pub_zt.expect("bound", Duration::from_secs(40));
    pub_zu.expect("bound", Duration::from_secs(40));
    let mut sub_b = net.role(1, "sub-zt", "sub", &stream("zt", &[]));
    sub_b.expect("ready", Duration::from_secs(40));
    for p in [&mut pub_zt, &mut pub_zu] {
        p.tell("go");
    }
    for p in [&mut pub_zt, &mut pub_zu] {
        p.expect("done", Duration::from_secs(60));
    }
    // B, granted zt out, gets all of it.
    let rb = sub_b.expect("result", Duration::from_secs(60));
    assert_eq!(field(&rb, "received"), COUNT, "B's subscriber of zt: {rb}");
    assert_eq!(field(&rb, "errors"), 0, "B's subscriber of zt: {rb}");

    // In: zc from B (granted) and from D (not granted), into A.
    let mut pub_zc_b = net.role(1, "pub-zc", "pub", &stream("zc", &[]));
    // D's messages are numbered from ORIGIN_STEP: any of them on A would show.
    let base = [("SHZ_SEQ_BASE", ORIGIN_STEP.to_string())];
    let mut pub_zc_d = net.role(2, "pub-zc", "pub", &stream("zc", &base));
    pub_zc_b.expect("bound", Duration::from_secs(40));
    pub_zc_d.expect("bound", Duration::from_secs(40));
    let zc_file = net.hosts[0].dir.join("zc.txt");
    let linger = [
        ("SHZ_OUT", zc_file.display().to_string()),
        ("SHZ_LINGER_MS", "1500".to_owned()),
    ];
    let mut sub_a = net.role(0, "sub-zc", "sub", &stream("zc", &linger));
    sub_a.expect("ready", Duration::from_secs(40));
    for p in [&mut pub_zc_b, &mut pub_zc_d] {
        p.tell("go");
    }
    for p in [&mut pub_zc_b, &mut pub_zc_d] {
        p.expect("done", Duration::from_secs(60));
    }
    // A's subscriber of zc gets B's stream (granted in), and nothing of D's.
    let ra = sub_a.expect("result", Duration::from_secs(60));
    assert_eq!(field(&ra, "errors"), 0, "A's subscriber of zc: {ra}");
    let seen: Vec<u64> = std::fs::read_to_string(&zc_file)
        .unwrap()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    assert!(
        seen.iter().all(|&s| s < ORIGIN_STEP),
        "D (not granted) injected into A's zc: {:?}",
        seen.iter().find(|&&s| s >= ORIGIN_STEP)
    );
    assert_eq!(seen.len() as u64, COUNT, "A's subscriber of zc: {ra}");
    // Give anything else time to show: neither zt nor zu reaches D, zu does not reach B.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        for (h, topic, who) in [(2, "zt", "D"), (2, "zu", "D"), (1, "zu", "B")] {
            assert!(
                !has_topic(&net.hosts[h].dir, topic),
                "{who}, not granted {topic}, got it"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for p in [&mut pub_zt, &mut pub_zu, &mut pub_zc_b, &mut pub_zc_d] {
        p.tell("exit");
    }
    // A last: B's and D's final lines show their links to it.
    let ld = bd.stop(Duration::from_secs(10));
    let lb = bb.stop(Duration::from_secs(10));
    let la = ba.stop(Duration::from_secs(10));
    // D's link to A was up (its certificate was accepted): the grants kept it out.
    assert!(links(&ld).contains("peers=1"), "D's links: {ld:?}");
    assert!(links(&lb).contains("peers=1"), "B's links: {lb:?}");
    // A sent zu to Zenoh (it is exported); its access control kept it from B.
    let zu = stats(&la, "zu", "out").unwrap_or_else(|| panic!("A's zu: {la:?}"));
    assert!(field(&zu, "messages") >= COUNT, "{zu}");
    for (lines, topic, who) in [(&ld, "zt", "D"), (&ld, "zu", "D"), (&lb, "zu", "B")] {
        assert!(
            stats(lines, topic, "in").is_none(),
            "{who} imported {topic}: {lines:?}"
        );
    }
    // D did put zc to Zenoh; A imported exactly what B put, none of D's.
    let d_out = stats(&ld, "zc", "out").unwrap_or_else(|| panic!("D's zc: {ld:?}"));
    assert!(field(&d_out, "messages") >= COUNT, "{d_out}");
    let b_out = stats(&lb, "zc", "out").unwrap_or_else(|| panic!("B's zc: {lb:?}"));
    let a_in = stats(&la, "zc", "in").unwrap_or_else(|| panic!("A's zc: {la:?}"));
    assert_eq!(
        field(&a_in, "messages"),
        field(&b_out, "messages"),
        "A imported more (or less) than B sent: {a_in} / {b_out} (D: {d_out})"
    );
}

/// Both directions at once over one `quic/` link with mutual TLS: A exports `zt` and
/// imports `zc`, B the other way round, and both streams run together; each subscriber
/// gets all of its stream, in order, and each bridge imports exactly what the other put.
/// This is the encrypted link to use for traffic both ways: Zenoh 1.10.2's `tls/` link
/// reads and writes one TLS stream from two tasks at once (eclipse-zenoh/zenoh#2557), and
/// with this test on `tls/` a direction stopped for good in 3 of 40 runs here
/// (docs/zenoh.md, "Limits"); on `quic/`, 40 of 40 went through.
#[test]
fn quic_carries_both_ways_at_once() {
    let Some((net, (a_ab, b_ab), _, pki)) = three_hosts() else {
        return;
    };
    let ca = ca("shmlink-zenoh test CA");
    std::fs::write(pki.join("ca.pem"), ca.0.pem()).unwrap();
    leaf(&pki, "a", &[&a_ab], &ca);
    leaf(&pki, "b", &[&b_ab], &ca);
    let f = |n: &str| pki.join(n).display().to_string();
    let exe = bridge_exe();
    let bridge = |h: usize, me: &str, args: [&str; 6]| -> Proc {
        let mut args = args.to_vec();
        let (pem, key) = (f(&format!("{me}.pem")), f(&format!("{me}.key")));
        let ca_pem = f("ca.pem");
        args.extend([
            "--tls-ca",
            &ca_pem,
            "--tls-cert",
            &pem,
            "--tls-key",
            &key,
            "--mtls",
        ]);
        let mut p = net.spawn(h, &format!("bridge-{me}"), &exe, &args, &[]);
        p.expect("ready", Duration::from_secs(20));
        p
    };
    let endpoint = format!("quic/{a_ab}:7449");
    let ops = ["--export", "zt", "--import", "zc"];
    let mut ba = bridge(
        0,
        "a",
        [ops[0], ops[1], ops[2], ops[3], "--listen", &endpoint],
    );
    let ops = ["--import", "zt", "--export", "zc"];
    let mut bb = bridge(
        1,
        "b",
        [ops[0], ops[1], ops[2], ops[3], "--connect", &endpoint],
    );

    let mut pubs = [
        net.role(0, "pub-zt", "pub", &stream("zt", &[])),
        net.role(1, "pub-zc", "pub", &stream("zc", &[])),
    ];
    for p in pubs.iter_mut() {
        p.expect("bound", Duration::from_secs(40));
    }
    let mut subs = [
        net.role(1, "sub-zt", "sub", &stream("zt", &[])),
        net.role(0, "sub-zc", "sub", &stream("zc", &[])),
    ];
    publish_round(&mut pubs, &mut subs, |_| COUNT);
    let lb = bb.stop(Duration::from_secs(10));
    let la = ba.stop(Duration::from_secs(10));
    assert!(links(&lb).contains("peers=1"), "B's links: {lb:?}");
    for (from, to, topic) in [(&la, &lb, "zt"), (&lb, &la, "zc")] {
        let out = stats(from, topic, "out").unwrap_or_else(|| panic!("{topic} out: {from:?}"));
        let got = stats(to, topic, "in").unwrap_or_else(|| panic!("{topic} in: {to:?}"));
        assert_eq!(
            field(&got, "messages"),
            field(&out, "messages"),
            "{got} / {out}"
        );
        assert_eq!(field(&got, "dropped"), 0, "{got}");
    }
}
