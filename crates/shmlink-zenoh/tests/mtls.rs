//! Mutual TLS between bridges: A listens on a `tls/` endpoint with `--mtls` and a CA.
//! B presents a certificate that CA signed and gets A's topic (the control); C presents
//! one from another CA and gets nothing, and injects nothing: C's exported topic never
//! appears on A. Three network namespaces, B and C each linked to A.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use support::hosts::{bridge_exe, unavailable, Net};

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

#[test]
fn mtls_admits_the_cas_peers_only() {
    if let Some((category, why)) = unavailable() {
        return shmlink_testkit::skip(category, why);
    }
    let net = Net::new(3);
    let (a_ab, b_ab) = net.link(0, 1, 0);
    let (a_ac, c_ac) = net.link(0, 2, 1);
    let pki = net.root.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
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
    let listen_b = format!("tls/{a_ab}:7447");
    let listen_c = format!("tls/{a_ac}:7448");
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
