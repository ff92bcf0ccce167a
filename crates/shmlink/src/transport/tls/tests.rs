//! `tls:` under the framed conformance suite — with a hand-driven TLS client for the
//! hostile cases and a raw TCP one for peers that do not speak TLS at all — and the entry
//! points on an already connected stream.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread;

use rustls::{ClientConfig, ClientConnection, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::test_pki::pki;
use super::{test_tls, ClientTls, ServerTls};
use crate::options::Options;
use crate::sys::stream::{self, Ready};
use crate::transport::framed::conformance::{self, opts_for, soon, RawPeer, PATIENCE};
use crate::transport::framed::{Frame, Link, HELLO_LEN};
use crate::transport::stream::tests::RawTcp;
use crate::transport::stream::{accept_stream, connect_stream, StreamLink};
use crate::transport::ConnOps;

const ANY: &str = "tls:127.0.0.1:0";

/// A TLS client driven by hand: rustls configured here, not by shmlink, with the test
/// client certificate.
struct RawTls {
    conn: ClientConnection,
    sock: TcpStream,
}

fn raw_config() -> Arc<ClientConfig> {
    let pki = pki();
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pki.ca.as_bytes()).unwrap())
        .unwrap();
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(pki.client.cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(pki.client.key.as_bytes()).unwrap(),
            )
            .unwrap();
    Arc::new(config)
}

impl RawTls {
    /// Writes the records rustls has ready.
    fn push(&mut self) {
        while self.conn.wants_write() {
            self.conn.write_tls(&mut self.sock).unwrap();
        }
    }
}

impl RawPeer for RawTls {
    /// Connects and sends the ClientHello; the rest of the TLS handshake happens on the
    /// first read, so that connecting never waits for a listener that is not accepting
    /// yet (what is written meanwhile waits in rustls).
    fn connect(addr: &str) -> RawTls {
        let sock = TcpStream::connect(addr.strip_prefix("tls:").unwrap()).unwrap();
        sock.set_read_timeout(Some(PATIENCE)).unwrap();
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let conn = ClientConnection::new(raw_config(), name).unwrap();
        let mut raw = RawTls { conn, sock };
        raw.push();
        raw
    }

    fn write(&mut self, bytes: &[u8]) {
        self.conn.writer().write_all(bytes).unwrap();
        self.push();
    }

    fn read_hello(&mut self) -> Option<[u8; HELLO_LEN]> {
        let mut h = [0u8; HELLO_LEN];
        match rustls::Stream::new(&mut self.conn, &mut self.sock).read_exact(&mut h) {
            Ok(()) => Some(h),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => None,
            Err(e) => panic!("{e}"),
        }
    }

    fn closed_by_peer(&mut self) -> bool {
        let mut buf = [0u8; 64];
        let mut s = rustls::Stream::new(&mut self.conn, &mut self.sock);
        loop {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    return true
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return false
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    fn frame(kind: Frame, payload: &[u8]) -> Vec<u8> {
        RawTcp::frame(kind, payload)
    }
}

#[test]
fn bad_clients_are_dropped() {
    // Inside TLS: garbage instead of a hello, and no hello.
    conformance::bad_clients_are_dropped::<RawTls>(ANY);
    // Outside: garbage instead of a ClientHello, and no ClientHello.
    conformance::bad_clients_are_dropped::<RawTcp>(ANY);
}

#[test]
fn garbage_is_dropped_at_once() {
    conformance::garbage_is_dropped_at_once::<RawTls>(ANY);
    conformance::garbage_is_dropped_at_once::<RawTcp>(ANY);
}

#[test]
fn other_version_is_told_and_dropped() {
    conformance::other_version_is_told_and_dropped::<RawTls>(ANY);
}

#[test]
fn fin_versus_crash() {
    conformance::fin_versus_crash::<RawTls>(ANY);
}

#[test]
fn hostile_frames() {
    use crate::transport::stream::tests::header;
    let too_big = RawTls::frame(Frame::Data, &[0; 1001]);
    conformance::hostile_frames::<RawTls>(
        ANY,
        &[
            &[&too_big],
            &[&header(1, 1 << 30)],
            &[&header(1, u32::MAX)],
            &[&[0x7f, 0, 0, 0, 0]],
            &[&header(2, 3), b"abc"],
        ],
    );
}

/// Waits until `link` may make progress.
fn wait(link: &StreamLink) {
    let ready = if link.pending_output() {
        Ready::ReadWrite
    } else {
        Ready::Read
    };
    assert!(
        stream::wait(link.sock(), ready, soon()).unwrap(),
        "peer stuck"
    );
}

#[test]
fn client_checks_listener_hello() {
    conformance::client_checks_listener_hello(|reply| {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = format!("tls:{}", listener.local_addr().unwrap());
        let server = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let tls = ServerTls::new(&test_tls()).unwrap();
            let mut link = StreamLink::new(OwnedFd::from(s), Some(tls.session().unwrap()));
            while !link.handshake().unwrap() {
                wait(&link);
            }
            let mut hello = Vec::with_capacity(HELLO_LEN);
            while hello.len() < HELLO_LEN {
                let missing = HELLO_LEN - hello.len();
                match link.recv_append(&mut hello, missing, false) {
                    Ok(n) => assert!(n > 0, "client left"),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(&link),
                    Err(e) => panic!("{e}"),
                }
            }
            if !reply.is_empty() {
                assert_eq!(link.send_parts(&reply, &[], true).unwrap(), reply.len());
                // Until the client goes.
                let mut rest = Vec::with_capacity(64);
                while let Ok(1..) = link.recv_append(&mut rest, 64, true) {
                    rest.clear();
                }
            }
        });
        (addr, server)
    });
}

/// As `auto:` will: a TCP connection made first, then (with TLS or without) the
/// handshake run on it through the entry points on a connected stream.
#[test]
fn handshake_on_a_connected_stream() {
    for with_tls in [false, true] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let opts = opts_for(ANY);
        let o = opts.clone();
        let client = thread::spawn(move || {
            let stream = TcpStream::connect(addr).unwrap();
            let tls = ClientTls::new(&o.tls, "127.0.0.1").unwrap();
            let deadline = soon().unwrap();
            connect_stream(stream, with_tls.then_some(&tls), &o, None, deadline).unwrap()
        });
        let (stream, _) = l.accept().unwrap();
        let tls = ServerTls::new(&opts.tls).unwrap();
        let scheme = if with_tls { "tls" } else { "tcp" };
        let local = format!("{scheme}:{addr}");
        let mut hs = accept_stream(stream, with_tls.then_some(&tls), local.clone(), &opts).unwrap();
        while !hs.advance().unwrap() {
            let ready = if hs.wants_write() {
                Ready::ReadWrite
            } else {
                Ready::Read
            };
            assert!(stream::wait(hs.sock(), ready, soon()).unwrap());
        }
        let mut server = hs.finish().unwrap().expect("accepted");
        let mut client = client.join().unwrap();
        assert_eq!(client.peer_addr(), local);
        assert_eq!(server.local_addr(), local);
        assert!(server.peer_addr().starts_with(&format!("{scheme}:")));
        client.send(b"ping", true).unwrap();
        assert_eq!(server.recv_next(true).unwrap(), 4);
        assert_eq!(server.take_current(), b"ping");
        server.close(true).unwrap();
        assert_eq!(
            client.recv_next(true).unwrap_err().kind(),
            crate::ErrorKind::EndOfStream
        );
    }
}

#[test]
fn options_without_certificates_are_refused_before_any_io() {
    let e = crate::Listener::bind(ANY, &Options::default()).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("tls.cert"), "{e}");
    // Nobody listens on port 1: the missing CA is reported, not the refusal.
    let e = crate::Connection::connect("tls:127.0.0.1:1", &Options::default()).unwrap_err();
    assert_eq!(e.kind(), crate::ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("tls.ca"), "{e}");
}
