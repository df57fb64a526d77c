//! `wait-then-put` on a connection of its own: `XREAD BLOCK` on the feed,
//! the put's `EVALSHA` behind it in the same write, and the pool of those
//! connections (on a cluster, to the node that serves the partition).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{
    AsyncConnectionConfig, Client, ErrorKind, PushInfo, PushKind, RedisError, ServerErrorKind,
    Value,
};

use coord_host::backend::{Condition, Outcome, StoreError, WriteReply};

use super::codec::{Inputs, Op, write_reply};
use super::link::{Link, Node, SlotTable, info_for, is_redirection, slot_of};
use super::{RedisBackend, malformed, one_string, unavailable};

impl RedisBackend {
    /// `wait-then-put` on a connection of its own: `XREAD BLOCK` on the
    /// feed, the put's `EVALSHA` behind it in the same write. `None` when
    /// this call should wait and put apart instead: every blocking
    /// connection is in use, none could be opened, Redis refused the
    /// `XREAD` (and the put it then ran at once did not apply), or, on a
    /// cluster, the partition's node is not known or no longer serves it
    /// (the shared cluster connection then follows the redirection).
    ///
    /// The host ends the block itself at the timeout, with `CLIENT UNBLOCK`
    /// from the main connection: Redis times blocked commands out only at
    /// its cron tick (every 100 ms at the default `hz`), so its own timeout,
    /// a response timeout later, is only the backstop.
    #[allow(clippy::too_many_arguments)] // the WIT function's parameters, one for one
    pub(super) async fn blocking_wait_then_put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<i64>,
        condition: &Condition,
        after: u64,
        timeout_ms: u64,
    ) -> Option<Result<WriteReply, StoreError>> {
        let slot = BlockingSlot::take(self)?;
        let node = self.node_of(partition).await?;
        // A connection that cannot be opened (a client limit, say, or a
        // node that died: the slots are read again next time) leaves the
        // shared connections, which may still serve.
        let Ok(mut conn) = slot.connection(&node).await else {
            self.forget_slots();
            return None;
        };
        let inputs = Inputs {
            key,
            value: Some(value),
            ttl_ms,
            condition: Some(condition),
            ..Inputs::default()
        };
        let sent = inputs.sent();
        let unblock = !self.unblock_refused.load(Ordering::Relaxed);
        let backstop = if unblock {
            u64::try_from(self.config.response_timeout.as_millis()).unwrap_or(u64::MAX)
        } else {
            0
        };
        let limit = Duration::from_millis(timeout_ms.saturating_add(backstop))
            .saturating_add(self.config.response_timeout);
        let put = self.write_script(
            partition,
            Op::Put,
            &inputs,
            std::time::Instant::now() + limit,
        );
        let mut pipe = ::redis::pipe();
        // A partition kept as one string has no feed, only a wake-up stream
        // that its writes fill while somebody waits: `arm` says so first (and
        // leaves a wake-up at once for a change already made after `after`).
        let unwatched = one_string(partition);
        let stream = if unwatched {
            let inputs = Inputs {
                after,
                ..Inputs::default()
            };
            pipe.add_command(self.script(partition, Op::Arm, &inputs));
            self.key(partition, "n")
        } else {
            self.key(partition, "f")
        };
        // Entries of the stream after `after` (its ids are "<revision>-0"):
        // the first one there is, or the first one appended while blocked.
        // One is enough to end the wait.
        pipe.cmd("XREAD")
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(timeout_ms.saturating_add(backstop))
            .arg("STREAMS")
            .arg(stream)
            .arg(format!("{after}-0"))
            .add_command(put.clone());
        let durable = self.replica_acks() > 0;
        if durable {
            pipe.add_command(self.wait_command());
        }
        pipe.ignore_errors();
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let (blocked_at, blocked_id) = (conn.node.clone(), conn.id);
        let exchange = async {
            let replies = pipe.query_async::<Vec<Value>>(&mut conn.conn);
            tokio::pin!(replies);
            if unblock {
                tokio::select! {
                    replies = &mut replies => return replies,
                    _ = tokio::time::sleep(Duration::from_millis(timeout_ms)) => {}
                }
                // Nothing blocked yet means the XREAD has not reached Redis
                // (a timeout of a millisecond, a busy host) or was answered
                // just now: ask again until it is ended or its reply is here.
                while let Some(false) = self.unblock(&blocked_at, blocked_id).await {
                    tokio::select! {
                        replies = &mut replies => return replies,
                        _ = tokio::time::sleep(Duration::from_millis(1)) => {}
                    }
                }
            }
            replies.await
        };
        let replies = match tokio::time::timeout(limit, exchange).await {
            Ok(Ok(replies)) => replies,
            Ok(Err(e)) => return Some(Err(unavailable(e))),
            Err(_) => {
                return Some(Err(StoreError::Unavailable(format!(
                    "redis: no reply to a wait-then-put within {} ms",
                    limit.as_millis()
                ))));
            }
        };
        let mut replies = replies.into_iter();
        if unwatched {
            // `arm`'s reply. Refused (NOSCRIPT after a restart), the XREAD
            // still ended at its timeout at the latest.
            replies.next();
        }
        let (Some(read), Some(reply)) = (replies.next(), replies.next()) else {
            return Some(Err(malformed("a wait-then-put without both replies")));
        };
        let acks = replies.next();
        slot.keep(conn);
        let moved = |value: &Value| match value {
            Value::ServerError(e) => is_redirection(&RedisError::from(e.clone())),
            _ => false,
        };
        let applied = |reply: &Value| {
            reply
                .clone()
                .extract_error()
                .ok()
                .and_then(|reply| write_reply(reply, key, sent).ok())
                .is_some_and(|reply| matches!(reply.outcome, Outcome::Applied(_)))
        };
        if moved(&read) || moved(&reply) {
            // The partition's slot moved (a failover, a resharding): forget
            // where slots live and let the cluster connection find it.
            self.forget_slots();
            if moved(&reply) || !applied(&reply) {
                // The put was not run, or ran without the wait (the XREAD
                // was redirected) and did not apply: wait and put apart.
                return None;
            }
        }
        let reply = match reply.extract_error() {
            Ok(reply) if durable => match acks.as_ref().map(|acks| self.check_acks(acks)) {
                Some(Ok(())) => write_reply(reply, key, sent),
                Some(Err(e)) => Err(e),
                None => Err(malformed("a wait-then-put without its WAIT")),
            },
            Ok(reply) => write_reply(reply, key, sent),
            // A restarted or flushed server forgot the script: the wait is
            // over, so load it and put again, once.
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                match self.run_write(&put, &self.store_scripts()).await {
                    Ok(reply) => write_reply(reply, key, sent),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(unavailable(e)),
        };
        if let Value::ServerError(refusal) = &read
            && !moved(&read)
        {
            // Redis refused the XREAD, so the put ran without a wait. Keep
            // what it wrote; otherwise wait and put apart. A refusal that is
            // a setting (an ACL, a command renamed away) holds from now on;
            // a moment's (loading, busy) only for this call.
            let setting = refusal.code() == "NOPERM"
                || refusal
                    .details()
                    .is_some_and(|d| d.contains("unknown command"));
            if setting {
                self.blocking_refused.store(true, Ordering::Relaxed);
            }
            if !matches!(
                &reply,
                Ok(WriteReply {
                    outcome: Outcome::Applied(_),
                    ..
                })
            ) {
                return None;
            }
        }
        Some(reply)
    }

    /// End the block of connection `id` as if it had timed out, so that its
    /// queued put runs now: whether a blocked command was ended, or `None`
    /// when Redis could not be asked or refused. If it refused (`CLIENT
    /// UNBLOCK` is an admin command an ACL may deny), later blocks end at
    /// Redis's own timeout.
    pub(super) async fn unblock(&self, node: &Node, id: i64) -> Option<bool> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let mut unblock = ::redis::cmd("CLIENT");
        unblock.arg("UNBLOCK").arg(id).arg("TIMEOUT");
        let unblocked = self.conn.to_node(node, &unblock).await;
        match unblocked {
            Ok(Value::Int(1)) => {
                self.unblocked.fetch_add(1, Ordering::Relaxed);
                Some(true)
            }
            Ok(Value::Int(_)) => Some(false),
            Ok(_) => None,
            Err(e) => {
                // Only a refusal by Redis is a setting; a lost or missing
                // connection (a node reconnecting) is a moment.
                if matches!(e.kind(), ErrorKind::Server(_)) && !is_redirection(&e) {
                    self.unblock_refused.store(true, Ordering::Relaxed);
                }
                None
            }
        }
    }
}

impl RedisBackend {
    /// Forget where the cluster's slots live: the next blocking call reads
    /// `CLUSTER SLOTS` again.
    fn forget_slots(&self) {
        if let Ok(mut slots) = self.slots.lock() {
            *slots = None;
        }
    }

    /// Where `partition` is served: the server, or on a cluster the master
    /// of its slot as `CLUSTER SLOTS` said (asked once, and again after a
    /// redirection). `None` when the cluster cannot say now.
    async fn node_of(&self, partition: &str) -> Option<Node> {
        if let Link::Single(_) = self.conn {
            return Some(Node::Server);
        }
        let known = self.slots.lock().ok()?.clone();
        let table = match known {
            Some(table) => table,
            None => {
                self.round_trips.fetch_add(1, Ordering::Relaxed);
                let mut conn = self.conn.clone();
                let reply = ::redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<Value>(&mut conn)
                    .await
                    .ok()?;
                let table = Arc::new(SlotTable::parse(&reply)?);
                *self.slots.lock().ok()? = Some(table.clone());
                table
            }
        };
        let node = table.node(slot_of(&self.key(partition, "s")));
        if node.is_none() {
            // Unknown here (the table was read mid-change): read it again next time.
            self.forget_slots();
        }
        node
    }
}

/// A connection `wait-then-put` blocks on, and whether it is known closed.
pub(super) struct BlockingConnection {
    pub(super) conn: MultiplexedConnection,
    /// The node it is connected to.
    pub(super) node: Node,
    /// Its `CLIENT ID`, for `CLIENT UNBLOCK`.
    pub(super) id: i64,
    /// Set when the connection reports its disconnection.
    pub(super) closed: Arc<AtomicBool>,
}

/// One `wait-then-put` blocking on a connection of its own; gives its place
/// back when dropped, however the call ended.
pub(super) struct BlockingSlot<'a> {
    pub(super) backend: &'a RedisBackend,
}

impl<'a> BlockingSlot<'a> {
    /// A place among the blocking calls, if one is free.
    pub(super) fn take(backend: &'a RedisBackend) -> Option<Self> {
        let max = backend.config.blocking_connections;
        backend
            .blocking
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(BlockingSlot { backend })
    }

    /// An idle blocking connection that is still open, or a new one. Idle
    /// ones the server closed meanwhile (a restart, an idle timeout, a
    /// `CLIENT KILL`) are dropped here, before anything is sent on them.
    /// Replies have no timeout of their own: the call bounds the exchange.
    pub(super) async fn connection(&self, node: &Node) -> Result<BlockingConnection, StoreError> {
        if let Ok(mut idle) = self.backend.idle_blocking.lock() {
            idle.retain(|conn| !conn.closed.load(Ordering::Acquire));
            if let Some(at) = idle.iter().rposition(|conn| conn.node == *node) {
                return Ok(idle.swap_remove(at));
            }
        }
        let closed = Arc::new(AtomicBool::new(false));
        let flag = closed.clone();
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(self.backend.config.response_timeout))
            .set_push_sender(move |push: PushInfo| {
                if push.kind == PushKind::Disconnection {
                    flag.store(true, Ordering::Release);
                }
                Ok::<(), std::convert::Infallible>(())
            });
        let client =
            Client::open(info_for(&self.backend.blocking_info, node)).map_err(unavailable)?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(unavailable)?;
        let id = tokio::time::timeout(
            self.backend.config.response_timeout,
            ::redis::cmd("CLIENT")
                .arg("ID")
                .query_async::<i64>(&mut conn),
        )
        .await
        .map_err(|_| StoreError::Unavailable("redis: no reply to CLIENT ID".into()))?
        .map_err(unavailable)?;
        self.backend.blocking_opened.fetch_add(1, Ordering::Relaxed);
        Ok(BlockingConnection {
            conn,
            node: node.clone(),
            id,
            closed,
        })
    }

    /// Keep `conn` for the next call: only a connection whose exchange ended
    /// cleanly, never one a cancelled or failed call may have left blocked.
    pub(super) fn keep(&self, conn: BlockingConnection) {
        if let Ok(mut idle) = self.backend.idle_blocking.lock() {
            idle.push(conn);
        }
    }
}

impl Drop for BlockingSlot<'_> {
    fn drop(&mut self) {
        self.backend.blocking.fetch_sub(1, Ordering::AcqRel);
    }
}
