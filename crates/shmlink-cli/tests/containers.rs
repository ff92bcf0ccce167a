//! shmlink between real containers (podman with runc, rootful), each in the runtime's own
//! pid, net, ipc, uts and mount namespaces (never `--ipc host` or `--pid host`), sharing
//! only a bind-mounted rendezvous directory: the image of `scripts/image.sh build`,
//!
//! - `shm:` between two containers of different uids (`--allow-uid`/`--expect-uid`), the
//!   p50 round trip printed with its ratio to two plain processes in the same run, a
//!   third uid refused, and `shmlink ls` from a third container seeing the listener;
//! - a container SIGKILLed mid-stream (`podman kill -s KILL`): its peer gets a reset at
//!   once, `shmlink probe` in the volume fails, and a restarted container on the same
//!   volume serves again; a killed client leaves the server serving the next one;
//! - a topic: a publisher container and three subscriber containers (one of another
//!   uid), `shmlink ls` from a fifth container listing the publisher and every subscriber;
//! - transparent mode: a redis-server container and a redis-benchmark container of one
//!   pod (its shared network namespace, as in a Kubernetes Pod; pid, ipc and mount
//!   namespaces their own), both under `shmlink run`, every connection on shared memory,
//!   requests/s printed with the ratio to the same pair over plain TCP (requirement
//!   `apps`: the host's redis from scripts/apps.sh, copied into a test image).
//!
//! Skipped (requirement `podman`) where podman cannot run a container; CI runs
//! scripts/containers.sh install first and requires it. Every container, and the
//! directory, is removed at the end of each test, failed or not.

mod podman;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use podman::*;
use serde_json::Value;

/// The p50 round trip (ns) of `pong --json` output.
fn p50(out: &Output) -> f64 {
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "pong: {stdout}{}", text(&out.stderr));
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON row: {stdout}"));
    let v: Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["transport"], "shm", "{line}");
    v["rtt_ns"]["p50"].as_f64().unwrap()
}

/// The namespaces of a running container's first process (`/proc/PID/ns/KIND` links).
fn namespaces(container: &str) -> Vec<String> {
    let pid = podman_ok(&["inspect", "--format", "{{.State.Pid}}", container]);
    ["pid", "net", "ipc", "uts", "mnt"]
        .iter()
        .map(|ns| {
            std::fs::read_link(format!("/proc/{}/ns/{ns}", pid.trim()))
                .map(|l| l.display().to_string())
                .unwrap_or_else(|e| panic!("{container}: ns/{ns}: {e}"))
        })
        .collect()
}

const COUNT: &str = "20000";

/// A pong client's short latency run against `shm:pong` (a served pong works).
const LATENCY_CLIENT: [&str; 9] = [
    "pong",
    "--client",
    "--latency",
    "--json",
    "--cpus",
    "none",
    "-n",
    "2000",
    "shm:pong",
];

#[test]
fn shm_between_containers_of_two_uids() {
    let Some((_serial, release)) = setup() else {
        return;
    };
    let mut scope = Scope::new("uids");
    // Owned by the server's uid and writable by nobody else (the trust check), open for
    // others to traverse: the client of another uid reaches the socket by path.
    let dir = scope.dir("rdv", UID, 0o755);
    let server = scope.run_args("server", UID, &dir);
    let server_name = server[2].clone();
    start(
        server,
        &[
            "pong",
            "--server",
            "--cpus",
            "none",
            "--allow-uid",
            &OTHER_UID.to_string(),
            "shm:pong",
        ],
    );
    wait_listening(&dir, "pong");

    // The probe inside the container, as Kubernetes would exec it.
    let probe = podman_ok(&["exec", &server_name, "shmlink", "probe", "shm:pong"]);
    assert!(probe.contains("listening"), "{probe}");

    // Best of three rounds each, alternating: two containers, then two plain processes
    // (the same release binary, unpinned like the containers).
    let plain_dir = scope.dir("plain", 0, 0o700);
    let (mut best_ctr, mut best_plain) = (f64::MAX, f64::MAX);
    for round in 0..3 {
        let client = scope.run_args(&format!("client{round}"), OTHER_UID, &dir);
        let out = run(
            client,
            &[
                "pong",
                "--client",
                "--latency",
                "--json",
                "--cpus",
                "none",
                "-n",
                COUNT,
                "--expect-uid",
                &UID.to_string(),
                "shm:pong",
            ],
        );
        best_ctr = best_ctr.min(p50(&out));
        let out = Command::new(&release)
            .args([
                "pong",
                "--latency",
                "--json",
                "--cpus",
                "none",
                "-n",
                COUNT,
                "shm:plain",
            ])
            .env("SHMLINK_DIR", &plain_dir)
            .output()
            .unwrap();
        best_plain = best_plain.min(p50(&out));
    }
    println!(
        "shm: p50 round trip, 64 B, best of 3 x {COUNT}: containers (uid {OTHER_UID} -> {UID}) {:.2} us, \
         plain processes {:.2} us, ratio {:.2}",
        best_ctr / 1e3,
        best_plain / 1e3,
        best_ctr / best_plain
    );

    // A third uid, not allowed: refused by the listener, which serves on.
    let out = run(
        scope.run_args("stranger", STRANGER_UID, &dir),
        &[
            "pong",
            "--client",
            "--latency",
            "--no-wait",
            "-n",
            "100",
            "--cpus",
            "none",
            "--expect-uid",
            &UID.to_string(),
            "shm:pong",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains("may not connect"), "{err}");

    // Two containers in flight at once, a client mid-run and `shmlink ls` in a third:
    // the listener (busy with its client, so not answering, or between runs, answering)
    // with its pid and uid as the kernel reports them.
    let client = scope.run_args("long", OTHER_UID, &dir);
    let long_name = client[2].clone();
    start(
        client,
        &[
            "pong",
            "--client",
            "--cpus",
            "none",
            "-n",
            "100000000",
            "--expect-uid",
            &UID.to_string(),
            "shm:pong",
        ],
    );
    let ls = run(scope.run_args("ls", UID, &dir), &["ls", "--json"]);
    assert!(ls.status.success(), "{}", text(&ls.stderr));
    let v: Value = serde_json::from_slice(&ls.stdout).unwrap();
    let listeners = v["listeners"].as_array().unwrap();
    assert_eq!(listeners.len(), 1, "{v}");
    let l = &listeners[0];
    assert_eq!(l["uid"], UID, "{l}");
    assert!(l["path"].as_str().unwrap().ends_with("/pong.sock"), "{l}");
    let state = l["state"].as_str().unwrap();
    assert!(state == "answered" || state == "not_answering", "{l}");
    println!(
        "shmlink ls from a third container during a run: {}",
        text(&ls.stdout).trim()
    );

    // Each container had namespaces of its own.
    let (a, b) = (namespaces(&server_name), namespaces(&long_name));
    for (x, y) in a.iter().zip(&b) {
        assert_ne!(x, y, "the two containers share a namespace");
    }
    let own: Vec<String> = ["pid", "net", "ipc", "uts", "mnt"]
        .iter()
        .map(|ns| {
            std::fs::read_link(format!("/proc/self/ns/{ns}"))
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    for (x, y) in a.iter().zip(&own) {
        assert_ne!(x, y, "a container shares a namespace with the host");
    }
    podman_ok(&["rm", "-f", "-t", "0", &long_name]);
}

#[test]
fn a_killed_container_resets_its_peer_and_a_restarted_one_serves() {
    let Some((_serial, _)) = setup() else {
        return;
    };
    let mut scope = Scope::new("kill");
    let dir = scope.dir("rdv", UID, 0o700);
    let server = scope.run_args("server", UID, &dir);
    let server_name = server[2].clone();
    start(server, &["pong", "--server", "--cpus", "none", "shm:pong"]);
    wait_listening(&dir, "pong");

    // A client streaming far longer than the test: attached, so its exit is seen.
    let mut args = scope.run_args("client", UID, &dir);
    args.push(IMAGE.to_string());
    args.extend(
        [
            "pong",
            "--client",
            "--cpus",
            "none",
            "-n",
            "1000000000",
            "shm:pong",
        ]
        .map(String::from),
    );
    let mut client = Command::new("podman")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-stream: the listener's connection is live (ls, as root here, sees it busy).
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        client.try_wait().unwrap().is_none(),
        "the client ended early"
    );

    let killed = Instant::now();
    podman_ok(&["kill", "-s", "KILL", &server_name]);
    // docs/containers.md: a peer's death is a reset at once (the kernel closes its
    // socket); 30 s is the bound this test gives it before calling it a hang.
    let status = loop {
        if let Some(s) = client.try_wait().unwrap() {
            break s;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "the client did not notice the SIGKILLed server"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let after = killed.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(client.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.to_lowercase().contains("reset") || err.contains("closed"),
        "{err}"
    );
    println!(
        "server container SIGKILLed mid-stream: the client container exited {:?} after {:.0} ms: {}",
        status.code(),
        after.as_secs_f64() * 1e3,
        err.trim()
    );

    // The socket file stays; the probe tells it is dead.
    assert!(dir.join("pong.sock").exists());
    let out = Command::new(BIN)
        .args(["probe", "shm:pong"])
        .env("SHMLINK_DIR", &dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));

    // A new server container on the same volume replaces the stale file and serves.
    start(
        scope.run_args("server2", UID, &dir),
        &["pong", "--server", "--cpus", "none", "shm:pong"],
    );
    wait_listening(&dir, "pong");
    let out = run(scope.run_args("client2", UID, &dir), &LATENCY_CLIENT);
    p50(&out);

    // The other way round: a client SIGKILLed mid-stream; the server serves the next.
    let c3 = scope.run_args("client3", UID, &dir);
    let c3_name = c3[2].clone();
    start(
        c3,
        &[
            "pong",
            "--client",
            "--cpus",
            "none",
            "-n",
            "1000000000",
            "shm:pong",
        ],
    );
    std::thread::sleep(Duration::from_secs(2));
    podman_ok(&["kill", "-s", "KILL", &c3_name]);
    let out = run(scope.run_args("client4", UID, &dir), &LATENCY_CLIENT);
    p50(&out);
}

#[test]
fn a_topic_with_a_publisher_container_and_three_subscriber_containers() {
    let Some((_serial, _)) = setup() else {
        return;
    };
    let mut scope = Scope::new("topic");
    let dir = scope.dir("rdv", UID, 0o755);
    // The publisher, fed on stdin by this test; it waits for three subscribers.
    let mut args = scope.run_args("pub", UID, &dir);
    args.insert(1, "-i".to_string());
    args.push(IMAGE.to_string());
    args.extend(
        [
            "pub",
            "--subscribers",
            "3",
            "--allow-uid",
            &OTHER_UID.to_string(),
            "shm:prices",
        ]
        .map(String::from),
    );
    let mut publisher = Command::new("podman")
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_listening(&dir, "prices");
    let mut subs = Vec::new();
    for (i, uid) in [UID, UID, OTHER_UID].into_iter().enumerate() {
        let name = format!("sub{i}");
        let a = scope.run_args(&name, uid, &dir);
        subs.push(a[2].clone());
        start(a, &["sub", "--expect-uid", &UID.to_string(), "shm:prices"]);
    }
    // All three joined: `shmlink ls` in a fifth container lists the topic, its publisher
    // and every subscriber with its uid.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut attempt = 0;
    let topic = loop {
        attempt += 1;
        let ls = run(
            scope.run_args(&format!("ls{attempt}"), UID, &dir),
            &["ls", "--json"],
        );
        assert!(ls.status.success(), "{}", text(&ls.stderr));
        let v: Value = serde_json::from_slice(&ls.stdout).unwrap();
        let t = v["topics"][0].clone();
        if t["subscribers"].as_array().map_or(0, |s| s.len()) == 3 {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "the subscribers did not all join: {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(topic["uid"], UID, "{topic}");
    let mut uids: Vec<u64> = topic["subscribers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["uid"].as_u64().unwrap())
        .collect();
    uids.sort();
    assert_eq!(uids, [UID as u64, UID as u64, OTHER_UID as u64], "{topic}");
    println!(
        "shmlink ls from a fifth container: topic {} of uid {}, subscribers' uids {uids:?}",
        topic["address"], topic["uid"]
    );

    // 1000 messages, then the end of the stream: every subscriber prints them all.
    {
        let mut stdin = publisher.stdin.take().unwrap();
        for i in 0..1000 {
            writeln!(stdin, "tick {i}").unwrap();
        }
    }
    let status = publisher.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(publisher.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "pub: {err}");
    for name in &subs {
        let code = podman_ok(&["wait", name]);
        assert_eq!(code.trim(), "0", "{name}");
        let logs = podman(&["logs", name]);
        let lines: Vec<String> = text(&logs.stdout).lines().map(String::from).collect();
        assert_eq!(lines.len(), 1000, "{name}: {}", text(&logs.stderr));
        assert_eq!(lines[0], "tick 0");
        assert_eq!(lines[999], "tick 999");
    }
}

/// A test image: the shmlink image plus the host's redis-server, redis-benchmark and the
/// libraries `ldd` lists for them (removed by the scope). `None` after a skip when this
/// machine has no redis (scripts/apps.sh install).
fn redis_image(scope: &mut Scope) -> Option<String> {
    let which = |p: &str| {
        Command::new("which")
            .arg(p)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| text(&o.stdout).trim().to_string())
    };
    let (Some(server), Some(bench)) = (which("redis-server"), which("redis-benchmark")) else {
        shmlink_testkit::skip(
            "apps",
            "no redis-server/redis-benchmark (scripts/apps.sh install)",
        );
        return None;
    };
    let ctx = std::env::temp_dir().join(format!("{}-redis-image", scope.prefix));
    let _ = std::fs::remove_dir_all(&ctx);
    let rootfs = ctx.join("root");
    std::fs::create_dir_all(rootfs.join("usr/bin")).unwrap();
    let ldd = Command::new("ldd")
        .args([&server, &bench])
        .output()
        .unwrap();
    for (from, name) in [(&server, "redis-server"), (&bench, "redis-benchmark")] {
        std::fs::copy(from, rootfs.join("usr/bin").join(name)).unwrap();
    }
    for line in text(&ldd.stdout).lines() {
        let Some((_, rest)) = line.split_once(" => ") else {
            continue;
        };
        let Some(lib) = rest
            .split_whitespace()
            .next()
            .filter(|l| l.starts_with('/'))
        else {
            continue;
        };
        let to = rootfs.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(lib, &to).unwrap();
    }
    std::fs::write(
        ctx.join("Containerfile"),
        format!("FROM {IMAGE}\nCOPY root /\n"),
    )
    .unwrap();
    let tag = format!("localhost/{}-redis:test", scope.prefix);
    let out = podman(&["build", "-q", "-t", &tag, &ctx.display().to_string()]);
    let _ = std::fs::remove_dir_all(&ctx);
    assert!(out.status.success(), "build {tag}: {}", text(&out.stderr));
    scope.images.push(tag.clone());
    Some(tag)
}

/// The requests/s of `test` (SET, GET) in redis-benchmark -q output.
fn rate(out: &str, test: &str) -> f64 {
    out.split(['\r', '\n'])
        .filter_map(|l| l.strip_prefix(&format!("{test}: ")))
        .filter_map(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .next_back()
        .unwrap_or_else(|| panic!("no {test} rate in: {out}"))
}

#[test]
fn redis_between_containers_in_transparent_mode() {
    let Some((_serial, _)) = setup() else {
        return;
    };
    let mut scope = Scope::new("redis");
    let Some(image) = redis_image(&mut scope) else {
        return;
    };
    let dir = scope.dir("rdv", UID, 0o700);
    let pod = format!("{}-pod", scope.prefix);
    scope.pods.push(pod.clone());
    podman_ok(&["pod", "create", "--name", &pod]);
    let user = format!("{UID}:{UID}");
    let volume = format!("{}:/run/shmlink", dir.display());
    let redis = scope.name("server");
    podman_ok(&[
        "run",
        "-d",
        "--pod",
        &pod,
        "--name",
        &redis,
        "--user",
        &user,
        "--read-only",
        "--cap-drop",
        "all",
        "-v",
        &volume,
        &image,
        "run",
        "--",
        "redis-server",
        "--port",
        "6379",
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]);
    // Registered: the preload library's socket for 127.0.0.1:6379 in the volume.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_dir(&dir).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with("-6379.sock")
    }) {
        assert!(
            Instant::now() < deadline,
            "redis-server did not register: {}",
            text(&podman(&["logs", &redis]).stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let bench = [
        "-p", "6379", "-c", "1", "-n", "20000", "-t", "set,get", "-q",
    ];
    let (mut plain, mut shm) = ((0f64, 0f64), (0f64, 0f64));
    for round in 0..2 {
        let name = scope.name(&format!("plain{round}"));
        let mut args = vec![
            "run",
            "--pod",
            &pod,
            "--name",
            &name,
            "--user",
            &user,
            "--read-only",
            "--entrypoint",
            "/usr/bin/redis-benchmark",
            &image,
        ];
        args.extend(bench);
        let out = podman(&args);
        let o = text(&out.stdout);
        assert!(out.status.success(), "{o}{}", text(&out.stderr));
        plain = (plain.0.max(rate(&o, "SET")), plain.1.max(rate(&o, "GET")));

        let name = scope.name(&format!("shm{round}"));
        let mut args = vec![
            "run",
            "--pod",
            &pod,
            "--name",
            &name,
            "--user",
            &user,
            "--read-only",
            "-e",
            "SHMLINK_LOG=debug",
            "-v",
            &volume,
            &image,
            "run",
            "--",
            "redis-benchmark",
        ];
        args.extend(bench);
        let out = podman(&args);
        let (o, e) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{o}{e}");
        // Every connection to the server, checked one by one in the preload's log.
        // (One line per connection the client opened: "A -> 127.0.0.1:6379: fd N on
        // shared memory", or "…; stays TCP".)
        let on_shm = e
            .lines()
            .filter(|l| l.contains("-> 127.0.0.1:6379: fd ") && l.ends_with("on shared memory"))
            .count();
        assert!(
            on_shm >= 2,
            "fewer than two connections on shared memory: {e}"
        );
        assert!(!e.contains("stays TCP"), "{e}");
        shm = (shm.0.max(rate(&o, "SET")), shm.1.max(rate(&o, "GET")));
    }
    println!(
        "redis-benchmark -c 1 between two containers of a pod, best of 2: plain TCP SET {:.0} GET {:.0} req/s, \
         shmlink run SET {:.0} GET {:.0} req/s; ratio SET {:.2} GET {:.2}",
        plain.0, plain.1, shm.0, shm.1, shm.0 / plain.0, shm.1 / plain.1
    );
}
