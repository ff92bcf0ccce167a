//! The connecting side: before a TCP `connect`, find and open the registration of the
//! listener it may reach ([`open`]); after it, claim the TCP connection ([`claim`]).

use std::net::Ipv4Addr;
use std::os::fd::RawFd;

use shmlink::{Connection, ErrorKind};

use super::addr::{netns, sock_endpoint, Endpoint};
use super::wire::{
    encode_claim, options, receive, reg_name, reg_path, shmlink_euid, valid_name, ANSWER_TIMEOUT,
    CONFIRM, CONFIRMED, GO, READY, YES,
};
use crate::debug;

/// Where a listener that a connection to `server` may have reached would register, the
/// ones that exist: the exact address, then the wildcards.
pub(crate) fn candidates(server: &Endpoint) -> Vec<String> {
    let mut eps = vec![*server];
    if server.is_v4() {
        eps.push(Endpoint {
            ip: Ipv4Addr::UNSPECIFIED.to_ipv6_mapped().octets(),
            port: server.port,
        });
    }
    eps.push(Endpoint {
        ip: [0; 16],
        port: server.port,
    });
    let mut said = false;
    eps.iter()
        .filter(|ep| match std::fs::symlink_metadata(reg_path(ep)) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && !said => {
                // Not silent: a server of another uid made the directory for itself.
                said = true;
                debug!(
                    "connect {server}: cannot look for a registration in {} ({e}): a \
                     server of another uid must allow uid {} with `shmlink run --allow-uid` \
                     (docs/transparent.md, \"Across users\"); plain TCP",
                    shmlink::rendezvous_dir().display(),
                    shmlink_euid()
                );
                false
            }
            Err(_) => false,
        })
        .map(|ep| format!("shm:{}", reg_name(ep)))
        .collect()
}

/// The registrations of `server`'s port in other network namespaces of the rendezvous
/// directory (its address, or a wildcard), at most [`MAX_FOREIGN`]: where a container of
/// its own network namespace that shares the directory may listen (docs/containers.md,
/// "Transparent mode between containers"). One directory listing, done only when this
/// namespace has no registration for a destination that is not loopback.
fn foreign_candidates(server: &Endpoint) -> Vec<String> {
    let own = format!("tcp-{:x}-", netns());
    let mut ips = vec![server.ip, [0; 16]];
    if server.is_v4() {
        ips.push(Ipv4Addr::UNSPECIFIED.to_ipv6_mapped().octets());
    }
    let tails: Vec<String> = ips
        .iter()
        .map(|ip| {
            let hex: String = ip.iter().map(|b| format!("{b:02x}")).collect();
            format!("-{hex}-{}.sock", server.port)
        })
        .collect();
    let Ok(dir) = std::fs::read_dir(shmlink::rendezvous_dir()) else {
        return Vec::new();
    };
    let mut found: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("tcp-") && !n.starts_with(&own))
        .filter(|n| tails.iter().any(|t| n.ends_with(t.as_str())))
        .filter_map(|n| Some(format!("shm:{}", n.strip_suffix(".sock")?)))
        .collect();
    found.sort();
    found.truncate(MAX_FOREIGN);
    found
}

/// The most registrations in other network namespaces a connect asks.
const MAX_FOREIGN: usize = 16;

/// The claim connections a `connect` opened before its TCP connect.
pub(crate) struct Intent {
    conns: Vec<Connection>,
    /// To registrations of other network namespaces (see [`claim`]).
    foreign: bool,
}

/// Opens a claim connection to `addr` (a registration) and waits for its READY: `Err`
/// when it could not connect (the next candidate may do), `Ok(None)` when the helper did
/// not get ready.
fn open_one(server: &Endpoint, addr: &str) -> Result<Option<Connection>, ()> {
    match Connection::connect(addr, &options()) {
        Ok(mut c) => {
            c.set_nonblocking(true);
            if receive(&mut c, ANSWER_TIMEOUT) == [READY] {
                return Ok(Some(c));
            }
            debug!("connect {server}: registration {addr} did not get ready");
            Ok(None)
        }
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            debug!(
                "connect {server}: registration {addr} refused ({e}); plain TCP. Across \
                 users, the server's side allows this uid ({}) with `shmlink run \
                 --allow-uid`, this side trusts the server's uid with `--expect-uid` \
                 (docs/transparent.md, \"Across users\")",
                shmlink_euid()
            );
            Err(())
        }
        Err(e) => {
            debug!("connect {server}: registration {addr} unusable ({e})");
            Err(())
        }
    }
}

/// Before the TCP `connect` to `server`: opens a claim connection to the listener
/// registered for it in this network namespace, if there is one (one `stat` per
/// candidate when there is none). Opening it first tells the server a claim is coming,
/// so its `accept` waits for it. Without one, for a destination that is not loopback:
/// one to each registration of the port in other network namespaces (containers sharing
/// the rendezvous directory); [`claim`] finds out which one the TCP connection reached.
pub(crate) fn open(server: &Endpoint) -> Option<Intent> {
    let local = candidates(server);
    if !local.is_empty() {
        // The first that takes the connection (the exact address before the wildcards).
        for addr in &local {
            if let Ok(c) = open_one(server, addr) {
                return c.map(|c| Intent {
                    conns: vec![c],
                    foreign: false,
                });
            }
        }
        return None;
    }
    if server.is_loopback() {
        return None;
    }
    let conns: Vec<Connection> = foreign_candidates(server)
        .iter()
        .filter_map(|addr| open_one(server, addr).ok().flatten())
        .collect();
    (!conns.is_empty()).then_some(Intent {
        conns,
        foreign: true,
    })
}

/// After the TCP `connect` of `fd` succeeded: claims it over `conn` (from [`open`]).
/// Returns the connection that replaces it if the listener said yes, else `None`
/// (stay on TCP).
pub(crate) fn claim(intent: Intent, fd: RawFd) -> Option<(Connection, Endpoint, Endpoint)> {
    let server = sock_endpoint(fd, true)?;
    let client = sock_endpoint(fd, false)?;
    let claim = encode_claim(&server, &client);
    if intent.foreign {
        return claim_foreign(intent.conns, &claim, server, client);
    }
    let mut conn = intent.conns.into_iter().next()?;
    // Only a destination on this kernel can be a preloaded listener here: loopback, or
    // one of our own addresses (the kernel then picks it as the source too).
    if !(server.is_loopback() || server.ip == client.ip) {
        return None;
    }
    conn.send(&claim).ok()?;
    let answer = receive(&mut conn, ANSWER_TIMEOUT);
    if answer == [YES] {
        return Some((conn, client, server));
    }
    if answer == [CONFIRM] {
        conn.send(&[CONFIRMED]).ok()?;
        return Some((conn, client, server));
    }
    if answer.first() == Some(&GO) {
        // A shared listening socket: the process that accepted our TCP connection
        // waits for us at its own address.
        let name = valid_name(&answer[1..])?;
        let mut c = match Connection::connect(&format!("shm:{name}"), &options()) {
            Ok(c) => c,
            Err(e) => {
                debug!("connect {server}: accepting process unreachable ({e}); plain TCP");
                return None;
            }
        };
        c.set_nonblocking(true);
        c.send(&claim).ok()?;
        if receive(&mut c, ANSWER_TIMEOUT) == [CONFIRM] && c.send(&[CONFIRMED]).is_ok() {
            debug!("connect {server}: claim taken by the accepting process ({name})");
            return Some((c, client, server));
        }
        debug!("connect {server}: the accepting process did not confirm; plain TCP");
        return None;
    }
    debug!("connect {server}: claim refused; plain TCP");
    None
}

/// [`claim`] across network namespaces: the same claim to every registration [`open`]
/// reached. A server says yes only if its own network namespace holds a TCP connection
/// with exactly these four addresses (`/proc/net/tcp`: only the namespace the
/// connection reached can), and only to a client of its own uid (or root: the socket of
/// a client in another namespace cannot be checked for its owner). Exactly one yes: that
/// one; none, or more than one (namespaces with the same addresses): TCP, every claim
/// connection closed (a server that said yes finds it closed at `accept`: TCP there
/// too).
fn claim_foreign(
    conns: Vec<Connection>,
    claim: &[u8],
    server: Endpoint,
    client: Endpoint,
) -> Option<(Connection, Endpoint, Endpoint)> {
    let mut sent: Vec<Connection> = conns
        .into_iter()
        .filter_map(|mut c| c.send(claim).is_ok().then_some(c))
        .collect();
    let mut yes: Vec<Connection> = Vec::new();
    for mut c in sent.drain(..) {
        if receive(&mut c, ANSWER_TIMEOUT) == [YES] {
            yes.push(c);
        }
    }
    match yes.len() {
        1 => {
            debug!("connect {server}: claimed in another network namespace");
            yes.pop().map(|c| (c, client, server))
        }
        0 => {
            debug!(
                "connect {server}: no registration of another network namespace holds \
                 {client} -> {server}; plain TCP"
            );
            None
        }
        n => {
            debug!(
                "connect {server}: {n} network namespaces hold {client} -> {server} \
                 (overlapping addresses); plain TCP"
            );
            None
        }
    }
}
