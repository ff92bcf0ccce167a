//! `auto:` across VMs, on the host: two processes that map one region file (what QEMU's
//! ivshmem backing file is) and are told which region to offer by `$SHMLINK_AUTO_VM` play
//! two guests. `$SHMLINK_AUTO_SHM=0` makes the client announce no boot id, so that the
//! same-kernel `shm:` upgrade is out of the way, as it is between two guests. Both ends
//! are child processes (this binary run again as `--ignored --exact child`), since the
//! variables are read by the library in the process that binds or connects.
//!
//! Checked: the upgrade happens when both map the region (and carries messages), it does
//! not without a shared region or with another region's id, hostile negotiation bytes
//! from either side leave the other on TCP or with a clear error, and a third party on
//! the region that presents a wrong or replayed token gets nothing.

mod common;

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use shmlink::{Connection, ErrorKind, Listener, Options};
use shmlink_testkit::AutoMsg;

// A child process (this binary's `child` test) and the lines it prints.
use common::ChildProc as Proc;

const WAIT: Duration = Duration::from_secs(30);
const ROLE: &str = "SHMLINK_VMAUTO_ROLE";
const ADDR: &str = "SHMLINK_VMAUTO_ADDR";

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fresh 16 MiB region file in /dev/shm, removed on drop.
struct RegionFile(PathBuf);

impl RegionFile {
    fn new() -> RegionFile {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let p = PathBuf::from(format!(
            "/dev/shm/shmlink-vmauto-test-{}-{n}",
            std::process::id()
        ));
        let f = common::create_region_file(&p);
        f.set_len(16 << 20).unwrap();
        RegionFile(p)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }

    /// The region id, once the first user wrote it (header: state u32 at 8, id at 16).
    fn id(&self) -> [u8; 16] {
        let f = std::fs::File::open(&self.0).unwrap();
        let start = Instant::now();
        loop {
            let mut st = [0u8; 4];
            f.read_exact_at(&mut st, 8).unwrap();
            if u32::from_le_bytes(st) == 2 {
                let mut id = [0u8; 16];
                f.read_exact_at(&mut id, 16).unwrap();
                return id;
            }
            assert!(start.elapsed() < WAIT, "the region never got an id");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for RegionFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Proc {
    /// Runs this binary as `role` with `env` set.
    fn spawn(role: &str, addr: &str, env: &[(&str, &str)]) -> Proc {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--ignored", "--exact", "child", "--nocapture"])
            .env(ROLE, role)
            .env(ADDR, addr)
            .env_remove("SHMLINK_AUTO_VM")
            .env_remove("SHMLINK_AUTO_SHM");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Proc::start(cmd)
    }
}

/// A server child: an `auto:` listener (told `env`), its address.
fn server(env: &[(&str, &str)]) -> (Proc, String) {
    let p = Proc::spawn("server", "", env);
    let addr = p.line("SERVER ");
    (p, addr)
}

/// A client child's result: "OWN_TRANSPORT SERVER_TRANSPORT", or "ERROR …".
fn client(addr: &str, env: &[(&str, &str)]) -> String {
    let p = Proc::spawn("client", addr, env);
    p.line("CLIENT ")
}

/// A self-checking payload.
fn payload(seq: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seq as usize).wrapping_mul(131).wrapping_add(i * 7) as u8)
        .collect()
}

/// The child roles. `server`: binds `auto:127.0.0.1:0`, prints its address, answers every
/// message of every connection with "TRANSPORT:" and the message, prints "ACCEPTED
/// TRANSPORT" per connection, until stdin closes. `client`: connects, sends messages of
/// 1 B – 1 MiB, checks every answer, prints "CLIENT OWN SERVER" (the transports) or
/// "CLIENT ERROR …".
#[test]
#[ignore = "a child-process role of the vm: auto: tests, run by them"]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    if role == "server" {
        let mut l = Listener::bind("auto:127.0.0.1:0", &Options::default()).unwrap();
        println!("SERVER {}", l.local_addr());
        std::thread::spawn(move || loop {
            let Ok(mut c) = l.accept() else { continue };
            let t = c.transport().as_str();
            println!("ACCEPTED {t}");
            std::thread::spawn(move || {
                while let Ok(m) = c.recv_vec() {
                    let mut answer = format!("{t}:").into_bytes();
                    answer.extend_from_slice(&m);
                    if c.send(&answer).is_err() {
                        break;
                    }
                }
            });
        });
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        return;
    }
    let addr = std::env::var(ADDR).unwrap();
    let o = Options::default().max_msg_size(2 << 20);
    let mut c = match Connection::connect(&addr, &o) {
        Ok(c) => c,
        Err(e) => {
            println!("CLIENT ERROR {:?} {e}", e.kind());
            return;
        }
    };
    let own = c.transport().as_str();
    let mut theirs = String::new();
    for (seq, len) in [1usize, 100, 4096, 65_536, 300_000, 1 << 20]
        .into_iter()
        .cycle()
        .take(60)
        .enumerate()
    {
        let m = payload(seq as u64, len);
        c.send(&m).unwrap();
        let a = c.recv_vec().unwrap();
        let colon = a.iter().position(|&b| b == b':').expect("TRANSPORT:");
        assert_eq!(&a[colon + 1..], &m[..], "answer {seq} differs");
        theirs = String::from_utf8_lossy(&a[..colon]).into_owned();
    }
    println!("CLIENT {own} {theirs}");
}

/// Both map the region: the client announces its id, the listener offers its `vm:`
/// listener, and the connection (both ends) ends up on `vm:`.
#[test]
fn auto_upgrades_to_vm_when_both_map_the_region() {
    let r = RegionFile::new();
    let (s, addr) = server(&[("SHMLINK_AUTO_VM", r.path())]);
    let got = client(
        &addr,
        &[("SHMLINK_AUTO_VM", r.path()), ("SHMLINK_AUTO_SHM", "0")],
    );
    assert_eq!(got, "vm vm");
    assert_eq!(s.line("ACCEPTED "), "vm");
    // A second client the same way, then a client that does not ask: TCP.
    let got = client(
        &addr,
        &[("SHMLINK_AUTO_VM", r.path()), ("SHMLINK_AUTO_SHM", "0")],
    );
    assert_eq!(got, "vm vm");
    assert_eq!(client(&addr, &[("SHMLINK_AUTO_SHM", "0")]), "tcp tcp");
}

/// No shared region: a listener without one, or a client without one → TCP.
#[test]
fn auto_stays_on_tcp_without_a_shared_region() {
    let r = RegionFile::new();
    let (_s, addr) = server(&[]);
    let got = client(
        &addr,
        &[("SHMLINK_AUTO_VM", r.path()), ("SHMLINK_AUTO_SHM", "0")],
    );
    assert_eq!(got, "tcp tcp");
    let (_s2, addr2) = server(&[("SHMLINK_AUTO_VM", r.path())]);
    assert_eq!(client(&addr2, &[("SHMLINK_AUTO_SHM", "0")]), "tcp tcp");
    // A region the client cannot map (missing file): it just asks for nothing.
    let got = client(
        &addr2,
        &[
            ("SHMLINK_AUTO_VM", "/dev/shm/shmlink-vmauto-no-such-region"),
            ("SHMLINK_AUTO_SHM", "0"),
        ],
    );
    assert_eq!(got, "tcp tcp");
    // Same kernel without the knob: the shm: upgrade still wins over vm:.
    assert_eq!(client(&addr2, &[("SHMLINK_AUTO_VM", r.path())]), "shm shm");
}

/// Two regions (two ids): no upgrade.
#[test]
fn auto_stays_on_tcp_when_the_region_ids_differ() {
    let (r1, r2) = (RegionFile::new(), RegionFile::new());
    let (_s, addr) = server(&[("SHMLINK_AUTO_VM", r1.path())]);
    let got = client(
        &addr,
        &[("SHMLINK_AUTO_VM", r2.path()), ("SHMLINK_AUTO_SHM", "0")],
    );
    assert_eq!(got, "tcp tcp");
    assert_ne!(r1.id(), r2.id());
}

fn tcp_of(addr: &str) -> String {
    addr.replacen("auto:", "tcp:", 1)
}

/// Receives within [`WAIT`] on a `vm:` connection, or the error.
fn recv_within(c: &mut Connection) -> Result<Vec<u8>, ErrorKind> {
    c.set_nonblocking(true);
    let deadline = Instant::now() + WAIT;
    loop {
        match c.recv_vec() {
            Ok(m) => return Ok(m),
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            Err(e) => return Err(e.kind()),
        }
    }
}

/// The listener's side against hostile clients: a wrong region id, malformed hellos, a
/// third party on the region presenting a wrong or replayed token; it goes on serving.
#[test]
fn hostile_clients_and_third_parties_get_nothing() {
    let r = RegionFile::new();
    let (s, addr) = server(&[("SHMLINK_AUTO_VM", r.path())]);
    let id = r.id();
    let o = Options::default();
    // Another id: told why, stays on TCP.
    let mut c = Connection::connect(&tcp_of(&addr), &o).unwrap();
    let hello = AutoMsg::HelloVm {
        boot_id: vec![],
        region: [7; 16],
    };
    c.send(&hello.encode()).unwrap();
    match AutoMsg::decode(&c.recv_vec().unwrap()).unwrap() {
        AutoMsg::NoOffer { reason } => {
            assert!(reason.contains("another vm: region"), "{reason}")
        }
        other => panic!("expected no offer, got {other:?}"),
    }
    // Malformed hellos (truncated, trailing bytes, huge length): the connection is
    // dropped, nothing else happens.
    let good = AutoMsg::HelloVm {
        boot_id: vec![],
        region: id,
    }
    .encode();
    let mut trailing = good.clone();
    trailing.push(0);
    let mut huge = good.clone();
    huge[12] = 0xff;
    huge[13] = 0xff;
    for bad in [
        &good[..good.len() - 3],
        &trailing[..],
        &huge[..],
        b"SHMLAUTO",
    ] {
        let mut c = Connection::connect(&tcp_of(&addr), &o).unwrap();
        c.send(bad).unwrap();
        assert!(c.recv_vec().is_err(), "{bad:?} was answered");
    }
    // The right id: an offer. A third party on the region presents a wrong token and
    // garbage: each of its connections is closed without the proof.
    let mut c = Connection::connect(&tcp_of(&addr), &o).unwrap();
    c.send(&good).unwrap();
    let (token, proof, name) = match AutoMsg::decode(&c.recv_vec().unwrap()).unwrap() {
        AutoMsg::VmOffer { token, proof, name } => (token, proof, name),
        other => panic!("expected a vm offer, got {other:?}"),
    };
    let vm_addr = format!("vm:{name}@{}", r.path());
    for bad in [&[0u8; 16][..], b"xyz", &[token, token].concat()[..]] {
        let mut third = Connection::connect(&vm_addr, &o).unwrap();
        third.send(bad).unwrap();
        assert!(recv_within(&mut third).is_err(), "{bad:?} got an answer");
    }
    // The client the offer went to: the proof, then the connection is the application's.
    let mut v = Connection::connect(&vm_addr, &o).unwrap();
    v.send(&token).unwrap();
    assert_eq!(recv_within(&mut v).unwrap(), proof);
    c.send(&AutoMsg::Decision { upgraded: true }.encode())
        .unwrap();
    v.send(b"hello").unwrap();
    assert_eq!(recv_within(&mut v).unwrap(), b"vm:hello");
    // The first client (another id) was handed out on TCP, the malformed ones never.
    assert_eq!(s.line("ACCEPTED "), "tcp");
    assert_eq!(s.line("ACCEPTED "), "vm");
    // Replaying the token gets nothing.
    let mut replay = Connection::connect(&vm_addr, &o).unwrap();
    replay.send(&token).unwrap();
    assert!(recv_within(&mut replay).is_err());
    // The listener still serves real clients.
    let got = client(
        &addr,
        &[("SHMLINK_AUTO_VM", r.path()), ("SHMLINK_AUTO_SHM", "0")],
    );
    assert_eq!(got, "vm vm");
}

/// Serves one connection like the server child answers on TCP (`tcp:` + message).
fn answer_as_tcp(mut c: Connection) {
    while let Ok(m) = c.recv_vec() {
        let mut a = b"tcp:".to_vec();
        a.extend_from_slice(&m);
        if c.send(&a).is_err() {
            break;
        }
    }
}

/// The client's side against a hostile listener: an offer of a name nobody serves, a
/// `vm:` listener that does not know the proof (another process on the region posing as
/// the listener), garbage instead of an answer.
#[test]
fn hostile_listeners_leave_the_client_on_tcp_or_with_a_clear_error() {
    let r = RegionFile::new();
    let o = Options::default();
    let mut tcp = Listener::bind("tcp:127.0.0.1:0", &o).unwrap();
    let addr = tcp.local_addr().replacen("tcp:", "auto:", 1);
    let env = [("SHMLINK_AUTO_VM", r.path()), ("SHMLINK_AUTO_SHM", "0")];
    let mut impostor = Listener::bind(&format!("vm:impostor@{}", r.path()), &o).unwrap();
    for case in ["nobody", "impostor", "garbage", "kind"] {
        let p = Proc::spawn("client", &addr, &env);
        let mut c = tcp.accept().unwrap();
        let hello = AutoMsg::decode(&c.recv_vec().unwrap()).unwrap();
        assert!(matches!(hello, AutoMsg::HelloVm { .. }), "{hello:?}");
        let offer = |name: &str| AutoMsg::VmOffer {
            token: [1; 16],
            proof: [2; 16],
            name: name.into(),
        };
        match case {
            "nobody" => c.send(&offer("nobody-here").encode()).unwrap(),
            "impostor" => {
                c.send(&offer("impostor").encode()).unwrap();
                let mut v = impostor.accept().unwrap();
                assert_eq!(v.recv_vec().unwrap(), [1; 16]);
                v.send(&[9; 16]).unwrap(); // not the proof
                let _ = v.recv_vec();
            }
            "garbage" => c.send(b"SHMLAUTO\x02\x00\x06\x00\x01").unwrap(),
            _ => c.send(b"SHMLAUTO\x02\x00\x63\x00").unwrap(),
        }
        if case == "nobody" || case == "impostor" {
            let d = AutoMsg::decode(&c.recv_vec().unwrap()).unwrap();
            assert_eq!(d, AutoMsg::Decision { upgraded: false }, "{case}");
            std::thread::spawn(move || answer_as_tcp(c));
            assert_eq!(p.line("CLIENT "), "tcp tcp", "{case}");
        } else {
            let got = p.line("CLIENT ");
            assert!(
                got.starts_with("ERROR ProtocolViolation") && got.contains("auto: negotiation"),
                "{case}: {got}"
            );
        }
    }
}
