//! The loop helpers every table shares: tasks run side by side for a
//! number of rounds, and the steps they take.

use std::sync::Arc;
use std::time::Instant;

use coord_host::backend::Backend;
use coord_host::{Instance, Runtime};
use coord_redis::RedisBackend;

use super::{Op, component_op, native_op};
use crate::measure::{Stats, Step, failed};

/// Run `tasks` tasks of `per_task` timed steps each; all samples and the
/// overall rate. `task(t)` makes task `t`'s step function.
pub(crate) async fn run_tasks<F, S, Fut>(
    tasks: usize,
    per_task: usize,
    task: F,
) -> wasmtime::Result<(Stats, f64)>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = wasmtime::Result<S>> + Send + 'static,
    S: Step + Send + 'static,
{
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let make = task(t);
        handles.push(tokio::spawn(async move {
            let mut step = make.await?;
            let mut s = Stats::default();
            for _ in 0..per_task {
                let start = Instant::now();
                step.step().await?;
                s.push(start.elapsed());
            }
            Ok::<_, wasmtime::Error>(s)
        }));
    }
    let mut all = Stats::default();
    for h in handles {
        all.extend(h.await??);
    }
    Ok((
        all,
        (tasks * per_task) as f64 / started.elapsed().as_secs_f64(),
    ))
}

/// The samples and elapsed time of several runs of [`run_tasks`].
#[derive(Default)]
pub(crate) struct Rounds {
    pub(crate) samples: Stats,
    pub(crate) operations: f64,
    pub(crate) seconds: f64,
}

impl Rounds {
    /// Add one run's samples and its rate.
    pub(crate) fn add(&mut self, (samples, rate): (Stats, f64)) {
        let operations = samples.len() as f64;
        self.operations += operations;
        self.seconds += operations / rate;
        self.samples.extend(samples);
    }

    /// Operations per second over all runs.
    pub(crate) fn rate(&self) -> f64 {
        self.operations / self.seconds
    }

    /// All samples and the overall rate, as one run reports them.
    pub(crate) fn total(self) -> (Stats, f64) {
        let rate = self.rate();
        (self.samples, rate)
    }
}

/// An operation through a component instance of its own.
pub(crate) struct ComponentStep(pub(crate) Op, pub(crate) Instance, pub(crate) String);
/// The same operation on the backend, natively.
pub(crate) struct NativeStep(
    pub(crate) Op,
    pub(crate) Arc<dyn Backend>,
    pub(crate) String,
);
/// A bare PING.
pub(crate) struct PingStep(pub(crate) Arc<RedisBackend>);

/// `op` in `tasks` tasks, `per_task` each, every task through an instance
/// of its own on its own key (`task-<n>`): the latencies and the rate.
pub(crate) async fn component_rate(
    runtime: &Arc<Runtime>,
    op: Op,
    tasks: usize,
    per_task: usize,
) -> wasmtime::Result<(Stats, f64)> {
    run_tasks(tasks, per_task, |t| {
        let runtime = runtime.clone();
        async move {
            Ok(ComponentStep(
                op,
                runtime.instantiate().await?,
                format!("task-{t}"),
            ))
        }
    })
    .await
}

impl Step for ComponentStep {
    async fn step(&mut self) -> wasmtime::Result<()> {
        component_op(self.0, &mut self.1, &self.2).await
    }
}

impl Step for NativeStep {
    async fn step(&mut self) -> wasmtime::Result<()> {
        native_op(self.0, self.1.as_ref(), &self.2).await
    }
}

impl Step for PingStep {
    async fn step(&mut self) -> wasmtime::Result<()> {
        self.0.ping().await.map_err(|e| failed(&format!("{e:?}")))
    }
}
