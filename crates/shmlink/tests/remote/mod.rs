//! The conformance suite split over two processes, for the namespace tests: the server
//! half and the client half of every case, played by peers that may share nothing but a
//! kernel (`namespaces.rs` starts them, each in namespaces of its own).
//!
//! Every case runs on a connection of its own: the client connects, sends the case's
//! name and plays its half; the server accepts connections one after another, reads the
//! name and plays the other half, until the client's `quit` (answered with how many cases
//! it served). On every connection both ends check that it runs on the transport the
//! scenario expects (`shm` or `tcp`). Each end prints a [`MARK`] line per case it
//! finished, which the test compares with the cases it asked for.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use shmlink::{Connection, ErrorKind, Listener, Options, Pem, TlsOptions};

use crate::common::{expect_eos, payload, verify};

/// Prefix of the lines a peer prints for the test.
pub const MARK: &str = "SHMLINK-NS:";
/// Deadline of every wait inside a peer (a connect, an accept, a readiness poll), and the
/// connect and handshake timeouts: generous, because two debug builds may share a CPU.
pub const WAIT: Duration = Duration::from_secs(30);

/// Which end a process plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Client => "client",
        }
    }
}

/// How the addresses of a transport look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addressing {
    /// `PREFIX:NAME`, a socket in the rendezvous directory (`SHMLINK_DIR`), which each
    /// end resolves in its own mount namespace.
    Rendezvous,
    /// `PREFIX:HOST:PORT`; the server binds port 0 and the client gets the port it got.
    Ip,
}

/// A transport as this harness runs it. Another transport (say `tls:` with its
/// certificates) is one more row in [`TRANSPORTS`].
pub struct Transport {
    pub prefix: &'static str,
    pub addressing: Addressing,
    /// The options each end starts from; the harness adds its timeouts, and cases that
    /// need other options (a small ring) add those.
    pub options: fn(Role) -> Options,
}

pub const TRANSPORTS: &[Transport] = &[
    Transport {
        prefix: "shm",
        addressing: Addressing::Rendezvous,
        options: |_| Options::default(),
    },
    Transport {
        prefix: "tcp",
        addressing: Addressing::Ip,
        options: |_| Options::default(),
    },
    Transport {
        prefix: "auto",
        addressing: Addressing::Ip,
        options: |_| Options::default(),
    },
    Transport {
        prefix: "tls",
        addressing: Addressing::Ip,
        options: |_| Options::default().tls(tls_from_env()),
    },
];

/// Environment variables that hand `tls:` peers the test's CA, certificate and key (PEM).
pub const TLS_CA_VAR: &str = "SHMLINK_NS_TLS_CA";
pub const TLS_CERT_VAR: &str = "SHMLINK_NS_TLS_CERT";
pub const TLS_KEY_VAR: &str = "SHMLINK_NS_TLS_KEY";

/// Mutual TLS with the certificates in the environment; the certificate is made for
/// `localhost`, which the client expects instead of the server's veth address.
fn tls_from_env() -> TlsOptions {
    let var = |name| std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    TlsOptions::new()
        .ca(Pem::text(var(TLS_CA_VAR)))
        .cert(Pem::text(var(TLS_CERT_VAR)))
        .key(Pem::text(var(TLS_KEY_VAR)))
        .server_name("localhost")
}

/// The socket name a [`Addressing::Rendezvous`] server binds and its client dials.
pub const RENDEZVOUS_NAME: &str = "ns-conformance";

impl Transport {
    /// The row for `prefix`.
    pub fn named(prefix: &str) -> &'static Transport {
        TRANSPORTS
            .iter()
            .find(|t| t.prefix == prefix)
            .unwrap_or_else(|| panic!("no transport {prefix:?} in remote::TRANSPORTS"))
    }

    /// What a server on `host` binds.
    pub fn listen_addr(&self, host: &str) -> String {
        match self.addressing {
            Addressing::Rendezvous => format!("{}:{RENDEZVOUS_NAME}", self.prefix),
            Addressing::Ip => format!("{}:{host}:0", self.prefix),
        }
    }

    /// What a client dials, given what the server bound (`listen`) and reported
    /// (`bound`): the name as given, resolved in the client's own rendezvous directory;
    /// or the host and the port the server got.
    pub fn client_addr(&self, listen: &str, bound: &str) -> String {
        match self.addressing {
            Addressing::Rendezvous => listen.to_string(),
            Addressing::Ip => bound.to_string(),
        }
    }

    fn opts(&self, role: Role) -> Options {
        (self.options)(role)
            .connect_timeout(WAIT)
            .handshake_timeout(WAIT)
    }
}

/// One case of the suite: its name and its two halves.
pub struct Case {
    pub name: &'static str,
    server: fn(&mut Server, Connection),
    client: fn(&Client, &'static str),
}

pub const CASES: &[Case] = &[
    Case {
        name: "transport",
        server: transport_server,
        client: transport_client,
    },
    Case {
        name: "echo",
        server: echo_server,
        client: echo_client,
    },
    Case {
        name: "million_messages_in_order",
        server: million_server,
        client: million_client,
    },
    Case {
        name: "sizes_keep_boundaries",
        server: sizes_server,
        client: sizes_client,
    },
    Case {
        name: "zero_length_messages",
        server: zero_length_server,
        client: zero_length_client,
    },
    Case {
        name: "nonblocking_sender_gets_would_block_and_loses_nothing",
        server: would_block_server,
        client: would_block_client,
    },
    Case {
        name: "client_close_delivers_everything",
        server: client_close_server,
        client: client_close_client,
    },
    Case {
        name: "server_close_delivers_everything",
        server: server_close_server,
        client: server_close_client,
    },
    Case {
        name: "zero_copy_send_and_receive",
        server: zero_copy_server,
        client: zero_copy_client,
    },
    Case {
        name: "counters_and_addresses",
        server: counters_server,
        client: counters_client,
    },
    Case {
        name: "fd_readable_when_a_message_waits",
        server: readiness_server,
        client: readiness_client,
    },
];

/// The cases named in `list` (comma-separated; `all` for every case), in suite order.
pub fn cases(list: &str) -> Vec<&'static Case> {
    if list == "all" {
        return CASES.iter().collect();
    }
    let names: Vec<&str> = list.split(',').collect();
    for n in &names {
        assert!(CASES.iter().any(|c| c.name == *n), "unknown case {n:?}");
    }
    CASES.iter().filter(|c| names.contains(&c.name)).collect()
}

/// Prints a line for the test, at once.
fn mark(text: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{MARK} {text}")
        .and_then(|()| out.flush())
        .unwrap();
}

/// Whether `conn`'s fd becomes readable within `timeout`.
fn readable(conn: &Connection, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: conn.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd that lives across the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
    n == 1
}

fn recv_u64(conn: &mut Connection) -> u64 {
    let m = conn.recv_vec().unwrap();
    u64::from_le_bytes(m.as_slice().try_into().expect("an 8-byte count"))
}

/// A message of `len` bytes that only `seq` and `len` produce (xorshift words): cheap
/// enough to make and check at 64 MiB in a debug build, unlike [`payload`].
fn bulk(seq: u64, len: usize) -> Vec<u8> {
    let mut x = ((seq << 32) ^ len as u64) | 1;
    let mut v = vec![0u8; len];
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    v
}

/// Checks a received bulk message without printing megabytes on failure.
fn check_bulk(seq: u64, len: usize, got: &[u8]) {
    assert_eq!(got.len(), len, "bulk message {seq}: wrong length");
    assert!(
        got == bulk(seq, len),
        "bulk message {seq} ({len} bytes) corrupted"
    );
}

// ---------------------------------------------------------------------------------------
// The server process.

/// The server's side: its listener and what every connection must run on.
pub struct Server {
    listener: Listener,
    expect: String,
}

impl Server {
    /// The next connection and the name it opens with.
    fn accept(&mut self) -> (Connection, String) {
        let deadline = Instant::now() + WAIT;
        let mut conn = loop {
            match self.listener.accept() {
                Ok(conn) => break conn,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("accept on {}: {e}", self.listener.local_addr()),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no client within {WAIT:?}");
            let mut p = libc::pollfd {
                fd: self.listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd that lives across the call.
            unsafe { libc::poll(&mut p, 1, left.as_millis().min(1000) as i32) };
        };
        assert_eq!(conn.transport().as_str(), self.expect, "server: {conn:?}");
        let name = String::from_utf8(conn.recv_vec().unwrap()).expect("a case name");
        (conn, name)
    }

    /// The next connection, which must open with `name`.
    fn accept_named(&mut self, name: &str) -> Connection {
        let (conn, got) = self.accept();
        assert_eq!(got, name, "server: unexpected connection");
        conn
    }
}

/// Binds `t` on `host`, prints `listening ADDR`, and serves cases until `quit`.
pub fn serve(t: &Transport, host: &str, expect: &str) {
    let addr = t.listen_addr(host);
    let mut listener = Listener::bind(&addr, &t.opts(Role::Server))
        .unwrap_or_else(|e| panic!("server: bind {addr}: {e}"));
    listener.set_nonblocking(true);
    mark(format_args!("listening {}", listener.local_addr()));
    let mut server = Server {
        listener,
        expect: expect.to_string(),
    };
    let mut served = 0u64;
    loop {
        let (mut conn, name) = server.accept();
        if name == "quit" {
            conn.send(&served.to_le_bytes()).unwrap();
            expect_eos(&mut conn);
            return;
        }
        let case = CASES
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("server: unknown case {name:?}"));
        (case.server)(&mut server, conn);
        served += 1;
        mark(format_args!("served {name}"));
    }
}

// ---------------------------------------------------------------------------------------
// The client process.

/// The client's side: where to connect and what every connection must run on.
pub struct Client {
    transport: &'static Transport,
    addr: String,
    expect: String,
}

impl Client {
    /// A new connection that has sent `name`, with the transport's client options.
    fn connect(&self, name: &str) -> Connection {
        self.connect_with(name, self.transport.opts(Role::Client))
    }

    fn connect_with(&self, name: &str, opts: Options) -> Connection {
        let mut conn = Connection::connect(&self.addr, &opts)
            .unwrap_or_else(|e| panic!("client: {name}: {e}"));
        assert_eq!(conn.transport().as_str(), self.expect, "client: {conn:?}");
        conn.send(name.as_bytes()).unwrap();
        conn
    }
}

/// Runs `cases` against the server at `addr`, printing `passed CASE` after each, then
/// ends the server with `quit`.
pub fn run_client(t: &'static Transport, addr: &str, expect: &str, cases: &[&Case]) {
    let client = Client {
        transport: t,
        addr: addr.to_string(),
        expect: expect.to_string(),
    };
    for case in cases {
        (case.client)(&client, case.name);
        mark(format_args!("passed {}", case.name));
    }
    let mut conn = client.connect("quit");
    assert_eq!(recv_u64(&mut conn), cases.len() as u64, "cases served");
    conn.close().unwrap();
}

// ---------------------------------------------------------------------------------------
// The cases: each `*_server` and `*_client` pair runs on one connection (two for
// would-block).

/// Both ends report the expected transport, and each sees the other's.
fn transport_server(server: &mut Server, mut conn: Connection) {
    assert_eq!(conn.transport().as_str(), server.expect);
    conn.send(conn.transport().as_str().as_bytes()).unwrap();
    expect_eos(&mut conn);
}

fn transport_client(client: &Client, name: &'static str) {
    let mut conn = client.connect(name);
    let theirs = conn.recv_vec().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&theirs),
        client.expect,
        "server's transport"
    );
    assert_eq!(
        conn.transport().as_str(),
        client.expect,
        "client's transport"
    );
    conn.close().unwrap();
}

fn echo_server(_: &mut Server, mut conn: Connection) {
    let m = conn.recv_vec().unwrap();
    conn.send(&m).unwrap();
    expect_eos(&mut conn);
}

fn echo_client(client: &Client, name: &'static str) {
    let mut conn = client.connect(name);
    conn.send(b"ping").unwrap();
    assert_eq!(conn.recv_vec().unwrap(), b"ping");
    conn.close().unwrap();
}

const MILLION: u64 = 1_000_000;

fn million_len(seq: u64) -> usize {
    12 + (seq % 53) as usize
}

/// Every message is checked (sequence number, length, checksum); the count goes back.
fn million_server(_: &mut Server, mut conn: Connection) {
    for seq in 0..MILLION {
        let m = conn.recv_ref().unwrap();
        verify(seq, million_len(seq), &m.bytes().to_vec());
    }
    conn.send(&MILLION.to_le_bytes()).unwrap();
    expect_eos(&mut conn);
}

fn million_client(client: &Client, name: &'static str) {
    let mut conn = client.connect(name);
    for seq in 0..MILLION {
        conn.send(&payload(seq, million_len(seq))).unwrap();
    }
    assert_eq!(recv_u64(&mut conn), MILLION, "messages the server verified");
    conn.close().unwrap();
}

const SIZES: &[usize] = &[1, 64, 4096, 1 << 20, 64 << 20];

/// Each size arrives whole (checked by the server) and comes back whole.
fn sizes_server(_: &mut Server, mut conn: Connection) {
    for (seq, &len) in SIZES.iter().enumerate() {
        let m = conn.recv_vec().unwrap();
        check_bulk(seq as u64, len, &m);
        conn.send(&m).unwrap();
    }
    expect_eos(&mut conn);
}

fn sizes_client(client: &Client, name: &'static str) {
    let mut conn = client.connect(name);
    for (seq, &len) in SIZES.iter().enumerate() {
        conn.send(&bulk(seq as u64, len)).unwrap();
        check_bulk(seq as u64, len, &conn.recv_vec().unwrap());
    }
    conn.close().unwrap();
}

fn zero_length_server(_: &mut Server, mut conn: Connection) {
    assert_eq!(conn.recv_vec().unwrap(), b"");
    assert_eq!(conn.recv_vec().unwrap(), b"x");
    let mut buf = [0u8; 4];
    assert_eq!(conn.recv(&mut buf).unwrap(), 0);
    expect_eos(&mut conn);
}

fn zero_length_client(client: &Client, name: &'static str) {
    let mut conn = client.connect(name);
    conn.send(b"").unwrap();
    conn.send(b"x").unwrap();
    conn.send(b"").unwrap();
    conn.close().unwrap();
}

const FILL_LEN: usize = 1000;
/// The second connection of the would-block case, which carries the go-ahead.
const GO: &str = "nonblocking_sender_gets_would_block_and_loses_nothing/go";

/// Reads nothing until the client, whose non-blocking sends filled the connection, says
/// on a second connection how many it sent; then every one of them must arrive.
fn would_block_server(server: &mut Server, mut conn: Connection) {
    let mut go = server.accept_named(GO);
    let sent = recv_u64(&mut go);
    for seq in 0..sent {
        verify(seq, FILL_LEN, &conn.recv_vec().unwrap());
    }
    expect_eos(&mut conn);
    go.send(&sent.to_le_bytes()).unwrap();
    expect_eos(&mut go);
}

fn would_block_client(client: &Client, name: &'static str) {
    let opts = client.transport.opts(Role::Client).ring_size(64 << 10);
    let mut conn = client.connect_with(name, opts);
    conn.set_nonblocking(true);
    let mut sent = 0u64;
    loop {
        match conn.send(&payload(sent, FILL_LEN)) {
            Ok(()) => sent += 1,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("non-blocking send {sent}: {e}"),
        }
        assert!(sent < 10_000_000, "the sender never saw WouldBlock");
    }
    assert!(sent > 0, "WouldBlock before anything was sent");
    let mut go = client.connect(GO);
    go.send(&sent.to_le_bytes()).unwrap();
    // `close` hands over what the full buffers could not take yet; the server reads now.
    conn.close().unwrap();
    assert_eq!(recv_u64(&mut go), sent, "messages the server received");
    go.close().unwrap();
}

const CLOSE_MSGS: u64 = 1000;
const CLOSE_LEN: usize = 100;
const CLOSE_TAIL: usize = 3 << 20;

fn send_then_close(mut conn: Connection) {
    for seq in 0..CLOSE_MSGS {
        conn.send(&payload(seq, CLOSE_LEN)).unwrap();
    }
    conn.send(&bulk(CLOSE_MSGS, CLOSE_TAIL)).unwrap();
    conn.close().unwrap();
}

fn read_all_then_eos(conn: &mut Connection) {
    for seq in 0..CLOSE_MSGS {
        verify(seq, CLOSE_LEN, &conn.recv_vec().unwrap());
    }
    check_bulk(CLOSE_MSGS, CLOSE_TAIL, &conn.recv_vec().unwrap());
    expect_eos(conn);
    expect_eos(conn);
}

/// The client closes right after sending: everything arrives, then end-of-stream; and
/// sending to the closed peer fails, it does not vanish silently forever.
fn client_close_server(_: &mut Server, mut conn: Connection) {
    read_all_then_eos(&mut conn);
    let err = (0..100_000)
        .find_map(|i| conn.send(&payload(i, 1024)).err())
        .expect("sends to a closed peer must fail once buffers are full");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
}

fn client_close_client(client: &Client, name: &'static str) {
    send_then_close(client.connect(name));
}

fn server_close_server(_: &mut Server, conn: Connection) {
    send_then_close(conn);
}

fn server_close_client(client: &Client, name: &'static str) {
    let mut conn = client.connect(name);
    read_all_then_eos(&mut conn);
}

const ZC_SIZES: [usize; 3] = [64, 100_000, 5 << 20];

/// Writes each size in place with reserve/commit (a reservation dropped uncommitted
/// sends nothing), then `after`.
fn send_in_place(conn: &mut Connection) {
    for (seq, len) in ZC_SIZES.into_iter().enumerate() {
        let mut buf = conn.reserve(len).unwrap();
        assert_eq!(buf.len(), len);
        buf.copy_from_slice(&bulk(seq as u64, len));
        buf.commit().unwrap();
    }
    drop(conn.reserve(10).unwrap());
    conn.send(b"after").unwrap();
}

/// Reads what [`send_in_place`] sent, in place with `recv_ref`.
fn recv_in_place(conn: &mut Connection) {
    for (seq, len) in ZC_SIZES.into_iter().enumerate() {
        check_bulk(seq as u64, len, &conn.recv_ref().unwrap().bytes().to_vec());
    }
    assert_eq!(conn.recv_ref().unwrap().bytes().to_vec(), b"after");
}

/// Zero-copy both ways: the client writes in place, the server reads in place, then the
/// other way round.
fn zero_copy_server(_: &mut Server, mut conn: Connection) {
    recv_in_place(&mut conn);
    send_in_place(&mut conn);
    expect_eos(&mut conn);
}

fn zero_copy_client(client: &Client, name: &'static str) {
    let mut conn = client.connect(name);
    send_in_place(&mut conn);
    recv_in_place(&mut conn);
    conn.close().unwrap();
}

fn encode_counters(c: shmlink::Counters) -> Vec<u8> {
    [c.msgs_in, c.bytes_in, c.msgs_out, c.bytes_out]
        .iter()
        .flat_map(|n| n.to_le_bytes())
        .collect()
}

fn check_addresses(conn: &Connection, expect: &str) {
    let prefix = format!("{expect}:");
    assert!(conn.local_addr().starts_with(&prefix), "{conn:?}");
    assert!(conn.peer_addr().starts_with(&prefix), "{conn:?}");
}

/// Both ends count the same messages and bytes (the case's name included), and their
/// addresses name the expected transport.
fn counters_server(server: &mut Server, mut conn: Connection) {
    conn.recv_vec().unwrap();
    conn.recv_vec().unwrap();
    check_addresses(&conn, &server.expect);
    conn.send(&encode_counters(conn.counters())).unwrap();
    expect_eos(&mut conn);
}

fn counters_client(client: &Client, name: &'static str) {
    let mut conn = client.connect(name);
    conn.send(&[0u8; 10]).unwrap();
    conn.send(&[0u8; 20]).unwrap();
    let sent = (3, name.len() as u64 + 30);
    let c = conn.counters();
    assert_eq!((c.msgs_out, c.bytes_out), sent, "client's counters");
    let theirs = conn.recv_vec().unwrap();
    let theirs: Vec<u64> = theirs
        .chunks(8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(theirs, [sent.0, sent.1, 0, 0], "server's counters");
    let c = conn.counters();
    assert_eq!((c.msgs_in, c.bytes_in), (1, 32), "client's counters");
    check_addresses(&conn, &client.expect);
    conn.close().unwrap();
}

/// The server's fd is not readable while nothing waits, becomes readable when the client
/// sends, and again when the client goes away.
fn readiness_server(server: &mut Server, mut conn: Connection) {
    conn.set_nonblocking(true);
    assert_eq!(conn.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
    assert!(
        !readable(&conn, Duration::ZERO),
        "readable with nothing to do"
    );
    conn.send(b"idle").unwrap();
    assert!(readable(&conn, WAIT), "not readable after the client sent");
    assert_eq!(conn.recv_vec().unwrap(), b"wake");
    assert_eq!(conn.recv_vec().unwrap_err().kind(), ErrorKind::WouldBlock);
    conn.send(b"got it").unwrap();
    // As an event loop would, tolerating an early wake-up: on `shm:` the client's close
    // rings a doorbell before its control socket closes, and `recv` reports the end of
    // the stream only once the socket's EOF is in, so in between the fd is readable
    // while `recv` says WouldBlock. Counted and printed, not failed.
    let deadline = Instant::now() + WAIT;
    let mut early = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(readable(&conn, left), "not readable after the client left");
        match conn.recv_vec() {
            Err(e) if e.kind() == ErrorKind::EndOfStream => break,
            Err(e) if e.kind() == ErrorKind::WouldBlock => early += 1,
            other => panic!("expected the end of the stream, got {other:?}"),
        }
    }
    if early > 0 {
        let t = &server.expect;
        eprintln!("server ({t}): fd readable {early} time(s) before the end of stream was");
    }
}

fn readiness_client(client: &Client, name: &'static str) {
    let mut conn = client.connect(name);
    assert_eq!(conn.recv_vec().unwrap(), b"idle");
    conn.send(b"wake").unwrap();
    assert_eq!(conn.recv_vec().unwrap(), b"got it");
    drop(conn);
}
