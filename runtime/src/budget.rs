//! The reserved compute budget and its warning: after each ubatch, compute buffer plus the
//! pool's high-water is compared with what was reserved at startup; crossing it warns once
//! (until the run drops back under), with the token where the run dies: the rest of the prefill
//! simulated under the run's pool and purge policy (the first crossing's projection is kept as
//! the run report's `projected_oom_at_token`). A linear extrapolation of the reserve's growth is
//! wrong exactly where it matters: a legacy pool strands buffers in steps, a purging one does not
//! grow at all.

/// See the module docs.
pub(crate) struct Budget {
    /// The reserved budget: compute buffer plus margin or planned pool peak.
    pub bytes: usize,
    compute: usize,
    over: bool,
    /// Warnings emitted.
    pub warnings: usize,
    /// The first crossing's projection: the token where the run dies, if it does.
    pub projection: Option<Projection>,
    /// Where a prefill of so many tokens ends, simulated (the runtime hands it the planner's
    /// projection; dry runs have no budget to cross and none).
    project: Option<Projector>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("bytes", &self.bytes)
            .field("compute", &self.compute)
            .field("warnings", &self.warnings)
            .field("projection", &self.projection)
            .finish_non_exhaustive()
    }
}

/// Where a prefill of `n` tokens ends, from the device as the pool found it.
pub(crate) type Projector = Box<dyn Fn(usize) -> Projection + Send>;

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
            project: None,
        }
    }

    /// Hands the budget the projection it reports on a crossing.
    pub fn project_with(&mut self, project: Projector) {
        self.project = Some(project);
    }

    /// Checks the ubatch that ended at token `pos` of a prefill of `total` tokens with the
    /// pool's reserve peaking at `reserved`; on a new crossing projects where the run dies and
    /// warns. Returns whether it is over the budget.
    pub fn check(
        &mut self,
        index: usize,
        (pos, total): (usize, usize),
        reserved: usize,
        device_free: usize,
    ) -> bool {
        let high_water = self.compute + reserved;
        let over = high_water > self.bytes;
        if over && !self.over {
            self.warnings += 1;
            let project = || match &self.project {
                Some(p) => p(total),
                None => Projection::Unknown("no projection was set up".into()),
            };
            let projection = match &self.projection {
                Some(p) => p.clone(),
                None => {
                    let p = project();
                    self.projection = Some(p.clone());
                    p
                }
            };
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
