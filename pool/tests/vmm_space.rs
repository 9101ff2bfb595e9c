//! The VMM pool's address space: growth past a reservation into further ones (contiguous where
//! the address after the last is free, a range of its own elsewhere), reservations retried
//! smaller where address space is scarce, and every reservation returned.
mod common;
use common::*;
use cupool_pool::driver::fault::FaultInjector;
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::{CallKind, Driver, ErrorCode};
use cupool_pool::pools::VmmPool;
use cupool_pool::upstream::vmm::VmmConfig;
use cupool_pool::{synchronize, Block, Pool, Purge};
use proptest::prelude::*;
use std::sync::Arc;

fn pool(dev: Arc<dyn Driver>, reserve: Option<usize>, min_grow: usize) -> VmmPool {
    VmmPool::with_config(
        dev,
        VmmConfig {
            reserve_bytes: reserve,
            min_grow,
            max_grow: 4 * min_grow,
            ..VmmConfig::default()
        },
    )
    .unwrap()
}

fn trim(p: &VmmPool, dev: &SimDevice) {
    let t = synchronize(dev).unwrap();
    p.purge(&t, Purge::All).unwrap();
}

/// Writes `tag` over all of `b` and checks it reads back: every byte is mapped and writable.
fn fill_and_check(dev: &SimDevice, b: &Block, tag: u8) {
    dev.write(b.ptr(), &vec![tag; b.size()]).unwrap();
    assert!(dev
        .read(b.ptr(), b.size())
        .unwrap()
        .iter()
        .all(|&x| x == tag));
}

#[test]
fn growth_continues_into_a_reservation_right_after_the_last() {
    let dev = sim(1.0);
    let p = pool(as_driver(&dev), Some(8 * MIB), 0);
    let a = p.alloc(6 * MIB).unwrap();
    let b = p.alloc(4 * MIB).unwrap();
    assert_eq!(
        b.ptr(),
        a.ptr() + 6 * MIB as u64,
        "the second reservation was placed at the hint, so the range continues"
    );
    assert_eq!(dev.ledger().reservations, 2);
    assert_eq!(p.stats().calls.reserves, 2);
    // `b` crosses the boundary of the two reservations.
    fill_and_check(&dev, &a, 1);
    fill_and_check(&dev, &b, 2);
    assert_eq!(dev.read(a.ptr(), 1).unwrap(), [1]);
    p.free(b).unwrap();
    p.free(a).unwrap();
    trim(&p, &dev);
    assert_eq!(p.stats().reserved_bytes, 0);
    let l = dev.ledger();
    assert_eq!((l.mappings, l.reservations), (0, 1), "the first is kept");
    // The freed space is one run again: a block as large as both fits.
    let c = p.alloc(10 * MIB).unwrap();
    fill_and_check(&dev, &c, 3);
    p.free(c).unwrap();
    drop(p);
    assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
}

#[test]
fn without_the_hint_a_further_reservation_is_a_range_of_its_own() {
    let dev = sim_with(SimConfig::gib(1.0).address_hints(false));
    let p = pool(as_driver(&dev), Some(8 * MIB), 0);
    // 6 MiB mapped (three granules) for 5 MiB: the range has a free MiB at its end.
    let a = p.alloc(5 * MIB).unwrap();
    let b = p.alloc(4 * MIB).unwrap();
    assert_ne!(b.ptr(), a.ptr() + 6 * MIB as u64);
    assert_eq!(dev.ledger().reservations, 2);
    let c = p.alloc(MIB).unwrap();
    assert_eq!(
        c.ptr(),
        a.ptr() + 5 * MIB as u64,
        "the free end of the first range is reused"
    );
    for (i, blk) in [&a, &b, &c].into_iter().enumerate() {
        fill_and_check(&dev, blk, i as u8 + 1);
    }
    assert_eq!(dev.read(a.ptr(), 1).unwrap(), [1]);
    assert_eq!(dev.read(b.ptr(), 1).unwrap(), [2]);
    // 6 MiB fits in no range's room: a third reservation, elsewhere again.
    let d = p.alloc(6 * MIB).unwrap();
    fill_and_check(&dev, &d, 4);
    assert_eq!(dev.ledger().reservations, 3);
    for blk in [d, c, b, a] {
        p.free(blk).unwrap();
    }
    trim(&p, &dev);
    let l = dev.ledger();
    assert_eq!((l.mappings, l.reservations, l.device_bytes), (0, 1, 0));
    drop(p);
    assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
}

#[test]
fn a_reservation_too_large_for_the_address_space_is_retried_smaller() {
    // A Jetson-like device: 1 GiB of memory, 16 MiB of address space.
    let dev = sim_with(SimConfig::gib(1.0).address_space(16 * MIB));
    let p = pool(as_driver(&dev), None, 0);
    let a = p.alloc(10 * MIB).unwrap();
    fill_and_check(&dev, &a, 1);
    assert_eq!(dev.ledger().reservations, 1);
    // The 16 MiB left after halving from 1 GiB hold 6 MiB more, and no more.
    let b = p.alloc(6 * MIB).unwrap();
    fill_and_check(&dev, &b, 2);
    let before = p.stats();
    let e = p.alloc(2 * MIB).unwrap_err();
    assert!(e.oom_report().is_some(), "{e}");
    assert!(e.to_string().contains("address space"), "{e}");
    let after = p.stats();
    assert_eq!(
        (after.live_bytes, after.reserved_bytes),
        (before.live_bytes, before.reserved_bytes)
    );
    p.free(b).unwrap();
    p.free(a).unwrap();
    drop(p);
    assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
}

#[test]
fn a_further_reservation_is_halved_down_to_the_need() {
    let dev = sim_with(SimConfig::gib(1.0).address_space(28 * MIB));
    let p = pool(as_driver(&dev), Some(16 * MIB), 0);
    let a = p.alloc(16 * MIB).unwrap();
    // 16 MiB do not fit the 12 MiB left; 8 do.
    let b = p.alloc(4 * MIB).unwrap();
    // 8 MiB more need 4 MiB right after the 8: the last 4 MiB of address space.
    let c = p.alloc(8 * MIB).unwrap();
    assert_eq!(c.ptr(), b.ptr() + 4 * MIB as u64);
    for (i, blk) in [&a, &b, &c].into_iter().enumerate() {
        fill_and_check(&dev, blk, i as u8 + 1);
    }
    assert_eq!(dev.ledger().reservations, 3);
    p.alloc(2 * MIB).unwrap_err();
    for blk in [a, b, c] {
        p.free(blk).unwrap();
    }
    trim(&p, &dev);
    assert_eq!(dev.ledger().reservations, 1);
    drop(p);
    assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
}

#[test]
fn a_failed_growth_into_a_further_reservation_leaves_nothing_behind() {
    for kind in [CallKind::Reserve, CallKind::Create, CallKind::Map] {
        let dev = sim(1.0);
        let faults = Arc::new(FaultInjector::new(dev.clone()));
        let p = pool(faults.clone(), Some(4 * MIB), 0);
        let a = p.alloc(3 * MIB).unwrap();
        let held = |p: &VmmPool| {
            let l = dev.ledger();
            (p.stats().reserved_bytes, l.device_bytes, l.mappings)
        };
        let before = held(&p);
        faults.fail_nth(kind, 1, ErrorCode::Injected);
        p.alloc(4 * MIB).unwrap_err();
        // No memory is left behind; the address space of the new segment stays with the pool
        // (idle, with nothing behind it) until a trim.
        assert_eq!(held(&p), before, "{kind:?}");
        let b = p.alloc(4 * MIB).unwrap();
        fill_and_check(&dev, &b, 2);
        p.free(b).unwrap();
        p.free(a).unwrap();
        drop(p);
        assert!(dev.ledger().is_empty(), "{kind:?}: {:?}", dev.ledger());
    }
}

#[test]
fn a_segment_whose_release_fails_halfway_keeps_its_place_and_is_backed_again() {
    let dev = sim(1.0);
    let faults = Arc::new(FaultInjector::new(dev.clone()));
    let p = pool(faults.clone(), Some(4 * MIB), 0);
    let a = p.alloc(2 * MIB).unwrap();
    let b = p.alloc(4 * MIB).unwrap(); // 2 MiB in each reservation
    assert_eq!(b.ptr(), a.ptr() + 2 * MIB as u64);
    p.free(b).unwrap();
    // The upper page unmaps, the lower refuses: the segment stays, its upper half vacant.
    faults.fail_from(CallKind::Unmap, 2, ErrorCode::Injected);
    let t = synchronize(dev.as_ref()).unwrap();
    p.purge(&t, Purge::All).unwrap_err();
    faults.clear_faults();
    assert_eq!(
        p.stats().reserved_bytes,
        4 * MIB,
        "the unmapped half is counted gone"
    );
    assert_eq!(dev.ledger().device_bytes, 4 * MIB);
    let c = p.alloc(4 * MIB).unwrap();
    assert_eq!(
        c.ptr(),
        a.ptr() + 2 * MIB as u64,
        "the segment is reused, its vacant half backed again"
    );
    assert_eq!(p.stats().reserved_bytes, 6 * MIB);
    fill_and_check(&dev, &c, 7);
    p.free(c).unwrap();
    p.free(a).unwrap();
    trim(&p, &dev);
    assert_eq!(dev.ledger().mappings, 0);
    drop(p);
    assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
}

#[test]
fn memory_a_failed_growth_cannot_unmap_is_counted_and_reused() {
    let dev = sim(1.0);
    let faults = Arc::new(FaultInjector::new(dev.clone()));
    let p = pool(faults.clone(), Some(4 * MIB), 0);
    let a = p.alloc(2 * MIB).unwrap();
    // 4 MiB more: 2 MiB in the first reservation, 2 in one right after it. The second page
    // fails, and the first cannot be undone: the driver refuses every unmap.
    faults.fail_nth(CallKind::Create, 2, ErrorCode::Injected);
    for n in 1..=3 {
        faults.fail_nth(CallKind::Unmap, n, ErrorCode::Injected);
    }
    p.alloc(4 * MIB).unwrap_err();
    faults.clear_faults();
    let s = p.stats();
    assert_eq!((s.live_blocks, s.live_bytes), (1, 2 * MIB));
    assert_eq!(s.reserved_bytes, 4 * MIB, "the page left behind is counted");
    assert_eq!(s.reserved_bytes, dev.ledger().device_bytes);
    // The page backs free space of the segment: the next growth lands on it.
    let b = p.alloc(4 * MIB).unwrap();
    fill_and_check(&dev, &a, 1);
    fill_and_check(&dev, &b, 2);
    assert_eq!(b.ptr(), a.ptr() + 2 * MIB as u64);
    assert_eq!(p.stats().reserved_bytes, 6 * MIB);
    assert_eq!(dev.ledger().device_bytes, 6 * MIB);
    p.free(b).unwrap();
    p.free(a).unwrap();
    trim(&p, &dev);
    assert_eq!(dev.ledger().mappings, 0);
    drop(p);
    assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
}

/// A cap on the simulated address space below one granule could hold no reservation at all: it
/// is refused when the device is built, naming the field and what is accepted.
#[test]
fn an_address_space_smaller_than_a_granule_is_refused() {
    let e = SimDevice::new(SimConfig::gib(1.0).address_space(4096)).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("SimConfig::address_space"), "{msg}");
    assert!(msg.contains("4096"), "{msg}");
    SimDevice::new(SimConfig::gib(1.0).address_space(2 * MIB)).unwrap();
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize),
    Free(usize),
    Trim,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop_oneof![1usize..(64 << 10), (64usize << 10)..(5 * MIB)].prop_map(Op::Alloc),
        4 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Trim),
    ]
}

/// Bytes of `b` checked at each step: its first and last bytes and one at every 2 MiB (where a
/// reservation may end).
fn probes(b: &Block) -> Vec<u64> {
    let mut v: Vec<u64> = (0..b.size())
        .step_by(2 * MIB)
        .map(|o| b.ptr() + o as u64)
        .collect();
    v.push(b.ptr() + b.size() as u64 - 1);
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Over random allocations, frees and trims on reservations of one to four granules (with
    /// and without address hints, with and without a cap on the address space): live blocks stay
    /// distinct and keep what was written to them, the pool's counters match the blocks and the
    /// device, a trim with nothing live leaves only the first reservation, and dropping the pool
    /// returns everything.
    #[test]
    fn live_blocks_stay_valid_across_reservations(
        granules in 1usize..=4,
        hints in any::<bool>(),
        cap in prop::option::of(24usize..64),
        min_grow in prop_oneof![Just(0usize), Just(2 * MIB)],
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut config = SimConfig::gib(0.125).address_hints(hints).record_calls(false);
        if let Some(c) = cap {
            config = config.address_space(c * MIB);
        }
        let dev = sim_with(config);
        let p = pool(as_driver(&dev), Some(granules * 2 * MIB), min_grow);
        let mut live: Vec<(Block, u8)> = Vec::new();
        for (step, op) in ops.into_iter().enumerate() {
            let tag = step as u8 | 1;
            match op {
                Op::Alloc(size) => match p.alloc(size) {
                    Ok(b) => {
                        prop_assert!(b.size() >= size);
                        for at in probes(&b) {
                            dev.write(at, &[tag]).unwrap();
                        }
                        live.push((b, tag));
                    }
                    Err(e) => prop_assert!(e.oom_report().is_some(), "{}", e),
                },
                Op::Free(i) if !live.is_empty() => {
                    let (b, _) = live.swap_remove(i % live.len());
                    p.free(b).unwrap();
                }
                Op::Free(_) => {}
                Op::Trim => trim(&p, &dev),
            }
            let mut spans: Vec<(u64, u64)> =
                live.iter().map(|(b, _)| (b.ptr(), b.ptr() + b.size() as u64)).collect();
            spans.sort_unstable();
            for w in spans.windows(2) {
                prop_assert!(w[0].1 <= w[1].0, "blocks overlap: {:x?}", w);
            }
            for (b, t) in &live {
                for at in probes(b) {
                    prop_assert_eq!(dev.read(at, 1).unwrap(), [*t], "block at {:#x}", b.ptr());
                }
            }
            let s = p.stats();
            prop_assert_eq!(s.live_blocks, live.len());
            prop_assert_eq!(s.live_bytes, live.iter().map(|(b, _)| b.size()).sum::<usize>());
            prop_assert_eq!(s.reserved_bytes, dev.ledger().device_bytes);
            prop_assert!(s.live_bytes <= s.reserved_bytes);
        }
        for (b, _) in live.drain(..) {
            p.free(b).unwrap();
        }
        trim(&p, &dev);
        let l = dev.ledger();
        prop_assert_eq!((l.mappings, l.device_bytes), (0, 0));
        prop_assert!(l.reservations <= 1, "{:?}", l);
        drop(p);
        prop_assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
    }
}
