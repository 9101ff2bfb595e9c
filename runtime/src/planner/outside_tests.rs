//! The terms outside the pool against what the engines' runs measured.

use super::*;

fn mib(b: usize) -> usize {
    b / MIB
}

#[test]
fn the_terms_add_up_to_what_mainline_s_computes_took() {
    let phi = EngineModel::preset("phi3-mini").unwrap();
    let llama = EngineModel::preset("llama3-8b").unwrap();
    let e = EngineKind::Profile {
        profile: Profile::Llama,
        cc: 900,
    };
    let f16 = Outside::of(e, Some(&phi), Weights::F16, 900);
    let q8 = Outside::of(e, Some(&llama), Weights::Q8_0, 900);
    let computes = |o: &Outside| mib(o.at_compute() - o.cuda_context);
    assert_eq!((computes(&f16), computes(&q8)), (164, 66));
    // The hold covers what the first compute takes, for either type.
    assert_eq!(mib(f16.shim_hold), 176);
    assert!(f16.shim_hold >= f16.at_compute() - f16.cuda_context);
    // Before compute capability 9.0, cuBLAS's workspace is 4 MiB.
    let old = Outside::of(e, Some(&phi), Weights::F16, 860);
    assert_eq!(mib(old.cublas_workspace), 4);
    assert_eq!(mib(old.shim_hold), 148);
}

#[test]
fn cublas_is_counted_where_the_engine_calls_it() {
    for profile in Profile::ALL {
        let e = EngineKind::Profile { profile, cc: 900 };
        for name in EngineModel::PRESETS {
            let m = EngineModel::preset(name).unwrap();
            let calls = m.moe.is_some() || m.mla.is_some();
            let q8 = Outside::of(e, Some(&m), Weights::Q8_0, 900);
            assert_eq!(q8.cublas_workspace > 0, calls, "{name} {profile:?}");
            let f16 = Outside::of(e, Some(&m), Weights::F16, 900);
            assert!(f16.cublas_workspace > 0);
            assert_eq!(f16.shim_hold > 0, profile == Profile::Llama);
            assert_eq!(f16.output_buffer, 0);
        }
    }
    let own = Outside::of(EngineKind::Cupool, None, Weights::F16, 900);
    assert_eq!((own.cublas_workspace, own.shim_hold), (0, 0));
    assert_eq!(Outside::NONE.at_compute() + Outside::NONE.at_startup(), 0);
}

#[test]
fn ik_llama_s_warm_up_graph_workspace_is_taken_and_given_back() {
    let ik = EngineKind::Profile {
        profile: Profile::IkLlama,
        cc: 900,
    };
    let phi = EngineModel::preset("phi3-mini").unwrap();
    let llama = EngineModel::preset("llama3-8b").unwrap();
    let f16 = Outside::of(ik, Some(&phi), Weights::F16, 900).after_warm_up(ik, true);
    // The first compute takes what the runs measured, 160 MiB, with a 4 MiB margin.
    assert_eq!(mib(f16.at_compute() - f16.cuda_context), 164);
    assert_eq!(mib(f16.given_back), 32);
    // The pool's room has it; the first compute needs it all the same.
    let free = 1000 * MIB;
    assert_eq!(f16.room(free, 0), Some(free - f16.at_compute() + 32 * MIB));
    assert_eq!(f16.room(f16.at_compute() - 1, 0), None);
    // What lies outside beside a pool that took its room and some of what came back; none
    // came back where the run stopped before its pool asked for anything.
    let room = f16.room(free, 0).unwrap();
    let pool = room - 32 * MIB + 10 * MIB;
    assert_eq!(
        f16.held_beside(pool, Some(room)),
        f16.at_compute() - 10 * MIB
    );
    assert_eq!(
        f16.held_beside(room, Some(room)),
        f16.at_compute() - 32 * MIB
    );
    assert_eq!(
        f16.held_beside(room - 32 * MIB, Some(room)),
        f16.at_compute()
    );
    assert_eq!(f16.held_beside(0, None), f16.at_compute());
    // No cuBLAS, no warm-up or another engine: nothing given back.
    let q8 = Outside::of(ik, Some(&llama), Weights::Q8_0, 900).after_warm_up(ik, true);
    assert_eq!(
        (q8.given_back, mib(q8.at_compute() - q8.cuda_context)),
        (0, 66)
    );
    let cold = Outside::of(ik, Some(&phi), Weights::F16, 900).after_warm_up(ik, false);
    assert_eq!(cold.given_back, 0);
    assert_eq!(cold.room(free, 0), f16.room(free, 0));
    let main = EngineKind::Profile {
        profile: Profile::Llama,
        cc: 900,
    };
    let m = Outside::of(main, Some(&phi), Weights::F16, 900).after_warm_up(main, true);
    assert_eq!(m.given_back, 0);
}

#[test]
fn ik_llama_makes_nccl_communicators_on_more_than_one_gpu() {
    let phi = EngineModel::preset("phi3-mini").unwrap();
    let ik = EngineKind::Profile {
        profile: Profile::IkLlama,
        cc: 900,
    };
    let one = Outside::of(ik, Some(&phi), Weights::F16, 900);
    assert_eq!(one.nccl_communicators, 0, "Outside::of plans one GPU");
    assert_eq!(one.on_gpus(ik, 0, 1), one);
    // Two GPUs: the main communicator on each, counted from start-up on.
    for device in 0..2 {
        let two = one.on_gpus(ik, device, 2);
        assert_eq!(mib(two.nccl_communicators), 394);
        assert_eq!(two.at_startup() - one.at_startup(), 394 * MIB);
        assert_eq!(two.at_compute() - one.at_compute(), 394 * MIB);
    }
    // The free-memory lines of the two-GPU runs (before and after ggml_cuda_init, MiB): the
    // term lies inside what each device lost.
    for (before, after) in [(80_552.2, 80_158.0), (7_156.6, 6_762.0)] {
        let lost = (before - after - 1.0 - 0.05, before - after + 0.05);
        let term = NCCL_COMMUNICATOR_BYTES as f64 / MIB as f64;
        assert!(lost.0 < term && term <= lost.1, "{lost:?} against {term}");
    }
    // Three and four GPUs add pair communicators; mainline and cupool make none.
    let counts = |n: usize| {
        (0..n)
            .map(|d| ik_nccl_communicators(d, n))
            .collect::<Vec<_>>()
    };
    assert_eq!(counts(3), [3, 2, 2]);
    assert_eq!(counts(4), [3, 3, 3, 3]);
    assert_eq!(counts(8), [1; 8]);
    assert_eq!(ik_nccl_communicators(2, 2), 0, "not a visible GPU");
    for profile in [Profile::Llama, Profile::LlamaB8833] {
        let e = EngineKind::Profile { profile, cc: 900 };
        let o = Outside::of(e, Some(&phi), Weights::F16, 900).on_gpus(e, 1, 2);
        assert_eq!(o.nccl_communicators, 0, "{profile:?}");
    }
    let own = Outside::of(EngineKind::Cupool, None, Weights::F16, 900);
    assert_eq!(own.on_gpus(EngineKind::Cupool, 1, 2).nccl_communicators, 0);
}

#[test]
fn a_plan_counts_the_given_back_memory_only_where_its_pool_took_it() {
    use crate::planner::test_setup::two_layers;
    use crate::planner::{plan_only, PlanTarget, Stop, GPU_MALLOC_PAGE};
    use crate::policy::PurgePolicy;
    use cupool_pool::PoolKind;
    let mut cfg = two_layers(
        Some(Profile::IkLlama),
        PoolKind::Legacy,
        PurgePolicy::Never,
        512,
    );
    cfg.weight_type = Weights::F16;
    let outside =
        Outside::of(cfg.engine, None, cfg.weight_type, 900).after_warm_up(cfg.engine, true);
    assert_eq!(mib(outside.given_back), 32);
    let (w, kv, c) = cfg.startup_bytes(cfg.n_ctx);
    let page = |b: usize| b.next_multiple_of(GPU_MALLOC_PAGE);
    let buffers = page(w) + page(kv) + page(c);
    let card = |free: usize| PlanTarget {
        free_bytes: free,
        vmm: true,
        granularity: 2 << 20,
        malloc_page: GPU_MALLOC_PAGE,
        outside,
    };
    // The first compute does not fit: nothing came back, the peak is all it needed.
    let short = buffers + outside.at_compute() - MIB;
    let p = plan_only(&cfg, &card(short), 2048).unwrap();
    assert_eq!(p.stop, Some(Stop::FirstCompute));
    // Each buffer in whole pages: what the device loses to it.
    assert_eq!(p.peak_device_bytes, buffers + outside.at_compute());
    assert_eq!(p.page_rounding_bytes, buffers - (w + kv + c));
    // A card the pool never fills: the peak holds every term, the pool's driver allocations
    // in whole pages too (the legacy pool's every `cudaMalloc` takes whole 2 MiB pages).
    let p = plan_only(&cfg, &card(64 << 30), 2048).unwrap();
    assert!(p.fits);
    let pool_pages = p.pool_peak_reserved_bytes + p.page_rounding_bytes - (buffers - (w + kv + c));
    assert!(pool_pages > p.pool_peak_reserved_bytes, "{p:?}");
    assert_eq!(pool_pages % GPU_MALLOC_PAGE, 0, "{p:?}");
    let all = buffers + outside.at_compute() + pool_pages;
    assert_eq!(p.peak_device_bytes, all);
    // A card whose room the pool outgrows into the given-back memory: the peak is at most the
    // free memory less the page the driver keeps (here exactly: the pool's pages fill it).
    let tight = buffers + outside.at_compute() + GPU_MALLOC_PAGE + pool_pages - 16 * MIB;
    let q = plan_only(&cfg, &card(tight), 2048).unwrap();
    assert!(q.fits, "{q:?}");
    assert_eq!(q.peak_device_bytes, all - 16 * MIB);
    assert_eq!(q.peak_device_bytes, tight - GPU_MALLOC_PAGE);
}
