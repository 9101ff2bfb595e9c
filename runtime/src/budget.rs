//! The reserved compute budget and its warning: after each ubatch, compute buffer plus the
//! pool's high-water is compared with what was reserved at startup; crossing it warns once
//! (until the run drops back under), with the token where the run dies: the rest of the prefill
//! simulated under the run's pool and purge policy (the first crossing's projection is kept for
//! the report). A linear extrapolation of the reserve's growth is wrong exactly where it
//! matters: a legacy pool strands buffers in steps, a purging one does not grow at all.

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Budget {
    /// The reserved budget: compute buffer plus margin or planned pool peak.
    pub bytes: usize,
    compute: usize,
    over: bool,
    /// Warnings emitted.
    pub warnings: usize,
    /// The first crossing's projection: the token where the run dies, if it does.
    pub projection: Option<Projection>,
}

/// Where a run that crossed its budget ends, by simulation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Projection {
    /// It runs out of memory after this many tokens.
    DiesAt(usize),
    /// The rest of the prefill fits.
    Completes,
    /// The simulation failed (the reason).
    Unknown(String),
}

impl Budget {
    pub fn new(bytes: usize, compute: usize) -> Self {
        Self {
            bytes,
            compute,
            over: false,
            warnings: 0,
            projection: None,
        }
    }

    /// Checks the ubatch that ended at token `pos` with the pool's reserve peaking at
    /// `reserved`; on a new crossing asks `project` where the run dies and warns. Returns
    /// whether it is over the budget.
    pub fn check(
        &mut self,
        index: usize,
        pos: usize,
        reserved: usize,
        device_free: usize,
        project: impl FnOnce() -> Projection,
    ) -> bool {
        let high_water = self.compute + reserved;
        let over = high_water > self.bytes;
        if over && !self.over {
            self.warnings += 1;
            let projection = self.projection.get_or_insert_with(project).clone();
            self.warn(index, pos, high_water, reserved, device_free, &projection);
        }
        self.over = over;
        over
    }

    fn warn(
        &self,
        index: usize,
        pos: usize,
        high_water: usize,
        reserved: usize,
        device_free: usize,
        projection: &Projection,
    ) {
        let overshoot = high_water - self.bytes;
        let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
        let (dies_at, outcome) = match projection {
            Projection::DiesAt(t) => (Some(*t), format!("the run dies at token {t}")),
            Projection::Completes => (None, "the rest of the prefill still fits".to_string()),
            Projection::Unknown(why) => (None, format!("where the run ends is unknown ({why})")),
        };
        tracing::warn!(
            ubatch = index,
            tokens = pos,
            compute_buffer = self.compute,
            pool_reserved = reserved,
            budget = self.bytes,
            overshoot,
            device_free,
            projected_oom_at_token = dies_at,
            "compute budget exceeded: compute buffer {:.1} MiB + pool {:.1} MiB > reserved {:.1} MiB (over by {:.1} MiB); simulated under this pool and purge policy, {outcome}",
            mib(self.compute),
            mib(reserved),
            mib(self.bytes),
            mib(overshoot),
        );
    }
}
