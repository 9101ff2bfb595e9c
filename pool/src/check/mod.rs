//! A checker for pool operation sequences, shared by the property tests and the fuzz targets,
//! and usable to test a pool configuration of your own.
//!
//! [`run`] drives a sequence of [`Op`]s through two pools (two streams) of one flavour on a small
//! simulated card, writing a tag into every block and checking after every step that live
//! blocks never overlap, are aligned, lie inside memory the driver handed out and keep their
//! tags; that the stats equal a recount; that a failed allocation changes nothing; and, once the
//! pools are dropped, that the device's ledger is empty. It returns the first violation.

mod flavor;
mod ops;

pub use flavor::{build, flavors, Device, Flavor};
pub use ops::{fault_kinds, ops_from_bytes, Op};

use crate::adaptors::Phases;
use crate::driver::sim::SimDevice;
use crate::driver::ErrorCode;
use crate::{synchronize, Block, Pool, PoolError, PoolKind, Purge};
use std::sync::Arc;

struct Live {
    block: Block,
    stream: usize,
    tag: u8,
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

fn stamp(dev: &SimDevice, b: &Block, tag: u8) -> Result<(), String> {
    let n = b.size().min(64);
    dev.write(b.ptr(), &vec![tag; n])
        .map_err(|e| e.to_string())?;
    if b.size() > 64 {
        dev.write(b.ptr() + (b.size() - 64) as u64, &[tag; 64])
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn check_stamp(dev: &SimDevice, b: &Block, tag: u8) -> Result<(), String> {
    let n = b.size().min(64);
    let ok = dev
        .read(b.ptr(), n)
        .map_err(|e| e.to_string())?
        .iter()
        .all(|&x| x == tag)
        && (b.size() <= 64
            || dev
                .read(b.ptr() + (b.size() - 64) as u64, 64)
                .map_err(|e| e.to_string())?
                .iter()
                .all(|&x| x == tag));
    ensure!(
        ok,
        "block {:#x} ({} bytes) was overwritten while live",
        b.ptr(),
        b.size()
    );
    Ok(())
}

fn invariants(
    flavor: Flavor,
    dev: &SimDevice,
    pools: &[Arc<Phases>; 2],
    live: &[Live],
) -> Result<(), String> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut reserved = 0;
    for (s, pool) in pools.iter().enumerate() {
        let st = pool.stats();
        let (mut bytes, mut blocks, mut fallback) = (0usize, 0usize, 0usize);
        for l in live.iter().filter(|l| l.stream == s) {
            let b = &l.block;
            ensure!(b.capacity() >= b.size(), "{flavor:?}: capacity below size");
            ensure!(
                dev.contains(b.ptr(), b.capacity()),
                "{flavor:?}: block {:#x} outside live device memory",
                b.ptr()
            );
            if b.is_managed_fallback() {
                fallback += b.size();
            }
            ensure!(
                b.ptr() % pool.alignment() as u64 == 0,
                "{flavor:?}: block {:#x} misaligned",
                b.ptr()
            );
            bytes += b.size();
            blocks += 1;
            ranges.push((b.ptr(), b.ptr() + b.capacity() as u64));
        }
        ensure!(
            st.live_bytes == bytes,
            "{flavor:?} stream {s}: live bytes {} but a recount gives {bytes}",
            st.live_bytes
        );
        ensure!(
            st.live_blocks == blocks,
            "{flavor:?} stream {s}: live blocks {} but a recount gives {blocks}",
            st.live_blocks
        );
        ensure!(
            st.fallback_live_bytes == fallback,
            "{flavor:?} stream {s}: fallback bytes differ from a recount"
        );
        ensure!(
            st.live_peak_bytes >= st.live_bytes && st.reserved_peak_bytes >= st.reserved_bytes,
            "{flavor:?}: a peak below its current value"
        );
        ensure!(
            st.cached_bytes <= st.reserved_bytes,
            "{flavor:?}: cached above reserved"
        );
        reserved += st.reserved_bytes;
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        ensure!(
            w[0].1 <= w[1].0,
            "{flavor:?}: live blocks {:#x} and {:#x} overlap",
            w[0].0,
            w[1].0
        );
    }
    // Every byte the driver holds is a byte some pool counts as reserved (refused frees
    // included: they stay reserved until a purge gets them back).
    let ledger = dev.ledger();
    let held = ledger.device_bytes + ledger.managed_bytes;
    ensure!(
        reserved == held,
        "{flavor:?}: the pools reserve {reserved} bytes but the driver holds {held} for them"
    );
    Ok(())
}

/// Runs `ops` on two pools of `flavor`; `faults` lets [`Op::Fault`] arm driver faults.
pub fn run(flavor: Flavor, ops: &[Op], faults: bool) -> Result<(), String> {
    let device = Device::new();
    let dev = device.sim.as_ref();
    let pools = [
        build(flavor, device.driver()),
        build(flavor, device.driver()),
    ];
    let mut live: Vec<Live> = Vec::new();
    let mut tag = 0u8;
    let mut stream = 0usize;
    for op in ops {
        match op {
            Op::Alloc(n) => {
                let pool = &pools[stream];
                let before = pool.stats();
                // Odd sizes through `alloc_onto`, which answers as `alloc` does.
                let got = match n % 2 {
                    0 => pool.alloc(*n),
                    _ => {
                        let mut out = Vec::new();
                        match (pool.alloc_onto(*n, &mut out), out.pop()) {
                            (Ok(()), Some(b)) if out.is_empty() => Ok(b),
                            (Err(e), None) => Err(e),
                            (r, _) => return Err(format!("{flavor:?}: alloc_onto answered {r:?} with another number of blocks")),
                        }
                    }
                };
                match got {
                    Ok(block) => {
                        tag = tag.wrapping_add(1);
                        stamp(dev, &block, tag)?;
                        live.push(Live { block, stream, tag });
                    }
                    Err(e) => {
                        let expected =
                            matches!(e, PoolError::OutOfMemory(_) | PoolError::InvalidSize { .. })
                                || (faults && matches!(e, PoolError::Driver(_)));
                        ensure!(expected, "{flavor:?}: unexpected error {e}");
                        ensure!(!e.to_string().is_empty(), "an error must say what failed");
                        let after = pool.stats();
                        ensure!(
                            after.live_bytes == before.live_bytes
                                && after.live_blocks == before.live_blocks,
                            "{flavor:?}: a failed allocation changed the live state"
                        );
                    }
                }
            }
            Op::Free(k) if !live.is_empty() => {
                let l = live.swap_remove(k % live.len());
                check_stamp(dev, &l.block, l.tag)?;
                if let Err(e) = pools[l.stream].free(l.block) {
                    ensure!(faults, "{flavor:?}: free refused: {e}");
                    live.push(Live {
                        block: e.block,
                        stream: l.stream,
                        tag: l.tag,
                    });
                }
            }
            Op::Free(_) => {}
            Op::PurgeAll | Op::PurgeSmaller(_) | Op::PurgeKeepFor(_) => {
                let what = match op {
                    Op::PurgeAll => Purge::All,
                    Op::PurgeSmaller(n) => Purge::SmallerThan(*n),
                    Op::PurgeKeepFor(r) => Purge::KeepFor(r.clone()),
                    _ => unreachable!("matched above"),
                };
                if let Ok(token) = synchronize(device.faults.as_ref()) {
                    for pool in &pools {
                        let promised = pool.releasable(&what);
                        let r = pool.purge(&token, what.clone());
                        ensure!(faults || r.is_ok(), "{flavor:?}: purge failed: {r:?}");
                        if let (Ok(r), false) = (&r, faults) {
                            ensure!(r.bytes <= promised, "{flavor:?}: purge released {} bytes, more than the {promised} it said it would", r.bytes);
                        }
                    }
                }
            }
            Op::Sync => {
                let _ = synchronize(device.faults.as_ref());
            }
            Op::Phase => {
                for pool in &pools {
                    if let Some(p) = pool.end_phase() {
                        ensure!(
                            p.live_peak_bytes >= p.live_end_bytes
                                && p.reserved_peak_bytes >= p.reserved_end_bytes,
                            "{flavor:?}: phase peak below its end"
                        );
                    }
                    pool.begin_phase("p");
                }
            }
            Op::Stream(s) => stream = *s as usize % 2,
            Op::Fault(x) if faults => {
                let kinds = fault_kinds();
                device.faults.fail_nth(
                    kinds[*x as usize % kinds.len()],
                    1 + (*x as u64 / 64),
                    ErrorCode::Injected,
                );
            }
            Op::Fault(_) => {}
        }
        invariants(flavor, dev, &pools, &live)?;
    }
    device.faults.clear_faults();
    for l in live.drain(..) {
        check_stamp(dev, &l.block, l.tag)?;
        pools[l.stream]
            .free(l.block)
            .map_err(|e| format!("{flavor:?}: final free: {e}"))?;
    }
    if matches!(
        flavor,
        Flavor::Plain(PoolKind::Vmm) | Flavor::VmmExactGrowth
    ) {
        // Everything is free: the whole mapped range must be one reusable run, with no growth.
        // Memory a refused driver call left in no block goes back first: a purge that releases
        // no idle segment still retries refused releases.
        let token = synchronize(dev).map_err(|e| e.to_string())?;
        for pool in &pools {
            pool.purge(&token, Purge::SmallerThan(1))
                .map_err(|e| format!("{flavor:?}: retrying refused releases: {e}"))?;
            let s = pool.stats();
            if s.reserved_bytes > 0 {
                // With lanes, a block of at most `GROW` may take a lane left by the ended
                // requests again (where a replacement was seen since), with memory made ahead
                // for it there (`placement/lanes/trim.rs`): the range's free run would go
                // unasked. One block larger than any lane takes asks the range alone, for all
                // of its memory and the rest new.
                // (Where the card has no room for the rest, the block of everything free is
                // asked: it may take a lane, and the range's run goes unchecked this time.)
                let wide = s
                    .reserved_bytes
                    .max(crate::placement::lanes::GROW + (2 << 20));
                let room = dev.capacity().saturating_sub(dev.ledger().device_bytes);
                let probe = if flavor == Flavor::VmmExactGrowth && wide - s.reserved_bytes <= room {
                    wide
                } else {
                    s.reserved_bytes
                };
                let in_lanes = probe <= crate::placement::lanes::GROW;
                let all = pool.alloc(probe).map_err(|e| {
                    format!("{flavor:?}: the free mapped range is not reusable: {e}")
                })?;
                if flavor == Flavor::VmmExactGrowth && faults {
                    // A refused call may have left a growth's segment partly vacant: the block
                    // may need a growth of its own (served above; its memory is not bounded).
                } else if flavor == Flavor::VmmExactGrowth {
                    // Pages move, and one too long for a gap is traded for a new one: the
                    // memory held grows by less than a page at each end of the block, the part
                    // of a page that straddles it (pages of one granule never straddle).
                    let slack = 2 * ((6 << 20) - (2 << 20));
                    ensure!(
                        in_lanes || pool.stats().reserved_bytes <= probe + slack,
                        "{flavor:?}: space was lost below the top: {} bytes reserved after one block of {probe} with {} free",
                        pool.stats().reserved_bytes,
                        s.reserved_bytes
                    );
                } else {
                    ensure!(
                        pool.stats().calls.maps == s.calls.maps,
                        "{flavor:?}: space was lost below the top"
                    );
                }
                pool.free(all).map_err(|e| e.to_string())?;
            }
        }
    }
    drop(pools);
    ensure!(
        dev.ledger().is_empty(),
        "{flavor:?}: leaked {:?}",
        dev.ledger()
    );
    Ok(())
}
