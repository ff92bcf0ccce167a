//! What `shmlink` generates about itself and what it hands on: shell completions that
//! know every command, a manual page that `man` renders, and `shmlink bench` running the
//! shmlink-bench program with its arguments (or saying how to get it).

use shmlink_testkit::install_executable;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_shmlink");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn stdout(out: Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The commands `shmlink --help` lists.
fn commands() -> Vec<String> {
    let help = stdout(run(&["--help"]));
    let commands: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    for c in [
        "pong",
        "ls",
        "metrics",
        "send",
        "recv",
        "pub",
        "sub",
        "bench",
        "completions",
        "man",
    ] {
        assert!(commands.iter().any(|x| x == c), "{c} missing: {help}");
    }
    commands
}

#[test]
fn completion_scripts_know_every_command() {
    let commands = commands();
    let bash = stdout(run(&["completions", "bash"]));
    for c in &commands {
        assert!(
            bash.contains(&format!("shmlink__{c}")) || bash.contains(c.as_str()),
            "bash: {c}"
        );
    }
    assert!(bash.contains("complete -F _shmlink"), "{bash}");
    // The script is valid bash.
    if let Ok(out) = Command::new("bash").arg("-n").arg("-c").arg(&bash).output() {
        assert!(out.status.success(), "bash -n: {out:?}");
    }
    let zsh = stdout(run(&["completions", "zsh"]));
    assert!(zsh.starts_with("#compdef shmlink"), "{zsh}");
    let fish = stdout(run(&["completions", "fish"]));
    for c in &commands {
        assert!(zsh.contains(c.as_str()) && fish.contains(c.as_str()), "{c}");
    }
    assert_eq!(run(&["completions", "tcsh"]).status.code(), Some(2));
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shmlink-cli-manual-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn the_manual_page_renders() {
    let page = stdout(run(&["man"]));
    assert!(page.contains(".TH shmlink 1"), "{page}");
    for section in [".SH NAME", ".SH SYNOPSIS", ".SH SUBCOMMANDS", ".SH VERSION"] {
        assert!(page.contains(section), "{section}: {page}");
    }
    let pong = stdout(run(&["man", "pong"]));
    assert!(
        pong.contains(".TH shmlink-pong 1") && pong.contains("spin\\-us"),
        "{pong}"
    );
    assert_eq!(run(&["man", "bong"]).status.code(), Some(2));
    // Rendered by man(1) where it is installed.
    let d = temp("man");
    let file = d.join("shmlink.1");
    std::fs::write(&file, &page).unwrap();
    match Command::new("man")
        .arg("-l")
        .arg(&file)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
    {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("SYNOPSIS") && text.contains("pong"), "{text}");
        }
        Ok(out) => eprintln!("note: man -l failed here ({out:?}); the roff headers were checked"),
        Err(e) => eprintln!("note: no man here ({e}); the roff headers were checked"),
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// A copy of shmlink in a directory of its own, with `PATH` holding only `path`.
fn isolated(d: &Path, args: &[&str], path: &Path) -> Output {
    let exe = d.join("shmlink");
    install_executable(Path::new(BIN), &exe);
    Command::new(&exe)
        .args(args)
        .env("PATH", path)
        .output()
        .unwrap()
}

#[test]
fn bench_runs_the_bench_program_or_says_how_to_get_it() {
    let d = temp("bench");
    let empty = d.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = isolated(&d, &["bench", "--quick"], &empty);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cargo run --release -p shmlink-bench"),
        "{stderr}"
    );
    // --help without the program: what it is and how to get it, status 0.
    for help in ["--help", "-h"] {
        let out = isolated(&d, &["bench", help], &empty);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert!(
            stdout.contains("Usage: shmlink bench")
                && stdout.contains("scripts/install.sh --bench"),
            "{stdout}"
        );
    }
    // A stand-in next to shmlink gets every argument, --help included, and its exit code
    // is shmlink's.
    let script = d.join("fake-bench.sh");
    let args_file = d.join("args");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > '{}'\nexit 3\n",
            args_file.display()
        ),
    )
    .unwrap();
    install_executable(&script, &d.join("shmlink-bench"));
    let out = isolated(
        &d,
        &["bench", "--pattern", "pubsub", "--help", "-x"],
        &empty,
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(&args_file).unwrap(),
        "--pattern\npubsub\n--help\n-x\n"
    );
    let _ = std::fs::remove_dir_all(&d);
}
