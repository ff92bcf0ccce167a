//! The container recipes in `deploy/` (docs/containers.md): every YAML document in them
//! parses and has the fields Docker Compose or Kubernetes require, the pieces that must
//! agree do (uids, the shared rendezvous directory, probes, Services, selectors), every
//! `shmlink` command line uses commands and flags the built binary has, and the `shm:`
//! recipes run here as written: server and client as separate processes, sharing a
//! directory the way their containers share a volume.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_yaml_ng::Value;

const SHMLINK: &str = env!("CARGO_BIN_EXE_shmlink");

const DOCKERFILE: &str = "deploy/Dockerfile";
const COMPOSE: &str = "deploy/docker-compose.yml";
const POD_SIDECAR: &str = "deploy/k8s/pod-sidecar.yaml";
const NODE_LOCAL: &str = "deploy/k8s/node-local.yaml";
const DOCS: &str = "docs/containers.md";

/// Every file the recipes consist of; a missing one fails the tests by name.
const REQUIRED: &[&str] = &[
    DOCKERFILE,
    "deploy/Dockerfile.dockerignore",
    COMPOSE,
    POD_SIDECAR,
    NODE_LOCAL,
    DOCS,
];

/// Kinds the manifests may use, with the apiVersion each must name.
const KINDS: &[(&str, &str)] = &[
    ("Pod", "v1"),
    ("Service", "v1"),
    ("ConfigMap", "v1"),
    ("Secret", "v1"),
    ("ServiceAccount", "v1"),
    ("Namespace", "v1"),
    ("Deployment", "apps/v1"),
    ("StatefulSet", "apps/v1"),
    ("DaemonSet", "apps/v1"),
    ("Job", "batch/v1"),
    ("CronJob", "batch/v1"),
];

/// Transports an address may name in a recipe (docs/design.md §6.1): the library's registry.
/// Those the built binary does not list yet are checked for their `HOST:PORT` shape only.
fn transports() -> impl Iterator<Item = &'static str> {
    shmlink::Transport::ALL.iter().map(|t| t.as_str())
}

// ---------------------------------------------------------------------------------
// Files and YAML

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| {
        panic!(
            "{rel}: cannot read it ({e}); it is part of the container recipes (docs/containers.md)"
        )
    })
}

/// Every non-empty YAML document of `rel`, with `<<` merge keys applied (Compose's
/// extension fields use them).
fn documents(rel: &str) -> Vec<Value> {
    let text = read(rel);
    let mut docs = Vec::new();
    for (i, de) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
        let mut doc = Value::deserialize(de)
            .unwrap_or_else(|e| panic!("{rel}: document {}: invalid YAML: {e}", i + 1));
        doc.apply_merge()
            .unwrap_or_else(|e| panic!("{rel}: document {}: bad merge key: {e}", i + 1));
        if !doc.is_null() {
            docs.push(doc);
        }
    }
    assert!(!docs.is_empty(), "{rel}: no YAML document in it");
    docs
}

/// Every `.yml`/`.yaml` file under `deploy/`, relative to the repository root.
fn yaml_files() -> Vec<String> {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) {
        let entries = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{rel}: cannot list it ({e}): the recipes live there"));
        for entry in entries {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = format!("{rel}/{name}");
            if entry.file_type().unwrap().is_dir() {
                walk(&entry.path(), &path, out);
            } else if name.ends_with(".yml") || name.ends_with(".yaml") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join("deploy"), "deploy", &mut out);
    out.sort();
    out
}

fn at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, key| v.get(key))
}

fn str_at<'a>(v: &'a Value, path: &str) -> Option<&'a str> {
    at(v, path).and_then(Value::as_str)
}

fn seq_at<'a>(v: &'a Value, path: &str) -> &'a [Value] {
    at(v, path)
        .and_then(Value::as_sequence)
        .map_or(&[], Vec::as_slice)
}

fn int(v: Option<&Value>) -> Option<i64> {
    v.and_then(Value::as_i64)
}

/// A YAML mapping of strings to strings (labels, selectors, Compose environment).
fn string_map(v: Option<&Value>) -> Option<BTreeMap<String, String>> {
    v?.as_mapping()?
        .iter()
        .map(|(k, v)| Some((k.as_str()?.to_string(), v.as_str()?.to_string())))
        .collect()
}

fn dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(dns_label)
}

/// Problems found, each with where it was found; the test fails listing all of them.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn add(&mut self, at: &str, what: impl std::fmt::Display) {
        self.0.push(format!("{at}: {what}"));
    }

    fn assert_none(self, what: &str) {
        assert!(
            self.0.is_empty(),
            "{what}: {} problem(s):\n  {}",
            self.0.len(),
            self.0.join("\n  ")
        );
    }
}

/// A list of strings, as Kubernetes requires for command, args and exec probes (a bare
/// number there is rejected by the API server).
fn strings(v: Option<&Value>, at: &str, p: &mut Problems) -> Option<Vec<String>> {
    let v = v?;
    let Some(items) = v.as_sequence() else {
        p.add(at, "must be a list of strings");
        return None;
    };
    let mut out = Vec::new();
    for item in items {
        match item.as_str() {
            Some(s) => out.push(s.to_string()),
            None => p.add(at, format!("{item:?} is not a string (quote it)")),
        }
    }
    Some(out)
}

// ---------------------------------------------------------------------------------
// The shmlink command line, as the built binary describes it

fn help(args: &[&str]) -> String {
    let out = Command::new(SHMLINK).args(args).output().unwrap();
    assert!(out.status.success(), "shmlink {args:?} failed: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Commands and, per command, flags (and which of them take a value) from `--help`.
struct Cli {
    /// Command name to its help text.
    helps: BTreeMap<String, String>,
    /// Transports the binary itself lists (`shm:`, `ux:`, ...).
    transports: BTreeSet<String>,
}

impl Cli {
    fn load() -> Cli {
        let top = help(&["--help"]);
        let commands: Vec<String> = top
            .lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next())
            // `bench` hands its arguments to the separate shmlink-bench program, whose
            // help is its own (no recipe runs it).
            .filter(|c| *c != "help" && *c != "bench")
            .map(str::to_string)
            .collect();
        assert!(
            commands.iter().any(|c| c == "pong"),
            "shmlink --help lists no pong command:\n{top}"
        );
        let helps: BTreeMap<String, String> = commands
            .iter()
            .map(|c| (c.clone(), help(&[c, "--help"])))
            .collect();
        let transports = transports()
            .filter(|t| helps["pong"].contains(&format!("{t}:")))
            .map(|t| t.to_string())
            .collect();
        Cli { helps, transports }
    }

    /// The flags `command --help` documents, each with whether it takes a value: clap's
    /// option lines read `  -m, --size <SIZE>` or `      --latency` (indented at most
    /// six spaces, the text after two spaces or on the next lines, indented further).
    fn flags(&self, command: &str) -> BTreeMap<String, bool> {
        let mut flags = BTreeMap::new();
        for line in self.helps[command].lines() {
            let indent = line.len() - line.trim_start().len();
            let line = line.trim_start();
            if !(2..=6).contains(&indent) || !line.starts_with('-') {
                continue;
            }
            let spec = line.split("  ").next().unwrap_or("");
            let words: Vec<&str> = spec.split_whitespace().collect();
            let names: Vec<&str> = words
                .iter()
                .map(|w| w.trim_end_matches(','))
                .filter(|w| w.starts_with('-'))
                .collect();
            let valued = words.last().is_some_and(|w| !w.starts_with('-'));
            for name in names {
                flags.insert(name.to_string(), valued);
            }
        }
        flags
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Server,
    Client,
    Both,
}

/// A `shmlink pong` command line, checked.
#[derive(Debug)]
struct Pong {
    role: Role,
    addrs: Vec<String>,
}

/// Checks a shmlink command line (without the program name) against the binary's help;
/// returns the pong invocation it is, if it is one.
fn check_cmdline(cli: &Cli, at: &str, args: &[String], p: &mut Problems) -> Option<Pong> {
    let Some(command) = args.first() else {
        p.add(at, "empty shmlink command line");
        return None;
    };
    if !cli.helps.contains_key(command) {
        p.add(
            at,
            format!(
                "`shmlink {command}`: no such command (shmlink --help lists {:?})",
                cli.helps.keys().collect::<Vec<_>>()
            ),
        );
        return None;
    }
    let flags = cli.flags(command);
    let mut positional = Vec::new();
    let mut it = args[1..].iter();
    let mut given = BTreeSet::new();
    while let Some(arg) = it.next() {
        if arg.len() > 1 && arg.starts_with('-') {
            let (name, inline) = match arg.split_once('=') {
                Some((n, _)) => (n, true),
                None => (arg.as_str(), false),
            };
            match flags.get(name) {
                None => p.add(
                    at,
                    format!(
                        "`shmlink {command} {name}`: `shmlink {command} --help` has no such flag"
                    ),
                ),
                Some(&valued) => {
                    if valued && !inline && it.next().is_none() {
                        p.add(at, format!("{name} needs a value"));
                    }
                }
            }
            given.insert(name.to_string());
        } else {
            positional.push(arg.clone());
        }
    }
    if command != "pong" {
        return None;
    }
    for addr in &positional {
        check_addr(cli, at, addr, p);
    }
    let role = match (given.contains("--server"), given.contains("--client")) {
        (true, false) => Role::Server,
        (false, true) => Role::Client,
        (false, false) => Role::Both,
        (true, true) => {
            p.add(at, "--server and --client together");
            return None;
        }
    };
    if role == Role::Server && positional.len() != 1 {
        p.add(at, "a pong server serves exactly one address");
    }
    Some(Pong {
        role,
        addrs: positional,
    })
}

fn check_addr(cli: &Cli, at: &str, addr: &str, p: &mut Problems) {
    let Some((prefix, rest)) = addr.split_once(':') else {
        p.add(at, format!("{addr:?} is not an address (TRANSPORT:...)"));
        return;
    };
    if !transports().any(|t| t == prefix) {
        p.add(at, format!("{addr:?}: unknown transport {prefix:?}"));
    } else if cli.transports.contains(prefix) {
        if let Err(e) = shmlink::Address::parse(addr) {
            p.add(at, format!("{addr:?} does not parse: {e}"));
        }
    } else {
        // Not in this binary's help yet: at least the HOST:PORT shape.
        match rest.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                eprintln!("note: {at}: {addr}: the built shmlink does not list {prefix}: yet; checked as {prefix}:HOST:PORT only");
            }
            _ => p.add(at, format!("{addr:?}: expected {prefix}:HOST:PORT")),
        }
    }
}

/// The `shm:NAME` (or `auto:`) address needs the rendezvous directory; `shm:/path` and
/// `shm:@name` do not.
fn uses_rendezvous_dir(addr: &str) -> bool {
    match addr.split_once(':') {
        Some(("shm", rest)) => !rest.starts_with('/') && !rest.starts_with('@'),
        Some(("auto", _)) => true,
        _ => false,
    }
}

fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit_once(':')?.1.parse().ok()
}

// ---------------------------------------------------------------------------------
// What every recipe has in common: shmlink containers sharing a directory

/// One container (or Compose service) that runs shmlink.
struct ShmlinkContainer {
    at: String,
    /// The Pod (or Compose project) it belongs to.
    group: String,
    args: Vec<String>,
    uid: Option<i64>,
    /// `$SHMLINK_DIR`.
    dir: Option<String>,
    /// (mount path, identity of the volume, read-only).
    mounts: Vec<(String, String, bool)>,
    /// (port name, port number) it declares.
    ports: Vec<(Option<String>, i64)>,
    /// Paths its probes test with `test -S PATH`.
    probe_sockets: Vec<String>,
}

/// A Kubernetes Service: its name, (port, targetPort) pairs and the Pods it selects.
struct ServiceInfo {
    name: String,
    ports: Vec<(i64, Value)>,
    selects: Vec<String>,
}

/// `test -S PATH` in an exec probe or a Compose health check.
fn socket_test(cmd: &[String]) -> Option<String> {
    let cmd = match cmd.first().map(String::as_str) {
        Some("CMD") => &cmd[1..],
        _ => cmd,
    };
    match cmd {
        [t, s, path] if t == "test" && s == "-S" => Some(path.clone()),
        // `shmlink probe ADDR` (the binary by path or name): the address it probes.
        [bin, probe, addr] if bin.ends_with("shmlink") && probe == "probe" => Some(addr.clone()),
        _ => None,
    }
}

/// Checks what the shmlink containers of one file must agree on; returns the pong
/// command lines, checked.
fn check_shmlink(
    file: &str,
    cli: &Cli,
    image_uid: i64,
    containers: &[ShmlinkContainer],
    services: &[ServiceInfo],
    p: &mut Problems,
) -> Vec<Option<Pong>> {
    if containers.is_empty() {
        p.add(file, "no container runs shmlink");
    }
    let pongs: Vec<Option<Pong>> = containers
        .iter()
        .map(|c| check_cmdline(cli, &c.at, &c.args, p))
        .collect();
    // One uid everywhere: the listener admits its own uid (and root) only.
    for c in containers {
        match c.uid {
            None => p.add(&c.at, "no uid set: give every end the same uid explicitly"),
            Some(0) => p.add(&c.at, "runs as root"),
            Some(uid) if uid != image_uid => p.add(
                &c.at,
                format!("uid {uid}, but the image's user (and its /run/shmlink) is {image_uid}"),
            ),
            Some(_) => {}
        }
    }
    let uids: BTreeSet<_> = containers.iter().filter_map(|c| c.uid).collect();
    if uids.len() > 1 {
        p.add(file, format!("shmlink containers run as different uids {uids:?}: a listener refuses peers with another uid"));
    }
    // The rendezvous directory: $SHMLINK_DIR is a mounted volume; which one.
    let rendezvous: Vec<Option<&(String, String, bool)>> = containers
        .iter()
        .zip(&pongs)
        .map(|(c, pong)| {
            let needs = pong
                .as_ref()
                .is_some_and(|pg| pg.addrs.iter().any(|a| uses_rendezvous_dir(a)));
            if !needs {
                return None;
            }
            let Some(dir) = &c.dir else {
                p.add(&c.at, "uses shm:NAME or auto: but sets no SHMLINK_DIR");
                return None;
            };
            let mount = c.mounts.iter().find(|m| &m.0 == dir);
            if mount.is_none() {
                p.add(&c.at, format!("SHMLINK_DIR={dir}, but no volume is mounted there: the peers would not share it"));
            }
            mount
        })
        .collect();
    for (i, (c, pong)) in containers.iter().zip(&pongs).enumerate() {
        let Some(pong) = pong else { continue };
        if pong.role == Role::Server {
            if let Some(m) = rendezvous[i] {
                if m.2 {
                    p.add(&c.at, "a server needs its rendezvous directory writable (it binds its socket there)");
                }
            }
            for path in &c.probe_sockets {
                if !path.contains(':') {
                    p.add(&c.at, format!("probe `test -S {path}` passes on the socket file a killed server leaves behind: use `shmlink probe ADDR`"));
                }
                let expected = pong.addrs.first().and_then(|a| {
                    let name = a.strip_prefix("shm:")?;
                    Some(format!("{}/{name}.sock", c.dir.as_deref()?))
                });
                if expected.as_deref() != Some(path) && pong.addrs.first() != Some(path) {
                    p.add(
                        &c.at,
                        format!("probe tests for socket {path}, but the server binds {expected:?}"),
                    );
                }
            }
        } else if !c.probe_sockets.is_empty() {
            p.add(&c.at, "probes for a socket, but only a server binds one");
        }
        if pong.role != Role::Client {
            continue;
        }
        for addr in &pong.addrs {
            let servers: Vec<usize> = (0..containers.len())
                .filter(|&j| {
                    pongs[j].as_ref().is_some_and(|s| {
                        s.role == Role::Server
                            && s.addrs.first().is_some_and(|sa| {
                                sa == addr
                                    || (sa.starts_with("auto:")
                                        && addr.starts_with("auto:")
                                        && port_of(sa) == port_of(addr))
                            })
                    })
                })
                .collect();
            let [j] = servers[..] else {
                p.add(
                    &c.at,
                    format!(
                        "client of {addr}: expected exactly one server for it in {file}, found {}",
                        servers.len()
                    ),
                );
                continue;
            };
            let key = |k: Option<&(String, String, bool)>| k.map(|m| m.1.clone());
            if uses_rendezvous_dir(addr) && key(rendezvous[i]) != key(rendezvous[j]) {
                p.add(
                    &c.at,
                    format!(
                        "client of {addr} and its server ({}) do not share one rendezvous directory ({:?} vs {:?})",
                        containers[j].at,
                        key(rendezvous[i]),
                        key(rendezvous[j])
                    ),
                );
            }
            if let Some(rest) = addr.strip_prefix("auto:") {
                check_auto_route(file, addr, rest, &containers[j], services, p, &c.at);
            }
        }
    }
    pongs
}

/// An `auto:HOST:PORT` client of a server in a Pod: HOST must be a Service of this file
/// that selects the server's Pod and routes PORT to the port the server listens on.
fn check_auto_route(
    file: &str,
    addr: &str,
    rest: &str,
    server: &ShmlinkContainer,
    services: &[ServiceInfo],
    p: &mut Problems,
    at: &str,
) {
    let (Some((host, _)), Some(port)) = (rest.rsplit_once(':'), port_of(addr)) else {
        return;
    };
    if services.is_empty() {
        return; // Compose: service names resolve directly.
    }
    let Some(svc) = services.iter().find(|s| s.name == host) else {
        p.add(at, format!("{addr}: no Service {host:?} in {file}"));
        return;
    };
    if !svc.selects.contains(&server.group) {
        p.add(
            at,
            format!("{addr}: Service {host} does not select the server's Pod"),
        );
    }
    let Some((_, target)) = svc.ports.iter().find(|(p, _)| *p == i64::from(port)) else {
        p.add(at, format!("{addr}: Service {host} has no port {port}"));
        return;
    };
    let server_port = server
        .args
        .iter()
        .find(|a| a.starts_with("auto:"))
        .and_then(|a| port_of(a));
    let target_port = match target {
        Value::Number(n) => n.as_i64(),
        Value::String(name) => server
            .ports
            .iter()
            .find(|(n, _)| n.as_deref() == Some(name))
            .map(|(_, p)| *p),
        _ => None,
    };
    if target_port.is_none() || target_port != server_port.map(i64::from) {
        p.add(
            at,
            format!("{addr}: Service {host} sends port {port} to {target:?}, the server listens on {server_port:?}"),
        );
    }
}

// ---------------------------------------------------------------------------------
// The Dockerfile

struct Image {
    uid: i64,
    dir: String,
}

fn image() -> Image {
    let text = read(DOCKERFILE);
    let mut p = Problems::default();
    let last = |inst: &str| {
        text.lines()
            .filter_map(|l| l.strip_prefix(inst))
            .next_back()
            .map(str::trim)
    };
    let uid = last("USER ")
        .and_then(|u| u.split(':').next())
        .and_then(|u| u.parse::<i64>().ok());
    if !matches!(uid, Some(u) if u > 0) {
        p.add(
            DOCKERFILE,
            "expected a numeric non-root `USER uid:gid` (Kubernetes' runAsNonRoot needs a number)",
        );
    }
    match last("ENTRYPOINT ") {
        Some(e) if e.starts_with('[') && e.trim_end_matches(']').trim_end().ends_with("shmlink\"") => {}
        e => p.add(DOCKERFILE, format!("ENTRYPOINT {e:?} should end in the shmlink binary (exec form): the manifests pass shmlink's arguments as args")),
    }
    let dir = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("ENV SHMLINK_DIR="))
        .map(|d| d.trim().to_string());
    // Made in the image for its user: `install -d ... -m 0700 DIR` in a Debian stage, or
    // (an image FROM scratch, no shell) copied with `COPY --chown=UID:GID ... DIR`.
    let owned_copy = |d: &str| {
        text.lines().any(|l| {
            l.starts_with("COPY ")
                && l.contains(&format!("--chown={}:", uid.unwrap_or(-1)))
                && l.trim_end().ends_with(&format!(" {d}"))
        })
    };
    match &dir {
        Some(d) if text.contains(&format!("-m 0700 {d}")) || owned_copy(d) => {}
        _ => p.add(DOCKERFILE, "expected `ENV SHMLINK_DIR=DIR` and DIR made for the image's user (`install -d ... -m 0700 DIR`, or `COPY --chown=UID:GID ... DIR`)"),
    }
    let base = text.lines().filter(|l| l.starts_with("FROM ")).count();
    if base < 2 {
        p.add(
            DOCKERFILE,
            "expected a multi-stage build (a build stage and a runtime stage)",
        );
    }
    p.assert_none(DOCKERFILE);
    Image {
        uid: uid.unwrap(),
        dir: dir.unwrap(),
    }
}

// ---------------------------------------------------------------------------------
// Docker Compose

fn check_compose(cli: &Cli, img: &Image) -> (Vec<ShmlinkContainer>, Vec<Option<Pong>>) {
    let file = COMPOSE;
    let docs = documents(file);
    let mut p = Problems::default();
    if docs.len() != 1 {
        p.add(file, "a compose file is one YAML document");
    }
    let doc = &docs[0];
    let compose_dir = root().join("deploy");
    let declared: BTreeSet<String> = at(doc, "volumes")
        .and_then(Value::as_mapping)
        .map(|m| {
            m.keys()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let services = at(doc, "services")
        .and_then(Value::as_mapping)
        .unwrap_or_else(|| panic!("{file}: no `services` mapping"));
    if services.is_empty() {
        p.add(file, "`services` is empty");
    }
    let mut containers = Vec::new();
    for (name, svc) in services {
        let name = name.as_str().unwrap_or("?").to_string();
        let here = format!("{file}: service {name}");
        if at(svc, "image").is_none() && at(svc, "build").is_none() {
            p.add(&here, "needs `image` or `build`");
        }
        if let Some(build) = at(svc, "build") {
            let context = build
                .as_str()
                .or_else(|| str_at(build, "context"))
                .unwrap_or(".");
            let context = compose_dir.join(context);
            let dockerfile = str_at(build, "dockerfile").unwrap_or("Dockerfile");
            if !context.join(dockerfile).is_file() {
                p.add(
                    &here,
                    format!("build: no {dockerfile} in context {}", context.display()),
                );
            }
        }
        match str_at(svc, "ipc") {
            None | Some("private") | Some("none") => {}
            Some(mode) => p.add(
                &here,
                format!("ipc: {mode}: shmlink needs no shared IPC namespace"),
            ),
        }
        if at(svc, "shm_size").is_some() {
            p.add(&here, "shm_size: shmlink does not use /dev/shm");
        }
        let listed =
            |key: &str, item: &str| seq_at(svc, key).iter().any(|v| v.as_str() == Some(item));
        if at(svc, "read_only").and_then(Value::as_bool) != Some(true)
            || !listed("cap_drop", "ALL")
            || !listed("security_opt", "no-new-privileges:true")
        {
            p.add(
                &here,
                "set read_only: true, cap_drop: [ALL] and security_opt: [no-new-privileges:true]",
            );
        }
        if let Some(r) = str_at(svc, "restart") {
            let ok = ["no", "always", "unless-stopped", "on-failure"].contains(&r)
                || r.strip_prefix("on-failure:")
                    .is_some_and(|n| n.parse::<u32>().is_ok());
            if !ok {
                p.add(&here, format!("restart: {r:?} is not a restart policy"));
            }
        }
        // Volumes: short `SRC:DST[:MODE]` or long `{type, source, target}`.
        let mut mounts = Vec::new();
        for v in seq_at(svc, "volumes") {
            let (source, target, ro, kind) = if let Some(s) = v.as_str() {
                let parts: Vec<&str> = s.split(':').collect();
                match parts[..] {
                    [src, dst] => (src.to_string(), dst.to_string(), false, None),
                    [src, dst, mode] => (
                        src.to_string(),
                        dst.to_string(),
                        mode.split(',').any(|m| m == "ro"),
                        None,
                    ),
                    _ => {
                        p.add(
                            &here,
                            format!("volume {s:?}: expected SOURCE:TARGET[:MODE]"),
                        );
                        continue;
                    }
                }
            } else {
                (
                    str_at(v, "source").unwrap_or("").to_string(),
                    str_at(v, "target").unwrap_or("").to_string(),
                    at(v, "read_only").and_then(Value::as_bool).unwrap_or(false),
                    str_at(v, "type"),
                )
            };
            let named = match kind {
                Some(k) => k == "volume",
                None => !source.starts_with(['/', '.', '~']),
            };
            if target == "/dev/shm" {
                p.add(&here, "mounts /dev/shm: shmlink needs no shared /dev/shm");
            }
            if !target.starts_with('/') {
                p.add(&here, format!("volume target {target:?} is not absolute"));
            }
            let key = if named {
                if !declared.contains(&source) {
                    p.add(
                        &here,
                        format!(
                            "named volume {source:?} is not declared under top-level `volumes`"
                        ),
                    );
                }
                format!("volume:{source}")
            } else {
                format!("bind:{source}")
            };
            mounts.push((target, key, ro));
        }
        for (dep, cond) in at(svc, "depends_on")
            .and_then(Value::as_mapping)
            .into_iter()
            .flatten()
        {
            let dep = dep.as_str().unwrap_or("?");
            if !services.contains_key(dep) {
                p.add(&here, format!("depends on unknown service {dep:?}"));
            }
            if str_at(cond, "condition") == Some("service_healthy")
                && services
                    .get(dep)
                    .and_then(|s| at(s, "healthcheck.test"))
                    .is_none()
            {
                p.add(
                    &here,
                    format!("waits for {dep} to be healthy, but {dep} has no healthcheck"),
                );
            }
        }
        // environment: a mapping or a list of KEY=VALUE.
        let env: BTreeMap<String, String> = match at(svc, "environment") {
            Some(Value::Sequence(items)) => items
                .iter()
                .filter_map(|i| i.as_str()?.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            Some(m) => string_map(Some(m)).unwrap_or_else(|| {
                p.add(&here, "environment values must be strings");
                BTreeMap::new()
            }),
            None => BTreeMap::new(),
        };
        let command = match at(svc, "command") {
            Some(Value::String(s)) => Some(s.split_whitespace().map(str::to_string).collect()),
            c => strings(c, &format!("{here}: command"), &mut p),
        };
        if at(svc, "entrypoint").is_some() {
            p.add(&here, "overrides the image's entrypoint (tini + shmlink)");
        }
        let Some(args) = command else {
            p.add(
                &here,
                "no command: say which shmlink command the service runs",
            );
            continue;
        };
        let uid = str_at(svc, "user")
            .and_then(|u| u.split(':').next())
            .and_then(|u| u.parse().ok());
        let healthcheck = strings(
            at(svc, "healthcheck.test"),
            &format!("{here}: healthcheck"),
            &mut p,
        );
        containers.push(ShmlinkContainer {
            at: here,
            group: "compose".into(),
            args,
            uid,
            dir: env.get("SHMLINK_DIR").cloned(),
            mounts,
            ports: Vec::new(),
            probe_sockets: healthcheck
                .as_deref()
                .and_then(socket_test)
                .into_iter()
                .collect(),
        });
    }
    // The rendezvous volume: named, declared, and mounted in every service.
    for c in &containers {
        if c.dir.as_deref() != Some(img.dir.as_str()) {
            p.add(&c.at, format!("SHMLINK_DIR {:?}: a named volume takes the owner and mode of the image's {} only when mounted there", c.dir, img.dir));
        }
        if !c
            .mounts
            .iter()
            .any(|m| Some(&m.0) == c.dir.as_ref() && m.1.starts_with("volume:"))
        {
            p.add(
                &c.at,
                "the rendezvous directory must be a named volume (shared by the services)",
            );
        }
    }
    let pongs = check_shmlink(file, cli, img.uid, &containers, &[], &mut p);
    p.assert_none(file);
    (containers, pongs)
}

// ---------------------------------------------------------------------------------
// Kubernetes

/// The Pod spec a document defines (a Pod's, or a workload's template), with the Pod's
/// labels.
fn pod_template(doc: &Value) -> Option<(Option<&Value>, &Value)> {
    let template = match str_at(doc, "kind")? {
        "Pod" => return Some((at(doc, "metadata.labels"), at(doc, "spec")?)),
        "Deployment" | "StatefulSet" | "DaemonSet" | "Job" => at(doc, "spec.template")?,
        "CronJob" => at(doc, "spec.jobTemplate.spec.template")?,
        _ => return None,
    };
    Some((at(template, "metadata.labels"), at(template, "spec")?))
}

fn labels_match(selector: &BTreeMap<String, String>, labels: Option<&Value>) -> bool {
    let labels = string_map(labels).unwrap_or_default();
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Capabilities the `baseline` Pod Security Standard lets a container add.
const BASELINE_CAPS: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Volume types the `restricted` Pod Security Standard allows.
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

struct PodCheck<'a> {
    here: String,
    kind: &'a str,
    spec: &'a Value,
}

fn check_pod(pod: &PodCheck, p: &mut Problems, out: &mut Vec<ShmlinkContainer>) {
    let (here, spec) = (&pod.here, pod.spec);
    let policy = str_at(spec, "restartPolicy");
    let allowed: &[&str] = match pod.kind {
        "Pod" => &["Always", "OnFailure", "Never"],
        "Job" | "CronJob" => &["OnFailure", "Never"],
        _ => &["Always"],
    };
    match policy {
        None if matches!(pod.kind, "Job" | "CronJob") => {
            p.add(here, "a Job's Pod needs restartPolicy OnFailure or Never")
        }
        Some(r) if !allowed.contains(&r) => p.add(
            here,
            format!("restartPolicy {r} is not allowed for a {}", pod.kind),
        ),
        _ => {}
    }
    for host in ["hostIPC", "hostPID", "hostNetwork"] {
        if at(spec, host).and_then(Value::as_bool) == Some(true) {
            p.add(
                here,
                format!("{host}: true: shmlink needs only the shared directory"),
            );
        }
    }
    // Volumes.
    let mut volumes: BTreeMap<String, String> = BTreeMap::new();
    let mut restricted = true;
    for v in seq_at(spec, "volumes") {
        let Some(name) = str_at(v, "name") else {
            p.add(here, "a volume without a name");
            continue;
        };
        if !dns_label(name) {
            p.add(here, format!("volume name {name:?} is not a DNS label"));
        }
        let sources: Vec<&str> = v
            .as_mapping()
            .map(|m| {
                m.keys()
                    .filter_map(Value::as_str)
                    .filter(|k| *k != "name")
                    .collect()
            })
            .unwrap_or_default();
        let [source] = sources[..] else {
            p.add(
                here,
                format!("volume {name}: needs exactly one source, has {sources:?}"),
            );
            continue;
        };
        if !RESTRICTED_VOLUMES.contains(&source) {
            restricted = false;
        }
        let key = match source {
            "hostPath" => {
                let path = str_at(v, "hostPath.path").unwrap_or("");
                if !path.starts_with('/') {
                    p.add(
                        here,
                        format!("volume {name}: hostPath needs an absolute path"),
                    );
                }
                let types = [
                    "",
                    "DirectoryOrCreate",
                    "Directory",
                    "FileOrCreate",
                    "File",
                    "Socket",
                    "CharDevice",
                    "BlockDevice",
                ];
                if let Some(t) = str_at(v, "hostPath.type") {
                    if !types.contains(&t) {
                        p.add(
                            here,
                            format!("volume {name}: hostPath type {t:?} is not one of {types:?}"),
                        );
                    }
                }
                format!("hostPath:{path}")
            }
            "emptyDir" => {
                if let Some(m) = str_at(v, "emptyDir.medium") {
                    if !["", "Memory", "HugePages"].contains(&m) {
                        p.add(here, format!("volume {name}: emptyDir medium {m:?}"));
                    }
                }
                format!("{here}/emptyDir:{name}")
            }
            other => format!("{here}/{other}:{name}"),
        };
        if volumes.insert(name.to_string(), key).is_some() {
            p.add(here, format!("two volumes named {name}"));
        }
    }
    // Pod-level security: what every container inherits.
    let pod_uid = int(at(spec, "securityContext.runAsUser"));
    let pod_nonroot = at(spec, "securityContext.runAsNonRoot").and_then(Value::as_bool);
    let pod_seccomp = str_at(spec, "securityContext.seccompProfile.type");
    if pod_nonroot != Some(true) {
        p.add(here, "set securityContext.runAsNonRoot: true for the Pod");
    }
    if !matches!(pod_seccomp, Some("RuntimeDefault" | "Localhost")) {
        p.add(
            here,
            "set securityContext.seccompProfile.type: RuntimeDefault for the Pod",
        );
    }
    if let Some(aff) = at(
        spec,
        "affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution",
    ) {
        for term in aff.as_sequence().into_iter().flatten() {
            if str_at(term, "topologyKey").map_or(true, |k| k.is_empty()) {
                p.add(here, "a podAffinity term needs a topologyKey");
            }
            if at(term, "labelSelector").is_none() {
                p.add(here, "a podAffinity term needs a labelSelector");
            }
        }
    }
    let containers = seq_at(spec, "containers");
    if containers.is_empty() {
        p.add(here, "spec.containers is empty");
    }
    let mut names = BTreeSet::new();
    for (list, items) in [
        ("initContainers", seq_at(spec, "initContainers")),
        ("containers", containers),
    ] {
        for c in items {
            let name = str_at(c, "name").unwrap_or("");
            let here = format!("{here}: {list} {name}");
            if !dns_label(name) {
                p.add(&here, format!("container name {name:?} is not a DNS label"));
            }
            if !names.insert(name.to_string()) {
                p.add(&here, "two containers with this name");
            }
            if str_at(c, "image").map_or(true, |i| i.is_empty()) {
                p.add(&here, "needs an image");
            }
            match (list, str_at(c, "restartPolicy")) {
                (_, None) | ("initContainers", Some("Always")) => {}
                (_, Some(r)) => p.add(&here, format!("restartPolicy {r}: only an init container may set it, to Always (a sidecar)")),
            }
            let command = strings(at(c, "command"), &format!("{here}: command"), p);
            let args = strings(at(c, "args"), &format!("{here}: args"), p);
            let mut dir = None;
            for e in seq_at(c, "env") {
                let Some(ename) = str_at(e, "name") else {
                    p.add(&here, "an env entry without a name");
                    continue;
                };
                match at(e, "value") {
                    None | Some(Value::String(_)) => {}
                    Some(v) => p.add(
                        &here,
                        format!("env {ename}: value {v:?} must be a string (quote it)"),
                    ),
                }
                if ename == "SHMLINK_DIR" {
                    dir = str_at(e, "value").map(str::to_string);
                }
            }
            let mut ports = Vec::new();
            for port in seq_at(c, "ports") {
                let n = int(at(port, "containerPort"));
                if !n.is_some_and(|n| (1..=65535).contains(&n)) {
                    p.add(&here, format!("containerPort {n:?} is not a port number"));
                }
                let pname = str_at(port, "name").map(str::to_string);
                if pname
                    .as_ref()
                    .is_some_and(|n| n.len() > 15 || !dns_label(n))
                {
                    p.add(
                        &here,
                        format!("port name {pname:?}: at most 15 lowercase letters, digits, '-'"),
                    );
                }
                if let Some(proto) = str_at(port, "protocol") {
                    if !["TCP", "UDP", "SCTP"].contains(&proto) {
                        p.add(&here, format!("protocol {proto}"));
                    }
                }
                ports.push((pname, n.unwrap_or(0)));
            }
            let mut mounts = Vec::new();
            for m in seq_at(c, "volumeMounts") {
                let vname = str_at(m, "name").unwrap_or("");
                let path = str_at(m, "mountPath").unwrap_or("");
                if !path.starts_with('/') {
                    p.add(&here, format!("mountPath {path:?} is not absolute"));
                }
                if path == "/dev/shm" {
                    p.add(&here, "mounts /dev/shm: shmlink needs no shared /dev/shm");
                }
                match volumes.get(vname) {
                    Some(key) => mounts.push((
                        path.to_string(),
                        key.clone(),
                        at(m, "readOnly").and_then(Value::as_bool).unwrap_or(false),
                    )),
                    None => p.add(
                        &here,
                        format!("volumeMount {vname:?}: no such volume in the Pod"),
                    ),
                }
            }
            let mut probe_sockets = Vec::new();
            for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
                let Some(pr) = at(c, probe) else { continue };
                let handlers: Vec<&str> = ["exec", "tcpSocket", "httpGet", "grpc"]
                    .into_iter()
                    .filter(|h| at(pr, h).is_some())
                    .collect();
                if handlers.len() != 1 {
                    p.add(
                        &here,
                        format!("{probe}: needs exactly one handler, has {handlers:?}"),
                    );
                }
                if let Some(cmd) = strings(at(pr, "exec.command"), &format!("{here}: {probe}"), p) {
                    probe_sockets.extend(socket_test(&cmd));
                }
                match at(pr, "tcpSocket.port") {
                    Some(Value::String(name))
                        if !ports.iter().any(|(n, _)| n.as_deref() == Some(name)) =>
                    {
                        p.add(&here, format!("{probe}: no container port named {name}"))
                    }
                    _ => {}
                }
            }
            // Security: every container either matches the `restricted` profile, or
            // (an init container that prepares a hostPath) stays within `baseline`.
            let sc = at(c, "securityContext");
            let get = |k: &str| sc.and_then(|s| at(s, k));
            let uid = int(get("runAsUser")).or(pod_uid);
            let nonroot = get("runAsNonRoot").and_then(Value::as_bool).or(pod_nonroot);
            if get("allowPrivilegeEscalation").and_then(Value::as_bool) != Some(false) {
                p.add(&here, "set allowPrivilegeEscalation: false");
            }
            if get("readOnlyRootFilesystem").and_then(Value::as_bool) != Some(true) {
                p.add(&here, "set readOnlyRootFilesystem: true");
            }
            if get("privileged").and_then(Value::as_bool) == Some(true) {
                p.add(&here, "privileged");
            }
            let drop: Vec<&str> = get("capabilities.drop")
                .and_then(Value::as_sequence)
                .map(|s| s.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if !drop.contains(&"ALL") {
                p.add(&here, "drop ALL capabilities");
            }
            let add: Vec<&str> = get("capabilities.add")
                .and_then(Value::as_sequence)
                .map(|s| s.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if let Some(cap) = add.iter().find(|c| !BASELINE_CAPS.contains(c)) {
                p.add(
                    &here,
                    format!("adds capability {cap}, beyond the baseline profile"),
                );
            }
            if !add.is_empty() || uid == Some(0) || nonroot == Some(false) {
                restricted = false;
            }
            // A shmlink container: the image's entrypoint with args, or shmlink as the command.
            let shmlink_args = match (&command, &args) {
                (None, Some(a)) => Some(a.clone()),
                (Some(cmd), a) if cmd.first().is_some_and(|c| c.ends_with("shmlink")) => {
                    Some(cmd[1..].iter().chain(a.iter().flatten()).cloned().collect())
                }
                _ => None,
            };
            if let Some(args) = shmlink_args {
                if uid == Some(0) || nonroot != Some(true) {
                    p.add(&here, "shmlink runs as non-root");
                }
                let sidecar = str_at(c, "restartPolicy") == Some("Always");
                if list == "initContainers" && !sidecar && args.iter().any(|a| a == "--server") {
                    p.add(&here, "a server in an init container must be a sidecar (restartPolicy: Always): a plain init container must exit before the others start");
                }
                out.push(ShmlinkContainer {
                    at: here.clone(),
                    group: pod.here.clone(),
                    args,
                    uid,
                    dir,
                    mounts,
                    ports,
                    probe_sockets,
                });
            }
        }
    }
    // What the Pod Security Standards say about the whole Pod (docs/containers.md).
    let needs_privileged_ns = volumes.values().any(|k| k.starts_with("hostPath:"));
    if !restricted && !needs_privileged_ns {
        p.add(here, "does not meet the `restricted` Pod Security Standard, and has no hostPath that would excuse it");
    }
}

fn check_manifest(
    file: &str,
    cli: &Cli,
    img: &Image,
) -> (Vec<ShmlinkContainer>, Vec<Option<Pong>>) {
    let docs = documents(file);
    let mut p = Problems::default();
    let mut pods: Vec<(String, Option<&Value>)> = Vec::new();
    let mut containers = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, doc) in docs.iter().enumerate() {
        let kind = str_at(doc, "kind").unwrap_or("");
        let name = str_at(doc, "metadata.name").unwrap_or("");
        let here = format!("{file}: document {} ({kind} {name})", i + 1);
        if !doc.is_mapping() {
            p.add(&here, "not a mapping");
            continue;
        }
        let api = str_at(doc, "apiVersion").unwrap_or("");
        match KINDS.iter().find(|(k, _)| *k == kind) {
            None => p.add(
                &here,
                format!("kind {kind:?} is not one this test knows (add it to KINDS)"),
            ),
            Some((_, want)) if api != *want => p.add(
                &here,
                format!("{kind} needs apiVersion {want}, has {api:?}"),
            ),
            _ => {}
        }
        if !dns_subdomain(name) {
            p.add(
                &here,
                format!("metadata.name {name:?} is not a DNS subdomain"),
            );
        }
        if !seen.insert((kind.to_string(), name.to_string())) {
            p.add(&here, "defined twice");
        }
        if at(doc, "metadata.labels").is_some() && string_map(at(doc, "metadata.labels")).is_none()
        {
            p.add(&here, "label values must be strings");
        }
        let here = format!("{file}: {kind} {name}");
        let workload = matches!(kind, "Deployment" | "StatefulSet" | "DaemonSet");
        if workload || (kind != "Service" && at(doc, "spec.selector").is_some()) {
            let sel = string_map(at(doc, "spec.selector.matchLabels")).unwrap_or_default();
            if !labels_match(&sel, at(doc, "spec.template.metadata.labels")) {
                p.add(&here, "spec.selector.matchLabels must be non-empty and match spec.template.metadata.labels");
            }
        }
        if kind == "Deployment" {
            if let Some(t) = str_at(doc, "spec.strategy.type") {
                if !["Recreate", "RollingUpdate"].contains(&t) {
                    p.add(&here, format!("strategy {t}"));
                }
            }
        }
        if let Some((labels, spec)) = pod_template(doc) {
            let pod = PodCheck {
                here: here.clone(),
                kind,
                spec,
            };
            check_pod(&pod, &mut p, &mut containers);
            pods.push((here, labels));
        } else if matches!(
            kind,
            "Pod" | "Deployment" | "StatefulSet" | "DaemonSet" | "Job" | "CronJob"
        ) {
            p.add(&here, "no Pod spec (spec.containers or spec.template.spec)");
        }
    }
    // Services and podAffinity must select Pods of this file.
    let mut services = Vec::new();
    for doc in &docs {
        let name = str_at(doc, "metadata.name").unwrap_or("").to_string();
        let here = format!("{file}: Service {name}");
        if str_at(doc, "kind") == Some("Service") {
            let ports: Vec<(i64, Value)> = seq_at(doc, "spec.ports")
                .iter()
                .map(|port| {
                    let n = int(at(port, "port"));
                    if !n.is_some_and(|n| (1..=65535).contains(&n)) {
                        p.add(&here, format!("port {n:?} is not a port number"));
                    }
                    let target = at(port, "targetPort").cloned().unwrap_or(Value::Null);
                    let target = if target.is_null() {
                        at(port, "port").cloned().unwrap_or(Value::Null)
                    } else {
                        target
                    };
                    (n.unwrap_or(0), target)
                })
                .collect();
            if ports.is_empty() {
                p.add(&here, "spec.ports is empty");
            }
            if ports.len() > 1
                && seq_at(doc, "spec.ports")
                    .iter()
                    .any(|p| str_at(p, "name").is_none())
            {
                p.add(&here, "several ports need a name each");
            }
            let sel = string_map(at(doc, "spec.selector")).unwrap_or_default();
            let selects: Vec<String> = pods
                .iter()
                .filter(|(_, labels)| labels_match(&sel, *labels))
                .map(|(h, _)| h.clone())
                .collect();
            if selects.is_empty() {
                p.add(&here, "spec.selector selects no Pod of this file");
            }
            services.push(ServiceInfo {
                name: name.clone(),
                ports,
                selects,
            });
        }
        if let Some((_, spec)) = pod_template(doc) {
            let terms = seq_at(
                spec,
                "affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            );
            for term in terms {
                let sel = string_map(at(term, "labelSelector.matchLabels")).unwrap_or_default();
                if !pods.iter().any(|(_, labels)| labels_match(&sel, *labels)) {
                    p.add(
                        &format!("{file}: {name}"),
                        "podAffinity selects no Pod of this file: it would stay Pending",
                    );
                }
            }
        }
    }
    // Named target ports must exist in the selected Pods.
    for svc in &services {
        for (_, target) in &svc.ports {
            if let Value::String(tname) = target {
                let found = containers.iter().any(|c: &ShmlinkContainer| {
                    svc.selects.contains(&c.group)
                        && c.ports.iter().any(|(n, _)| n.as_deref() == Some(tname))
                });
                if !found {
                    p.add(
                        &format!("{file}: Service {}", svc.name),
                        format!(
                            "targetPort {tname}: no selected container has a port by that name"
                        ),
                    );
                }
            }
        }
    }
    let pongs = check_shmlink(file, cli, img.uid, &containers, &services, &mut p);
    p.assert_none(file);
    (containers, pongs)
}

// ---------------------------------------------------------------------------------
// The tests

#[test]
fn every_recipe_file_is_there() {
    let missing: Vec<&str> = REQUIRED
        .iter()
        .copied()
        .filter(|f| !root().join(f).is_file())
        .collect();
    assert!(
        missing.is_empty(),
        "container recipe files missing: {missing:?}"
    );
    let docs = read(DOCS);
    for f in [COMPOSE, POD_SIDECAR, NODE_LOCAL, DOCKERFILE] {
        assert!(docs.contains(f), "{DOCS} does not mention {f}");
    }
}

#[test]
fn every_yaml_file_in_deploy_is_checked() {
    let known = [COMPOSE, POD_SIDECAR, NODE_LOCAL];
    for f in known {
        assert!(root().join(f).is_file(), "{f} is missing");
    }
    for f in yaml_files() {
        // Parses, every document.
        let docs = documents(&f);
        assert!(
            known.contains(&f.as_str()),
            "{f} ({} documents) is not checked by tests/deploy.rs: add it to a check",
            docs.len()
        );
    }
}

/// The Dockerfile as text (nothing is built: the tests run without Docker): two stages,
/// a numeric non-root `USER`, an exec-form `ENTRYPOINT` that is the shmlink binary, and
/// `SHMLINK_DIR` an absolute directory created with mode 0700.
#[test]
fn dockerfile_declares_a_multi_stage_non_root_shmlink_image() {
    let img = image();
    assert!(img.dir.starts_with('/'));
}

#[test]
fn compose_file_is_valid_and_consistent() {
    let cli = Cli::load();
    let (containers, pongs) = check_compose(&cli, &image());
    let roles: Vec<Role> = pongs.iter().flatten().map(|p| p.role).collect();
    assert!(
        roles.contains(&Role::Server) && roles.contains(&Role::Client),
        "{COMPOSE}: expected a pong server and a pong client, got {roles:?}"
    );
    let volumes: BTreeSet<&str> = containers
        .iter()
        .flat_map(|c| c.mounts.iter().map(|m| m.1.as_str()))
        .collect();
    assert!(
        containers.len() >= 2
            && volumes.iter().any(|v| containers
                .iter()
                .all(|c| c.mounts.iter().any(|m| m.1 == *v))),
        "{COMPOSE}: no named volume is mounted in every service"
    );
}

#[test]
fn pod_sidecar_manifest_is_valid_and_consistent() {
    let cli = Cli::load();
    let (containers, pongs) = check_manifest(POD_SIDECAR, &cli, &image());
    let groups: BTreeSet<&str> = containers.iter().map(|c| c.group.as_str()).collect();
    assert_eq!(
        groups.len(),
        1,
        "{POD_SIDECAR}: server and client belong in one Pod"
    );
    // Without a hostPath, check_pod holds the Pod to the `restricted` standard.
    let docs = documents(POD_SIDECAR);
    let host_path = docs
        .iter()
        .filter_map(pod_template)
        .flat_map(|(_, spec)| seq_at(spec, "volumes"))
        .any(|v| at(v, "hostPath").is_some());
    assert!(
        !host_path,
        "{POD_SIDECAR}: a hostPath volume takes the Pod out of the `restricted` standard"
    );
    assert!(
        containers
            .iter()
            .all(|c| c.mounts.iter().any(|m| m.1.contains("/emptyDir:"))),
        "{POD_SIDECAR}: both containers mount the emptyDir"
    );
    assert!(pongs.iter().flatten().any(|p| p.role == Role::Server));
    assert!(pongs.iter().flatten().any(|p| p.role == Role::Client));
}

#[test]
fn node_local_manifest_is_valid_and_consistent() {
    let cli = Cli::load();
    let (containers, pongs) = check_manifest(NODE_LOCAL, &cli, &image());
    let groups: BTreeSet<&str> = containers.iter().map(|c| c.group.as_str()).collect();
    assert_eq!(
        groups.len(),
        2,
        "{NODE_LOCAL}: server and client in two Pods"
    );
    assert!(
        containers
            .iter()
            .all(|c| c.mounts.iter().any(|m| m.1.starts_with("hostPath:"))),
        "{NODE_LOCAL}: both Pods mount the hostPath directory"
    );
    let auto = |role| {
        pongs
            .iter()
            .flatten()
            .any(|p| p.role == role && p.addrs.iter().any(|a| a.starts_with("auto:")))
    };
    assert!(
        auto(Role::Server) && auto(Role::Client),
        "{NODE_LOCAL}: server and client use auto: addresses"
    );
    // Co-location: the client Pod's required podAffinity on the node's hostname.
    let docs = documents(NODE_LOCAL);
    let colocated = docs.iter().filter_map(pod_template).any(|(_, spec)| {
        seq_at(
            spec,
            "affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution",
        )
        .iter()
        .any(|t| str_at(t, "topologyKey") == Some("kubernetes.io/hostname"))
    });
    assert!(
        colocated,
        "{NODE_LOCAL}: no Pod asks to run on its peer's node"
    );
}

/// A server process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the recipe's server and client command lines as written, with `$SHMLINK_DIR`
/// pointing both at one fresh directory (the shared volume) with the mode the volume
/// has in the recipe's runtime: a Kubernetes emptyDir is 0777 (setgid with fsGroup), a
/// Docker named volume takes the image's 0700 directory.
fn run_recipe(file: &str, server: &ShmlinkContainer, client: &ShmlinkContainer, name: &str) {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("shmlink-deploy-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mode = if file == POD_SIDECAR { 0o2777 } else { 0o700 };
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    let _server = Server(
        Command::new(SHMLINK)
            .args(&server.args)
            .env("SHMLINK_DIR", &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let socket = dir.join(format!("{name}.sock"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "{file}: {}: no socket {} after 20 s",
            server.at,
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut child = Command::new(SHMLINK)
        .args(&client.args)
        .env("SHMLINK_DIR", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{file}: {}: still running after 120 s", client.at);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().any(|l| l.starts_with("shm ")),
        "{file}: {} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        client.at,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "{file}: ran {:?} against {:?}: ok",
        client.args, server.args
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn shm_recipes_run_as_written() {
    let cli = Cli::load();
    let img = image();
    let recipes = [
        (COMPOSE, check_compose(&cli, &img)),
        (POD_SIDECAR, check_manifest(POD_SIDECAR, &cli, &img)),
    ];
    for (file, (containers, pongs)) in &recipes {
        let mut ran = 0;
        for (c, pong) in containers.iter().zip(pongs) {
            let Some(pong) = pong.as_ref().filter(|p| p.role == Role::Client) else {
                continue;
            };
            for addr in &pong.addrs {
                let Some(name) = addr
                    .strip_prefix("shm:")
                    .filter(|n| !n.starts_with(['/', '@']))
                else {
                    continue;
                };
                let server = containers
                    .iter()
                    .zip(pongs)
                    .find(|(_, p)| {
                        p.as_ref()
                            .is_some_and(|p| p.role == Role::Server && p.addrs == [addr.clone()])
                    })
                    .map(|(s, _)| s)
                    .unwrap_or_else(|| panic!("{file}: no server for {addr}"));
                run_recipe(file, server, c, name);
                ran += 1;
            }
        }
        assert!(ran > 0, "{file}: no shm: client to run");
    }
}
