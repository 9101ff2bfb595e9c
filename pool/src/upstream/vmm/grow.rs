//! Growth into a further reservation.

use super::space::Tail;
use super::VmmReserve;
use crate::driver::{DevicePtr, DriverError};
use crate::placement::Segment;
use crate::stats::DriverCalls;

impl VmmReserve {
    /// A further reservation of at least `need` bytes, at `hint` if the driver places it
    /// there. A size the driver refused is not asked for again.
    #[cold]
    pub(super) fn reserve(
        &mut self,
        need: usize,
        hint: DevicePtr,
        calls: &mut DriverCalls,
    ) -> Result<(DevicePtr, usize), DriverError> {
        let driver = self.driver.clone();
        let (base, len) = self.space.reserve(
            driver.as_ref(),
            self.reserve_len,
            need,
            hint,
            self.granularity,
            calls,
        )?;
        if len < self.reserve_len {
            tracing::info!(
                refused = self.reserve_len,
                reserved = len,
                "the driver refused a vmm reservation of the configured size; later ones are smaller too"
            );
            self.reserve_len = len;
        }
        Ok((base, len))
    }

    /// Grows into a further reservation: right after `tail`'s if the driver places it there,
    /// continuing the last segment (so it needs only what the last one lacks, which matters
    /// where address space is scarce); else anywhere, holding `alone` bytes by itself.
    #[cold]
    pub(super) fn grow_further(
        &mut self,
        tail: Tail,
        extend: usize,
        alone: usize,
        calls: &mut DriverCalls,
    ) -> Result<Segment, DriverError> {
        let driver = self.driver.clone();
        let least = if tail.extends {
            extend - tail.room
        } else {
            alone
        };
        let (mut base, mut len) = self.reserve(least, tail.end, calls)?;
        let contiguous = base == tail.end && tail.extends;
        if !contiguous && len < alone {
            // Placed elsewhere, and too small to hold the request by itself.
            self.space.drop_empty_tail(driver.as_ref());
            (base, len) = self.reserve(alone, 0, calls)?;
        }
        let result = if contiguous {
            let want = self.preferred(extend, tail.room + len);
            self.space.claim(tail.at, want)
        } else {
            let want = self.preferred(alone, len);
            self.space.claim(base, want)
        };
        if result.is_err() {
            // Leave the address space as it was.
            self.space.drop_empty_tail(driver.as_ref());
        }
        result
    }
}
