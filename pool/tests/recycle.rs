//! Page recycling in the VMM pool: free pages inside holes move to where a new block lands
//! without waiting for the device, stay mapped at their old place until a synchronize covers
//! it, never move from under a live block, and a failure anywhere loses nothing.
mod common;
use common::*;
use cupool_pool::driver::fault::FaultInjector;
use cupool_pool::driver::{CallKind, Driver, ErrorCode};
use cupool_pool::pools::VmmPool;
use cupool_pool::upstream::vmm::VmmConfig;
use cupool_pool::{synchronize, Block, Pool, PoolError, Purge};
use proptest::prelude::*;
use std::sync::Arc;

/// A recycling pool whose pages are one granule (2 MiB on the simulated card), unless a test
/// asks for longer ones with [`vmm_pages`].
fn vmm(dev: Arc<dyn Driver>) -> VmmPool {
    vmm_pages(dev, 2 * MIB)
}

fn vmm_pages(dev: Arc<dyn Driver>, page: usize) -> VmmPool {
    recycling_vmm(dev, page)
}

/// The KV-cache pattern: a block freed between two live ones leaves a hole just too small for
/// its successor. The successor grows the range, and the hole's four pages move behind it
/// without a synchronize, so the pool holds one page more, not five; the neighbours keep their
/// bytes. Work queued before the free may still use the hole, so its pages stay mapped there
/// too, and nothing is unmapped until a synchronize.
#[test]
fn a_hole_s_pages_move_behind_a_larger_successor_without_waiting() {
    let dev = sim(1.0);
    let p = vmm(as_driver(&dev));
    // Something below, so the hole is not at the range's start.
    let y = p.alloc(2 * MIB).unwrap();
    let z = p.alloc(10 * MIB).unwrap();
    let a = p.alloc(8 * MIB).unwrap();
    let b = p.alloc(8 * MIB).unwrap();
    let c = p.alloc(8 * MIB).unwrap();
    fill(&a, 1);
    fill(&c, 3);
    let hole = (b.ptr(), b.size());
    p.free(b).unwrap();
    let before = p.stats();
    let log_from = dev.call_log().len();
    let d = p.alloc(10 * MIB).unwrap();
    fill(&d, 4);
    let s = p.stats();
    assert_eq!(
        (s.calls.remaps, s.calls.syncs),
        (4, 0),
        "b's four pages moved, without waiting"
    );
    assert_eq!(
        s.reserved_bytes,
        before.reserved_bytes + 2 * MIB,
        "one page created, not five"
    );
    assert_eq!(dev.ledger().device_bytes, s.reserved_bytes);
    assert!(holds(&a, 1) && holds(&c, 3) && holds(&d, 4));
    for x in [&a, &c, &d] {
        assert!(dev.contains(x.ptr(), x.size()), "{:#x} is mapped", x.ptr());
    }
    assert!(
        dev.contains(hole.0, hole.1),
        "the hole stays reachable for work queued before its free"
    );
    let log = &dev.call_log()[log_from..];
    assert!(
        log.iter().all(|c| c.kind != CallKind::Unmap),
        "nothing unmapped without a synchronize: {log:?}"
    );
    // The device may still use the hole: the next block goes elsewhere rather than wait.
    let e = p.alloc(8 * MIB).unwrap();
    assert_ne!(e.ptr(), hole.0);
    assert_eq!(p.stats().calls.syncs, 0);
    // Once a synchronize covers it, the hole takes a block: its old mappings go first, and
    // memory is put behind it before it is handed out.
    synchronize(dev.as_ref()).unwrap();
    let f = p.alloc(8 * MIB).unwrap();
    assert_eq!(f.ptr(), hole.0);
    assert!(dev.contains(f.ptr(), f.size()));
    fill(&e, 5);
    fill(&f, 6);
    assert!(holds(&a, 1) && holds(&c, 3) && holds(&d, 4) && holds(&e, 5) && holds(&f, 6));
    assert_eq!(p.stats().reserved_bytes, dev.ledger().device_bytes);
    assert_eq!(p.stats().calls.syncs, 0, "the pool itself never waited");
    for x in [a, c, d, e, f, y, z] {
        p.free(x).unwrap();
    }
    let t = synchronize(dev.as_ref()).unwrap();
    p.purge(&t, Purge::All).unwrap();
    assert_eq!(dev.ledger().mappings, 0);
    drop(p);
    assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
}

/// A pool whose free memory is small next to what it holds creates memory instead of paying a
/// synchronize; a block that fits a hole never synchronizes either.
/// Pages longer than a granule (libcupool's 8 MiB) move whole: the hole's one page goes behind
/// its larger successor in one move, the successor's tail gets a page of its own; a block that
/// lands among long free pages afterwards holds no more memory than before.
#[test]
fn long_pages_move_whole_and_one_too_long_for_a_gap_is_traded() {
    let dev = sim(1.0);
    let p = vmm_pages(as_driver(&dev), 8 * MIB);
    let y = p.alloc(2 * MIB).unwrap();
    let a = p.alloc(8 * MIB).unwrap();
    let b = p.alloc(8 * MIB).unwrap();
    let c = p.alloc(8 * MIB).unwrap();
    fill(&a, 1);
    fill(&c, 3);
    p.free(b).unwrap();
    let before = p.stats();
    let d = p.alloc(10 * MIB).unwrap();
    fill(&d, 4);
    let s = p.stats();
    assert_eq!(
        s.calls.remaps - before.calls.remaps,
        1,
        "b's one page moved"
    );
    assert_eq!(s.calls.maps - before.calls.maps, 1, "one page for the tail");
    assert_eq!(s.reserved_bytes, before.reserved_bytes + 2 * MIB);
    assert_eq!(dev.ledger().device_bytes, s.reserved_bytes);
    // Free a's page and d's two: a 6 MiB block lands among them.
    p.free(a).unwrap();
    p.free(d).unwrap();
    let before = p.stats();
    let e = p.alloc(6 * MIB).unwrap();
    fill(&e, 5);
    let s = p.stats();
    assert!(s.reserved_bytes <= before.reserved_bytes, "{s:?}");
    assert_eq!(dev.ledger().device_bytes, s.reserved_bytes);
    assert!(holds(&c, 3) && holds(&e, 5));
    for x in [c, e, y] {
        p.free(x).unwrap();
    }
}

#[test]
fn little_free_memory_or_a_fitting_hole_costs_no_synchronize() {
    let dev = sim(1.0);
    let p = vmm(as_driver(&dev));
    let big = p.alloc(256 * MIB).unwrap();
    let a = p.alloc(2 * MIB).unwrap();
    let b = p.alloc(2 * MIB).unwrap();
    p.free(a).unwrap();
    // 2 MiB free of 260 held: below the slack, no recycling.
    let c = p.alloc(4 * MIB).unwrap();
    let s = p.stats();
    assert_eq!((s.calls.remaps, s.calls.syncs), (0, 0));
    // The hole fits: the fast path, no driver call at all.
    let maps = s.calls.maps;
    let d = p.alloc(2 * MIB).unwrap();
    let s = p.stats();
    assert_eq!((s.calls.maps, s.calls.syncs), (maps, 0));
    for x in [big, b, c, d] {
        p.free(x).unwrap();
    }
}

/// With recycling off, a growth maps one page as ggml does and never moves one.
#[test]
fn recycling_off_keeps_the_holes_pages() {
    let dev = sim(1.0);
    let p = VmmPool::with_config(
        as_driver(&dev),
        VmmConfig {
            min_grow: 0,
            max_grow: 0,
            large_rounding: 2 * MIB,
            recycle: false,
            ..VmmConfig::default()
        },
    )
    .unwrap();
    let a = p.alloc(8 * MIB).unwrap();
    let b = p.alloc(8 * MIB).unwrap();
    let c = p.alloc(8 * MIB).unwrap();
    p.free(b).unwrap();
    let d = p.alloc(10 * MIB).unwrap();
    let s = p.stats();
    assert_eq!((s.calls.remaps, s.calls.syncs, s.calls.maps), (0, 0, 4));
    assert_eq!(s.reserved_bytes, 34 * MIB);
    for x in [a, c, d] {
        p.free(x).unwrap();
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    Free(usize),
    Trim,
    /// Arms a fault on the nth next call of a kind that recycling makes.
    Fault(u8, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1usize..8 * MIB).prop_map(Op::Alloc),
        4 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Trim),
        2 => (0u8..5, 1u64..4).prop_map(|(k, n)| Op::Fault(k, n)),
    ]
}

const FAULTS: [CallKind; 5] = [
    CallKind::Unmap,
    CallKind::Map,
    CallKind::SetAccess,
    CallKind::Create,
    CallKind::Synchronize,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Random allocations, frees and trims on a small card with faults armed at random on
    /// the calls recycling makes (the moves' unmap, map and access, the creates, the
    /// synchronize): after every step the pool's reserved bytes are exactly what the device
    /// holds, every live block is mapped and holds its bytes, every block freed since the last
    /// finished synchronize is still mapped (work queued before its free may still use it),
    /// and the device ends empty.
    #[test]
    fn recycling_loses_nothing_and_never_unmaps_a_live_block(
        ops in prop::collection::vec(op(), 1..80)
    ) {
        let dev = sim(0.0625);
        let inj = Arc::new(FaultInjector::new(as_driver(&dev)));
        let p = vmm(inj.clone());
        let mut live: Vec<(Block, u8)> = Vec::new();
        // Freed blocks (address, size, epoch of the free) the device may still be using.
        let mut queued: Vec<(u64, usize, u64)> = Vec::new();
        let mut seed = 0u8;
        for op in ops {
            match op {
                Op::Alloc(n) => match p.alloc(n) {
                    Ok(b) => {
                        seed = seed.wrapping_add(1);
                        prop_assert!(dev.contains(b.ptr(), b.size()));
                        fill(&b, seed);
                        live.push((b, seed));
                    }
                    Err(PoolError::OutOfMemory(_)) | Err(PoolError::Driver(_)) => {}
                    Err(e) => prop_assert!(false, "unexpected {e}"),
                },
                Op::Free(i) if !live.is_empty() => {
                    let (b, _) = live.swap_remove(i % live.len());
                    queued.push((b.ptr(), b.size(), dev.epoch().current()));
                    p.free(b).unwrap();
                }
                Op::Free(_) => {}
                Op::Trim => {
                    if let Ok(t) = synchronize(inj.as_ref()) {
                        let _ = p.purge(&t, Purge::All);
                    }
                }
                Op::Fault(k, n) => inj.fail_nth(FAULTS[k as usize], n, ErrorCode::Injected),
            }
            if let Err(e) = recycling_invariants(&p, &dev, &mut queued, &live) {
                prop_assert!(false, "{e}");
            }
        }
        inj.clear_faults();
        for (b, _) in live {
            p.free(b).unwrap();
        }
        drop(p);
        prop_assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
    }
}
