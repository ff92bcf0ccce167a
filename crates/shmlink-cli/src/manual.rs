//! `shmlink completions SHELL` and `shmlink man [COMMAND]`: generated from the command
//! tree, so they never disagree with the parser.

use std::io::{self, Write};
use std::process::ExitCode;

use clap::CommandFactory;

use crate::cli::{usage_error, Cli, CompletionsCli, ManCli};

/// Writes the completion script for the shell on `out`.
pub fn completions(args: &CompletionsCli, out: &mut impl Write) {
    clap_complete::generate(args.shell, &mut Cli::command(), "shmlink", out);
}

/// Writes the manual page (roff) of `shmlink`, or of one of its commands, on `out`.
pub fn man(args: &ManCli, out: &mut impl Write) -> Result<(), clap::Error> {
    let mut cmd = Cli::command();
    cmd.build();
    let page = match &args.command {
        None => cmd,
        Some(name) => {
            let Some(sub) = cmd.find_subcommand(name) else {
                return Err(usage_error(
                    "man",
                    format!("no command {name:?} (shmlink --help lists them)"),
                ));
            };
            // Named shmlink-COMMAND, as git's pages are.
            let title = format!("shmlink-{name}");
            sub.clone().name(title.clone()).bin_name(title)
        }
    };
    clap_mangen::Man::new(page)
        .render(out)
        .map_err(|e| clap::Error::raw(clap::error::ErrorKind::Io, e))
}

/// Runs `shmlink completions`.
pub fn run_completions(args: &CompletionsCli) -> ExitCode {
    let mut out = io::stdout().lock();
    completions(args, &mut out);
    let _ = out.flush();
    ExitCode::SUCCESS
}

/// Runs `shmlink man`.
pub fn run_man(args: &ManCli) -> ExitCode {
    let mut out = io::stdout().lock();
    match man(args, &mut out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == clap::error::ErrorKind::Io => {
            eprintln!("shmlink man: {e}");
            ExitCode::from(1)
        }
        Err(e) => crate::cli::report(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_gets_a_script_naming_every_command() {
        let commands: Vec<String> = Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        assert!(commands.len() >= 8, "{commands:?}");
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut out = Vec::new();
            completions(&CompletionsCli { shell }, &mut out);
            let script = String::from_utf8(out).unwrap();
            for c in &commands {
                assert!(script.contains(c.as_str()), "{shell}: no {c}");
            }
        }
    }

    #[test]
    fn man_pages_are_roff() {
        for command in [None, Some("pong".to_string()), Some("send".to_string())] {
            let mut out = Vec::new();
            man(
                &ManCli {
                    command: command.clone(),
                },
                &mut out,
            )
            .unwrap();
            let page = String::from_utf8(out).unwrap();
            let title = match &command {
                None => "shmlink".to_string(),
                Some(c) => format!("shmlink-{c}"),
            };
            assert!(
                page.starts_with(".ie \\n(.g .ds Aq") || page.contains(".TH"),
                "{page}"
            );
            assert!(
                page.contains(&format!(".TH {title}")),
                "{command:?}: {page}"
            );
            assert!(page.contains(".SH NAME") && page.contains(".SH SYNOPSIS"));
        }
        let e = man(
            &ManCli {
                command: Some("bong".into()),
            },
            &mut Vec::new(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("no command \"bong\""));
    }
}
