//! Sleep and wake of the VMM pool: the physical memory goes, the addresses stay, offloaded
//! contents come back bit for bit, and a failure anywhere leaves nothing lost.
mod common;
use common::*;
use cupool_pool::driver::fault::FaultInjector;
use cupool_pool::driver::{CallKind, Driver, ErrorCode};
use cupool_pool::pools::{LegacyPool, VmmPool};
use cupool_pool::upstream::vmm::VmmConfig;
use cupool_pool::{synchronize, Block, Pool, PoolError, Purge};
use proptest::prelude::*;
use std::sync::Arc;

fn vmm(dev: Arc<dyn Driver>) -> VmmPool {
    VmmPool::with_config(
        dev,
        VmmConfig {
            min_grow: 2 * MIB,
            max_grow: 8 * MIB,
            ..VmmConfig::default()
        },
    )
    .unwrap()
}

#[test]
fn sleep_releases_everything_keeps_addresses_and_wake_restores_offloaded_bytes() {
    let dev = sim(1.0);
    let p = vmm(as_driver(&dev));
    let blocks: Vec<Block> = (0..5)
        .map(|i| p.alloc((i + 1) * 3 * MIB + 77).unwrap())
        .collect();
    for (i, b) in blocks.iter().enumerate() {
        fill(b, i as u8);
    }
    let spare = p.alloc(5 * MIB).unwrap();
    p.free(spare).unwrap();
    let before = dev.mem_info().unwrap();
    let reserved = p.stats().reserved_bytes;
    assert!(before.used() >= reserved);

    let token = synchronize(dev.as_ref()).unwrap();
    let slept = p.sleep(&token, true).unwrap();
    let after = dev.mem_info().unwrap();
    assert_eq!(after.used(), 0, "no physical memory is left on the device");
    assert_eq!(slept.bytes, slept.copied);
    assert!(slept.bytes >= blocks.iter().map(|b| b.size()).sum::<usize>());
    assert_eq!(p.stats().asleep_bytes, slept.bytes);

    // Asleep: allocations are refused with the reason, frees are taken.
    match p.alloc(64) {
        Err(PoolError::Asleep { device: 0, bytes }) => assert_eq!(bytes, slept.bytes),
        other => panic!("expected Asleep, got {other:?}"),
    }
    let mut blocks = blocks;
    let gone = blocks.remove(1);
    p.free(gone).unwrap();
    assert_eq!(
        p.purge(&synchronize(dev.as_ref()).unwrap(), Purge::All)
            .unwrap()
            .bytes,
        0
    );

    let woken = p.wake().unwrap();
    assert_eq!(woken.bytes, slept.bytes);
    assert_eq!(woken.copied, slept.copied);
    assert_eq!(p.stats().asleep_bytes, 0);
    for (b, seed) in blocks.iter().zip([0u8, 2, 3, 4]) {
        assert!(
            holds(b, seed),
            "block of seed {seed} at {:#x} restored",
            b.ptr()
        );
    }
    // The pool serves again, and a second wake changes nothing.
    let c = p.alloc(MIB).unwrap();
    assert_eq!(p.wake().unwrap(), cupool_pool::Moved::default());
    p.free(c).unwrap();
    for b in blocks {
        p.free(b).unwrap();
    }
}

#[test]
fn sleep_without_offload_discards_and_wake_maps_fresh_memory() {
    let dev = sim(1.0);
    let p = vmm(as_driver(&dev));
    let b = p.alloc(10 * MIB).unwrap();
    fill(&b, 9);
    let token = synchronize(dev.as_ref()).unwrap();
    let slept = p.sleep(&token, false).unwrap();
    assert_eq!(slept.copied, 0);
    assert_eq!(dev.mem_info().unwrap().used(), 0);
    let ptr = b.ptr();
    let woken = p.wake().unwrap();
    assert_eq!((woken.bytes, woken.copied), (slept.bytes, 0));
    assert_eq!(b.ptr(), ptr);
    // Fresh memory: the old bytes are gone, the range is writable again.
    assert!(!holds(&b, 9));
    fill(&b, 1);
    assert!(holds(&b, 1));
    p.free(b).unwrap();
}

#[test]
fn a_pool_without_reserved_ranges_cannot_sleep_and_says_which_can() {
    let dev = sim(1.0);
    let p = LegacyPool::new(as_driver(&dev));
    let b = p.alloc(MIB).unwrap();
    let token = synchronize(dev.as_ref()).unwrap();
    let e = p.sleep(&token, true).unwrap_err();
    assert!(matches!(e, PoolError::CannotSleep { .. }));
    assert!(e.to_string().contains("GGML_POOL=vmm"), "{e}");
    assert!(p.wake().is_err());
    // Nothing changed.
    assert_eq!(p.stats().live_blocks, 1);
    p.free(b).unwrap();
}

#[test]
fn a_token_of_another_device_is_refused() {
    let (a, b) = (sim(1.0), sim(1.0));
    let p = vmm(as_driver(&a));
    let blk = p.alloc(MIB).unwrap();
    let e = p
        .sleep(&synchronize(b.as_ref()).unwrap(), false)
        .unwrap_err();
    assert!(matches!(e, PoolError::WrongDevice { .. }));
    assert_eq!(p.stats().asleep_bytes, 0);
    p.free(blk).unwrap();
}

#[test]
fn dropping_an_asleep_pool_gives_everything_back() {
    let dev = sim(1.0);
    {
        let p = vmm(as_driver(&dev));
        let b = p.alloc(6 * MIB).unwrap();
        p.sleep(&synchronize(dev.as_ref()).unwrap(), true).unwrap();
        p.free(b).unwrap();
    }
    assert!(dev.ledger().is_empty(), "every range and mapping released");
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize),
    Free(usize),
    Sleep {
        offload: bool,
    },
    Wake,
    /// Arms a fault on the nth next call of a kind that sleep or wake makes.
    Fault(u8, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..6 * MIB).prop_map(Op::Alloc),
        3 => any::<usize>().prop_map(Op::Free),
        1 => any::<bool>().prop_map(|offload| Op::Sleep { offload }),
        1 => Just(Op::Wake),
        1 => (0u8..5, 1u64..4).prop_map(|(k, n)| Op::Fault(k, n)),
    ]
}

const FAULTS: [CallKind; 5] = [
    CallKind::Unmap,
    CallKind::Create,
    CallKind::Map,
    CallKind::HostAlloc,
    CallKind::Copy,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Random allocations, frees, sleeps and wakes with driver faults armed at random: a
    /// failed sleep or wake loses nothing. Every block that was asleep with an offload (and
    /// no sleep without one since it was written) holds its bytes once a wake succeeds;
    /// allocations are refused exactly from a sleep to the next successful wake; the device
    /// ends empty.
    #[test]
    fn sleep_and_wake_lose_nothing(ops in prop::collection::vec(op(), 1..60)) {
        let dev = sim(0.5);
        let inj = Arc::new(FaultInjector::new(as_driver(&dev)));
        let p = vmm(inj.clone());
        // Live blocks with their seed; `None` once a sleep without offload discarded them.
        let mut live: Vec<(Block, Option<u8>)> = Vec::new();
        let mut seed = 0u8;
        // Whether the pool was put to sleep and has not woken since.
        let mut asleep = false;
        for op in ops {
            match op {
                Op::Alloc(n) => match p.alloc(n) {
                    Ok(b) => {
                        prop_assert!(!asleep);
                        prop_assert_eq!(p.stats().asleep_bytes, 0);
                        seed = seed.wrapping_add(1);
                        fill(&b, seed);
                        live.push((b, Some(seed)));
                    }
                    Err(PoolError::Asleep { .. }) => prop_assert!(asleep),
                    Err(PoolError::OutOfMemory(_)) => {}
                    Err(e) => prop_assert!(false, "unexpected {e}"),
                },
                Op::Free(i) if !live.is_empty() => {
                    let (b, _) = live.swap_remove(i % live.len());
                    p.free(b).unwrap();
                }
                Op::Free(_) => {}
                Op::Sleep { offload } => {
                    let Ok(token) = synchronize(inj.as_ref()) else { continue };
                    let r = p.sleep(&token, offload);
                    asleep = true;
                    if !offload {
                        // Whatever was unmapped without a copy is gone: forget every seed
                        // (conservative: a failure may have unmapped part of them).
                        live.iter_mut().for_each(|(_, s)| *s = None);
                    }
                    if r.is_ok() {
                        prop_assert_eq!(inj.mem_info().unwrap().used(), 0);
                    }
                }
                Op::Wake => {
                    if p.wake().is_ok() {
                        asleep = false;
                        prop_assert_eq!(p.stats().asleep_bytes, 0);
                        for (b, s) in &live {
                            if let Some(s) = s {
                                prop_assert!(holds(b, *s), "restored bytes at {:#x}", b.ptr());
                            }
                        }
                    }
                }
                Op::Fault(k, n) => inj.fail_nth(FAULTS[k as usize], n, ErrorCode::OutOfMemory),
            }
        }
        inj.clear_faults();
        p.wake().unwrap();
        for (b, s) in &live {
            if let Some(s) = s {
                prop_assert!(holds(b, *s));
            }
        }
        for (b, _) in live {
            p.free(b).unwrap();
        }
        drop(p);
        prop_assert!(dev.ledger().is_empty());
    }
}

#[test]
fn a_second_offload_reuses_the_host_buffers_until_a_trim_gives_them_back() {
    let dev = sim(1.0);
    let inj = Arc::new(FaultInjector::new(as_driver(&dev)));
    let p = vmm(inj.clone());
    let b = p.alloc(20 * MIB).unwrap();
    fill(&b, 5);
    let cycle = || {
        p.sleep(&synchronize(inj.as_ref()).unwrap(), true).unwrap();
        p.wake().unwrap();
    };
    cycle();
    let first = inj.calls(CallKind::HostAlloc);
    assert!(first > 0);
    cycle();
    assert_eq!(
        inj.calls(CallKind::HostAlloc),
        first,
        "no page-locking the second time"
    );
    assert!(holds(&b, 5));
    // A trim gives the kept buffers back: the next offload allocates again.
    p.purge(&synchronize(inj.as_ref()).unwrap(), Purge::All)
        .unwrap();
    cycle();
    assert_eq!(inj.calls(CallKind::HostAlloc), 2 * first);
    assert!(holds(&b, 5));
    p.free(b).unwrap();
}
