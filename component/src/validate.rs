//! Argument checks shared by every interface: each failure names the field
//! as it is spelled in the WIT, so a caller knows exactly what to fix.

/// The longest id (a lock's or a space's name), in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// The longest resource, tenant or key, in bytes.
pub const MAX_NAME_BYTES: usize = 1024;
/// The longest TTL any primitive accepts: one day, in milliseconds.
pub const MAX_TTL_MS: u64 = 86_400_000;

/// The longest any call may block waiting, in milliseconds (ten minutes).
pub const MAX_WAIT_MS: u64 = 600_000;

/// Implement, for one interface's generated `error` variant and
/// `invalid-argument` record, the conversions from [`Invalid`] and from a
/// store error. Every exported interface has the same three error cases.
macro_rules! interface_errors {
    ($error:ident, $invalid:ident) => {
        impl From<$crate::validate::Invalid> for $error {
            fn from(invalid: $crate::validate::Invalid) -> Self {
                $error::InvalidArgument($invalid {
                    field: invalid.field,
                    reason: invalid.reason,
                })
            }
        }

        impl From<$crate::store::StoreError> for $error {
            fn from(error: $crate::store::StoreError) -> Self {
                use $crate::store::StoreError;
                match error {
                    StoreError::Unavailable(why) => $error::Unavailable(why),
                    StoreError::HistoryGone(_) => $error::Internal(
                        "the store answered with an unexpected history-gone".into(),
                    ),
                    StoreError::Invalid(why) => {
                        $error::Internal(format!("the store rejected a request: {why}"))
                    }
                }
            }
        }
    };
}
pub(crate) use interface_errors;

/// A rejected argument: the field's WIT name and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The argument's name as the WIT spells it.
    pub field: String,
    /// Why it was rejected.
    pub reason: String,
}

impl Invalid {
    /// A rejection of `field` for `reason`.
    pub fn new(field: &str, reason: impl Into<String>) -> Self {
        Invalid {
            field: field.to_string(),
            reason: reason.into(),
        }
    }
}

/// A non-empty name of at most `max` bytes.
pub fn name(field: &str, value: &str, max: usize) -> Result<(), Invalid> {
    if value.is_empty() {
        return Err(Invalid::new(field, "must not be empty"));
    }
    if value.len() > max {
        return Err(Invalid::new(
            field,
            format!("is {} bytes; the limit is {max}", value.len()),
        ));
    }
    Ok(())
}

/// A number in `min..=max`.
pub fn in_range(field: &str, value: u64, min: u64, max: u64) -> Result<(), Invalid> {
    if value < min || value > max {
        return Err(Invalid::new(
            field,
            format!("is {value}; it must be between {min} and {max}"),
        ));
    }
    Ok(())
}

/// A TTL: at least 1 ms, at most [`MAX_TTL_MS`].
pub fn ttl(field: &str, value: u64) -> Result<(), Invalid> {
    in_range(field, value, 1, MAX_TTL_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ranges_are_checked_and_the_field_is_named() {
        assert_eq!(name("id", "x", 4), Ok(()));
        assert_eq!(name("id", "", 4).map_err(|e| e.field), Err("id".into()));
        assert!(name("id", "xxxxx", 4).is_err());
        assert_eq!(ttl("ttl-ms", 0).map_err(|e| e.field), Err("ttl-ms".into()));
        assert!(ttl("ttl-ms", MAX_TTL_MS).is_ok());
        assert!(ttl("ttl-ms", MAX_TTL_MS + 1).is_err());
    }
}
