//! The one connection per backend that `LISTEN`s on the table's channel and
//! passes each announced change on to the waiters of this process.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{broadcast, mpsc};
use tokio_postgres::{AsyncMessage, NoTls};

/// Listen on `channel` for as long as the backend lives, connecting again
/// half a second after the connection is lost (waiters re-check on their
/// own meanwhile). Each notification's payload is `<revision>:<partition's
/// name in hex>`.
pub(super) async fn listen(
    pg: tokio_postgres::Config,
    channel: String,
    heard: broadcast::Sender<(String, u64)>,
) {
    loop {
        match pg.connect(NoTls).await {
            Ok((client, mut connection)) => {
                let (forward, mut received) = mpsc::unbounded_channel();
                // The connection is driven here: its notifications come out
                // of the same poll that moves the LISTEN statement along.
                let driving = tokio::spawn(async move {
                    let mut messages =
                        futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                    while let Some(Ok(message)) = messages.next().await {
                        if let AsyncMessage::Notification(n) = message
                            && forward.send(n.payload().to_string()).is_err()
                        {
                            break;
                        }
                    }
                });
                match client.batch_execute(&format!("LISTEN {channel}")).await {
                    Ok(()) => {
                        while let Some(payload) = received.recv().await {
                            if let Some((revision, partition)) = payload.split_once(':')
                                && let Ok(revision) = revision.parse()
                            {
                                // Compared with the waiter's partition as hex.
                                let _ = heard.send((partition.to_string(), revision));
                            }
                        }
                    }
                    Err(e) => tracing::debug!("LISTEN {channel} failed: {e}"),
                }
                driving.abort();
            }
            Err(e) => tracing::debug!("the listening connection failed: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
