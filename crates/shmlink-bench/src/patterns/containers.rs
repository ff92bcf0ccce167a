//! `shmlink-bench --pattern containers`: `shmlink pong` between two podman containers
//! (runc; each in its own namespaces, sharing only a rendezvous directory) over `shm:`,
//! against two plain processes over `shm:` and the same two containers over `tcp:` on a
//! podman network: p50 round trip and messages/s, rounds interleaved, medians shown.
//! The image is `scripts/image.sh build`'s (localhost/shmlink:dev); the plain processes
//! run the image's own binary. Then `redis-benchmark -c 1` between two containers, server
//! and client pinned to CPUs of their own (`--cpuset-cpus`, as `--pattern apps` pins them):
//! both under `shmlink run` on the podman network (each in its own network namespace,
//! the connection claimed across namespaces, docs/containers.md) and in one pod, against
//! plain TCP between two containers on the network and on the pod's loopback
//! (`scripts/image.sh redis`'s image; skipped without redis, scripts/apps.sh install).
//! Needs rootful podman (scripts/containers.sh install).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output, Stdio};
use std::time::{Duration, Instant};

use crate::cli::{positive, Cli, UsageError};
use crate::pattern::Pattern;

const IMAGE: &str = "localhost/shmlink:dev";
const UID: &str = "10001:10001";

/// `--pattern containers`.
pub struct Containers;

impl Pattern for Containers {
    fn name(&self) -> &'static str {
        "containers"
    }

    fn help(&self) -> &'static str {
        "shmlink pong between two podman containers (runc, rootful; scripts/containers.sh
install) sharing only a rendezvous directory: shm: across the containers, shm: between
two plain processes, tcp: between the same containers on a podman network; p50 round
trip and messages/s of 64 B, medians over the rounds. Builds the image first
(scripts/image.sh build). Then redis-benchmark -c 1 (SET, GET; 20000 requests, 5000
with --quick) between two containers pinned to two CPUs: both under shmlink run on a
podman network and in one pod (shared memory), against plain TCP between two containers
on the network and on a pod's loopback (needs redis: scripts/apps.sh install). Options: --iterations
(round trips; 10 x as many streamed messages), --rounds, --quick."
    }

    fn flags(&self) -> &'static [&'static str] {
        &["iterations", "rounds", "quick"]
    }

    fn run(&self, cli: &Cli) -> Result<ExitCode, UsageError> {
        let mut n: u64 = if cli.quick { 5_000 } else { 50_000 };
        let mut rounds: u32 = if cli.quick { 1 } else { 3 };
        if let Some(t) = &cli.iterations {
            n = positive(t, "--iterations")?;
        }
        if let Some(t) = &cli.rounds {
            rounds = positive(t, "--rounds")?;
        }
        Ok(match run(n, rounds) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("shmlink-bench: containers: {e}");
                ExitCode::from(1)
            }
        })
    }
}

/// The repository (scripts/, target/).
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `podman ARGS` bounded by `timeout` (coreutils); `Err` with its output on failure.
fn podman(args: &[&str]) -> Result<Output, String> {
    let out = Command::new("timeout")
        .arg("300")
        .arg("podman")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("podman: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "podman {}: {}{}",
            args.join(" "),
            text(&out.stdout),
            text(&out.stderr)
        ))
    }
}

/// What `pong --json` measured: p50 (µs) or messages/s.
fn figure(out: &Output, key: &str) -> Result<f64, String> {
    let stdout = text(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| format!("no JSON row: {stdout}{}", text(&out.stderr)))?;
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let x = match key {
        "p50" => v["rtt_ns"]["p50"].as_f64().map(|ns| ns / 1e3),
        _ => v["msgs_per_s"].as_f64(),
    };
    x.ok_or_else(|| format!("no {key} in {line}"))
}

/// What the run made, removed on drop.
struct Scope {
    prefix: String,
    dir: PathBuf,
}

impl Drop for Scope {
    fn drop(&mut self) {
        let names: Vec<String> = [
            "shm",
            "tcp",
            "redis-shm",
            "redis-net",
            "redis-tcp",
            "redis-client",
        ]
        .iter()
        .map(|r| format!("{}-{r}", self.prefix))
        .collect();
        let mut args = vec!["rm", "--force", "--ignore", "-t", "0"];
        args.extend(names.iter().map(|s| s.as_str()));
        let _ = podman(&args);
        let _ = podman(&["pod", "rm", "--force", "--ignore", "-t", "0", &self.prefix]);
        let _ = podman(&["network", "rm", "--force", &self.prefix]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(n: u64, rounds: u32) -> Result<(), String> {
    let start = Instant::now();
    let image = Command::new(root().join("scripts/image.sh"))
        .args(["build", IMAGE])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("scripts/image.sh: {e}"))?;
    if !image.success() {
        return Err("scripts/image.sh build failed (scripts/containers.sh install?)".into());
    }
    eprintln!("image ready in {:.1} s", start.elapsed().as_secs_f64());
    let plain_bin = root().join("target/image/root/usr/local/bin/shmlink");
    let prefix = format!("shmlink-bench-{}", std::process::id());
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let scope = Scope {
        prefix: prefix.clone(),
        dir: dir.clone(),
    };
    std::os::unix::fs::chown(&dir, Some(10001), Some(10001)).map_err(|e| e.to_string())?;
    let volume = format!("{}:/run/shmlink", dir.display());
    podman(&["network", "create", &prefix])?;
    let shm_server = format!("{prefix}-shm");
    let tcp_server = format!("{prefix}-tcp");
    podman(&[
        "run",
        "-d",
        "--name",
        &shm_server,
        "--network",
        "none",
        "--user",
        UID,
        "-v",
        &volume,
        IMAGE,
        "pong",
        "--server",
        "--cpus",
        "none",
        "shm:pong",
    ])?;
    podman(&[
        "run",
        "-d",
        "--name",
        &tcp_server,
        "--network",
        &prefix,
        "--user",
        UID,
        IMAGE,
        "pong",
        "--server",
        "--cpus",
        "none",
        "tcp:0.0.0.0:7000",
    ])?;
    let ip = text(
        &podman(&[
            "inspect",
            "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &tcp_server,
        ])?
        .stdout,
    )
    .trim()
    .to_string();
    let tcp_addr = format!("tcp:{ip}:7000");
    std::thread::sleep(Duration::from_secs(1));

    let counts = [n.to_string(), (10 * n).to_string()];
    let rows = [
        "shm, two plain processes",
        "shm, two containers",
        "tcp, two containers",
    ];
    let mut p50 = vec![Vec::new(); 3];
    let mut rate = vec![Vec::new(); 3];
    for round in 0..rounds {
        eprintln!("round {} of {rounds}", round + 1);
        for (mode, count) in [("--latency", &counts[0]), ("--throughput", &counts[1])] {
            let mut pong: Vec<&str> =
                vec!["pong", "--client", "--json", "--cpus", "none", "-n", count];
            if mode == "--latency" {
                pong.push("--latency");
            }
            let plain_dir = dir.join("plain");
            let mut plain_args: Vec<&str> =
                pong.iter().copied().filter(|a| *a != "--client").collect();
            plain_args.push("shm:plain");
            let plain = Command::new(&plain_bin)
                .args(&plain_args)
                .env("SHMLINK_DIR", &plain_dir)
                .output()
                .map_err(|e| format!("{}: {e}", plain_bin.display()))?;
            let mut shm: Vec<&str> = vec![
                "run",
                "--rm",
                "--network",
                "none",
                "--user",
                UID,
                "-v",
                &volume,
                IMAGE,
            ];
            shm.extend(&pong);
            shm.push("shm:pong");
            let mut tcp: Vec<&str> =
                vec!["run", "--rm", "--network", &prefix, "--user", UID, IMAGE];
            tcp.extend(&pong);
            tcp.push(&tcp_addr);
            let outs = [plain, podman(&shm)?, podman(&tcp)?];
            for (i, out) in outs.iter().enumerate() {
                if mode == "--latency" {
                    p50[i].push(figure(out, "p50")?);
                } else {
                    rate[i].push(figure(out, "rate")?);
                }
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "{:<28} {:>10} {:>14}",
        "64 B messages", "p50 us", "messages/s"
    );
    let mut p = Vec::new();
    for i in 0..3 {
        p.push(median(&mut p50[i]));
        println!(
            "{:<28} {:>10.2} {:>14.0}",
            rows[i],
            p[i],
            median(&mut rate[i])
        );
    }
    println!(
        "p50 ratio, two containers / two plain processes over shm: {:.2}",
        p[1] / p[0]
    );
    redis(
        &prefix,
        &volume,
        if n < 50_000 { 5_000 } else { 20_000 },
        rounds,
    )?;
    drop(scope);
    Ok(())
}

/// The redis rows: `redis-benchmark -c 1` between two containers pinned apart, over
/// shared memory (a pod, both under `shmlink run`) and over plain TCP (the podman network
/// `prefix`; the pod's loopback). Medians of `rounds`.
fn redis(prefix: &str, volume: &str, requests: u32, rounds: u32) -> Result<(), String> {
    let has = |p: &str| {
        Command::new("which")
            .arg(p)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has("redis-server") || !has("redis-benchmark") {
        println!("redis: skipped (no redis-server/redis-benchmark: scripts/apps.sh install)");
        return Ok(());
    }
    let image = "localhost/shmlink-redis:dev";
    let built = Command::new(root().join("scripts/image.sh"))
        .args(["redis", image])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("scripts/image.sh redis: {e}"))?;
    if !built.success() {
        return Err("scripts/image.sh redis failed".into());
    }
    let cpus = shmlink_measure::cpus::allowed_cpus();
    let (server_cpu, client_cpu) = match cpus[..] {
        [s, c, ..] => (Some(s.to_string()), Some(c.to_string())),
        _ => (None, None),
    };
    let pin = |cpu: &Option<String>| -> Vec<String> {
        cpu.iter()
            .flat_map(|c| ["--cpuset-cpus".to_string(), c.clone()])
            .collect()
    };
    let run = |args: Vec<String>| -> Result<Output, String> {
        let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        podman(&refs)
    };
    let strs = |a: &[&str]| -> Vec<String> { a.iter().map(|s| s.to_string()).collect() };
    let base = strs(&["--user", UID, "--read-only", "--cap-drop", "all"]);
    let server_args = strs(&["--port", "6379", "--save", "", "--appendonly", "no"]);
    podman(&["pod", "create", "--name", prefix])?;
    // Servers: preloaded in the pod, preloaded on the network, plain on the network.
    let server = |name: &str, where_: [&str; 2], preloaded: bool, bind: &str| {
        let mut a = strs(&["run", "-d", "--name", name]);
        a.extend(strs(&where_));
        a.extend(pin(&server_cpu));
        a.extend(base.clone());
        if preloaded {
            a.extend(strs(&["-v", volume, image, "run", "--", "redis-server"]));
        } else {
            a.extend(strs(&["--entrypoint", "/usr/bin/redis-server", image]));
        }
        a.extend(strs(&["--bind", bind, "--protected-mode", "no"]));
        a.extend(server_args.clone());
        run(a)
    };
    server(
        &format!("{prefix}-redis-shm"),
        ["--pod", prefix],
        true,
        "127.0.0.1",
    )?;
    server(
        &format!("{prefix}-redis-net"),
        ["--network", prefix],
        true,
        "0.0.0.0",
    )?;
    server(
        &format!("{prefix}-redis-tcp"),
        ["--network", prefix],
        false,
        "0.0.0.0",
    )?;
    let ip_of = |role: &str| -> Result<String, String> {
        Ok(text(
            &podman(&[
                "inspect",
                "--format",
                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                &format!("{prefix}-{role}"),
            ])?
            .stdout,
        )
        .trim()
        .to_string())
    };
    let (tcp_ip, net_ip) = (ip_of("redis-tcp")?, ip_of("redis-net")?);
    std::thread::sleep(Duration::from_secs(1));
    let n = requests.to_string();
    // (row, --network or --pod, host, preloaded)
    let rows = [
        (
            "tcp, two containers on a network",
            true,
            tcp_ip.as_str(),
            false,
        ),
        ("shmlink run, the same way", true, net_ip.as_str(), true),
        (
            "tcp, two containers in a pod (lo)",
            false,
            "127.0.0.1",
            false,
        ),
        ("shmlink run, containers in a pod", false, "127.0.0.1", true),
    ];
    let mut set = vec![Vec::new(); rows.len()];
    let mut get = vec![Vec::new(); rows.len()];
    let client = format!("{prefix}-redis-client");
    for round in 0..rounds {
        eprintln!("redis round {} of {rounds}", round + 1);
        for (i, &(row, on_net, host, preloaded)) in rows.iter().enumerate() {
            let mut a = strs(&["run", "--rm", "--name", &client]);
            if on_net {
                a.extend(strs(&["--network", prefix]));
            } else {
                a.extend(strs(&["--pod", prefix]));
            }
            a.extend(pin(&client_cpu));
            a.extend(base.clone());
            if preloaded {
                a.extend(strs(&["-v", volume, image, "run", "--", "redis-benchmark"]));
            } else {
                a.extend(strs(&["--entrypoint", "/usr/bin/redis-benchmark", image]));
            }
            a.extend(strs(&[
                "-h", host, "-p", "6379", "-c", "1", "-n", &n, "-t", "set,get", "-q",
            ]));
            let out = text(&run(a)?.stdout);
            let rate = |test: &str| -> Result<f64, String> {
                out.split(['\r', '\n'])
                    .filter_map(|l| l.strip_prefix(&format!("{test}: ")))
                    .filter_map(|l| l.split_whitespace().next()?.parse::<f64>().ok())
                    .next_back()
                    .ok_or_else(|| format!("{row}: no {test} rate in: {out}"))
            };
            set[i].push(rate("SET")?);
            get[i].push(rate("GET")?);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let pinned = match (&server_cpu, &client_cpu) {
        (Some(s), Some(c)) => format!("server on CPU {s}, client on CPU {c}"),
        _ => "not pinned (one CPU allowed)".to_string(),
    };
    println!();
    println!(
        "{:<34} {:>10} {:>10}   (redis-benchmark -c 1 -n {n}, {pinned})",
        "redis", "SET req/s", "GET req/s"
    );
    let (mut s, mut g) = (Vec::new(), Vec::new());
    for (i, row) in rows.iter().enumerate() {
        s.push(median(&mut set[i]));
        g.push(median(&mut get[i]));
        println!("{:<34} {:>10.0} {:>10.0}", row.0, s[i], g[i]);
    }
    println!(
        "shmlink run / tcp on a network: SET {:.2}x GET {:.2}x across network namespaces, \
         SET {:.2}x GET {:.2}x in a pod",
        s[1] / s[0],
        g[1] / g[0],
        s[3] / s[0],
        g[3] / g[0]
    );
    Ok(())
}
