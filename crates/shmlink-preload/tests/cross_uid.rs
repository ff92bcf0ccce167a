//! Transparent mode across users (docs/transparent.md, "Across users"): root starts a C
//! echo server under `shmlink run` that changes to `nobody` (65534), and clients of the
//! same or another uid reach it under `shmlink run`. Only the policy the operator sets
//! moves a connection of another user onto shared memory; without it the connection
//! stays on TCP, with correct data, and the `--debug` output says why and which flag
//! fixes it. Every connection is checked on both sides ("fd N on shared memory" once per
//! connection), every echoed byte by the client. Needs root (to change uids), `cc` and
//! the `shmlink` binary (`cargo build -p shmlink-cli`). Round-trip times are printed,
//! never asserted.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{finish, target_dir, Scratch};
use shmlink_testkit::{install_executable, Reaped};

const NOBODY: u32 = 65534;
/// Connections per client run, round trips per connection, bytes per round trip.
const CONNS: usize = 3;
const ROUNDS: &str = "2000";
const SIZE: &str = "64";

/// What the test needs, or `None` after a skip line: root, `cc`, the `shmlink` binary
/// and the preload library, both reachable by `nobody`.
fn setup(scratch: &Scratch) -> Option<(PathBuf, PathBuf)> {
    if std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|v| v.split_whitespace().nth(1) == Some("0"))
        })
        != Some(true)
    {
        shmlink_testkit::skip("root", "changing uids needs root");
        return None;
    }
    let shmlink = target_dir().join("shmlink");
    let lib = target_dir().join("libshmlink_preload.so");
    if !shmlink.is_file() || !lib.is_file() {
        shmlink_testkit::skip(
            "cli",
            format!(
                "{} or {} is not built (cargo build -p shmlink-preload -p shmlink-cli)",
                shmlink.display(),
                lib.display()
            ),
        );
        return None;
    }
    // `nobody` must reach the library and the program: copy both into the scratch dir.
    let lib_copy = scratch.0.join("libshmlink_preload.so");
    std::fs::copy(&lib, &lib_copy).expect("copy the preload library");
    let shmlink_copy = scratch.0.join("shmlink");
    install_executable(&shmlink, &shmlink_copy);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/dropper.c");
    let prog = scratch.0.join("dropper");
    match Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&prog)
        .arg(&src)
        .output()
    {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("cc failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            shmlink_testkit::skip("cc", format!("no C compiler (cc: {e})"));
            return None;
        }
    }
    for p in [&lib_copy, &prog] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    Some((shmlink_copy, prog))
}

/// `shmlink run --debug FLAGS -- PROG ARGS` with rendezvous directory `rdv`, as `uid`.
fn under_run(
    shmlink: &Path,
    rdv: &Path,
    uid: Option<u32>,
    flags: &[&str],
    prog: &Path,
    args: &[&str],
) -> Command {
    let mut c = Command::new(shmlink);
    c.arg("run")
        .arg("--debug")
        .args(flags)
        .arg("--")
        .arg(prog)
        .args(args)
        .env("SHMLINK_DIR", rdv)
        .env(
            "SHMLINK_PRELOAD_LIB",
            shmlink.with_file_name("libshmlink_preload.so"),
        )
        .env_remove("LD_PRELOAD")
        .env_remove("XDG_RUNTIME_DIR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(uid) = uid {
        c.uid(uid).gid(uid);
    }
    c
}

/// What one server and client pair printed.
struct Pair {
    server_log: String,
    client_log: String,
    /// Nanoseconds per round trip, as the client measured them.
    ns_per_rt: f64,
}

impl Pair {
    /// Connections on shared memory: (server side, client side).
    fn shm(&self) -> (usize, usize) {
        let count = |log: &str| {
            log.lines()
                .filter(|l| l.ends_with("on shared memory"))
                .count()
        };
        (count(&self.server_log), count(&self.client_log))
    }
}

/// A test's programs (from [`setup`]) and the rendezvous directory its servers use.
struct Test {
    shmlink: PathBuf,
    prog: PathBuf,
    rdv: PathBuf,
    scratch: Scratch,
}

impl Test {
    /// The test `tag`, its rendezvous directory not made yet; `None` after a skip line.
    fn new(tag: &str) -> Option<Test> {
        let scratch = Scratch::new(tag);
        let (shmlink, prog) = setup(&scratch)?;
        let rdv = scratch.0.join("rdv");
        Some(Test {
            shmlink,
            prog,
            rdv,
            scratch,
        })
    }

    /// The same with the rendezvous directory in a parent every user may create in (as
    /// /tmp), so that a server running as nobody makes it.
    fn with_public_rdv(tag: &str) -> Option<Test> {
        let mut t = Test::new(tag)?;
        let public = t.scratch.0.join("public");
        std::fs::create_dir(&public).unwrap();
        std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o1777)).unwrap();
        t.rdv = public.join("rdv");
        Some(t)
    }

    /// `shmlink run --debug FLAGS -- PROG ARGS` with the test's rendezvous directory, as
    /// `uid`.
    fn run(&self, uid: Option<u32>, flags: &[&str], prog: &Path, args: &[&str]) -> Command {
        under_run(&self.shmlink, &self.rdv, uid, flags, prog, args)
    }

    /// Starts the dropping server (`PROG server UID CONNS`, or `server-early`), returns
    /// it with the port it printed.
    fn start_server(&self, flags: &[&str], args: &[&str]) -> (Child, String) {
        let mut server = self
            .run(None, flags, &self.prog, args)
            .spawn()
            .expect("start the server");
        let mut line = String::new();
        BufReader::new(server.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the server's port");
        let port = line.trim().to_string();
        assert!(!port.is_empty(), "the server printed no port");
        (server, port)
    }

    /// Starts the dropping server (`mode`: `server` drops after listen, `server-early`
    /// before) with `server_flags`, waits for its port, runs the client (as `client_uid`)
    /// with `client_flags`, checks both ended well and every byte came back.
    fn pair(
        &self,
        mode: &str,
        server_flags: &[&str],
        client_uid: Option<u32>,
        client_flags: &[&str],
    ) -> Pair {
        self.pair_as((mode, NOBODY), server_flags, client_uid, client_flags)
    }

    /// [`Test::pair`] with the uid the server changes to.
    fn pair_as(
        &self,
        (mode, server_uid): (&str, u32),
        server_flags: &[&str],
        client_uid: Option<u32>,
        client_flags: &[&str],
    ) -> Pair {
        let uid = server_uid.to_string();
        let conns = CONNS.to_string();
        let (server, port) = self.start_server(server_flags, &[mode, &uid, &conns]);
        let client = self
            .run(
                client_uid,
                client_flags,
                &self.prog,
                &["client", &port, &conns, ROUNDS, SIZE],
            )
            .spawn()
            .expect("start the client");
        let c = finish(client, "client");
        let s = finish(server, "server");
        let client_log = String::from_utf8_lossy(&c.stderr).into_owned();
        let server_log = String::from_utf8_lossy(&s.stderr).into_owned();
        let out = String::from_utf8_lossy(&c.stdout).into_owned();
        assert!(
            c.status.success() && out.starts_with("ok "),
            "client failed: {out}\n{client_log}\nserver:\n{server_log}"
        );
        assert!(s.status.success(), "server failed:\n{server_log}");
        assert!(
            server_log.contains(&format!("serving as uid {server_uid}")),
            "{server_log}"
        );
        let ns_per_rt = out
            .split_whitespace()
            .nth(3)
            .and_then(|v| v.parse().ok())
            .expect("ns per round trip");
        Pair {
            server_log,
            client_log,
            ns_per_rt,
        }
    }
}

fn report(what: &str, tcp: &Pair, shm: &Pair) {
    eprintln!(
        "{what}: {CONNS} x {ROUNDS} round trips of {SIZE} B: TCP {:.1} us, shared memory \
         {:.1} us per round trip: {:.1}x (debug build; a loaded machine; not asserted)",
        tcp.ns_per_rt / 1e3,
        shm.ns_per_rt / 1e3,
        tcp.ns_per_rt / shm.ns_per_rt
    );
}

/// A client of another uid (nobody) reaches a server that root started (it listens as
/// root, then changes to nobody) on shared memory only when the server's side allows
/// the client's uid with `--allow-uid`; without, it stays on TCP and its `--debug`
/// output names the flag.
#[test]
fn a_nobody_client_gets_shared_memory_only_with_allow_uid() {
    let Some(t) = Test::new("allow") else {
        return;
    };
    let plain = t.pair("server", &[], Some(NOBODY), &[]);
    assert_eq!(
        plain.shm(),
        (0, 0),
        "without --allow-uid the connections stay on TCP:\n{}",
        plain.client_log
    );
    let reason = format!("must allow uid {NOBODY} with `shmlink run --allow-uid`");
    assert!(
        plain.client_log.contains(&reason),
        "the client's --debug output says why ({reason:?}):\n{}",
        plain.client_log
    );

    // The directory the first server made (0700) keeps nobody out even with the flag:
    // an existing directory keeps its mode, and the server's log says so.
    let kept_out = t.pair("server", &["--allow-uid", "65534"], Some(NOBODY), &[]);
    assert_eq!(kept_out.shm(), (0, 0), "{}", kept_out.client_log);
    assert!(
        kept_out
            .server_log
            .contains("(mode 0o700, uid 0) keeps uids 65534 out"),
        "{}",
        kept_out.server_log
    );
    // A fresh one is made 0711 for the allowed users.
    std::fs::remove_dir_all(&t.rdv).unwrap();
    let allowed = t.pair("server", &["--allow-uid", "65534"], Some(NOBODY), &[]);
    assert_eq!(
        allowed.shm(),
        (CONNS, CONNS),
        "with --allow-uid every connection is on shared memory, on both sides:\n\
         server:\n{}\nclient:\n{}",
        allowed.server_log,
        allowed.client_log
    );
    assert!(
        allowed
            .server_log
            .contains(&format!("admits uids [{NOBODY}]")),
        "{}",
        allowed.server_log
    );
    report("nobody client, --allow-uid 65534", &plain, &allowed);
}

/// The same server with a root client: the registration was bound while the server was
/// root, so a root client trusts it; every connection is on shared memory without any
/// flag.
#[test]
fn a_root_client_gets_shared_memory_from_a_server_that_drops_after_listen() {
    let Some(t) = Test::new("root") else {
        return;
    };
    let shm = t.pair("server", &["--allow-uid", "65534"], None, &[]);
    assert_eq!(shm.shm(), (CONNS, CONNS), "{}", shm.server_log);
}

/// A server that changes to nobody before it listens (as `memcached -u nobody` does)
/// registers as nobody, in a directory nobody may write: a root client takes shared
/// memory only when it trusts uid 65534 with `--expect-uid`; without, it stays on TCP
/// and its `--debug` output says why.
#[test]
fn a_root_client_trusts_a_server_listening_as_nobody_only_with_expect_uid() {
    // The nobody server makes the rendezvous directory.
    let Some(t) = Test::with_public_rdv("expect") else {
        return;
    };
    let plain = t.pair("server-early", &[], None, &[]);
    assert_eq!(plain.shm(), (0, 0), "{}", plain.client_log);
    assert!(
        plain
            .client_log
            .contains(&format!("belongs to uid {NOBODY}, not to a trusted uid"))
            && plain.client_log.contains("--expect-uid"),
        "the client's --debug output says why:\n{}",
        plain.client_log
    );

    let trusted = t.pair("server-early", &[], None, &["--expect-uid", "65534"]);
    assert_eq!(
        trusted.shm(),
        (CONNS, CONNS),
        "server:\n{}\nclient:\n{}",
        trusted.server_log,
        trusted.client_log
    );
    report("root client, --expect-uid 65534", &plain, &trusted);
}

/// A client the registration refuses is named in the server's `--debug` output too,
/// with the library's reason and the flag that would admit it: the server stays root
/// and allows uid 1000, a client of uid 65534 comes.
#[test]
fn a_refused_client_is_named_in_the_servers_debug_output() {
    let Some(t) = Test::new("refused") else {
        return;
    };
    let p = t.pair_as(("server", 0), &["--allow-uid", "1000"], Some(NOBODY), &[]);
    assert_eq!(p.shm(), (0, 0), "{}", p.server_log);
    for log in [&p.server_log, &p.client_log] {
        assert!(
            log.contains("uid 65534 (gid 65534) may not connect (allowed: root, uids 1000)")
                && log.contains("`--allow-uid 65534`"),
            "the reason and the flag:\n{log}"
        );
    }
    assert!(p.server_log.contains("client refused"), "{}", p.server_log);
}

/// `memcached -u nobody` (Debian's, `scripts/apps.sh install`) changes to nobody before
/// it listens, so it registers as nobody: a root client under `shmlink run` reaches it
/// on shared memory only with `--expect-uid 65534`; without, it stays on TCP and says
/// why. Every `get` answer is checked by the client.
#[test]
fn memcached_as_nobody_serves_a_root_client_on_shared_memory_with_expect_uid() {
    let Some(t) = Test::with_public_rdv("memcached") else {
        return;
    };
    let Some(memcached) = ["/usr/bin/memcached", "/usr/local/bin/memcached"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
    else {
        shmlink_testkit::skip(
            "memcached",
            "memcached is not installed (scripts/apps.sh install)",
        );
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
        .to_string();
    let server = t
        .run(
            None,
            &[],
            memcached,
            &["-u", "nobody", "-l", "127.0.0.1", "-p", &port, "-U", "0"],
        )
        .spawn()
        .expect("start memcached");
    let mut server = Reaped(Some(server));
    // Registered once its socket file is there.
    let deadline = Instant::now() + Duration::from_secs(20);
    let registered = || {
        std::fs::read_dir(&t.rdv).is_ok_and(|d| {
            d.filter_map(|e| e.ok()).any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .ends_with(&format!("-{port}.sock"))
            })
        })
    };
    while !registered() {
        assert!(Instant::now() < deadline, "memcached never registered");
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = |flags: &[&str]| {
        let c = t
            .run(None, flags, &t.prog, &["memc", &port, ROUNDS])
            .spawn()
            .unwrap();
        let out = finish(c, "memcached client");
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && stdout.starts_with("ok "),
            "{stdout}\n{log}"
        );
        let ns: f64 = stdout.split_whitespace().nth(3).unwrap().parse().unwrap();
        let shm = log
            .lines()
            .filter(|l| l.ends_with("on shared memory"))
            .count();
        (shm, ns, log)
    };
    let (plain_shm, plain_ns, plain_log) = client(&[]);
    assert_eq!(plain_shm, 0, "{plain_log}");
    assert!(
        plain_log.contains("belongs to uid 65534, not to a trusted uid")
            && plain_log.contains("--expect-uid"),
        "{plain_log}"
    );
    let (shm, ns, log) = client(&["--expect-uid", "65534"]);
    assert_eq!(shm, 1, "{log}");
    let mut child = server.0.take().unwrap();
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let server_log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        server_log
            .lines()
            .filter(|l| l.ends_with("on shared memory"))
            .count(),
        1,
        "memcached's side of the one connection:\n{server_log}"
    );
    eprintln!(
        "memcached -u nobody, root client: {ROUNDS} gets: TCP {:.1} us, shared memory {:.1} us \
         per round trip: {:.1}x (debug build; a loaded machine; not asserted)",
        plain_ns / 1e3,
        ns / 1e3,
        plain_ns / ns
    );
}

/// In the attacker's process (this test binary run again as nobody, see
/// [`an_allowed_uid_cannot_claim_another_users_connection`]): connects to the
/// registration named in `XUID_ATTACK` (`NAME SERVER_PORT CLIENT_PORT`, both on
/// 127.0.0.1) and claims that TCP connection; prints the answer byte.
#[test]
fn attacker_helper() {
    let Ok(spec) = std::env::var("XUID_ATTACK") else {
        return; // not the attacker's process: nothing to do
    };
    let f: Vec<&str> = spec.split_whitespace().collect();
    let (name, server, client) = (
        f[0],
        f[1].parse::<u16>().unwrap(),
        f[2].parse::<u16>().unwrap(),
    );
    let opts = shmlink::Options::default()
        .in_process(false)
        .prepare_ahead(false)
        .connect_timeout(Duration::from_secs(2));
    let mut c = shmlink::Connection::connect(&format!("shm:{name}"), &opts).expect("connect");
    assert_eq!(c.recv_vec().unwrap(), [2], "READY");
    let mut claim = b"SLPC\x01".to_vec();
    for port in [server, client] {
        claim.extend_from_slice(&std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets());
        claim.extend_from_slice(&port.to_be_bytes());
    }
    c.send(&claim).unwrap();
    let answer = c.recv_vec().unwrap();
    println!("answer {}", answer.first().copied().unwrap_or(255));
}

/// A client of an allowed uid may claim only its own TCP connections: nobody, allowed
/// by `--allow-uid 65534`, claims a connection root made to the same server (its four
/// addresses are public in /proc/net/tcp) before the server accepted it. The claim is
/// answered no, and root's connection stays a working TCP connection. Before the check,
/// the answer was yes and the server program would have talked to nobody in root's place.
#[test]
fn an_allowed_uid_cannot_claim_another_users_connection() {
    let Some(t) = Test::new("hijack") else {
        return;
    };
    // A server that stays root (setuid(0)), admitting nobody's clients, serving two
    // connections one after the other.
    let (server, port) = t.start_server(&["--allow-uid", "65534"], &["server", "0", "2"]);
    let port: u16 = port.parse().expect("a port");
    let server = Reaped(Some(server));
    use std::io::{Read, Write};
    // The first connection keeps the server busy; the second waits in its backlog.
    let mut first = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    first.write_all(b"x").unwrap();
    let mut b = [0u8; 1];
    first.read_exact(&mut b).unwrap();
    let mut victim = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let victim_port = victim.local_addr().unwrap().port();
    let name = std::fs::read_dir(&t.rdv)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("tcp-") && n.ends_with(".sock"))
        .expect("the registration")
        .trim_end_matches(".sock")
        .to_string();
    let exe = t.scratch.0.join("cross_uid_test");
    install_executable(&std::env::current_exe().unwrap(), &exe);
    let out = Command::new(&exe)
        .args([
            "--exact",
            "attacker_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("XUID_ATTACK", format!("{name} {port} {victim_port}"))
        .env("SHMLINK_DIR", &t.rdv)
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("answer 0"),
        "nobody's claim of root's connection is answered no:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Root's connection is intact once the server gets to it.
    drop(first);
    victim
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    victim.write_all(b"still mine").unwrap();
    let mut echo = [0u8; 10];
    victim.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"still mine");
    drop(victim);
    drop(server);
}
