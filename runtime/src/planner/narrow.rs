//! Where the search for the largest context probes next. A probe is two dry runs of up to the
//! whole context, so the search's time is the number of probes; bisection takes one per
//! halving of the bracket (eleven from 512 Ki positions to 256). But a probe that fits says
//! more than "fits": by how much its pool's room exceeded its peak, its slack. The slack falls
//! almost linearly with the context (the KV cache and the compute buffer take room at a fixed
//! rate per position, the pool's scratch grows with the KV length), so two fitting probes
//! predict where it reaches zero, and the prediction is usually right to a step or two.
//!
//! The prediction only chooses where to probe: the bracket (a context that fits, one that does
//! not) shrinks as in a bisection. From the prediction the probes step towards the boundary by
//! 1, 2 and 4 steps, and bisect once it is bracketed, so a prediction a few steps off costs a
//! few probes, and one far off (a pool that grows in steps, a compute buffer that jumps, a pool
//! whose peak follows its room) a handful more than the bisection (the property test below
//! bounds it by five).
//! Where whether a context fits is monotone, any order of probes finds the one boundary, so the
//! answer is the bisection's. The probes depend only on earlier probes' results and the
//! search's fixed start, never on the context a search must beat meanwhile, so a search that
//! stops early has run a prefix of the whole one with the same start.

use std::collections::BTreeMap;

/// Which compute buffer a probe ran beside: its floor, or the context's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Beside {
    Floor,
    Exact,
}

/// The slack of every probe that fit, by kind and context.
#[derive(Debug, Default)]
pub(crate) struct Slacks {
    floor: BTreeMap<usize, usize>,
    exact: BTreeMap<usize, usize>,
    /// Bytes per position no slack falls slower than (the KV cache's: the room loses it, and
    /// the buffers and the pool's peak only grow), for a search with one fitting probe.
    least: Option<f64>,
}

impl Slacks {
    fn of(&self, kind: Beside) -> &BTreeMap<usize, usize> {
        match kind {
            Beside::Floor => &self.floor,
            Beside::Exact => &self.exact,
        }
    }

    /// Notes that a probe of `ctx` beside `kind` fit with `slack` bytes to spare.
    pub fn note(&mut self, kind: Beside, ctx: usize, slack: usize) {
        match kind {
            Beside::Floor => self.floor.insert(ctx, slack),
            Beside::Exact => self.exact.insert(ctx, slack),
        };
    }

    /// Sets the least loss of slack per position, the slope where no two probes show one.
    pub fn set_least(&mut self, bytes_per_position: f64) {
        self.least = (bytes_per_position > 0.0).then_some(bytes_per_position);
    }

    /// The slack a probe of `ctx` beside `kind` fit with, if it was probed and fit.
    pub fn at(&self, kind: Beside, ctx: usize) -> Option<usize> {
        self.of(kind).get(&ctx).copied()
    }

    /// The bytes of slack lost per position at or below `ctx`: from the two fitting probes of
    /// `kind` closest below it, else from the floor's (the same pool and the same KV cache, a
    /// buffer that grows alike), else the least loss (which predicts the boundary past where it
    /// is: the steps from there come back); `None` where none is known.
    fn slope(&self, kind: Beside, ctx: usize) -> Option<f64> {
        let from = |m: &BTreeMap<usize, usize>| {
            let mut below = m.range(..=ctx).rev();
            let ((&c1, &s1), (&c0, &s0)) = (below.next()?, below.next()?);
            (s0 > s1).then(|| (s0 - s1) as f64 / (c1 - c0) as f64)
        };
        from(self.of(kind))
            .or_else(|| from(&self.floor))
            .or(self.least)
    }

    /// Where the slack of probes beside `kind` is predicted to reach zero, from a probe of `lo`
    /// that fit: the largest context predicted to fit, in multiples of `step`.
    pub fn zero_from(&self, kind: Beside, lo: usize, step: usize) -> Option<usize> {
        let (slack, slope) = (self.at(kind, lo)?, self.slope(kind, lo)?);
        // The slope is at least a byte over the two probes' distance: the quotient is finite,
        // and past `usize` it saturates (the caller clamps it into its bracket).
        let positions = (slack as f64 / slope) as usize;
        Some(lo.saturating_add(positions / step * step))
    }

    /// The largest context at most `ctx`, in multiples of `step`, predicted to have at least
    /// `more` bytes of slack beside the floor (`ctx` itself where its known slack has them):
    /// where a context whose own buffer exceeds its floor by `more` is predicted to fit.
    pub fn covering(&self, ctx: usize, more: usize, step: usize) -> Option<usize> {
        let slack = self.at(Beside::Floor, ctx)?;
        if slack >= more {
            return Some(ctx);
        }
        let positions = (more - slack) as f64 / self.slope(Beside::Floor, ctx)?;
        let steps = (positions / step as f64).ceil();
        (steps.is_finite() && steps * (step as f64) < ctx as f64)
            .then(|| ctx - steps as usize * step)
    }
}

/// The longest step from a prediction, in the search's steps: predictions within 7 steps of
/// the boundary are found by steps of 1, 2 and 4.
const GALLOP: usize = 4;

/// A bracket being narrowed: `lo` fits, `fail` does not, both multiples of the step.
#[derive(Debug)]
pub(crate) struct Bracket {
    pub lo: usize,
    pub fail: usize,
    mode: Mode,
    /// Whether the steps from the prediction ran out before they bracketed the boundary.
    missed: bool,
}

/// How the next probe is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// At the prediction, where there is one, else the midpoint.
    Predict,
    /// The last probe was at the prediction.
    Predicted,
    /// Upwards from `lo` by this many positions: the prediction and the probes after it fit.
    Up(usize),
    /// Downwards from `fail` by this many: the prediction and the probes after it failed.
    Down(usize),
    /// At the midpoint: the boundary is bracketed, or the prediction was far off.
    Bisect,
}

impl Bracket {
    pub fn new(lo: usize, fail: usize) -> Self {
        Self {
            lo,
            fail,
            mode: Mode::Predict,
            missed: false,
        }
    }

    /// The next context to probe, strictly inside the bracket (which must be wider than one
    /// step). First the prediction; from there steps of 1, 2 and 4 towards the boundary (a
    /// prediction a few steps off costs a few probes); the midpoint once the boundary is
    /// bracketed, a step would pass the midpoint, or the steps run out.
    pub fn next(&mut self, predicted: Option<usize>, step: usize) -> usize {
        debug_assert!(
            self.fail >= self.lo + 2 * step && self.lo % step == 0 && self.fail % step == 0,
            "a bracket to narrow: {self:?} by {step}"
        );
        let mid = (self.lo + self.fail) / 2 / step * step;
        let half = (self.fail - self.lo) / 2;
        // Steps from the prediction go no further than this: past it the prediction was off, as
        // it is where the pool's peak follows its room (a legacy pool purged `auto` fills the
        // room before it purges, so its slack is near nothing wherever it fits).
        let reach = GALLOP * step;
        match self.mode {
            // No prediction yet: the midpoint, and a prediction after it.
            Mode::Predict => match predicted {
                Some(p) => {
                    self.mode = Mode::Predicted;
                    (p / step * step).clamp(self.lo + step, self.fail - step)
                }
                None => mid,
            },
            Mode::Up(gap) | Mode::Down(gap) if gap < half && gap > reach => {
                self.missed = true;
                self.mode = Mode::Bisect;
                mid
            }
            Mode::Up(gap) if gap < half => self.lo + gap,
            Mode::Down(gap) if gap < half => self.fail - gap,
            _ => {
                self.mode = Mode::Bisect;
                mid
            }
        }
    }

    /// Whether the prediction was off by more than the steps from it reach: a search whose
    /// slack does not predict (a pool that grows in steps, or follows its room) stops asking.
    pub fn missed(&self) -> bool {
        self.missed
    }

    /// Notes a probe's result (`step`: the search's).
    pub fn probed(&mut self, ctx: usize, fits: bool, step: usize) {
        self.mode = match (self.mode, fits) {
            (Mode::Predict, _) => Mode::Predict,
            (Mode::Predicted, true) => Mode::Up(step),
            (Mode::Predicted, false) => Mode::Down(step),
            (Mode::Up(gap), true) => Mode::Up(2 * gap),
            (Mode::Down(gap), false) => Mode::Down(2 * gap),
            _ => Mode::Bisect,
        };
        if fits {
            self.lo = ctx;
        } else {
            self.fail = ctx;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEP: usize = 256;

    /// Narrows `[lo, fail)` over `fits`, a monotone predicate with a linear slack; returns the
    /// answer and the probes it took.
    fn narrow(boundary: usize, lo: usize, fail: usize, linear: bool) -> (usize, usize) {
        let slack = |c: usize| {
            let s = (boundary as f64 + 100.0 - c as f64) * 1000.0;
            // A slack that falls in stages of 8 Ki positions, not linearly.
            let s = if linear {
                s
            } else {
                s + ((c / 8192) % 2) as f64 * 4.0e6
            };
            s.max(0.0) as usize
        };
        let mut slacks = Slacks::default();
        for c in [lo / 2, lo] {
            slacks.note(Beside::Floor, c, slack(c));
        }
        let (mut b, mut probes) = (Bracket::new(lo, fail), 0);
        while b.fail - b.lo > STEP {
            let c = b.next(slacks.zero_from(Beside::Floor, b.lo, STEP), STEP);
            assert!(c > b.lo && c < b.fail);
            probes += 1;
            let fits = c <= boundary;
            if fits {
                slacks.note(Beside::Floor, c, slack(c));
            }
            b.probed(c, fits, STEP);
        }
        (b.lo, probes)
    }

    #[test]
    fn a_linear_slack_is_found_in_two_probes_where_bisection_takes_eleven() {
        let (answer, probes) = narrow(700_000, 1 << 19, 1 << 20, true);
        assert_eq!(answer, 700_000 / STEP * STEP);
        assert_eq!(probes, 2);
    }

    #[test]
    fn any_slack_finds_the_boundary_in_at_most_four_probes_more_than_bisection() {
        for boundary in (300_000..1_000_000).step_by(37_123) {
            for linear in [true, false] {
                let (answer, probes) = narrow(boundary, 1 << 18, 1 << 20, linear);
                assert_eq!(answer, boundary / STEP * STEP, "boundary {boundary}");
                // The bisection's 12, and the prediction and its three steps.
                assert!(probes <= 12 + 4, "{probes} probes at {boundary}");
            }
        }
    }

    #[test]
    fn no_prediction_without_a_loss_of_slack() {
        let mut s = Slacks::default();
        s.note(Beside::Floor, 256, 10);
        assert_eq!(s.zero_from(Beside::Floor, 256, STEP), None);
        s.note(Beside::Floor, 512, 10);
        assert_eq!(s.zero_from(Beside::Floor, 512, STEP), None);
        s.note(Beside::Exact, 1024, 4);
        // One exact probe borrows the floor's slope: none.
        assert_eq!(s.zero_from(Beside::Exact, 1024, STEP), None);
        s.note(Beside::Floor, 768, 5);
        // 5 bytes lost over 256 positions: 4 bytes of slack last 204 positions, under a step.
        assert_eq!(s.zero_from(Beside::Exact, 1024, STEP), Some(1024));
    }

    #[test]
    fn a_buffer_above_its_floor_is_predicted_to_fit_as_far_below_as_its_excess_takes() {
        let mut s = Slacks::default();
        // 1 KiB of slack lost per position.
        for (c, slack) in [(1 << 18, 300 << 20), (1 << 19, 44 << 20)] {
            s.note(Beside::Floor, c, slack);
        }
        assert_eq!(s.covering(1 << 19, 40 << 20, STEP), Some(1 << 19));
        // 20 MiB short: 20 Ki positions below, 80 steps.
        assert_eq!(
            s.covering(1 << 19, 64 << 20, STEP),
            Some((1 << 19) - 80 * STEP)
        );
        // Unknown slack, or more than every context below has: no prediction.
        assert_eq!(s.covering(1 << 17, 1, STEP), None);
        assert_eq!(s.covering(1 << 19, 1 << 40, STEP), None);
    }

    proptest::proptest! {
        /// Whatever the predictions (none, absurd, changing every probe) and whatever the
        /// probes answer (monotone or not), every probe lies strictly inside the bracket on a
        /// step, the bracket ends one step wide, and it takes at most the bisection's probes
        /// and the prediction's four more (a fresh prediction may restart the steps from it
        /// only while no step has run out).
        #[test]
        fn every_probe_is_inside_and_the_count_is_bounded(
            lo_steps in 1usize..10_000,
            width in 2usize..20_000,
            guesses in proptest::collection::vec(proptest::option::of(0usize..40_000), 64),
            fits in proptest::collection::vec(proptest::bool::ANY, 64),
        ) {
            let (lo, fail) = (lo_steps * STEP, (lo_steps + width) * STEP);
            let mut b = Bracket::new(lo, fail);
            let mut probes = 0;
            while b.fail - b.lo > STEP {
                let guess = guesses[probes % 64].map(|g| g * STEP + g % 3);
                let c = b.next(guess, STEP);
                proptest::prop_assert!(c > b.lo && c < b.fail && c % STEP == 0, "{c} in {b:?}");
                b.probed(c, fits[probes % 64], STEP);
                probes += 1;
            }
            let bisection = (usize::BITS - (width - 1).leading_zeros()) as usize;
            proptest::prop_assert!(probes <= bisection + 5, "{probes} probes, bisection {bisection}");
            proptest::prop_assert_eq!(b.fail - b.lo, STEP);
        }
    }
}
