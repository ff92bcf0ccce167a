//! Bridges that carry topics beyond the host (the Zenoh bridge, `shmlink-zenoh`), as
//! `shmlink ls` lists them.
//!
//! A bridge is not a listener, so no socket answers a query for it. Instead each bridge
//! keeps a status file in the rendezvous directory, `bridge-<pid>-<id>.status`, rewritten
//! every second ([`write_bridge_status`], through a temporary file and a rename, so a
//! reader never sees half of one) and removed when the bridge closes. [`bridges`] reads
//! them. The file's age tells a live bridge from a dead one: a file not rewritten for
//! [`BRIDGE_STALE_AFTER`] is a bridge that stopped without removing it (SIGKILL). This
//! works across PID namespaces, where the bridge's PID means nothing to the reader.
//!
//! The files are written by whoever may write the directory: they are read as untrusted
//! text, at most [`MAX_BRIDGE_STATUS`] bytes, links are not followed, and a file that is
//! not a status file is reported as such rather than guessed at.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};

/// A status file older than this belongs to a bridge that is gone.
pub const BRIDGE_STALE_AFTER: Duration = Duration::from_secs(5);
/// The largest status file read (longer ones are cut there, and say so).
pub const MAX_BRIDGE_STATUS: u64 = 64 * 1024;

const MAGIC: &str = "shmlink-bridge-status 1";

/// One topic a bridge carries, and its counters.
///
/// `Send`, `Sync`, `Clone`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BridgedTopic {
    /// `true`: a local topic sent out (exported); `false`: brought in (imported).
    pub export: bool,
    /// The local topic's name.
    pub topic: String,
    /// The remote key (the Zenoh key expression).
    pub key: String,
    /// Messages carried.
    pub messages: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Messages lost on the way (the bridge's own count).
    pub dropped: u64,
    /// A word on the topic's state: `active`, or why it stopped.
    pub state: String,
}

/// One status file and what it says.
///
/// `Send`, `Sync`, `Clone`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BridgeReport {
    /// The status file.
    pub path: PathBuf,
    /// The bridge's PID, as it wrote it (in its own PID namespace).
    pub pid: Option<u32>,
    /// Time since the bridge last rewrote the file.
    pub age: Duration,
    /// Whether the file is fresh (younger than [`BRIDGE_STALE_AFTER`]).
    pub live: bool,
    /// The topics, in the file's order.
    pub topics: Vec<BridgedTopic>,
    /// What was wrong with the file, if anything (not a status file, cut at the size
    /// limit, malformed lines skipped).
    pub problem: Option<String>,
}

/// The status file of the bridge `id` of this process in `dir`.
pub fn bridge_status_path(dir: &Path, id: u128) -> PathBuf {
    dir.join(format!(
        "bridge-{}-{:08x}.status",
        std::process::id(),
        id as u32
    ))
}

/// Writes a bridge's status file at `path` (from [`bridge_status_path`]) whole: into a
/// temporary file beside it, then renamed over it.
pub fn write_bridge_status(path: &Path, topics: &[BridgedTopic]) -> io::Result<()> {
    let mut text = format!("{MAGIC}\npid {}\n", std::process::id());
    for t in topics {
        text.push_str(&format!(
            "topic {} {} {} {} {} {} {}\n",
            if t.export { "export" } else { "import" },
            word(&t.topic),
            word(&t.key),
            t.messages,
            t.bytes,
            t.dropped,
            t.state.replace(|c: char| c.is_control(), " "),
        ));
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("bridge");
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    drop(f);
    fs::rename(&tmp, path)
}

/// A field that must not split: whitespace and control characters become `?`.
fn word(s: &str) -> String {
    if s.is_empty() {
        return "?".into();
    }
    s.replace(|c: char| c.is_whitespace() || c.is_control(), "?")
}

/// The bridges' status files in `dir`, sorted by name. A directory that does not exist
/// holds none.
pub fn bridges(dir: &Path) -> Result<Vec<BridgeReport>> {
    let read = |e| Error::io(format!("read {}", dir.display()), e);
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read(e)),
    };
    let now = SystemTime::now();
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(read)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        // The entry's own type: a link is not followed.
        if !name.starts_with("bridge-")
            || !name.ends_with(".status")
            || !entry.file_type().is_ok_and(|t| t.is_file())
        {
            continue;
        }
        out.push(read_one(entry.path(), now));
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn read_one(path: PathBuf, now: SystemTime) -> BridgeReport {
    let mut report = BridgeReport {
        path,
        pid: None,
        age: Duration::ZERO,
        live: false,
        topics: Vec::new(),
        problem: None,
    };
    let mut text = Vec::new();
    let opened = fs::File::open(&report.path).and_then(|f| {
        let modified = f.metadata()?.modified()?;
        f.take(MAX_BRIDGE_STATUS + 1).read_to_end(&mut text)?;
        Ok(modified)
    });
    match opened {
        Ok(modified) => {
            report.age = now.duration_since(modified).unwrap_or(Duration::ZERO);
            report.live = report.age < BRIDGE_STALE_AFTER;
        }
        Err(e) => {
            report.problem = Some(format!("cannot read it: {e}"));
            return report;
        }
    }
    let cut = text.len() as u64 > MAX_BRIDGE_STATUS;
    text.truncate(MAX_BRIDGE_STATUS as usize);
    let text = String::from_utf8_lossy(&text);
    let (pid, topics, bad) = parse(&text);
    if pid.is_none() && topics.is_empty() && !text.starts_with(MAGIC) {
        report.problem = Some("not a bridge status file".into());
        return report;
    }
    report.pid = pid;
    report.topics = topics;
    let mut problems = Vec::new();
    if cut {
        problems.push(format!("cut at {MAX_BRIDGE_STATUS} bytes"));
    }
    if bad > 0 {
        problems.push(format!("{bad} malformed lines skipped"));
    }
    report.problem = (!problems.is_empty()).then(|| problems.join(", "));
    report
}

/// The PID, the topics and the number of malformed lines of a status file's text.
fn parse(text: &str) -> (Option<u32>, Vec<BridgedTopic>, usize) {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return (None, Vec::new(), 0);
    }
    let (mut pid, mut topics, mut bad) = (None, Vec::new(), 0);
    for line in lines {
        if let Some(p) = line.strip_prefix("pid ") {
            match p.parse() {
                Ok(p) => pid = Some(p),
                Err(_) => bad += 1,
            }
            continue;
        }
        match topic_line(line) {
            Some(t) => topics.push(t),
            None => bad += 1,
        }
    }
    (pid, topics, bad)
}

fn topic_line(line: &str) -> Option<BridgedTopic> {
    let mut f = line.splitn(8, ' ');
    if f.next()? != "topic" {
        return None;
    }
    let export = match f.next()? {
        "export" => true,
        "import" => false,
        _ => return None,
    };
    // No control characters reach a terminal that prints these.
    let text = |s: &str| s.replace(char::is_control, "?");
    Some(BridgedTopic {
        export,
        topic: text(f.next()?),
        key: text(f.next()?),
        messages: f.next()?.parse().ok()?,
        bytes: f.next()?.parse().ok()?,
        dropped: f.next()?.parse().ok()?,
        state: text(f.next().unwrap_or("")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory, removed afterwards.
    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("shmlink-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&d);
            fs::create_dir_all(&d).unwrap();
            Dir(d)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn topic(export: bool, name: &str) -> BridgedTopic {
        BridgedTopic {
            export,
            topic: name.into(),
            key: format!("shmlink/{name}"),
            messages: 7,
            bytes: 448,
            dropped: 1,
            state: "local topic ended: peer closed the connection".into(),
        }
    }

    #[test]
    fn a_status_file_reads_back_as_written() {
        let dir = Dir::new("bridges");
        let path = bridge_status_path(dir.path(), 0xabcd_ef12_3456);
        let topics = [topic(true, "a"), topic(false, "b")];
        write_bridge_status(&path, &topics).unwrap();
        let found = bridges(dir.path()).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        let r = &found[0];
        assert_eq!(r.path, path);
        assert_eq!(r.pid, Some(std::process::id()));
        assert!(r.live && r.problem.is_none(), "{r:?}");
        assert_eq!(r.topics, topics);
        // Nothing else of the directory's is taken for a bridge, and no temporary file
        // is left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn hostile_or_stale_files_are_reported_not_trusted() {
        let dir = Dir::new("bridges-hostile");
        let p = |n: &str| dir.path().join(n);
        fs::write(p("bridge-1-a.status"), "something else\n").unwrap();
        let mut long = format!("{MAGIC}\npid 9\n");
        while long.len() as u64 <= MAX_BRIDGE_STATUS {
            long.push_str("topic export t shmlink/t 1 2 3 active\n");
        }
        fs::write(p("bridge-2-b.status"), long).unwrap();
        fs::write(
            p("bridge-3-c.status"),
            format!("{MAGIC}\npid x\ntopic sideways t k 1 2 3 s\ntopic import t k 1 -2 3\n"),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/passwd", p("bridge-4-d.status")).unwrap();
        fs::write(p("listener.sock.status"), MAGIC).unwrap();
        let old = fs::File::options()
            .append(true)
            .open(p("bridge-2-b.status"))
            .unwrap();
        old.set_modified(SystemTime::now() - BRIDGE_STALE_AFTER * 2)
            .unwrap();
        let found = bridges(dir.path()).unwrap();
        let problems: Vec<_> = found.iter().map(|r| r.problem.clone()).collect();
        assert_eq!(
            problems,
            [
                Some("not a bridge status file".to_string()),
                Some(format!("cut at {MAX_BRIDGE_STATUS} bytes")),
                Some("3 malformed lines skipped".to_string()),
            ]
        );
        assert!(!found[1].live && found[1].age >= BRIDGE_STALE_AFTER);
        assert_eq!(found[1].pid, Some(9));
        assert!(found[2].topics.is_empty() && found[2].pid.is_none());
    }
}
