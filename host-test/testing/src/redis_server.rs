//! Finding a Redis server for tests: `REDIS_URL`, else 127.0.0.1:6379, else a
//! `redis-server` spawned on a free port in a temporary directory, one per
//! test process, stopped when the process exits. Tests that stop or restart
//! a server spawn a private [`RedisServer`], killed on drop. A missing Redis
//! fails the test; it never skips.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Whether a Redis server answers `PING` at `url`.
pub async fn answers(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let ping = async {
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .ok()
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), ping).await,
        Ok(Some(_))
    )
}

/// An environment variable's value, if it is set and not empty: an empty
/// variable is unset, as every tool treats it (`REDIS_URL=` once made 22
/// tests fail with "`REDIS_URL=` does not answer PING").
pub fn env_url(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .filter(|url| !url.trim().is_empty())
}

/// The Redis URL to test against: `REDIS_URL` (unless empty), else
/// 127.0.0.1:6379 if it answers, else one `redis-server` that this test
/// process starts on first use and every later call shares. Sharing
/// matters: a test that calls this twice (one backend that writes, one that
/// waits) must reach one server, not two.
pub async fn redis_url() -> String {
    if let Some(url) = env_url("REDIS_URL") {
        assert!(answers(&url).await, "REDIS_URL={url} does not answer PING");
        return url;
    }
    let local = "redis://127.0.0.1:6379";
    if answers(local).await {
        return local.to_string();
    }
    static SHARED: OnceLock<Result<String, String>> = OnceLock::new();
    match SHARED.get_or_init(spawn_for_this_process) {
        Ok(url) => url.clone(),
        Err(why) => panic!(
            "no Redis for the Redis suite: REDIS_URL is unset, 127.0.0.1:6379 does not answer, \
             and redis-server could not be started ({why}). Install redis-server or set REDIS_URL."
        ),
    }
}

/// Start the server [`redis_url`] shares, under a shell that kills it when
/// this process exits: the shell's standard input is a pipe this process
/// never closes, so it reads end-of-file only once the process is gone.
fn spawn_for_this_process() -> Result<String, String> {
    let (port, dir) = port_and_dir()?;
    let script = format!(
        "redis-server --bind 127.0.0.1 --port {port} --save '' --appendonly no --dir . \
         >/dev/null 2>&1 & server=$!; cat >/dev/null; kill $server; wait; cd /; rm -rf '{}'",
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
            .map(|status| format!("redis-server exited: {status}"))
    })?;
    // Kept open for the life of the process (a static is never dropped).
    std::mem::forget(shell.stdin.take());
    Ok(format!("redis://127.0.0.1:{port}"))
}

/// A free port on loopback and a fresh directory for a server on it.
pub(super) fn port_and_dir() -> Result<(u16, PathBuf), String> {
    let port = free_ports(1)?[0];
    Ok((port, dir_for(port)?))
}

/// `count` distinct free ports on loopback: each stays bound until all are
/// chosen, so the kernel cannot hand out one twice.
pub fn free_ports(count: usize) -> Result<Vec<u16>, String> {
    let listeners = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()).map_err(|e| e.to_string()))
        .collect()
}

/// A fresh directory for a server on `port`.
pub(super) fn dir_for(port: u16) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("coord-server-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    Ok(dir)
}

/// Wait until something listens on `port`, for up to 10 s, or until
/// `exited` reports why it never will.
pub(super) fn until_listening(
    port: u16,
    mut exited: impl FnMut() -> Option<String>,
) -> Result<(), String> {
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if started.elapsed() > Duration::from_secs(10) {
            return Err("the server did not listen within 10 s".into());
        }
        if let Some(why) = exited() {
            return Err(why);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// A `redis-server` this test started, with no persistence, killed on drop.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    tls: bool,
}

impl RedisServer {
    /// Start a server on a free port.
    pub fn spawn() -> Result<Self, String> {
        RedisServer::spawn_with(false)
    }

    /// Start a server that speaks only TLS, with a self-signed certificate
    /// made by `openssl` for this server alone.
    pub fn spawn_tls() -> Result<Self, String> {
        RedisServer::spawn_with(true)
    }

    fn spawn_with(tls: bool) -> Result<Self, String> {
        let (port, dir) = port_and_dir()?;
        if tls {
            let status = Command::new("openssl")
                .args([
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                ])
                .args([
                    "-subj",
                    "/CN=localhost",
                    "-keyout",
                    "key.pem",
                    "-out",
                    "cert.pem",
                ])
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map_err(|e| format!("openssl: {e}"))?;
            if !status.success() {
                return Err(format!("openssl could not make a certificate: {status}"));
            }
        }
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            tls,
        };
        server.start()?;
        Ok(server)
    }

    /// The URL it listens on (`rediss://…#insecure` for TLS: the certificate
    /// is self-signed).
    pub fn url(&self) -> String {
        if self.tls {
            format!("rediss://127.0.0.1:{}/#insecure", self.port)
        } else {
            format!("redis://127.0.0.1:{}", self.port)
        }
    }

    /// Start it again on the same port (after [`RedisServer::stop`]), empty.
    pub fn start(&mut self) -> Result<(), String> {
        let port = self.port.to_string();
        let mut listen = vec!["--bind", "127.0.0.1"];
        if self.tls {
            listen.extend([
                "--port",
                "0",
                "--tls-port",
                &port,
                "--tls-auth-clients",
                "no",
            ]);
            listen.extend(["--tls-cert-file", "cert.pem", "--tls-key-file", "key.pem"]);
            listen.extend(["--tls-ca-cert-file", "cert.pem"]);
        } else {
            listen.extend(["--port", &port]);
        }
        let child = Command::new("redis-server")
            .current_dir(&self.dir)
            .args(listen)
            .args(["--save", "", "--appendonly", "no", "--dir", "."])
            // `DEBUG SLEEP` stalls the server as outside testers did.
            .args(["--enable-debug-command", "local"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))?;
        self.child = Some(child);
        until_listening(self.port, || None)
    }

    /// Kill it; everything it held is lost (it persists nothing).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
