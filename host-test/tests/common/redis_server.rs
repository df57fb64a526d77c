//! Finding a Redis server for tests: `REDIS_URL`, else 127.0.0.1:6379, else a
//! `redis-server` spawned on a free port in a temporary directory and stopped
//! when dropped. A missing Redis fails the test; it never skips.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
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

/// A Redis URL to test against, and the server if this call started one.
pub async fn redis_url() -> (String, Option<RedisServer>) {
    if let Ok(url) = std::env::var("REDIS_URL") {
        assert!(answers(&url).await, "REDIS_URL={url} does not answer PING");
        return (url, None);
    }
    let local = "redis://127.0.0.1:6379";
    if answers(local).await {
        return (local.to_string(), None);
    }
    match RedisServer::spawn() {
        Ok(server) => (server.url(), Some(server)),
        Err(why) => panic!(
            "no Redis for the Redis suite: REDIS_URL is unset, 127.0.0.1:6379 does not answer, \
             and redis-server could not be started ({why}). Install redis-server or set REDIS_URL."
        ),
    }
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
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let dir = std::env::temp_dir().join(format!("coord-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
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
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))?;
        self.child = Some(child);
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if started.elapsed() > Duration::from_secs(10) {
                return Err("redis-server did not listen within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
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
