//! How long `--compute cpu` will take, said before it starts: the reference maths of a real
//! shape run for minutes to hours on a CPU, and nothing else would tell.

use cupool::kernels::cpu;
use cupool::runtime::ModelShape;
use half::f16;
use std::time::{Duration, Instant};

/// Floating-point operations of a prefill of `prompt` tokens: the projections and the FFN
/// (gate, up, down) of every layer, and attention over the KV length so far.
pub fn prefill_flops(m: &ModelShape, prompt: usize) -> f64 {
    let (e, f) = (m.n_embd as f64, m.n_ff as f64);
    let proj = e * (m.q_dim() + m.kv_dim_k() + m.kv_dim_v()) as f64 + m.out_dim() as f64 * e;
    let per_token = 2.0 * (proj + 3.0 * e * f);
    // Token t attends to t keys: prompt²/2 scores and as many value rows, per head.
    let heads = m.n_head as f64 * (m.head_dim_k + m.head_dim_v) as f64;
    let attention = 2.0 * heads * (prompt as f64).powi(2) / 2.0;
    m.n_layer as f64 * (prompt as f64 * per_token + attention)
}

/// The reference matmul's speed on this machine, in FLOP/s, measured for about 50 ms.
pub fn cpu_rate() -> f64 {
    let (m, n, k) = (16, 256, 256);
    let x = vec![0.5f32; m * k];
    let w = vec![f16::from_f32(0.25); k * n];
    let mut y = vec![0f32; m * n];
    let start = Instant::now();
    let mut runs = 0u32;
    while start.elapsed() < Duration::from_millis(50) || runs == 0 {
        cpu::matmul(&x, &w, &mut y, m, n, k, false);
        runs += 1;
    }
    std::hint::black_box(&y);
    2.0 * (m * n * k) as f64 * runs as f64 / start.elapsed().as_secs_f64()
}

/// A duration as a person reads it.
pub fn human(seconds: f64) -> String {
    match seconds {
        s if s < 1.0 => "under a second".into(),
        s if s < 90.0 => format!("about {s:.0} s"),
        s if s < 5400.0 => format!("about {:.0} minutes", s / 60.0),
        s => format!("about {:.1} hours", s / 3600.0),
    }
}

/// Above this many seconds of estimated CPU time in all, a `--compute cpu` run starts only
/// with `--yes`: ten minutes is past what anyone waits for by accident.
pub const CONFIRM_ABOVE_SECONDS: f64 = 600.0;

/// How long a `--compute cpu` run of `configs` configurations will take on this CPU.
pub struct Estimate {
    /// Floating-point operations of one configuration's prefill.
    pub flops: f64,
    /// The reference maths' speed here, in FLOP/s.
    pub rate: f64,
    /// Seconds per configuration, and in all.
    pub each: f64,
    pub total: f64,
}

impl Estimate {
    /// Measures this CPU (about 50 ms) and estimates the run.
    pub fn measure(m: &ModelShape, prompt: usize, configs: usize) -> Self {
        Self::at_rate(m, prompt, configs, cpu_rate())
    }

    /// The estimate at `rate` FLOP/s.
    pub fn at_rate(m: &ModelShape, prompt: usize, configs: usize, rate: f64) -> Self {
        let flops = prefill_flops(m, prompt);
        let each = flops / rate;
        Self {
            flops,
            rate,
            each,
            total: each * configs as f64,
        }
    }

    /// The note printed before the run starts.
    pub fn note(&self) -> String {
        format!(
            "note: --compute cpu runs the reference maths on this CPU: {} per configuration, {} in all ({:.3} TFLOP each at {:.1} GFLOP/s measured now); --compute dry-run measures the memory alone, at once",
            human(self.each),
            human(self.total),
            self.flops / 1e12,
            self.rate / 1e9
        )
    }

    /// Whether the run may start: at most [`CONFIRM_ABOVE_SECONDS`] in all, or confirmed by
    /// `--yes`; else what it would take and how to go on.
    pub fn allows(&self, yes: bool) -> Result<(), String> {
        if yes || self.total <= CONFIRM_ABOVE_SECONDS {
            return Ok(());
        }
        Err(format!(
            "--compute cpu would take {} in all ({} per configuration at {:.1} GFLOP/s measured now), over the {} that starts without asking: add --yes to start it anyway, or use --compute dry-run (the memory alone, at once), a smaller --prompt or shape, or one --pool",
            human(self.total),
            human(self.each),
            self.rate / 1e9,
            human(CONFIRM_ABOVE_SECONDS)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_grow_with_the_prompt_and_the_attention_quadratically() {
        let m = ModelShape::preset("phi3-mini").unwrap();
        let a = prefill_flops(&m, 1000);
        let b = prefill_flops(&m, 2000);
        assert!(b > 2.0 * a && b < 4.0 * a, "{a} {b}");
        // About twice the parameters per token: 3.8B parameters, 1000 tokens.
        assert!(a > 6e12 && a < 9e12, "{a}");
        assert_eq!(human(0.2), "under a second");
        assert_eq!(human(600.0), "about 10 minutes");
        assert_eq!(human(7200.0), "about 2.0 hours");
        assert!(cpu_rate() > 1e6);
    }

    #[test]
    fn a_run_over_ten_minutes_needs_yes() {
        let m = ModelShape::preset("phi3-mini").unwrap();
        // The rate that makes 1000 tokens take exactly the threshold, in all.
        let rate = prefill_flops(&m, 1000) / CONFIRM_ABOVE_SECONDS;
        let at = |prompt, configs| Estimate::at_rate(&m, prompt, configs, rate);
        assert!(at(1000, 1).allows(false).is_ok(), "at the threshold");
        assert!(at(999, 1).allows(false).is_ok());
        for (prompt, configs) in [(1001, 1), (600, 2), (20000, 6)] {
            let e = at(prompt, configs);
            let refused = e.allows(false).unwrap_err();
            assert!(
                refused.contains(&human(e.total)) && refused.contains("--yes"),
                "{refused}"
            );
            assert!(e.allows(true).is_ok());
        }
    }
}
