//! The reserved compute budget and its warning: after each ubatch, compute buffer plus the
//! pool's high-water is compared with what was reserved at startup; crossing it warns once
//! (until the run drops back under), with where the card runs out at the current growth.

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Budget {
    /// The reserved budget: compute buffer plus margin or planned pool peak.
    pub bytes: usize,
    compute: usize,
    over: bool,
    /// Warnings emitted.
    pub warnings: usize,
    prev_reserved: usize,
}

impl Budget {
    pub fn new(bytes: usize, compute: usize) -> Self {
        Self {
            bytes,
            compute,
            over: false,
            warnings: 0,
            prev_reserved: 0,
        }
    }

    /// Checks the ubatch that ended at token `pos` (`n_tokens` long) with the pool's reserve
    /// peaking at `reserved`; returns whether it went over the budget.
    pub fn check(
        &mut self,
        index: usize,
        pos: usize,
        n_tokens: usize,
        reserved: usize,
        device_free: usize,
    ) -> bool {
        let high_water = self.compute + reserved;
        let over = high_water > self.bytes;
        if over && !self.over {
            self.warnings += 1;
            self.warn(index, pos, n_tokens, high_water, reserved, device_free);
        }
        self.over = over;
        self.prev_reserved = reserved;
        over
    }

    fn warn(
        &self,
        index: usize,
        pos: usize,
        n_tokens: usize,
        high_water: usize,
        reserved: usize,
        device_free: usize,
    ) {
        let overshoot = high_water - self.bytes;
        // The reserve's growth per token: over this ubatch, or on average if it did not grow.
        let step = reserved.saturating_sub(self.prev_reserved) as f64 / n_tokens.max(1) as f64;
        let per_token = if step > 0.0 {
            step
        } else {
            reserved as f64 / pos.max(1) as f64
        };
        let runs_out_at =
            (per_token > 0.0).then(|| pos + (device_free as f64 / per_token) as usize);
        let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
        tracing::warn!(
            ubatch = index,
            tokens = pos,
            compute_buffer = self.compute,
            pool_reserved = reserved,
            budget = self.bytes,
            overshoot,
            device_free,
            runs_out_at_token = runs_out_at,
            "compute budget exceeded: compute buffer {:.1} MiB + pool {:.1} MiB > reserved {:.1} MiB (over by {:.1} MiB); at {:.1} KiB/token the card runs out at token {}",
            mib(self.compute),
            mib(reserved),
            mib(self.bytes),
            mib(overshoot),
            per_token / 1024.0,
            runs_out_at.map_or("never".to_string(), |t| t.to_string()),
        );
    }
}
