//! A linearizability checker in the spirit of Porcupine (Wing & Gong's search
//! with memoized states): a recorded concurrent history is accepted when some
//! total order of its operations respects real time (an operation that
//! returned before another was invoked comes first) and a sequential model
//! produces every recorded output in that order.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// A sequential specification.
pub trait Model {
    /// The model's state.
    type State: Clone + Eq + Hash;
    /// An operation's input.
    type Input: Clone + std::fmt::Debug;
    /// An operation's recorded output.
    type Output: Clone + std::fmt::Debug;
    /// The state before any operation.
    fn init(&self) -> Self::State;
    /// The state after `input` if the model can answer it with `output`.
    fn step(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: &Self::Output,
    ) -> Option<Self::State>;
}

/// One completed operation: when it was invoked and returned (on one logical
/// clock shared by every client), what went in and what came out.
#[derive(Debug, Clone)]
pub struct Op<I, O> {
    /// When the call was made, on the shared logical clock.
    pub invoked: u64,
    /// When its answer came back, on the same clock.
    pub returned: u64,
    /// What the call asked.
    pub input: I,
    /// What it answered.
    pub output: O,
}

/// Records operations from many tasks on one logical clock.
pub struct Recorder<I, O> {
    clock: AtomicU64,
    ops: Mutex<Vec<Op<I, O>>>,
}

impl<I, O> Default for Recorder<I, O> {
    fn default() -> Self {
        Recorder {
            clock: AtomicU64::new(0),
            ops: Mutex::new(Vec::new()),
        }
    }
}

impl<I, O> Recorder<I, O> {
    /// A timestamp: call before invoking an operation.
    pub fn invoke(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    /// Record an operation that returned now.
    pub fn returned(&self, invoked: u64, input: I, output: O) {
        let returned = self.clock.fetch_add(1, Ordering::SeqCst);
        self.ops.lock().unwrap().push(Op {
            invoked,
            returned,
            input,
            output,
        });
    }

    /// Everything recorded.
    pub fn history(self) -> Vec<Op<I, O>> {
        self.ops.into_inner().unwrap()
    }
}

/// Whether `history` is linearizable with respect to `model` (at most 128 operations).
pub fn linearizable<M: Model>(model: &M, history: &[Op<M::Input, M::Output>]) -> bool {
    assert!(
        history.len() <= 128,
        "the checker takes at most 128 operations"
    );
    let mut seen = HashSet::new();
    search(model, history, 0u128, model.init(), &mut seen)
}

fn search<M: Model>(
    model: &M,
    history: &[Op<M::Input, M::Output>],
    done: u128,
    state: M::State,
    seen: &mut HashSet<(u128, M::State)>,
) -> bool {
    if done.count_ones() as usize == history.len() {
        return true;
    }
    if !seen.insert((done, state.clone())) {
        return false;
    }
    // Only an operation invoked before every pending one returned can go next.
    let horizon = history
        .iter()
        .enumerate()
        .filter(|(i, _)| done & (1 << i) == 0)
        .map(|(_, op)| op.returned)
        .min()
        .unwrap_or(u64::MAX);
    for (i, op) in history.iter().enumerate() {
        if done & (1 << i) != 0 || op.invoked > horizon {
            continue;
        }
        if let Some(next) = model.step(&state, &op.input, &op.output)
            && search(model, history, done | (1 << i), next, seen)
        {
            return true;
        }
    }
    false
}
