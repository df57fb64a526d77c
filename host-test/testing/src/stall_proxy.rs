//! A TCP proxy that stalls a connection to Redis on demand.
#![allow(dead_code)] // not every suite uses it

use std::sync::Arc;
use std::time::Duration;

/// A TCP proxy on loopback that forwards to a Redis server and can hold all
/// traffic in both directions, as a stalled network or a paused server would.
pub struct StallProxy {
    /// The port it listens on.
    pub port: u16,
    stalled: Arc<std::sync::atomic::AtomicBool>,
}

impl StallProxy {
    /// Listen on a free port and forward to `upstream_port`.
    pub async fn start(upstream_port: u16) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stalled.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream_port)).await
                else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (mut from, mut to) in [
                    (
                        Box::new(cr) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
                        Box::new(sw) as Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
                    ),
                    (Box::new(sr), Box::new(cw)),
                ] {
                    let flag = flag.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match from.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            while flag.load(std::sync::atomic::Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            if to.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        StallProxy { port, stalled }
    }

    /// Hold all traffic (`true`) or let it flow again (`false`).
    pub fn stall(&self, on: bool) {
        self.stalled.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}
