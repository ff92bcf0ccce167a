//! `tls:` as its users see it: certificates from files or PEM text, refused certificates
//! and names reported as clear errors on the client, mutual TLS, and a listener that
//! goes on serving after a client failed its TLS handshake.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::thread;
use std::time::Duration;

use common::*;
use shmlink::{Connection, Error, ErrorKind, Listener, Options, Pem, TlsOptions};

/// A listener's options: the test listener certificate and key.
fn server(cert: &test_pki::Identity) -> TlsOptions {
    TlsOptions::new()
        .cert(Pem::text(&cert.cert))
        .key(Pem::text(&cert.key))
}

/// A client's options: trusting `ca`.
fn client(ca: &str) -> TlsOptions {
    TlsOptions::new().ca(Pem::text(ca))
}

/// A listener on a free port, and a thread that accepts `good` clients and echoes one
/// message for each; clients that fail their handshake meanwhile do not surface.
fn serve(tls: TlsOptions, good: usize) -> (String, thread::JoinHandle<()>) {
    let opts = Options::default()
        .tls(tls)
        .handshake_timeout(Duration::from_millis(500));
    let mut l = Listener::bind("tls:127.0.0.1:0", &opts).unwrap();
    let addr = l.local_addr();
    let t = thread::spawn(move || {
        for _ in 0..good {
            let mut c = l.accept().unwrap();
            let m = c.recv_vec().unwrap();
            c.send(&m).unwrap();
        }
    });
    (addr, t)
}

/// Connects, and checks the connection works.
fn works(addr: &str, tls: TlsOptions) {
    let mut c = Connection::connect(addr, &Options::default().tls(tls)).unwrap();
    assert_eq!(c.transport(), shmlink::Transport::Tls);
    c.send(b"hi").unwrap();
    assert_eq!(c.recv_vec().unwrap(), b"hi");
}

/// Connects, expecting a refusal of `kind` whose message names the address and `says`.
fn refused(addr: &str, tls: TlsOptions, kind: ErrorKind, says: &str) -> Error {
    let e = Connection::connect(addr, &Options::default().tls(tls)).unwrap_err();
    eprintln!("{e}");
    assert_eq!(e.kind(), kind, "{e}");
    assert!(e.to_string().contains(addr), "{e}");
    assert!(e.to_string().contains(says), "{e}");
    e
}

#[test]
fn a_listener_signed_by_another_ca_is_refused() {
    let pki = pki();
    let (addr, t) = serve(server(&pki.server), 1);
    refused(
        &addr,
        client(&pki.other_ca),
        ErrorKind::PermissionDenied,
        "the listener's certificate is not signed by a CA in option tls.ca",
    );
    // The listener goes on serving.
    works(&addr, client(&pki.ca));
    t.join().unwrap();
}

#[test]
fn a_listener_certificate_for_another_name_is_refused() {
    let pki = pki();
    let (addr, t) = serve(server(&pki.elsewhere), 3);
    let e = refused(
        &addr,
        client(&pki.ca),
        ErrorKind::PermissionDenied,
        "the listener's certificate is not valid for the server name",
    );
    // The expected and the presented names are both shown.
    assert!(e.to_string().contains("127.0.0.1"), "{e}");
    assert!(e.to_string().contains("elsewhere.example"), "{e}");
    // The name the certificate is for, given explicitly.
    works(&addr, client(&pki.ca).server_name("elsewhere.example"));
    // Hostname verification off: the CA's signature is enough.
    works(&addr, client(&pki.ca).verify_hostname(false));
    // ... but not without it.
    refused(
        &addr,
        client(&pki.other_ca).verify_hostname(false),
        ErrorKind::PermissionDenied,
        "not signed by a CA",
    );
    refused(
        &addr,
        client(&pki.ca).server_name("wrong.example"),
        ErrorKind::PermissionDenied,
        "wrong.example",
    );
    works(&addr, client(&pki.ca).server_name("elsewhere.example"));
    t.join().unwrap();
}

#[test]
fn host_names_and_ip_addresses_are_verified() {
    let pki = pki();
    let (addr, t) = serve(server(&pki.server), 2);
    let port = addr.rsplit_once(':').unwrap().1;
    works(&format!("tls:localhost:{port}"), client(&pki.ca));
    works(&addr, client(&pki.ca));
    t.join().unwrap();
}

#[test]
fn mutual_tls_refuses_clients_without_a_trusted_certificate() {
    let pki = pki();
    let (addr, t) = serve(server(&pki.server).ca(Pem::text(&pki.ca)), 1);
    refused(
        &addr,
        client(&pki.ca),
        ErrorKind::PermissionDenied,
        "the listener requires a client certificate",
    );
    refused(
        &addr,
        client(&pki.ca)
            .cert(Pem::text(&pki.stranger.cert))
            .key(Pem::text(&pki.stranger.key)),
        ErrorKind::PermissionDenied,
        "the listener does not trust the CA that signed this client's certificate",
    );
    works(
        &addr,
        client(&pki.ca)
            .cert(Pem::text(&pki.client.cert))
            .key(Pem::text(&pki.client.key)),
    );
    t.join().unwrap();
}

#[test]
fn certificates_come_from_files_or_text() {
    let pki = pki();
    let dir = test_dir().join(format!(
        "pki-{}",
        fresh_addr("ux").rsplit('-').next().unwrap()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, pem: &str| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap();
        Pem::file(path)
    };
    let files = TlsOptions::new()
        .cert(file("server.pem", &pki.server.cert))
        .key(file("server.key", &pki.server.key))
        .ca(file("ca.pem", &pki.ca));
    let text = TlsOptions::new()
        .cert(Pem::text(&pki.client.cert))
        .key(Pem::text(&pki.client.key))
        .ca(Pem::text(&pki.ca));
    // Listener from files, client from text.
    let (addr, t) = serve(files.clone(), 1);
    works(&addr, text.clone());
    t.join().unwrap();
    // And the other way round.
    let (addr, t) = serve(
        text.cert(Pem::text(&pki.server.cert))
            .key(Pem::text(&pki.server.key)),
        1,
    );
    works(
        &addr,
        files
            .cert(file("client.pem", &pki.client.cert))
            .key(file("client.key", &pki.client.key)),
    );
    t.join().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_tls_options_name_the_option() {
    let pki = pki();
    let bind = |tls: TlsOptions| {
        Listener::bind("tls:127.0.0.1:0", &Options::default().tls(tls)).unwrap_err()
    };
    let connect = |tls: TlsOptions| {
        // Nobody listens on port 1: options are checked before any connection.
        Connection::connect("tls:127.0.0.1:1", &Options::default().tls(tls)).unwrap_err()
    };
    let missing = test_dir().join("no-such-file.pem");
    for (e, says) in [
        (bind(TlsOptions::new()), "tls.cert"),
        (
            bind(server(&pki.server).cert(Pem::file(&missing))),
            "option tls.cert: cannot read",
        ),
        (
            bind(server(&pki.server).key(Pem::text("not PEM"))),
            "option tls.key: no PRIVATE KEY",
        ),
        (
            bind(server(&pki.server).cert(Pem::text(&pki.server.key))),
            "option tls.cert: no CERTIFICATE",
        ),
        (
            bind(server(&pki.server).key(Pem::text(&pki.client.key))),
            "options tls.cert and tls.key",
        ),
        (
            bind(server(&pki.server).ca(Pem::file(&missing))),
            "option tls.ca: cannot read",
        ),
        (connect(TlsOptions::new()), "option tls.ca is required"),
        (
            connect(client(&pki.ca).server_name("not a name!")),
            "option tls.server_name",
        ),
        (
            connect(client(&pki.ca).cert(Pem::text(&pki.client.cert))),
            "tls.key",
        ),
    ] {
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
    assert!(bind(server(&pki.server).cert(Pem::file(&missing)))
        .to_string()
        .contains(&missing.display().to_string()));
}

#[test]
fn tcp_and_tls_do_not_mix() {
    let pki = pki();
    // A tls: client of a tcp: listener.
    let mut l = Listener::bind("tcp:127.0.0.1:0", &Options::default()).unwrap();
    let port = l.local_addr().rsplit_once(':').unwrap().1.to_string();
    let tcp_addr = l.local_addr();
    let t = thread::spawn(move || l.accept().map(|_| ()));
    refused(
        &format!("tls:127.0.0.1:{port}"),
        client(&pki.ca),
        ErrorKind::ConnectionRefused,
        "is it a tls: listener?",
    );
    Connection::connect(&tcp_addr, &Options::default()).unwrap();
    t.join().unwrap().unwrap();
    // A tcp: client of a tls: listener.
    let (addr, t) = serve(server(&pki.server), 1);
    let port = addr.rsplit_once(':').unwrap().1;
    let e = Connection::connect(&format!("tcp:127.0.0.1:{port}"), &Options::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    works(&addr, client(&pki.ca));
    t.join().unwrap();
}

#[test]
fn a_silent_client_holds_up_no_one() {
    let pki = pki();
    let (addr, t) = serve(server(&pki.server), 2);
    // Connected, but never starts its TLS handshake.
    let mut silent = TcpStream::connect(addr.strip_prefix("tls:").unwrap()).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    works(&addr, client(&pki.ca));
    // Dropped at the listener's handshake deadline (500 ms), while it waits for the next.
    let mut buf = [0u8; 16];
    assert_eq!(
        silent.read(&mut buf).unwrap(),
        0,
        "silent client not dropped"
    );
    works(&addr, client(&pki.ca));
    t.join().unwrap();
}
