//! A configuration value outside what it accepts.
//!
//! Every configuration struct of this crate is checked when it is used, and a bad value is this
//! error, naming the field, the value and the accepted range; nothing panics on a setting.
//! It is a leaf (it imports nothing of the crate), so every layer can return it and
//! [`crate::PoolError`] wraps it.

use std::fmt;

/// See the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InvalidConfig {
    /// The field or variable, as the user wrote it (`LegacyConfig::slots`, `GGML_POOL`).
    pub field: &'static str,
    /// The value given.
    pub value: String,
    /// What is accepted.
    pub accepted: String,
}

impl InvalidConfig {
    /// Builds the error.
    pub fn new(field: &'static str, value: impl fmt::Debug, accepted: impl Into<String>) -> Self {
        Self {
            field,
            value: format!("{value:?}"),
            accepted: accepted.into(),
        }
    }

    /// Checks `lo <= value <= hi`.
    pub(crate) fn range(
        field: &'static str,
        value: usize,
        lo: usize,
        hi: usize,
    ) -> Result<(), Self> {
        if (lo..=hi).contains(&value) {
            Ok(())
        } else {
            Err(Self::new(field, value, format!("{lo} to {hi}")))
        }
    }
}

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={} is not valid: accepted values are {}",
            self.field, self.value, self.accepted
        )
    }
}

impl std::error::Error for InvalidConfig {}
