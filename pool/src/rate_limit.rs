//! Rate-limiting a repeated warning: it is logged the 1st, 2nd, 4th, 8th, ... time, so a loop
//! that keeps failing does not flood the log while a first occurrence is never lost.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts occurrences of one event. See the module docs.
#[derive(Debug, Default)]
pub struct Doubling(AtomicU64);

impl Doubling {
    /// A counter at zero (usable in a `static`).
    pub const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Counts one occurrence; returns the count when this one should be logged.
    pub fn due(&self) -> Option<u64> {
        let n = self.0.fetch_add(1, Ordering::Relaxed) + 1;
        n.is_power_of_two().then_some(n)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn logs_at_powers_of_two() {
        let d = super::Doubling::new();
        let logged: Vec<u64> = (0..20).filter_map(|_| d.due()).collect();
        assert_eq!(logged, [1, 2, 4, 8, 16]);
    }
}
