//! Two GPUs, and memory made for NCCL, on real devices: a kernel on device 1 reads and writes
//! device 0's pool memory (VMM mappings are made accessible to every peer, as ggml's VMM pool
//! does for `-sm row`), and the `nccl` kind's blocks are each one exportable allocation, as
//! `ncclMemAlloc` makes them. Skipped (saying why) with fewer than two GPUs where two are needed.
//! Run on a machine with CUDA: `cargo test -p cupool-pool --test gpu_peers -- --ignored`.
mod common;

use cudarc::driver::{sys, PushKernelArg};
use cupool_pool::driver::cuda::{device_count, CudaDriver};
use cupool_pool::driver::limit::LimitedDriver;
use cupool_pool::driver::Driver;
use cupool_pool::pools::{NcclPool, VmmPool};
use cupool_pool::{synchronize, Pool, PoolBuffer};
use std::sync::Arc;

use common::kernels::{cfg, kernels, Kernels};
use common::MIB;

/// Fills `buf` with `tag` on `writer`'s device, checks it on `reader`'s, and returns the words
/// that differ.
fn cross(buf: &PoolBuffer<u32>, tag: u32, writer: &Kernels, reader: &Kernels) -> u32 {
    let n = buf.len() as u64;
    let mut b = writer.stream.launch_builder(&writer.fill);
    b.arg(buf).arg(&tag).arg(&n);
    // SAFETY: writes `n` u32 into a live buffer of that length.
    unsafe { b.launch(cfg(buf.len())) }.unwrap();
    writer.stream.synchronize().unwrap();
    let bad = reader.stream.alloc_zeros::<u32>(1).unwrap();
    let mut b = reader.stream.launch_builder(&reader.check);
    b.arg(buf).arg(&tag).arg(&n).arg(&bad);
    // SAFETY: reads `n` u32 of a live buffer (another device's memory, mapped for this one).
    unsafe { b.launch(cfg(buf.len())) }.unwrap();
    reader.stream.clone_dtoh(&bad).unwrap()[0]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_kernel_on_device_1_reads_and_writes_device_0_pool_memory() {
    if common::no_gpu() {
        return;
    }
    if device_count().unwrap() < 2 {
        eprintln!("skipped: needs two GPUs");
        return;
    }
    let d0 = Arc::new(CudaDriver::new(0).unwrap());
    let d1 = Arc::new(CudaDriver::new(1).unwrap());
    let (k0, k1) = (kernels(&d0), kernels(&d1));
    let drv: Arc<dyn Driver> = d0.clone();
    for (name, pool) in [
        ("vmm", Arc::new(VmmPool::new(drv.clone())) as Arc<dyn Pool>),
        ("nccl", Arc::new(NcclPool::new(drv.clone()))),
    ] {
        // Several blocks, so later ones land in grown segments and further mappings.
        let bufs: Vec<PoolBuffer<u32>> = [1usize, 3, 40, 130]
            .iter()
            .map(|&m| PoolBuffer::alloc(&pool, m * MIB / 4 + 17).unwrap())
            .collect();
        eprintln!(
            "{name}: 4 blocks on device 0, reserved {}",
            pool.stats().reserved_bytes
        );
        for (i, buf) in bufs.iter().enumerate() {
            let tag = 0xC0FF_EE00 ^ i as u32;
            assert_eq!(
                cross(buf, tag, &k0, &k1),
                0,
                "{name}: device 1 read block {i} of device 0"
            );
            assert_eq!(
                cross(buf, !tag, &k1, &k0),
                0,
                "{name}: device 1 wrote block {i} of device 0"
            );
        }
        drop(bufs);
        let token = synchronize(drv.as_ref()).unwrap();
        let released = pool.purge(&token, cupool_pool::Purge::All).unwrap().bytes;
        eprintln!(
            "{name}: purge released {released}, reserved now {}",
            pool.stats().reserved_bytes
        );
        assert_eq!(pool.stats().reserved_bytes, 0, "{name}");
        eprintln!("{name}: device 1 read and wrote 4 blocks of device 0's pool");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn nccl_kind_blocks_are_one_exportable_allocation_each() {
    if common::no_gpu() {
        return;
    }
    let d0 = Arc::new(CudaDriver::new(0).unwrap());
    let k = kernels(&d0);
    // Counted through a wrapper with no effective limit: what the pool holds at the end is known
    // exactly (free memory also moves with the context's own use, kernel modules and all).
    let counted = Arc::new(LimitedDriver::new(d0.clone(), usize::MAX));
    let drv: Arc<dyn Driver> = counted.clone();
    let g = drv.granularity().unwrap();
    let pool: Arc<dyn Pool> = Arc::new(NcclPool::new(drv.clone()));
    let sizes = [5 * MIB, 64 * MIB, 300 * MIB + 12345];
    let bufs: Vec<PoolBuffer<u8>> = sizes
        .iter()
        .map(|&n| PoolBuffer::alloc(&pool, n).unwrap())
        .collect();
    d0.context().bind_to_thread().unwrap();
    for (buf, &n) in bufs.iter().zip(&sizes) {
        let ptr = buf.ptr();
        let (mut base, mut len) = (0u64, 0usize);
        // SAFETY: two out-parameters and an address this process mapped.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut len, ptr) }
            .result()
            .unwrap();
        assert_eq!(
            (base, len),
            (ptr, n.next_multiple_of(g)),
            "a block is one allocation, rounded to the granularity"
        );
        let mut handle = 0;
        // SAFETY: retains the handle mapped at a live address (released below).
        unsafe { sys::cuMemRetainAllocationHandle(&mut handle, ptr as *mut _) }
            .result()
            .unwrap();
        let mut fd: i32 = -1;
        // SAFETY: writes an int file descriptor for a handle we retained.
        let exported = unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut i32).cast(),
                handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        }
        .result();
        eprintln!("block of {n} bytes at {ptr:#x}: one allocation of {len} bytes, exported as a file descriptor: {exported:?}");
        assert!(exported.is_ok(), "exportable as ncclMemAlloc's memory is");
        // SAFETY: our own descriptor and our own retained reference.
        unsafe {
            libc_close(fd);
            sys::cuMemRelease(handle).result().unwrap();
        }
    }
    let n: Vec<u64> = bufs.iter().map(|b| b.bytes() as u64).collect();
    assert_eq!(
        pool.stats().reserved_bytes,
        n.iter()
            .map(|&b| (b as usize).next_multiple_of(g))
            .sum::<usize>()
    );
    let bad = k.stream.alloc_zeros::<u32>(1).unwrap();
    for (buf, n) in bufs.iter().zip(&n) {
        let words = n / 4;
        let tag = 7u32;
        let mut b = k.stream.launch_builder(&k.fill);
        b.arg(buf).arg(&tag).arg(&words);
        // SAFETY: writes `words` u32 inside a live block.
        unsafe { b.launch(cfg(words as usize)) }.unwrap();
        let mut b = k.stream.launch_builder(&k.check);
        b.arg(buf).arg(&tag).arg(&words).arg(&bad);
        // SAFETY: reads them back.
        unsafe { b.launch(cfg(words as usize)) }.unwrap();
    }
    assert_eq!(k.stream.clone_dtoh(&bad).unwrap()[0], 0);
    drop(bufs);
    // Each block went back when freed: nothing cached, nothing left with the driver.
    assert_eq!(pool.stats().reserved_bytes, 0);
    assert_eq!(
        counted.used(),
        0,
        "device memory still held after every block was freed"
    );
}

extern "C" {
    #[link_name = "close"]
    fn libc_close(fd: i32) -> i32;
}
