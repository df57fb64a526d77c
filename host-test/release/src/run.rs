//! Running the tools a release needs, and where things are.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root: two folders above this crate.
pub fn workspace_root() -> anyhow::Result<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow::anyhow!("this crate is not two folders deep"))
}

/// Run `program` with `args` in `dir`, failing with the command's name.
pub fn run(dir: &Path, program: &str, args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new(program)
        .args(args)
        .current_dir(dir)
        .status()
        .map_err(|error| anyhow::anyhow!("cannot run {program}: {error}"))?;
    anyhow::ensure!(
        status.success(),
        "`{program} {}` in {} failed: {status}",
        args.join(" "),
        dir.display()
    );
    Ok(())
}

/// What `program` with `args` prints, trimmed.
pub fn output(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|error| anyhow::anyhow!("cannot run {program}: {error}"))?;
    anyhow::ensure!(
        out.status.success(),
        "`{program} {}` failed",
        args.join(" ")
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// `cargo`: the one running this, under `cargo run`.
pub fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}
