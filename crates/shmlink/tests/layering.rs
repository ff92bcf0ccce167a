//! No import circles in the library: reads `src/**/*.rs`, builds the module graph from the
//! paths the code names, and fails with every circle printed.
//!
//! # The rule
//!
//! Module `a` *depends on* module `b` when code in `a` names an item that lives in `b`: a
//! `use` of it, or a path written inline (`crate::x::y`, `super::y`, `$crate::x::y`, or a
//! path starting with the name of one of `a`'s own child modules). Re-exports are seen
//! through: `crate::Connection` is the item in `conn`, not in the crate root. A `mod`
//! declaration is no dependency, and neither is a `pub use` of an item that lives in the
//! re-exporting module's own subtree (a parent's facade over its children). Comments, doc
//! links and string literals name nothing. Inline modules (`mod tests { … }`) are modules
//! like the others, children of their file's module.
//!
//! **At every level of the module tree, the parent's own code and its child subtrees form
//! a directed acyclic graph.** For each module `m`, every dependency between two modules
//! inside `m`'s subtree is drawn as an edge between the two *nodes* holding them, where a
//! node is either `m` itself (its own file) or one of its child subtrees (the child and
//! everything below it); edges inside one node are that node's own business, one level
//! down. A child naming its parent's items is an edge child → parent, so the parent's own
//! code may not name the child's items back (only declare it and re-export from it).
//!
//! # The layers this gives the library
//!
//! Each module may import the ones listed before it, never one after it.
//!
//! 1. Plain types and the OS: `error`; `addr` (addresses, the rendezvous directory);
//!    `options`; `sys` (the only libc user) and `sync` (the loom shim); `trust` (who may
//!    connect); `trace` (the optional `tracing` events); `view`, `notify`; `status`
//!    (per-connection counters and what a listener reports: a leaf the transports fill
//!    in and `inspect` reads).
//! 2. `ring`: the SPSC byte ring.
//! 3. `rendezvous`: binding, removing and sweeping the rendezvous sockets of `shm:`
//!    addresses (for the `shm:` listener, `auto:`'s upgrade socket and the publisher).
//! 4. `transport`, inside which, from the bottom: `ops` (the trait every transport
//!    implements); `framed` (the framing, hello and flow control of the stream
//!    transports); `stream` (TCP, with the TLS session under it in `stream::tls`); the
//!    entries `tcp`, `tls`, `ux`; `shm` (its handshake codec, registry, segments and
//!    connection); `local` (the local upgrade both `auto:` and `auto:` topics run:
//!    boot ids, tokens, the upgrade socket); `net` (publish/subscribe's one interface to
//!    the network transports); `auto`. `transport`'s own file only lists them (the
//!    registry) and holds a connection as `shm:` or as a trait object (`Conn`).
//! 5. `conn` (the public `Connection` and `Listener` over the transports), then `split`
//!    (its send and receive halves).
//! 6. `pubsub`, inside which: the codecs `wire` and `handshake`; `ring`, `segment`,
//!    `options`; `topic` (the state the publisher shares with its control and fan-out
//!    threads) and `stats`; `shm_subscriber`, `remote` (the network subscriber), then
//!    `subscriber`; `status` (a topic's answer to `inspect`), `control`, `fanout`, then
//!    `publisher`, which starts both threads. Its
//!    network side names nothing of `transport` but `transport::net`, its shared-memory
//!    side the `shm:` packet codec its handshake extends (checked below).
//! 7. `inspect` (asks listeners and publishers over their rendezvous sockets; a
//!    publisher's answer is pub/sub's own packet, so `inspect` comes after `pubsub`).
//! 8. `testing` (helpers for the tests, cargo feature `testing`) and `threads` (the
//!    compile-time `Send`/`Sync` checks) may name anything; nothing names them.
//!
//! The crate root only declares and re-exports.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A module path from the crate root: `[]` is the crate, `["transport", "shm"]` is
/// `crate::transport::shm`.
type ModPath = Vec<String>;

/// One dependency, with where it was written.
#[derive(Clone, Debug)]
struct Edge {
    from: ModPath,
    to: ModPath,
    at: String,
}

/// What the sources say.
#[derive(Default)]
struct Crate {
    /// Every module, with its child modules.
    children: BTreeMap<ModPath, BTreeSet<String>>,
    /// Per module, the names its `use` items bind: name → the path it stands for
    /// (absolute, from the crate root, or `None` when it leads outside the crate).
    names: BTreeMap<ModPath, BTreeMap<String, Option<Vec<String>>>>,
    /// Every path written, unresolved: (module, absolute path or first-segment-relative,
    /// is a `pub use`, where).
    paths: Vec<(ModPath, Vec<String>, bool, String)>,
    /// Modules declared under `#[cfg(test)]` (or `#[cfg(all(test, …))]`).
    test_only: BTreeSet<ModPath>,
}

/// `src/` of this crate.
fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The workspace's root directory (file names in messages are relative to it).
fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Source text with comments, string and char literals blanked (newlines kept, so lines
/// still count).
fn strip(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    while i < c.len() {
        if c[i] == '/' && at(&c, i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
                out.push(' ');
            }
        } else if c[i] == '/' && at(&c, i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(&c, i + 1) == '*' {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && at(&c, i + 1) == '/' {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if (c[i] == 'r' || (c[i] == 'b' && at(&c, i + 1) == 'r'))
            && !c[i.saturating_sub(1)].is_alphanumeric()
            && {
                let s = if c[i] == 'b' { 2 } else { 1 };
                let mut k = s;
                while at(&c, i + k) == '#' {
                    k += 1;
                }
                at(&c, i + k) == '"'
            }
        {
            // Raw string: r"…", r#"…"#, br#"…"#.
            let mut k = if c[i] == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while at(&c, i + k) == '#' {
                hashes += 1;
                k += 1;
            }
            for _ in 0..=k {
                out.push(' ');
            }
            i += k + 1;
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|h| c.get(i + h) == Some(&'#')) {
                    for _ in 0..=hashes {
                        out.push(' ');
                    }
                    i += hashes + 1;
                    break;
                }
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' && (at(&c, i + 1) == '\\' || at(&c, i + 2) == '\'') {
            // A char literal ('x', '\n', '\u{..}'); a lifetime has no closing quote.
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '\'' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                out.push(' ');
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The char at `i`, or NUL past the end.
fn at(c: &[char], i: usize) -> char {
    c.get(i).copied().unwrap_or('\0')
}

/// A token: an identifier (with `$crate` as one), `::`, or one punctuation character.
#[derive(Clone, Debug, PartialEq)]
struct Tok {
    text: String,
    line: usize,
}

fn tokenize(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphabetic() || ch == '_' || (ch == '$' && c.get(i + 1) == Some(&'c')) {
            let start = i;
            i += 1;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let mut text: String = c[start..i].iter().collect();
            if let Some(raw) = text.strip_prefix("r#") {
                text = raw.to_string();
            }
            toks.push(Tok { text, line });
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            toks.push(Tok {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            toks.push(Tok {
                text: ch.to_string(),
                line,
            });
            i += 1;
        }
    }
    toks
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_' || c == '$')
}

/// Parses one use tree starting at `toks[*i]`, pushing every full path (a trailing
/// `self` is dropped, a glob `*` is kept as the last segment) with the name it binds (its
/// last segment, or what follows `as`) into `out`.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let mut path = prefix.to_vec();
    loop {
        let t = &toks[*i].text;
        if t == "{" {
            *i += 1;
            while toks[*i].text != "}" {
                use_tree(toks, i, &path, out);
                if toks[*i].text == "," {
                    *i += 1;
                }
            }
            *i += 1;
            return;
        } else if t == "*" {
            path.push("*".into());
            *i += 1;
            out.push((path, "*".into()));
            return;
        } else if is_ident(t) {
            if t != "self" || path.is_empty() {
                path.push(t.clone());
            }
            *i += 1;
            if toks[*i].text == "::" {
                *i += 1;
                continue;
            }
            let mut name = path.last().cloned().unwrap_or_default();
            if toks[*i].text == "as" {
                name = toks[*i + 1].text.clone();
                *i += 2;
            }
            out.push((path, name));
            return;
        } else {
            panic!(
                "unexpected token {t:?} in a use tree at line {}",
                toks[*i].line
            );
        }
    }
}

/// Whether the attributes just before a `mod` item (whose tokens end `before`) include a
/// `cfg` that needs `test`.
/// Whether the item whose first token follows `before` is `#[cfg(doc)]` (built only for
/// documentation: imports that exist for doc links).
fn cfg_doc(before: &[Tok]) -> bool {
    let text: Vec<&str> = before
        .iter()
        .rev()
        .take(7)
        .map(|t| t.text.as_str())
        .collect();
    text == ["]", ")", "doc", "(", "cfg", "[", "#"]
}

fn cfg_test(before: &[Tok]) -> bool {
    let mut j = before.len();
    // The visibility: `pub`, `pub(crate)`, `pub(super)`, `pub(in path)`.
    while j > 0 && ["pub", "(", ")", "crate", "super", "in", "self"].contains(&&*before[j - 1].text)
    {
        j -= 1;
    }
    while j > 0 && before[j - 1].text == "]" {
        let end = j - 1;
        let mut open = end;
        let mut level = 0;
        loop {
            match before[open].text.as_str() {
                "]" => level += 1,
                "[" => level -= 1,
                _ => {}
            }
            if level == 0 {
                break;
            }
            open -= 1;
        }
        let attr = &before[open + 1..end];
        let needs_test = attr.first().is_some_and(|t| t.text == "cfg")
            && (2..attr.len()).any(|k| attr[k].text == "test" && attr[k - 2].text != "not");
        if needs_test {
            return true;
        }
        j = open.saturating_sub(1); // before the `#`
    }
    false
}

/// Reads one file (module `module`), recording its inline modules, `use`s and paths.
fn read_file(krate: &mut Crate, file: &Path, module: &ModPath) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
    let toks = tokenize(&strip(&text));
    let rel = file.strip_prefix(workspace_dir()).unwrap_or(file);
    krate.children.entry(module.clone()).or_default();
    // Inline modules open at a brace depth; the stack says which module a token is in.
    let mut stack: Vec<(ModPath, usize)> = vec![(module.clone(), 0)];
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let cur = stack.last().unwrap().0.clone();
        let t = toks[i].text.as_str();
        let at = format!("{}:{}", rel.display(), toks[i].line);
        match t {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if stack.len() > 1 && stack.last().unwrap().1 == depth {
                    stack.pop();
                }
            }
            "mod" if i + 2 < toks.len() && is_ident(&toks[i + 1].text) => {
                let name = toks[i + 1].text.clone();
                krate
                    .children
                    .entry(cur.clone())
                    .or_default()
                    .insert(name.clone());
                let mut child = cur.clone();
                child.push(name);
                krate.children.entry(child.clone()).or_default();
                if cfg_test(&toks[..i]) {
                    krate.test_only.insert(child.clone());
                }
                if toks[i + 2].text == "{" {
                    stack.push((child, depth));
                    depth += 1;
                    i += 3;
                    continue;
                }
                i += 2;
                continue;
            }
            "use" if cfg_doc(&toks[..i]) => {
                // `#[cfg(doc)] use …`: names for doc links only, no dependency.
                while i < toks.len() && toks[i].text != ";" {
                    i += 1;
                }
            }
            "use" => {
                // `pub use`, `pub(crate) use`, `pub(in …) use`: a re-export.
                let public = i >= 1
                    && (toks[i - 1].text == "pub"
                        || (toks[i - 1].text == ")"
                            && toks[..i].iter().rev().take(6).any(|t| t.text == "pub")));
                i += 1;
                if toks[i].text == "::" {
                    i += 1;
                }
                let mut paths = Vec::new();
                use_tree(&toks, &mut i, &[], &mut paths);
                for (p, name) in paths {
                    // Every `use` binds a name in the module, which its descendants (and,
                    // for a `pub use`, others) may name as `that::module::name`.
                    if name != "*" && name != "_" {
                        let target = absolute(krate, &cur, &p);
                        krate
                            .names
                            .entry(cur.clone())
                            .or_default()
                            .insert(name, target);
                    }
                    krate.paths.push((cur.clone(), p, public, at.clone()));
                }
                continue;
            }
            _ if (t == "crate" || t == "$crate" || t == "super" || t == "self")
                || (is_ident(t) && i + 1 < toks.len() && toks[i + 1].text == "::") =>
            {
                let after_sep = i >= 1 && toks[i - 1].text == "::";
                if !after_sep && i + 1 < toks.len() && toks[i + 1].text == "::" {
                    let mut p = vec![t.to_string()];
                    let mut k = i + 1;
                    while k + 1 < toks.len() && toks[k].text == "::" && is_ident(&toks[k + 1].text)
                    {
                        p.push(toks[k + 1].text.clone());
                        k += 2;
                    }
                    krate.paths.push((cur.clone(), p, false, at));
                    i = k;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
}

/// The absolute path (from the crate root) of `p` as written in module `cur`, or `None`
/// when it leads outside the crate (std, libc, another crate, a local variable's method).
fn absolute(krate: &Crate, cur: &ModPath, p: &[String]) -> Option<Vec<String>> {
    let mut base = cur.clone();
    let mut segs = p;
    match p.first().map(String::as_str) {
        Some("crate") | Some("$crate") => {
            base.clear();
            segs = &p[1..];
        }
        Some("self") => segs = &p[1..],
        Some("super") => {
            let mut k = 0;
            while p.get(k).map(String::as_str) == Some("super") {
                base.pop();
                k += 1;
            }
            segs = &p[k..];
        }
        Some(first) => {
            let child = krate.children.get(cur).is_some_and(|c| c.contains(first));
            if !child {
                return None;
            }
        }
        None => return None,
    }
    base.extend(segs.iter().cloned());
    Some(base)
}

/// The module holding the item at absolute path `p`, seeing re-exports through; `None`
/// when the path leaves the crate (a re-export of another crate's item).
fn resolve(krate: &Crate, p: &[String], hops: usize) -> Option<ModPath> {
    assert!(hops < 16, "re-export loop at {p:?}");
    let mut m: ModPath = Vec::new();
    for (k, seg) in p.iter().enumerate() {
        if krate.children.get(&m).is_some_and(|c| c.contains(seg)) {
            m.push(seg.clone());
            continue;
        }
        if let Some(target) = krate.names.get(&m).and_then(|r| r.get(seg)) {
            let target = target.as_ref()?;
            let mut full = target.clone();
            full.extend(p[k + 1..].iter().cloned());
            // A re-export of an item of the module itself (`pub(crate) use a_macro;`).
            if full == p {
                return Some(m);
            }
            return resolve(krate, &full, hops + 1);
        }
        return Some(m);
    }
    Some(m)
}

/// Every module file under `dir` for module `module`, recursively by `mod` declarations.
fn read_tree(krate: &mut Crate, file: &Path, module: &ModPath) {
    read_file(krate, file, module);
    let children: Vec<String> = krate.children[module].iter().cloned().collect();
    let dir = if module.is_empty() && (file.ends_with("lib.rs") || file.ends_with("main.rs"))
        || file.ends_with("mod.rs")
    {
        file.parent().unwrap().to_path_buf()
    } else {
        file.with_extension("")
    };
    for child in children {
        let mut cm = module.clone();
        cm.push(child.clone());
        let flat = dir.join(format!("{child}.rs"));
        let nested = dir.join(&child).join("mod.rs");
        if flat.exists() {
            read_tree(krate, &flat, &cm);
        } else if nested.exists() {
            read_tree(krate, &nested, &cm);
        }
        // Otherwise an inline module, read with its file.
    }
}

fn starts_with(p: &[String], prefix: &[String]) -> bool {
    p.len() >= prefix.len() && p[..prefix.len()] == *prefix
}

/// The dependencies, resolved; re-exports of a module's own descendants left out.
fn edges(krate: &Crate) -> Vec<Edge> {
    let test_only = |m: &ModPath| (0..=m.len()).any(|k| krate.test_only.contains(&m[..k]));
    let mut out = Vec::new();
    for (from, p, public, at) in &krate.paths {
        if test_only(from) {
            continue;
        }
        let Some(abs) = absolute(krate, from, p) else {
            continue;
        };
        let abs: Vec<String> = abs.into_iter().filter(|s| s != "*").collect();
        let Some(to) = resolve(krate, &abs, 0) else {
            continue;
        };
        if (*public && starts_with(&to, from)) || test_only(&to) {
            continue;
        }
        if to != *from {
            out.push(Edge {
                from: from.clone(),
                to,
                at: at.clone(),
            });
        }
    }
    out
}

fn name(m: &[String]) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// Every circle, one line per level and strongly connected set, with the edges that
/// close it and where they were written.
fn circles(krate: &Crate, edges: &[Edge]) -> Vec<String> {
    let mut found = Vec::new();
    for (m, children) in &krate.children {
        // Node of a module inside m's subtree: "" for m itself, else the child's name.
        let node = |x: &ModPath| -> Option<String> {
            if !starts_with(x, m) {
                return None;
            }
            Some(x.get(m.len()).cloned().unwrap_or_default())
        };
        let mut graph: BTreeMap<String, BTreeMap<String, Vec<&Edge>>> = BTreeMap::new();
        for e in edges {
            if let (Some(a), Some(b)) = (node(&e.from), node(&e.to)) {
                if a != b {
                    graph.entry(a).or_default().entry(b).or_default().push(e);
                }
            }
        }
        let mut nodes: Vec<String> = children.iter().cloned().collect();
        nodes.push(String::new());
        for scc in strongly_connected(&nodes, &graph) {
            if scc.len() < 2 {
                continue;
            }
            let label = |n: &String| {
                if n.is_empty() {
                    format!("{} (its own file)", name(m))
                } else {
                    let mut c = m.clone();
                    c.push(n.clone());
                    name(&c)
                }
            };
            let mut s = format!(
                "circles under `{}` among {}\n",
                name(m),
                scc.iter().map(label).collect::<Vec<_>>().join(", ")
            );
            // The shortest circle through each edge, each printed once.
            let mut seen = BTreeSet::new();
            for a in &scc {
                for b in graph.get(a).into_iter().flatten().map(|(b, _)| b) {
                    let Some(back) = shortest_path(&graph, b, a) else {
                        continue;
                    };
                    let mut ring: Vec<String> = std::iter::once(a.clone()).chain(back).collect();
                    ring.pop(); // `a` again
                    let start = (0..ring.len()).min_by_key(|&k| &ring[k]).unwrap();
                    ring.rotate_left(start);
                    if seen.insert(ring.clone()) {
                        let mut names: Vec<String> = ring.iter().map(label).collect();
                        names.push(label(&ring[0]));
                        let _ = writeln!(s, "  circle: {}", names.join(" -> "));
                    }
                }
            }
            let _ = writeln!(s, "  because:");
            for a in &scc {
                for (b, es) in graph.get(a).into_iter().flatten() {
                    if scc.contains(b) {
                        let _ = writeln!(
                            s,
                            "    {} -> {}: {}",
                            label(a),
                            label(b),
                            es.iter()
                                .map(|e| format!("{} names {}", e.at, name(&e.to)))
                                .collect::<BTreeSet<_>>()
                                .into_iter()
                                .take(3)
                                .collect::<Vec<_>>()
                                .join("; ")
                        );
                    }
                }
            }
            found.push(s);
        }
    }
    found
}

/// The nodes on a shortest path from `from` to `to` (both included).
fn shortest_path(
    graph: &BTreeMap<String, BTreeMap<String, Vec<&Edge>>>,
    from: &str,
    to: &str,
) -> Option<Vec<String>> {
    let mut prev: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([from.to_string()]);
    let mut seen = BTreeSet::from([from.to_string()]);
    while let Some(v) = queue.pop_front() {
        if v == *to {
            let mut path = vec![v.clone()];
            let mut cur = v;
            while let Some(p) = prev.get(&cur) {
                path.push(p.clone());
                cur = p.clone();
            }
            path.reverse();
            return Some(path);
        }
        for w in graph.get(&v).into_iter().flatten().map(|(w, _)| w) {
            if seen.insert(w.clone()) {
                prev.insert(w.clone(), v.clone());
                queue.push_back(w.clone());
            }
        }
    }
    None
}

/// Tarjan's strongly connected components, each sorted.
fn strongly_connected(
    nodes: &[String],
    graph: &BTreeMap<String, BTreeMap<String, Vec<&Edge>>>,
) -> Vec<Vec<String>> {
    struct State<'g, 'e> {
        graph: &'g BTreeMap<String, BTreeMap<String, Vec<&'e Edge>>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on_stack: BTreeSet<String>,
        out: Vec<Vec<String>>,
    }
    fn visit(s: &mut State, v: &String) {
        let n = s.index.len();
        s.index.insert(v.clone(), n);
        s.low.insert(v.clone(), n);
        s.stack.push(v.clone());
        s.on_stack.insert(v.clone());
        let next: Vec<String> = s
            .graph
            .get(v)
            .into_iter()
            .flatten()
            .map(|(w, _)| w.clone())
            .collect();
        for w in &next {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(&w);
                let done = w == *v;
                scc.push(w);
                if done {
                    break;
                }
            }
            scc.sort();
            s.out.push(scc);
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn library() -> Crate {
    read_crate(&src_dir().join("lib.rs"))
}

/// The module tree of the crate whose root file is `root`.
fn read_crate(root: &Path) -> Crate {
    let mut krate = Crate::default();
    read_tree(&mut krate, root, &Vec::new());
    krate
}

/// Every crate root of the workspace's members: `src/lib.rs`, `src/main.rs`,
/// `src/bin/NAME.rs` and `src/bin/NAME/main.rs`.
fn workspace_crate_roots() -> Vec<PathBuf> {
    let crates = workspace_dir().join("crates");
    let mut roots = Vec::new();
    let mut members: Vec<PathBuf> = std::fs::read_dir(&crates)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").exists())
        .collect();
    members.sort();
    for member in members {
        let src = member.join("src");
        for root in ["lib.rs", "main.rs"] {
            if src.join(root).exists() {
                roots.push(src.join(root));
            }
        }
        let Ok(bins) = std::fs::read_dir(src.join("bin")) else {
            continue;
        };
        let mut bins: Vec<PathBuf> = bins.map(|e| e.unwrap().path()).collect();
        bins.sort();
        for bin in bins {
            if bin.extension().is_some_and(|e| e == "rs") {
                roots.push(bin);
            } else if bin.join("main.rs").exists() {
                roots.push(bin.join("main.rs"));
            }
        }
    }
    roots
}

#[test]
fn no_import_circles() {
    let krate = library();
    let edges = edges(&krate);
    let found = circles(&krate, &edges);
    assert!(
        found.is_empty(),
        "{} import circle(s) in the library (rule: see tests/layering.rs):\n{}",
        found.len(),
        found.concat()
    );
}

/// The same rule in every crate of the workspace (its library and each binary), not only
/// the library: the preload, the benchmark, the CLI, the C and Python bindings each keep
/// their modules in layers too.
#[test]
fn no_import_circles_in_any_crate() {
    let roots = workspace_crate_roots();
    assert!(roots.len() >= 10, "found only {roots:?}");
    let mut report = String::new();
    for root in &roots {
        let krate = read_crate(root);
        for c in circles(&krate, &edges(&krate)) {
            let _ = writeln!(
                report,
                "{}:\n{c}",
                root.strip_prefix(workspace_dir()).unwrap().display()
            );
        }
    }
    assert!(
        report.is_empty(),
        "import circles (rule: see tests/layering.rs):\n{report}"
    );
}

/// The checker sees what it must: a few dependencies the library is known to have, and a
/// circle in a made-up tree.
#[test]
fn the_checker_sees_dependencies() {
    let krate = library();
    let edges = edges(&krate);
    let has = |from: &str, to: &str| {
        edges
            .iter()
            .any(|e| name(&e.from) == from && name(&e.to) == to)
    };
    // A `use crate::…` line, and a re-export seen through (`crate::Error` is in `error`).
    assert!(has("conn", "error"), "conn -> error not seen");
    // `super::…` from a file module.
    assert!(
        has("transport::shm::conn", "transport::shm::segment")
            || has("transport::shm::conn", "transport::shm")
    );

    let mut made_up = Crate::default();
    for (m, c) in [(vec![], "a"), (vec![], "b")] {
        made_up.children.entry(m).or_default().insert(c.to_string());
    }
    made_up.children.insert(vec!["a".into()], BTreeSet::new());
    made_up.children.insert(vec!["b".into()], BTreeSet::new());
    made_up.paths.push((
        vec!["a".into()],
        vec!["crate".into(), "b".into(), "X".into()],
        false,
        "a.rs:1".into(),
    ));
    made_up.paths.push((
        vec!["b".into()],
        vec!["super".into(), "a".into(), "Y".into()],
        false,
        "b.rs:1".into(),
    ));
    let found = circles(&made_up, &self::edges(&made_up));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("a -> b -> a"), "{}", found[0]);

    // A parent's own code naming its child's item while the child names the parent's is a
    // circle too; the parent's `mod` declaration and `pub use` of the child are not.
    let mut family = Crate::default();
    family
        .children
        .insert(vec![], BTreeSet::from(["p".to_string()]));
    family
        .children
        .insert(vec!["p".into()], BTreeSet::from(["c".to_string()]));
    family
        .children
        .insert(vec!["p".into(), "c".into()], BTreeSet::new());
    let (p, c) = (
        vec!["p".to_string()],
        vec!["p".to_string(), "c".to_string()],
    );
    let path = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    family
        .paths
        .push((c.clone(), path("super::Trait"), false, "c.rs:1".into()));
    family
        .paths
        .push((p.clone(), path("c::Impl"), true, "p.rs:1".into()));
    assert!(circles(&family, &self::edges(&family)).is_empty());
    family
        .paths
        .push((p.clone(), path("c::Impl"), false, "p.rs:2".into()));
    let found = circles(&family, &self::edges(&family));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("p (its own file) -> p::c -> p (its own file)"),
        "{}",
        found[0]
    );
}

/// Publish/subscribe reaches the transports through one narrow interface: its network
/// side through `transport::net`, its shared-memory side through the `shm:` packet codec
/// its own handshake extends (`transport::shm::handshake`), nothing else of `transport`.
#[test]
fn pubsub_names_of_transport_only_net_and_the_shm_packet_codec() {
    let krate = library();
    let allowed = [
        "transport::net",
        "transport::local",
        "transport::shm::handshake",
    ];
    let wrong: Vec<String> = edges(&krate)
        .into_iter()
        .filter(|e| name(&e.from).starts_with("pubsub") && name(&e.to).starts_with("transport"))
        .filter(|e| !allowed.contains(&name(&e.to).as_str()))
        .map(|e| format!("{} names {}", e.at, name(&e.to)))
        .collect();
    assert!(
        wrong.is_empty(),
        "pub/sub reaches into transport internals:\n{}",
        wrong.join("\n")
    );
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Whether `file` is product code: not a test module in a file of its own (`tests.rs`,
/// declared `#[cfg(test)]`) nor a loom model (`loom_*.rs`, built only under `--cfg loom`).
fn is_product_file(file: &Path) -> bool {
    let name = file.file_name().unwrap().to_string_lossy();
    name != "tests.rs" && !name.starts_with("loom_") && !file.ends_with("loom_model.rs")
}

/// The tokens of `file` outside `#[cfg(test)]` modules (comments and strings blanked).
fn product_tokens(file: &Path) -> Vec<Tok> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
    let toks = tokenize(&strip(&text));
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        let test_mod = toks[i].text == "mod"
            && toks.get(i + 2).is_some_and(|t| t.text == "{")
            && cfg_test(&toks[..i]);
        if test_mod {
            // Skip to the brace that closes the module.
            let mut depth = 0usize;
            i += 2;
            while i < toks.len() {
                match toks[i].text.as_str() {
                    "{" => depth += 1,
                    "}" => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        } else {
            out.push(toks[i].clone());
        }
        i += 1;
    }
    out
}

/// System calls go through `shmlink-sys`, the one crate whose unsafe code speaks to the
/// kernel and the C library. Outside it, no product code calls a `libc::` function
/// (constants and types, such as errno values for the C and Python errors, are fine).
/// The exceptions, each a room of its own: the preload, which *is* an interposer of the
/// C library (its hooks and the real calls behind them); the benchmark's kernel methods
/// (`methods/`: pipes, message queues, futexes measured as they are); and the test kit,
/// whose hostile peers make the raw calls a well-behaved program never would. Tests and
/// `#[cfg(test)]` modules are not product code.
#[test]
fn libc_calls_only_in_sys() {
    let exempt = [
        "crates/shmlink-sys/",
        "crates/shmlink-preload/",
        "crates/shmlink-bench/src/methods/",
        "crates/shmlink-bench/src/pubsub/methods/",
        "crates/shmlink-testkit/",
    ];
    let root = workspace_dir().canonicalize().unwrap();
    let mut found = Vec::new();
    for file in rust_files(&root.join("crates")) {
        let rel = file.strip_prefix(&root).unwrap().display().to_string();
        if !rel.contains("/src/") || exempt.iter().any(|e| rel.starts_with(e)) {
            continue;
        }
        if !is_product_file(&file) {
            continue;
        }
        let toks = product_tokens(&file);
        for w in toks.windows(4) {
            let call = w[0].text == "libc"
                && w[1].text == "::"
                && w[2].text.starts_with(|c: char| c.is_ascii_lowercase())
                && w[3].text == "(";
            if call {
                found.push(format!("{rel}:{} calls libc::{}", w[0].line, w[2].text));
            }
        }
    }
    assert!(
        found.is_empty(),
        "libc calls outside shmlink-sys (add a safe wrapper there; rule: see \
         tests/layering.rs):\n{}",
        found.join("\n")
    );
}

/// Memory another process can write is read with `shmlink_sys::copy_shared` (or the
/// ring's readers built on it), which names the race and cannot be miscompiled into
/// reading a value twice; a plain `copy_nonoverlapping` out of it can. In the library and
/// the ring, a plain copy therefore only ever copies *from this process's own memory*
/// (into a ring, a region or a lent buffer), and its `// SAFETY:` comment says so in
/// those words ("own memory"), which this test reads. Zero-copy reads (`recv_ref`, a
/// subscriber's lent message) hand out slices over the peer's pages on purpose; they are
/// documented where they are made and are not copies.
#[test]
fn no_plain_copies_from_shared_memory() {
    let root = workspace_dir().canonicalize().unwrap();
    let mut found = Vec::new();
    for dir in ["crates/shmlink/src", "crates/shmlink-ring/src"] {
        for file in rust_files(&root.join(dir)) {
            if !is_product_file(&file) {
                continue;
            }
            let rel = file.strip_prefix(&root).unwrap().display().to_string();
            let lines: Vec<String> = std::fs::read_to_string(&file)
                .unwrap()
                .lines()
                .map(String::from)
                .collect();
            let toks = product_tokens(&file);
            for (k, t) in toks.iter().enumerate() {
                let copy = (t.text == "copy_nonoverlapping" || t.text == "copy")
                    && k >= 2
                    && toks[k - 1].text == "::"
                    && toks[k - 2].text == "ptr"
                    && toks.get(k + 1).is_some_and(|t| t.text == "(");
                if !copy {
                    continue;
                }
                // The comment block above the statement (up to eight lines up).
                let at = t.line - 1;
                let said = lines[at.saturating_sub(8)..=at]
                    .iter()
                    .any(|l| l.contains("own memory"));
                if !said {
                    found.push(format!("{rel}:{}", t.line));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "plain copies not stated to read this process's own memory (read shared memory \
         with shmlink_sys::copy_shared, or say \"own memory\" in the SAFETY comment; \
         rule: see tests/layering.rs):\n{}",
        found.join("\n")
    );
}

/// Every atomic type and fence in the library and the ring crate comes from the one shim,
/// `shmlink_ring::sync` (the library's `crate::sync`), so that the loom build replaces
/// all of them: no `std::sync::atomic` or `core::sync::atomic` path in code, whatever
/// the type (`AtomicU8`, `AtomicBool` and `AtomicUsize` as much as `AtomicU64` or
/// `fence`), and whatever the import's shape, outside the shim itself.
#[test]
fn atomics_come_only_from_the_sync_shim() {
    let ring = src_dir().join("../../shmlink-ring/src");
    let shim = ring.join("sync.rs");
    assert!(shim.is_file(), "the shim at {}", shim.display());
    let mut stack = vec![src_dir(), ring];
    let (mut checked, mut bad) = (0, Vec::new());
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension() != Some("rs".as_ref()) || path == shim {
                continue;
            }
            let code = strip(&std::fs::read_to_string(&path).unwrap());
            // Whitespace out, loom's own atomics (the loom models' helpers) aside.
            let flat: String = code.split_whitespace().collect();
            let flat = flat.replace("loom::sync::atomic", "");
            if flat.contains("sync::atomic") {
                bad.push(format!("{}: sync::atomic", path.display()));
            }
            let mut rest = flat.as_str();
            while let Some(i) = rest.find("sync::{") {
                rest = &rest[i + "sync::{".len()..];
                let group = &rest[..rest.find('}').unwrap_or(rest.len())];
                if group.split(',').any(|item| item.starts_with("atomic")) {
                    bad.push(format!("{}: sync::{{atomic…}}", path.display()));
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} files found");
    assert!(
        bad.is_empty(),
        "atomics taken around the shim (import them from crate::sync / shmlink_ring::sync):\n{}",
        bad.join("\n")
    );
}
