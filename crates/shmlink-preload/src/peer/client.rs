//! The connecting side: before a TCP `connect`, find and open the registration of the
//! listener it may reach ([`open`]); after it, claim the TCP connection ([`claim`]).

use std::net::Ipv4Addr;
use std::os::fd::RawFd;

use shmlink::{Connection, ErrorKind};

use super::addr::{sock_endpoint, Endpoint};
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

/// Before the TCP `connect` to `server`: opens a claim connection to the listener
/// registered for it, if there is one (one `stat` per candidate when there is none).
/// Opening it first tells the server a claim is coming, so its `accept` waits for it.
pub(crate) fn open(server: &Endpoint) -> Option<Connection> {
    for addr in candidates(server) {
        match Connection::connect(&addr, &options()) {
            Ok(mut c) => {
                c.set_nonblocking(true);
                if receive(&mut c, ANSWER_TIMEOUT) == [READY] {
                    return Some(c);
                }
                debug!("connect {server}: registration {addr} did not get ready");
                return None;
            }
            Err(e) if e.kind() == ErrorKind::PermissionDenied => debug!(
                "connect {server}: registration {addr} refused ({e}); plain TCP. Across \
                 users, the server's side allows this uid ({}) with `shmlink run \
                 --allow-uid`, this side trusts the server's uid with `--expect-uid` \
                 (docs/transparent.md, \"Across users\")",
                shmlink_euid()
            ),
            Err(e) => debug!("connect {server}: registration {addr} unusable ({e})"),
        }
    }
    None
}

/// After the TCP `connect` of `fd` succeeded: claims it over `conn` (from [`open`]).
/// Returns the connection that replaces it if the listener said yes, else `None`
/// (stay on TCP).
pub(crate) fn claim(mut conn: Connection, fd: RawFd) -> Option<(Connection, Endpoint, Endpoint)> {
    let server = sock_endpoint(fd, true)?;
    let client = sock_endpoint(fd, false)?;
    // Only a destination on this kernel can be a preloaded listener here: loopback, or
    // one of our own addresses (the kernel then picks it as the source too).
    if !(server.is_loopback() || server.ip == client.ip) {
        return None;
    }
    let claim = encode_claim(&server, &client);
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
