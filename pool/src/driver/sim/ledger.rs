//! The simulated device's ledger: every call counted by kind, optionally logged, and a
//! summary of what is alive, so tests can assert call counts and that nothing leaked.

use super::{SimDevice, MAX_CAPACITY};
use crate::driver::CallKind;
use crate::invalid::InvalidConfig;
use std::sync::atomic::Ordering;

/// One logged driver call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRecord {
    /// Which primitive.
    pub kind: CallKind,
    /// The size argument, where the call has one.
    pub bytes: usize,
    /// Whether it succeeded.
    pub ok: bool,
}

/// What is alive on the device right now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Device bytes in use (mallocs plus mapped physical memory).
    pub device_bytes: usize,
    /// Managed bytes in use.
    pub managed_bytes: usize,
    /// Live `malloc` allocations.
    pub allocations: usize,
    /// Live managed allocations.
    pub managed_allocations: usize,
    /// Live address reservations.
    pub reservations: usize,
    /// Live physical mappings.
    pub mappings: usize,
}

impl Ledger {
    /// Whether nothing at all is held on the device.
    pub fn is_empty(&self) -> bool {
        *self == Ledger::default()
    }
}

/// Call counts and the call log.
#[derive(Clone, Debug, Default)]
pub(super) struct Calls {
    counts: [u64; CallKind::ALL.len()],
    log: Vec<CallRecord>,
    record: bool,
}

impl Calls {
    pub fn new(record: bool) -> Self {
        Self {
            record,
            ..Self::default()
        }
    }

    /// Counts (and logs) a call, taken as successful until [`Calls::failed`].
    pub fn enter(&mut self, kind: CallKind, bytes: usize) {
        self.counts[kind as usize] += 1;
        if self.record {
            self.log.push(CallRecord {
                kind,
                bytes,
                ok: true,
            });
        }
    }

    /// Marks the last call as failed.
    pub fn failed(&mut self) {
        if let Some(last) = self.log.last_mut() {
            last.ok = false;
        }
    }

    pub fn count(&self, kind: CallKind) -> u64 {
        self.counts[kind as usize]
    }

    pub fn log(&self) -> &[CallRecord] {
        &self.log
    }
}

impl SimDevice {
    /// How many calls of `kind` were made.
    pub fn calls(&self, kind: CallKind) -> u64 {
        self.state.lock().calls.count(kind)
    }

    /// The log of every call so far (empty if `record_calls` is off).
    pub fn call_log(&self) -> Vec<CallRecord> {
        self.state.lock().calls.log().to_vec()
    }

    /// What is alive on the device.
    pub fn ledger(&self) -> Ledger {
        self.state.lock().memory.ledger()
    }

    /// The device memory it has: its configuration's capacity until [`SimDevice::set_capacity`].
    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Gives the card `bytes` of device memory from now on (up to [`MAX_CAPACITY`]): a dry run
    /// goes on from a snapshot in another room. What is allocated stays, even above it: the
    /// next allocation fails then.
    pub fn set_capacity(&self, bytes: usize) -> Result<(), InvalidConfig> {
        InvalidConfig::range("SimDevice::set_capacity", bytes, 0, MAX_CAPACITY)?;
        self.capacity.store(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// The most device memory it held at once (a snapshot keeps and restores it).
    pub fn device_peak(&self) -> usize {
        self.state.lock().memory.device_peak
    }

    /// The least capacity in which one of the device allocations it refused would have
    /// succeeded (`None`: it refused none; a snapshot keeps and restores it): a run goes the
    /// same way in any capacity below it.
    pub fn failed_below(&self) -> Option<usize> {
        self.state.lock().memory.failed_below
    }
}
