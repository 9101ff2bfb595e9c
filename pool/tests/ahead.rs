//! Memory made ahead of need (`upstream/vmm/ahead.rs`): a lane's growth is mapped on the pool's
//! worker thread before the copy that needs it lands, and the pool is the one it would be with
//! the pages made at once.
mod common;
use common::*;
use cupool_pool::driver::limit::LimitedDriver;
use cupool_pool::driver::sim::SimDevice;
use cupool_pool::driver::timed::{TimedDriver, AHEAD_MAP};
use cupool_pool::driver::{Driver, PhysHandle};
use cupool_pool::pools::VmmPool;
use cupool_pool::sync::synchronize;
use cupool_pool::upstream::vmm::{Ahead, VmmConfig};
use cupool_pool::{Block, Pool, Purge};
use proptest::prelude::*;
use std::sync::Arc;

fn pool(driver: Arc<dyn Driver>, ahead: Ahead) -> VmmPool {
    VmmPool::with_config(
        driver,
        VmmConfig {
            ahead,
            ..recycling_config(8 * MIB, true)
        },
    )
    .expect("valid settings")
}

/// One step of a prefill's traffic: per layer, an activation, then the keys' and the values'
/// grown copies (each allocated before its old block is freed, as `torch.cat`). Returns every
/// address handed out.
fn step(p: &dyn Pool, cache: &mut [Block], grow: usize, act: usize) -> Vec<u64> {
    let mut out = Vec::new();
    for (k, slot) in cache.iter_mut().enumerate() {
        if k % 2 == 0 && act > 0 {
            let a = p.alloc(act).unwrap();
            out.push(a.ptr());
            p.free(a).unwrap();
        }
        let grown = p.alloc(slot.size() + grow).unwrap();
        fill(&grown, k as u8);
        out.push(grown.ptr());
        let old = std::mem::replace(slot, grown);
        p.free(old).unwrap();
    }
    out
}

/// Phi-3's prefill in miniature: 8 layers' keys and values grown by 3 MiB a step (4, then
/// 2 MiB of granules), with an activation between layers that lands in the lanes too. A lane
/// is read as a growing cache's once two copies in a row grew alike in it and the growth it
/// would then have asked for was needed (six steps to learn, activations between); from then
/// on the worker maps at least three quarters of the growth, where without it every copy maps
/// its growth on the allocating thread. The reserve pays a growth or two for it.
#[test]
fn the_worker_maps_the_lanes_growth_off_the_allocating_thread() {
    let run = |ahead: Ahead| {
        let dev = sim(4.0);
        let timed = Arc::new(TimedDriver::timed(as_driver(&dev)));
        let p = pool(timed.clone(), ahead);
        let mut cache: Vec<Block> = (0..16).map(|_| p.alloc(3 * MIB).unwrap()).collect();
        for (k, b) in cache.iter().enumerate() {
            fill(b, k as u8);
        }
        let calls = || {
            let t = timed.times();
            let count = |name: &str| t.get(name).map_or(0, |c| c.calls);
            (count("map"), count(AHEAD_MAP))
        };
        let mut peak = 0;
        let mut learnt = (0, 0);
        for s in 0..12 {
            if s == 6 {
                learnt = calls();
            }
            step(&p, &mut cache, 3 * MIB, 5 * MIB);
            peak = peak.max(p.stats().reserved_bytes);
        }
        for (k, b) in cache.iter().enumerate() {
            assert!(holds(b, k as u8), "tensor {k} kept its bytes");
        }
        let end = calls();
        // The last six steps' maps, on the allocating thread and on the worker.
        (end.0 - learnt.0, end.1 - learnt.1, peak)
    };
    let (off_inline, off_ahead, off_peak) = run(Ahead::Off);
    let (inline, ahead, peak) = run(Ahead::Worker);
    assert_eq!(off_ahead, 0);
    assert!(
        off_inline >= 16 * 6,
        "each copy maps its growth: {off_inline}"
    );
    assert!(
        ahead >= 12 * 6 && inline <= 4 * 6,
        "the worker maps the growth: {inline} maps on the allocating thread, {ahead} on the worker, {off_inline} without"
    );
    assert!(
        peak <= off_peak + 4 * 4 * MIB,
        "{peak} against {off_peak} without"
    );
}

/// A driver whose maps take a millisecond: the worker is still busy when the pool goes.
#[derive(Debug)]
struct SlowMaps(Arc<dyn Driver>);

impl cupool_pool::driver::forward::Forward for SlowMaps {
    fn inner(&self) -> &dyn Driver {
        self.0.as_ref()
    }

    fn map(&self, at: u64, bytes: usize) -> Result<PhysHandle, cupool_pool::driver::DriverError> {
        std::thread::sleep(std::time::Duration::from_millis(1));
        self.0.map(at, bytes)
    }
}

/// Pages in flight when the pool is dropped, purged or put to sleep are waited for: nothing
/// stays on the device, and the reserve counts what the device holds.
#[test]
fn pages_in_flight_are_waited_for_by_drop_purge_and_sleep() {
    let dev = sim(4.0);
    let slow: Arc<dyn Driver> = Arc::new(SlowMaps(as_driver(&dev)));
    let p = pool(slow.clone(), Ahead::Worker);
    let mut cache: Vec<Block> = (0..8).map(|_| p.alloc(3 * MIB).unwrap()).collect();
    for _ in 0..3 {
        step(&p, &mut cache, 3 * MIB, 0);
    }
    assert_eq!(p.stats().reserved_bytes, dev.ledger().device_bytes);
    let token = synchronize(&*dev).unwrap();
    p.sleep(&token, true).unwrap();
    p.wake().unwrap();
    for (k, b) in cache.iter().enumerate() {
        assert!(holds(b, k as u8), "tensor {k} kept its bytes");
    }
    step(&p, &mut cache, 3 * MIB, 0);
    for b in cache.drain(..) {
        p.free(b).unwrap();
    }
    p.purge(&synchronize(&*dev).unwrap(), Purge::All).unwrap();
    assert_eq!(dev.ledger().device_bytes, 0);
    // Again, and dropped with the worker's pages still being made.
    let mut cache: Vec<Block> = (0..8).map(|_| p.alloc(3 * MIB).unwrap()).collect();
    step(&p, &mut cache, 3 * MIB, 0);
    step(&p, &mut cache, 3 * MIB, 0);
    drop(cache);
    drop(p);
    assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
}

/// Random traffic of grown copies, activations and purges.
#[derive(Clone, Debug)]
enum Op {
    /// A step: every tensor copied `grow` bytes larger, an activation per layer.
    Step {
        grow: usize,
        act: usize,
    },
    /// One tensor freed early, replaced by a new small one.
    Replace(usize),
    Purge,
    SleepWake,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..=6 * MIB, 0usize..=12 * MIB).prop_map(|(grow, act)| Op::Step { grow, act }),
        2 => any::<usize>().prop_map(Op::Replace),
        1 => Just(Op::Purge),
        1 => Just(Op::SleepWake),
    ]
}

/// Runs `ops` on a fresh pool over `driver`; every address handed out (labelled by first
/// appearance) and the reserve after each op, or the first error. Checks the pool's reserve against the device after each op.
fn trace(
    dev: &Arc<SimDevice>,
    driver: Arc<dyn Driver>,
    ahead: Ahead,
    tensors: usize,
    ops: &[Op],
) -> Result<(Vec<u64>, Vec<usize>), String> {
    let p = pool(driver, ahead);
    let mut out = Vec::new();
    let mut reserves = Vec::new();
    let mut cache: Vec<Block> = Vec::new();
    for k in 0..tensors {
        let b = p.alloc(3 * MIB).map_err(|e| e.to_string())?;
        fill(&b, k as u8);
        cache.push(b);
    }
    let result = (|| {
        for op in ops {
            match op {
                Op::Step { grow, act } => {
                    for (k, slot) in cache.iter_mut().enumerate() {
                        if *act > 0 {
                            let a = p.alloc(*act).map_err(|e| e.to_string())?;
                            out.push(a.ptr());
                            p.free(a).unwrap();
                        }
                        let grown = p.alloc(slot.size() + grow).map_err(|e| e.to_string())?;
                        fill(&grown, k as u8);
                        out.push(grown.ptr());
                        let old = std::mem::replace(slot, grown);
                        p.free(old).unwrap();
                    }
                }
                Op::Replace(i) => {
                    let k = i % cache.len();
                    let fresh = p.alloc(3 * MIB).map_err(|e| e.to_string())?;
                    fill(&fresh, k as u8);
                    out.push(fresh.ptr());
                    let old = std::mem::replace(&mut cache[k], fresh);
                    p.free(old).unwrap();
                }
                Op::Purge => {
                    p.purge(&synchronize(&**dev).unwrap(), Purge::All).unwrap();
                }
                Op::SleepWake => {
                    p.sleep(&synchronize(&**dev).unwrap(), true).unwrap();
                    p.wake().map_err(|e| e.to_string())?;
                }
            }
            let reserved = p.stats().reserved_bytes;
            let held = dev.ledger().device_bytes;
            if reserved != held {
                return Err(format!(
                    "after {op:?}: the pool counts {reserved}, the device holds {held}"
                ));
            }
            for (k, b) in cache.iter().enumerate() {
                if !holds(b, k as u8) {
                    return Err(format!("tensor {k} lost its bytes after {op:?}"));
                }
            }
            reserves.push(reserved);
        }
        Ok(())
    })();
    drop(cache);
    drop(p);
    if !dev.ledger().is_empty() {
        return Err(format!("left on the device: {:?}", dev.ledger()));
    }
    // Each card places its address space elsewhere: addresses are compared by the order in
    // which they first appear.
    let mut seen = std::collections::HashMap::new();
    let out = out
        .into_iter()
        .map(|a| {
            let n = seen.len() as u64;
            *seen.entry(a).or_insert(n)
        })
        .collect();
    result.map(|_| (out, reserves))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// The worker changes when pages are made, never where blocks go or what the pool holds:
    /// every address and every reserve equal to the run with the pages made inline.
    #[test]
    fn the_worker_gives_the_pool_of_pages_made_at_once(
        tensors in 1usize..8,
        ops in prop::collection::vec(op(), 1..8),
    ) {
        let a = sim(8.0);
        let inline = trace(&a, as_driver(&a), Ahead::Inline, tensors, &ops);
        let b = sim(8.0);
        let worker = trace(&b, as_driver(&b), Ahead::Worker, tensors, &ops);
        prop_assert!(inline.is_ok(), "{:?}", inline);
        prop_assert_eq!(inline, worker);
    }

    /// Under any memory limit the worker's pool stays whole: a request that does not fit is
    /// an out-of-memory error, the reserve is what the device holds after every op, no tensor
    /// loses a byte, and nothing is left on the device at the drop. (Pages made ahead are memory:
    /// a block that runs out gives them back first and stops them until a purge,
    /// `core/back.rs`.)
    #[test]
    fn under_a_memory_limit_the_worker_s_pool_stays_whole(
        tensors in 1usize..8,
        ops in prop::collection::vec(op(), 1..8),
        share in 40usize..=100,
    ) {
        let a = sim(8.0);
        let off = trace(&a, as_driver(&a), Ahead::Off, tensors, &ops);
        prop_assert!(off.is_ok(), "{:?}", off);
        let peak = off.unwrap().1.into_iter().max().unwrap_or(0);
        let b = sim(8.0);
        let limit = (peak * share / 100).max(16 * MIB);
        let limited: Arc<dyn Driver> = Arc::new(LimitedDriver::new(as_driver(&b), limit));
        if let Err(e) = trace(&b, limited, Ahead::Worker, tensors, &ops) {
            prop_assert!(e.starts_with("out of device memory"), "{}", e);
        }
    }
}

/// A driver whose maps fail while `failing` is set, and whose maps on a pool's worker thread
/// take `worker_ms`.
#[derive(Debug)]
struct Flaky {
    inner: Arc<dyn Driver>,
    failing: std::sync::atomic::AtomicBool,
    worker_ms: u64,
}

impl cupool_pool::driver::forward::Forward for Flaky {
    fn inner(&self) -> &dyn Driver {
        self.inner.as_ref()
    }

    fn map(&self, at: u64, bytes: usize) -> Result<PhysHandle, cupool_pool::driver::DriverError> {
        use cupool_pool::driver::{CallKind, DriverError, ErrorCode};
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(DriverError::new(
                CallKind::Map,
                ErrorCode::OutOfMemory,
                "refused by the test",
            ));
        }
        if cupool_pool::driver::worker::on_worker() {
            std::thread::sleep(std::time::Duration::from_millis(self.worker_ms));
        }
        self.inner.map(at, bytes)
    }
}

fn flaky(dev: &Arc<SimDevice>, worker_ms: u64) -> Arc<Flaky> {
    Arc::new(Flaky {
        inner: as_driver(dev),
        failing: false.into(),
        worker_ms,
    })
}

/// A block whose backing failed in a lane leaves nothing behind: after a purge releases that
/// lane and a new lane gets its address space, the block there has all its memory (a range
/// named for the failed block once unmapped part of it).
#[test]
fn a_failed_backing_names_nothing_to_give_back_later() {
    for ahead in [Ahead::Worker, Ahead::Inline] {
        let dev = sim(4.0);
        let drv = flaky(&dev, 0);
        let p = pool(drv.clone(), ahead);
        let a = p.alloc(4 * MIB).unwrap();
        let b = p.alloc(6 * MIB).unwrap();
        p.free(a).unwrap();
        let c = p.alloc(4 * MIB).unwrap();
        let e = p.alloc(12 * MIB).unwrap();
        let f = p.alloc(14 * MIB).unwrap();
        p.free(e).unwrap();
        p.free(c).unwrap();
        // Every lane is free: c's is left, and a replacement seen since takes it again.
        let h = p.alloc(8 * MIB).unwrap();
        p.free(h).unwrap();
        p.free(b).unwrap();
        drv.failing.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(p.alloc(6 * MIB).is_err());
        drv.failing
            .store(false, std::sync::atomic::Ordering::SeqCst);
        p.purge(&synchronize(&*dev).unwrap(), Purge::All).unwrap();
        let g = p.alloc(16 * MIB).unwrap();
        assert!(
            dev.contains(g.ptr(), g.size()),
            "{ahead:?}: the block at {:#x} has all its memory",
            g.ptr()
        );
        fill(&g, 7);
        assert!(holds(&g, 7));
        assert_eq!(p.stats().reserved_bytes, dev.ledger().device_bytes);
        drop((f, g));
    }
}

/// A purge or a sleep while the worker is still making pages counts them first: the reserve
/// is what the device holds right after it, and a purge reports what the device got back.
#[test]
fn a_purge_with_pages_in_flight_counts_them() {
    for sleep in [false, true] {
        let dev = sim(4.0);
        let p = pool(flaky(&dev, 20), Ahead::Worker);
        let mut cache: Vec<Block> = (0..8).map(|_| p.alloc(3 * MIB).unwrap()).collect();
        for _ in 0..4 {
            step(&p, &mut cache, 3 * MIB, 0);
        }
        p.purge(&synchronize(&*dev).unwrap(), Purge::All).unwrap();
        step(&p, &mut cache, 3 * MIB, 0);
        step(&p, &mut cache[..4], 3 * MIB, 0);
        let token = synchronize(&*dev).unwrap();
        if sleep {
            p.sleep(&token, false).unwrap();
            p.wake().unwrap();
        } else {
            p.purge(&token, Purge::All).unwrap();
        }
        let held = dev.ledger().device_bytes;
        assert_eq!(
            p.reserved_bytes(),
            held,
            "sleep {sleep}: the published reserve"
        );
        assert_eq!(p.stats().reserved_bytes, held, "sleep {sleep}");
    }
}

/// The same miniature's first steps, where no lane has seen three copies yet: the lanes read
/// the copies' growth from the last two copies that replaced long-lived blocks (`growth_of` in
/// `placement/lanes/ahead.rs`), so from the third step the worker maps most of the growth
/// (before, each lane learnt it alone, and the first steps made it where it landed).
#[test]
fn a_cache_s_first_copies_are_made_ahead_once_two_copies_grew_alike() {
    let dev = sim(4.0);
    let timed = Arc::new(TimedDriver::timed(as_driver(&dev)));
    let p = pool(timed.clone(), Ahead::Worker);
    let mut cache: Vec<Block> = (0..16).map(|_| p.alloc(3 * MIB).unwrap()).collect();
    let calls = || {
        let t = timed.times();
        let count = |name: &str| t.get(name).map_or(0, |c| c.calls);
        (count("map"), count(AHEAD_MAP))
    };
    for (k, b) in cache.iter().enumerate() {
        fill(b, k as u8);
    }
    let mut at = Vec::new();
    for _ in 0..5 {
        step(&p, &mut cache, 3 * MIB, 5 * MIB);
        at.push(calls());
    }
    for (k, b) in cache.iter().enumerate() {
        assert!(holds(b, k as u8), "tensor {k} kept its bytes");
    }
    // Steps 3 to 5: 48 copies, each growing by one or two granules. Before, 37 pages were
    // made on the allocating thread there and 13 by the worker.
    let (inline, ahead) = (at[4].0 - at[1].0, at[4].1 - at[1].1);
    assert!(
        inline <= 18 && ahead >= 36,
        "steps 3 to 5: {inline} pages made on the allocating thread, {ahead} by the worker ({at:?})"
    );
}
