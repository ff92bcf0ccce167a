//! Who can read, write and serve a `vm:` region on the host (issue 31, security review 2,
//! findings 1–5): region files planted by another user or reached through a symbolic
//! link are refused with the reason; a region `vm-host` creates is owner-only; a doorbell
//! server of another uid, or one that hands out more descriptors than a region needs, is
//! refused; a `reserve`d send buffer is the sender's own, whatever another mapping of the
//! region writes; and an `auto:` connection asked for TLS stays on TLS unless the region
//! is declared private.
//!
//! Tests that play another user need root (skipped visibly otherwise, tag `root`); the
//! other user is `nobody` (65534), run as a child process: this binary again
//! (`--ignored --exact child`) with the role in `SHMLINK_VMTRUST_ROLE`.

mod common;

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use shmlink::{Connection, ErrorKind, Listener, Options};
use shmlink_testkit::bell_stats;
use shmlink_vmhost::VmHost;

use common::{ChildProc, VmPaths as Paths};

const NOBODY: u32 = 65534;
const ROLE: &str = "SHMLINK_VMTRUST_ROLE";
const ARG: &str = "SHMLINK_VMTRUST_ARG";
/// The parent's test PKI, for the TLS children.
const PEM_CERT: &str = "SHMLINK_VMTRUST_CERT";
const PEM_KEY: &str = "SHMLINK_VMTRUST_KEY";
const PEM_CA: &str = "SHMLINK_VMTRUST_CA";
const WAIT: Duration = Duration::from_secs(30);
const MIB: u64 = 1 << 20;
/// Where the ring data areas start in a region file (the header: page 0, the listener
/// table, 64 slots of 2 KiB; transport/vm/region.rs).
const DATA_AT: u64 = 8192 + 64 * 2048;
/// Ring data size of a 16 MiB region.
const RING_16M: u64 = 64 << 10;
/// Bytes of a ring record's header (shmlink_ring::spsc::HEADER).
const RECORD_HEADER: u64 = 8;

/// Whether we are root; if not, the calling test is skipped.
fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        shmlink_testkit::skip("root", format!("needs root to play uid {NOBODY}"));
    }
    root
}

/// A fresh region path in /dev/shm (nothing created), and its `.bell`; both removed on
/// drop.
fn paths() -> Paths {
    Paths::new("vmtrust")
}

impl Paths {
    /// Creates the region file owner-only, as `vm-host` does.
    fn create(&self, mode: u32) -> &Self {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&self.region)
            .unwrap();
        f.set_permissions(std::fs::Permissions::from_mode(mode))
            .unwrap();
        f.set_len(16 * MIB).unwrap();
        self
    }
}

/// The error of binding a `vm:` listener in `p`'s region.
fn bind_error(p: &Paths) -> shmlink::Error {
    match Listener::bind(&p.addr("trust"), &Options::default()) {
        Ok(_) => panic!("{} was mapped", p.region.display()),
        Err(e) => e,
    }
}

/// The error of `vm-host` on `p`'s region.
fn host_error(p: &Paths) -> shmlink::Error {
    match VmHost::bind(&p.bell, &p.region, 16 * MIB, 1) {
        Ok(_) => panic!("vm-host took {}", p.region.display()),
        Err(e) => e,
    }
}

fn assert_refused(e: &shmlink::Error, because: &str) {
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains(because), "{e}");
}

/// A connected pair in `p`'s region: (client, server, listener).
fn pair(p: &Paths, name: &str) -> (Connection, Connection, Listener) {
    p.pair(name)
}

#[test]
fn a_region_reached_through_a_symbolic_link_is_refused() {
    let target = paths();
    target.create(0o600);
    let p = paths();
    std::os::unix::fs::symlink(&target.region, &p.region).unwrap();
    assert_refused(&bind_error(&p), "symbolic link");
    assert_refused(&host_error(&p), "symbolic link");
    // A dangling link is not followed to create the file at its target either.
    let missing = paths();
    let q = paths();
    std::os::unix::fs::symlink(&missing.region, &q.region).unwrap();
    assert_refused(&host_error(&q), "symbolic link");
    assert!(
        !missing.region.exists(),
        "vm-host created the link's target"
    );
}

#[test]
fn a_region_file_others_may_read_or_write_is_refused() {
    for (mode, because) in [
        (0o644, "mode 0o644"),
        (0o606, "mode 0o606"),
        (0o660, "mode 0o660 and group"),
    ] {
        let p = paths();
        p.create(mode);
        assert_refused(&bind_error(&p), because);
        assert_refused(&host_error(&p), because);
    }
    // Group access is fine for the group the options name.
    let p = paths();
    p.create(0o660);
    let gid = std::fs::metadata(&p.region).unwrap().gid();
    Listener::bind(&p.addr("group"), &Options::default().vm_region_group(gid)).unwrap();
}

#[test]
fn a_region_planted_by_another_user_is_refused() {
    if !root() {
        return;
    }
    let p = paths();
    p.create(0o600);
    std::os::unix::fs::chown(&p.region, Some(NOBODY), Some(NOBODY)).unwrap();
    assert_refused(&bind_error(&p), &format!("belongs to uid {NOBODY}"));
    assert_refused(&host_error(&p), &format!("belongs to uid {NOBODY}"));
    // Trusted by name, it is used.
    Listener::bind(
        &p.addr("trusted"),
        &Options::default().expect_uids([NOBODY]),
    )
    .unwrap();
}

#[test]
fn a_region_vm_host_creates_is_owner_only_and_nobody_cannot_open_it() {
    let p = paths();
    let host = VmHost::bind(&p.bell, &p.region, 16 * MIB, 1).unwrap();
    let mode = std::fs::metadata(&p.region).unwrap().mode() & 0o7777;
    assert_eq!(mode, 0o600, "region mode {mode:#o}");
    let smode = std::fs::metadata(&p.bell).unwrap().mode() & 0o7777;
    assert_eq!(smode, 0o600, "socket mode {smode:#o}");
    if !root() {
        return;
    }
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            "cat",
        ])
        .arg(&p.region)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "nobody read the region");
    assert!(err.contains("Permission denied"), "{err}");
    drop(host);
}

use common::send_ivshmem_msg as send_msg;

/// A well-formed doorbell setup for peer `id`: version, id, the memory, `peers` other
/// peers with `vectors` eventfds each (`e`, duplicated by every send), then our own.
fn serve_setup(s: &UnixStream, id: i64, peers: i64, vectors: usize, e: &OwnedFd) {
    let mem: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    if !(send_msg(s, 0, None) && send_msg(s, id, None) && send_msg(s, -1, Some(&mem))) {
        return;
    }
    for p in 0..peers {
        let p = if p >= id { p + 1 } else { p };
        for _ in 0..vectors {
            if !send_msg(s, p, Some(e)) {
                return; // refused: the client hung up
            }
        }
    }
    send_msg(s, id, Some(e));
}

/// This process's open descriptors.
fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn a_bell_handing_out_more_descriptors_than_the_region_needs_is_refused() {
    // 200 peers: more parties than a region of 32 listeners and 64 slots has (the old
    // bound was 4,096 peers × 64 vectors).
    let p = paths();
    p.create(0o600);
    let l = UnixListener::bind(&p.bell).unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let e: OwnedFd = UnixStream::pair().unwrap().0.into();
        serve_setup(&s, 3, 200, 1, &e);
        // Held until the client hung up (or 10 s).
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = (&s).read(&mut [0u8; 8]);
    });
    let (mut c, mut s, _l) = pair(&p, "many");
    assert_eq!(bell_stats(&p.region), None, "the flood was taken");
    c.send(b"polling").unwrap();
    assert_eq!(s.recv_vec().unwrap(), b"polling");
    drop((c, s));
    t.join().unwrap();
}

#[test]
fn a_bell_keeps_one_descriptor_per_peer_whatever_the_vectors() {
    // 100 peers × 30 vectors = 3,000 descriptors sent: a doorbell rings vector 0 only, so
    // it keeps at most one per peer (the old code kept all 3,000).
    let p = paths();
    p.create(0o600);
    let l = UnixListener::bind(&p.bell).unwrap();
    let (done_tx, done_rx) = channel::<()>();
    let t = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let e: OwnedFd = UnixStream::pair().unwrap().0.into();
        serve_setup(&s, 3, 100, 30, &e);
        let _ = done_rx.recv_timeout(WAIT);
    });
    let before = fd_count();
    let (c, s, _l) = pair(&p, "vectors");
    let deadline = Instant::now() + WAIT;
    while bell_stats(&p.region).is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        bell_stats(&p.region).is_some(),
        "an honest-looking bell refused"
    );
    let held = fd_count().saturating_sub(before);
    assert!(held < 1000, "{held} descriptors held for 100 peers");
    drop((c, s));
    done_tx.send(()).unwrap();
    t.join().unwrap();
}

#[test]
fn a_bell_server_of_another_uid_is_refused() {
    if !root() {
        return;
    }
    let p = paths();
    p.create(0o600);
    // nobody binds REGION.bell first (in /dev/shm, which everyone may write) and serves a
    // well-formed setup.
    let child = ChildProc::spawn_as(NOBODY, "fake_bell", p.bell.to_str().unwrap());
    child.line("READY");
    let (mut c, mut s, _l) = pair(&p, "impostor");
    assert_eq!(
        bell_stats(&p.region),
        None,
        "the doorbell of uid {NOBODY} was taken"
    );
    c.send(b"polling").unwrap();
    assert_eq!(s.recv_vec().unwrap(), b"polling");
}

#[test]
fn a_reserved_send_buffer_is_the_senders_own_whatever_the_region_says() {
    let p = paths();
    p.create(0o600);
    let (mut c, mut s, _l) = pair(&p, "scribble");
    let mut buf = c.reserve(64).unwrap();
    buf.fill(0xAA);
    // A third party (another mapping of the file) writes over where the record's
    // payload lies in every client-to-server ring.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&p.region)
        .unwrap();
    for slot in 0..64u64 {
        let at = DATA_AT + 2 * slot * RING_16M + RECORD_HEADER;
        f.write_all_at(&[0x55; 64], at).unwrap();
    }
    assert!(
        buf.iter().all(|&b| b == 0xAA),
        "the buffer changed under us"
    );
    buf.commit().unwrap();
    assert_eq!(s.recv_vec().unwrap(), vec![0xAA; 64]);
}

#[test]
fn tls_auto_stays_on_tls_unless_the_region_is_private() {
    let p = paths();
    p.create(0o600);
    let region = p.region.to_str().unwrap();
    let vm = [("SHMLINK_AUTO_VM", region), ("SHMLINK_AUTO_SHM", "0")];
    let (server, addr) = ChildProc::server(&vm);
    assert_eq!(ChildProc::client(&addr, &vm), "tls tls");
    drop(server);
    let private = [
        ("SHMLINK_AUTO_VM", region),
        ("SHMLINK_AUTO_SHM", "0"),
        ("SHMLINK_AUTO_VM_PRIVATE", "1"),
    ];
    let (server, addr) = ChildProc::server(&private);
    assert_eq!(ChildProc::client(&addr, &private), "vm vm");
    drop(server);
}

impl ChildProc {
    fn spawn(role: &str, arg: &str, env: &[(&str, &str)]) -> ChildProc {
        let mut cmd = common::rerun_ignored("child");
        cmd.env(ROLE, role)
            .env(ARG, arg)
            .env_remove("SHMLINK_AUTO_VM")
            .env_remove("SHMLINK_AUTO_SHM")
            .env_remove("SHMLINK_AUTO_VM_PRIVATE");
        cmd.envs(env.iter().copied());
        // One test PKI for both children (each process would make its own).
        let pki = common::pki();
        cmd.env(PEM_CERT, &pki.server.cert)
            .env(PEM_KEY, &pki.server.key)
            .env(PEM_CA, &pki.ca);
        ChildProc::start(cmd)
    }

    fn spawn_as(uid: u32, role: &str, arg: &str) -> ChildProc {
        ChildProc::start(common::child_as(uid, uid, &[(ROLE, role), (ARG, arg)]))
    }

    /// An `auto:` server with TLS options: its address.
    fn server(env: &[(&str, &str)]) -> (ChildProc, String) {
        let p = ChildProc::spawn("server", "", env);
        let addr = p.line("SERVER ");
        (p, addr)
    }

    /// An `auto:` client with TLS options: "OWN_TRANSPORT SERVER_TRANSPORT".
    fn client(addr: &str, env: &[(&str, &str)]) -> String {
        ChildProc::spawn("client", addr, env).line("RESULT ")
    }
}

/// The child roles: `fake_bell` (a doorbell server at the path in `ARG`, as whoever runs
/// it), `server` and `client` (`auto:` with the test TLS options). Each runs until its
/// stdin closes.
#[test]
#[ignore = "a child-process role of the vm: trust tests, run by them"]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let arg = std::env::var(ARG).unwrap_or_default();
    let pem = |k: &str| shmlink::Pem::text(std::env::var(k).unwrap_or_default());
    let tls = Options::default().tls(
        shmlink::TlsOptions::new()
            .cert(pem(PEM_CERT))
            .key(pem(PEM_KEY))
            .ca(pem(PEM_CA)),
    );
    match role.as_str() {
        "fake_bell" => {
            let _ = std::fs::remove_file(&arg);
            let l = UnixListener::bind(&arg).unwrap();
            std::fs::set_permissions(&arg, std::fs::Permissions::from_mode(0o777)).unwrap();
            println!("READY");
            std::thread::spawn(move || {
                while let Ok((s, _)) = l.accept() {
                    std::thread::spawn(move || {
                        let e: OwnedFd = UnixStream::pair().unwrap().0.into();
                        serve_setup(&s, 3, 0, 1, &e);
                        let _ = (&s).read(&mut [0u8; 8]);
                    });
                }
            });
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            let _ = std::fs::remove_file(&arg);
        }
        "server" => {
            let mut l = Listener::bind("auto:127.0.0.1:0", &tls).unwrap();
            println!("SERVER {}", l.local_addr());
            std::thread::spawn(move || loop {
                let Ok(mut c) = l.accept() else { continue };
                let t = c.transport().as_str();
                std::thread::spawn(move || {
                    while let Ok(m) = c.recv_vec() {
                        let mut answer = format!("{t} ").into_bytes();
                        answer.extend_from_slice(&m);
                        if c.send(&answer).is_err() {
                            break;
                        }
                    }
                });
            });
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        }
        "client" => match Connection::connect(&arg, &tls) {
            Ok(mut c) => {
                let own = c.transport().as_str();
                c.send(b"secret").unwrap();
                let answer = String::from_utf8(c.recv_vec().unwrap()).unwrap();
                let theirs = answer.strip_suffix(" secret").unwrap_or("?").to_string();
                println!("RESULT {own} {theirs}");
            }
            Err(e) => println!("RESULT ERROR {:?} {e}", e.kind()),
        },
        other => panic!("unknown role {other}"),
    }
}
