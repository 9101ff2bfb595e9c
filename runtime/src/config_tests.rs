use super::*;
use crate::model::ModelShape;
use cupool_profiles::Profile;

/// Llama-3-8B's shape with `profile`'s engine (or cupool's own), ubatch `ub`, batch 2048.
fn cfg(profile: Option<Profile>, ub: usize) -> RunConfig {
    let mut c = RunConfig::new(ModelShape::preset("llama3-8b").unwrap(), 4096);
    if let Some(profile) = profile {
        c.engine = EngineKind::Profile { profile, cc: 900 };
    }
    c.n_ubatch = ub;
    c.n_batch = 2048;
    c
}

#[test]
fn an_engine_s_compute_buffer_for_a_context_below_the_ubatch_is_the_context_s() {
    for profile in [Profile::Llama, Profile::IkLlama] {
        let wide = cfg(Some(profile), 512);
        let narrow = cfg(Some(profile), 256);
        // llama.cpp runs a 256-position context with batches of at most 256 tokens.
        assert_eq!(
            wide.compute_buffer_bytes(256),
            narrow.compute_buffer_bytes(256),
            "{profile:?}"
        );
        assert!(wide.compute_buffer_bytes(512) > narrow.compute_buffer_bytes(512));
        // The search's bound grows with the context through the clamp, and stays a bound.
        let mut last = 0;
        for ctx in (32..=1024).step_by(32) {
            let floor = wide.compute_floor_bytes(ctx);
            assert!(floor >= last, "{profile:?} at {ctx}: {floor} < {last}");
            assert!(
                floor <= wide.compute_buffer_bytes(ctx),
                "{profile:?} at {ctx}"
            );
            last = floor;
        }
    }
    // ik_llama.cpp pads the context to 256 positions before it clamps: 300 runs as 512 (no
    // clamp at a 512 ubatch), 100 as 256; mainline clamps 300 itself.
    let ik = |ub| cfg(Some(Profile::IkLlama), ub);
    assert_eq!(
        ik(512).compute_buffer_bytes(300),
        ik(512).compute_buffer_bytes(512)
    );
    assert_eq!(
        ik(512).compute_buffer_bytes(100),
        ik(256).compute_buffer_bytes(256)
    );
    let llama = |ub| cfg(Some(Profile::Llama), ub);
    assert_eq!(
        llama(512).compute_buffer_bytes(300),
        llama(300).compute_buffer_bytes(300)
    );
    // A clamped configuration stays as it is.
    let c = ik(512).clamped_to(100).unwrap();
    assert!(c.clamped_to(100).is_none() && c.n_ubatch == 256 && c.n_batch == 256);
    // cupool's own engine reserves for its ubatch whatever the context.
    let own = cfg(None, 512);
    assert!(own.compute_buffer_bytes(256) > cfg(None, 256).compute_buffer_bytes(256));
}
