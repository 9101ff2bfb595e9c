//! The pools on a real GPU: every block is written by one kernel and checked by another, so an
//! overlap, a bad mapping or a premature release shows up as a mismatch or a fault.
//! Run on a machine with CUDA: `cargo test -p cupool-pool --test gpu -- --ignored`.
mod common;

use cudarc::driver::PushKernelArg;
use cupool_pool::adaptors::ManagedFallback;
use cupool_pool::driver::cuda::CudaDriver;
use cupool_pool::driver::limit::LimitedDriver;
use cupool_pool::driver::Driver;
use cupool_pool::placement::slots::SlotsConfig;
use cupool_pool::pools::{LegacyConfig, LegacyPool, ManagedConfig, ManagedPool, NcclPool, VmmPool};
use cupool_pool::{synchronize, Pool, PoolBuffer, Purge};
use std::sync::Arc;

use common::kernels::{cfg, kernels, Kernels};
use common::MIB;

fn exercise(name: &str, pool: Arc<dyn Pool>, k: &Kernels) {
    let bad = k.stream.alloc_zeros::<u32>(1).unwrap();
    let mut live: Vec<(PoolBuffer<u32>, u32)> = Vec::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for step in 0..400u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let free = x % 5 < 2 && !live.is_empty();
        if free {
            let (buf, tag) = live.swap_remove((x >> 8) as usize % live.len());
            let n = buf.len() as u64;
            let mut b = k.stream.launch_builder(&k.check);
            b.arg(&buf).arg(&tag).arg(&n).arg(&bad);
            // SAFETY: the kernel reads `n` u32 from a live buffer of that length and adds to a one-element counter.
            unsafe { b.launch(cfg(buf.len())) }.unwrap();
            drop(buf); // returned while the check may still be queued: reuse is stream-ordered
        } else {
            let elems = match x % 3 {
                0 => 1 + (x >> 20) as usize % 1024,
                1 => 1 + (x >> 20) as usize % (256 << 10),
                _ => 1 + (x >> 20) as usize % (8 * MIB),
            };
            let buf = PoolBuffer::<u32>::alloc(&pool, elems).unwrap();
            assert_eq!(buf.ptr() % pool.alignment() as u64, 0);
            let n = elems as u64;
            let mut b = k.stream.launch_builder(&k.fill);
            b.arg(&buf).arg(&step).arg(&n);
            // SAFETY: writes `n` u32 into a live buffer of exactly that length.
            unsafe { b.launch(cfg(elems)) }.unwrap();
            live.push((buf, step));
        }
        if step % 97 == 0 {
            let token = synchronize(pool.driver().as_ref()).unwrap();
            pool.purge(&token, Purge::All).unwrap();
        }
    }
    for (buf, tag) in live.drain(..) {
        let n = buf.len() as u64;
        let mut b = k.stream.launch_builder(&k.check);
        b.arg(&buf).arg(&tag).arg(&n).arg(&bad);
        // SAFETY: as above.
        unsafe { b.launch(cfg(buf.len())) }.unwrap();
    }
    let mismatches = k.stream.clone_dtoh(&bad).unwrap()[0];
    let s = pool.stats();
    eprintln!(
        "{name}: mismatches {mismatches}, peak live {} MiB, peak reserved {} MiB, calls {:?}",
        s.live_peak_bytes / MIB,
        s.reserved_peak_bytes / MIB,
        s.calls
    );
    assert_eq!(mismatches, 0, "{name}: a block was overwritten");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_pool_on_cuda_with_kernels() {
    if common::no_gpu() {
        return;
    }
    let drv = Arc::new(CudaDriver::new(0).unwrap());
    let d: Arc<dyn Driver> = drv.clone();
    assert!(d.vmm_supported());
    eprintln!(
        "device {}: granularity {} bytes, {:?}",
        d.name(),
        d.granularity().unwrap(),
        d.mem_info().unwrap()
    );
    let k = kernels(&drv);
    // Every pool allocates through one counting wrapper with no effective limit, so what they
    // still hold at the end is known exactly (mem_info also moves with the context's own
    // allocations, such as the kernels' local memory on first launch).
    let counted = Arc::new(LimitedDriver::new(d.clone(), usize::MAX));
    let c: Arc<dyn Driver> = counted.clone();
    let free_before = d.mem_info().unwrap().free;
    exercise("vmm", Arc::new(VmmPool::new(c.clone())), &k);
    exercise("legacy", Arc::new(LegacyPool::new(c.clone())), &k);
    exercise("nccl", Arc::new(NcclPool::new(c.clone())), &k);
    exercise(
        "legacy-4-slots-retry",
        Arc::new(
            LegacyPool::with_config(
                c.clone(),
                LegacyConfig {
                    placement: SlotsConfig {
                        slots: 4,
                        ..SlotsConfig::default()
                    },
                    flush_and_retry: true,
                    ..Default::default()
                },
            )
            .unwrap(),
        ),
        &k,
    );
    exercise(
        "managed",
        Arc::new(ManagedPool::new(c.clone(), ManagedConfig::default())),
        &k,
    );
    let limited: Arc<dyn Driver> = Arc::new(LimitedDriver::new(c.clone(), 64 * MIB));
    exercise(
        "vmm-64MiB-limit+managed-fallback",
        Arc::new(ManagedFallback::new(Arc::new(VmmPool::new(limited)), false)),
        &k,
    );
    k.stream.synchronize().unwrap();
    let free_after = d.mem_info().unwrap().free;
    eprintln!(
        "device free before {free_before}, after {free_after} (the context's own use included)"
    );
    assert_eq!(
        counted.used(),
        0,
        "the dropped pools still hold device memory"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_vmm_trim_returns_memory_to_the_card() {
    if common::no_gpu() {
        return;
    }
    let drv: Arc<dyn Driver> = Arc::new(CudaDriver::new(0).unwrap());
    let pool = VmmPool::new(drv.clone());
    let before = drv.mem_info().unwrap().free;
    let b = pool.alloc(512 * MIB).unwrap();
    let during = drv.mem_info().unwrap().free;
    assert!(before - during >= 512 * MIB);
    pool.free(b).unwrap();
    let token = synchronize(drv.as_ref()).unwrap();
    let r = pool.purge(&token, Purge::All).unwrap();
    assert!(r.bytes >= 512 * MIB);
    let after = drv.mem_info().unwrap().free;
    assert!(after + 4 * MIB >= before, "before {before}, after {after}");
}

#[cfg(feature = "poison")]
#[test]
#[ignore = "needs a CUDA GPU"]
fn poison_makes_a_use_after_free_fail_on_the_gpu() {
    if common::no_gpu() {
        return;
    }
    let drv = Arc::new(CudaDriver::new(0).unwrap());
    let k = kernels(&drv);
    for pool in [
        Arc::new(VmmPool::new(drv.clone())) as Arc<dyn Pool>,
        Arc::new(LegacyPool::new(drv.clone())),
    ] {
        let bad = k.stream.alloc_zeros::<u32>(1).unwrap();
        let n = 1u64 << 20;
        let buf = PoolBuffer::<u32>::alloc(&pool, n as usize).unwrap();
        let tag = 7u32;
        let mut b = k.stream.launch_builder(&k.fill);
        b.arg(&buf).arg(&tag).arg(&n);
        // SAFETY: writes n u32 into a live buffer of that length.
        unsafe { b.launch(cfg(n as usize)) }.unwrap();
        let ptr = buf.ptr();
        drop(buf); // poisoned, stream-ordered after the fill
        let mut b = k.stream.launch_builder(&k.check);
        b.arg(&ptr).arg(&tag).arg(&n).arg(&bad);
        // SAFETY: the deliberate bug: reads freed (but still pool-owned, mapped) memory.
        unsafe { b.launch(cfg(n as usize)) }.unwrap();
        let mismatches = k.stream.clone_dtoh(&bad).unwrap()[0];
        eprintln!("{:?}: {mismatches} of {n} stale reads caught", pool.kind());
        assert_eq!(mismatches as u64, n, "every stale read must see the poison");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_faults_injected_at_every_mapping_step_leave_nothing_behind() {
    if common::no_gpu() {
        return;
    }
    use cupool_pool::driver::fault::FaultInjector;
    use cupool_pool::driver::{CallKind, ErrorCode};
    let drv = Arc::new(CudaDriver::new(0).unwrap());
    let counted = Arc::new(LimitedDriver::new(drv.clone(), usize::MAX));
    let faults = Arc::new(FaultInjector::new(counted.clone()));
    for kind in [
        CallKind::Granularity,
        CallKind::Reserve,
        CallKind::Create,
        CallKind::Map,
        CallKind::SetAccess,
        CallKind::Malloc,
        CallKind::MallocManaged,
    ] {
        let pools: Vec<Arc<dyn Pool>> = vec![
            Arc::new(VmmPool::new(faults.clone())),
            Arc::new(LegacyPool::new(faults.clone())),
            Arc::new(ManagedPool::new(faults.clone(), ManagedConfig::default())),
        ];
        for pool in pools {
            faults.fail_nth(kind, 1, ErrorCode::Injected);
            match pool.alloc(4 * MIB) {
                Err(e) => assert!(e.to_string().contains(kind.cuda_name()), "{kind:?}: {e}"),
                Ok(b) => pool.free(b).unwrap(), // this pool makes no call of that kind
            }
            faults.clear_faults();
            let b = pool.alloc(4 * MIB).expect("usable after the fault");
            pool.free(b).unwrap();
            let token = synchronize(faults.as_ref()).unwrap();
            pool.purge(&token, Purge::All).unwrap();
        }
        assert_eq!(counted.used(), 0, "{kind:?}: device memory left behind");
    }
    // A failed unmap keeps the mapping; the next trim takes it back.
    let pool = VmmPool::new(faults.clone());
    let b = pool.alloc(8 * MIB).unwrap();
    pool.free(b).unwrap();
    faults.fail_nth(CallKind::Unmap, 1, ErrorCode::Injected);
    let token = synchronize(faults.as_ref()).unwrap();
    assert!(pool.purge(&token, Purge::All).is_err());
    assert!(counted.used() > 0);
    let token = synchronize(faults.as_ref()).unwrap();
    pool.purge(&token, Purge::All).unwrap();
    assert_eq!(counted.used(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_memory_of_live_blocks_outlives_their_pool() {
    if common::no_gpu() {
        return;
    }
    let drv = Arc::new(CudaDriver::new(0).unwrap());
    let k = kernels(&drv);
    let counted = Arc::new(LimitedDriver::new(drv.clone(), usize::MAX));
    let pools: Vec<Arc<dyn Pool>> = vec![
        Arc::new(VmmPool::new(counted.clone())),
        Arc::new(LegacyPool::new(counted.clone())),
    ];
    for pool in pools {
        let kind = pool.kind();
        let n = (16 * MIB / 4) as u64;
        let live = pool.alloc(16 * MIB).unwrap();
        let idle = pool.alloc(32 * MIB).unwrap();
        pool.free(idle).unwrap();
        drop(pool); // the idle 32 MiB go back; the live block's memory must stay mapped
        assert!(
            counted.used() >= 16 * MIB && counted.used() < 48 * MIB,
            "{kind}: {}",
            counted.used()
        );
        let (ptr, tag) = (live.ptr(), 5u32);
        let bad = k.stream.alloc_zeros::<u32>(1).unwrap();
        let mut b = k.stream.launch_builder(&k.fill);
        b.arg(&ptr).arg(&tag).arg(&n);
        // SAFETY: the block is live (its pool is gone, its memory is not): n u32 fit in it.
        unsafe { b.launch(cfg(n as usize)) }.unwrap();
        let mut b = k.stream.launch_builder(&k.check);
        b.arg(&ptr).arg(&tag).arg(&n).arg(&bad);
        // SAFETY: as above.
        unsafe { b.launch(cfg(n as usize)) }.unwrap();
        assert_eq!(k.stream.clone_dtoh(&bad).unwrap()[0], 0, "{kind}");
        drop(live); // the last block: now everything goes
        assert_eq!(counted.used(), 0, "{kind}: memory left behind");
    }
}

/// More than ggml's fixed 32 GiB of address space live in one VMM pool: 40 blocks of 1 GiB over
/// reservations of 8 GiB, so the pool grows through at least five of them. Each block is filled
/// with its own byte (cuMemsetD8 over all of it, so a block that crosses from one reservation
/// into the next is written across the boundary), and bytes at its start, middle and end are
/// read back after all are allocated: the blocks are mapped, writable and distinct. Skipped
/// (with a line saying why) on a card with less free memory.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_vmm_serves_more_than_32_gib_over_small_reservations() {
    if common::no_gpu() {
        return;
    }
    use cudarc::driver::sys;
    use cupool_pool::upstream::vmm::VmmConfig;
    const GIB: usize = 1 << 30;
    const BLOCKS: usize = 40;
    const PROBE: usize = 16;
    let drv = Arc::new(CudaDriver::new(0).unwrap());
    let d: Arc<dyn Driver> = drv.clone();
    let free = d.mem_info().unwrap().free;
    let needed = (BLOCKS + 1) * GIB;
    if free < needed {
        eprintln!(
            "skipped: {} has {} MiB free, this test needs {} MiB",
            d.name(),
            free / MIB,
            needed / MIB
        );
        return;
    }
    let config = VmmConfig {
        reserve_bytes: Some(8 * GIB),
        ..VmmConfig::default()
    };
    let pool = VmmPool::with_config(d.clone(), config).unwrap();
    drv.context().bind_to_thread().unwrap();
    let offsets = [0, GIB / 2, GIB - PROBE];
    let mut blocks = Vec::with_capacity(BLOCKS);
    for i in 0..BLOCKS {
        let b = pool.alloc(GIB).unwrap();
        // SAFETY: writes the live block's own bytes (its size), on the bound context.
        unsafe { sys::cuMemsetD8_v2(b.ptr(), i as u8 + 1, b.size()) }
            .result()
            .unwrap();
        blocks.push(b);
    }
    let mut spans: Vec<(u64, u64)> = blocks
        .iter()
        .map(|b| (b.ptr(), b.ptr() + b.size() as u64))
        .collect();
    spans.sort_unstable();
    assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "blocks overlap");
    for (i, b) in blocks.iter().enumerate() {
        for off in offsets {
            let mut got = [0u8; PROBE];
            // SAFETY: copies PROBE bytes of a live block into a buffer of that size.
            unsafe { sys::cuMemcpyDtoH_v2(got.as_mut_ptr().cast(), b.ptr() + off as u64, PROBE) }
                .result()
                .unwrap();
            assert_eq!(got, [i as u8 + 1; PROBE], "block {i} at offset {off}");
        }
    }
    let s = pool.stats();
    eprintln!(
        "{}: {} GiB live in one vmm pool, {} reservations of at most 8 GiB, {} maps",
        d.name(),
        s.live_bytes / GIB,
        s.calls.reserves,
        s.calls.maps
    );
    assert!(s.live_bytes >= BLOCKS * GIB);
    assert!(s.calls.reserves >= 5, "{:?}", s.calls);
    for b in blocks {
        pool.free(b).unwrap();
    }
    let token = synchronize(d.as_ref()).unwrap();
    pool.purge(&token, Purge::All).unwrap();
    assert_eq!(pool.stats().reserved_bytes, 0);
    drop(pool);
    let after = d.mem_info().unwrap().free;
    assert!(after + 64 * MIB >= free, "before {free}, after {after}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_vmm_sleep_frees_the_card_and_wake_restores_every_byte() {
    if common::no_gpu() {
        return;
    }
    let drv = CudaDriver::new(0).unwrap();
    let k = kernels(&drv);
    let drv: Arc<dyn Driver> = Arc::new(drv);
    let pool: Arc<dyn Pool> = Arc::new(VmmPool::new(drv.clone()));
    let bad = k.stream.alloc_zeros::<u32>(1).unwrap();
    let sizes = [1usize, 3 * MIB, 64 * MIB, 300 * MIB];
    let bufs: Vec<(PoolBuffer<u32>, u32)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let buf = PoolBuffer::<u32>::alloc(&pool, n).unwrap();
            let (tag, n) = (i as u32 + 7, n as u64);
            let mut b = k.stream.launch_builder(&k.fill);
            b.arg(&buf).arg(&tag).arg(&n);
            // SAFETY: writes `n` u32 into a live buffer of exactly that length.
            unsafe { b.launch(cfg(buf.len())) }.unwrap();
            (buf, tag)
        })
        .collect();
    let ptrs: Vec<u64> = bufs.iter().map(|(b, _)| b.ptr()).collect();
    let reserved = pool.stats().reserved_bytes;
    k.stream.synchronize().unwrap();
    let before = drv.mem_info().unwrap().free;
    let t = std::time::Instant::now();
    let slept = pool
        .sleep(&synchronize(drv.as_ref()).unwrap(), true)
        .unwrap();
    let sleep_s = t.elapsed().as_secs_f64();
    let during = drv.mem_info().unwrap().free;
    assert_eq!(slept.bytes, slept.copied);
    assert!(
        (during - before) as f64 >= 0.995 * reserved as f64,
        "freed {} of {reserved} reserved bytes",
        during - before
    );
    assert!(pool.alloc(64).is_err(), "an asleep pool serves nothing");
    let t = std::time::Instant::now();
    let woken = pool.wake().unwrap();
    let wake_s = t.elapsed().as_secs_f64();
    assert_eq!((woken.bytes, woken.copied), (slept.bytes, slept.copied));
    for ((buf, tag), ptr) in bufs.iter().zip(&ptrs) {
        assert_eq!(buf.ptr(), *ptr, "addresses are kept");
        let n = buf.len() as u64;
        let mut b = k.stream.launch_builder(&k.check);
        b.arg(buf).arg(tag).arg(&n).arg(&bad);
        // SAFETY: reads `n` u32 from a live buffer of that length.
        unsafe { b.launch(cfg(buf.len())) }.unwrap();
    }
    assert_eq!(
        k.stream.clone_dtoh(&bad).unwrap()[0],
        0,
        "offloaded bytes restored"
    );
    eprintln!(
        "sleep/wake of {} MiB with offload: sleep {sleep_s:.3} s, wake {wake_s:.3} s, freed {} MiB",
        slept.bytes / MIB,
        (during - before) / MIB
    );
    // Without offload: the memory comes back writable, at the same addresses.
    pool.sleep(&synchronize(drv.as_ref()).unwrap(), false)
        .unwrap();
    pool.wake().unwrap();
    let (buf, tag) = &bufs[3];
    let n = buf.len() as u64;
    let mut b = k.stream.launch_builder(&k.fill);
    b.arg(buf).arg(tag).arg(&n);
    // SAFETY: writes `n` u32 into a live buffer of exactly that length.
    unsafe { b.launch(cfg(buf.len())) }.unwrap();
    let mut b = k.stream.launch_builder(&k.check);
    b.arg(buf).arg(tag).arg(&n).arg(&bad);
    // SAFETY: reads `n` u32 from a live buffer of that length.
    unsafe { b.launch(cfg(buf.len())) }.unwrap();
    assert_eq!(k.stream.clone_dtoh(&bad).unwrap()[0], 0);
    drop(bufs);
}
