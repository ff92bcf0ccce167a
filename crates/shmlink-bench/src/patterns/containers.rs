//! `shmlink-bench --pattern containers`: `shmlink pong` between two podman containers
//! (runc; each in its own namespaces, sharing only a rendezvous directory) over `shm:`,
//! against two plain processes over `shm:` and the same two containers over `tcp:` on a
//! podman network: p50 round trip and messages/s, rounds interleaved, medians shown.
//! The image is `scripts/image.sh build`'s (localhost/shmlink:dev); the plain processes
//! run the image's own binary. Needs rootful podman (scripts/containers.sh install).

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
(scripts/image.sh build). Options: --iterations (round trips; 10 x as many streamed
messages), --rounds, --quick."
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
fn root() -> PathBuf {
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
        let names: Vec<String> = ["shm", "tcp"]
            .iter()
            .map(|r| format!("{}-{r}", self.prefix))
            .collect();
        let mut args = vec!["rm", "--force", "--ignore", "-t", "0"];
        args.extend(names.iter().map(|s| s.as_str()));
        let _ = podman(&args);
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
    for i in 0..3 {
        println!(
            "{:<28} {:>10.2} {:>14.0}",
            rows[i],
            median(&mut p50[i]),
            median(&mut rate[i])
        );
    }
    drop(scope);
    Ok(())
}
