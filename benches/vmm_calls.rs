//! What each CUDA virtual-memory call costs, alone and batched: the numbers behind the VMM
//! pool's choice of how to move recycled pages (`pool/src/upstream/vmm/recycle.rs`).
//!
//! For pages of 2 and 8 MiB, 64 at a time, it times `cuMemCreate` (plain and exportable as a
//! POSIX file descriptor), `cuMemMap`, `cuMemSetAccess` per page and once over the 64 pages,
//! `cuMemUnmap` per page and once over the 64 (where the driver accepts a range that covers
//! several mappings), `cuMemRelease`, a page move made at once (unmap, map, access), moves whose
//! access is granted once per run of pages, and the pool's move: a second mapping (map,
//! access; `alias_each`) whose old one is dropped later (`unalias_each`). Prints one JSON line
//! per measurement (microseconds per page, the median of 5 rounds); skips without a GPU.
//!
//!     cargo bench --bench vmm_calls
use cudarc::driver::sys;
use std::mem::MaybeUninit;
use std::time::Instant;

#[path = "common/gpu_timing.rs"]
#[allow(dead_code)]
mod gpu_timing;

const MIB: usize = 1 << 20;
const PAGES: usize = 64;
const ROUNDS: usize = 5;

struct Vmm {
    dev: i32,
    access: sys::CUmemAccessDesc,
}

fn ok(r: sys::CUresult, what: &str) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what}");
}

impl Vmm {
    fn prop(&self, exportable: bool) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct for which all-zero is a valid (empty) value.
        let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = self.dev;
        if exportable {
            p.requestedHandleTypes =
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        }
        p
    }

    fn create(&self, bytes: usize, exportable: bool) -> sys::CUmemGenericAllocationHandle {
        let prop = self.prop(exportable);
        let mut h = MaybeUninit::uninit();
        // SAFETY: creates physical memory; `h` is written on success, which `ok` checks.
        ok(
            unsafe { sys::cuMemCreate(h.as_mut_ptr(), bytes, &prop, 0) },
            "cuMemCreate",
        );
        // SAFETY: written by the successful call.
        unsafe { h.assume_init() }
    }

    fn reserve(&self, bytes: usize) -> sys::CUdeviceptr {
        let mut p = MaybeUninit::uninit();
        // SAFETY: reserves address space; `p` is written on success.
        ok(
            unsafe { sys::cuMemAddressReserve(p.as_mut_ptr(), bytes, 0, 0, 0) },
            "cuMemAddressReserve",
        );
        // SAFETY: written by the successful call.
        unsafe { p.assume_init() }
    }

    fn map(&self, at: sys::CUdeviceptr, bytes: usize, h: sys::CUmemGenericAllocationHandle) {
        // SAFETY: `at` lies in a reservation of ours with nothing mapped; `h` is live.
        ok(unsafe { sys::cuMemMap(at, bytes, 0, h, 0) }, "cuMemMap");
    }

    fn grant(&self, at: sys::CUdeviceptr, bytes: usize) {
        // SAFETY: the range is mapped; one descriptor.
        ok(
            unsafe { sys::cuMemSetAccess(at, bytes, &self.access, 1) },
            "cuMemSetAccess",
        );
    }

    fn unmap(&self, at: sys::CUdeviceptr, bytes: usize) -> sys::CUresult {
        // SAFETY: the range is mapped by us and idle.
        unsafe { sys::cuMemUnmap(at, bytes) }
    }
}

/// Microseconds per page of `f`, which handles `PAGES` pages: the median of the rounds.
fn per_page(rounds: &mut [f64]) -> f64 {
    rounds.sort_by(|a, b| a.total_cmp(b));
    rounds[rounds.len() / 2] / PAGES as f64
}

fn line(page: usize, what: &str, us: f64) {
    println!(
        "{{\"bench\":\"vmm_calls\",\"page_mib\":{},\"call\":\"{what}\",\"us_per_page\":{us:.2}}}",
        page / MIB
    );
}

fn main() {
    let Some(ctx) = gpu_timing::device("vmm_calls") else {
        return;
    };
    ctx.bind_to_thread().expect("binding the context");
    // SAFETY: a plain C struct for which all-zero is a valid (empty) value.
    let mut access: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    access.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    let v = Vmm { dev: 0, access };
    for page in [2 * MIB, 8 * MIB] {
        let span = page * PAGES;
        // Two ranges: pages move from `a` to `b` and back.
        let (a, b) = (v.reserve(span), v.reserve(span));
        let at = |base: sys::CUdeviceptr, i: usize| base + (i * page) as u64;
        let mut t: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
        let mut time = |name: &'static str, f: &mut dyn FnMut()| {
            let s = Instant::now();
            f();
            t.entry(name)
                .or_default()
                .push(s.elapsed().as_secs_f64() * 1e6);
        };
        for _ in 0..ROUNDS {
            for exportable in [true, false] {
                let mut hs = Vec::new();
                let name = if exportable {
                    "create_exportable"
                } else {
                    "create_plain"
                };
                time(name, &mut || {
                    hs = (0..PAGES).map(|_| v.create(page, exportable)).collect()
                });
                time(
                    if exportable {
                        "map_exportable"
                    } else {
                        "map_plain"
                    },
                    &mut || {
                        for (i, &h) in hs.iter().enumerate() {
                            v.map(at(a, i), page, h);
                        }
                    },
                );
                time("access_each_page", &mut || {
                    for i in 0..PAGES {
                        v.grant(at(a, i), page);
                    }
                });
                time("access_once_per_run", &mut || v.grant(a, span));
                // The pool's move today: unmap, map elsewhere, grant that page.
                time("move_each_granted", &mut || {
                    for (i, &h) in hs.iter().enumerate() {
                        ok(v.unmap(at(a, i), page), "cuMemUnmap");
                        v.map(at(b, i), page, h);
                        v.grant(at(b, i), page);
                    }
                });
                // Moves whose access is granted once over the run they landed in.
                time("move_run_granted", &mut || {
                    for (i, &h) in hs.iter().enumerate() {
                        ok(v.unmap(at(b, i), page), "cuMemUnmap");
                        v.map(at(a, i), page, h);
                    }
                    v.grant(a, span);
                });
                // The pool's move now: the page mapped and granted at its new place while it
                // stays mapped at the old one, and the old mapping dropped later.
                time("alias_each", &mut || {
                    for (i, &h) in hs.iter().enumerate() {
                        v.map(at(b, i), page, h);
                        v.grant(at(b, i), page);
                    }
                });
                time("unalias_each", &mut || {
                    for i in 0..PAGES {
                        ok(v.unmap(at(a, i), page), "cuMemUnmap of an alias");
                    }
                });
                for (i, &h) in hs.iter().enumerate() {
                    ok(v.unmap(at(b, i), page), "cuMemUnmap");
                    v.map(at(a, i), page, h);
                }
                v.grant(a, span);
                // One unmap over the 64 mappings, where the driver takes such a range.
                let whole = v.unmap(a, span);
                let unmapped = whole == sys::CUresult::CUDA_SUCCESS;
                if !unmapped {
                    time("unmap_each", &mut || {
                        for i in 0..PAGES {
                            ok(v.unmap(at(a, i), page), "cuMemUnmap");
                        }
                    });
                } else {
                    // Map them again to time the per-page unmap too.
                    for (i, &h) in hs.iter().enumerate() {
                        v.map(at(a, i), page, h);
                    }
                    time("unmap_each", &mut || {
                        for i in 0..PAGES {
                            ok(v.unmap(at(a, i), page), "cuMemUnmap");
                        }
                    });
                    for (i, &h) in hs.iter().enumerate() {
                        v.map(at(a, i), page, h);
                    }
                    v.grant(a, span);
                    time("unmap_once_per_run", &mut || {
                        ok(v.unmap(a, span), "cuMemUnmap over a run")
                    });
                }
                println!(
                    "{{\"bench\":\"vmm_calls\",\"page_mib\":{},\"unmap_over_several_mappings\":\"{whole:?}\"}}",
                    page / MIB
                );
                time("release", &mut || {
                    for &h in &hs {
                        // SAFETY: every mapping of `h` is gone.
                        ok(unsafe { sys::cuMemRelease(h) }, "cuMemRelease");
                    }
                });
            }
        }
        for (name, mut r) in t {
            line(page, name, per_page(&mut r));
        }
        for base in [a, b] {
            // SAFETY: nothing is mapped in the range any more.
            ok(
                unsafe { sys::cuMemAddressFree(base, span) },
                "cuMemAddressFree",
            );
        }
    }
}
