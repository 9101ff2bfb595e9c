//! Placement strategies: where in the memory a pool holds a request goes.
//!
//! A placement deals only in addresses and sizes. It makes no driver call, takes no lock and
//! keeps no statistics: the pool core ([`crate::core`]) does all of that once for every
//! placement, and asks the upstream ([`crate::upstream`]) for memory when the placement has no
//! room. So a placement can be tested, and compared with ggml decision by decision, on numbers
//! alone.
//!
//! - [`slots::Slots`]: ggml's legacy pool, a fixed table of idle buffers searched best-fit;
//! - [`bump::Bump`]: the VMM pool, one contiguous range with a bump pointer and indexed holes;
//! - [`caching::Caching`]: PyTorch's caching allocator, to show what it would reserve;
//! - [`direct::Direct`]: nothing cached; every request is its own segment (the managed
//!   fallback);
//! - [`lanes::Lanes`]: over another placement, address space of its own for each tensor that
//!   grows by replacement (a KV cache concatenated every chunk).

pub mod bump;
pub mod caching;
pub mod direct;
pub mod lanes;
pub mod slots;

use crate::pool::Purge;
use std::fmt;

/// A piece of memory an upstream handed out: what the placement carves blocks from, and what
/// goes back to the upstream whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Its device address.
    pub ptr: u64,
    /// Its length in bytes.
    pub len: usize,
    /// The upstream's own handle for it (the physical allocation of a VMM mapping), opaque here.
    pub handle: u64,
}

/// Where a request was placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    /// The block's address.
    pub addr: u64,
    /// Bytes the block occupies (at least the request).
    pub capacity: usize,
}

/// A segment no block uses, which a purge may release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Idle {
    /// The segment.
    pub seg: Segment,
    /// The synchronize epoch of the latest free that made it idle: a token must cover it.
    pub freed_at: u64,
}

/// A placement strategy. See the module docs.
pub trait Placement: Send + fmt::Debug + 'static {
    /// Whether [`Placement::give_back`] may hand a segment back for release at once. Only
    /// upstreams whose release waits for the device may run under such a placement (checked
    /// when a pool is built).
    const RELEASES_ON_FREE: bool;

    /// The alignment of every block address.
    fn alignment(&self) -> usize;

    /// A copy of the placement's state, for a pool's snapshot ([`crate::PoolSnapshot`]);
    /// `None` where it keeps none.
    fn copy_state(&self) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }

    /// Places `size` bytes (1 to [`crate::MAX_REQUEST`]) in memory already held, if it fits.
    fn take(&mut self, size: usize) -> Option<Fit>;

    /// Like [`Placement::take`], where the upstream backs memory behind only part of its
    /// segments: among the free ranges that fit `size`, one where `unbacked(addr, len)` (the
    /// bytes of `[addr, addr+len)` with no memory behind them) is least, the best fit among
    /// those; `usize::MAX` marks a range the upstream cannot back without waiting for the
    /// device, never taken (the pool grows instead). The default ignores `unbacked`.
    fn take_backed(&mut self, size: usize, unbacked: &dyn Fn(u64, usize) -> usize) -> Option<Fit> {
        let _ = unbacked;
        self.take(size)
    }

    /// Bytes to ask the upstream for when [`Placement::take`] found no room for `size`, for a
    /// segment that starts where the last one ends.
    fn grow_request(&self, size: usize) -> usize;

    /// Bytes a new segment needs for `size` when it does not start where the last one ends (a
    /// VMM upstream that had to reserve address space elsewhere). A placement that serves
    /// every request from the new segment alone needs no more than
    /// [`Placement::grow_request`].
    fn grow_alone(&self, size: usize) -> usize {
        self.grow_request(size)
    }

    /// Bytes of address space apart from the placement's ranges that a growth for `size` should
    /// ask the upstream for ([`crate::upstream::Upstream::acquire_apart`]), right after
    /// [`Placement::take_backed`] found no room for it; `None` (the default): an ordinary
    /// growth.
    fn apart(&self, size: usize) -> Option<usize> {
        let _ = size;
        None
    }

    /// Places `size` bytes at the start of `seg`, address space apart that the upstream handed
    /// out for the request [`Placement::apart`] named. Called only after it named one; the
    /// default places it as a new segment.
    fn take_apart(&mut self, seg: Segment, size: usize) -> Fit {
        self.take_new(seg, size)
    }

    /// The upstream has no address space apart to give: [`Placement::apart`] names none from
    /// now on.
    fn apart_refused(&mut self) {}

    /// Places `size` bytes in `seg`, a new segment that the upstream just handed out for it:
    /// of at least [`Placement::grow_request`] bytes if it starts where the last segment ends,
    /// else of at least [`Placement::grow_alone`] bytes.
    fn take_new(&mut self, seg: Segment, size: usize) -> Fit;

    /// Takes a block back, freed at synchronize epoch `freed_at`. Returns a segment the
    /// placement does not keep, to be released at once.
    fn give_back(&mut self, fit: Fit, freed_at: u64) -> Option<Segment>;

    /// The idle segments a purge of `what` would release, in the order to release them.
    fn idle(&self, what: &Purge) -> Vec<Idle>;

    /// The sum of `bytes(segment)` over [`Placement::idle`]'s segments for `what`, in any
    /// order: what a purge would release, asked at every `auto` boundary, where a placement
    /// can say it without making the list.
    fn idle_bytes(&self, what: &Purge, bytes: &mut dyn FnMut(&Segment) -> usize) -> usize {
        self.idle(what).iter().map(|i| bytes(&i.seg)).sum()
    }

    /// Free segments a purge of everything keeps, each with the epoch of its latest free: the
    /// memory behind them goes back to the device, their address space stays for the next
    /// blocks (a lane, which the next request takes again: `lanes/again.rs`). None by default,
    /// and none once [`Placement::closing`] was called: [`Placement::idle`] names them then.
    fn kept_on_purge(&self) -> Vec<Idle> {
        Vec::new()
    }

    /// The pool is closing: every free segment is [`Placement::idle`] for a purge of
    /// everything from now on, those [`Placement::kept_on_purge`] named too.
    fn closing(&mut self) {}

    /// The memory behind `seg`, one of [`Placement::kept_on_purge`]'s, went back to the device
    /// (a placement that names the memory its next blocks need ahead names it again).
    fn kept_given_back(&mut self, seg: &Segment) {
        let _ = seg;
    }

    /// Free ranges holding memory made ahead of need that no block used (lanes grown again
    /// after a trim ahead of blocks that did not come): the core gives it back at once, with no
    /// synchronize (no kernel can use it). Taken once; asked after every block the core gives
    /// back to the placement.
    fn take_never_used(&mut self) -> Vec<(u64, usize)> {
        Vec::new()
    }

    /// Forgets `seg`, one of [`Placement::idle`]'s, after the upstream released it.
    fn remove(&mut self, seg: &Segment);

    /// Idle bytes too small to serve a request of `size`: held, but useless to it.
    fn stranded(&self, size: usize) -> usize;

    /// Free ranges inside the segments that no block uses (address, length), and the
    /// synchronize epoch of the latest free among them: where an upstream may take memory from
    /// to put behind a new block (page recycling). The default names none.
    fn free_spans(&self) -> (Vec<(u64, usize)>, u64) {
        (Vec::new(), 0)
    }

    /// Segments still held (idle or not), for the pool's final release.
    fn segments(&self) -> Vec<Segment>;

    /// Ranges the next blocks are expected to need memory on, soonest first, for the upstream
    /// to back ahead of need ([`crate::upstream::Upstream::back_ahead`]): a guess, never a
    /// reservation (the memory there is free space until a block lands). None by default.
    fn ahead(&self, f: &mut dyn FnMut(u64, usize)) {
        let _ = f;
    }

    /// Whether what [`Placement::ahead`] names is made: the core stops making it when a block
    /// runs out of memory (it sheds that memory first) and starts again after a purge. A
    /// placement that counts named memory as there must not while it is not.
    fn made_ahead(&mut self, made: bool) {
        let _ = made;
    }

    /// A range behind the block just placed that no block ever used, where memory made ahead
    /// of need may lie that the block did not need (a copy smaller than expected): the core
    /// gives it back at once, with no synchronize (no kernel can use it). Taken once.
    fn take_excess(&mut self) -> Option<(u64, usize)> {
        None
    }

    /// Free ranges that hold memory only because of what [`Placement::ahead`] named (behind a
    /// block, beyond what it or the last block there needed), or that are kept out of the free
    /// spans for a later block (a free lane kept for a request's cache): the first memory given
    /// back when a block runs out of it. None by default.
    fn surplus(&self, f: &mut dyn FnMut(u64, usize)) {
        let _ = f;
    }
}
