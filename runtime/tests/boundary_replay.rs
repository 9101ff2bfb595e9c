//! The boundary decision is taken once ([`cupool_pool::Boundary`]): a run recorded with any
//! policy, headroom, pool kind and ubatch sequence, then replayed from its trace, returns the
//! same bytes at every prefill boundary and reaches the same peak reserve.
use cupool_kernels::KvType;
use cupool_pool::driver::sim::{SimConfig, SimDevice};
use cupool_pool::driver::Driver;
use cupool_pool::trace::{self, TraceEvent};
use cupool_pool::{AutoHeadroom, PoolConfig, PoolKind};
use cupool_runtime::executor::dry_run::DryRun;
use cupool_runtime::*;
use proptest::prelude::*;
use std::sync::Arc;

const MIB: usize = 1 << 20;
const CARD_GIB: f64 = 4.0;

/// Two layers of Phi-3-mini over a q8_0 cache: flash-attention scratch of tens of MiB that
/// grows with the cache, beside a 32 MiB GEMM workspace.
fn cfg(kind: PoolKind, purge: PurgePolicy, headroom: AutoHeadroom, n_ubatch: usize) -> RunConfig {
    let mut shape = ModelShape::preset("phi3-mini").unwrap();
    shape.n_layer = 2;
    shape.weights_bytes = 0; // the two layers' own, from the layout
    let mut c = RunConfig::new(shape, 8192);
    c.kv_type = KvType::Q8_0;
    c.n_ubatch = n_ubatch;
    c.n_batch = n_ubatch * 2;
    c.pool = PoolConfig::default().kind(kind);
    c.purge = purge;
    c.auto_headroom = headroom;
    c.record_trace = true;
    c
}

fn card() -> Arc<dyn Driver> {
    Arc::new(SimDevice::new(SimConfig::gib(CARD_GIB).backed(false).record_calls(false)).unwrap())
}

/// What a run of `prompt` tokens then `decode` single tokens returned at each prefill
/// boundary, its peak reserve and its trace.
fn record(c: RunConfig, prompt: usize, decode: usize) -> (Vec<usize>, usize, Vec<TraceEvent>) {
    let mut rt = Runtime::new(card(), c, Box::new(DryRun)).unwrap();
    let mut rows = Vec::new();
    let mut peak = 0;
    let r = rt.prefill(prompt).unwrap();
    assert!(r.completed, "the card has room for every run");
    peak = peak.max(r.peak_reserved_bytes);
    rows.extend(r.ubatches);
    for t in 0..decode {
        let r = rt.decode(&[t as i32]).unwrap();
        peak = peak.max(r.peak_reserved_bytes);
        rows.extend(r.ubatches);
    }
    let released = rows
        .iter()
        .filter(|r| r.n_tokens > 1)
        .map(|r| r.purged_bytes)
        .collect();
    (released, peak, rt.recorder().unwrap().events())
}

/// Free device memory once the startup buffers of `c` are allocated.
fn free_after_startup(c: &RunConfig) -> usize {
    let d = card();
    let _rt = Runtime::new(d.clone(), c.clone(), Box::new(DryRun)).unwrap();
    d.mem_info().unwrap().free
}

fn kinds() -> impl Strategy<Value = PoolKind> {
    prop::sample::select(vec![
        PoolKind::Legacy,
        PoolKind::Vmm,
        PoolKind::Torch,
        PoolKind::Managed,
    ])
}

fn policies() -> impl Strategy<Value = PurgePolicy> {
    prop::sample::select(vec![
        PurgePolicy::Never,
        PurgePolicy::Always,
        PurgePolicy::Auto,
    ])
}

/// `None`: a fixed number of MiB below the free memory after startup (so the device turns
/// short as the pool grows, at a random point); otherwise the headroom itself.
fn headrooms() -> impl Strategy<Value = Option<AutoHeadroom>> {
    prop_oneof![
        Just(Some(AutoHeadroom::Ubatch)),
        Just(Some(AutoHeadroom::Infinite)),
        Just(Some(AutoHeadroom::Bytes(0))),
        Just(None),
    ]
}

fn check(
    kind: PoolKind,
    purge: PurgePolicy,
    headroom: Option<AutoHeadroom>,
    below_free_mib: usize,
    n_ubatch: usize,
    prompt: usize,
    decode: usize,
) -> Result<(Vec<usize>, Vec<TraceEvent>), TestCaseError> {
    let headroom = match headroom {
        Some(h) => h,
        None => {
            let free = free_after_startup(&cfg(kind, purge, AutoHeadroom::Ubatch, n_ubatch));
            AutoHeadroom::Bytes(free.saturating_sub(below_free_mib * MIB))
        }
    };
    let c = cfg(kind, purge, headroom, n_ubatch);
    let pool = c.pool.clone();
    let (released, peak, events) = record(c, prompt, decode);
    let replayed = trace::replay(&events, &pool, purge, None).unwrap();
    prop_assert_eq!(
        &replayed.boundary_releases,
        &released,
        "bytes returned per boundary"
    );
    prop_assert_eq!(replayed.peak_reserved_bytes, peak, "peak reserve");
    prop_assert_eq!(replayed.ooms, 0);
    Ok((released, events))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_replay_decides_every_boundary_as_the_recorded_run_did(
        kind in kinds(),
        purge in policies(),
        headroom in headrooms(),
        below_free_mib in 0usize..160,
        n_ubatch in prop::sample::select(vec![64usize, 256, 512, 1024]),
        prompt in 2usize..6000,
        decode in 0usize..3,
    ) {
        check(kind, purge, headroom, below_free_mib, n_ubatch, prompt, decode)?;
    }
}

/// The random cases above cover both sides of `auto`'s decision: here one sequence is short
/// at some boundaries and not at others, and releases memory at some.
#[test]
fn auto_turns_short_mid_run_and_the_replay_follows() {
    let (released, events) =
        check(PoolKind::Legacy, PurgePolicy::Auto, None, 60, 512, 6000, 1).unwrap();
    let kept_all = events
        .iter()
        .filter(|e| matches!(e, TraceEvent::Keep { sizes: None, .. }))
        .count();
    let kept_some = events
        .iter()
        .filter(|e| matches!(e, TraceEvent::Keep { sizes: Some(_), .. }))
        .count();
    assert!(kept_all > 0 && kept_some > 0, "{kept_all} {kept_some}");
    assert!(released.iter().any(|&b| b > 0), "{released:?}");
}
