//! State that every user of one device shares, whichever driver object it reaches it through.
//!
//! Wrapping drivers ([`super::limit::LimitedDriver`], [`super::fault::FaultInjector`]) hand out
//! the state of the driver they wrap, so every pool on a device, however it is wrapped, counts
//! against the same synchronize epoch and the same managed-memory ledger.

use super::{CallKind, DriverError, ErrorCode};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_EPOCH_ID: AtomicU64 = AtomicU64::new(1);

/// A device's synchronize counter (see [`crate::sync`]).
#[derive(Debug)]
pub struct SyncEpoch {
    id: u64,
    counter: AtomicU64,
    /// The epoch of the latest synchronize that finished: what was freed before it is idle.
    completed: AtomicU64,
}

impl SyncEpoch {
    fn new() -> Self {
        Self {
            id: NEXT_EPOCH_ID.fetch_add(1, Ordering::Relaxed),
            counter: AtomicU64::new(0),
            completed: AtomicU64::new(0),
        }
    }

    /// The current epoch: buffers freed now are stamped with it.
    #[inline]
    pub fn current(&self) -> u64 {
        self.counter.load(Ordering::Acquire)
    }

    /// This counter's identity (tokens carry it, so a token only fits its own device).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether a buffer freed at epoch `freed_at` is certainly idle: a synchronize that began
    /// after its free has finished (by any pool on the device), so no token is needed.
    #[inline]
    pub fn idle_since(&self, freed_at: u64) -> bool {
        freed_at < self.completed.load(Ordering::Acquire)
    }

    /// (current, completed): what a simulated device's snapshot keeps.
    pub(crate) fn values(&self) -> (u64, u64) {
        (self.current(), self.completed.load(Ordering::Acquire))
    }

    /// Puts the counter back to `values` (a simulated device's restore).
    pub(crate) fn set(&self, (current, completed): (u64, u64)) {
        self.counter.store(current, Ordering::Release);
        self.completed.store(completed, Ordering::Release);
    }

    /// Records that the synchronize of `epoch` (from [`SyncEpoch::advance`]) finished.
    pub(crate) fn finished(&self, epoch: u64) {
        self.completed.fetch_max(epoch, Ordering::AcqRel);
    }

    /// Moves to the next epoch and returns it.
    pub(crate) fn advance(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::AcqRel) + 1
    }
}

/// Managed memory handed out on one device, by every pool and adaptor together.
///
/// Managed memory lives on the host until it is touched, so the device's free memory does not
/// shrink when it is allocated: a check per request would let many requests together go far
/// beyond the card. Every managed allocation is admitted here first, against the device's free
/// memory less what is already outstanding; oversubscription happens only when the caller
/// allows it explicitly, since on a real GPU it can hang the device for everyone.
#[derive(Debug, Default)]
pub struct ManagedLedger {
    outstanding: Mutex<usize>,
}

impl ManagedLedger {
    /// Managed bytes admitted and not yet released.
    pub fn outstanding(&self) -> usize {
        *self.outstanding.lock()
    }

    /// Admits `bytes`: with `allow_oversubscription` off, only while everything outstanding plus
    /// `bytes` fits in `headroom()` (the device's free memory). The check and the count are one
    /// step, so concurrent requests cannot pass it together.
    pub fn admit(
        &self,
        bytes: usize,
        allow_oversubscription: bool,
        headroom: impl FnOnce() -> Result<usize, DriverError>,
    ) -> Result<(), DriverError> {
        let mut out = self.outstanding.lock();
        if !allow_oversubscription {
            let free = headroom()?;
            let fits = out.checked_add(bytes).is_some_and(|total| total <= free);
            if !fits {
                return Err(DriverError::new(
                    CallKind::MallocManaged,
                    ErrorCode::OutOfMemory,
                    format!(
                        "refused: {bytes} managed bytes on top of {} already outstanding exceed the device's {free} free bytes, and oversubscription is not allowed",
                        *out
                    ),
                ));
            }
        }
        *out = out.saturating_add(bytes);
        Ok(())
    }

    /// Returns `bytes` admitted earlier (after their free, or when the allocation failed).
    pub fn release(&self, bytes: usize) {
        let mut out = self.outstanding.lock();
        *out = out.saturating_sub(bytes);
    }
}

/// What every user of a device shares: see the module docs. Each driver that talks to a device
/// owns one; wrappers return the one of the driver they wrap.
#[derive(Debug)]
pub struct DeviceShared {
    /// The synchronize counter.
    pub epoch: SyncEpoch,
    /// Managed memory outstanding on the device.
    pub managed: ManagedLedger,
}

impl DeviceShared {
    /// Fresh state for a device.
    pub fn new() -> Self {
        Self {
            epoch: SyncEpoch::new(),
            managed: ManagedLedger::default(),
        }
    }
}

impl Default for DeviceShared {
    fn default() -> Self {
        Self::new()
    }
}
