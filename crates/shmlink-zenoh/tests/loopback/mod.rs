//! Two Zenoh peers in one process over loopback, and numbered messages: what the
//! one-process tests (`exporting.rs`, `importing.rs`) share. No namespaces, no root.

use std::net::TcpListener;
use std::path::PathBuf;

use zenoh::Wait;

fn session(key: &str, endpoint: &str) -> zenoh::Session {
    let mut c = zenoh::Config::default();
    for (k, v) in [
        ("mode", "\"peer\"".to_string()),
        (key, format!("[{endpoint:?}]")),
        ("scouting/multicast/enabled", "false".into()),
        ("scouting/gossip/enabled", "false".into()),
    ] {
        c.insert_json5(k, &v).expect("zenoh configuration");
    }
    zenoh::open(c).wait().expect("open a Zenoh session")
}

/// A private rendezvous directory `shz-NAME-PID` (set as `SHMLINK_DIR`: call it from a
/// binary's only test, so no other thread reads the environment meanwhile) and two
/// peers, the first listening on a free loopback port, the second connecting to it.
pub fn pair(name: &str) -> (PathBuf, zenoh::Session, zenoh::Session) {
    let dir = std::env::temp_dir().join(format!("shz-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::set_var("SHMLINK_DIR", &dir);
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("tcp/127.0.0.1:{port}");
    let a = session("listen/endpoints", &endpoint);
    let b = session("connect/endpoints", &endpoint);
    (dir, a, b)
}

/// Message `n` of `len` bytes (at least 8): its number, then a fill byte.
pub fn msg(n: u64, len: usize) -> Vec<u8> {
    let mut m = n.to_le_bytes().to_vec();
    m.resize(len, n as u8);
    m
}

/// The number of a message made by [`msg`], checked whole.
pub fn number(m: &[u8]) -> u64 {
    let n = u64::from_le_bytes(m[..8].try_into().unwrap());
    assert_eq!(m, msg(n, m.len()), "message {n} intact");
    n
}
