//! A trim between two requests (`cupool.trim()` between prefills, as `prefill.py` runs them): the
//! lanes' memory goes back to the device and their address space stays, and the next request's
//! lanes get their memory made again on the pool's worker, ahead of the blocks that land there
//! (`placement/lanes/again.rs`). The pool holds no more after the trim than with the lanes
//! released, and a closing pool releases the lanes' address space too.
mod common;
use common::*;
use cupool_pool::driver::sim::SimDevice;
use cupool_pool::driver::timed::{TimedDriver, AHEAD_MAP};
use cupool_pool::driver::Driver;
use cupool_pool::pools::VmmPool;
use cupool_pool::sync::synchronize;
use cupool_pool::upstream::vmm::{Ahead, VmmConfig};
use cupool_pool::{Block, Pool, Purge};
use std::sync::Arc;

/// A simulated card, its driver timed, and a recycling pool with lanes whose growth the
/// worker makes ahead, as `cupool.torch.install()` sets libcupool.
fn pool() -> (Arc<SimDevice>, Arc<TimedDriver>, VmmPool) {
    let dev = sim(4.0);
    let timed = Arc::new(TimedDriver::timed(as_driver(&dev)));
    let p = VmmPool::with_config(
        timed.clone(),
        VmmConfig {
            ahead: Ahead::Worker,
            ..recycling_config(8 * MIB, true)
        },
    )
    .expect("valid settings");
    (dev, timed, p)
}

/// What one request did: pages made on the allocating thread and by the worker, address
/// reservations made, the reserve's peak, and what it held once every block was free.
#[derive(Debug)]
struct Request {
    inline: u64,
    ahead: u64,
    reserved: u64,
    peak: usize,
    end: usize,
}

/// A prefill in miniature: 16 tensors (8 layers' keys and values) of 3 MiB grown by 3 MiB a
/// step for `steps` steps, each copy allocated before its old block is freed (`torch.cat`),
/// with a 5 MiB activation between layers; every tensor's bytes checked, then all freed.
fn request(p: &VmmPool, timed: &TimedDriver, steps: usize) -> Request {
    let count = |name: &str| timed.times().get(name).map_or(0, |c| c.calls);
    let before = (count("map"), count(AHEAD_MAP), count("reserve"));
    let mut peak = 0;
    let mut cache: Vec<Block> = (0..16).map(|_| p.alloc(3 * MIB).unwrap()).collect();
    for (k, b) in cache.iter().enumerate() {
        fill(b, k as u8);
    }
    for _ in 0..steps {
        for (k, slot) in cache.iter_mut().enumerate() {
            if k % 2 == 0 {
                let a = p.alloc(5 * MIB).unwrap();
                p.free(a).unwrap();
            }
            let grown = p.alloc(slot.size() + 3 * MIB).unwrap();
            fill(&grown, k as u8);
            p.free(std::mem::replace(slot, grown)).unwrap();
            peak = peak.max(p.stats().reserved_bytes);
        }
    }
    for (k, b) in cache.iter().enumerate() {
        assert!(holds(b, k as u8), "tensor {k} kept its bytes");
    }
    for b in cache {
        p.free(b).unwrap();
    }
    Request {
        inline: count("map") - before.0,
        ahead: count(AHEAD_MAP) - before.1,
        reserved: count("reserve") - before.2,
        peak,
        end: p.stats().reserved_bytes,
    }
}

#[test]
fn after_a_trim_the_lanes_memory_is_made_again_ahead_of_the_next_request() {
    let (dev, timed, p) = pool();
    let first = request(&p, &timed, 10);
    let mut later = Vec::new();
    for _ in 0..2 {
        let r = p.purge(&synchronize(&*dev).unwrap(), Purge::All).unwrap();
        assert!(r.bytes > 0, "the trim gave memory back: {r:?}");
        // Every byte back to the device; the lanes' address space kept.
        assert_eq!(p.stats().reserved_bytes, 0);
        assert_eq!(dev.ledger().device_bytes, 0, "{:?}", dev.ledger());
        assert!(dev.ledger().reservations > 1, "{:?}", dev.ledger());
        later.push(request(&p, &timed, 10));
    }
    for r in &later {
        // The first request mapped its lanes' first blocks and much of their growth where the
        // blocks landed; the later ones find most of it made. (Lanes kept through the trim
        // but nothing named for them: 64 and 66 pages on the allocating thread.)
        assert!(
            r.inline * 3 <= first.inline * 2 && r.ahead > first.ahead,
            "first {first:?}, after a trim {later:?}"
        );
        // No lane opened again: no address space asked for.
        assert_eq!(r.reserved, 0, "first {first:?}, after a trim {later:?}");
        // Grown again never past its first request's largest block, a lane holds no more
        // at the end than it did: the reserve's peak stays within two pages of the first
        // request's (8 and 14 MiB above it here).
        assert!(
            r.peak <= first.peak + 16 * MIB,
            "first {first:?}, after a trim {later:?}"
        );
    }
    // A closing pool gives back the lanes' address space too.
    drop(p);
    assert!(dev.ledger().is_empty(), "{:?}", dev.ledger());
}

/// A shorter request after a trim: its lanes grow a page ahead of its blocks, never to the
/// longer request's size, and what they made that no block reached goes back when the request
/// ends. The price: the short request's peak is up to a page a lane above a fresh pool's.
#[test]
fn a_shorter_request_after_a_trim_grows_its_lanes_only_a_page_ahead() {
    let (dev, timed, p) = pool();
    let long = request(&p, &timed, 12);
    p.purge(&synchronize(&*dev).unwrap(), Purge::All).unwrap();
    let short = request(&p, &timed, 3);
    let fresh = {
        let (_dev, timed, p) = pool();
        request(&p, &timed, 3)
    };
    let lanes = long.reserved as usize - 1;
    assert!(
        short.peak < long.peak / 2 && short.peak <= fresh.peak + lanes * 8 * MIB,
        "long {long:?}, short after a trim {short:?}, short on a fresh pool {fresh:?}"
    );
    // What the lanes made ahead that its blocks did not reach went back at its end: 52 MB
    // (kept, the short request ended holding its peak, 323 MB; the fresh pool 218).
    assert!(
        short.end + 40 * MIB <= short.peak,
        "long {long:?}, short after a trim {short:?}, short on a fresh pool {fresh:?}"
    );
    // What the short request left cached goes back at the next trim, all of it.
    assert!(p.releasable(&Purge::All) > 0);
    p.purge(&synchronize(&*dev).unwrap(), Purge::All).unwrap();
    assert_eq!(dev.ledger().device_bytes, 0, "{:?}", dev.ledger());
}

/// Every unmap, with whether the device had finished all work queued before a mark.
#[derive(Debug)]
struct Watch {
    inner: Arc<dyn Driver>,
    mark: std::sync::Mutex<Option<u64>>,
    unmaps: std::sync::Mutex<Vec<(u64, usize, bool)>>,
}

impl cupool_pool::driver::forward::Forward for Watch {
    fn inner(&self) -> &dyn Driver {
        self.inner.as_ref()
    }

    fn unmap(
        &self,
        at: cupool_pool::driver::DevicePtr,
        bytes: usize,
        handle: cupool_pool::driver::PhysHandle,
    ) -> Result<(), cupool_pool::driver::DriverError> {
        if let Some(m) = *self.mark.lock().unwrap() {
            let idle = self.inner.epoch().idle_since(m);
            self.unmaps.lock().unwrap().push((at, bytes, idle));
        }
        self.inner.unmap(at, bytes, handle)
    }
}

/// A trim, a request, then a shorter one with no trim and no synchronize: the memory the
/// first request after the trim used stays with its lanes for the next one, and none of it is
/// unmapped while kernels queued before its frees may still use it. (Before the lanes kept the
/// largest block since their memory went back, the shorter request's end unmapped 80 such pages.)
#[test]
fn memory_a_request_used_after_a_trim_is_never_unmapped_under_its_kernels() {
    let dev = sim(4.0);
    let w = Arc::new(Watch {
        inner: as_driver(&dev),
        mark: std::sync::Mutex::new(None),
        unmaps: std::sync::Mutex::new(Vec::new()),
    });
    let p = VmmPool::with_config(
        w.clone(),
        VmmConfig {
            ahead: Ahead::Inline,
            // Any free memory is worth moving: no synchronize comes with a move.
            recycle_free: 100,
            ..recycling_config(8 * MIB, true)
        },
    )
    .expect("valid settings");
    let run = |steps: usize, seen: &mut Vec<(u64, usize)>| {
        let mut cache: Vec<Block> = (0..16).map(|_| p.alloc(3 * MIB).unwrap()).collect();
        seen.extend(cache.iter().map(|b| (b.ptr(), b.capacity())));
        for _ in 0..steps {
            for slot in cache.iter_mut() {
                let grown = p.alloc(slot.size() + 3 * MIB).unwrap();
                seen.push((grown.ptr(), grown.capacity()));
                p.free(std::mem::replace(slot, grown)).unwrap();
            }
        }
        for b in cache {
            p.free(b).unwrap();
        }
    };
    run(12, &mut Vec::new());
    p.purge(&synchronize(&*dev).unwrap(), Purge::All).unwrap();
    let mut used = Vec::new();
    run(8, &mut used);
    *w.mark.lock().unwrap() = Some(dev.epoch().current());
    let held = p.stats().reserved_bytes;
    run(2, &mut Vec::new());
    let unsafe_unmaps: Vec<_> = w
        .unmaps
        .lock()
        .unwrap()
        .iter()
        .copied()
        .filter(|&(a, l, idle)| {
            !idle
                && used
                    .iter()
                    .any(|&(b, c)| a < b + c as u64 && b < a + l as u64)
        })
        .collect();
    assert!(
        unsafe_unmaps.is_empty(),
        "pages under the last request's blocks unmapped with no synchronize since: {unsafe_unmaps:?}"
    );
    assert!(
        p.stats().reserved_bytes >= held,
        "the lanes kept their memory for the next request"
    );
}
