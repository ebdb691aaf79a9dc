//! Man pages and shell completions for ironguard's three commands, generated from their clap definitions
//! ([`ironguard_agent::cli::Cli`], [`ironguard_controlplane::cli::Cli`], [`ironguardctl::cli::Cli`]) so they never
//! drift from `--help`. `scripts/package.sh` runs the `ironguard-gen-docs` binary and puts the files where Debian
//! expects them.
//!
//! [`write_all`] writes, under one output directory:
//! - `man/man1/<command>.1`, and one page per subcommand (`ironguardctl-filters-allow.1`, …);
//! - `completions/bash/<command>`, `completions/zsh/_<command>`, `completions/fish/<command>.fish`.
#![forbid(unsafe_code)]

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::CommandFactory as _;
use clap_complete::Shell;

/// The commands that get a man page and completions, by the name they are installed under.
pub fn commands() -> Vec<clap::Command> {
    vec![
        ironguard_agent::cli::Cli::command(),
        ironguard_controlplane::cli::Cli::command(),
        ironguardctl::cli::Cli::command(),
    ]
}

/// What goes in the man pages' title line besides the name: the date (`YYYY-MM-DD`, empty for none, which keeps
/// the output reproducible) and the source (e.g. `ironguard 0.1.0`).
#[derive(Debug, Clone, Default)]
pub struct ManTitle {
    pub date: String,
    pub source: String,
}

/// Writes every man page and completion file under `out` (created if missing) and returns the files written.
pub fn write_all(out: &Path, title: &ManTitle) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for cmd in commands() {
        written.extend(write_man_pages(cmd.clone(), &out.join("man/man1"), title)?);
        written.extend(write_completions(cmd, &out.join("completions"))?);
    }
    Ok(written)
}

/// The command's page and one per (visible) subcommand, recursively; `help` subcommands get none.
fn write_man_pages(cmd: clap::Command, dir: &Path, title: &ManTitle) -> anyhow::Result<Vec<PathBuf>> {
    fn walk(cmd: clap::Command, dir: &Path, title: &ManTitle, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            walk(sub, dir, title, out)?;
        }
        let man = clap_mangen::Man::new(cmd).date(title.date.clone()).source(title.source.clone()).manual("ironguard");
        let path = man.generate_to(dir).with_context(|| format!("writing a man page in {}", dir.display()))?;
        out.push(path);
        Ok(())
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    walk(cmd, dir, title, &mut out)?;
    Ok(out)
}

/// Completion scripts named as bash-completion, zsh and fish look them up (`name`, `_name`, `name.fish`).
fn write_completions(mut cmd: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let name = cmd.get_name().to_string();
    let mut out = Vec::new();
    for (shell, file) in [
        (Shell::Bash, format!("bash/{name}")),
        (Shell::Zsh, format!("zsh/_{name}")),
        (Shell::Fish, format!("fish/{name}.fish")),
    ] {
        let path = dir.join(file);
        let parent = path.parent().unwrap_or(dir);
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut cmd, name.clone(), &mut buf);
        fs::write(&path, buf).with_context(|| format!("writing {}", path.display()))?;
        out.push(path);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn writes_a_page_per_command_and_subcommand_and_three_completions_each() {
        let out = std::env::temp_dir().join(format!("ironguard-gen-docs-test-{}", std::process::id()));
        let title = ManTitle { date: "2026-01-01".into(), source: "ironguard 0.0.0".into() };
        let written = write_all(&out, &title).unwrap();
        for name in ["ironguard-agent", "ironguard-controlplane", "ironguardctl"] {
            let page = fs::read_to_string(out.join(format!("man/man1/{name}.1"))).unwrap();
            assert!(page.contains(".TH "), "{name}.1 is not a man page");
            assert!(page.contains("ironguard 0.0.0") && page.contains("2026-01-01"), "{name}.1 title: {page}");
            for f in [format!("bash/{name}"), format!("zsh/_{name}"), format!("fish/{name}.fish")] {
                let text = fs::read_to_string(out.join("completions").join(&f)).unwrap();
                assert!(text.contains(name), "{f} does not mention {name}");
            }
        }
        // Subcommands get their own pages, the help subcommand none.
        for page in ["ironguard-agent-guard-install.1", "ironguardctl-filters-allow.1"] {
            assert!(out.join("man/man1").join(page).is_file(), "{page} is missing");
        }
        assert!(!out.join("man/man1/ironguardctl-help.1").exists());
        // The environment variables are documented, as in --help.
        let agent = fs::read_to_string(out.join("man/man1/ironguard-agent.1")).unwrap();
        assert!(agent.contains("IRONGUARD_AGENT_CONFIG"), "{agent}");
        assert_eq!(written.len(), fs::read_dir(out.join("man/man1")).unwrap().count() + 9);
        fs::remove_dir_all(&out).unwrap();
    }
}
