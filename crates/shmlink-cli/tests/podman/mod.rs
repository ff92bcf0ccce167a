//! What the container tests share (tests/containers.rs, tests/kube.rs): podman found
//! working or the skip reported (requirement `podman`), the image built once
//! (scripts/image.sh build), one test at a time, podman calls bounded by `timeout`, and a
//! scope whose containers and directories are removed whatever happens.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// The shmlink binary of this build (the probe, run from the host).
pub const BIN: &str = env!("CARGO_BIN_EXE_shmlink");
/// The image the tests run (scripts/image.sh build).
pub const IMAGE: &str = "localhost/shmlink:dev";
/// The image's user, and the other uids the tests run containers as.
pub const UID: u32 = 10001;
pub const OTHER_UID: u32 = 10002;
pub const STRANGER_UID: u32 = 10003;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `Ok(the image's shmlink)` once the image is built, `Err(reason)` when podman cannot run.
static SETUP: OnceLock<Result<PathBuf, String>> = OnceLock::new();
/// One container test at a time: they measure, and the machine has few CPUs.
static SERIAL: Mutex<()> = Mutex::new(());

/// Takes the machine for one test: `None` (after reporting the skip) when podman cannot
/// run containers here. Builds the image the first time (scripts/image.sh build, a
/// release build; a failure there fails the test).
pub fn setup() -> Option<(MutexGuard<'static, ()>, PathBuf)> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let r = SETUP.get_or_init(|| {
        let check = Command::new(root().join("scripts/containers.sh"))
            .arg("check")
            .output();
        match check {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                return Err(format!(
                    "podman cannot run a container here (scripts/containers.sh install): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ))
            }
            Err(e) => return Err(format!("scripts/containers.sh: {e}")),
        }
        let start = Instant::now();
        // The release build as from a shell: without the variables `cargo test` sets for
        // this process, which would make cargo rebuild (and rebuild again at the next
        // build from a shell).
        let mut image = Command::new(root().join("scripts/image.sh"));
        image.env_clear().args(["build", IMAGE]);
        for var in [
            "PATH",
            "HOME",
            "USER",
            "CARGO_HOME",
            "RUSTUP_HOME",
            "CARGO_TARGET_DIR",
            "TMPDIR",
        ] {
            if let Some(v) = std::env::var_os(var) {
                image.env(var, v);
            }
        }
        let out = image.output().expect("run scripts/image.sh");
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "scripts/image.sh build failed:\n{listing}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        println!(
            "image {IMAGE} ready in {:.1} s: {}",
            start.elapsed().as_secs_f64(),
            listing.lines().next().unwrap_or("")
        );
        // The image's own shmlink (dynamically linked against this machine's glibc), for
        // the plain processes the containers are compared with.
        Ok(root().join("target/image/root/usr/local/bin/shmlink"))
    });
    match r {
        Ok(bin) => Some((guard, bin.clone())),
        Err(why) => {
            shmlink_testkit::skip("podman", why);
            None
        }
    }
}

/// `podman ARGS`, bounded by `timeout` (coreutils), its output.
pub fn podman_for(secs: u32, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg(secs.to_string())
        .arg("podman")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run podman")
}

/// `podman ARGS`, bounded by three minutes.
pub fn podman(args: &[&str]) -> Output {
    podman_for(180, args)
}

/// Bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `podman ARGS` that must succeed; its stdout.
pub fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// A test's containers and rendezvous directories: removed on drop, whatever happened.
pub struct Scope {
    pub prefix: String,
    containers: Mutex<Vec<String>>,
    dirs: Vec<PathBuf>,
    /// Pods, networks and images of this test (removed on drop, after the containers).
    pub pods: Vec<String>,
    pub networks: Vec<String>,
    pub images: Vec<String>,
}

impl Scope {
    pub fn new(test: &str) -> Scope {
        Scope {
            prefix: format!("shmlink-t{}-{test}", std::process::id()),
            containers: Mutex::new(Vec::new()),
            dirs: Vec::new(),
            pods: Vec::new(),
            networks: Vec::new(),
            images: Vec::new(),
        }
    }

    /// A host directory for a rendezvous volume, owned by `uid`, with `mode`.
    pub fn dir(&mut self, name: &str, uid: u32, mode: u32) -> PathBuf {
        let d = std::env::temp_dir().join(format!("{}-{name}", self.prefix));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(uid), Some(uid)).unwrap();
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
        self.dirs.push(d.clone());
        d
    }

    /// A container name of this test (removed on drop).
    pub fn name(&self, role: &str) -> String {
        let n = format!("{}-{role}", self.prefix);
        self.containers.lock().unwrap().push(n.clone());
        n
    }

    /// `podman run` arguments for a container of this test: its own namespaces (the
    /// runtime's defaults), no network, read-only root, no capabilities, `uid`, the
    /// directory `dir` at /run/shmlink.
    pub fn run_args(&self, role: &str, uid: u32, dir: &Path) -> Vec<String> {
        [
            "run",
            "--name",
            &self.name(role),
            "--network",
            "none",
            "--read-only",
            "--cap-drop",
            "all",
            "--security-opt",
            "no-new-privileges",
            "--user",
            &format!("{uid}:{uid}"),
            "-v",
            &format!("{}:/run/shmlink", dir.display()),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let names = self
            .containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if !names.is_empty() {
            // --ignore: some may be gone already (removed by the test itself).
            let mut args = vec!["rm", "--force", "--ignore", "-t", "0"];
            args.extend(names.iter().map(|s| s.as_str()));
            let _ = podman(&args);
        }
        for pod in &self.pods {
            let _ = podman(&["pod", "rm", "--force", "--ignore", "-t", "0", pod]);
        }
        for net in &self.networks {
            let _ = podman(&["network", "rm", "--force", net]);
        }
        for image in &self.images {
            let _ = podman(&["rmi", "--force", "--ignore", image]);
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Runs `podman ARGS IMAGE CMD…` to completion: its output.
pub fn run(mut args: Vec<String>, cmd: &[&str]) -> Output {
    args.push(IMAGE.to_string());
    args.extend(cmd.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    podman(&refs)
}

/// Starts `podman run -d ARGS IMAGE CMD…`.
pub fn start(mut args: Vec<String>, cmd: &[&str]) {
    args.insert(1, "-d".to_string());
    let out = run(args, cmd);
    assert!(out.status.success(), "podman run -d: {}", text(&out.stderr));
}

/// Waits until `shmlink probe shm:NAME` in `dir` (run here, as root) passes.
pub fn wait_listening(dir: &Path, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = Command::new(BIN)
            .args(["probe", &format!("shm:{name}")])
            .env("SHMLINK_DIR", dir)
            .output()
            .unwrap();
        if out.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "nothing listens at shm:{name} in {}: {}",
            dir.display(),
            text(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
