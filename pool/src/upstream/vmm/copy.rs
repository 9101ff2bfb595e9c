//! A copy of the reserve's state for a pool's snapshot ([`crate::PoolSnapshot`]): its address
//! space and pages as bookkeeping (the device's side is the simulated device's snapshot).
//! Nothing may be on its way: no worker started to make pages ahead (its pages and thread are
//! not copied), no contents offloaded by a sleep (host buffers are not copied).

use super::ahead::InFlight;
use super::space::AddressSpace;
use super::VmmReserve;

impl VmmReserve {
    /// Whether nothing is on its way (see the module docs).
    pub(super) fn copyable(&self) -> bool {
        self.in_flight.is_idle() && self.space.copies.is_empty() && self.space.spares.is_empty()
    }

    /// A copy of the reserve, if nothing is on its way (see the module docs).
    pub(super) fn copied(&self) -> Option<Self> {
        if !self.copyable() {
            return None;
        }
        Some(Self {
            driver: self.driver.clone(),
            config: self.config.clone(),
            granularity: self.granularity,
            reserve_len: self.reserve_len,
            space: self.space.copied()?,
            streak: self.streak,
            granular: self.granular,
            page: self.page,
            fresh: self.fresh,
            in_flight: InFlight::default(),
        })
    }
}

impl AddressSpace {
    /// A copy of the bookkeeping, if no sleep left host copies.
    fn copied(&self) -> Option<Self> {
        if !self.copies.is_empty() || !self.spares.is_empty() {
            return None;
        }
        Some(Self {
            reservations: self.reservations.clone(),
            segs: self.segs.clone(),
            apart: self.apart.clone(),
            pages: self.pages.clone(),
            held: self.held,
            vacant: self.vacant.clone(),
            copies: Vec::new(),
            spares: Vec::new(),
            stale: self.stale.clone(),
            stale_of: self.stale_of.clone(),
            stale_queue: self.stale_queue.clone(),
            busy_stale: self.busy_stale,
        })
    }
}
