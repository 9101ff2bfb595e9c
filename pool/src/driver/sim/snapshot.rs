//! The simulated device's state at one point, to go back to: with a pool's
//! ([`crate::PoolSnapshot`]), a dry run tries several continuations from one point.

use super::{SimDevice, State};

/// The device's ledger, call counts, address space and synchronize epoch at one point
/// ([`SimDevice::snapshot`]).
#[derive(Debug)]
pub struct SimSnapshot(State, (u64, u64));

impl SimDevice {
    /// The device's state now, for [`SimDevice::restore`]; `None` for a device backed by host
    /// memory (its addresses are real memory, which a copy would alias).
    pub fn snapshot(&self) -> Option<SimSnapshot> {
        let s = self.state.lock();
        let state = State {
            calls: s.calls.clone(),
            memory: s.memory.clone(),
            backing: s.backing.copy_fake()?,
        };
        // Pools stamp frees with the epoch and read what a synchronize made idle from it.
        Some(SimSnapshot(state, self.shared.epoch.values()))
    }

    /// Puts the device back in the state `snapshot` took: what was allocated, mapped or
    /// reserved since is forgotten, with the calls counted since. The pools on it must be put
    /// back to the same point ([`crate::Pool::restore`]). A snapshot whose device had other
    /// addresses (one backed by host memory) is refused: `false`.
    pub fn restore(&self, snapshot: &SimSnapshot) -> bool {
        let Some(backing) = snapshot.0.backing.copy_fake() else {
            return false;
        };
        let mut s = self.state.lock();
        if !s.backing.is_fake() {
            return false;
        }
        *s = State {
            calls: snapshot.0.calls.clone(),
            memory: snapshot.0.memory.clone(),
            backing,
        };
        self.shared.epoch.set(snapshot.1);
        true
    }
}
