//! Upstreams: where a pool's memory comes from.
//!
//! An upstream turns requests for segments into driver calls and counts every call it makes.
//! It keeps no blocks and no statistics beyond those counts; the pool core calls it under its
//! lock, only on the slow paths (growth, release).
//!
//! - [`device::DeviceMalloc`]: `cuMemAlloc` / `cuMemFree`;
//! - [`managed::ManagedMalloc`]: `cuMemAllocManaged`, admitted against the device's
//!   [`crate::driver::ManagedLedger`], so managed memory stays within the device's free memory
//!   across every pool and the fallback unless oversubscription is allowed;
//! - [`vmm::VmmReserve`]: address reservations, physical memory mapped at the end of the last
//!   with an adaptive growth, unmapped from the end; a further reservation when one is full;
//! - [`vmm_each::VmmEach`]: one VMM allocation per segment, as `ncclMemAlloc` makes them.

pub mod device;
pub mod managed;
pub mod vmm;
pub mod vmm_each;

use crate::driver::{Driver, DriverError};
use crate::placement::Segment;
use crate::stats::DriverCalls;
use std::fmt;
use std::sync::Arc;

/// What a growth asks the upstream for: the placement's [`Placement::grow_request`] and
/// [`Placement::grow_alone`].
///
/// [`Placement::grow_request`]: crate::placement::Placement::grow_request
/// [`Placement::grow_alone`]: crate::placement::Placement::grow_alone
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grow {
    /// Bytes enough when the new segment starts where the last one ends.
    pub extend: usize,
    /// Bytes needed when it starts anywhere else (at least `extend`).
    pub alone: usize,
}

/// Where a pool's memory comes from. See the module docs.
pub trait Upstream: Send + fmt::Debug + 'static {
    /// Whether [`Upstream::release`] waits for the work queued on the device first, as
    /// `cuMemFree` does. Only such an upstream may release a block the moment it is freed.
    const RELEASE_WAITS: bool;

    /// The driver it calls.
    fn driver(&self) -> &Arc<dyn Driver>;

    /// A copy of the upstream's state, for a pool's snapshot ([`crate::PoolSnapshot`]);
    /// `None` where it keeps none.
    fn copy_state(&self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }

    /// Whether [`Upstream::copy_state`] would copy the state now (nothing on its way that a
    /// copy, or a restore over it, would lose).
    fn keeps_state(&self) -> bool {
        false
    }

    /// A new segment for `want`: of at least `want.extend` bytes if it starts where the last
    /// segment ends, else of at least `want.alone` bytes.
    fn acquire(&mut self, want: Grow, calls: &mut DriverCalls) -> Result<Segment, DriverError>;

    /// A segment of `len` bytes of address space apart from the others, for a placement that
    /// keeps some blocks by themselves ([`crate::placement::Placement::apart`]): memory goes
    /// behind it only where blocks land, and [`Upstream::release`] takes it back in any order.
    /// The default has none to give.
    fn acquire_apart(
        &mut self,
        len: usize,
        calls: &mut DriverCalls,
    ) -> Result<Segment, DriverError> {
        let _ = calls;
        Err(DriverError::new(
            crate::driver::CallKind::Reserve,
            crate::driver::ErrorCode::NotSupported,
            format!("this upstream has no address space apart from its segments to give ({len} bytes asked)"),
        ))
    }

    /// For a segment from [`Upstream::acquire_apart`]: the bytes of memory behind it (what its
    /// release gives back; its length is address space). `None` for any other segment, whose
    /// releases go in the placement's order. The default hands out none apart.
    fn apart_held(&self, seg: &Segment) -> Option<usize> {
        let _ = seg;
        None
    }

    /// Whether `[addr, addr+len)`, inside a segment, has memory behind every byte. An upstream
    /// whose segments are address space first (VMM) says no where it has none yet; the core
    /// then calls [`Upstream::back`] before the block is handed out. Asked on the fast path.
    #[inline]
    fn backed(&self, addr: u64, len: usize) -> bool {
        let _ = (addr, len);
        true
    }

    /// Puts memory behind `[addr, addr+len)` where it has none, first moving pages that lie
    /// wholly inside the free ranges `donors` (address, length; empty: none may move). `idle`:
    /// a synchronize covers the donors' frees; without one, a moved page must stay reachable
    /// at its old address until the device is past the work queued there. The core calls this
    /// only where [`Upstream::must_wait`] says no (or after a synchronize). On error the range
    /// may be partly backed; nothing is lost.
    fn back(
        &mut self,
        addr: u64,
        len: usize,
        donors: &[(u64, usize)],
        idle: bool,
        calls: &mut DriverCalls,
    ) -> Result<(), DriverError> {
        let _ = (addr, len, donors, idle, calls);
        Ok(())
    }

    /// Whether backing `[addr, addr+len)` must wait for a synchronize first: an old mapping of
    /// a moved page there may still be in use, or such mappings hold more address space than
    /// the upstream holds memory.
    fn must_wait(&mut self, addr: u64, len: usize) -> bool {
        let _ = (addr, len);
        false
    }

    /// Releases every page lying wholly inside `unused` (address, length: free ranges and the
    /// range of a block not yet handed out, none of it in use after a synchronize); the bytes
    /// given back. The core's last resort when backing a block ran out of memory while pages
    /// too long to move, or straddling the block's edge, held what it needed.
    fn shed(&mut self, unused: &[(u64, usize)], calls: &mut DriverCalls) -> usize {
        let _ = (unused, calls);
        0
    }

    /// Whether `seg` has no memory behind it at all (a growth whose backing failed).
    fn wholly_vacant(&self, seg: &Segment) -> bool {
        let _ = seg;
        false
    }

    /// Bytes of `[addr, addr+len)` with no memory behind them (0 where segments are held
    /// whole); `usize::MAX` where backing them would wait for the device
    /// ([`Upstream::must_wait`]).
    fn unbacked(&self, addr: u64, len: usize) -> usize {
        let _ = (addr, len);
        0
    }

    /// Whether [`Upstream::back`] recycles pages from free ranges at all.
    fn recycles(&self) -> bool {
        false
    }

    /// Whether a block that needs memory should have free pages moved to it rather than new
    /// memory created, with `cached` of the `reserved` bytes free in the pool.
    fn worth_recycling(&self, cached: usize, reserved: usize) -> bool {
        let _ = (cached, reserved);
        false
    }

    /// Whether some page lies wholly inside `donors` and could be moved: only then is a
    /// synchronize worth paying.
    /// The core asks only when the pool's free memory is worth recycling.
    fn movable(&mut self, donors: &[(u64, usize)]) -> bool {
        let _ = donors;
        false
    }

    /// Bytes of memory the upstream holds behind its segments, where that is not their length
    /// (segments with vacant ranges); `None`: every segment is held whole. The core counts
    /// this as reserved.
    fn held(&self) -> Option<usize> {
        None
    }

    /// Puts memory behind `[addr, addr+len)` ahead of need, off the calling thread where the
    /// upstream can (a VMM pool's worker: `vmm/ahead.rs`); until it is taken in
    /// ([`Upstream::collect_ahead`]) the range counts as backed in [`Upstream::unbacked`] and
    /// as vacant in [`Upstream::backed`]. Best effort: a failure leaves the range vacant.
    fn back_ahead(&mut self, addr: u64, len: usize, calls: &mut DriverCalls) {
        let _ = (addr, len, calls);
    }

    /// Takes in the memory [`Upstream::back_ahead`] finished (all of it, waiting, with
    /// `wait`); whether any came in (the core then counts it as reserved).
    fn collect_ahead(&mut self, wait: bool, calls: &mut DriverCalls) -> bool {
        let _ = (wait, calls);
        false
    }

    /// Returns `seg`. On error the upstream still holds it and it may be released again later.
    fn release(&mut self, seg: Segment, calls: &mut DriverCalls) -> Result<(), DriverError>;

    /// Memory the upstream could not give back while undoing a failed acquire or release: still
    /// held on the device, in no block. The core counts each as reserved and releases it with
    /// the releases the driver refused (at the next purge). Each is handed out once.
    fn take_leftovers(&mut self) -> Vec<Segment> {
        Vec::new()
    }

    /// A block was freed (the VMM upstream's growth starts small again).
    #[inline]
    fn note_free(&mut self) {}

    /// Whether [`Upstream::sleep`] and [`Upstream::wake`] work: the memory can be released and
    /// brought back at the same addresses (VMM only).
    const CAN_SLEEP: bool = false;

    /// Releases the physical memory behind every segment and keeps the addresses, copying it
    /// to host memory first if `offload`. Only called when [`Upstream::CAN_SLEEP`], after a
    /// synchronize.
    fn sleep(
        &mut self,
        offload: bool,
        calls: &mut DriverCalls,
    ) -> Result<crate::pool::Moved, DriverError> {
        let _ = (offload, calls);
        Ok(crate::pool::Moved::default())
    }

    /// Maps physical memory again behind every segment [`Upstream::sleep`] released, at the
    /// same addresses, and restores what it offloaded.
    fn wake(&mut self, calls: &mut DriverCalls) -> Result<crate::pool::Moved, DriverError> {
        let _ = calls;
        Ok(crate::pool::Moved::default())
    }

    /// Bytes of segments asleep now.
    fn asleep_bytes(&self) -> usize {
        0
    }

    /// Gives back host memory kept for the next sleep's offload; returns its bytes.
    fn drop_host_buffers(&mut self) -> usize {
        0
    }

    /// Releases what the upstream holds of its own, once every segment is back.
    fn close(&mut self, _calls: &mut DriverCalls) -> Result<(), DriverError> {
        Ok(())
    }
}
