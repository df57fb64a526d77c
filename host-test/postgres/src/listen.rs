//! The one connection per backend that `LISTEN`s on the table's channel and
//! passes each announced change on to the waiters of this process, and
//! says whether it is listening, so waiters know when a notification may
//! have gone unheard.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_postgres::{AsyncMessage, NoTls};

/// How long the listener waits before connecting again, and how often a
/// waiter re-checks while nobody listens.
pub(super) const RETRY: Duration = Duration::from_millis(500);

/// Listen on `channel` for as long as the backend lives, connecting again
/// [`RETRY`] after the connection is lost. Each notification's payload is
/// `<revision>:<partition's name in hex>`.
///
/// `listening` is `Some(n)` from the moment the `n`th connection's `LISTEN`
/// took effect on the server until that connection is lost, `None` before
/// and between: a write that commits while it is `None` may notify nobody,
/// so waiters re-check at every change of it and every [`RETRY`] while it
/// is `None`.
pub(super) async fn listen(
    pg: tokio_postgres::Config,
    channel: String,
    heard: broadcast::Sender<(String, u64)>,
    listening: watch::Sender<Option<u64>>,
) {
    let mut connections = 0u64;
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
                        connections += 1;
                        listening.send_replace(Some(connections));
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
                listening.send_replace(None);
                driving.abort();
            }
            Err(e) => tracing::debug!("the listening connection failed: {e}"),
        }
        tokio::time::sleep(RETRY).await;
    }
}
