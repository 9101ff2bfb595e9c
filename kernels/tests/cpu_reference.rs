//! The CPU flash attention against a naive attention in f64, on random shapes.
use cupool_kernels::cpu::{self, FaParams};
use half::f16;
use proptest::prelude::*;

fn naive(p: &FaParams, q: &[f32], k: &[f16], v: &[f16]) -> Vec<f64> {
    let mut out = vec![0f64; p.n_tokens * p.n_head * p.d_v];
    for t in 0..p.n_tokens {
        for h in 0..p.n_head {
            let hk = h / (p.n_head / p.n_head_kv);
            let visible = (p.pos0 + t + 1).min(p.n_kv);
            let scores: Vec<f64> = (0..visible)
                .map(|pos| {
                    (0..p.d_k)
                        .map(|d| {
                            q[(t * p.n_head + h) * p.d_k + d] as f64
                                * k[pos * p.k_row + hk * p.k_head + d].to_f64()
                        })
                        .sum::<f64>()
                        * p.scale as f64
                })
                .collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
            let sum: f64 = w.iter().sum();
            for d in 0..p.d_v {
                out[(t * p.n_head + h) * p.d_v + d] = (0..visible)
                    .map(|pos| w[pos] * v[pos * p.v_row + hk * p.v_head + d].to_f64())
                    .sum::<f64>()
                    / sum;
            }
        }
    }
    out
}

fn lcg(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    #[test]
    fn flash_attention_matches_naive_f64(
        n_tokens in 1usize..40, pos0 in 0usize..70, heads_kv in 1usize..3, group in 1usize..3,
        dims in prop::sample::select(vec![(32usize, 32usize, false), (64, 64, false), (96, 96, false), (64, 32, true)]),
        parallel_blocks in 1usize..4, seed in any::<u64>(),
    ) {
        let (d_k, d_v, v_is_k) = dims;
        let n_head = heads_kv * group;
        let n_kv = (pos0 + n_tokens).next_multiple_of(32);
        let k_row = heads_kv * d_k;
        let (v_row, v_head) = if v_is_k { (k_row, d_k) } else { (heads_kv * d_v, d_v) };
        let p = FaParams { n_tokens, n_head, n_head_kv: heads_kv, d_k, d_v, n_kv, pos0, k_row, k_head: d_k, v_row, v_head, scale: 1.0 / (d_k as f32).sqrt(), parallel_blocks };
        let q = lcg(seed, n_tokens * n_head * d_k);
        let k: Vec<f16> = lcg(seed ^ 1, n_kv * k_row).into_iter().map(f16::from_f32).collect();
        let v: Vec<f16> = if v_is_k { k.clone() } else { lcg(seed ^ 2, n_kv * v_row).into_iter().map(f16::from_f32).collect() };
        let rows = n_tokens * n_head;
        let mut dst = vec![f32::NAN; rows * d_v];
        let mut tmp = vec![f32::NAN; parallel_blocks * rows * d_v];
        let mut meta = vec![[f32::NAN; 2]; parallel_blocks * rows];
        cpu::flash_attn(&p, &q, &k, &v, &mut dst, &mut tmp, &mut meta);
        let want = naive(&p, &q, &k, &v);
        for (i, (&got, &w)) in dst.iter().zip(&want).enumerate() {
            prop_assert!(got.is_finite(), "NaN at {i}");
            prop_assert!((got as f64 - w).abs() <= 1e-4 + 1e-4 * w.abs(), "at {i}: {got} vs {w}");
        }
    }
}

#[test]
fn q8_0_round_trip_is_within_half_a_step() {
    let x = lcg(7, 32 * 64);
    let mut q = vec![0u8; 64 * 34];
    cpu::quantize_q8_0(&x, &mut q);
    let mut back = vec![f16::ZERO; x.len()];
    cpu::dequantize_q8_0(&q, &mut back);
    for (blk, (xs, bs)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let step = amax / 127.0;
        for (a, b) in xs.iter().zip(bs) {
            assert!(
                (a - b.to_f32()).abs() <= step * 0.5 + amax * 2e-3,
                "block {blk}: {a} vs {b}"
            );
        }
    }
}
