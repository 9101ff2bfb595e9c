//! Thread caches in front of a shared pool: reuse without the pool, exact current statistics,
//! the bounds, every slow path giving the blocks back, and threads racing on one pool with
//! every block's bytes checked (no two live blocks ever overlap).
mod common;
use common::*;
use cupool_pool::adaptors::{ThreadCache, ThreadCacheConfig};
use cupool_pool::pools::VmmPool;
use cupool_pool::{synchronize, Block, Pool, Purge};
use std::sync::Arc;

fn cached(
    dev: &Arc<cupool_pool::driver::sim::SimDevice>,
    config: ThreadCacheConfig,
) -> ThreadCache {
    ThreadCache::new(Arc::new(VmmPool::new(as_driver(dev))), config)
}

/// The adaptor and the pool behind it.
fn both(dev: &Arc<cupool_pool::driver::sim::SimDevice>) -> (ThreadCache, Arc<dyn Pool>) {
    let inner: Arc<dyn Pool> = Arc::new(VmmPool::new(as_driver(dev)));
    (
        ThreadCache::new(inner.clone(), ThreadCacheConfig::default()),
        inner,
    )
}

#[test]
fn a_freed_small_block_is_reused_by_its_thread_without_the_pool() {
    let dev = sim(1.0);
    let (p, inner) = both(&dev);
    let a = p.alloc(4096).unwrap();
    let ptr = a.ptr();
    p.free(a).unwrap();
    let s = p.stats();
    assert_eq!(
        (s.live_bytes, s.live_blocks),
        (0, 0),
        "a cached block is not live"
    );
    assert!(s.thread_cached_bytes >= 4096 && s.cached_bytes >= s.thread_cached_bytes);
    assert_eq!((s.allocs, s.frees), (1, 1));
    let b = p.alloc(4096).unwrap();
    assert_eq!(b.ptr(), ptr);
    assert_eq!(
        inner.stats().allocs,
        1,
        "served by the thread's cache, not the pool"
    );
    let s = p.stats();
    assert_eq!(
        (s.allocs, s.live_bytes),
        (2, 4096),
        "yet counted as an allocation"
    );
    // Another size is the pool's.
    let c = p.alloc(8192).unwrap();
    assert_eq!(inner.stats().allocs, 2);
    p.free(b).unwrap();
    p.free(c).unwrap();
}

#[test]
fn bounds_hold_and_every_slow_path_gives_the_blocks_back() {
    let dev = sim(1.0);
    let config = ThreadCacheConfig {
        max_block: 64 << 10,
        max_bytes: 256 << 10,
    };
    let p = cached(&dev, config);
    // Too large to keep.
    let big = p.alloc(1 << 20).unwrap();
    p.free(big).unwrap();
    assert_eq!(p.stats().thread_cached_bytes, 0);
    // At most max_bytes kept, over any number of sizes.
    let blocks: Vec<Block> = (1..=40).map(|i| p.alloc(i * 1024).unwrap()).collect();
    blocks.into_iter().for_each(|b| p.free(b).unwrap());
    let s = p.stats();
    assert!(
        s.thread_cached_bytes > 0 && s.thread_cached_bytes <= config.max_bytes,
        "{s:?}"
    );
    assert_eq!(s.live_blocks, 0);
    // A purge returns them: nothing kept, and the whole range goes back.
    let r = p
        .purge(&synchronize(dev.as_ref()).unwrap(), Purge::All)
        .unwrap();
    assert!(r.bytes > 0);
    let s = p.stats();
    assert_eq!((s.thread_cached_bytes, s.reserved_bytes), (0, 0));
    // As does releasable (a caller's check before a purge) and a dropped cache.
    let b = p.alloc(4096).unwrap();
    p.free(b).unwrap();
    assert!(p.releasable(&Purge::All) > 0);
    assert_eq!(p.stats().thread_cached_bytes, 0);
    let b = p.alloc(4096).unwrap();
    p.free(b).unwrap();
    drop(p);
    assert!(dev.ledger().is_empty(), "nothing left on the device");
}

#[test]
fn a_block_freed_by_another_thread_goes_to_that_thread_s_cache() {
    let dev = sim(1.0);
    let p = Arc::new(cached(&dev, ThreadCacheConfig::default()));
    let b = p.alloc(1000).unwrap();
    let q = p.clone();
    std::thread::spawn(move || q.free(b).unwrap())
        .join()
        .unwrap();
    let s = p.stats();
    assert_eq!(s.live_blocks, 0);
    assert!(
        s.thread_cached_bytes >= 1000,
        "kept by the exited thread until a flush"
    );
    assert_eq!(p.flush(), 1);
    assert_eq!(p.stats().thread_cached_bytes, 0);
}

/// Eight threads on one pool, random sizes, each block filled with its owner's stamp and
/// checked before it is freed: a block handed to two users at once shows as a wrong stamp.
#[test]
fn threads_racing_on_one_pool_never_share_a_live_block() {
    let dev = sim(2.0);
    let p = Arc::new(cached(&dev, ThreadCacheConfig::default()));
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let p = p.clone();
            s.spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t;
                let mut live: Vec<(Block, u8)> = Vec::new();
                for i in 0..4000u32 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if !live.is_empty() && (x % 3 == 0 || live.len() >= 12) {
                        let (b, stamp) = live.swap_remove((x >> 8) as usize % live.len());
                        // SAFETY: a live block of a backed simulated card, `size` bytes.
                        let bytes =
                            unsafe { std::slice::from_raw_parts(b.ptr() as *const u8, b.size()) };
                        assert!(bytes.iter().all(|&v| v == stamp), "block overwritten");
                        p.free(b).unwrap();
                    } else {
                        let size = [64usize, 4096, 65536, 300_000, 2 << 20][(x >> 16) as usize % 5];
                        let b = p.alloc(size).unwrap();
                        let stamp = (t as u8).wrapping_mul(31).wrapping_add(i as u8);
                        // SAFETY: as above, writable.
                        unsafe { std::ptr::write_bytes(b.ptr() as *mut u8, stamp, b.size()) };
                        live.push((b, stamp));
                    }
                }
                live.into_iter().for_each(|(b, _)| p.free(b).unwrap());
            });
        }
    });
    let s = p.stats();
    assert_eq!((s.live_blocks, s.live_bytes), (0, 0));
    assert!(s.thread_cached_bytes <= 8 * ThreadCacheConfig::default().max_bytes);
    p.flush();
    assert_eq!(p.stats().cached_bytes, p.stats().reserved_bytes);
}

/// What a purge reports released is what the pool's reserve lost, also where the flush itself
/// releases (the legacy pool frees a block outright when its slots are full).
#[test]
fn a_purge_counts_what_the_flush_released() {
    use cupool_pool::pools::LegacyPool;
    let dev = sim(1.0);
    let p = ThreadCache::new(
        Arc::new(LegacyPool::new(as_driver(&dev))),
        ThreadCacheConfig::default(),
    );
    // More idle buffers than ggml's 256 slots: freeing past them releases at once.
    let blocks: Vec<Block> = (0..300).map(|i| p.alloc(1000 + i).unwrap()).collect();
    let keep: Vec<Block> = (0..300).map(|i| p.alloc(100_000 + i).unwrap()).collect();
    blocks.into_iter().for_each(|b| p.free(b).unwrap());
    keep.into_iter().for_each(|b| p.free(b).unwrap());
    let before = p.stats().reserved_bytes;
    let r = p
        .purge(&synchronize(dev.as_ref()).unwrap(), Purge::All)
        .unwrap();
    assert_eq!(p.stats().reserved_bytes, before - r.bytes);
    assert_eq!(p.stats().reserved_bytes, 0);
}

/// A thread cache never hands out a block over memory a sleep released: while asleep it
/// neither serves nor keeps, and the pool's refusal reaches the caller.
#[test]
fn an_asleep_pool_s_caches_serve_nothing_until_it_wakes() {
    let dev = sim(1.0);
    let p = cached(&dev, ThreadCacheConfig::default());
    let a = p.alloc(4096).unwrap();
    let b = p.alloc(4096).unwrap();
    p.free(a).unwrap(); // kept by this thread
    p.sleep(&synchronize(dev.as_ref()).unwrap(), false).unwrap();
    assert_eq!(
        p.stats().thread_cached_bytes,
        0,
        "the sleep flushed the caches"
    );
    p.free(b).unwrap(); // goes to the pool, not the cache
    assert_eq!(p.stats().thread_cached_bytes, 0);
    assert!(matches!(
        p.alloc(4096),
        Err(cupool_pool::PoolError::Asleep { .. })
    ));
    p.wake().unwrap();
    let c = p.alloc(4096).unwrap();
    p.free(c).unwrap();
    assert!(
        p.stats().thread_cached_bytes > 0,
        "caching again after the wake"
    );
}

/// A sleep the pool refuses (it cannot keep its addresses) changes nothing: the caches go on.
#[test]
fn a_refused_sleep_leaves_the_caches_serving() {
    use cupool_pool::pools::LegacyPool;
    let dev = sim(1.0);
    let p = ThreadCache::new(
        Arc::new(LegacyPool::new(as_driver(&dev))),
        ThreadCacheConfig::default(),
    );
    let e = p
        .sleep(&synchronize(dev.as_ref()).unwrap(), false)
        .unwrap_err();
    assert!(matches!(e, cupool_pool::PoolError::CannotSleep { .. }));
    let b = p.alloc(4096).unwrap();
    p.free(b).unwrap();
    assert!(p.stats().thread_cached_bytes > 0);
}

/// Blocks a thread keeps are live to the pool: a request of another size would make it grow
/// though the kept blocks' memory could serve it. A miss the pool cannot serve from what it
/// holds gives the thread's blocks back first.
#[test]
fn kept_blocks_go_back_before_the_pool_grows_for_a_request_they_could_serve() {
    let dev = sim(1.0);
    let (p, inner) = both(&dev);
    // Eight blocks of 256 KiB take the pool's first growth whole; freed, all eight are kept.
    let blocks: Vec<Block> = (0..8).map(|_| p.alloc(256 << 10).unwrap()).collect();
    let reserved = inner.stats().reserved_bytes;
    assert_eq!(
        inner.stats().cached_bytes,
        reserved - (8 << 18),
        "the eight fill what the pool holds but its growth's rest"
    );
    blocks.into_iter().for_each(|b| p.free(b).unwrap());
    assert_eq!(p.stats().thread_cached_bytes, 8 << 18);
    // As large as what the pool holds free beside them and more: only their memory serves it.
    let ask = inner.stats().cached_bytes + (512 << 10);
    let b = p.alloc(ask).unwrap();
    assert_eq!(
        inner.stats().reserved_bytes,
        reserved,
        "served from the kept blocks' memory, no growth"
    );
    assert_eq!(p.stats().thread_cached_bytes, 0, "the blocks went back");
    p.free(b).unwrap();
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Over any sequence of small allocations and frees on one thread, the pool grows only
    /// while the thread keeps nothing: a request it keeps no block of gives them back before
    /// it costs new memory.
    #[test]
    fn the_pool_grows_for_a_small_request_only_once_the_thread_keeps_nothing(
        ops in proptest::collection::vec((0u8..3, 1usize..(1 << 20)), 1..200)
    ) {
        let dev = sim(1.0);
        let (p, inner) = both(&dev);
        let max_block = ThreadCacheConfig::default().max_block;
        let mut live: Vec<Block> = Vec::new();
        for (op, x) in ops {
            if op == 0 && !live.is_empty() {
                let b = live.swap_remove(x % live.len());
                p.free(b).unwrap();
            } else {
                // Few distinct sizes, so the caches both hit and miss.
                let size = (x % 24 + 1) * (max_block / 24);
                let before = inner.stats().reserved_bytes;
                live.push(p.alloc(size).unwrap());
                if inner.stats().reserved_bytes > before {
                    proptest::prop_assert_eq!(p.stats().thread_cached_bytes, 0);
                }
            }
        }
        live.into_iter().for_each(|b| p.free(b).unwrap());
        let s = p.stats();
        proptest::prop_assert_eq!((s.live_blocks, s.live_bytes), (0, 0));
    }
}
