//! Certificates for the `tls:` tests, made at test time with rcgen (once per test process):
//!
//! - `ca`, and signed by it: `server` (for `localhost`, `127.0.0.1` and `::1`), `client`,
//!   and `elsewhere` (for `elsewhere.example` only);
//! - `other_ca`, unrelated, and signed by it: `stranger` (for `localhost` and `127.0.0.1`).
//!
//! Leaf certificates serve as server and as client certificates alike. This file uses
//! nothing of shmlink's: the unit tests compile it as a module of the crate, the
//! integration tests as a module of theirs (`#[path]`).
#![allow(dead_code)]

use std::sync::OnceLock;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate and its private key, in PEM.
pub struct Identity {
    pub cert: String,
    pub key: String,
}

/// Every certificate the tests use, in PEM.
pub struct Pki {
    pub ca: String,
    pub server: Identity,
    pub client: Identity,
    pub elsewhere: Identity,
    pub other_ca: String,
    pub stranger: Identity,
}

fn new_ca(name: &str) -> (Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("CA certificate");
    (cert, key)
}

fn new_leaf(names: &[&str], ca: &(Certificate, KeyPair)) -> Identity {
    let sans: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(sans).expect("leaf parameters");
    params.distinguished_name.push(DnType::CommonName, names[0]);
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate().expect("leaf key");
    let cert = params
        .signed_by(&key, &ca.0, &ca.1)
        .expect("leaf certificate");
    Identity {
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

/// The test certificates, made on first use.
pub fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let ca = new_ca("shmlink test CA");
        let other = new_ca("unrelated test CA");
        Pki {
            ca: ca.0.pem(),
            server: new_leaf(&["localhost", "127.0.0.1", "::1"], &ca),
            client: new_leaf(&["client.test"], &ca),
            elsewhere: new_leaf(&["elsewhere.example"], &ca),
            other_ca: other.0.pem(),
            stranger: new_leaf(&["localhost", "127.0.0.1"], &other),
        }
    })
}
