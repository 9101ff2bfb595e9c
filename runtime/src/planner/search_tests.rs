//! The largest context where mainline's compute buffer is not monotone in the context: a
//! mixture of experts' (see `search.rs`), against every context tried one by one; and the
//! search's two prompts per context, run at once, against the same run one after the other;
//! and a search that only needs to beat a context, against the whole one.

use super::*;
use crate::engine_kind::EngineKind;
use crate::model::ModelShape;
use crate::planner::probe::fits_beside;
use crate::planner::tail::tail_prompt;
use crate::planner::test_setup::{h100, two_layers};
use crate::planner::{room_beside, simulate_beside, GPU_MALLOC_PAGE};
use crate::policy::PurgePolicy;
use crate::profiled::LayerBytes;
use cupool_pool::layering::Layering;
use cupool_pool::PoolKind;
use cupool_profiles::{EngineModel, Profile, Weights};

const MIB: usize = 1 << 20;
const GIB: f64 = (1u64 << 30) as f64;

/// Qwen3-30B-A3B's shape with `n_layer` layers and `n_head_kv` KV heads under the `llama`
/// profile, q8_0 experts and cache, `-b 2048 -ub 512`, the vmm pool purged `auto`: the plan of
/// data/h100-2026-11-25-mainline-predict's `qwen3-q8` cases (their GGUF: 2,982,014,976 bytes of
/// weights on the device).
fn qwen3moe(n_layer: usize, n_head_kv: usize, weights_bytes: usize) -> RunConfig {
    let mut m = EngineModel::preset("qwen3-30b-a3b").unwrap();
    m.n_layer = n_layer;
    m.n_head_kv = n_head_kv;
    let moe = m.moe.unwrap();
    let shape = ModelShape {
        name: "qwen3moe".into(),
        n_layer,
        n_embd: m.n_embd,
        n_head: m.n_head,
        n_head_kv,
        head_dim_k: m.head_dim,
        head_dim_v: m.head_dim,
        v_is_k: false,
        n_ff: moe.n_expert_used * moe.n_ff_exp,
        weights_bytes,
    };
    let mut cfg = RunConfig::new(shape, 4096);
    cfg.engine = EngineKind::Profile {
        profile: Profile::Llama,
        cc: 900,
    };
    cfg.engine_model = Some(m);
    cfg.weight_type = Weights::Q8_0;
    cfg.pool.kind = Some(PoolKind::Vmm);
    cfg.purge = PurgePolicy::Auto;
    cfg
}

/// `cfg` with the library's pool rather than libcupool's (no size classes, 128-byte
/// rounding): the pool the bump tests' figures were worked out with. Which pool it is does not
/// matter to them; that the pool's peak stays put does.
fn ggml_s_layering(mut cfg: RunConfig) -> RunConfig {
    cfg.layering = Layering {
        round_large: false,
        size_classes: false,
    };
    cfg
}

/// Every context tried from the top: none fits above the one whose start-up buffers, with the
/// buffer's floor, no longer fit (the floor is below the buffer and never decreases: checked
/// below), and below it each context is its own plan.
fn brute_force(cfg: &RunConfig, t: &PlanTarget) -> Option<usize> {
    let starts = |c: usize| {
        let (w, kv) = cfg.resident_bytes(c);
        room_beside(t, (w, kv, cfg.compute_floor_bytes(c))).is_ok()
    };
    let top = (1..=crate::config::MAX_CTX / STEP)
        .map(|s| s * STEP)
        .take_while(|&c| starts(c))
        .last()?;
    (1..=top / STEP)
        .rev()
        .map(|s| s * STEP)
        .find(|&c| fits(cfg, t, c).unwrap())
}

/// The bump: the buffer at 256, 512, 4,096 and 38,400 positions (MiB).
fn buffers_mib(cfg: &RunConfig) -> Vec<f64> {
    [256, 512, 4096, 38400]
        .iter()
        .map(|&c| cfg.compute_buffer_bytes(c) as f64 / MIB as f64)
        .collect()
}

/// The recorded 4-layer shape with 3.925 GiB free: the bump (341.5 MiB up to 37,376
/// positions, 300.75 MiB from 38,400) fails the contexts from 31,488 to 38,144 while
/// 38,400 to 40,960 fit beside the smaller buffer. A bisection over the contexts took 31,232.
#[test]
fn a_context_past_the_bump_fits_above_ones_that_do_not() {
    let cfg = ggml_s_layering(qwen3moe(4, 4, 2_982_014_976));
    assert_eq!(
        buffers_mib(&cfg),
        // 256 positions run in batches of 256 tokens (`RunConfig::clamped_to`)
        [150.375, 341.33984375, 341.53515625, 300.75]
    );
    // (the driver's last page beside it: `usable`)
    let t = h100(&cfg, (3.925 * GIB) as usize + GPU_MALLOC_PAGE);
    let fit = |c| fits(&cfg, &t, c).unwrap();
    assert_eq!(
        [31232, 31488, 38144, 38400].map(fit),
        [true, false, false, true]
    );
    assert_eq!(max_ctx_that_fits(&cfg, &t).unwrap(), Some(40960));
    assert_eq!(brute_force(&cfg, &t), Some(40960));
}

/// Two layers of one KV head, 340 MiB free beside the weights and what lies outside them: 256
/// positions fit beside the 300.75 MiB buffer, 512 to 37,376 do not beside 341.3–344.6 MiB,
/// and from 38,400 up to 49,920 fit again. A bisection over the contexts stopped at 256.
#[test]
fn a_bump_at_a_short_context_does_not_hide_the_longer_ones() {
    let cfg = ggml_s_layering(qwen3moe(2, 1, 1 << 30));
    let free = (1 << 30) + 340 * MIB + h100(&cfg, 0).outside.at_compute() + GPU_MALLOC_PAGE;
    let t = h100(&cfg, free);
    assert!(fits(&cfg, &t, 256).unwrap() && !fits(&cfg, &t, 512).unwrap());
    assert_eq!(max_ctx_that_fits(&cfg, &t).unwrap(), Some(49920));
    assert_eq!(brute_force(&cfg, &t), Some(49920));
}

/// The recorded cases: at 3.8 GiB only 256 positions fit (the engine refused 10,496 and 11,008
/// at start-up, its compute buffer of 341.5 MiB 39 MiB beyond the room the KV cache left; on
/// 2026-11-27 it ran 256 and refused 768), at 4 GiB 59,136 (the engine refused 59,904 and 60,416
/// at start-up, 300.75 MiB asked, and on 2026-11-27 59,648, with 302.6 MiB free: the driver's
/// last page, which a plan without it counted as room), 58,624 with libcupool's pool: its size
/// classes, and the retry that purges them all on an out-of-memory (on 2026-11-27 58,624 ran,
/// retrying every ubatch, and 59,136 died at its first compute).
#[test]
fn the_recorded_moe_cases_are_their_brute_force_s() {
    let cfg = qwen3moe(4, 4, 2_982_014_976);
    for (gib, want) in [(3.8, 256), (4.0, 58624)] {
        let t = h100(&cfg, (gib * GIB) as usize);
        assert_eq!(
            max_ctx_that_fits(&cfg, &t).unwrap(),
            Some(want),
            "{gib} GiB"
        );
        assert_eq!(brute_force(&cfg, &t), Some(want), "{gib} GiB");
    }
}

/// The floor the search bisects on is below the replayed buffer and never decreases, for the
/// mixture of experts and the dense presets under both mainline profiles (`llama`, whose buffer
/// holds the K/V copies, and `llama-b8833`, whose copies come from the pool), and is the buffer
/// itself for ik_llama.cpp's closed form.
#[test]
fn the_compute_buffer_s_floor_is_below_it_and_monotone() {
    let mut configs = vec![qwen3moe(4, 4, 1 << 30), qwen3moe(1, 1, 1 << 30)];
    for name in ["phi3-mini", "llama3-8b"] {
        let mut m = EngineModel::preset(name).unwrap();
        m.n_layer = 2;
        let mut shape = ModelShape::preset(name).unwrap();
        shape.n_layer = 2;
        let mut cfg = RunConfig::new(shape, 4096);
        cfg.engine = EngineKind::Profile {
            profile: Profile::Llama,
            cc: 900,
        };
        cfg.engine_model = Some(m);
        configs.push(cfg);
    }
    let b8833: Vec<RunConfig> = configs
        .iter()
        .map(|c| {
            let mut c = c.clone();
            c.engine = EngineKind::Profile {
                profile: Profile::LlamaB8833,
                cc: 900,
            };
            c
        })
        .collect();
    configs.extend(b8833);
    for cfg in &configs {
        let mut last = 0;
        for c in (STEP..=80_000).step_by(STEP) {
            let (floor, exact) = (cfg.compute_floor_bytes(c), cfg.compute_buffer_bytes(c));
            assert!(
                floor <= exact && floor >= last,
                "{} {:?}: -c {c}",
                cfg.model.name,
                cfg.engine
            );
            last = floor;
        }
    }
    let mut ik = qwen3moe(4, 4, 1 << 30);
    ik.engine = EngineKind::Profile {
        profile: Profile::IkLlama,
        cc: 900,
    };
    for c in [256, 4096, 38400] {
        assert_eq!(ik.compute_floor_bytes(c), ik.compute_buffer_bytes(c));
    }
}

/// Whether every prompt up to `n_ctx` completes beside a compute buffer of `compute` bytes, as
/// the search asked before it ran the two prompts at once: the full one, then the one ending in
/// the worst tail only where the full one completes.
fn fits_one_after_the_other(
    cfg: &RunConfig,
    t: &PlanTarget,
    n_ctx: usize,
    compute: usize,
) -> Result<bool, RuntimeError> {
    let mut c = cfg.clone();
    c.n_ctx = n_ctx;
    let (w, kv) = c.resident_bytes(n_ctx);
    let buffers = (w, kv, compute);
    if simulate_beside(&c, t, n_ctx, buffers)?.stop.is_some() {
        return Ok(false);
    }
    Ok(match tail_prompt(&c, t, &mut LayerBytes::new(&c)) {
        Some(p) => simulate_beside(&c, t, p, buffers)?.stop.is_none(),
        None => true,
    })
}

/// Whether every prompt up to a context of `n_ctx` completes beside its own compute buffer.
fn fits(cfg: &RunConfig, target: &PlanTarget, n_ctx: usize) -> Result<bool, RuntimeError> {
    let compute = cfg.compute_buffer_bytes(n_ctx);
    Ok(fits_beside(cfg, target, n_ctx, compute, &mut LayerBytes::new(cfg), None)?.is_some())
}

/// An H100 whose free memory leaves `room_mib` MiB beside `cfg`'s weights and what lies
/// outside the buffers: the searches' property tests sweep it around where contexts stop fitting.
fn room_beside_the_weights(cfg: &RunConfig, room_mib: usize) -> PlanTarget {
    let (w, _) = cfg.resident_bytes(STEP);
    let outside = h100(cfg, 0).outside.at_compute();
    h100(cfg, w + outside + (room_mib << 20))
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// The two prompts run at once answer as they did one after the other, errors included,
    /// around where the context stops fitting (the free memory a little above or below what
    /// the start-up buffers and what lies outside them take).
    #[test]
    fn two_prompts_at_once_answer_as_one_after_the_other(
        profile in proptest::sample::select(vec![None, Some(Profile::IkLlama), Some(Profile::LlamaB8833), Some(Profile::Llama)]),
        kind in proptest::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm]),
        purge in proptest::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
        ubatch in proptest::sample::select(vec![64usize, 256, 512]),
        steps in 1usize..80,
        floor in proptest::prelude::any::<bool>(),
        room_mib in 0usize..600,
    ) {
        let cfg = two_layers(profile, kind, purge, ubatch);
        let n_ctx = steps * STEP;
        let compute = match floor {
            true => cfg.compute_floor_bytes(n_ctx),
            false => cfg.compute_buffer_bytes(n_ctx),
        };
        let (w, kv) = cfg.resident_bytes(n_ctx);
        let outside = h100(&cfg, 0).outside.at_compute();
        let t = h100(&cfg, w + kv + compute + outside + (room_mib << 20));
        let at_once = fits_beside(&cfg, &t, n_ctx, compute, &mut LayerBytes::new(&cfg), None)
            .map(|slack| slack.is_some())
            .map_err(|e| e.to_string());
        let in_turn = fits_one_after_the_other(&cfg, &t, n_ctx, compute).map_err(|e| e.to_string());
        proptest::prop_assert_eq!(at_once, in_turn);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// A search that only needs to beat a context answers what the whole search does, where
    /// that is above it, and nothing otherwise: the advice's other settings lose nothing by
    /// stopping early. One that also starts one step above the context answers the same,
    /// errors included; where fitting is not monotone the two may meet different boundaries,
    /// each of which must fit with its next step failing.
    #[test]
    fn a_search_above_a_context_answers_as_the_whole_one(
        profile in proptest::sample::select(vec![None, Some(Profile::IkLlama), Some(Profile::LlamaB8833), Some(Profile::Llama)]),
        kind in proptest::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm]),
        purge in proptest::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
        ubatch in proptest::sample::select(vec![64usize, 256, 512]),
        room_mib in 0usize..1500,
        // Where the context to beat lies from the whole search's answer, in steps.
        around in proptest::prop_oneof![-2isize..2, -40isize..40],
    ) {
        let cfg = two_layers(profile, kind, purge, ubatch);
        let t = room_beside_the_weights(&cfg, room_mib);
        let whole = max_ctx_that_fits(&cfg, &t).map_err(|e| e.to_string());
        let answer = whole.clone().ok().flatten().unwrap_or(0) as isize;
        let above = (answer + around * STEP as isize).max(0) as usize;
        let beyond = max_ctx_above(&cfg, &t, 0, &|| above).map_err(|e| e.to_string());
        let expected = whole.map(|m| m.filter(|&m| m > above));
        proptest::prop_assert_eq!(&beyond, &expected);
        let started = max_ctx_above(&cfg, &t, above, &|| above).map_err(|e| e.to_string());
        match (&started, &expected) {
            (Ok(a), Ok(b)) if a != b => {
                for &m in [a, b].into_iter().flatten() {
                    proptest::prop_assert!(fits(&cfg, &t, m).unwrap(), "{m} fits");
                    proptest::prop_assert!(!fits(&cfg, &t, m + STEP).unwrap(), "{} fails", m + STEP);
                }
                let top = a.unwrap_or(0).max(b.unwrap_or(0)).max(above + STEP);
                let fails_below = (1..top / STEP).any(|k| !fits(&cfg, &t, k * STEP).unwrap());
                proptest::prop_assert!(fails_below, "{a:?} and {b:?} differ where fitting is monotone");
            }
            _ => proptest::prop_assert_eq!(started, expected),
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// The search that predicts its probes from the slack answers what the bisection answers,
    /// errors included, for every pool and purge policy it predicts for (the others bisect).
    /// Where fitting is not monotone (an ik_llama.cpp VMM pool with 446 MiB of room fits
    /// 12,288 and 12,800 positions but not 12,544) the two may meet different boundaries: each
    /// answer must then fit with its next step failing.
    #[test]
    fn predicted_probes_answer_as_the_bisection(
        profile in proptest::sample::select(vec![None, Some(Profile::IkLlama), Some(Profile::LlamaB8833), Some(Profile::Llama)]),
        kind in proptest::sample::select(vec![PoolKind::Legacy, PoolKind::Vmm]),
        purge in proptest::sample::select(vec![PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always]),
        ubatch in proptest::sample::select(vec![64usize, 256, 512]),
        room_mib in 0usize..1500,
    ) {
        let cfg = two_layers(profile, kind, purge, ubatch);
        let t = room_beside_the_weights(&cfg, room_mib);
        let bisected = search_with(&cfg, &t, (0, &|| 0), false, Made::default()).map_err(|e| e.to_string());
        let predicted =
            search_with(&cfg, &t, (0, &|| 0), predicts(&cfg, &t), Made::default()).map_err(|e| e.to_string());
        match (&predicted, &bisected) {
            (Ok(Some(p)), Ok(Some(b))) if p != b => {
                // Fitting is not monotone here (a context fails below one that fits: the
                // searches met different boundaries). Both answers must be boundaries.
                for &a in [p, b] {
                    proptest::prop_assert!(fits(&cfg, &t, a).unwrap(), "{a} fits");
                    proptest::prop_assert!(!fits(&cfg, &t, a + STEP).unwrap(), "{} fails", a + STEP);
                }
                let fails_below = (1..*p.max(b) / STEP)
                    .any(|k| !fits(&cfg, &t, k * STEP).unwrap());
                proptest::prop_assert!(fails_below, "{p} and {b} differ where fitting is monotone");
            }
            _ => proptest::prop_assert_eq!(predicted, bisected),
        }
    }
}

/// A pool that makes memory ahead on a worker thread (`CUPOOL_VMM_AHEAD=worker`, which `plan`
/// reads from the environment) is planned as with the pages made at once: the same answer every
/// time, and the same as `inline`'s. (Before, the worker's timing moved the dry runs'
/// placements: one configuration answered 28,672 and 29,184 positions in turn.)
#[test]
fn a_worker_making_memory_ahead_plans_as_inline() {
    use cupool_pool::upstream::vmm::Ahead;
    for profile in [None, Some(Profile::IkLlama)] {
        for purge in [PurgePolicy::Never, PurgePolicy::Auto, PurgePolicy::Always] {
            for room_mib in [250, 300, 337, 400, 500, 700, 900] {
                let answer = |ahead: Ahead| {
                    let mut cfg = two_layers(profile, PoolKind::Vmm, purge, 256);
                    cfg.pool.vmm.recycle = true;
                    cfg.pool.vmm.lanes = true;
                    cfg.pool.vmm.ahead = ahead;
                    let t = room_beside_the_weights(&cfg, room_mib);
                    max_ctx_that_fits(&cfg, &t).unwrap()
                };
                let inline = answer(Ahead::Inline);
                for _ in 0..3 {
                    assert_eq!(
                        answer(Ahead::Worker),
                        inline,
                        "{profile:?} {purge:?} {room_mib} MiB"
                    );
                }
            }
        }
    }
}
