//! Stale mappings: the old address of a page the pool moved while the device may still be
//! using it there.
//!
//! A page in a hole was freed by its block, but kernels queued before that free may not have
//! run yet, and unmapping the page under them would fault. Waiting for them (a synchronize)
//! stalls the allocating thread until the GPU drains its queue, once per backing that recycles
//! (1,289 times in the Phi-3 prefill trace). So a move maps the page's memory at its new address
//! *as well* ([`crate::driver::Driver::alias`]) and leaves the old mapping in place: the queued
//! kernels still reach the memory through it, and the new block's kernels, queued after them on
//! the pool's stream, use it only once they are done. The old mapping is dropped
//! ([`crate::driver::Driver::unalias`]) once the device is known to be past it: a synchronize
//! that began after the move has finished ([`crate::driver::SyncEpoch::idle_since`]).
//!
//! A stale mapping holds address space, not memory. Its range counts as vacant (the placement
//! may put a block there, and [`AddressSpace::back`] then drops it first, which the pool core
//! makes safe with a synchronize if it is still busy), and the pool's memory counts its page
//! once, where it lives. Memory is given back only once no stale mapping of it is left, so
//! every path that releases a page drops its stale mappings first, and refuses while they
//! are busy.

use super::space::{AddressSpace, Stale};
use crate::driver::{CallKind, DevicePtr, Driver, DriverError, ErrorCode, PhysHandle, SyncEpoch};
use crate::stats::DriverCalls;

impl AddressSpace {
    /// Records that the page of `len` bytes with `handle` moved away from `at`, still mapped
    /// there. Its range is vacant for the placement from now on.
    pub(super) fn add_stale(&mut self, at: DevicePtr, len: usize, handle: PhysHandle, epoch: u64) {
        self.stale.insert(at, Stale { len, handle, epoch });
        self.stale_of.entry(handle).or_default().push(at);
        self.stale_queue.push_back((epoch, len));
        self.busy_stale += len;
    }

    /// Bytes of stale mappings the device may still use. Moves happen in epoch order, so the
    /// idle ones are a prefix of the queue.
    pub(super) fn busy_stale(&mut self, epoch: &SyncEpoch) -> usize {
        while let Some(&(e, len)) = self.stale_queue.front() {
            if !epoch.idle_since(e) {
                break;
            }
            self.stale_queue.pop_front();
            self.busy_stale -= len;
        }
        self.busy_stale
    }

    /// The stale mappings that overlap `[from, to)`. Asked for every place the placement
    /// weighs, so it allocates nothing.
    fn stale_in(
        &self,
        from: DevicePtr,
        to: DevicePtr,
    ) -> impl Iterator<Item = (DevicePtr, Stale)> + '_ {
        let first = self
            .stale
            .range(..from)
            .next_back()
            .filter(|(&at, s)| at + s.len as u64 > from)
            .map(|(&at, &s)| (at, s));
        first
            .into_iter()
            .chain(self.stale.range(from..to).map(|(&at, &s)| (at, s)))
    }

    /// Bytes of `[from, to)` under stale mappings the device may still use.
    pub(super) fn busy_stale_in(&self, epoch: &SyncEpoch, from: DevicePtr, to: DevicePtr) -> usize {
        self.stale_in(from, to)
            .filter(|(_, s)| !epoch.idle_since(s.epoch))
            .map(|(at, s)| (to.min(at + s.len as u64) - from.max(at)) as usize)
            .sum()
    }

    /// Drops the stale mappings that overlap `[from, to)`, so memory can be mapped there.
    /// Refused, with nothing dropped, while one of them may still be in use.
    pub(super) fn clear_stale(
        &mut self,
        driver: &dyn Driver,
        from: DevicePtr,
        to: DevicePtr,
        calls: &mut DriverCalls,
    ) -> Result<(), DriverError> {
        let hit = self.stale_in(from, to).map(|(at, _)| at).collect();
        self.drop_all(driver, hit, calls)
    }

    /// Drops every stale mapping of `handle`'s memory, so releasing it gives the memory back.
    /// Refused, with nothing dropped, while one of them may still be in use.
    pub(super) fn clear_stale_of(
        &mut self,
        driver: &dyn Driver,
        handle: PhysHandle,
        calls: &mut DriverCalls,
    ) -> Result<(), DriverError> {
        let Some(ats) = self.stale_of.get(&handle) else {
            return Ok(());
        };
        let ats = ats.clone();
        self.drop_all(driver, ats, calls)
    }

    fn drop_all(
        &mut self,
        driver: &dyn Driver,
        ats: Vec<DevicePtr>,
        calls: &mut DriverCalls,
    ) -> Result<(), DriverError> {
        let epoch = driver.epoch();
        if let Some((&at, s)) = ats
            .iter()
            .filter_map(|at| self.stale.get_key_value(at))
            .find(|(_, s)| !epoch.idle_since(s.epoch))
        {
            return Err(DriverError::new(
                CallKind::Unmap,
                ErrorCode::InvalidValue,
                format!(
                    "the {} bytes at {at:#x} moved away while the device may still use them there; unmapping them needs a synchronize first",
                    s.len
                ),
            ));
        }
        for at in ats {
            let Some(s) = self.stale.get(&at).copied() else {
                continue;
            };
            driver.unalias(at, s.len)?;
            calls.record(CallKind::Unmap);
            self.stale.remove(&at);
            if let Some(list) = self.stale_of.get_mut(&s.handle) {
                list.retain(|&p| p != at);
                if list.is_empty() {
                    self.stale_of.remove(&s.handle);
                }
            }
        }
        Ok(())
    }

    /// [`AddressSpace::unbacked`], or `usize::MAX` where the device may still use a stale
    /// mapping: a block placed there would wait for a synchronize, and growing costs less.
    pub(super) fn unbacked_now(&self, epoch: &SyncEpoch, at: DevicePtr, len: usize) -> usize {
        // Stale mappings lie in vacant ranges: a range with memory behind every byte (most of
        // the lanes a large block weighs) has none to look up.
        let n = self.unbacked(at, len);
        #[cfg(feature = "check")]
        assert!(
            n > 0 || self.busy_stale_in(epoch, at, at + len as u64) == 0,
            "a stale mapping outside the vacant ranges at {at:#x}"
        );
        match n {
            0 => 0,
            n if self.busy_stale_in(epoch, at, at + len as u64) == 0 => n,
            _ => usize::MAX,
        }
    }

    /// Whether backing `[at, at+len)` waits for a synchronize: a stale mapping there may still
    /// be in use, or busy ones cover more than a quarter of the memory held (and `floor`).
    /// Without that bound they pile up as address space the pool cannot reuse until some
    /// synchronize happens. Measured on the PyTorch prefill traces with 2% free kept
    /// ([`super::VmmConfig::recycle_free`]): with the quarter, Phi-3 synchronizes 21 times in
    /// its 20,000 tokens and maps 1.020 times its live peak (Llama-3: 4 times, 1.025); bounded
    /// by all the memory held, 8 and 0 times for 1.023 and 1.028; by an eighth, 32 and 10 times
    /// for 1.020 and 1.025.
    pub(super) fn must_wait(
        &mut self,
        epoch: &SyncEpoch,
        at: DevicePtr,
        len: usize,
        floor: usize,
    ) -> bool {
        self.busy_stale_in(epoch, at, at + len as u64) > 0
            || self.busy_stale(epoch) > (self.held / 4).max(floor)
    }

    /// Whether a stale mapping lies inside `[from, to)`.
    pub(super) fn has_stale_in(&self, from: DevicePtr, to: DevicePtr) -> bool {
        self.stale_in(from, to).next().is_some()
    }
}
