//! Every kind of driver call the pools make fails at every position of a representative
//! sequence, on every pool flavour. Each time: the error names the failed call, the pool stays
//! usable (the whole sequence then runs clean), and after the drop nothing has leaked.
use cupool_pool::adaptors::Phases;
use cupool_pool::check::{build, fault_kinds, flavors, Device, Flavor};
use cupool_pool::driver::{CallKind, Driver, ErrorCode};
use cupool_pool::{synchronize, Block, Pool, PoolError, PoolKind, Purge};
use std::sync::Arc;

const MIB: usize = 1 << 20;

/// Grows, frees out of order, reuses holes, purges every way, and goes past the card.
fn sequence(dev: &dyn Driver, pool: &Phases) -> Vec<String> {
    let mut errors = Vec::new();
    let mut live: Vec<Block> = Vec::new();
    let alloc =
        |pool: &dyn Pool, n: usize, live: &mut Vec<Block>, errors: &mut Vec<String>| match pool
            .alloc(n)
        {
            Ok(b) => live.push(b),
            Err(e) => errors.push(e.to_string()),
        };
    let purge = |pool: &dyn Pool, what: Purge, errors: &mut Vec<String>| match synchronize(dev) {
        Ok(t) => {
            if let Err(e) = pool.purge(&t, what) {
                errors.push(e.to_string());
            }
        }
        Err(e) => errors.push(e.to_string()),
    };
    for n in [MIB, 3 * MIB, 5 * MIB] {
        alloc(pool, n, &mut live, &mut errors);
    }
    if live.len() > 1 {
        let b = live.remove(1);
        free(pool, b, &mut live, &mut errors);
    }
    alloc(pool, 2 * MIB, &mut live, &mut errors);
    pool.begin_phase("p");
    for b in std::mem::take(&mut live) {
        free(pool, b, &mut live, &mut errors);
    }
    pool.end_phase();
    purge(pool, Purge::KeepFor(vec![4 * MIB]), &mut errors);
    alloc(pool, 8 * MIB, &mut live, &mut errors);
    alloc(pool, MIB, &mut live, &mut errors);
    alloc(pool, 40 * MIB, &mut live, &mut errors); // beyond a 24 MiB limit: OOM or fallback
    purge(pool, Purge::SmallerThan(2 * MIB), &mut errors);
    for b in std::mem::take(&mut live) {
        free(pool, b, &mut live, &mut errors);
    }
    purge(pool, Purge::All, &mut errors);
    errors
}

fn free(pool: &dyn Pool, b: Block, live: &mut Vec<Block>, errors: &mut Vec<String>) {
    if let Err(e) = pool.free(b) {
        errors.push(e.to_string());
        live.push(e.block);
    }
}

fn fresh(flavor: Flavor) -> (Device, Arc<Phases>) {
    let dev = Device::new();
    let pool = build(flavor, dev.driver());
    (dev, pool)
}

#[test]
fn every_call_fails_at_every_position() {
    let mut cases = 0;
    for flavor in flavors() {
        // How often the clean sequence makes each kind of call.
        let (dev, pool) = fresh(flavor);
        let clean = sequence(dev.faults.as_ref(), &pool);
        assert!(
            clean.iter().all(|e| e.contains("out of device memory")),
            "{flavor:?}: {clean:?}"
        );
        drop(pool);
        let counts: Vec<(CallKind, u64)> = fault_kinds()
            .into_iter()
            .map(|k| (k, dev.faults.calls(k)))
            .collect();
        for (kind, count) in counts {
            for n in 1..=count {
                cases += 1;
                let (dev, pool) = fresh(flavor);
                dev.faults.fail_nth(kind, n, ErrorCode::Injected);
                let errors = sequence(dev.faults.as_ref(), &pool);
                for e in &errors {
                    let named = e.contains(kind.cuda_name()) || e.contains("out of device memory");
                    assert!(
                        named,
                        "{flavor:?}, {kind:?} #{n}: the error does not name the failed call: {e}"
                    );
                }
                dev.faults.clear_faults();
                let again = sequence(dev.faults.as_ref(), &pool);
                assert!(
                    again.iter().all(|e| e.contains("out of device memory")),
                    "{flavor:?}, {kind:?} #{n}: not usable afterwards: {again:?}"
                );
                drop(pool);
                assert!(
                    dev.sim.ledger().is_empty(),
                    "{flavor:?}, {kind:?} #{n}: leaked {:?}",
                    dev.sim.ledger()
                );
            }
        }
    }
    eprintln!("{cases} fault positions checked");
    assert!(cases > 100);
}

#[test]
fn a_failed_grow_changes_nothing() {
    for kind in [
        CallKind::Create,
        CallKind::Map,
        CallKind::SetAccess,
        CallKind::Reserve,
        CallKind::Granularity,
    ] {
        let (dev, pool) = fresh(Flavor::Plain(PoolKind::Vmm));
        dev.faults.fail_nth(kind, 1, ErrorCode::Injected);
        let before = pool.stats();
        let e = pool.alloc(MIB).unwrap_err();
        assert!(
            matches!(&e, PoolError::Driver(d) if d.call == kind),
            "{kind:?}: {e}"
        );
        let after = pool.stats();
        // The address reservation may stay (it is kept for the next attempt); no memory does.
        assert_eq!(
            (after.live_bytes, after.reserved_bytes, after.calls.maps),
            (before.live_bytes, before.reserved_bytes, before.calls.maps),
            "{kind:?}"
        );
        assert_eq!(
            (dev.sim.ledger().mappings, dev.sim.ledger().device_bytes),
            (0, 0),
            "{kind:?}"
        );
    }
}
