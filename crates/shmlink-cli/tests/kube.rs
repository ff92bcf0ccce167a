//! deploy/k8s's manifests run as pods by `podman kube play` (podman 4.3, runc; no
//! kubelet), as written (but for one line for podman before 4.6: `podman_playable`), with
//! the image of `scripts/image.sh build`:
//!
//! - pod-sidecar.yaml: the Pod runs, its client container makes its latency run over
//!   `shm` and exits 0, the server's probe command (read from the manifest, run the way
//!   a kubelet runs an exec probe: in the container, without a shell) passes; after
//!   `podman kill -s KILL` of the server the same command, run on the Pod's rendezvous
//!   volume, fails at its first run (well within the probe's period) although the
//!   socket file is still there;
//! - node-local.yaml: the server Deployment's Pod runs (its init container, busybox,
//!   hands the hostPath to uid 10001), and a client made as the Job's Pod spec says
//!   (podman 4.3 runs neither Jobs nor Services: the Service's name is given to it with
//!   `--add-host`) upgrades `auto:` to shared memory through the hostPath, and stays on
//!   TCP over the podman network without it; `shmlink probe` fails after the server is
//!   killed.
//!
//! Every pod, container, volume and the hostPath directory are removed at the end, failed
//! or not (`podman kube down`, `podman rm`, `podman volume rm`).

mod podman;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use podman::*;
use serde::Deserialize;
use serde_yaml_ng::Value;

/// The YAML documents of a file in the repository.
fn documents(rel: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(root().join(rel)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|d| !d.is_null())
        .collect()
}

/// `v[path]` for a dotted path of mapping keys.
fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, k| &v[k])
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("not a list: {v:?}"))
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// The container `name` of the pod spec `spec`.
fn container<'a>(spec: &'a Value, name: &str) -> &'a Value {
    spec["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// podman's version, e.g. (4, 3).
fn podman_version() -> (u32, u32) {
    let v = podman_ok(&["version", "--format", "{{.Client.Version}}"]);
    let mut parts = v.trim().split('.').map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The manifest `rel` as podman can play it. podman before 4.6 gives a Pod's init
/// containers the Pod's restart policy (podman#16343, fixed by podman#18481): under a
/// Deployment's `Always` an init container that exits is started again at once, in a
/// loop, and `kube play` fails to remove it ("cannot remove container … as it is
/// running"). Kubernetes allows only `Always` in a Deployment, so the file keeps it;
/// for such a podman the test plays a copy whose Deployment Pods say `OnFailure`, which
/// podman applies to the init container too (it exits 0, so it is not restarted).
fn podman_playable(rel: &str) -> PathBuf {
    let file = root().join(rel);
    if podman_version() >= (4, 6) {
        return file;
    }
    let text = std::fs::read_to_string(&file).unwrap();
    let docs: Vec<String> = text
        .split("\n---\n")
        .map(|d| {
            if !d.contains("\nkind: Deployment\n") {
                return d.to_string();
            }
            let template = "\n  template:\n";
            let at = d.find(template).expect("a Deployment's template") + template.len();
            let (head, tail) = d.split_at(at);
            let spec = "\n    spec:\n";
            assert_eq!(tail.matches(spec).count(), 1, "{rel}: one Pod spec");
            format!(
                "{head}{}",
                tail.replacen(spec, &format!("{spec}      restartPolicy: OnFailure\n"), 1)
            )
        })
        .collect();
    let copy = std::env::temp_dir().join(format!(
        "shmlink-t{}-{}",
        std::process::id(),
        file.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&copy, docs.join("\n---\n")).unwrap();
    copy
}

/// What `podman kube play` made of a file, torn down on drop.
struct Played {
    file: PathBuf,
    volumes: Vec<String>,
    host_dirs: Vec<PathBuf>,
    extra: Vec<String>,
}

impl Played {
    /// Plays `file`, the repository's `rel` or a copy of it.
    fn play(rel: &str, file: PathBuf, volumes: &[&str], host_dirs: &[&str]) -> Played {
        let played = Played {
            file,
            volumes: volumes.iter().map(|s| s.to_string()).collect(),
            // Only directories this test creates are removed.
            host_dirs: host_dirs
                .iter()
                .map(PathBuf::from)
                .filter(|d| !d.exists())
                .collect(),
            extra: Vec::new(),
        };
        let file = played.file.display().to_string();
        // Leftovers of an earlier run that was killed.
        let _ = podman(&["kube", "down", &file]);
        let out = podman(&["kube", "play", &file]);
        assert!(
            out.status.success(),
            "podman kube play {rel}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        played
    }
}

impl Drop for Played {
    fn drop(&mut self) {
        if !self.extra.is_empty() {
            let mut args = vec!["rm", "--force", "--ignore", "-t", "0"];
            args.extend(self.extra.iter().map(|s| s.as_str()));
            let _ = podman(&args);
        }
        let _ = podman(&["kube", "down", &self.file.display().to_string()]);
        if self.file.starts_with(std::env::temp_dir()) {
            let _ = std::fs::remove_file(&self.file);
        }
        for v in &self.volumes {
            let _ = podman(&["volume", "rm", "--force", v]);
        }
        for d in &self.host_dirs {
            let _ = std::fs::remove_dir_all(d);
            // And its parent if that is empty now (/run/shmlink of /run/shmlink/pong).
            if let Some(p) = d.parent() {
                let _ = std::fs::remove_dir(p);
            }
        }
    }
}

/// Waits until `podman inspect --format FORMAT NAME` prints `want`.
fn wait_for(name: &str, format: &str, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let out = podman(&["inspect", "--format", format, name]);
        let got = text(&out.stdout).trim().to_string();
        if got == want {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: {format} is {got:?}, not {want:?}: {}",
            text(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Where podman keeps named volume `v` on this host.
fn volume_dir(v: &str) -> PathBuf {
    PathBuf::from(podman_ok(&["volume", "inspect", "--format", "{{.Mountpoint}}", v]).trim())
}

/// The transport column of `pong`'s table row.
fn transport(stdout: &str) -> String {
    stdout
        .lines()
        .find(|l| !l.starts_with('#') && !l.starts_with("transport"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no result row: {stdout}"))
        .to_string()
}

#[test]
fn pod_sidecar_runs_and_its_probe_fails_once_the_server_is_killed() {
    let Some(_serial) = setup() else {
        return;
    };
    let rel = "deploy/k8s/pod-sidecar.yaml";
    let docs = documents(rel);
    let pod = &docs[0];
    let name = pod["metadata"]["name"].as_str().unwrap().to_string();
    let spec = &pod["spec"];
    let volume = spec["volumes"][0]["name"].as_str().unwrap().to_string();
    let server = container(spec, "server");
    let probe = strings(at(server, "livenessProbe.exec.command"));
    assert_eq!(
        probe,
        strings(at(server, "readinessProbe.exec.command")),
        "one probe command"
    );
    let period = at(server, "livenessProbe.periodSeconds").as_u64().unwrap();

    let _played = Played::play(rel, root().join(rel), &[&volume], &[]);
    let server_ctr = format!("{name}-server");
    let client_ctr = format!("{name}-client");
    // The client's one run, then exit 0; its row says shm.
    wait_for(&client_ctr, "{{.State.Status}}", "exited");
    wait_for(&client_ctr, "{{.State.ExitCode}}", "0");
    let logs = podman_ok(&["logs", &client_ctr]);
    assert_eq!(transport(&logs), "shm", "{logs}");
    wait_for(&server_ctr, "{{.State.Status}}", "running");

    // The probe as a kubelet runs it: exec in the container, no shell.
    let mut exec = vec!["exec", server_ctr.as_str()];
    exec.extend(probe.iter().map(|s| s.as_str()));
    let out = podman(&exec);
    assert!(
        out.status.success(),
        "probe of a live server: {}",
        text(&out.stderr)
    );
    println!("{rel}: client row: {}", logs.lines().last().unwrap_or(""));
    println!(
        "{rel}: probe {probe:?} on the live server: {}",
        text(&out.stdout).trim()
    );

    // SIGKILL: the socket file stays in the volume, the probe fails at its next run.
    let killed = Instant::now();
    podman_ok(&["kill", "-s", "KILL", &server_ctr]);
    let mut args = vec![
        "run".to_string(),
        "--rm".into(),
        "--user".into(),
        format!("{UID}:{UID}"),
        "-v".into(),
        format!("{volume}:/run/shmlink"),
        "--entrypoint".into(),
        probe[0].clone(),
        IMAGE.into(),
    ];
    args.extend(probe[1..].iter().cloned());
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = podman(&refs);
    let after = killed.elapsed();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("listener that is gone"), "{err}");
    let sock = volume_dir(&volume).join("pong.sock");
    assert!(sock.exists(), "the killed server's socket file is gone?");
    println!(
        "{rel}: server SIGKILLed; the probe (in a new container on the volume) failed {:.1} s later \
         (period {period} s; most of it is starting that container), while {} still exists: {}",
        after.as_secs_f64(),
        sock.display(),
        err.trim()
    );
}

#[test]
fn node_local_server_runs_and_auto_upgrades_through_the_host_path() {
    let Some(_serial) = setup() else {
        return;
    };
    let rel = "deploy/k8s/node-local.yaml";
    let docs = documents(rel);
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"].as_str() == Some(k))
            .unwrap_or_else(|| panic!("{rel}: no {k}"))
    };
    let deployment = kind("Deployment");
    let job = kind("Job");
    let service = kind("Service");
    let service_name = service["metadata"]["name"].as_str().unwrap();
    let host_path = deployment["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"]
        .as_str()
        .unwrap()
        .to_string();
    let job_spec = &job["spec"]["template"]["spec"];
    let client = &job_spec["containers"][0];
    let client_args = strings(&client["args"]);
    let client_uid = job_spec["securityContext"]["runAsUser"].as_u64().unwrap();
    let mount = client["volumeMounts"][0]["mountPath"].as_str().unwrap();
    let dir_env = client["env"][0]["value"].as_str().unwrap();
    let init_image = deployment["spec"]["template"]["spec"]["initContainers"][0]["image"]
        .as_str()
        .unwrap()
        .to_string();
    busybox_image(&init_image);

    let mut played = Played::play(rel, podman_playable(rel), &[], &[&host_path]);
    let deploy_name = deployment["metadata"]["name"].as_str().unwrap();
    let pod = format!("{deploy_name}-pod-0");
    let server_ctr = format!("{pod}-server");
    wait_for(&server_ctr, "{{.State.Status}}", "running");
    let infra = podman_ok(&["pod", "inspect", "--format", "{{.InfraContainerID}}", &pod]);
    let net = podman_ok(&[
        "inspect",
        "--format",
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{$v.IPAddress}}{{end}}",
        infra.trim(),
    ]);
    let (network, ip) = net
        .trim()
        .split_once(' ')
        .expect("the pod's network and address");
    let port = client_args
        .last()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    // Listening: the probe in the server container (its socket dir is the hostPath).
    let out = podman(&[
        "exec",
        &server_ctr,
        "shmlink",
        "probe",
        &format!("auto:127.0.0.1:{port}"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let hp = Path::new(&host_path);
    let modes = std::fs::metadata(hp).unwrap();
    assert_eq!(
        (
            std::os::unix::fs::MetadataExt::uid(&modes),
            std::os::unix::fs::MetadataExt::mode(&modes) & 0o777
        ),
        (10001, 0o700),
        "the init container's owner and mode on {host_path}"
    );

    // The Job's client, as its Pod spec says, on the pods' network: with the hostPath,
    // auto: upgrades to shm; without it, it stays on TCP.
    let mut runs = Vec::new();
    for with_dir in [true, false] {
        let name = format!("shmlink-t{}-nl-client-{with_dir}", std::process::id());
        played.extra.push(name.clone());
        let mut args = vec![
            "run".to_string(),
            "--name".into(),
            name,
            "--network".into(),
            network.to_string(),
            "--add-host".into(),
            format!("{service_name}:{ip}"),
            "--user".into(),
            format!("{client_uid}:{client_uid}"),
            "--read-only".into(),
            "--cap-drop".into(),
            "all".into(),
            "-e".into(),
            format!("SHMLINK_DIR={dir_env}"),
        ];
        if with_dir {
            args.extend(["-v".to_string(), format!("{host_path}:{mount}:ro")]);
        }
        args.push(IMAGE.into());
        args.extend(client_args.iter().cloned());
        let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let out = podman(&refs);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
        runs.push((
            with_dir,
            transport(&stdout),
            stdout.lines().last().unwrap_or("").to_string(),
        ));
    }
    for (with_dir, t, row) in &runs {
        println!(
            "{rel}: Job client {} the hostPath: {row}",
            if *with_dir { "with" } else { "without" }
        );
        assert_eq!(t, if *with_dir { "shm" } else { "tcp" }, "{row}");
    }

    // Killed: the TCP side refuses, the probe fails.
    podman_ok(&["kill", "-s", "KILL", &server_ctr]);
    let name = format!("shmlink-t{}-nl-probe", std::process::id());
    played.extra.push(name.clone());
    let out = podman(&[
        "run",
        "--name",
        &name,
        "--network",
        network,
        IMAGE,
        "probe",
        &format!("auto:{ip}:{port}"),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    println!("{rel}: server SIGKILLed: {}", text(&out.stderr).trim());
}

/// The init container's busybox image: pulled where a registry is reachable; here made
/// from this machine's static busybox (Debian's busybox-static) under the same name.
fn busybox_image(name: &str) {
    if podman(&["image", "exists", name]).status.success() {
        return;
    }
    let busybox = Path::new("/bin/busybox");
    let ldd = Command::new("ldd").arg(busybox).output();
    let is_static =
        ldd.is_ok_and(|o| !o.status.success() || text(&o.stdout).contains("not a dynamic"));
    assert!(
        busybox.exists() && is_static,
        "no registry to pull {name} from and no static /bin/busybox to make it from (apt-get install busybox-static)"
    );
    let ctx = std::env::temp_dir().join(format!("shmlink-busybox-{}", std::process::id()));
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::copy(busybox, ctx.join("busybox")).unwrap();
    std::fs::write(
        ctx.join("Containerfile"),
        "FROM scratch\nCOPY busybox /bin/busybox\nENTRYPOINT [\"/bin/busybox\"]\nCMD [\"sh\"]\n",
    )
    .unwrap();
    let out = podman(&["build", "-q", "-t", name, &ctx.display().to_string()]);
    let _ = std::fs::remove_dir_all(&ctx);
    assert!(out.status.success(), "build {name}: {}", text(&out.stderr));
}
