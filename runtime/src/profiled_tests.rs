//! The engine profiles' layers as the dry runs take them: a kind of layer asks the same in
//! every layer of it, and a refusal does not depend on the KV length.

use super::*;
use crate::model::ModelShape;
use cupool_profiles::Weights;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Layers of one kind make the same requests, in every profile and preset, for any
    /// ubatch: a dry run asks the profile once per kind, and skips the layers that repeat.
    #[test]
    fn layers_of_one_kind_ask_the_same(
        profile in prop::sample::select(Profile::ALL.to_vec()),
        model in prop::sample::select(vec!["phi3-mini", "llama3-8b", "qwen3-30b-a3b", "deepseek-v3"]),
        n_layer in 1usize..8,
        n_tokens in 1usize..1024,
        kv_past in 0usize..100_000,
        n_outputs in 0usize..2,
        a in any::<usize>(),
        b in any::<usize>(),
    ) {
        let mut shape = ModelShape::preset(model).unwrap();
        shape.n_layer = n_layer;
        let mut cfg = RunConfig::new(shape, 1 << 20);
        cfg.engine = EngineKind::Profile { profile, cc: 900 };
        cfg.weight_type = Weights::Q8_0;
        let (profile, s) = setup(&cfg).unwrap().unwrap();
        let n_kv = cupool_kernels::fa::n_kv(kv_past + n_tokens, cfg.n_ctx);
        let u = UbatchShape { n_tokens, n_kv, n_outputs: n_outputs.min(n_tokens) };
        let (a, b) = (a % n_layer, b % n_layer);
        let m = &s.model;
        if layer_kind(m, a) == layer_kind(m, b) {
            let (x, y) = (profile.layer(&s, u, a), profile.layer(&s, u, b));
            prop_assert_eq!(x, y, "layers {} and {}", a, b);
        }
    }

    /// Whether a profile refuses a ubatch does not depend on its KV length (at least its
    /// tokens) nor on the layer: what [`refuses_no_ubatch`] rests on.
    #[test]
    fn a_refusal_does_not_depend_on_the_kv_length(
        profile in prop::sample::select(Profile::ALL.to_vec()),
        model in prop::sample::select(vec!["phi3-mini", "llama3-8b", "qwen3-30b-a3b", "deepseek-v3"]),
        weights in prop::sample::select(vec![Weights::F16, Weights::Q8_0]),
        kv in prop::sample::select(vec![cupool_kernels::KvType::Q8_0, cupool_kernels::KvType::F16]),
        no_gqa in any::<bool>(),
        n_layer in 1usize..8,
        n_tokens in 1usize..5000,
        n_outputs in 0usize..2,
        kv_a in 0usize..1_000_000,
        kv_b in 0usize..1_000_000,
        l in any::<usize>(),
    ) {
        let mut shape = ModelShape::preset(model).unwrap();
        shape.n_layer = n_layer;
        if no_gqa {
            shape.n_head_kv = shape.n_head;
        }
        let mut cfg = RunConfig::new(shape, 1 << 22);
        cfg.engine = EngineKind::Profile { profile, cc: 900 };
        cfg.weight_type = weights;
        cfg.kv_type = kv;
        let Ok(Some((profile, s))) = setup(&cfg) else {
            return Ok(());
        };
        let n_outputs = n_outputs.min(n_tokens);
        let u = |n_kv| UbatchShape { n_tokens, n_kv, n_outputs };
        let first = profile.layer(&s, u(n_tokens), 0).is_ok();
        prop_assert_eq!(profile.layer(&s, u(n_tokens + kv_a), l % n_layer).is_ok(), first);
        prop_assert_eq!(profile.layer(&s, u(n_tokens + kv_b), 0).is_ok(), first);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// What a layer holds, its part around the attention kept across the ubatches asked, is
    /// the most its ops hold at once and the count of its requests, or a refusal where the
    /// layer is refused.
    #[test]
    fn a_layer_s_bytes_are_its_requests(
        profile in prop::sample::select(Profile::ALL.to_vec()),
        model in prop::sample::select(vec!["phi3-mini", "llama3-8b", "qwen3-30b-a3b", "deepseek-v3"]),
        weights in prop::sample::select(vec![Weights::F16, Weights::Q8_0]),
        asked in prop::collection::vec((1usize..600, 0usize..200_000), 1..40),
    ) {
        let mut shape = ModelShape::preset(model).unwrap();
        shape.n_layer = 3;
        let mut cfg = RunConfig::new(shape, 1 << 20);
        cfg.engine = EngineKind::Profile { profile, cc: 900 };
        cfg.weight_type = weights;
        let mut bytes = LayerBytes::new(&cfg);
        for (n_tokens, kv_past) in asked {
            let n_kv = n_tokens + kv_past;
            let want = setup(&cfg).ok().flatten().and_then(|(profile, s)| {
                let u = UbatchShape { n_tokens, n_kv, n_outputs: 0 };
                let calls = profile.layer(&s, u, 0).ok()?;
                Some(LayerHeld {
                    most: calls.iter().map(|c| c.high_water(256)).max().unwrap_or(0),
                    requests: calls.iter().map(|c| c.request_count()).sum(),
                })
            });
            prop_assert_eq!(bytes.of(n_tokens, n_kv), want.map(Some));
        }
    }

    /// What a dry run keeps across ubatches changes no answer: the attention and the keep list
    /// of each ubatch asked, some asked again, are the profile's own.
    #[test]
    fn what_a_dry_run_keeps_answers_as_the_profile(
        profile in prop::sample::select(Profile::ALL.to_vec()),
        model in prop::sample::select(vec!["phi3-mini", "llama3-8b", "qwen3-30b-a3b", "deepseek-v3"]),
        asked in prop::collection::vec((1usize..600, 0usize..200_000, 0usize..2), 1..40),
    ) {
        let mut shape = ModelShape::preset(model).unwrap();
        shape.n_layer = 4;
        let mut cfg = RunConfig::new(shape, 1 << 20);
        cfg.engine = EngineKind::Profile { profile, cc: 900 };
        cfg.weight_type = Weights::Q8_0;
        let (profile, s) = setup(&cfg).unwrap().unwrap();
        let mut around = Around::default();
        // Each shape asked twice in a row, then again later: the kept answers are used.
        let shapes = asked.iter().chain(asked.iter().rev()).flat_map(|&a| [a, a]);
        for (n_tokens, kv_past, n_outputs) in shapes {
            let u = UbatchShape { n_tokens, n_kv: n_tokens + kv_past, n_outputs };
            let kept = keep(u, (profile, s.clone()), Some(&mut around)).map_err(|e| e.to_string());
            let want = keep(u, (profile, s.clone()), None).map_err(|e| e.to_string());
            prop_assert_eq!(kept, want);
            let attention = around.attention(profile, &s, u).map(|a| a.to_vec());
            prop_assert_eq!(
                attention.map_err(|e| e.to_string()),
                profile.attention(&s, u).map_err(|e| e.to_string())
            );
        }
    }
}
