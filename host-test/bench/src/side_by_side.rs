//! One store as a side-by-side comparison drives it (`nats.rs`, `sql.rs`):
//! a component instance on it, the samples of the row being measured, and
//! the store's round trips per call.

use std::sync::Arc;
use std::time::Instant;

use coord_host::backend::Backend;
use coord_host::lock::{AcquireOutcome, ExtendOutcome};
use coord_host::{Instance, Runtime};

use crate::measure::{Stats, failed};
use crate::ops::{LOCK_ID, Op, component_op, no_wait, space};

/// One store, as the comparison drives it.
pub struct Store {
    /// The instance the one-task rows call.
    pub instance: Instance,
    /// The runtime the many-task rows instantiate from.
    pub runtime: Arc<Runtime>,
    trips: Box<dyn Fn() -> u64>,
    samples: Stats,
    trips_taken: u64,
}

impl Store {
    /// A runtime and an instance on `backend`, whose round trips so far
    /// `trips` reads.
    pub async fn new(
        backend: Arc<dyn Backend>,
        trips: Box<dyn Fn() -> u64>,
    ) -> wasmtime::Result<Self> {
        let runtime = Arc::new(Runtime::new(backend)?);
        let instance = runtime.instantiate().await?;
        Ok(Store {
            instance,
            runtime,
            trips,
            samples: Stats::default(),
            trips_taken: 0,
        })
    }

    /// Write the 100 entries the snapshot row reads, right before it: they
    /// expire with the space's TTL (a minute), and on a slow VM the rows
    /// before it took longer.
    pub async fn fill(&mut self) -> wasmtime::Result<()> {
        for k in 0..100 {
            self.instance
                .ephemeral()
                .upsert(&space(), "bench-100", &format!("k{k}"), b"{}")
                .await?
                .map_err(|e| failed(&format!("{e:?}")))?;
        }
        Ok(())
    }

    /// Time `op` on key `n` and count its round trips.
    pub async fn time(&mut self, op: Op, n: &str) -> wasmtime::Result<()> {
        let trips = (self.trips)();
        let start = Instant::now();
        component_op(op, &mut self.instance, n).await?;
        self.samples.push(start.elapsed());
        self.trips_taken += (self.trips)() - trips;
        Ok(())
    }

    /// Take the row's figures and start the next row.
    pub fn take(&mut self, reps: usize) -> (Stats, f64) {
        let trips = self.trips_taken as f64 / reps as f64;
        self.trips_taken = 0;
        (std::mem::take(&mut self.samples), trips)
    }
}

/// Extends of one held lock, timed, with their round trips.
pub async fn extend(store: &mut Store, reps: usize) -> wasmtime::Result<(Stats, f64)> {
    let AcquireOutcome::Acquired(mut lock) = store
        .instance
        .lock()
        .acquire(LOCK_ID, "extend-me", no_wait())
        .await?
        .map_err(|e| failed(&format!("{e:?}")))?
    else {
        return Err(failed("busy"));
    };
    for _ in 0..reps {
        let trips = (store.trips)();
        let start = Instant::now();
        let ExtendOutcome::Extended(next) = store
            .instance
            .lock()
            .extend(&lock, None)
            .await?
            .map_err(|e| failed(&format!("{e:?}")))?
        else {
            return Err(failed("lost"));
        };
        store.samples.push(start.elapsed());
        store.trips_taken += (store.trips)() - trips;
        lock = next;
    }
    store
        .instance
        .lock()
        .release(&lock)
        .await?
        .map_err(|e| failed(&format!("{e:?}")))?;
    Ok(store.take(reps))
}
