//! A node's leases, kept current: seed 004's `Manager` over `coord:sync/lease`.
//!
//! One [`LeaseManager`] per node, over one [`Runtime`]. Every third of the
//! TTL it brings every name it was asked about up to date: a lease it holds
//! is renewed; one it does not hold is acquired if it can be, which is how a
//! lease moves to this node when its holder is gone.
//!
//! - [`LeaseManager::held`] answers from the last renewal, with no round
//!   trip (but the first time a name is asked about): `true` until one TTL
//!   after the last successful acquire or renewal was *sent* — never later
//!   than the lease's real expiry, which the store set after that — and it
//!   lags the store by at most one renewal interval.
//! - [`LeaseManager::guard`] brings the lease up to date, runs the store's
//!   commit-point check (still this node's, at this epoch, past the grace)
//!   and only then calls the write, with a [`Token`] that carries the epoch
//!   to present at the write boundary. Its errors keep `unavailable`,
//!   `not-holder` and `in-grace` apart.
//! - [`LeaseManager::close`] makes `held` false at once and stops renewing;
//!   the leases then run out (and through their grace) in the store.
//!   [`LeaseManager::resign`] hands one over at once instead.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::lease::{Error, HeldLease, Holder};
use crate::{Instance, Runtime};

/// What a write under [`LeaseManager::guard`] is given: proof it passed the
/// commit point, and the epoch to present at the write boundary. Only the
/// manager makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    name: String,
    epoch: u64,
}

impl Token {
    /// The lease this token was issued under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lease's epoch: present it at the write boundary, which refuses
    /// an epoch lower than one it has seen.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

/// Why [`LeaseManager::guard`] did not run the write.
#[derive(Debug)]
pub enum GuardError {
    /// The store could not be reached: refuse the write.
    Unavailable(String),
    /// Another node holds the lease (who, when the store said), or nobody.
    NotHolder(Option<Holder>),
    /// This node holds it but the previous holder's grace has not ended.
    InGrace(Duration),
    /// The manager was closed.
    Closed,
    /// The store or the component broke its contract, or trapped.
    Internal(String),
}

impl std::fmt::Display for GuardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuardError::Unavailable(why) => write!(f, "lease store unavailable: {why}"),
            GuardError::NotHolder(Some(holder)) => {
                write!(
                    f,
                    "the lease is held by {} (epoch {})",
                    holder.node, holder.epoch
                )
            }
            GuardError::NotHolder(None) => write!(f, "the lease is not held by this node"),
            GuardError::InGrace(left) => {
                write!(f, "in the failover grace for {} ms more", left.as_millis())
            }
            GuardError::Closed => write!(f, "the lease manager is closed"),
            GuardError::Internal(why) => write!(f, "internal: {why}"),
        }
    }
}

impl std::error::Error for GuardError {}

impl From<Error> for GuardError {
    fn from(error: Error) -> Self {
        match error {
            Error::Unavailable(why) => GuardError::Unavailable(why),
            Error::NotHolder(holder) => GuardError::NotHolder(holder),
            Error::InGrace(ms) => GuardError::InGrace(Duration::from_millis(ms)),
            Error::InvalidArgument(bad) => {
                GuardError::Internal(format!("{}: {}", bad.field, bad.reason))
            }
            Error::Internal(why) => GuardError::Internal(why),
        }
    }
}

/// This node's leases over one runtime; see the module's documentation.
pub struct LeaseManager {
    shared: Arc<Shared>,
    renewing: tokio::task::JoinHandle<()>,
}

struct Shared {
    runtime: Runtime,
    node: String,
    ttl: Duration,
    closed: AtomicBool,
    /// The instance the manager calls through, and the holding of every name
    /// it was asked about (`None`: not held). Renewals and guards take turns.
    state: Mutex<State>,
    /// What `held` reads: per name, until when (ns after `base`) this node
    /// may take itself to hold it; 0 when it does not.
    until: RwLock<HashMap<String, Arc<AtomicU64>>>,
    base: Instant,
}

struct State {
    instance: Option<Instance>,
    holds: HashMap<String, Option<HeldLease>>,
}

impl LeaseManager {
    /// Start the manager of `node`'s leases of `ttl` on `runtime`, and its
    /// renewal loop (every third of the TTL). Must be called inside a Tokio
    /// runtime.
    pub fn start(runtime: Runtime, node: impl Into<String>, ttl: Duration) -> LeaseManager {
        let shared = Arc::new(Shared {
            runtime,
            node: node.into(),
            ttl,
            closed: AtomicBool::new(false),
            state: Mutex::new(State {
                instance: None,
                holds: HashMap::new(),
            }),
            until: RwLock::new(HashMap::new()),
            base: Instant::now(),
        });
        let looping = shared.clone();
        let renewing = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(looping.ttl / 3);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let mut state = looping.state.lock().await;
                let names: Vec<String> = state.holds.keys().cloned().collect();
                for name in names {
                    let _ = looping.ensure(&mut state, &name).await;
                }
            }
        });
        LeaseManager { shared, renewing }
    }

    /// The node this manager holds leases for.
    pub fn node(&self) -> &str {
        &self.shared.node
    }

    /// Whether this node holds `name` now, as of the last renewal; see the
    /// module's documentation. The first question about a name asks the
    /// store (and from then on the renewal loop keeps it current).
    pub async fn held(&self, name: &str) -> bool {
        if self.shared.closed.load(Ordering::SeqCst) {
            return false;
        }
        let known = self.shared.read_until(name);
        let until = match known {
            Some(until) => until,
            None => {
                let mut state = self.shared.state.lock().await;
                let _ = self.shared.ensure(&mut state, name).await;
                self.shared.read_until(name).unwrap_or(0)
            }
        };
        !self.shared.closed.load(Ordering::SeqCst) && self.shared.elapsed_ns() < until
    }

    /// Run `write` under the lease `name`: acquire or renew it, enforce the
    /// failover grace, pass the store's commit-point check, and only then
    /// call `write` with the token it must present.
    pub async fn guard<T, F, Fut>(&self, name: &str, write: F) -> Result<T, GuardError>
    where
        F: FnOnce(Token) -> Fut,
        Fut: Future<Output = T>,
    {
        let token = {
            if self.shared.closed.load(Ordering::SeqCst) {
                return Err(GuardError::Closed);
            }
            let mut state = self.shared.state.lock().await;
            let lease = self.shared.ensure(&mut state, name).await?;
            let checked = Shared::instance(&self.shared.runtime, &mut state)
                .await?
                .lease()
                .check(&lease)
                .await;
            let checked = settle(&mut state, checked);
            match checked {
                Ok(_) => {}
                Err(Error::NotHolder(holder)) => {
                    self.shared.drop_holding(&mut state, name);
                    return Err(GuardError::NotHolder(holder));
                }
                Err(other) => return Err(other.into()),
            }
            Token {
                name: name.to_string(),
                epoch: lease.epoch,
            }
        };
        Ok(write(token).await)
    }

    /// Give up `name` now, so another node takes it with no grace; `held`
    /// is false from here on until the lease comes back to this node.
    pub async fn resign(&self, name: &str) -> Result<bool, GuardError> {
        let mut state = self.shared.state.lock().await;
        let Some(Some(lease)) = state.holds.get(name).cloned() else {
            return Ok(false);
        };
        self.shared.drop_holding(&mut state, name);
        // Not asked about any more: the loop must not take it back.
        state.holds.remove(name);
        let resigned = Shared::instance(&self.shared.runtime, &mut state)
            .await?
            .lease()
            .resign(&lease)
            .await;
        Ok(settle(&mut state, resigned)?)
    }

    /// Stop renewing and make `held` false at once. The leases run out in
    /// the store by themselves (then through their grace).
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.renewing.abort();
        if let Ok(until) = self.shared.until.read() {
            for deadline in until.values() {
                deadline.store(0, Ordering::SeqCst);
            }
        }
    }
}

impl Drop for LeaseManager {
    fn drop(&mut self) {
        self.close();
    }
}

/// A lease call's result; a trap also drops the instance (a trapped
/// instance cannot be called again), so the next call makes a new one.
fn settle<T>(state: &mut State, result: crate::LeaseResult<T>) -> Result<T, Error> {
    match result {
        Ok(result) => result,
        Err(trap) => {
            state.instance = None;
            Err(Error::Internal(format!("trap: {trap:#}")))
        }
    }
}

impl Shared {
    fn elapsed_ns(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn read_until(&self, name: &str) -> Option<u64> {
        let until = self.until.read().ok()?;
        until
            .get(name)
            .map(|deadline| deadline.load(Ordering::SeqCst))
    }

    /// Record until when `held(name)` may answer `true` (0: not held).
    fn publish(&self, name: &str, until_ns: u64) {
        if let Ok(mut until) = self.until.write() {
            until
                .entry(name.to_string())
                .or_insert_with(|| Arc::new(AtomicU64::new(0)))
                .store(until_ns, Ordering::SeqCst);
        }
    }

    fn drop_holding(&self, state: &mut State, name: &str) {
        state.holds.insert(name.to_string(), None);
        self.publish(name, 0);
    }

    /// Bring the holding of `name` up to date: renew it if held, else try
    /// to acquire it. Publishes what `held` answers.
    async fn ensure(&self, state: &mut State, name: &str) -> Result<HeldLease, Error> {
        let began = self.elapsed_ns();
        let current = state.holds.get(name).cloned().flatten();
        let outcome = match &current {
            Some(lease) => {
                let renewed = Shared::instance(&self.runtime, state)
                    .await?
                    .lease()
                    .renew(lease)
                    .await;
                match settle(state, renewed) {
                    // Taken over, or run out and taken: try to get it back.
                    Err(Error::NotHolder(_)) => self.acquire(state, name).await,
                    other => other,
                }
            }
            None => self.acquire(state, name).await,
        };
        match &outcome {
            Ok(lease) => {
                state.holds.insert(name.to_string(), Some(lease.clone()));
                let ttl_ns = u64::try_from(Duration::from_millis(lease.ttl_ms).as_nanos())
                    .unwrap_or(u64::MAX);
                self.publish(name, began.saturating_add(ttl_ns));
            }
            // Unreachable: what `held` had stays true only until the last
            // confirmed holding's bound, which never outlives the lease.
            Err(Error::Unavailable(_)) => {
                state.holds.entry(name.to_string()).or_insert(current);
                if self.read_until(name).is_none() {
                    self.publish(name, 0);
                }
            }
            Err(_) => self.drop_holding(state, name),
        }
        outcome
    }

    async fn acquire(&self, state: &mut State, name: &str) -> Result<HeldLease, Error> {
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let acquired = Shared::instance(&self.runtime, state)
            .await?
            .lease()
            .acquire(name, &self.node, ttl_ms)
            .await;
        settle(state, acquired)
    }

    /// The manager's instance, made on first use or after a trap.
    async fn instance<'a>(
        runtime: &Runtime,
        state: &'a mut State,
    ) -> Result<&'a mut Instance, Error> {
        if state.instance.is_none() {
            let instance = runtime
                .instantiate()
                .await
                .map_err(|trap| Error::Internal(format!("instantiating: {trap:#}")))?;
            state.instance = Some(instance);
        }
        state
            .instance
            .as_mut()
            .ok_or_else(|| Error::Internal("no instance".into()))
    }
}
