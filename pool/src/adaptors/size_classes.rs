//! Size classes: requests of different sizes from pools of their own, so their blocks never
//! share an address range.
//!
//! In one VMM range, small long-lived tensors land between large ones and pin the holes the
//! large ones leave. A range for requests up to 1 MiB and one for the rest cut the mapped peak
//! of a PyTorch prefill trace by 76 MiB (0.5%; docs/pytorch.md). More bounds can do harm: a
//! tensor that grows across a bound (a KV cache concatenated every chunk) leaves its old class
//! full of holes that only a trim returns (with a 64 MiB bound as well, that trace's peak grew
//! by 4.2 GiB). Each class is a whole pool; a free goes to the class whose pool handed the
//! block out.
//!
//! The peaks are the adaptor's own: the classes peak at different moments, so the sum of their
//! peaks would overstate what was live or reserved at once.

use crate::block::Block;
use crate::driver::Driver;
use crate::error::{FreeError, PoolError};
use crate::invalid::InvalidConfig;
use crate::kind::PoolKind;
use crate::pool::{Moved, Pool, Purge, Released};
use crate::stats::PoolStats;
use crate::sync::SyncToken;
use crate::PoolId;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Pools by request size. See the module docs.
#[derive(Debug)]
pub struct SizeClasses {
    /// Upper bounds (inclusive) of every class but the last, ascending.
    bounds: Vec<usize>,
    /// One pool a class: `bounds.len() + 1` of them.
    pools: Vec<Arc<dyn Pool>>,
    /// Bytes asked for and held, over every class.
    live: AtomicUsize,
    /// The highest `live` since creation or the last peak reset.
    live_peak: AtomicUsize,
    /// The highest sum of the classes' reserves since then (a reserve grows only in an
    /// allocation or a wake).
    reserved_peak: AtomicUsize,
}

impl SizeClasses {
    /// Requests up to `bounds[i]` bytes (and above `bounds[i - 1]`) go to `pools[i]`, larger
    /// ones to the last pool. The bounds must ascend strictly, there must be one pool more
    /// than bounds, and all pools must be on one device.
    pub fn new(bounds: Vec<usize>, pools: Vec<Arc<dyn Pool>>) -> Result<Self, PoolError> {
        let invalid = |mixed_devices| {
            Err(PoolError::SizeClasses {
                bounds: bounds.len(),
                pools: pools.len(),
                mixed_devices,
            })
        };
        if pools.len() != bounds.len() + 1 {
            return invalid(false);
        }
        check_bounds(&bounds)?;
        let device = pools[0].driver().ordinal();
        if pools.iter().any(|p| p.driver().ordinal() != device) {
            return invalid(true);
        }
        Ok(Self {
            bounds,
            pools,
            live: AtomicUsize::new(0),
            live_peak: AtomicUsize::new(0),
            reserved_peak: AtomicUsize::new(0),
        })
    }

    /// Raises the reserve's peak to the classes' reserve now (a peak seldom moves: it is read
    /// before it is written).
    #[inline]
    fn note_reserve(&self) {
        let reserved = self.reserved_bytes();
        if reserved > self.reserved_peak.load(Ordering::Relaxed) {
            self.reserved_peak.fetch_max(reserved, Ordering::Relaxed);
        }
    }

    /// Counts a block handed out as live, and the live peak it may raise.
    #[inline]
    fn note_live(&self, b: &Block) {
        let live = self.live.fetch_add(b.size, Ordering::Relaxed) + b.size;
        if live > self.live_peak.load(Ordering::Relaxed) {
            self.live_peak.fetch_max(live, Ordering::Relaxed);
        }
    }

    /// The pool serving `bytes`.
    #[inline]
    fn class(&self, bytes: usize) -> &Arc<dyn Pool> {
        let i = self.bounds.partition_point(|&b| b < bytes);
        &self.pools[i]
    }

    /// The upper bounds of the classes.
    pub fn bounds(&self) -> &[usize] {
        &self.bounds
    }
}

/// What size-class bounds must be: above 0 and strictly ascending.
pub(crate) const BOUNDS_ACCEPTED: &str =
    "none, or byte sizes above 0, strictly ascending, separated by commas (e.g. 1048576,67108864)";

/// Checks size-class bounds (the one check, for [`SizeClasses::new`] and the configuration).
pub(crate) fn check_bounds(bounds: &[usize]) -> Result<(), InvalidConfig> {
    if bounds.first() == Some(&0) || bounds.windows(2).any(|w| w[0] >= w[1]) {
        return Err(InvalidConfig::new(
            "CUPOOL_SIZE_CLASSES",
            bounds,
            BOUNDS_ACCEPTED,
        ));
    }
    Ok(())
}

impl Pool for SizeClasses {
    /// The smallest class's pool: blocks carry the identity of the class that served them.
    fn id(&self) -> PoolId {
        self.pools[0].id()
    }

    fn kind(&self) -> PoolKind {
        self.pools[0].kind()
    }

    fn driver(&self) -> &Arc<dyn Driver> {
        self.pools[0].driver()
    }

    fn alignment(&self) -> usize {
        self.pools.iter().map(|p| p.alignment()).min().unwrap_or(1)
    }

    #[inline]
    fn alloc(&self, bytes: usize) -> Result<Block, PoolError> {
        let b = self.class(bytes).alloc(bytes)?;
        self.note_live(&b);
        self.note_reserve();
        Ok(b)
    }

    #[inline]
    fn alloc_onto(&self, bytes: usize, out: &mut Vec<Block>) -> Result<(), PoolError> {
        self.class(bytes).alloc_onto(bytes, out)?;
        if let Some(b) = out.last() {
            self.note_live(b);
        }
        self.note_reserve();
        Ok(())
    }

    fn alloc_held(&self, bytes: usize) -> Result<Option<Block>, PoolError> {
        let b = self.class(bytes).alloc_held(bytes)?;
        if let Some(b) = &b {
            self.note_live(b);
        }
        Ok(b)
    }

    #[inline]
    fn free(&self, block: Block) -> Result<(), FreeError> {
        match self.pools.iter().find(|p| p.id() == block.pool) {
            Some(p) => {
                let size = block.size;
                p.free(block)?;
                self.live.fetch_sub(size, Ordering::Relaxed);
                Ok(())
            }
            None => {
                let error = PoolError::WrongPool {
                    owner: block.pool,
                    given_to: self.id(),
                };
                Err(FreeError { error, block })
            }
        }
    }

    fn purge(&self, token: &SyncToken, what: Purge) -> Result<Released, PoolError> {
        let mut out = Released::default();
        for p in &self.pools {
            let r = p.purge(token, what.clone())?;
            out.bytes += r.bytes;
            out.buffers += r.buffers;
            out.deferred_bytes += r.deferred_bytes;
        }
        Ok(out)
    }

    fn releasable(&self, what: &Purge) -> usize {
        self.pools.iter().map(|p| p.releasable(what)).sum()
    }

    fn stats(&self) -> PoolStats {
        let mut t = PoolStats::default();
        for p in &self.pools {
            t.merge(&p.stats());
        }
        t.live_peak_bytes = t.live_bytes.max(self.live_peak.load(Ordering::Relaxed));
        t.reserved_peak_bytes = t
            .reserved_bytes
            .max(self.reserved_peak.load(Ordering::Relaxed));
        t
    }

    fn reserved_bytes(&self) -> usize {
        self.pools.iter().map(|p| p.reserved_bytes()).sum()
    }

    fn snapshot(&self) -> Result<crate::PoolSnapshot, PoolError> {
        let classes = self
            .pools
            .iter()
            .map(|p| p.snapshot())
            .collect::<Result<Vec<_>, _>>()?;
        let counters =
            [&self.live, &self.live_peak, &self.reserved_peak].map(|c| c.load(Ordering::Relaxed));
        Ok(crate::PoolSnapshot::new((classes, counters)))
    }

    fn restore(&self, snapshot: &crate::PoolSnapshot) -> Result<(), PoolError> {
        let Some((classes, counters)) = snapshot
            .get::<(Vec<crate::PoolSnapshot>, [usize; 3])>()
            .filter(|(c, _)| c.len() == self.pools.len())
        else {
            return Err(crate::snapshot_unsupported(
                self.kind(),
                "a restore from another pool's snapshot",
            ));
        };
        // Refused before any class changes: a class with live blocks would refuse midway.
        if self.live.load(Ordering::Relaxed) != 0 {
            return Err(crate::snapshot_unsupported(
                self.kind(),
                "a snapshot while blocks are live (free them first)",
            ));
        }
        // A class refusing midway: those restored go back to where they were.
        let now = self
            .pools
            .iter()
            .map(|p| p.snapshot())
            .collect::<Result<Vec<_>, _>>()?;
        for (k, (p, s)) in self.pools.iter().zip(classes).enumerate() {
            if let Err(e) = p.restore(s) {
                for (q, back) in self.pools[..k].iter().zip(&now) {
                    q.restore(back)?;
                }
                return Err(e);
            }
        }
        for (c, v) in [&self.live, &self.live_peak, &self.reserved_peak]
            .iter()
            .zip(counters)
        {
            c.store(*v, Ordering::Relaxed);
        }
        Ok(())
    }

    fn reset_peaks(&self) {
        self.pools.iter().for_each(|p| p.reset_peaks());
        self.live_peak
            .store(self.live.load(Ordering::Relaxed), Ordering::Relaxed);
        self.reserved_peak
            .store(self.reserved_bytes(), Ordering::Relaxed);
    }

    fn sleep(&self, token: &SyncToken, offload: bool) -> Result<Moved, PoolError> {
        let mut out = Moved::default();
        for p in &self.pools {
            let m = p.sleep(token, offload)?;
            out.bytes += m.bytes;
            out.copied += m.copied;
        }
        Ok(out)
    }

    fn wake(&self) -> Result<Moved, PoolError> {
        let mut out = Moved::default();
        for p in &self.pools {
            let m = p.wake()?;
            out.bytes += m.bytes;
            out.copied += m.copied;
        }
        self.note_reserve();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::sim::{SimConfig, SimDevice};
    use crate::PoolConfig;

    fn pools(n: usize) -> Vec<Arc<dyn Pool>> {
        let d: Arc<dyn Driver> = Arc::new(SimDevice::new(SimConfig::gib(1.0)).unwrap());
        (0..n)
            .map(|_| {
                PoolConfig::default()
                    .kind(PoolKind::Vmm)
                    .build(d.clone())
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn routes_by_size_and_frees_to_the_owner() {
        let p = SizeClasses::new(vec![1 << 20], pools(2)).unwrap();
        let small = p.alloc(1 << 20).unwrap();
        let large = p.alloc((1 << 20) + 1).unwrap();
        assert_eq!(small.pool, p.pools[0].id());
        assert_eq!(large.pool, p.pools[1].id());
        assert_eq!(p.stats().live_blocks, 2);
        p.free(large).unwrap();
        p.free(small).unwrap();
        assert_eq!(p.stats().live_blocks, 0);
        let stranger = pools(1)[0].alloc(64).unwrap();
        let e = p.free(stranger).unwrap_err();
        assert!(matches!(e.error, PoolError::WrongPool { .. }));
    }

    /// The classes peak at different moments: the adaptor's peaks are what was live and
    /// reserved at once, not the sum of the classes' peaks.
    #[test]
    fn peaks_are_what_was_held_at_once() {
        let p = SizeClasses::new(vec![1 << 20], pools(2)).unwrap();
        let small = p.alloc(1 << 20).unwrap();
        p.free(small).unwrap();
        let large = p.alloc(4 << 20).unwrap();
        p.free(large).unwrap();
        let s = p.stats();
        assert_eq!(s.live_peak_bytes, 4 << 20, "not 5 MiB: never live together");
        let classes: usize = p.pools.iter().map(|c| c.stats().reserved_peak_bytes).sum();
        assert!(s.reserved_peak_bytes <= classes);
        assert!(s.reserved_peak_bytes >= s.reserved_bytes);
        // A free the pool refuses changes nothing; a reset starts from what is held now.
        let kept = p.alloc(64).unwrap();
        let stranger = pools(1)[0].alloc(64).unwrap();
        assert!(p.free(stranger).is_err());
        p.reset_peaks();
        assert_eq!(p.stats().live_peak_bytes, 64);
        assert_eq!(p.stats().reserved_peak_bytes, p.reserved_bytes());
        p.free(kept).unwrap();
        assert_eq!(p.stats().live_bytes, 0);
    }

    #[test]
    fn refuses_bad_bounds() {
        assert!(SizeClasses::new(vec![], pools(2)).is_err());
        assert!(SizeClasses::new(vec![2, 1], pools(3)).is_err());
        assert!(SizeClasses::new(vec![0], pools(2)).is_err());
        assert!(crate::config::parse_size_classes("1,1").is_err());
        assert_eq!(
            crate::config::parse_size_classes(" none ").unwrap(),
            Vec::<usize>::new()
        );
        assert_eq!(
            crate::config::parse_size_classes("10,20").unwrap(),
            vec![10, 20]
        );
    }
}
