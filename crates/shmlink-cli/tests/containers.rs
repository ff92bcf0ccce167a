//! shmlink between real containers (podman with runc, rootful), each in the runtime's own
//! pid, net, ipc, uts and mount namespaces (never `--ipc host` or `--pid host`), sharing
//! only a bind-mounted rendezvous directory: the image of `scripts/image.sh build`,
//!
//! - `shm:` between two containers of different uids (`--allow-uid`/`--expect-uid`), the
//!   p50 round trip printed with its ratio to two plain processes in the same run, a
//!   third uid refused, and `shmlink ls` from a third container listing both ends of the
//!   live connection (a third uid's `ls` refused);
//! - a container SIGKILLed mid-stream (`podman kill -s KILL`): its peer gets a reset at
//!   once, `shmlink probe` in the volume fails, and a restarted container on the same
//!   volume serves again; a killed client leaves the server serving the next one;
//! - a topic: a publisher container and three subscriber containers (one of another
//!   uid), `shmlink ls` from a fifth container listing the publisher and every subscriber;
//! - transparent mode: a redis-server container and a redis-benchmark container, both
//!   under `shmlink run`, each in its own network namespace on a podman network (the
//!   connection to the other container's address claimed across namespaces) and in one
//!   pod (its shared network namespace, as in a Kubernetes Pod), every connection on
//!   shared memory, requests/s printed with the ratio to plain TCP between two containers
//!   on the network, server and client pinned apart (requirement `apps`: the host's redis
//!   from scripts/apps.sh, in `scripts/image.sh redis`'s image).
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
    // both ends of the live connection, the listener (which answers while it serves: its
    // accept thread) with its uid, and under it the client's connection with the client's
    // uid and counters that move. Pids are "-" (null): each container has its own PID
    // namespace, where the kernel has no number for the others' processes.
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
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut attempt = 0;
    let (ls, conn) = loop {
        attempt += 1;
        let ls = run(
            scope.run_args(&format!("ls{attempt}"), UID, &dir),
            &["ls", "--json"],
        );
        assert!(ls.status.success(), "{}", text(&ls.stderr));
        let v: Value = serde_json::from_slice(&ls.stdout).unwrap();
        let listeners = v["listeners"].as_array().unwrap();
        assert_eq!(listeners.len(), 1, "{v}");
        let l = listeners[0].clone();
        assert_eq!(l["uid"], UID, "{l}");
        assert!(l["path"].as_str().unwrap().ends_with("/pong.sock"), "{l}");
        assert_eq!(l["state"], "answered", "the listener serving a client: {l}");
        assert_eq!(l["pid"], Value::Null, "another PID namespace: {l}");
        assert_eq!(l["address"], "shm:pong", "{l}");
        // The client container may still be starting: its connection comes.
        if let Some(c) = l["connections"].as_array().unwrap().first() {
            break (ls, c.clone());
        }
        assert!(
            Instant::now() < deadline,
            "the client's connection never showed: {l}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(conn["transport"], "shm", "{conn}");
    assert_eq!(conn["peer_uid"], OTHER_UID, "{conn}");
    assert_eq!(conn["peer_pid"], Value::Null, "{conn}");
    println!(
        "shmlink ls from a third container during a run: {}",
        text(&ls.stdout).trim()
    );
    // Live: the counters move between two looks (the client streams round trips).
    let msgs = |c: &Value| c["msgs_in"].as_u64().unwrap();
    let before = msgs(&conn);
    std::thread::sleep(Duration::from_millis(500));
    let again = run(scope.run_args("ls-again", UID, &dir), &["ls", "--json"]);
    let v: Value = serde_json::from_slice(&again.stdout).unwrap();
    let after = msgs(&v["listeners"][0]["connections"][0]);
    assert!(
        after > before,
        "msgs_in did not move: {before} then {after}"
    );
    // The table, as a user reads it: the listener line and the client's line below it.
    let table = run(scope.run_args("ls-table", UID, &dir), &["ls"]);
    let t = text(&table.stdout);
    assert!(
        t.contains("shm:pong") && t.contains(&OTHER_UID.to_string()),
        "{t}"
    );
    println!(
        "shmlink ls (table) from a third container:\n{}",
        t.trim_end()
    );
    // Trust is not weakened: a third uid's `ls` learns nothing but that it may not ask.
    let out = run(
        scope.run_args("ls-stranger", STRANGER_UID, &dir),
        &["ls", "--json"],
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["listeners"][0]["state"], "permission_denied", "{v}");
    assert_eq!(v["listeners"][0]["connections"], Value::Null, "{v}");

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

/// The test image with redis: `scripts/image.sh redis` (the shmlink image plus the host's
/// redis-server, redis-benchmark and the libraries `ldd` lists for them). `None` after a
/// skip when this machine has no redis (scripts/apps.sh install).
fn redis_image() -> Option<String> {
    let has = |p: &str| {
        Command::new("which")
            .arg(p)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has("redis-server") || !has("redis-benchmark") {
        shmlink_testkit::skip(
            "apps",
            "no redis-server/redis-benchmark (scripts/apps.sh install)",
        );
        return None;
    }
    let tag = "localhost/shmlink-redis:dev";
    let out = Command::new(root().join("scripts/image.sh"))
        .args(["redis", tag])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/image.sh redis: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    Some(tag.to_string())
}

/// The CPUs this process may run on (`Cpus_allowed_list` of /proc/self/status).
fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or("")
        .trim();
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap());
    }
    cpus
}

/// The requests/s of `test` (SET, GET) in redis-benchmark -q output.
fn rate(out: &str, test: &str) -> f64 {
    out.split(['\r', '\n'])
        .filter_map(|l| l.strip_prefix(&format!("{test}: ")))
        .filter_map(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .next_back()
        .unwrap_or_else(|| panic!("no {test} rate in: {out}"))
}

/// `redis-benchmark -c 1` between containers, four ways, each server and client pinned to
/// CPUs of their own (`--cpuset-cpus`, as `--pattern apps` pins them on the host):
///
/// - shm across network namespaces: two containers on a podman network, each in its own
///   network namespace, both under `shmlink run`, sharing only the rendezvous volume: the
///   TCP connection to the other container's address claimed onto shared memory
///   (docs/containers.md, "Transparent mode between containers"), every connection
///   checked in the preload's log;
/// - TCP across network namespaces: a plain pair on the same network (the veth pairs and
///   the bridge): the baseline the ratios are taken against;
/// - shm in a pod: both containers in one pod (its shared network namespace, as in a
///   Kubernetes Pod; pid, ipc and mount namespaces their own), on loopback;
/// - TCP on the pod's loopback (a plain redis-benchmark against the preloaded server: a
///   plain peer sees plain TCP).
#[test]
fn redis_between_containers_in_transparent_mode() {
    let Some((_serial, _)) = setup() else {
        return;
    };
    let mut scope = Scope::new("redis");
    let Some(image) = redis_image() else {
        return;
    };
    let cpus = allowed_cpus();
    let (server_cpu, client_cpu) = match cpus[..] {
        [a, b, ..] => (Some(a.to_string()), Some(b.to_string())),
        _ => (None, None),
    };
    let pin = |cpu: &Option<String>| -> Vec<String> {
        cpu.iter()
            .flat_map(|c| ["--cpuset-cpus".to_string(), c.clone()])
            .collect()
    };
    let strs = |a: &[&str]| -> Vec<String> { a.iter().map(|s| s.to_string()).collect() };
    let dir = scope.dir("rdv", UID, 0o700);
    let pod = format!("{}-pod", scope.prefix);
    scope.pods.push(pod.clone());
    podman_ok(&["pod", "create", "--name", &pod]);
    let net = format!("{}-net", scope.prefix);
    scope.networks.push(net.clone());
    podman_ok(&["network", "create", &net]);
    let user = format!("{UID}:{UID}");
    let volume = format!("{}:/run/shmlink", dir.display());
    let base = strs(&["--user", &user, "--read-only", "--cap-drop", "all"]);
    let redis_args = ["--port", "6379", "--save", "", "--appendonly", "no"];
    let podman_vec = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        podman(&refs)
    };
    let ip_of = |name: &str| {
        let ip = podman_ok(&[
            "inspect",
            "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            name,
        ])
        .trim()
        .to_string();
        assert!(ip.parse::<std::net::Ipv4Addr>().is_ok(), "no IP: {ip:?}");
        ip
    };

    // Three servers: preloaded in the pod (loopback), preloaded on the network, plain on
    // the network. `where_` is `--pod POD` or `--network NET`.
    let server = |role: &str, where_: [&str; 2], preloaded: bool, bind: &str| -> String {
        let name = scope.name(role);
        let mut a = strs(&["run", "-d", "--name", &name]);
        a.extend(strs(&where_));
        a.extend(pin(&server_cpu));
        a.extend(base.clone());
        if preloaded {
            a.extend(strs(&["-v", &volume, &image, "run", "--", "redis-server"]));
        } else {
            a.extend(strs(&["--entrypoint", "/usr/bin/redis-server", &image]));
        }
        a.extend(strs(&["--bind", bind, "--protected-mode", "no"]));
        a.extend(strs(&redis_args));
        let out = podman_vec(a);
        assert!(out.status.success(), "{}", text(&out.stderr));
        name
    };
    let pod_server = server("pod-server", ["--pod", &pod], true, "127.0.0.1");
    let net_server = server("net-server", ["--network", &net], true, "0.0.0.0");
    let tcp_server = server("tcp-server", ["--network", &net], false, "0.0.0.0");
    let (net_ip, tcp_ip) = (ip_of(&net_server), ip_of(&tcp_server));
    let ns = |name: &str| namespaces(name)[1].clone();
    assert_ne!(ns(&net_server), ns(&pod_server));
    assert_ne!(ns(&net_server), ns(&tcp_server));

    // Registered: both preloaded servers' sockets for port 6379 in the volume.
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with("-6379.sock")
        })
        .count()
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "the redis-servers did not register: {}{}",
            text(&podman(&["logs", &pod_server]).stderr),
            text(&podman(&["logs", &net_server]).stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // One redis-benchmark container: `where_` as for the servers, preloaded or not;
    // its (SET, GET) rates, and the preload's wait counters when preloaded.
    let mut n = 0;
    let mut client = |where_: [&str; 2], host: &str, preloaded: bool| -> ((f64, f64), String) {
        n += 1;
        let mut a = strs(&["run", "--name", &scope.name(&format!("client{n}"))]);
        a.extend(strs(&where_));
        a.extend(pin(&client_cpu));
        a.extend(base.clone());
        if preloaded {
            a.extend(strs(&["-e", "SHMLINK_LOG=debug", "-e", "SHMLINK_STATS=1"]));
            a.extend(strs(&[
                "-v",
                &volume,
                &image,
                "run",
                "--",
                "redis-benchmark",
            ]));
        } else {
            a.extend(strs(&["--entrypoint", "/usr/bin/redis-benchmark", &image]));
        }
        a.extend(strs(&[
            "-h", host, "-p", "6379", "-c", "1", "-n", "10000", "-t", "set,get", "-q",
        ]));
        let out = podman_vec(a);
        let (o, e) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{o}{e}");
        let mut stats = String::new();
        if preloaded {
            // Every connection to the server, checked one by one in the preload's log
            // (one line per connection the client opened: "A -> HOST:6379: fd N on
            // shared memory", or "…; stays TCP").
            let on_shm = e
                .lines()
                .filter(|l| {
                    l.contains(&format!("-> {host}:6379: fd ")) && l.ends_with("on shared memory")
                })
                .count();
            assert!(
                on_shm >= 2,
                "fewer than two connections to {host} on shared memory: {e}"
            );
            assert!(!e.contains("stays TCP") && !e.contains("plain TCP"), "{e}");
            stats = e
                .lines()
                .find(|l| l.contains("]: stats "))
                .unwrap_or("")
                .to_string();
        }
        ((rate(&o, "SET"), rate(&o, "GET")), stats)
    };
    // (SET, GET), best of the rounds.
    let mut best = [(0f64, 0f64); 4];
    let mut stats = [String::new(), String::new()];
    for _ in 0..2 {
        let runs = [
            client(["--network", &net], &tcp_ip, false),
            client(["--network", &net], &net_ip, true),
            client(["--pod", &pod], "127.0.0.1", false),
            client(["--pod", &pod], "127.0.0.1", true),
        ];
        for (i, (r, st)) in runs.into_iter().enumerate() {
            best[i] = (best[i].0.max(r.0), best[i].1.max(r.1));
            if !st.is_empty() {
                stats[i / 2] = st;
            }
        }
    }
    let pinned = match (&server_cpu, &client_cpu) {
        (Some(s), Some(c)) => format!("server on CPU {s}, client on CPU {c}"),
        _ => "not pinned (one CPU allowed)".to_string(),
    };
    let [tcp, net_shm, pod_tcp, pod_shm] = best;
    println!(
        "redis-benchmark -c 1 between two containers, best of 2, {pinned}, SET / GET req/s:\n  \
         TCP, each in its own network namespace (podman network): {:.0} / {:.0}\n  \
         shmlink run, the same way (claimed across namespaces):   {:.0} / {:.0}  ratio {:.2} / {:.2}\n  \
         TCP on a pod's loopback:                                 {:.0} / {:.0}\n  \
         shmlink run, two containers of a pod:                    {:.0} / {:.0}  ratio {:.2} / {:.2}\n  \
         client's waits across namespaces: {}\n  client's waits in the pod: {}",
        tcp.0,
        tcp.1,
        net_shm.0,
        net_shm.1,
        net_shm.0 / tcp.0,
        net_shm.1 / tcp.1,
        pod_tcp.0,
        pod_tcp.1,
        pod_shm.0,
        pod_shm.1,
        pod_shm.0 / tcp.0,
        pod_shm.1 / tcp.1,
        stats[0],
        stats[1],
    );
}
