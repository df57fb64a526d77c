//! A TCP proxy that stalls a connection to a store on demand.
#![allow(dead_code)] // not every suite uses it

use std::sync::Arc;
use std::time::Duration;

/// A TCP proxy on loopback that forwards to a server (Redis, NATS) and can
/// hold all traffic in both directions, as a stalled network or a paused
/// server would.
pub struct StallProxy {
    /// The port it listens on.
    pub port: u16,
    stalled: Arc<std::sync::atomic::AtomicBool>,
    /// Bytes whose sending by a client stalls all traffic from then on.
    trigger: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
}

impl StallProxy {
    /// Listen on a free port and forward to `upstream_port`.
    pub async fn start(upstream_port: u16) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let trigger = Arc::new(std::sync::Mutex::new(None::<Vec<u8>>));
        let (flag, armed) = (stalled.clone(), trigger.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream_port)).await
                else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (mut from, mut to, upstream) in [
                    (
                        Box::new(cr) as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
                        Box::new(sw) as Box<dyn tokio::io::AsyncWrite + Unpin + Send>,
                        true,
                    ),
                    (Box::new(sr), Box::new(cw), false),
                ] {
                    let (flag, armed) = (flag.clone(), armed.clone());
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match from.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if upstream && let Some(pattern) = armed.lock().unwrap().as_deref() {
                                let sent = &buf[..n];
                                if sent.windows(pattern.len()).any(|w| w == pattern) {
                                    flag.store(true, std::sync::atomic::Ordering::SeqCst);
                                }
                            }
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
        StallProxy {
            port,
            stalled,
            trigger,
        }
    }

    /// Hold all traffic (`true`) or let it flow again (`false`).
    pub fn stall(&self, on: bool) {
        self.stalled.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Hold all traffic from the moment a client sends `pattern` (that
    /// send included), as a server that stalls on one kind of request.
    pub fn stall_when_sent(&self, pattern: &[u8]) {
        *self.trigger.lock().unwrap() = Some(pattern.to_vec());
    }
}
