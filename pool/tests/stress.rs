//! Many threads on per-stream pools and on one shared pool: 8 threads × 100,000 operations,
//! every block tagged at both ends and checked before it is freed, stats consistent after.
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::Driver;
use cupool_pool::pools::{LegacyPool, VmmPool};
use cupool_pool::{Block, Pool, PoolConfig, PoolKind, Registry, StreamId};
use std::sync::Arc;

const THREADS: usize = 8;
const OPS: usize = 100_000;

fn tag(b: &Block, v: u64) {
    let (p, n) = (b.ptr(), b.size());
    // SAFETY: the simulated device's addresses are host memory; the block is live, at least
    // 16 bytes (requests below are), and owned by this thread alone.
    unsafe {
        std::ptr::write_unaligned(p as *mut u64, v);
        std::ptr::write_unaligned((p + n as u64 - 8) as *mut u64, v);
    }
}

fn read(b: &Block) -> (u64, u64) {
    let (p, n) = (b.ptr(), b.size());
    // SAFETY: as in `tag`.
    unsafe {
        (
            std::ptr::read_unaligned(p as *const u64),
            std::ptr::read_unaligned((p + n as u64 - 8) as *const u64),
        )
    }
}

fn worker(pool: Arc<dyn Pool>, thread: usize) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (thread as u64) << 32;
    let mut live: Vec<(Block, u64)> = Vec::new();
    for i in 0..OPS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if live.len() < 8 || (x % 2 == 0 && live.len() < 64) {
            let size = 16
                + if x % 50 == 0 {
                    (x >> 8) as usize % (1 << 20)
                } else {
                    (x >> 8) as usize % 4096
                };
            let b = pool.alloc(size).expect("4 GiB is enough");
            let v = (thread as u64) << 48 | i as u64;
            tag(&b, v);
            live.push((b, v));
        } else {
            let (b, v) = live.swap_remove((x >> 16) as usize % live.len());
            assert_eq!(
                read(&b),
                (v, v),
                "thread {thread}: a block was written by someone else"
            );
            pool.free(b).unwrap();
        }
    }
    for (b, v) in live {
        assert_eq!(read(&b), (v, v));
        pool.free(b).unwrap();
    }
}

fn check_quiet(pool: &dyn Pool) {
    let s = pool.stats();
    assert_eq!((s.live_bytes, s.live_blocks), (0, 0));
    assert_eq!(s.allocs, s.frees);
    assert!(s.cached_bytes == s.reserved_bytes);
}

#[test]
fn eight_threads_on_their_own_streams() {
    for kind in [PoolKind::Vmm, PoolKind::Legacy] {
        let dev = Arc::new(SimDevice::new(SimConfig::gib(4.0).record_calls(false)).unwrap());
        let reg = Arc::new(Registry::new(
            PoolConfig::default().kind(kind),
            vec![dev.clone() as Arc<dyn Driver>],
        ));
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let reg = reg.clone();
                s.spawn(move || worker(reg.pool(0, StreamId(t as u64)).unwrap(), t));
            }
        });
        let pools = reg.pools();
        assert_eq!(pools.len(), THREADS);
        for (_, p) in &pools {
            check_quiet(p.as_ref());
        }
        drop(pools);
        drop(reg);
        assert!(dev.ledger().is_empty(), "{kind:?}: {:?}", dev.ledger());
    }
}

#[test]
fn eight_threads_on_one_shared_pool() {
    let dev = Arc::new(SimDevice::new(SimConfig::gib(4.0).record_calls(false)).unwrap());
    let d: Arc<dyn Driver> = dev.clone();
    for pool in [
        Arc::new(VmmPool::new(d.clone())) as Arc<dyn Pool>,
        Arc::new(LegacyPool::new(d.clone())),
    ] {
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let pool = pool.clone();
                s.spawn(move || worker(pool, t));
            }
        });
        check_quiet(pool.as_ref());
    }
    assert!(dev.ledger().is_empty());
}
