//! Ephemeral state with typed values: seed 000's `ephemeral<{ userId }>`.

use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ephemeral;

/// A space of ephemeral state whose values are `T`, stored as JSON.
#[derive(Debug, Clone)]
pub struct Space<T> {
    space: ephemeral::Space,
    values: PhantomData<fn() -> T>,
}

/// An entry of a [`Space`], its value decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry<T> {
    /// The entry's key within its tenant.
    pub key: String,
    /// The value last upserted.
    pub value: T,
    /// The revision of that upsert.
    pub revision: u64,
    /// Store time of that upsert, in Unix milliseconds.
    pub updated_at: u64,
}

/// The live entries of a tenant at one revision, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot<T> {
    /// The entries, in key order.
    pub entries: Vec<Entry<T>>,
    /// The tenant's revision: pass it to `watch` as `after`.
    pub revision: u64,
}

/// Why a [`Space`] call failed.
#[derive(Debug)]
pub enum SpaceError {
    /// The ephemeral interface's own error (`unavailable`, an invalid
    /// argument naming its field, `internal`).
    Ephemeral(ephemeral::Error),
    /// The value could not be encoded as JSON.
    Encode(String),
    /// A stored value is not a `T` (written by other code, or before a
    /// change of `T`).
    Decode {
        /// The entry's key.
        key: String,
        /// Why, from serde.
        why: String,
    },
}

impl From<ephemeral::Error> for SpaceError {
    fn from(error: ephemeral::Error) -> Self {
        SpaceError::Ephemeral(error)
    }
}

impl std::fmt::Display for SpaceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpaceError::Ephemeral(error) => write!(f, "ephemeral state: {error:?}"),
            SpaceError::Encode(why) => write!(f, "the value is not JSON: {why}"),
            SpaceError::Decode { key, why } => write!(f, "the value of {key} is unreadable: {why}"),
        }
    }
}

impl std::error::Error for SpaceError {}

impl<T: Serialize + DeserializeOwned> Space<T> {
    /// The space `id`: entries live `ttl_ms` after their last upsert or
    /// touch; an encoded value may be `max_value_bytes` long.
    pub fn new(id: impl Into<String>, ttl_ms: u64, max_value_bytes: u32) -> Self {
        Space {
            space: ephemeral::Space {
                id: id.into(),
                ttl_ms,
                max_value_bytes,
            },
            values: PhantomData,
        }
    }

    /// The space as the ephemeral interface takes it (for `watch`).
    pub fn raw(&self) -> &ephemeral::Space {
        &self.space
    }

    /// Create or replace `key` of `tenant` with `value`.
    pub fn upsert(
        &self,
        tenant: &str,
        key: &str,
        value: &T,
    ) -> Result<ephemeral::Written, SpaceError> {
        let bytes = serde_json::to_vec(value).map_err(|e| SpaceError::Encode(e.to_string()))?;
        Ok(ephemeral::upsert(&self.space, tenant, key, &bytes)?)
    }

    /// Renew `key`'s TTL; `false` when it is gone (upsert it again).
    pub fn touch(&self, tenant: &str, key: &str) -> Result<bool, SpaceError> {
        Ok(ephemeral::touch(&self.space, tenant, key)?)
    }

    /// Remove `key`; `false` when it did not exist.
    pub fn delete(&self, tenant: &str, key: &str) -> Result<bool, SpaceError> {
        Ok(ephemeral::delete(&self.space, tenant, key)?)
    }

    /// The live entries of `tenant` whose keys start with `prefix`, decoded.
    pub fn snapshot(&self, tenant: &str, prefix: Option<&str>) -> Result<Snapshot<T>, SpaceError> {
        let snapshot = ephemeral::snapshot(&self.space, tenant, prefix)?;
        let entries = snapshot
            .entries
            .into_iter()
            .map(|entry| Space::decode(&entry))
            .collect::<Result<_, _>>()?;
        Ok(Snapshot {
            entries,
            revision: snapshot.revision,
        })
    }

    /// Decode an entry a watcher or a snapshot returned.
    pub fn decode(entry: &ephemeral::Entry) -> Result<Entry<T>, SpaceError> {
        let value = serde_json::from_slice(&entry.value).map_err(|e| SpaceError::Decode {
            key: entry.key.clone(),
            why: e.to_string(),
        })?;
        Ok(Entry {
            key: entry.key.clone(),
            value,
            revision: entry.revision,
            updated_at: entry.updated_at,
        })
    }
}
