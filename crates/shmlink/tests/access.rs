//! Who may connect over `shm:`, and what another user can reach: a client under another
//! uid is refused (with the reason) unless the listener allows its uid or gid, so is its
//! `shmlink ls` query, and the connection's memory is out of reach through /proc.
//!
//! The other user is `nobody` (65534): this test binary re-runs itself under that uid
//! (the ignored test `child`), which needs root; without root the tests are skipped
//! (`shmlink_testkit::skip`, a failure where `SHMLINK_REQUIRE` names `root`).

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use shmlink::{Connection, ErrorKind, Listener, Options, PubSubOptions, Publisher, Subscriber};

const NOBODY: u32 = 65534;
const ROLE: &str = "SHMLINK_ACCESS_ROLE";
const ARG: &str = "SHMLINK_ACCESS_ARG";
/// Set for a child that declares its rendezvous directory shared.
const SHARED: &str = "SHMLINK_ACCESS_SHARED";

/// Whether we are root; if not, the calling test is skipped.
fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        shmlink_testkit::skip(
            "root",
            format!("needs root to run a client as uid {NOBODY}"),
        );
    }
    root
}

/// Runs this binary's `child` test as `uid`/`gid` with `role` and `arg`; returns the
/// line it printed after `RESULT `.
fn run_as(uid: u32, gid: u32, role: &str, arg: &str) -> String {
    run_as_in(uid, gid, role, arg, &[])
}

/// The child command for [`run_as`]: this binary's `child` test as `uid`/`gid`.
fn child_command(uid: u32, gid: u32, role: &str, arg: &str, env: &[(&str, &str)]) -> Command {
    common::child_as(uid, gid, &[&[(ROLE, role), (ARG, arg)], env].concat())
}

/// [`run_as`] with more environment variables for the child.
fn run_as_in(uid: u32, gid: u32, role: &str, arg: &str, env: &[(&str, &str)]) -> String {
    common::child_result(&child_command(uid, gid, role, arg, env).output().unwrap())
}

/// The other user's side, started by [`run_as`].
#[test]
#[ignore = "run by the other tests of this file under another uid"]
fn child() {
    let (Ok(role), Ok(arg)) = (std::env::var(ROLE), std::env::var(ARG)) else {
        return;
    };
    let result = match role.as_str() {
        "connect" => {
            let opts = Options::default().connect_timeout(Duration::from_secs(3));
            match Connection::connect(&arg, &opts) {
                Ok(mut c) => {
                    c.send(b"hello").unwrap();
                    format!("ok {}", String::from_utf8_lossy(&c.recv_vec().unwrap()))
                }
                Err(e) => format!("{:?} {e}", e.kind()),
            }
        }
        "bind" => {
            let opts = Options::default().shared_rendezvous_dir(std::env::var_os(SHARED).is_some());
            match Listener::bind(&arg, &opts) {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("{:?} {e}", e.kind()),
            }
        }
        "flood" => {
            // Connect to `arg` and say nothing, from 4 threads, each keeping its last 64
            // connections open, until stdin closes; print the count every 100.
            let done = Arc::new(AtomicBool::new(false));
            let flag = done.clone();
            std::thread::spawn(move || {
                let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
                flag.store(true, Ordering::Relaxed);
            });
            let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let (done, count, arg) = (done.clone(), count.clone(), arg.clone());
                    std::thread::spawn(move || {
                        let mut held = std::collections::VecDeque::new();
                        while !done.load(Ordering::Relaxed) && std::time::Instant::now() < deadline
                        {
                            if let Ok(fd) = shmlink_testkit::silent_client(&arg) {
                                held.push_back(fd);
                                if held.len() > 64 {
                                    held.pop_front();
                                }
                                let n = count.fetch_add(1, Ordering::Relaxed) + 1;
                                if n % 100 == 0 {
                                    println!("\nFLOODED {n}");
                                }
                            }
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            format!("flooded {}", count.load(Ordering::Relaxed))
        }
        "squat" | "squat-topic" => {
            // Serve `arg` (an echo listener or a topic) until stdin closes.
            let done = Arc::new(AtomicBool::new(false));
            let flag = done.clone();
            std::thread::spawn(move || {
                let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
                flag.store(true, Ordering::Relaxed);
            });
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            let running = || !done.load(Ordering::Relaxed) && std::time::Instant::now() < deadline;
            if role == "squat" {
                let (stop, server) = serve(Listener::bind(&arg, &Options::default()).unwrap());
                println!("\nREADY");
                while running() {
                    std::thread::sleep(Duration::from_millis(10));
                }
                stop.store(true, Ordering::Relaxed);
                format!("served {}", server.join().unwrap())
            } else {
                let mut p = Publisher::bind(&arg, &PubSubOptions::default()).unwrap();
                println!("\nREADY");
                while running() {
                    p.publish(b"from the squatter").unwrap();
                    std::thread::sleep(Duration::from_millis(10));
                }
                "published".to_string()
            }
        }
        "proc" => {
            // Everything of process `arg` that could lead to its memory.
            let mut opened = Vec::new();
            let mut denied = 0;
            for sub in ["fd", "map_files"] {
                let dir = format!("/proc/{arg}/{sub}");
                let entries = match std::fs::read_dir(&dir) {
                    Ok(e) => e.filter_map(|e| e.ok()).map(|e| e.path()).collect(),
                    Err(_) => {
                        denied += 1;
                        Vec::new()
                    }
                };
                for p in entries {
                    match std::fs::File::open(&p) {
                        Ok(_) => opened.push(match std::fs::read_link(&p) {
                            Ok(target) => target.display().to_string(),
                            Err(_) => p.display().to_string(),
                        }),
                        Err(_) => denied += 1,
                    }
                }
            }
            for file in ["maps", "mem"] {
                match std::fs::read(format!("/proc/{arg}/{file}")) {
                    Ok(_) => opened.push(file.to_string()),
                    Err(_) => denied += 1,
                }
            }
            format!("opened={} denied={denied} {opened:?}", opened.len())
        }
        "inspect" => {
            let reports =
                shmlink::inspect(std::path::Path::new(&arg), Duration::from_secs(3)).unwrap();
            let states: Vec<String> = reports
                .iter()
                .map(|r| {
                    let name = r.path.file_name().unwrap().to_string_lossy().into_owned();
                    match &r.state {
                        shmlink::inspect::SocketState::Answered(s) => {
                            format!("{name}=answered:{}", s.address)
                        }
                        shmlink::inspect::SocketState::PermissionDenied(why) => {
                            format!("{name}=denied:{why}")
                        }
                        other => format!("{name}={other:?}"),
                    }
                })
                .collect();
            states.join(" | ")
        }
        other => panic!("unknown role {other}"),
    };
    println!("RESULT {result}");
}

/// A listener served by a thread: every connection gets its first message echoed with
/// `echo: ` in front. Stops when the returned flag is set.
fn serve(mut l: Listener) -> (Arc<AtomicBool>, JoinHandle<usize>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    l.set_nonblocking(true);
    let t = std::thread::spawn(move || {
        let mut served = 0;
        while !flag.load(Ordering::Relaxed) {
            match l.accept() {
                Ok(mut c) => {
                    let m = c.recv_vec().unwrap();
                    c.send(&[b"echo: ", &m[..]].concat()).unwrap();
                    served += 1;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
        served
    });
    (stop, t)
}

/// A directory everybody may enter, removed on drop.
struct OpenDir(PathBuf);

impl OpenDir {
    fn new(name: &str) -> OpenDir {
        let dir = std::env::temp_dir().join(format!("shmlink-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        OpenDir(dir)
    }

    fn addr(&self, name: &str) -> String {
        format!("shm:{}/{name}.sock", self.0.display())
    }
}

impl Drop for OpenDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn other_users_are_refused_unless_allowed() {
    if !root() {
        return;
    }
    let dir = OpenDir::new("access");
    // (name, options, start of the child's result, text it contains)
    let cases: [(&str, Options, &str, &str); 4] = [
        // The default: only our uid and root; the socket file is not even writable.
        (
            "default",
            Options::default(),
            "PermissionDenied",
            "no permission to reach",
        ),
        // Another uid allowed: the socket is open to all, the credential check refuses.
        (
            "other-uid",
            Options::default().allow_uids([4242]),
            "PermissionDenied",
            "refused by listener: uid 65534 (gid 65534) may not connect",
        ),
        (
            "uid",
            Options::default().allow_uids([NOBODY]),
            "ok",
            "echo: hello",
        ),
        (
            "gid",
            Options::default().allow_gids([NOBODY]),
            "ok",
            "echo: hello",
        ),
    ];
    let mut results = HashMap::new();
    for (name, opts, kind, text) in cases {
        let addr = dir.addr(name);
        let (stop, server) = serve(Listener::bind(&addr, &opts).unwrap());
        let got = run_as(NOBODY, NOBODY, "connect", &addr);
        // The listener still serves its own uid after refusing the other one.
        let mut c = Connection::connect(&addr, &Options::default()).unwrap();
        c.send(b"me").unwrap();
        assert_eq!(c.recv_vec().unwrap(), b"echo: me");
        stop.store(true, Ordering::Relaxed);
        let served = server.join().unwrap();
        assert!(got.starts_with(kind) && got.contains(text), "{name}: {got}");
        assert_eq!(served, if kind == "ok" { 2 } else { 1 }, "{name}");
        results.insert(name, got);
    }
    eprintln!("{results:#?}");
}

#[test]
fn connection_memory_is_out_of_reach_of_other_users() {
    if !root() {
        return;
    }
    let dir = OpenDir::new("proc");
    let addr = dir.addr("p");
    let mut l = Listener::bind(&addr, &Options::default()).unwrap();
    let a = addr.clone();
    let client = std::thread::spawn(move || Connection::connect(&a, &Options::default()).unwrap());
    let mut server = l.accept().unwrap();
    let mut client = client.join().unwrap();
    client.send(b"x").unwrap();
    assert_eq!(server.recv_vec().unwrap(), b"x");

    let pid = std::process::id().to_string();
    // The probe works: our own uid opens the connection's mapping through /proc …
    let same = run_as(0, 0, "proc", &pid);
    assert!(same.contains("memfd:"), "{same}");
    // … another uid opens nothing.
    let other = run_as(NOBODY, NOBODY, "proc", &pid);
    assert!(other.starts_with("opened=0 "), "{other}");
    // And nothing of the connection has a name outside the rendezvous socket.
    let names: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["p.sock"]);
}

#[test]
fn queries_pass_the_same_credential_check() {
    if !root() {
        return;
    }
    let dir = OpenDir::new("query-access");
    let listeners: Vec<_> = [
        ("a-default", Options::default()),
        ("b-other-uid", Options::default().allow_uids([4242])),
        ("c-nobody", Options::default().allow_uids([NOBODY])),
    ]
    .into_iter()
    .map(|(name, opts)| serve(Listener::bind(&dir.addr(name), &opts).unwrap()))
    .collect();
    let got = run_as(NOBODY, NOBODY, "inspect", dir.0.to_str().unwrap());
    for (stop, server) in listeners {
        stop.store(true, Ordering::Relaxed);
        assert_eq!(server.join().unwrap(), 0, "a query is not a connection");
    }
    let states: Vec<&str> = got.split(" | ").collect();
    assert_eq!(states.len(), 3, "{got}");
    // The socket file keeps the other user out; then the listener's check does.
    assert!(states[0].starts_with("a-default.sock=denied:"), "{got}");
    assert!(
        states[1].starts_with("b-other-uid.sock=denied:")
            && states[1].contains("uid 65534 (gid 65534) may not connect"),
        "{got}"
    );
    assert_eq!(
        states[2],
        format!("c-nobody.sock=answered:{}", dir.addr("c-nobody"))
    );
}

/// A process of another user serving an address (the `squat` roles), stopped on drop.
struct Squatter {
    child: std::process::Child,
    /// Kept open: what the child prints at the end must not fail.
    _stdout: std::process::ChildStdout,
}

impl Squatter {
    fn start(role: &str, addr: &str) -> Squatter {
        use std::io::BufRead;
        let mut child = child_command(NOBODY, NOBODY, role, addr, &[])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let ready = (&mut out)
            .lines()
            .any(|l| l.is_ok_and(|l| l.ends_with("READY")));
        assert!(ready, "the squatter did not start");
        Squatter {
            child,
            _stdout: out.into_inner(),
        }
    }
}

impl Drop for Squatter {
    fn drop(&mut self) {
        drop(self.child.stdin.take()); // the child stops when its stdin closes
        let _ = self.child.wait();
    }
}

#[test]
fn a_squatter_on_an_abstract_name_is_refused_unless_expected() {
    if !root() {
        return;
    }
    let pid = std::process::id();
    let quick = Options::default().connect_timeout(Duration::from_secs(3));

    let addr = format!("shm:@squat-{pid}");
    let _squatter = Squatter::start("squat", &addr);
    let e = Connection::connect(&addr, &quick).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    let why = e.to_string();
    assert!(why.contains("uid 65534") && why.contains("uid 0"), "{why}");
    // Trusting that uid explicitly: served.
    let mut c = Connection::connect(&addr, &quick.clone().expect_uids([NOBODY])).unwrap();
    c.send(b"hi").unwrap();
    assert_eq!(c.recv_vec().unwrap(), b"echo: hi");

    let topic = format!("shm:@squat-topic-{pid}");
    let _publisher = Squatter::start("squat-topic", &topic);
    let subscribe =
        |opts: Options| Subscriber::connect(&topic, &PubSubOptions::default().options(opts));
    let e = subscribe(quick.clone()).expect_err("the squatting publisher is refused");
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("uid 65534"), "{e}");
    let mut sub = subscribe(quick.expect_uids([NOBODY])).unwrap();
    assert_eq!(sub.recv_vec().unwrap(), b"from the squatter");
}

#[test]
fn rendezvous_directories_others_control_are_refused() {
    if !root() {
        return;
    }
    let base = OpenDir::new("rdv");
    let chown =
        |p: &std::path::Path, uid: u32| std::os::unix::fs::lchown(p, Some(uid), Some(uid)).unwrap();
    let mkdir = |name: &str, mode: u32, owner: u32| {
        let d = base.0.join(name);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
        chown(&d, owner);
        d
    };
    // Pre-created writable for all (by nobody itself, say, or a careless script).
    let open = mkdir("open", 0o777, NOBODY);
    // A link to a directory of nobody's own: whoever controls the link controls the target.
    let real = mkdir("real", 0o700, NOBODY);
    let link = base.0.join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    chown(&link, NOBODY);
    // Owned by another uid (readable by all).
    let foreign = mkdir("foreign", 0o755, 4242);

    let as_nobody = |role: &str, dir: &std::path::Path, shared: bool| {
        let mut env = vec![("SHMLINK_DIR", dir.to_str().unwrap())];
        if shared {
            env.push((SHARED, "1"));
        }
        run_as_in(NOBODY, NOBODY, role, "shm:x", &env)
    };
    for (dir, reason) in [
        (&open, "mode 0o777"),
        (&link, "symbolic link"),
        (&foreign, "belongs to uid 4242"),
    ] {
        for role in ["bind", "connect"] {
            let got = as_nobody(role, dir, false);
            assert!(
                got.starts_with("PermissionDenied") && got.contains(reason),
                "{role} in {}: {got}",
                dir.display()
            );
        }
    }
    // Declared shared, the open directory serves; a link never does.
    assert_eq!(as_nobody("bind", &open, true), "ok");
    assert!(as_nobody("bind", &link, true).contains("symbolic link"));
    // Nobody's own private directory is fine.
    assert_eq!(as_nobody("bind", &real, false), "ok");
}

#[test]
fn a_handshake_flood_from_another_uid_does_not_evict_genuine_clients() {
    if !root() {
        return;
    }
    // An abstract name: any uid in the network namespace can connect to it.
    let addr = format!("shm:@flood-{}", std::process::id());
    let (stop, server) = serve(Listener::bind(&addr, &Options::default()).unwrap());
    let opts = Options::default().connect_timeout(Duration::from_secs(10));
    flood_while_serving(&addr, |i| {
        let mut c = Connection::connect(&addr, &opts)?;
        c.send(format!("genuine {i}").as_bytes())?;
        assert_eq!(c.recv_vec()?, format!("echo: genuine {i}").as_bytes());
        Ok(())
    });
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
}

#[test]
fn a_subscribe_flood_from_another_uid_does_not_evict_genuine_subscribers() {
    if !root() {
        return;
    }
    let addr = format!("shm:@topic-flood-{}", std::process::id());
    let _publisher = Publisher::bind(&addr, &PubSubOptions::default()).unwrap();
    let opts = PubSubOptions::default()
        .options(Options::default().connect_timeout(Duration::from_secs(10)));
    flood_while_serving(&addr, |_| Subscriber::connect(&addr, &opts).map(drop));
}

/// Floods `addr` from uid `nobody` with silent connections while `genuine` clients (4 at
/// a time) connect, until 100 of them were served and 1,000 floods were sent: every
/// genuine one must be served.
fn flood_while_serving(addr: &str, genuine: impl Fn(usize) -> shmlink::Result<()> + Sync) {
    use std::io::BufRead;
    let mut child = child_command(NOBODY, NOBODY, "flood", addr, &[])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let floods = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = floods.clone();
    let out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut last = String::new();
        for line in std::io::BufReader::new(out).lines().map_while(|l| l.ok()) {
            if let Some(n) = line.rsplit("FLOODED ").next().and_then(|n| n.parse().ok()) {
                seen.store(n, Ordering::Relaxed);
            }
            if line.contains("RESULT ") {
                last = line;
            }
        }
        last
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while floods.load(Ordering::Relaxed) < 100 {
        assert!(
            std::time::Instant::now() < deadline,
            "the flood did not start"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut served = 0;
    while served < 100 || floods.load(Ordering::Relaxed) < 1000 {
        assert!(
            std::time::Instant::now() < deadline,
            "the test ran out of time"
        );
        std::thread::scope(|s| {
            let genuine = &genuine;
            let clients: Vec<_> = (0..4).map(|i| s.spawn(move || genuine(i))).collect();
            for c in clients {
                if let Err(e) = c.join().unwrap() {
                    panic!("genuine client {served} was not served during the flood: {e}");
                }
                served += 1;
            }
        });
    }
    drop(child.stdin.take());
    child.wait().unwrap();
    let last = reader.join().unwrap();
    eprintln!("{addr}: {served} genuine clients served during the flood ({last})");
}
