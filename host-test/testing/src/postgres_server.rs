//! Finding a PostgreSQL server for tests: `POSTGRES_URL`, else the server
//! on 127.0.0.1:5432 (user `postgres`, trust authentication, as these
//! machines run one), else one this test process starts from the
//! installed binaries (`initdb` into a temporary directory, then
//! `postgres` on a free port, stopped and removed when the process exits).
//! A missing server fails the test, naming what it tried; it never skips.

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

/// The directory holding `initdb` and `postgres`: on `PATH`, else the
/// newest of Debian's `/usr/lib/postgresql/<version>/bin`.
fn server_binaries() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).find(|dir| dir.join("initdb").is_file()));
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

/// Start `postgres` on a free port from a fresh `initdb` in a temporary
/// directory, kept until this process exits (its shell waits on a stdin
/// that closes then). The server refuses to run as root: as root, it runs
/// as the `postgres` user the package made.
fn spawn_for_this_process() -> Result<String, String> {
    let bin = server_binaries().ok_or("no initdb on PATH or in /usr/lib/postgresql/*/bin")?;
    let (port, dir) = port_and_dir()?;
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
    let as_user = if root {
        let owned = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(&dir)
            .status()
            .map_err(|e| format!("chown: {e}"))?;
        if !owned.success() {
            return Err("running as root, and no postgres user to run the server as".into());
        }
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

/// Drop a test's table and its sequence (best effort), on a thread of its
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
                .batch_execute(&format!(
                    "DROP TABLE IF EXISTS {table}; DROP SEQUENCE IF EXISTS {table}_versions;"
                ))
                .await;
            driving.abort();
        });
    });
    let _ = dropping.join();
}
