// A ggml stream's pool through libcupool, as the shim drives it: the requests ik_llama.cpp made
// on an H100 (its MoE's sweep, recorded with CUPOOL_TRACE: data/h100-2026-11-27-ik-warmup/moe),
// replayed call for call through the C API with GGML_POOL=legacy and CUPOOL_PURGE=never, reserve
// what ggml's legacy policy reserves for them (the library's replay of the same trace) at every
// ubatch end. With a thread's kept blocks in front of the legacy pool, the run itself logged
// 13.4 MiB more from its first ubatch on.
use super::api::{alloc, error, init, stat, stats, TURN};
use crate::*;
use cupool_pool::trace::{self, Op};
use cupool_pool::{PoolConfig, PoolKind, PurgePolicy};
use std::collections::HashMap;
use std::io::Read;

const RUN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../data/h100-2026-11-27-ik-warmup/moe/moe12-c20480-trace"
);

fn recorded() -> Vec<Op> {
    let f = std::fs::File::open(format!("{RUN}.trace.jsonl.gz")).unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(f)
        .read_to_string(&mut text)
        .unwrap();
    trace::parse(&text).unwrap()
}

/// The reserve libcupool's run logged at its first ubatch end (`peak_reserved=`).
fn logged_first_ubatch() -> usize {
    let log = std::fs::read_to_string(format!("{RUN}.log")).unwrap();
    let at = log.find("ubatch end ubatch=1 ").unwrap();
    let v = &log[at..].split("peak_reserved=").nth(1).unwrap();
    v.split(' ').next().unwrap().parse().unwrap()
}

#[test]
fn a_legacy_stream_pool_reserves_what_ggml_s_policy_does() {
    let _t = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let ops = recorded();
    assert_eq!(
        init("CUPOOL_DEVICE=sim CUPOOL_SIM_GIB=4 GGML_POOL=legacy CUPOOL_PURGE=never"),
        CupoolStatus::Ok,
        "{}",
        error()
    );
    let mut held = HashMap::new();
    let mut ends = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Alloc { id, size, .. } => {
                let (p, _) = alloc(0, 0, *size);
                assert!(!p.is_null(), "event {i}: {}", error());
                held.insert(*id, (p, *size));
            }
            Op::Free { id } => {
                let (p, size) = held.remove(id).unwrap();
                assert_eq!(cupool_free(0, 0, p, size), CupoolStatus::Ok, "{}", error());
            }
            Op::PhaseEnd { .. } => {
                // SAFETY: a null `released` is accepted.
                let s = unsafe { cupool_ubatch_end(0, std::ptr::null_mut()) };
                assert_eq!(s, CupoolStatus::Ok, "{}", error());
                let reserved = stat(&stats(0), "reserved_bytes.all.current") as usize;
                ends.push((i, reserved));
            }
            _ => {}
        }
    }
    assert_eq!(cupool_shutdown(), CupoolStatus::Ok, "{}", error());
    assert_eq!(ends.len(), 41, "the start-up phase and 40 sweep steps");
    let legacy = PoolConfig::default().kind(PoolKind::Legacy);
    for (k, &(i, reserved)) in ends.iter().enumerate() {
        let r = trace::replay(&ops[..=i], &legacy, PurgePolicy::Never, None).unwrap();
        assert_eq!(reserved, r.end_reserved_bytes, "ubatch {k}");
    }
    // The first ubatch (the warm-up and the first prefill ubatch): 13.40625 MiB less than the
    // run logged, when its thread kept blocks in front of the legacy pool.
    assert_eq!(logged_first_ubatch() - ends[0].1, 14_057_472);
}
