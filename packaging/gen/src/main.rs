//! `ironguard-gen-docs --out DIR`: writes the man pages and shell completions of `ironguard-agent`,
//! `ironguard-controlplane` and `ironguardctl` under DIR (see the library's documentation for the layout).
#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::Parser as _;
use ironguard_gen_docs::{ManTitle, write_all};

#[derive(Debug, clap::Parser)]
#[command(name = "ironguard-gen-docs", version, about = "Write ironguard's man pages and shell completions")]
struct Args {
    /// Output directory (created if missing): man/man1/*.1 and completions/{bash,zsh,fish}/.
    #[arg(long)]
    out: PathBuf,
    /// Date in the man pages' title line (YYYY-MM-DD); none by default, for reproducible output.
    #[arg(long, default_value = "")]
    date: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let title = ManTitle { date: args.date, source: format!("ironguard {}", env!("CARGO_PKG_VERSION")) };
    let written = write_all(&args.out, &title)?;
    println!("ironguard-gen-docs: {} files under {}", written.len(), args.out.display());
    Ok(())
}
