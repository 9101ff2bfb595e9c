//! Page moves made by a worker thread on a real GPU (`DeferredDriver`): the allocating stream
//! waits on the device for the queued mappings (cuStreamWaitValue32), and kernels queued
//! after an allocation write and read its memory only once it is mapped; a stream being
//! captured makes the host wait instead.
//! Run on a machine with CUDA: `cargo test -p cupool-pool --release --test gpu_deferred -- --ignored`.
mod common;

use cupool_pool::driver::cuda::CudaDriver;
use cupool_pool::driver::deferred::DeferredDriver;
use cupool_pool::driver::Driver;
use cupool_pool::pools::VmmPool;
use cupool_pool::upstream::vmm::VmmConfig;
use cupool_pool::{synchronize, Pool, PoolBuffer, Purge};
use std::sync::Arc;

use common::kernels::kernels;
use common::MIB;

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_queued_moves_are_waited_for_by_the_stream_and_keep_every_byte() {
    if common::no_gpu() {
        return;
    }
    let cuda = CudaDriver::new(0).unwrap();
    let k = kernels(&cuda);
    let stream = k.stream.cu_stream() as u64;
    // The primitives first: a word the device reads, and a wait on it that holds the stream
    // back until the host writes it.
    let word = cuda
        .wait_word()
        .unwrap()
        .expect("a word streams can wait on");
    assert!(!cuda.stream_capturing(stream).unwrap());
    cuda.stream_wait(stream, &word, 1).unwrap();
    let event = k.stream.record_event(None).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        !event.is_complete(),
        "the stream ran past a wait for a value not yet written"
    );
    word.set(1);
    k.stream.synchronize().unwrap();
    assert!(event.is_complete());
    let deferred = Arc::new(DeferredDriver::new(Arc::new(cuda)));
    let drv: Arc<dyn Driver> = deferred.clone();
    let config = VmmConfig {
        min_grow: 0,
        max_grow: 0,
        large_rounding: 2 * MIB,
        recycle: true,
        recycle_free: 0,
        ..VmmConfig::default()
    };
    let pool: Arc<dyn Pool> = Arc::new(VmmPool::with_config(drv.clone(), config).unwrap());
    let bad = k.stream.alloc_zeros::<u32>(1).unwrap();
    let elems = |mib: usize| mib * MIB / 4;
    let alloc = |n: usize| {
        let b = PoolBuffer::<u32>::alloc(&pool, n).unwrap();
        drv.fence(stream).unwrap();
        b
    };
    // The KV-cache pattern of gpu_recycle.rs: every round a block is replaced by a larger one
    // while its neighbours stay live, the new one written right after its allocation (behind
    // the wait), the old one read and freed.
    let mut live: Vec<(PoolBuffer<u32>, u32)> = Vec::new();
    for i in 0..8u32 {
        let b = alloc(elems(8));
        k.fill(&b, i);
        live.push((b, i));
    }
    for round in 0..48u32 {
        let i = (round as usize * 3) % live.len();
        let (old, tag) = live.swap_remove(i);
        let new = alloc(old.len() + elems(2) + 1);
        k.fill(&new, 100 + round);
        k.check(&old, tag, &bad);
        drop(old);
        live.push((new, 100 + round));
        if round % 16 == 15 {
            // A synchronize lets the old mappings go: their drops are queued too.
            synchronize(drv.as_ref()).unwrap();
        }
    }
    for (b, tag) in &live {
        k.check(b, *tag, &bad);
    }
    let mismatches = k.stream.clone_dtoh(&bad).unwrap()[0];
    let s = pool.stats();
    let (on_stream, on_host) = deferred.waits();
    eprintln!(
        "{}: queued moves: mismatches {mismatches}, moves {}, fences waited on the stream {on_stream}, on the host {on_host}, peak live {} MiB, peak reserved {} MiB",
        drv.name(),
        s.calls.remaps,
        s.live_peak_bytes / MIB,
        s.reserved_peak_bytes / MIB,
    );
    assert_eq!(mismatches, 0, "a block lost its bytes");
    assert!(s.calls.remaps > 0, "{:?}", s.calls);
    assert!(
        on_stream > 0,
        "no fence waited on the stream ({on_host} on the host)"
    );
    drop(live);
    let token = synchronize(drv.as_ref()).unwrap();
    pool.purge(&token, Purge::All).unwrap();
    assert_eq!(pool.stats().reserved_bytes, 0);
    assert_eq!(deferred.pending(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_a_stream_being_captured_waits_on_the_host() {
    if common::no_gpu() {
        return;
    }
    let cuda = CudaDriver::new(0).unwrap();
    let ctx = cuda.context().clone();
    // Moves made 50 ms late: the fences below find them queued.
    let deferred = DeferredDriver::new(common::slow(Arc::new(cuda), 50));
    let d: &dyn Driver = &deferred;
    let gran = d.granularity().unwrap();
    let base = d.reserve(4 * gran, 0).unwrap();
    let h = d.map(base, gran).unwrap();
    let to = base + 2 * gran as u64;
    // A move queued, then a fence on a stream being captured into a graph: a wait in the graph
    // would be part of every replay, so the host waits for the move instead.
    let s = ctx.new_stream().unwrap();
    s.begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .unwrap();
    d.alias(base, to, gran, h).unwrap();
    d.fence(s.cu_stream() as u64).unwrap();
    let graph = s
        .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
        .expect("the capture stayed valid");
    assert_eq!(deferred.pending(), 0);
    assert_eq!(
        deferred.waits(),
        (0, 1),
        "the captured stream was given a wait"
    );
    drop(graph);
    // The same fence on the stream outside a capture waits on the device.
    d.unalias(base, gran).unwrap();
    d.fence(s.cu_stream() as u64).unwrap();
    assert_eq!(deferred.waits(), (1, 1));
    s.synchronize().unwrap();
    d.synchronize_device().unwrap();
    d.unmap(to, gran, h).unwrap();
    d.release_reservation(base, 4 * gran).unwrap();
}
