//! The claim protocol's messages (claims, queries, the one-byte answers) and timeouts,
//! the names and socket files registrations use in the rendezvous directory, and the
//! shmlink options of every connection the preload makes.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use shmlink::{Connection, ErrorKind, Options};

use super::addr::{netns, Endpoint, Key};
use crate::{config, debug, real};

/// A claim: magic, version, then the server's and the client's address (16-byte IPv6,
/// IPv4 mapped) and port (big-endian), as the client sees them.
const MAGIC: &[u8; 4] = b"SLPC";
const VERSION: u8 = 1;
pub(crate) const CLAIM_LEN: usize = 4 + 1 + 2 * (16 + 2);
pub(crate) const YES: u8 = 1;
pub(crate) const NO: u8 = 0;
/// The helper's first message: it counts the claim as in flight (the server's `accept`
/// now waits for it), so the client may make its TCP connection.
pub(crate) const READY: u8 = 2;
/// The answer to a claim on a shared listening socket: "the process that accepted your
/// TCP connection waits at shmlink address NAME" (the rest of the message).
pub(crate) const GO: u8 = 3;
/// A query, from a process that accepted a TCP connection on a listening socket it
/// shares with the registering process (fork, SO_REUSEPORT): magic, version, the key,
/// then the shmlink name where it waits for the client.
const QMAGIC: &[u8; 4] = b"SLPQ";
/// On a shared socket the answer comes at accept time, when the client may be giving up
/// (its [`ANSWER_TIMEOUT`]): the accepting process answers CONFIRM and commits only once
/// the client answers CONFIRMED (a client that gave up closed the connection instead).
pub(crate) const CONFIRM: u8 = 4;
pub(crate) const CONFIRMED: u8 = 5;
/// How long the accepting process waits for CONFIRMED (the client answers at once; a
/// client that gave up closes, which ends the wait sooner).
const CONFIRM_WAIT: Duration = Duration::from_secs(10);

/// How long a client waits for its claim's answer before staying on TCP.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the server remembers a TCP connection it accepted as plain TCP (longer than
/// any client waits for an answer).
pub(crate) const DECIDED_TTL: Duration = Duration::from_secs(10);
/// How long the helper waits for a client's claim after its handshake (the client makes
/// its TCP connection in between).
pub(crate) const CLAIM_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `accept` waits for claims in flight before taking a connection as plain TCP.
pub(crate) const ACCEPT_WAIT: Duration = Duration::from_secs(1);

/// The shmlink name a listener on `ep` registers under (`shm:NAME`).
pub(crate) fn reg_name(ep: &Endpoint) -> String {
    let ip: String = ep.ip.iter().map(|b| format!("{b:02x}")).collect();
    format!("tcp-{:x}-{ip}-{}", netns(), ep.port)
}

/// The socket file of `reg_name(ep)` in the rendezvous directory.
pub(crate) fn reg_path(ep: &Endpoint) -> PathBuf {
    shmlink::rendezvous_dir().join(format!("{}.sock", reg_name(ep)))
}

pub(crate) fn options() -> Options {
    // Never in-process: a program's sockets outlive fork and exec (descriptors a child
    // inherits), which only the kernel path's shared memory and socket carry. Nothing made
    // ahead either: a segment kept between connections is a descriptor the program does
    // not know of, and may close (sockcheck's scenario 14 closes every fd it did not open).
    let policy = &config().policy;
    let opts = Options::default()
        .in_process(false)
        .prepare_ahead(false)
        .ring_size(config().ring_size)
        .connect_timeout(Duration::from_secs(1))
        .handshake_timeout(Duration::from_secs(1))
        // The cross-uid policy (docs/transparent.md, "Across users"): a registration
        // admits these client uids and gids (its socket file is then 0666 and
        // SO_PEERCRED the gate); a client trusts registrations bound by these uids.
        .allow_uids(policy.allow_uids.iter().copied())
        .allow_gids(policy.allow_gids.iter().copied())
        .expect_uids(policy.expect_uids.iter().copied());
    if policy.allows_others() {
        // A directory this process makes lets the allowed users reach the socket files
        // they know the names of (not list or write it).
        opts.rendezvous_dir_mode(0o711)
    } else {
        opts
    }
}

/// A query: the claim's encoding under [`QMAGIC`], then the name where the accepting
/// process waits.
pub(crate) fn encode_query(key: &Key, name: &str) -> Vec<u8> {
    let mut v = encode_claim(&key.0, &key.1);
    v[..4].copy_from_slice(QMAGIC);
    v.extend_from_slice(name.as_bytes());
    v
}

/// A shmlink name as this library makes them (untrusted input: checked).
pub(crate) fn valid_name(b: &[u8]) -> Option<String> {
    let ok = !b.is_empty()
        && b.len() <= 200
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_./".contains(c))
        && !b.windows(2).any(|w| w == b"..");
    ok.then(|| String::from_utf8_lossy(b).into_owned())
}

pub(crate) fn decode_query(msg: &[u8]) -> Option<(Key, String)> {
    if msg.len() <= CLAIM_LEN || &msg[..4] != QMAGIC {
        return None;
    }
    let mut claim = msg[..CLAIM_LEN].to_vec();
    claim[..4].copy_from_slice(MAGIC);
    Some((decode_claim(&claim)?, valid_name(&msg[CLAIM_LEN..])?))
}

pub(crate) fn encode_claim(server: &Endpoint, client: &Endpoint) -> Vec<u8> {
    let mut v = Vec::with_capacity(CLAIM_LEN);
    v.extend_from_slice(MAGIC);
    v.push(VERSION);
    for ep in [server, client] {
        v.extend_from_slice(&ep.ip);
        v.extend_from_slice(&ep.port.to_be_bytes());
    }
    v
}

pub(crate) fn decode_claim(msg: &[u8]) -> Option<Key> {
    if msg.len() != CLAIM_LEN || &msg[..4] != MAGIC || msg[4] != VERSION {
        return None;
    }
    let ep = |b: &[u8]| Endpoint {
        ip: b[..16].try_into().expect("16 bytes"),
        port: u16::from_be_bytes([b[16], b[17]]),
    };
    Some((ep(&msg[5..23]), ep(&msg[23..41])))
}

/// This process's effective uid, for messages.
pub(crate) fn shmlink_euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// One message from a non-blocking `conn` within `timeout`; empty on timeout or error.
pub(crate) fn receive(conn: &mut Connection, timeout: Duration) -> Vec<u8> {
    let deadline = Instant::now() + timeout;
    loop {
        match conn.recv_vec() {
            Ok(m) => return m,
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                real::poll_one(conn.as_raw_fd(), libc::POLLIN, 50);
            }
            Err(_) => return Vec::new(),
        }
    }
}

/// The accepting process's yes on a shared socket: CONFIRM, then the client's CONFIRMED
/// (or its close: it gave up, the connection stays TCP).
pub(crate) fn confirm(mut conn: Connection, key: Key) -> Option<Connection> {
    if conn.send(&[CONFIRM]).is_err() {
        debug!("accept {} <- {}: claim dropped; stays TCP", key.0, key.1);
        return None;
    }
    if receive(&mut conn, CONFIRM_WAIT) == [CONFIRMED] {
        debug!("claim {} <- {}: yes (accepted here)", key.0, key.1);
        return Some(conn);
    }
    debug!(
        "accept {} <- {}: the client gave up; stays TCP",
        key.0, key.1
    );
    None
}
