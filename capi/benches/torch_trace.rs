//! A recorded PyTorch allocation stream replayed through libcupool's PyTorch entry points
//! (`cupool_torch_alloc`, `cupool_torch_free`), one thread, as the plug-in calls them: the CPU
//! time libcupool adds to each tensor a model makes. The trace is parsed before the clock
//! starts; the time is the calls' alone, split by request size (up to 1 MiB: blocks a thread's
//! cache may keep; above: large blocks and the KV cache's lanes), and for the large ones by
//! tenth of the trace.
//!
//! The trace runs `BENCH_ROUNDS` times in one process (default 5), each round after the last
//! freed everything: the first is the recorded process, the later ones a process serving the
//! same request again on the pool the first left. Before lanes were taken again by the next
//! request (`pool/src/placement/lanes/again.rs`), a large allocation took 0.6 µs in the first
//! round and 7 to 23 µs on average in the later ones (up to 174 µs late in the fifth): the pool moved
//! the old lanes' pages one by one.
//!
//! - `BENCH_TRACE`: the trace (default: the Phi-3 chunked prefill recorded on the H100,
//!   `data/h100-2026-11-22-pytorch/trace-phi3.jsonl.gz`);
//! - `BENCH_DEVICE`: `sim` (the default, runs anywhere) or `cuda` (real driver calls, no
//!   kernels);
//! - `BENCH_THRASH`: KiB of memory read and written between two calls, untimed (default 0):
//!   a prefill's kernel launches run between its allocations and leave the CPU's caches cold
//!   for them, which a tight loop of calls does not show;
//! - libcupool set as `cupool.torch.install()` sets it (`CUPOOL_VMM_AHEAD=worker`,
//!   `CUPOOL_SIZE_CLASSES=none`) unless the environment sets otherwise; every other setting
//!   from the environment. (Before 2026-11-29 the bench passed a configuration string with
//!   only the device, which replaces the environment: runs that set `CUPOOL_VMM_AHEAD=worker`
//!   made their pages where each block landed, and used libcupool's size classes.)
//!
//! Prints one JSON line per round and the median over the rounds after the first; `perf
//! record` on this binary shows where the time goes.
use cupool::{
    cupool_init, cupool_reset_peaks, cupool_shutdown, cupool_stats_json, cupool_torch_alloc,
    cupool_torch_free, CupoolStatus,
};
use cupool_pool::trace::{parse, TraceEvent};
use std::collections::HashMap;
use std::ffi::c_void;
use std::io::Read;
use std::time::{Duration, Instant};

/// A request above this many bytes is one no thread's cache keeps (and libcupool's size class
/// for large blocks, where the size classes are on).
const SMALL: usize = 1 << 20;

/// One call to make, with the trace's ids resolved to slots.
enum Call {
    Alloc { slot: usize, size: usize },
    Free { slot: usize },
}

fn load(path: &str) -> Vec<Call> {
    let mut raw = Vec::new();
    std::fs::File::open(path)
        .unwrap_or_else(|e| panic!("BENCH_TRACE {path}: {e}"))
        .read_to_end(&mut raw)
        .expect("the trace is readable");
    let text = if path.ends_with(".gz") {
        let mut s = String::new();
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_string(&mut s)
            .expect("the trace is gzip");
        s
    } else {
        String::from_utf8(raw).expect("the trace is UTF-8")
    };
    let events = parse(&text).expect("the trace parses");
    // Ids become dense slots, so the replay indexes a vector, not a map.
    let mut slots = HashMap::new();
    let mut calls = Vec::with_capacity(events.len());
    for e in events {
        match e {
            TraceEvent::Alloc { id, size, .. } => {
                let slot = slots.len();
                slots.insert(id, slot);
                calls.push(Call::Alloc { slot, size });
            }
            TraceEvent::Free { id } => {
                if let Some(slot) = slots.get(&id) {
                    calls.push(Call::Free { slot: *slot });
                }
            }
            _ => {}
        }
    }
    calls
}

/// Time spent in each kind of call during one replay.
#[derive(Default)]
struct Spent {
    small: (u64, Duration),
    large: (u64, Duration),
    frees: (u64, Duration),
    /// Large allocations' time in each tenth of the trace: whether a call's cost grows with
    /// what the pool has seen.
    tenths: [(u64, Duration); 10],
}

fn replay(calls: &[Call], sizes: &mut [usize], ptrs: &mut [usize], thrash: &mut [u64]) -> Spent {
    let mut spent = Spent::default();
    let stream = std::ptr::null_mut();
    for (i, c) in calls.iter().enumerate() {
        // One word a cache line: enough to evict what the last call left cached.
        for w in thrash.iter_mut().step_by(8) {
            *w = std::hint::black_box(w.wrapping_add(1));
        }
        let tenth = i * 10 / calls.len();
        match *c {
            Call::Alloc { slot, size } => {
                let t = Instant::now();
                let p = cupool_torch_alloc(size, 0, stream);
                let d = t.elapsed();
                assert!(
                    !p.is_null(),
                    "the trace's allocation of {size} bytes failed"
                );
                let bin = if size <= SMALL {
                    &mut spent.small
                } else {
                    &mut spent.large
                };
                bin.0 += 1;
                bin.1 += d;
                if size > SMALL {
                    spent.tenths[tenth].0 += 1;
                    spent.tenths[tenth].1 += d;
                }
                sizes[slot] = size;
                ptrs[slot] = p as usize;
            }
            Call::Free { slot } => {
                let t = Instant::now();
                cupool_torch_free(ptrs[slot] as *mut c_void, sizes[slot], 0, stream);
                spent.frees.0 += 1;
                spent.frees.1 += t.elapsed();
                ptrs[slot] = 0;
            }
        }
    }
    // What the trace left live is freed, so the next replay starts where this one did.
    for (p, s) in ptrs.iter_mut().zip(sizes.iter()) {
        if *p != 0 {
            cupool_torch_free(*p as *mut c_void, *s, 0, stream);
            *p = 0;
        }
    }
    spent
}

/// libcupool's reserve peak since the last reset, in MiB (every device): what the replay held.
fn reserved_peak_mib() -> f64 {
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: `buf` has `buf.len()` writable bytes.
    let n = unsafe { cupool_stats_json(-1, buf.as_mut_ptr().cast(), buf.len()) };
    let text = std::str::from_utf8(&buf[..n.min(buf.len())]).expect("the statistics are UTF-8");
    let key = "\"reserved_bytes.all.peak\":";
    let at = text
        .find(key)
        .expect("the statistics name the reserve's peak")
        + key.len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse::<f64>().expect("a byte count") / (1u64 << 20) as f64
}

/// Sets the bench's device (`BENCH_DEVICE` decides it, so the results name the device that
/// ran), and `cupool.torch.install()`'s defaults where the environment leaves them unset;
/// libcupool then reads its settings from there (`cupool_init(NULL)`).
fn settings(device: &str) {
    std::env::set_var("CUPOOL_DEVICE", device);
    // The simulated card must hold the trace's peak (about 18 GiB for Llama-3).
    for (k, v) in [
        ("CUPOOL_SIM_GIB", "80"),
        ("CUPOOL_VMM_AHEAD", "worker"),
        ("CUPOOL_SIZE_CLASSES", "none"),
    ] {
        if std::env::var_os(k).is_none() {
            std::env::set_var(k, v);
        }
    }
}

fn ns(bin: (u64, Duration)) -> f64 {
    bin.1.as_nanos() as f64 / bin.0.max(1) as f64
}

fn main() {
    let path = std::env::var("BENCH_TRACE").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../data/h100-2026-11-22-pytorch/trace-phi3.jsonl.gz"
        )
        .into()
    });
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .map(|r| r.parse().expect("BENCH_ROUNDS: a number of replays"))
        .unwrap_or(5);
    let device = std::env::var("BENCH_DEVICE").unwrap_or_else(|_| "sim".into());
    let thrash_kib: usize = std::env::var("BENCH_THRASH")
        .map(|r| {
            r.parse()
                .expect("BENCH_THRASH: KiB touched between two calls")
        })
        .unwrap_or(0);
    let mut thrash = vec![0u64; thrash_kib * 128];
    let calls = load(&path);
    let n = calls
        .iter()
        .filter(|c| matches!(c, Call::Alloc { .. }))
        .count();
    let (mut sizes, mut ptrs) = (vec![0; n], vec![0; n]);
    settings(&device);
    // SAFETY: a null configuration reads the environment.
    assert_eq!(unsafe { cupool_init(std::ptr::null()) }, CupoolStatus::Ok);
    let mut per_event = Vec::new();
    for round in 0..rounds.max(2) {
        assert_eq!(cupool_reset_peaks(-1), CupoolStatus::Ok);
        let t = Instant::now();
        let s = replay(&calls, &mut sizes, &mut ptrs, &mut thrash);
        let wall = t.elapsed();
        let reserved = reserved_peak_mib();
        let events = s.small.0 + s.large.0 + s.frees.0;
        println!(
            "{{\"round\":{round},\"device\":\"{device}\",\"events\":{events},\"wall_ms\":{:.1},\"ns_per_event\":{:.0},\"small_alloc_ns\":{:.0},\"large_alloc_ns\":{:.0},\"free_ns\":{:.0},\"small_allocs\":{},\"large_allocs\":{},\"frees\":{},\"large_alloc_ns_by_tenth\":{:?},\"reserved_peak_mib\":{reserved:.1}}}",
            wall.as_secs_f64() * 1e3,
            wall.as_nanos() as f64 / events as f64,
            ns(s.small),
            ns(s.large),
            ns(s.frees),
            s.small.0,
            s.large.0,
            s.frees.0,
            s.tenths.map(|t| ns(t).round() as u64)
        );
        if round > 0 {
            per_event.push(wall.as_nanos() as f64 / events as f64);
        }
    }
    per_event.sort_by(f64::total_cmp);
    println!(
        "median over {} replays: {:.0} ns per call",
        per_event.len(),
        per_event[per_event.len() / 2]
    );
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok);
}
