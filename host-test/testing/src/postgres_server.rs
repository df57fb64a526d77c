//! Finding a PostgreSQL server for tests: `POSTGRES_URL`, else the server
//! on 127.0.0.1:5432 (user `postgres`, trust authentication, as these
//! machines run one), else one this test process starts from the
//! installed binaries (`initdb` into a temporary directory, then
//! `postgres` on a free port, stopped and removed when the process exits).
//! A missing server fails the test, naming what it tried; it never skips.
//! [`PrivateServer`] is a server of one test's own, to stop and restart.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

use crate::redis_server::{env_url, port_and_dir};

/// The URL tried when `POSTGRES_URL` is unset.
const LOCAL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Whether a PostgreSQL server answers `SELECT 1` at `url`.
async fn answers(url: &str) -> bool {
    let query = async {
        let (client, connection) = tokio_postgres::connect(url, NoTls).await.ok()?;
        let driving = tokio::spawn(connection);
        let answered = client.simple_query("SELECT 1").await.ok();
        driving.abort();
        answered
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(5), query).await,
        Ok(Some(_))
    )
}

/// The PostgreSQL URL to test against: `POSTGRES_URL` (unless empty), else
/// 127.0.0.1:5432 as `postgres`, else one server this test process starts
/// on first use and every later call shares.
pub async fn postgres_url() -> String {
    if let Some(url) = env_url("POSTGRES_URL") {
        assert!(
            answers(&url).await,
            "POSTGRES_URL={url} does not answer SELECT 1"
        );
        return url;
    }
    if answers(LOCAL).await {
        return LOCAL.to_string();
    }
    static SHARED: OnceLock<Result<String, String>> = OnceLock::new();
    let url = match SHARED.get_or_init(spawn_for_this_process) {
        Ok(url) => url.clone(),
        Err(why) => panic!(
            "no PostgreSQL for the PostgreSQL suites: POSTGRES_URL is unset, {LOCAL} does not \
             answer, and a server could not be started ({why}). Install PostgreSQL \
             (apt-get install postgresql) or set POSTGRES_URL."
        ),
    };
    // It listens before it takes queries: wait for the first answer.
    let started = Instant::now();
    while !answers(&url).await {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the PostgreSQL server this process started at {url} does not answer SELECT 1"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    url
}

/// The directory holding `initdb`, `postgres` and the other server
/// programs: `initdb`'s on `PATH` (links followed), else the newest of
/// Debian's `/usr/lib/postgresql/<version>/bin`.
fn server_binaries() -> Option<PathBuf> {
    // Where a link on PATH points (the server's own directory also holds
    // pg_ctl and pg_basebackup, which PATH may not).
    let on_path = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).find(|dir| dir.join("initdb").is_file()))
        .and_then(|dir| dir.join("initdb").canonicalize().ok())
        .and_then(|initdb| initdb.parent().map(PathBuf::from));
    on_path.or_else(|| {
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let version = entry.file_name().to_str()?.parse().ok()?;
                let bin = entry.path().join("bin");
                bin.join("initdb").is_file().then_some((version, bin))
            })
            .collect();
        versions.sort();
        versions.pop().map(|(_, bin)| bin)
    })
}

/// Whether the server must run as the `postgres` user (this process is
/// root, which the server refuses), having given it `dir` if so.
fn hand_to_server_user(dir: &std::path::Path) -> Result<bool, String> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
    if root {
        let owned = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(dir)
            .status()
            .map_err(|e| format!("chown: {e}"))?;
        if !owned.success() {
            return Err("running as root, and no postgres user to run the server as".into());
        }
    }
    Ok(root)
}

/// Start `postgres` on a free port from a fresh `initdb` in a temporary
/// directory, kept until this process exits (its shell waits on a stdin
/// that closes then). The server refuses to run as root: as root, it runs
/// as the `postgres` user the package made.
fn spawn_for_this_process() -> Result<String, String> {
    let bin = server_binaries().ok_or("no initdb on PATH or in /usr/lib/postgresql/*/bin")?;
    let (port, dir) = port_and_dir()?;
    let as_user = if hand_to_server_user(&dir)? {
        "runuser -u postgres -- "
    } else {
        ""
    };
    let script = format!(
        "{as_user}'{bin}/initdb' -D data -U postgres --auth=trust -E UTF8 --no-sync \
           >initdb.log 2>&1 || exit 1; \
         {as_user}'{bin}/postgres' -D data -p {port} -k '{dir}' \
           -c listen_addresses=127.0.0.1 -c fsync=off >server.log 2>&1 & server=$!; \
         cat >/dev/null; kill $server; wait; cd /; rm -rf '{dir}'",
        bin = bin.display(),
        dir = dir.display()
    );
    let mut shell = Command::new("sh")
        .args(["-c", &script])
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("sh: {e}"))?;
    // initdb takes seconds, more on a busy machine: wait while the shell
    // lives, and fail once it has exited (or after five minutes, a hang).
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if started.elapsed() > Duration::from_secs(300) {
            return Err(format!(
                "nothing listened on port {port} within five minutes"
            ));
        }
        if let Ok(Some(status)) = shell.try_wait() {
            let log = std::fs::read_to_string(dir.join("initdb.log")).unwrap_or_default();
            let server = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
            return Err(format!(
                "initdb or postgres exited ({status}): {log}{server}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Kept open for the life of the process (a static is never dropped).
    std::mem::forget(shell.stdin.take());
    Ok(format!("postgres://postgres@127.0.0.1:{port}/postgres"))
}

/// Drop a test's table, its settings and its sequence (best effort), on a thread of its
/// own: a drop cannot await, and may run inside the test's runtime.
pub fn drop_table(url: String, table: String) {
    let dropping = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async {
            let Ok((client, connection)) = tokio_postgres::connect(&url, NoTls).await else {
                return;
            };
            let driving = tokio::spawn(connection);
            let _ = client
                .batch_execute(&coord_postgres::drop_statements(&table))
                .await;
            driving.abort();
        });
    });
    let _ = dropping.join();
}

/// A PostgreSQL server of one test's own, which it may stop (cleanly or as
/// a crash) and start again on the same data and port: `initdb` into a
/// temporary directory, then `pg_ctl`. Stopped and removed when dropped.
pub struct PrivateServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// `runuser -u postgres --` when running as root (the server refuses
    /// root), else nothing.
    as_user: Vec<String>,
}

/// How a [`PrivateServer`] stops.
#[derive(Clone, Copy, Debug)]
pub enum Stop {
    /// `pg_ctl stop -m fast`: sessions ended, a checkpoint, a clean exit.
    Fast,
    /// `pg_ctl stop -m immediate`: every process killed, as in a crash;
    /// the next start replays the write-ahead log.
    Immediate,
}

impl PrivateServer {
    /// `initdb` and start a server. Blocking: seconds, more on a busy
    /// machine.
    pub fn start() -> Result<Self, String> {
        let server = Self::unstarted()?;
        server.run(
            "initdb",
            &[
                "-D",
                "data",
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )?;
        server.resume()?;
        Ok(server)
    }

    /// A streaming standby of `primary` (`pg_basebackup -R`, asynchronous
    /// unless the primary names it synchronous), started. Blocking.
    pub fn standby_of(primary: &PrivateServer) -> Result<Self, String> {
        let server = Self::unstarted()?;
        let port = primary.port.to_string();
        server.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                "data",
                "-R",
                "-X",
                "stream",
                "--no-sync",
            ],
        )?;
        server.resume()?;
        Ok(server)
    }

    /// Promote this standby to a primary, waiting until it takes writes.
    /// Blocking.
    pub fn promote(&self) -> Result<(), String> {
        self.run("pg_ctl", &["-D", "data", "-w", "promote"])
    }

    /// A port and a directory (owned by the server's user), nothing in it.
    fn unstarted() -> Result<Self, String> {
        let bin = server_binaries().ok_or("no initdb on PATH or in /usr/lib/postgresql/*/bin")?;
        let (port, dir) = port_and_dir()?;
        let as_user = if hand_to_server_user(&dir)? {
            ["runuser", "-u", "postgres", "--"]
                .map(String::from)
                .to_vec()
        } else {
            Vec::new()
        };
        Ok(PrivateServer {
            bin,
            dir,
            port,
            as_user,
        })
    }

    /// The URL of the server (while it runs).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stop the server, waiting until it has. Blocking.
    pub fn stop(&self, how: Stop) -> Result<(), String> {
        let mode = match how {
            Stop::Fast => "fast",
            Stop::Immediate => "immediate",
        };
        self.run("pg_ctl", &["-D", "data", "-m", mode, "-w", "stop"])
    }

    /// Start the stopped server on the same data and port, waiting until
    /// it takes connections. Blocking.
    pub fn resume(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        self.run(
            "pg_ctl",
            &[
                "-D",
                "data",
                "-l",
                "server.log",
                "-o",
                &options,
                "-t",
                "300",
                "-w",
                "start",
            ],
        )
    }

    /// Run the server's `program` with `args` in its directory, as the
    /// server's user; its output is the error when it fails.
    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let path = self.bin.join(program);
        let mut command = match self.as_user.split_first() {
            Some((runuser, rest)) => {
                let mut c = Command::new(runuser);
                c.args(rest).arg(&path);
                c
            }
            None => Command::new(&path),
        };
        let out = command
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        Err(format!(
            "{program} {args:?} failed ({}): {}{}\n{log}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        let _ = self.stop(Stop::Immediate);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
