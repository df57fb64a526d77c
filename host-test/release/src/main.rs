//! `coord-release`: coord's release, from one command.
//!
//! ```text
//! cargo run -p coord-release -- prebuilt            # refresh host-test/*/prebuilt/
//! cargo run -p coord-release -- dist --out DIR      # the release folder
//! ```
//!
//! `prebuilt` builds the components (`coord.wasm`, the example functions)
//! and writes them into the crates that embed them, with the toolchain that
//! built them: what a published crate carries (docs/packaging.md). `dist`
//! refuses to run when those are not what the sources build today, then
//! writes one folder: `coord.wasm`, the WIT package encoded as a wasm
//! package, the `coord` binary, the npm tarball, the wheel and
//! `SHA256SUMS`. It runs `cargo`, `npm` and `python3`, which a machine that
//! builds the packages has.

mod dist;
mod prebuilt;
mod run;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// coord's release, from one command.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// What to make.
#[derive(Subcommand)]
enum Command {
    /// Build the components and write them to the crates' prebuilt/ folders.
    Prebuilt,
    /// Write the release folder.
    Dist {
        /// The folder to write (made if missing; files of the same names are replaced).
        #[arg(long, default_value = "target/dist")]
        out: PathBuf,
        /// The Cargo profile the `coord` binary is built with (`dev` reuses the tests' build).
        #[arg(long, default_value = "release")]
        profile: String,
    },
}

fn main() -> anyhow::Result<()> {
    let root = run::workspace_root()?;
    match Cli::parse().command {
        Command::Prebuilt => prebuilt::write(&root),
        Command::Dist { out, profile } => dist::write(&root, &root.join(out), &profile),
    }
}
