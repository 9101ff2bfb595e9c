//! What a VMM reserve holds, as its stats and tests read it.

use super::VmmReserve;
use crate::driver::DevicePtr;

impl VmmReserve {
    /// Bytes currently mapped.
    pub fn mapped(&self) -> usize {
        self.space.mapped()
    }

    /// Address reservations currently held.
    pub fn reservations(&self) -> usize {
        self.space.reservations()
    }

    /// Bytes of address space handed out with no memory behind them.
    pub fn vacant(&self) -> usize {
        self.space
            .vacant
            .iter()
            .map(|(s, e)| (e - s) as usize)
            .sum()
    }

    /// The pages (address, length) behind the segments, awake or asleep, in address order.
    pub fn pages(&self) -> Vec<(DevicePtr, usize)> {
        self.space.pages.iter().map(|(&a, p)| (a, p.len)).collect()
    }

    /// Bytes of address space still mapped to pages that moved away (`stale.rs`).
    pub fn stale(&self) -> usize {
        self.space.stale.values().map(|s| s.len).sum()
    }
}
