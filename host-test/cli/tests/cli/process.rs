//! A `coord serve` process for the tests that drive it over real HTTP.
#![allow(dead_code)] // not every suite uses every helper

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::Value;
use wasmtime_wasi_http::io::TokioIo;

/// A `coord serve` process, killed when dropped.
pub struct Serve {
    child: Child,
    /// Where it listens, `127.0.0.1:PORT`.
    pub address: String,
}

impl Serve {
    /// Start `coord serve ARGS --listen 127.0.0.1:0` and wait until it listens.
    pub fn start(args: &[&str]) -> Serve {
        Serve::spawn(args, None)
    }

    /// [`Serve::start`], its log (standard error, at `info`) written to `log`.
    pub fn start_logging_to(args: &[&str], log: &std::path::Path) -> Serve {
        Serve::spawn(args, Some(log))
    }

    fn spawn(args: &[&str], log: Option<&std::path::Path>) -> Serve {
        let mut command = Command::new(env!("CARGO_BIN_EXE_coord"));
        command
            .arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped());
        match log {
            Some(log) => {
                command
                    .env("COORD_LOG", "info")
                    .stderr(std::fs::File::create(log).unwrap());
            }
            // One log line per request would bury the test's own output.
            None => {
                command.env("COORD_LOG", "warn");
            }
        }
        let mut child = command.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        let address = first
            .strip_prefix("coord serve: listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line: {first}"))
            .to_string();
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Serve { child, address }
    }

    /// Send one request on a fresh connection; returns status, headers, JSON.
    pub async fn call(&self, method: &str, path: &str, user: Option<&str>, body: &str) -> Reply {
        let user: Vec<(&str, &str)> = user.map(|u| ("x-user-id", u)).into_iter().collect();
        self.call_with(method, path, &user, body).await
    }

    /// [`Serve::call`] with the given request headers.
    pub async fn call_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        let stream = tokio::net::TcpStream::connect(&self.address).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.address);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let response = coord_testing::bounded(sender.send_request(request))
            .await
            .unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let json = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {bytes:?}"));
        Reply {
            status,
            headers,
            json,
        }
    }
}

impl Serve {
    /// Send the process SIGTERM, as an orchestrator stopping it would.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM failed");
    }

    /// Kill the process with SIGKILL, as the kernel's OOM killer or a lost
    /// machine would: nothing of it runs afterwards, no cleanup included.
    /// Returns once it is gone.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Wait for the process to exit; its exit status.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A reply: its status, headers and JSON body.
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The headers.
    pub headers: hyper::HeaderMap,
    /// The body, parsed.
    pub json: Value,
}

impl Reply {
    /// A header's value, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}
