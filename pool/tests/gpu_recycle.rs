//! VMM page recycling on a real GPU: a page mapped a second time with `Driver::alias` shows
//! the same bytes at both addresses, and keeps them at the new one once `Driver::unalias`
//! drops the old; recycling a hole's pages behind a new block leaves the live neighbours' bytes
//! intact, also while a kernel queued before the free still reads the freed block (the old
//! mapping stays until a synchronize covers it).
//! Run on a machine with CUDA: `cargo test -p cupool-pool --release --test gpu_recycle -- --ignored`.
mod common;

use cudarc::driver::sys;
use cupool_pool::driver::cuda::CudaDriver;
use cupool_pool::driver::Driver;
use cupool_pool::pools::VmmPool;
use cupool_pool::upstream::vmm::VmmConfig;
use cupool_pool::{synchronize, Pool, PoolBuffer, Purge};
use std::sync::Arc;

use common::kernels::kernels;
use common::MIB;

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_alias_maps_a_page_twice_and_unalias_keeps_its_bytes() {
    if common::no_gpu() {
        return;
    }
    let drv = CudaDriver::new(0).unwrap();
    drv.context().bind_to_thread().unwrap();
    let gran = drv.granularity().unwrap();
    let base = drv.reserve(4 * gran, 0).unwrap();
    let handle = drv.map(base, gran).unwrap();
    // SAFETY: sets the bytes of the page just mapped, on the bound context.
    unsafe { sys::cuMemsetD8_v2(base, 0x5A, gran) }
        .result()
        .unwrap();
    drv.synchronize_device().unwrap();
    let to = base + 2 * gran as u64;
    drv.alias(base, to, gran, handle).unwrap();
    let read = |at: u64| {
        let mut got = vec![0u8; gran];
        // SAFETY: copies `gran` mapped bytes at `at` into a buffer of that size.
        unsafe { sys::cuMemcpyDtoH_v2(got.as_mut_ptr().cast(), at, gran) }
            .result()
            .unwrap();
        got
    };
    // One memory behind both: a write through the new address shows at the old one.
    // SAFETY: the first byte of the page mapped at `to`.
    unsafe { sys::cuMemsetD8_v2(to, 0x33, 1) }.result().unwrap();
    drv.synchronize_device().unwrap();
    let old = read(base);
    assert_eq!(
        (old[0], old[1]),
        (0x33, 0x5A),
        "both addresses reach one page"
    );
    drv.unalias(base, gran).unwrap();
    let got = read(to);
    assert!(
        got[0] == 0x33 && got[1..].iter().all(|&b| b == 0x5A),
        "the bytes stay at the new address once the old mapping is gone"
    );
    // A second mapping onto a mapped range is refused and changes nothing.
    let other = drv.map(base, gran).unwrap();
    assert!(drv.alias(to, base, gran, handle).is_err());
    assert_eq!(read(to)[1], 0x5A, "still mapped at its place");
    drv.unmap(base, gran, other).unwrap();
    drv.unmap(to, gran, handle).unwrap();
    drv.release_reservation(base, 4 * gran).unwrap();
}

/// The KV-cache pattern, many times, on a VMM pool with recycling and `lanes` on or off: each
/// round a block is replaced by a larger one while its neighbours stay live, and the old one is
/// freed with a check still queued on it. Every block's bytes are checked; returns the pool's
/// statistics, after checking that a purge gives every byte back.
fn replace_blocks(lanes: bool) -> cupool_pool::PoolStats {
    let drv = CudaDriver::new(0).unwrap();
    let k = kernels(&drv);
    let drv: Arc<dyn Driver> = Arc::new(drv);
    let config = VmmConfig {
        min_grow: 0,
        max_grow: 0,
        large_rounding: 2 * MIB,
        recycle: true,
        lanes,
        ..VmmConfig::default()
    };
    let pool: Arc<dyn Pool> = Arc::new(VmmPool::with_config(drv.clone(), config).unwrap());
    let bad = k.stream.alloc_zeros::<u32>(1).unwrap();
    let elems = |mib: usize| mib * MIB / 4;
    let mut live: Vec<(PoolBuffer<u32>, u32)> = Vec::new();
    for i in 0..8u32 {
        let b = PoolBuffer::<u32>::alloc(&pool, elems(8)).unwrap();
        k.fill(&b, i);
        live.push((b, i));
    }
    for round in 0..24u32 {
        let i = (round as usize * 3) % live.len();
        let (old, tag) = live.swap_remove(i);
        let grown = old.len() + elems(2) + 1;
        let new = PoolBuffer::<u32>::alloc(&pool, grown).unwrap();
        k.fill(&new, 100 + round);
        // Read the old one after the new one is written, then free it: the read is queued
        // when its pages become free to move.
        k.check(&old, tag, &bad);
        drop(old);
        live.push((new, 100 + round));
    }
    for (b, tag) in &live {
        k.check(b, *tag, &bad);
    }
    let mismatches = k.stream.clone_dtoh(&bad).unwrap()[0];
    let s = pool.stats();
    eprintln!(
        "{} (lanes {lanes}): mismatches {mismatches}, peak live {} MiB, peak reserved {} MiB, calls {:?}",
        drv.name(),
        s.live_peak_bytes / MIB,
        s.reserved_peak_bytes / MIB,
        s.calls
    );
    assert_eq!(mismatches, 0, "a live block lost its bytes");
    assert!(
        s.reserved_peak_bytes as f64 <= 1.25 * s.live_peak_bytes as f64,
        "{} reserved for {} live",
        s.reserved_peak_bytes,
        s.live_peak_bytes
    );
    drop(live);
    purge_gives_everything_back(pool, &drv);
    s
}

/// Purges `pool`, whose blocks are all freed, and drops it: what it held goes back to the
/// card, whose free memory rises by all of it.
fn purge_gives_everything_back(pool: Arc<dyn Pool>, drv: &Arc<dyn Driver>) {
    let (held, free_before) = (pool.stats().reserved_bytes, drv.mem_info().unwrap().free);
    let token = synchronize(drv.as_ref()).unwrap();
    pool.purge(&token, Purge::All).unwrap();
    assert_eq!(pool.stats().reserved_bytes, 0);
    drop(pool);
    let free_after = drv.mem_info().unwrap().free;
    assert!(
        free_after + 4 * MIB >= free_before + held,
        "held {held}, free before {free_before}, after {free_after}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_recycling_keeps_live_neighbours_and_queued_kernels_safe() {
    if common::no_gpu() {
        return;
    }
    let s = replace_blocks(false);
    assert!(s.calls.remaps > 0, "{:?}", s.calls);
}

/// The same with lanes: each replaced block's successors land in address space of their own,
/// mapping only what they grew by; a purge gives back the lanes' memory, and the pool's drop
/// their reservations.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_lanes_keep_every_byte_and_give_everything_back() {
    if common::no_gpu() {
        return;
    }
    let s = replace_blocks(true);
    assert!(
        s.calls.reserves > 1,
        "lanes reserve address space of their own: {:?}",
        s.calls
    );
}

/// A KV cache copied layer by layer, its growth made ahead on the pool's worker thread
/// (`upstream/vmm/ahead.rs`) while kernels write the copies and read the old blocks queued
/// behind their frees: every byte kept, the growth mapped on the worker; a trim gives the
/// lanes' memory back, the same request again has it made on the worker, and a purge and the
/// pool's drop give everything back.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_growth_made_ahead_on_the_worker_keeps_every_byte() {
    use cupool_pool::driver::timed::{TimedDriver, AHEAD_MAP};
    use cupool_pool::upstream::vmm::Ahead;
    if common::no_gpu() {
        return;
    }
    let cuda = CudaDriver::new(0).unwrap();
    let k = kernels(&cuda);
    let timed = Arc::new(TimedDriver::timed(Arc::new(cuda)));
    let drv: Arc<dyn Driver> = timed.clone();
    let config = VmmConfig {
        min_grow: 0,
        max_grow: 0,
        large_rounding: 2 * MIB,
        recycle: true,
        lanes: true,
        ahead: Ahead::Worker,
        ..VmmConfig::default()
    };
    let pool: Arc<dyn Pool> = Arc::new(VmmPool::with_config(drv.clone(), config).unwrap());
    let bad = k.stream.alloc_zeros::<u32>(1).unwrap();
    let step = 3 * MIB / 4;
    let times = || timed.times();
    let calls = |name: &str| times().get(name).map_or(0, |c| c.calls);
    // One request: 16 tensors copied 16 times, each 3 MiB larger; returns the pages it made
    // on this thread and on the worker.
    let request = || {
        let before = (calls("map"), calls(AHEAD_MAP));
        let mut cache: Vec<(PoolBuffer<u32>, u32)> = (0..16u32)
            .map(|i| {
                let b = PoolBuffer::<u32>::alloc(&pool, step).unwrap();
                k.fill(&b, i);
                (b, i)
            })
            .collect();
        for round in 1..=16u32 {
            for (i, slot) in cache.iter_mut().enumerate() {
                let tag = round * 100 + i as u32;
                let new = PoolBuffer::<u32>::alloc(&pool, slot.0.len() + step).unwrap();
                k.fill(&new, tag);
                let (old, old_tag) = std::mem::replace(slot, (new, tag));
                k.check(&old, old_tag, &bad);
                drop(old);
            }
        }
        for (b, tag) in &cache {
            k.check(b, *tag, &bad);
        }
        drop(cache);
        (calls("map") - before.0, calls(AHEAD_MAP) - before.1)
    };
    let first = request();
    let mismatches = k.stream.clone_dtoh(&bad).unwrap()[0];
    let s = pool.stats();
    eprintln!(
        "{}: mismatches {mismatches}, maps on the allocating thread {}, on the worker {}, peak live {} MiB, peak reserved {} MiB",
        drv.name(),
        first.0,
        first.1,
        s.live_peak_bytes / MIB,
        s.reserved_peak_bytes / MIB
    );
    assert_eq!(mismatches, 0, "a live block lost its bytes");
    assert!(
        // A lane is read as a cache's once two copies in a row grew alike in it and the growth
        // it would then have asked for was needed: the worker maps from about the sixth round
        // on (109 maps of 12 rounds on an H100).
        first.1 >= 16 * 8 && first.0 < first.1,
        "the worker maps the growth: {:?}",
        times()
    );
    // A trim: the lanes' memory goes back to the card, their address space stays
    // (`placement/lanes/trim.rs`), and the next request has it made again on the worker.
    let free_before = drv.mem_info().unwrap().free;
    let held = pool.stats().reserved_bytes;
    pool.purge(&synchronize(drv.as_ref()).unwrap(), Purge::All)
        .unwrap();
    assert_eq!(pool.stats().reserved_bytes, 0);
    assert!(drv.mem_info().unwrap().free + 4 * MIB >= free_before + held);
    let again = request();
    let mismatches = k.stream.clone_dtoh(&bad).unwrap()[0];
    eprintln!(
        "after a trim: mismatches {mismatches}, maps on the allocating thread {}, on the worker {}",
        again.0, again.1
    );
    assert_eq!(mismatches, 0, "a live block lost its bytes after the trim");
    assert!(
        again.0 * 2 <= first.0,
        "after a trim the worker makes the lanes' memory: first {first:?}, again {again:?}"
    );
    purge_gives_everything_back(pool, &drv);
}
