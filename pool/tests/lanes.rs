//! Lanes in a recycling VMM pool: a tensor replaced every step by a slightly larger copy (a KV
//! cache concatenated every chunk) gets address space of its own, where the next copies land
//! and only what they grow by gets new memory.
mod common;
use common::*;
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::{CallKind, ErrorCode};
use cupool_pool::sync::synchronize;
use cupool_pool::Purge;
use cupool_pool::{Block, Pool};
use std::sync::Arc;

/// What a run of [`grow_cache`] held and did.
#[derive(Debug)]
struct Run {
    /// Peak of the pool's reserve.
    peak: usize,
    /// Peak of the bytes live.
    live: usize,
    remaps: u64,
}

/// `tensors` tensors of 3 MiB grown by 3 MiB a step for `steps` steps, each step copying every
/// one into a new block before freeing the old (as `torch.cat` does), with a 6 MiB activation
/// taken and freed between the copies. Every tensor's bytes are checked at the end.
fn grow_cache(p: &dyn Pool, dev: &SimDevice, tensors: usize, steps: usize) -> Run {
    let mut cache: Vec<Block> = (0..tensors).map(|_| p.alloc(3 * MIB).unwrap()).collect();
    for (k, b) in cache.iter().enumerate() {
        fill(b, k as u8);
    }
    let (mut peak, mut live) = (0, 0);
    for step in 1..=steps {
        for k in 0..tensors {
            let size = 3 * MIB * (step + 1);
            let grown = p.alloc(size).unwrap();
            fill(&grown, (k + step) as u8);
            let act = p.alloc(6 * MIB).unwrap();
            let now: usize = cache.iter().map(|b| b.size()).sum::<usize>() + size + act.size();
            live = live.max(now);
            peak = peak.max(p.stats().reserved_bytes);
            p.free(act).unwrap();
            let old = std::mem::replace(&mut cache[k], grown);
            p.free(old).unwrap();
        }
    }
    for (k, b) in cache.iter().enumerate() {
        assert!(holds(b, (k + steps) as u8), "tensor {k} kept its bytes");
        assert!(dev.contains(b.ptr(), b.size()));
    }
    let remaps = p.stats().calls.remaps;
    for b in cache {
        p.free(b).unwrap();
    }
    Run { peak, live, remaps }
}

/// With lanes the cache's copies grow in place: the reserve stays within 16 MiB of the live
/// peak. Without them the same traffic holds more and moves more pages.
#[test]
fn a_cache_grown_by_replacement_maps_only_its_growth() {
    let dev = sim(2.0);
    let p = vmm_with(as_driver(&dev), 8 * MIB, true);
    let with = grow_cache(&p, &dev, 8, 12);
    assert!(
        with.peak <= with.live + 16 * MIB,
        "lanes hold the live peak and little more: {with:?}"
    );
    let dev2 = sim(2.0);
    let q = vmm_with(as_driver(&dev2), 8 * MIB, false);
    let without = grow_cache(&q, &dev2, 8, 12);
    assert!(
        without.peak > with.peak && without.remaps > with.remaps,
        "{with:?} {without:?}"
    );
}

/// The next requests on the same pool (no purge between) grow their caches over the lanes the
/// first one left, in their memory. Before, each moved the old lanes' pages one by one: in this
/// miniature 110 to 128 pages and 3 to 5 synchronizes a request against the first's 30 and 6,
/// with the reserve growing for three requests; the recorded PyTorch prefills moved
/// thousands (`data/cpu-2026-11-28-lanes-again`, where they now make no driver call at all).
#[test]
fn the_next_requests_grow_their_caches_over_the_lanes_the_first_left() {
    for first in [12, 6] {
        let dev = sim(2.0);
        let p = vmm_with(as_driver(&dev), 8 * MIB, true);
        let weights = p.alloc(40 * MIB).unwrap();
        // (peak reserve, pages created, moved, unmapped, synchronizes) per request.
        let mut runs = Vec::new();
        for s in [first, 12, 12, 12, 12] {
            let calls = p.stats().calls;
            let run = grow_cache(&p, &dev, 8, s);
            let after = p.stats().calls;
            runs.push((
                run.peak,
                after.maps - calls.maps,
                after.remaps - calls.remaps,
                after.unmaps - calls.unmaps,
                after.syncs - calls.syncs,
            ));
        }
        let full = if first == 12 { runs[0] } else { runs[1] };
        for (k, r) in runs.iter().enumerate().skip(1) {
            assert!(
                r.2 <= full.2 && r.4 <= full.4,
                "first {first}: request {k} moved pages or synchronized more than the first full one did: {runs:?}"
            );
        }
        // The reserve settles within three requests of the first full one.
        let settled = if first == 12 { 3 } else { 4 };
        assert_eq!(
            (runs[settled].0, runs[settled].1),
            (runs[settled - 1].0, 0),
            "first {first}: the reserve still grew: {runs:?}"
        );
        p.free(weights).unwrap();
    }
}

/// A recycling pool over a fault injector, with a block `b` of 6 MiB in the range and its grown
/// copy `c` of 8 MiB in a lane of its own (`b` is still live).
fn faulty_pool_with_a_lane() -> (
    Arc<SimDevice>,
    Arc<cupool_pool::driver::fault::FaultInjector>,
    cupool_pool::pools::VmmPool,
    Block,
    Block,
) {
    let dev = sim(2.0);
    let fi = Arc::new(cupool_pool::driver::fault::FaultInjector::new(as_driver(
        &dev,
    )));
    let p = vmm_with(
        fi.clone() as Arc<dyn cupool_pool::driver::Driver>,
        8 * MIB,
        true,
    );
    let a = p.alloc(4 * MIB).unwrap();
    let b = p.alloc(6 * MIB).unwrap();
    p.free(a).unwrap(); // replaced by a grown copy: a lane opens for the next block
    let c = p.alloc(8 * MIB).unwrap();
    assert_eq!(dev.ledger().reservations, 2, "c in a lane");
    (dev, fi, p, b, c)
}

/// A failed backing that moved pages into a block's range (the rest could not be created)
/// leaves their old mappings busy: a purge under a token from before does not release them
/// (it fails, else), and one after a synchronize does.
#[test]
fn a_purge_after_a_failed_backing_that_moved_pages_waits_for_them() {
    let (dev, fi, p, _b, c) = faulty_pool_with_a_lane();
    let token = synchronize(&*dev).unwrap();
    p.free(c).unwrap(); // every lane free: the lane is left for the next request
    fi.fail_nth(CallKind::Create, 1, ErrorCode::Injected);
    assert!(p.alloc(10 * MIB).is_err(), "its backing fails");
    let r = p.purge(&token, Purge::All).unwrap();
    assert!(r.deferred_bytes >= 8 * MIB, "{r:?}");
    p.purge(&synchronize(&*dev).unwrap(), Purge::All).unwrap();
    assert!(p.releasable(&Purge::All) < 64 * MIB);
}

/// A purge after the cache is freed gives back every lane's memory and keeps their address
/// space for the next request, which takes the lanes again and opens none (`tests/trim.rs`);
/// the pool's drop releases the address space too.
#[test]
fn a_purge_gives_back_the_free_lanes_memory_and_keeps_their_address_space() {
    let dev = sim(2.0);
    let p = vmm_with(as_driver(&dev), 8 * MIB, true);
    grow_cache(&p, &dev, 4, 6);
    let before = dev.ledger();
    assert!(
        before.reservations > 1,
        "lanes are reservations of their own: {before:?}"
    );
    p.purge(&synchronize(&*dev).unwrap(), Purge::All).unwrap();
    let after = dev.ledger();
    assert_eq!(after.device_bytes, 0, "{after:?}");
    assert_eq!(after.mappings, 0, "{after:?}");
    assert_eq!(p.stats().reserved_bytes, 0);
    assert_eq!(
        after.reservations, before.reservations,
        "the lanes' address space stays: {after:?}"
    );
    grow_cache(&p, &dev, 4, 6);
    assert_eq!(
        dev.ledger().reservations,
        before.reservations,
        "no lane opened"
    );
    drop(p);
    assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
}

/// Where the driver has no address space for a lane (a Jetson), blocks stay in the range and
/// every allocation still succeeds.
#[test]
fn without_address_space_for_lanes_blocks_stay_in_the_range() {
    let dev = Arc::new(SimDevice::new(SimConfig::gib(2.0).address_space(512 * MIB)).unwrap());
    let p = cupool_pool::pools::VmmPool::with_config(
        as_driver(&dev),
        cupool_pool::upstream::vmm::VmmConfig {
            reserve_bytes: Some(256 * MIB),
            recycle: true,
            large_rounding: 2 * MIB,
            ..Default::default()
        },
    )
    .unwrap();
    let run = grow_cache(&p, &dev, 4, 6);
    assert!(run.peak >= run.live);
    assert_eq!(dev.ledger().reservations, 1, "the range's only");
}

/// Sleep unmaps the lanes' memory like the range's, and a wake with offload restores every
/// tensor in its lane.
#[test]
fn sleep_and_wake_keep_the_tensors_in_their_lanes() {
    let dev = sim(2.0);
    let p = vmm_with(as_driver(&dev), 8 * MIB, true);
    let mut cache: Vec<Block> = (0..4).map(|_| p.alloc(3 * MIB).unwrap()).collect();
    for _ in 0..3 {
        for b in cache.iter_mut() {
            let grown = p.alloc(b.size() + 3 * MIB).unwrap();
            p.free(std::mem::replace(b, grown)).unwrap();
        }
    }
    assert!(dev.ledger().reservations > 1, "the tensors are in lanes");
    for (k, b) in cache.iter().enumerate() {
        fill(b, 40 + k as u8);
    }
    let held = dev.ledger().device_bytes;
    p.sleep(&synchronize(&*dev).unwrap(), true).unwrap();
    assert!(dev.ledger().device_bytes < held / 10, "{:?}", dev.ledger());
    p.wake().unwrap();
    for (k, b) in cache.iter().enumerate() {
        assert!(holds(b, 40 + k as u8), "tensor {k} restored at its address");
    }
    for b in cache {
        p.free(b).unwrap();
    }
}

/// A lane's block freed after a synchronize is not released under that synchronize's token,
/// also after a block that landed in the free lane failed to get memory (a failure other than
/// out of memory): the lane's memory is still the freed block's, which a queued kernel may read.
/// A purge defers the lane's memory, not its address space.
#[test]
fn a_failed_backing_in_a_free_lane_keeps_its_free_epoch() {
    for inject in [false, true] {
        let (dev, fi, p, b, c) = faulty_pool_with_a_lane();
        p.free(b).unwrap(); // replaced by c: another lane opens
        let _d = p.alloc(12 * MIB).unwrap();
        assert_eq!(dev.ledger().reservations, 3, "d in a lane");
        let token = synchronize(&*dev).unwrap();
        p.free(c).unwrap(); // d's lane is busy: c's is free, not left for a next request
        if inject {
            fi.fail_nth(CallKind::Create, 1, ErrorCode::Injected);
            assert!(
                p.alloc(10 * MIB).is_err(),
                "lands in the free lane, and its map fails"
            );
        }
        let r = p.purge(&token, Purge::All).unwrap();
        assert_eq!(dev.ledger().reservations, 3, "inject {inject}: {r:?}");
        assert!(
            r.deferred_bytes >= 8 * MIB && r.deferred_bytes < 64 * MIB,
            "the lane's memory deferred, not its address space: {r:?}"
        );
        assert!(p.releasable(&Purge::All) < 64 * MIB);
    }
}

/// The largest block the pool can still place: a search over sizes in 2 MiB steps; each
/// refusal must leave the pool consistent, each success is freed again.
fn largest_alloc(p: &dyn Pool, most: usize) -> usize {
    let (mut lo, mut hi) = (0, most / (2 * MIB));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        match p.alloc(mid * 2 * MIB) {
            Ok(b) => {
                p.free(b).unwrap();
                lo = mid;
            }
            Err(_) => hi = mid - 1,
        }
    }
    lo * 2 * MIB
}

/// A lane the next request took again and freed while another lane is busy keeps its memory
/// for the cache (out of the free spans), and names all of it as surplus: an out-of-memory
/// sheds it, and the largest block that still fits is the card less what is live (with 9 MiB
/// live: 978 MiB before, when the lane's first bytes were neither free nor surplus; 1,014 now).
#[test]
fn a_free_lane_taken_again_can_be_shed() {
    let dev = sim(1.0);
    let p = vmm_with(as_driver(&dev), 8 * MIB, true);
    // The first request: four lanes of 39 MiB, all left.
    grow_cache(&p, &dev, 4, 12);
    // The next request's cache takes them again and grows to 9 MiB; one tensor stays live.
    let mut cache: Vec<Block> = (0..4).map(|_| p.alloc(3 * MIB).unwrap()).collect();
    for step in 1..=2 {
        for b in cache.iter_mut() {
            let grown = p.alloc(3 * MIB * (step + 1)).unwrap();
            p.free(std::mem::replace(b, grown)).unwrap();
        }
    }
    let kept = cache.remove(0);
    for b in cache {
        p.free(b).unwrap();
    }
    let live = kept.size();
    let largest = largest_alloc(&p, 1 << 30);
    // What is live, its lane's granule and one page of the pool's bookkeeping may stay.
    assert!(
        largest + live + 16 * MIB >= 1 << 30,
        "largest {} MiB with {} MiB live",
        largest / MIB,
        live / MIB
    );
    p.free(kept).unwrap();
}

/// Where the driver refused address space for more lanes, the lanes already open are still
/// taken again by the next request: its copies grow there as the first request's did, with no
/// more page moves or synchronizes than the first request made.
#[test]
fn the_next_request_takes_the_lanes_again_after_address_space_ran_out() {
    let dev = Arc::new(
        SimDevice::new(SimConfig::gib(2.0).address_space(512 * MIB + 4 * (1 << 30))).unwrap(),
    );
    let p = cupool_pool::pools::VmmPool::with_config(
        as_driver(&dev),
        cupool_pool::upstream::vmm::VmmConfig {
            reserve_bytes: Some(512 * MIB),
            ..recycling_config(8 * MIB, true)
        },
    )
    .unwrap();
    let mut runs = Vec::new();
    for _ in 0..3 {
        let calls = p.stats().calls;
        grow_cache(&p, &dev, 6, 10);
        let after = p.stats().calls;
        runs.push((
            after.maps - calls.maps,
            after.remaps - calls.remaps,
            after.syncs - calls.syncs,
        ));
        assert_eq!(
            dev.ledger().reservations,
            5,
            "the range and four lanes: no fifth fits"
        );
    }
    // Before, the left lanes were never taken again here: the next requests moved more pages
    // (158 and 79 against the first's 100) with 4-5 synchronizes; the maps stayed few either way.
    for r in &runs[1..] {
        assert!(
            r.1 <= runs[0].1 && r.2 <= runs[0].2 && r.0 < runs[0].0 / 4,
            "the next requests grow in the lanes the first left: {runs:?}"
        );
    }
}
