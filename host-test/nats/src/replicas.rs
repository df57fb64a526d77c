//! How many replicas the stream keeps, and who may change it.
//!
//! Every process on a stream relies on its replicas: an acknowledged write
//! survives the loss of a server only on a replicated stream. So one
//! process's setting never lowers it unasked (outside testers: a second
//! `coord serve` given two of the three URLs set everyone's stream to one
//! replica, and a hung server then stopped every call of every process).
//! An existing stream keeps its count unless the operator asks for more
//! (`replicas`), or for fewer with a second explicit word
//! (`allow_fewer_replicas`). What differs from what was asked, or from
//! what the stream had, is logged at start and reported by `warnings` (so
//! by `/readyz` and the metrics), re-checked at every readiness probe.

use std::sync::atomic::Ordering;

use super::{NatsBackend, NatsConfig};

impl NatsBackend {
    /// The count to give a stream that has `have` replicas, if it is to
    /// change: only what the operator asked for, and lower only when
    /// allowed to.
    pub(super) fn replicas_to_set(&self, have: usize) -> Option<usize> {
        let asked = self.config.replicas?.max(1);
        (asked > have || (asked < have && self.config.allow_fewer_replicas)).then_some(asked)
    }

    /// The count to make a missing stream with: what was asked (else the
    /// default for the URLs given), but never fewer than the stream had
    /// when this process last saw it, unless fewer are allowed. A stream
    /// deleted and made again by a process given fewer URLs would
    /// otherwise come back with fewer replicas than every other process
    /// relies on.
    pub(super) fn replicas_to_make(&self) -> usize {
        let asked = self
            .config
            .replicas
            .unwrap_or_else(|| NatsConfig::default_replicas(&self.config.url))
            .max(1);
        if self.config.allow_fewer_replicas {
            return asked;
        }
        asked.max(self.relied_on_replicas.load(Ordering::Relaxed) as usize)
    }

    /// After seeing a stream of `have` replicas: what this process relies
    /// on from now on. It only rises, unless fewer are allowed.
    pub(super) fn rely_on_replicas(&self, have: usize) {
        if self.config.allow_fewer_replicas {
            self.relied_on_replicas
                .store(have as u64, Ordering::Relaxed);
        } else {
            self.relied_on_replicas
                .fetch_max(have as u64, Ordering::Relaxed);
        }
    }

    /// Record what is wrong with a stream of `have` replicas now.
    pub(super) fn check_replicas(&self, have: usize) {
        let stream = &self.config.stream;
        let relied_on = self.relied_on_replicas.load(Ordering::Relaxed) as usize;
        let mut warnings = Vec::new();
        if have < relied_on && !self.config.allow_fewer_replicas {
            warnings.push(format!(
                "the stream {stream:?} has {have} replica(s), fewer than the {relied_on} it had \
                 when this process started: another process lowered it"
            ));
        }
        match self.config.replicas {
            Some(asked) if asked < have && !self.config.allow_fewer_replicas => {
                warnings.push(format!(
                    "{asked} replica(s) were asked for (--nats-replicas) and the stream \
                     {stream:?} has {have}: kept at {have}, since lowering it needs a second \
                     explicit word (--allow-fewer-replicas)"
                ));
            }
            Some(_) => {}
            None => {
                let servers = self
                    .config
                    .url
                    .split(',')
                    .filter(|s| !s.trim().is_empty())
                    .count();
                let default = NatsConfig::default_replicas(&self.config.url);
                if have < default {
                    warnings.push(format!(
                        "the stream {stream:?} has {have} replica(s) though {servers} servers \
                         are named: an acknowledged write is lost with the server that holds \
                         it; ask for {default} (--nats-replicas {default}) to raise it"
                    ));
                }
            }
        }
        if let Ok(mut kept) = self.warnings.lock() {
            *kept = warnings;
        }
    }

    /// What is wrong with the stream's configuration, as last checked.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().map(|w| w.clone()).unwrap_or_default()
    }
}
