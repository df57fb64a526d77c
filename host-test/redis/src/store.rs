//! The store contract's operations on Redis: each one `EVALSHA` of the
//! store script (or `TIME`), `wait-then-put` a blocking `XREAD` with the
//! put behind it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ::redis::Value;
use async_trait::async_trait;
use coord_component::keys::is_unwatched;

use coord_host::backend::{
    Backend, ChangesReply, Condition, ListReply, MeterMode, MeterReply, MeterRequest, Millis,
    ReadReply, StoreError, WriteReply, no_feed,
};
use coord_host::clock::Clock;

use super::codec::{Inputs, Op, Reader, listing, meter_reply, packed_meter, page, ttl_arg};
use super::{METER_SCRIPT, RedisBackend, malformed, one_string, unavailable};

#[async_trait]
impl Backend for RedisBackend {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn now(&self) -> Result<Millis, StoreError> {
        if let Some(clock) = &self.config.test_clock {
            return Ok(clock.now_ms());
        }
        let mut conn = self.conn.clone();
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let (secs, micros): (u64, u64) = ::redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let now = secs * 1000 + micros / 1000;
        if !self.config.cluster {
            self.server_clock.heard(0, now);
        }
        Ok(now)
    }

    /// A write, as every write is sent: `SET <prefix>:ready` (10 s TTL),
    /// behind `WAIT` when replicas must acknowledge writes. A server that
    /// tells the time but refuses writes is not ready: one made a replica
    /// (`READONLY`), out of memory under `noeviction` (`OOM`), refusing
    /// writes after a failed save (`MISCONF`), or whose replicas do not
    /// acknowledge. A cluster, first: a node says `cluster_state:ok`, so
    /// every slot is served (with a master and its replicas down, the
    /// other masters still tell the time while that master's partitions
    /// take no write); the write then reaches the probe key's master.
    async fn ready(&self) -> Result<(), StoreError> {
        if self.config.cluster {
            self.every_slot_served().await?;
        }
        let mut probe = ::redis::cmd("SET");
        probe
            .arg(format!("{}:ready", self.config.prefix))
            .arg(1)
            .arg("PX")
            .arg(10_000);
        self.run_write(&probe, &[]).await.map(|_| ())
    }

    fn warnings(&self) -> Vec<String> {
        self.acks_warnings()
    }

    async fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        let _turn = self.turn().await;
        let cmd = self.script(
            partition,
            Op::Get,
            &Inputs {
                key,
                ..Inputs::default()
            },
        );
        let reply = self.run(&cmd).await?;
        let mut r = Reader::new(&reply);
        let read = ReadReply {
            now: r.u64()?,
            entry: r.maybe_entry()?,
        };
        self.heard_clock(partition, read.now);
        Ok(read)
    }

    async fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        let _turn = self.turn().await;
        let inputs = Inputs {
            key: prefix,
            ..Inputs::default()
        };
        let cmd = self.script(partition, Op::List, &inputs);
        match self.run_script_value(&cmd, &self.store_scripts()).await? {
            Value::BulkString(packed) => listing(&packed),
            other => Err(malformed(&format!(
                "expected a packed listing, got {other:?}"
            ))),
        }
    }

    async fn put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let ttl = ttl_ms.map(ttl_arg).transpose()?;
        let _turn = self.turn().await;
        let inputs = Inputs {
            key,
            value: Some(value),
            ttl_ms: ttl,
            condition: Some(condition),
            ..Inputs::default()
        };
        self.write(partition, Op::Put, inputs).await
    }

    async fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let _turn = self.turn().await;
        let inputs = Inputs {
            key,
            condition: Some(condition),
            ..Inputs::default()
        };
        self.write(partition, Op::Delete, inputs).await
    }

    async fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let ttl = ttl_arg(ttl_ms)?;
        let _turn = self.turn().await;
        let inputs = Inputs {
            key,
            ttl_ms: Some(ttl),
            condition: Some(condition),
            ..Inputs::default()
        };
        self.write(partition, Op::Touch, inputs).await
    }

    async fn changes(
        &self,
        partition: &str,
        after: u64,
        max: u32,
    ) -> Result<ChangesReply, StoreError> {
        if is_unwatched(partition) {
            return Err(no_feed(partition));
        }
        let _turn = self.turn().await;
        let inputs = Inputs {
            after,
            max,
            ..Inputs::default()
        };
        let cmd = self.script(partition, Op::Changes, &inputs);
        match self.run_script_value(&cmd, &self.store_scripts()).await? {
            Value::BulkString(packed) => page(&packed),
            Value::Array(reply) => {
                // The history no longer reaches `after`.
                let mut r = Reader::new(&reply);
                let (_now, _revision) = (r.u64()?, r.u64()?);
                Err(StoreError::HistoryGone(r.u64()?))
            }
            other => Err(malformed(&format!("expected a packed page, got {other:?}"))),
        }
    }

    async fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        // A charge, refund or reset held by a paused server must not apply
        // after this call answered `unavailable` (`deadline.rs`).
        let writes = !matches!(request.mode, MeterMode::Peek);
        let gives_up = std::time::Instant::now() + self.config.response_timeout;
        let clock = self.script_clock(partition, writes.then_some(gives_up));
        let packed = packed_meter(request, clock.packed());
        let _turn = self.turn().await;
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(&self.meter_sha)
            .arg(1)
            .arg(format!("{}{key}", self.key(partition, "r:")))
            .arg(packed);
        let reply = match request.mode {
            MeterMode::Peek => self.run_script_value(&cmd, &[METER_SCRIPT]).await?,
            MeterMode::Consume | MeterMode::Reset | MeterMode::Charge | MeterMode::Refund(_) => {
                self.run_write(&cmd, &[METER_SCRIPT]).await?
            }
        };
        let reply = match reply {
            Value::BulkString(packed) => meter_reply(&packed)?,
            other => {
                return Err(malformed(&format!(
                    "expected a packed meter reply, got {other:?}"
                )));
            }
        };
        self.heard_clock(partition, reply.now);
        Ok(reply)
    }

    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        let mut guard = self.register(&self.key(partition, "w")).await?;
        let mut deadline = None;
        loop {
            // Mark what we have seen before checking, so a change published
            // after the check wakes us. A published revision past `after`
            // answers the wait with no check: one round trip less per wake-up.
            let published = *guard.notify.borrow_and_update();
            if published > after {
                return Ok(published);
            }
            let (now, revision, next_expiry) = self.check(partition).await?;
            let deadline = *deadline.get_or_insert(now.saturating_add(timeout_ms));
            if revision > after || now >= deadline {
                return Ok(revision);
            }
            let recheck_ms = u64::try_from(self.config.recheck.as_millis()).unwrap_or(u64::MAX);
            let mut sleep_ms = (deadline - now).min(recheck_ms);
            if let Some(expiry) = next_expiry {
                sleep_ms = sleep_ms.min(expiry.saturating_sub(now).max(1));
            }
            let test_clock_reaches = async {
                match &self.config.test_clock {
                    Some(clock) => clock.sleep_until(now + sleep_ms).await,
                    None => std::future::pending().await,
                }
            };
            let mut notify = guard.notify.clone();
            let _asleep = guard.asleep();
            tokio::select! {
                _ = notify.changed() => {}
                _ = test_clock_reaches => {}
                _ = tokio::time::sleep(Duration::from_millis(sleep_ms)) => {}
            }
        }
    }

    async fn wait_then_put(
        &self,
        partition: &str,
        key: &str,
        value: &[u8],
        ttl_ms: Option<u64>,
        condition: &Condition,
        after: u64,
        timeout_ms: u64,
    ) -> Result<WriteReply, StoreError> {
        if timeout_ms == 0 {
            // No wait at all (and `BLOCK 0` would block forever).
            return self.put(partition, key, value, ttl_ms, condition).await;
        }
        // A test clock's time cannot end a block on Redis: that waits here.
        // On a cluster a partition kept as one string keeps no wake stream
        // to block on (unwatched.lua says why): its waiters wait on the channel.
        let no_stream = self.config.cluster && one_string(partition);
        let mut timeout_ms = timeout_ms;
        if self.config.test_clock.is_none()
            && !no_stream
            && !self.blocking_refused.load(Ordering::Relaxed)
        {
            let ttl = ttl_ms.map(ttl_arg).transpose()?;
            let started = std::time::Instant::now();
            if let Some(reply) = self
                .blocking_wait_then_put(partition, key, value, ttl, condition, after, timeout_ms)
                .await
            {
                return reply;
            }
            // Waiting apart now: only for what is left of the timeout.
            let spent = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            timeout_ms = timeout_ms.saturating_sub(spent);
        }
        self.wait(partition, after, timeout_ms).await?;
        self.put(partition, key, value, ttl_ms, condition).await
    }
}

impl RedisBackend {
    /// A cluster node says `cluster_state:ok`: every slot is served.
    async fn every_slot_served(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let info: String = ::redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        if info.lines().any(|line| line.trim() == "cluster_state:ok") {
            return Ok(());
        }
        Err(StoreError::Unavailable(
            "redis: the cluster does not serve every slot (cluster_state is not ok)".into(),
        ))
    }
}
