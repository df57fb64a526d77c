//! One [`Backend`] for every store that keeps each partition as the
//! in-memory state machine ([`Partition`]) and applies a call to one
//! partition in one step of its own: the memory store under its lock,
//! SQLite and PostgreSQL in a transaction on the partition's row, NATS by a
//! compare-and-set of the partition's message.
//!
//! Such a store implements [`PartitionStore`]: its step ([`PartitionStore::step`],
//! which applies an [`Operation`] to the partition at the store's now and
//! keeps what it changed), its clock, its readiness and its wait. Every
//! other [`Backend`] method is written here, once, as one step.

use std::borrow::Cow;

use async_trait::async_trait;
use coord_component::memory::Partition;

use super::{
    Backend, Change, ChangesReply, Condition, Entry, ListReply, MeterReply, MeterRequest, Millis,
    Outcome, ReadReply, StoreError, WriteReply, no_feed,
};

/// One call of the store contract, as the partition's state machine runs
/// it. Borrowed from the caller; [`Operation::into_owned`] for a step that
/// runs on another thread.
#[derive(Clone, Debug)]
pub enum Operation<'a> {
    /// Read one key.
    Get {
        /// The key.
        key: Cow<'a, str>,
    },
    /// List the live entries under a prefix, with the partition's revision.
    List {
        /// The prefix.
        prefix: Cow<'a, str>,
    },
    /// Write a value if the condition holds.
    Put {
        /// The key.
        key: Cow<'a, str>,
        /// The value.
        value: Cow<'a, [u8]>,
        /// Its TTL, if it expires.
        ttl_ms: Option<u64>,
        /// What must hold for the write to apply.
        condition: Cow<'a, Condition>,
    },
    /// Remove a key if the condition holds.
    Delete {
        /// The key.
        key: Cow<'a, str>,
        /// What must hold for the removal to apply.
        condition: Cow<'a, Condition>,
    },
    /// Renew a key's TTL if the condition holds.
    Touch {
        /// The key.
        key: Cow<'a, str>,
        /// The new TTL.
        ttl_ms: u64,
        /// What must hold for the renewal to apply.
        condition: Cow<'a, Condition>,
    },
    /// The changes after a revision, with the partition's revision.
    Changes {
        /// The revision the caller has seen.
        after: u64,
        /// The most changes to answer.
        max: u32,
    },
    /// Count against a rate-limit key.
    Meter {
        /// The key.
        key: Cow<'a, str>,
        /// The algorithm, limit, window and cost.
        request: MeterRequest,
    },
}

/// What a step answered: one case per [`Operation`] case.
#[derive(Debug)]
pub enum Answer {
    /// [`Operation::Get`]'s entry.
    Entry(Option<Entry>),
    /// [`Operation::List`]'s entries and the revision.
    Entries(Vec<Entry>, u64),
    /// [`Operation::Put`]'s, [`Operation::Delete`]'s or [`Operation::Touch`]'s
    /// outcome, and the partition's revision once it was decided.
    Written(Outcome, u64),
    /// [`Operation::Changes`]'s changes (or the history gone) and the revision.
    Changes(Result<Vec<Change>, StoreError>, u64),
    /// [`Operation::Meter`]'s decision.
    Metered(MeterReply),
}

impl Operation<'_> {
    /// Apply this operation to `partition` at `now`: the step's core, the
    /// same on every store. A store whose step may run twice (a
    /// transaction retried after a race) applies it again to the state it
    /// read again.
    pub fn apply(&self, partition: &mut Partition, now: u64) -> Answer {
        match self {
            Operation::Get { key } => Answer::Entry(partition.get(key, now)),
            Operation::List { prefix } => {
                Answer::Entries(partition.list(prefix, now), partition.revision())
            }
            Operation::Put {
                key,
                value,
                ttl_ms,
                condition,
            } => {
                let outcome = partition.put(key, value, *ttl_ms, condition, now);
                Answer::Written(outcome, partition.revision())
            }
            Operation::Delete { key, condition } => {
                let outcome = partition.delete(key, condition, now);
                Answer::Written(outcome, partition.revision())
            }
            Operation::Touch {
                key,
                ttl_ms,
                condition,
            } => {
                let outcome = partition.touch(key, *ttl_ms, condition, now);
                Answer::Written(outcome, partition.revision())
            }
            Operation::Changes { after, max } => {
                Answer::Changes(partition.changes(*after, *max, now), partition.revision())
            }
            Operation::Meter { key, request } => {
                Answer::Metered(partition.meter(key, request, now))
            }
        }
    }

    /// This operation owning its arguments, to move to another thread.
    pub fn into_owned(self) -> Operation<'static> {
        fn own<T: ToOwned + ?Sized>(borrowed: Cow<'_, T>) -> Cow<'static, T> {
            Cow::Owned(borrowed.into_owned())
        }
        match self {
            Operation::Get { key } => Operation::Get { key: own(key) },
            Operation::List { prefix } => Operation::List {
                prefix: own(prefix),
            },
            Operation::Put {
                key,
                value,
                ttl_ms,
                condition,
            } => Operation::Put {
                key: own(key),
                value: own(value),
                ttl_ms,
                condition: own(condition),
            },
            Operation::Delete { key, condition } => Operation::Delete {
                key: own(key),
                condition: own(condition),
            },
            Operation::Touch {
                key,
                ttl_ms,
                condition,
            } => Operation::Touch {
                key: own(key),
                ttl_ms,
                condition: own(condition),
            },
            Operation::Changes { after, max } => Operation::Changes { after, max },
            Operation::Meter { key, request } => Operation::Meter {
                key: own(key),
                request,
            },
        }
    }

    /// Whether the step only reads: it changes nothing of the partition
    /// unless an entry is due to expire (a store records the expiry first).
    pub fn only_reads(&self) -> bool {
        matches!(
            self,
            Operation::Get { .. } | Operation::List { .. } | Operation::Changes { .. }
        )
    }

    /// Whether the step must decide on the partition's latest state, not on
    /// a copy this host cached: a read, and a create-if-absent (a lock's or
    /// a permit's acquire), which on a cached copy would let a holder that
    /// just released take the lock again before the waiters its release
    /// woke. Other writes are compare-and-set on the revision they read, so
    /// a stale copy costs a retry, never a wrong answer; a store that always
    /// reads (a transaction) ignores this.
    pub fn needs_latest(&self) -> bool {
        match self {
            Operation::Get { .. } | Operation::List { .. } | Operation::Changes { .. } => true,
            Operation::Put { condition, .. }
            | Operation::Delete { condition, .. }
            | Operation::Touch { condition, .. } => matches!(
                condition.as_ref(),
                Condition::Absent | Condition::AbsentAndFewerThan(_)
            ),
            Operation::Meter { .. } => false,
        }
    }
}

/// A store that keeps each partition as [`Partition`] and supplies one
/// step per call; it is a [`Backend`] through this module.
#[async_trait]
pub trait PartitionStore: Send + Sync + 'static {
    /// The store's name in logs and metrics ("memory", "sqlite", ...).
    fn kind(&self) -> &'static str;

    /// The store's clock ([`Backend::now`]).
    async fn now(&self) -> Result<Millis, StoreError>;

    /// Whether a write could land now ([`Backend::ready`]).
    async fn ready(&self) -> Result<(), StoreError> {
        self.now().await.map(|_| ())
    }

    /// What an operator should know of this store's settings ([`Backend::warnings`]).
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// Apply `operation` to `partition` at the store's now, atomically,
    /// keeping what it changed: its answer and that now.
    async fn step(
        &self,
        partition: &str,
        operation: Operation<'_>,
    ) -> Result<(Answer, Millis), StoreError>;

    /// Wait for a revision past `after` ([`Backend::wait`]): each store
    /// hears writes its own way.
    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError>;
}

/// A step that answered another operation's answer: a store's bug, told
/// as the contract's `invalid` rather than a panic.
fn wrong_answer(kind: &str, operation: &str, answer: &Answer) -> StoreError {
    StoreError::Invalid(format!(
        "the {kind} store answered {operation} with {answer:?}, another operation's answer"
    ))
}

/// A write's step, its outcome with the now it was decided at.
async fn write<S: PartitionStore + ?Sized>(
    store: &S,
    partition: &str,
    operation: Operation<'_>,
    name: &str,
) -> Result<WriteReply, StoreError> {
    match store.step(partition, operation).await? {
        (Answer::Written(outcome, revision), now) => Ok(WriteReply {
            outcome,
            now,
            revision,
        }),
        (other, _) => Err(wrong_answer(store.kind(), name, &other)),
    }
}

#[async_trait]
impl<S: PartitionStore> Backend for S {
    fn kind(&self) -> &'static str {
        PartitionStore::kind(self)
    }

    async fn now(&self) -> Result<Millis, StoreError> {
        PartitionStore::now(self).await
    }

    async fn ready(&self) -> Result<(), StoreError> {
        PartitionStore::ready(self).await
    }

    fn warnings(&self) -> Vec<String> {
        PartitionStore::warnings(self)
    }

    async fn get(&self, partition: &str, key: &str) -> Result<ReadReply, StoreError> {
        let operation = Operation::Get { key: key.into() };
        match self.step(partition, operation).await? {
            (Answer::Entry(entry), now) => Ok(ReadReply { entry, now }),
            (other, _) => Err(wrong_answer(PartitionStore::kind(self), "get", &other)),
        }
    }

    async fn list(&self, partition: &str, prefix: &str) -> Result<ListReply, StoreError> {
        let operation = Operation::List {
            prefix: prefix.into(),
        };
        match self.step(partition, operation).await? {
            (Answer::Entries(entries, revision), now) => Ok(ListReply {
                entries,
                revision,
                now,
            }),
            (other, _) => Err(wrong_answer(PartitionStore::kind(self), "list", &other)),
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
        let operation = Operation::Put {
            key: key.into(),
            value: value.into(),
            ttl_ms,
            condition: Cow::Borrowed(condition),
        };
        write(self, partition, operation, "put").await
    }

    async fn delete(
        &self,
        partition: &str,
        key: &str,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let operation = Operation::Delete {
            key: key.into(),
            condition: Cow::Borrowed(condition),
        };
        write(self, partition, operation, "delete").await
    }

    async fn touch(
        &self,
        partition: &str,
        key: &str,
        ttl_ms: u64,
        condition: &Condition,
    ) -> Result<WriteReply, StoreError> {
        let operation = Operation::Touch {
            key: key.into(),
            ttl_ms,
            condition: Cow::Borrowed(condition),
        };
        write(self, partition, operation, "touch").await
    }

    async fn changes(
        &self,
        partition: &str,
        after: u64,
        max: u32,
    ) -> Result<ChangesReply, StoreError> {
        if coord_component::keys::is_unwatched(partition) {
            return Err(no_feed(partition));
        }
        match self
            .step(partition, Operation::Changes { after, max })
            .await?
        {
            (Answer::Changes(changes, revision), now) => Ok(ChangesReply {
                changes: changes?,
                revision,
                now,
            }),
            (other, _) => Err(wrong_answer(PartitionStore::kind(self), "changes", &other)),
        }
    }

    async fn meter(
        &self,
        partition: &str,
        key: &str,
        request: &MeterRequest,
    ) -> Result<MeterReply, StoreError> {
        let operation = Operation::Meter {
            key: key.into(),
            request: *request,
        };
        match self.step(partition, operation).await? {
            (Answer::Metered(reply), _) => Ok(reply),
            (other, _) => Err(wrong_answer(PartitionStore::kind(self), "meter", &other)),
        }
    }

    async fn wait(&self, partition: &str, after: u64, timeout_ms: u64) -> Result<u64, StoreError> {
        PartitionStore::wait(self, partition, after, timeout_ms).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store whose step answers a list to everything: a broken store.
    struct AnswersAList;

    #[async_trait]
    impl PartitionStore for AnswersAList {
        fn kind(&self) -> &'static str {
            "broken"
        }
        async fn now(&self) -> Result<Millis, StoreError> {
            Ok(1)
        }
        async fn step(&self, _: &str, _: Operation<'_>) -> Result<(Answer, Millis), StoreError> {
            Ok((Answer::Entries(Vec::new(), 0), 1))
        }
        async fn wait(&self, _: &str, _: u64, _: u64) -> Result<u64, StoreError> {
            Ok(0)
        }
    }

    /// A step's wrong answer is the contract's `invalid`, naming the
    /// store and the call, never a panic or a reply made up.
    #[tokio::test]
    async fn a_wrong_answer_is_an_invalid_error() {
        let store = AnswersAList;
        let error = Backend::get(&store, "p", "k").await.unwrap_err();
        let StoreError::Invalid(message) = error else {
            panic!("not invalid: {error:?}");
        };
        assert!(
            message.contains("broken") && message.contains("get"),
            "{message}"
        );
        assert!(Backend::list(&store, "p", "").await.is_ok());
    }

    /// An owned operation answers what the borrowed one answers.
    #[test]
    fn an_owned_operation_applies_as_the_borrowed_one() {
        let condition = Condition::Absent;
        let borrowed = Operation::Put {
            key: "k".into(),
            value: b"v".as_slice().into(),
            ttl_ms: Some(1000),
            condition: Cow::Borrowed(&condition),
        };
        let owned = borrowed.clone().into_owned();
        let (mut a, mut b) = (Partition::new(16), Partition::new(16));
        let (Answer::Written(first, at), Answer::Written(second, also_at)) =
            (borrowed.apply(&mut a, 5), owned.apply(&mut b, 5))
        else {
            panic!("a put answers a write");
        };
        assert_eq!((&first, at), (&second, also_at));
        let Outcome::Applied(written) = first else {
            panic!("a put of an absent key applies");
        };
        assert_eq!(written.revision, at, "the reply's revision is the put's");
    }

    /// Reads and creates need the latest state; other writes and meters
    /// may decide on a cached copy.
    #[test]
    fn reads_and_creates_need_the_latest_state() {
        let absent = Condition::Absent;
        let revision = Condition::Revision(3);
        let put = |condition| Operation::Put {
            key: "k".into(),
            value: b"".as_slice().into(),
            ttl_ms: None,
            condition: Cow::Borrowed(condition),
        };
        assert!(Operation::Get { key: "k".into() }.needs_latest());
        assert!(Operation::Changes { after: 0, max: 1 }.needs_latest());
        assert!(put(&absent).needs_latest());
        assert!(!put(&revision).needs_latest());
    }
}
