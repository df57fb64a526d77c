//! `wait` without a connection per waiter: the local waiters of each
//! partition's channel, one subscriber connection, and the re-check that
//! bounds a lost notification.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, oneshot, watch};

use coord_host::backend::StoreError;

use super::codec::{Inputs, Op, Reader};
use super::link::Link;
use super::{RedisBackend, malformed};

/// Local waiters on one partition's channel.
pub(super) struct Waiting {
    /// Waiters registered (subscribed or subscribing).
    pub(super) count: usize,
    /// Waiters asleep after a check that found nothing new.
    pub(super) sleeping: usize,
    /// The highest revision published on the channel since the first waiter came.
    pub(super) notify: watch::Sender<u64>,
}

pub(super) type Waiters = Arc<Mutex<HashMap<String, Waiting>>>;

/// What the subscriber task is asked to do.
pub(super) enum Subscription {
    /// Make the channel's subscription match its waiters, then answer.
    Sync(String, oneshot::Sender<()>),
    /// The server ended the channel's subscription (on a cluster, its slot
    /// moved to another node): subscribe again, at the slot's new node, if
    /// it still has waiters.
    Dropped(String),
    /// A subscriber connection was lost (on a cluster, a node died): every
    /// channel is subscribed again, at its slot's current node.
    Disconnected,
}

/// How often the subscriber task retries channels that have waiters but
/// no subscription (one that could not be made during a failover, say).
const RESUBSCRIBE_EVERY: Duration = Duration::from_secs(1);

impl RedisBackend {
    /// `(now, revision, next expiry)` of a partition, after sweeping it; the
    /// next expiry may be early (a lower bound), never late.
    pub(super) async fn check(
        &self,
        partition: &str,
    ) -> Result<(u64, u64, Option<u64>), StoreError> {
        let _turn = self.turn().await;
        let reply = self
            .run(&self.script(partition, Op::Check, &Inputs::default()))
            .await?;
        let mut r = Reader::new(&reply);
        Ok((r.u64()?, r.u64()?, r.optional_u64()?))
    }

    /// Register a waiter on `channel` and make sure it is subscribed before
    /// the waiter's first check, so no notification after it is missed.
    pub(super) async fn register(&self, channel: &str) -> Result<WaiterGuard<'_>, StoreError> {
        let notify = {
            let mut waiters = self
                .waiters
                .lock()
                .map_err(|_| malformed("poisoned waiter map"))?;
            let w = waiters
                .entry(channel.to_string())
                .or_insert_with(|| Waiting {
                    count: 0,
                    sleeping: 0,
                    notify: watch::Sender::new(0),
                });
            w.count += 1;
            w.notify.subscribe()
        };
        let guard = WaiterGuard {
            backend: self,
            channel: channel.to_string(),
            notify,
        };
        let (ack, acked) = oneshot::channel();
        let sync = Subscription::Sync(channel.to_string(), ack);
        if self.subscriptions.send(sync).is_ok() {
            // If the subscription cannot be made, the re-check still bounds
            // the wait; and a waiter does not queue behind other channels'
            // subscriptions for longer than a call may take (during a
            // failover each can take that long).
            let _ = tokio::time::timeout(self.config.response_timeout, acked).await;
        }
        Ok(guard)
    }
}

/// Deregisters a waiter when its `wait` ends, however it ends.
pub(super) struct WaiterGuard<'a> {
    pub(super) backend: &'a RedisBackend,
    pub(super) channel: String,
    pub(super) notify: watch::Receiver<u64>,
}

impl WaiterGuard<'_> {
    /// Count this waiter as asleep (see [`RedisBackend::waiters`]) until the
    /// returned value drops.
    pub(super) fn asleep(&self) -> Asleep<'_> {
        self.adjust_sleeping(true);
        Asleep(self)
    }

    pub(super) fn adjust_sleeping(&self, asleep: bool) {
        if let Ok(mut waiters) = self.backend.waiters.lock()
            && let Some(w) = waiters.get_mut(&self.channel)
        {
            w.sleeping = if asleep {
                w.sleeping + 1
            } else {
                w.sleeping.saturating_sub(1)
            };
        }
    }
}

/// A waiter counted as asleep.
pub(super) struct Asleep<'a>(&'a WaiterGuard<'a>);

impl Drop for Asleep<'_> {
    fn drop(&mut self) {
        self.0.adjust_sleeping(false);
    }
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut waiters) = self.backend.waiters.lock()
            && let Some(w) = waiters.get_mut(&self.channel)
        {
            w.count = w.count.saturating_sub(1);
        }
        let (ack, _) = oneshot::channel();
        let sync = Subscription::Sync(self.channel.clone(), ack);
        let _ = self.backend.subscriptions.send(sync);
    }
}

/// Wake the local waiters of the channel a change was published on, or
/// report a subscription the server ended. Called by the subscriber
/// connection for each push it reads; never blocks.
pub(super) fn dispatch_notification(
    push: &PushInfo,
    waiters: &Waiters,
    subscriptions: &mpsc::UnboundedSender<Subscription>,
) {
    if push.kind == PushKind::Disconnection {
        let _ = subscriptions.send(Subscription::Disconnected);
        return;
    }
    if push.kind == PushKind::SUnsubscribe
        && let Some(Value::BulkString(channel)) = push.data.first()
        && let Ok(channel) = std::str::from_utf8(channel)
    {
        // Also the confirmation of our own SUNSUBSCRIBE: the task then
        // finds no waiters and leaves it.
        let _ = subscriptions.send(Subscription::Dropped(channel.to_string()));
        return;
    }
    // Sharded messages (`SSUBSCRIBE`, on a cluster) or plain ones.
    if !matches!(push.kind, PushKind::Message | PushKind::SMessage) {
        return;
    }
    let Some(Value::BulkString(channel)) = push.data.first() else {
        return;
    };
    let Ok(channel) = std::str::from_utf8(channel) else {
        return;
    };
    // The payload is the change's revision; anything else still wakes the
    // waiters, who then check the partition themselves.
    let revision: Option<u64> = match push.data.get(1) {
        Some(Value::BulkString(payload)) => std::str::from_utf8(payload)
            .ok()
            .and_then(|p| p.parse().ok()),
        _ => None,
    };
    if let Ok(waiters) = waiters.lock()
        && let Some(w) = waiters.get(channel)
    {
        w.notify
            .send_modify(|latest| *latest = revision.map_or(*latest, |r| r.max(*latest)));
    }
}

/// Bring the subscriptions in line with the waiters, one channel at a time,
/// in request order, so a subscribe and an unsubscribe never cross; every
/// [`RESUBSCRIBE_EVERY`], subscribe the channels with waiters that have
/// none (a subscription that failed or that the server ended).
pub(super) async fn manage_subscriptions(
    mut requests: mpsc::UnboundedReceiver<Subscription>,
    mut push: Link,
    waiters: Waiters,
) {
    let mut subscribed = HashSet::new();
    let mut retry = tokio::time::interval(RESUBSCRIBE_EVERY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (channel, ack) = tokio::select! {
            request = requests.recv() => match request {
                Some(Subscription::Sync(channel, ack)) => (channel, Some(ack)),
                Some(Subscription::Dropped(channel)) => {
                    subscribed.remove(&channel);
                    (channel, None)
                }
                Some(Subscription::Disconnected) => {
                    // The next retry subscribes them again.
                    subscribed.clear();
                    continue;
                }
                None => return,
            },
            _ = retry.tick() => {
                let missing: Vec<String> = waiters.lock().map_or_else(
                    |_| Vec::new(),
                    |w| {
                        w.iter()
                            .filter(|(c, w)| w.count > 0 && !subscribed.contains(*c))
                            .map(|(c, _)| c.clone())
                            .collect()
                    },
                );
                for channel in missing {
                    if push.subscribe(&channel).await.is_err() {
                        // Mid-failover, likely: try the rest at the next
                        // tick rather than hold waiters' requests meanwhile.
                        break;
                    }
                    subscribed.insert(channel);
                }
                continue;
            }
        };
        let wanted = waiters.lock().is_ok_and(|mut w| {
            let wanted = w.get(&channel).is_some_and(|w| w.count > 0);
            if !wanted {
                w.remove(&channel);
            }
            wanted
        });
        if wanted && !subscribed.contains(&channel) {
            if push.subscribe(&channel).await.is_ok() {
                subscribed.insert(channel);
            }
        } else if !wanted && subscribed.remove(&channel) {
            let _ = push.unsubscribe(&channel).await;
        }
        if let Some(ack) = ack {
            let _ = ack.send(());
        }
    }
}
