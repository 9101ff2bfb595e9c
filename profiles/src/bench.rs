//! What mainline llama.cpp's `llama-bench` runs for one test (`tools/llama-bench`, 0c1e5709):
//! `-p P` (a prompt), `-n G` (generated tokens) or `-pg P,G` (a prompt, then tokens generated
//! after it), each step a ubatch of a known shape, and where the engine marks a ubatch's end to
//! its pools.
//!
//! Unless `--no-warmup`, the warm-up runs the whole prompt (`test_prompt` over `n_prompt`
//! tokens) and then generates one token after it (`test_gen(ctx, 1)`, at the position after the
//! prompt). Each repetition empties the cache (`llama_memory_clear`), runs the prompt in batches
//! of `-b` (split into ubatches of `-ub`; the last token of each batch asks for logits), then
//! generates `G` tokens one at a time, each at the next position with one output row. A
//! one-token step attends to the cache padded to 256 positions up to and including its own
//! (`llama_kv_cache::get_n_kv`), as a prompt ubatch does.
//!
//! The shim's patch marks a ubatch's end (`ggml_backend_cupool_ubatch_end`, where the pools
//! apply `CUPOOL_PURGE` and a recorded trace starts its next phase) only for ubatches of more
//! than one token: one-token steps share the phase of the ubatch before them.
//!
//! With CUDA graphs on (mainline's default; `GGML_CUDA_DISABLE_GRAPHS` turns them off), a step
//! that replays a captured graph launches no op and asks the pool for nothing: see
//! `mark_replays` for which steps those are.

use crate::error::ProfileError;
use crate::events::trace_events;
use crate::predict::EngineTrace;
use crate::profile::Profile;
use crate::setup::{Setup, UbatchShape};
use crate::sweep::KV_PADDING;
use cupool_pool::trace::Op;

/// One `llama-bench` test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LlamaBench {
    /// Prompt tokens (`-p`, or the first of `-pg`).
    pub prompt: usize,
    /// Tokens generated after the prompt (`-n`, or the second of `-pg`).
    pub gen: usize,
    /// `-b`.
    pub batch: usize,
    /// `-ub`.
    pub ubatch: usize,
    /// Repetitions (`-r`).
    pub reps: usize,
    /// Whether the warm-up runs (no `--no-warmup`).
    pub warmup: bool,
    /// Whether ggml's CUDA graphs are on (no `GGML_CUDA_DISABLE_GRAPHS`), as mainline has them.
    pub cuda_graphs: bool,
}

/// One step of a test: a ubatch (a prompt's, or one generated token).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// Its shape.
    pub shape: UbatchShape,
    /// The position of its first token.
    pub first_token: usize,
    /// Whether the engine marks its end to the pools (more than one token).
    pub boundary: bool,
    /// Whether a captured CUDA graph's replay runs it: its ops are not launched one by one, so
    /// none of them asks the pool for anything.
    pub replayed: bool,
}

impl LlamaBench {
    /// Every step the test runs, the warm-up's first, in order.
    pub fn steps(&self) -> Result<Vec<Step>, ProfileError> {
        let LlamaBench {
            prompt,
            gen,
            batch,
            ubatch,
            reps,
            ..
        } = *self;
        if ubatch == 0 || batch == 0 || batch % ubatch != 0 {
            return Err(ProfileError::Schedule(format!(
                "-b {batch} -ub {ubatch}: accepted is a ubatch of 1 or more tokens and a batch that is a whole number of ubatches"
            )));
        }
        if prompt + gen == 0 || reps == 0 {
            return Err(ProfileError::Schedule(format!(
                "-p {prompt} -n {gen} -r {reps}: accepted are 1 or more tokens (prompt or generated) and 1 or more repetitions"
            )));
        }
        let mut steps = Vec::new();
        if self.warmup {
            prompt_steps(prompt, batch, ubatch, &mut steps);
            gen_steps(prompt, gen.min(1), &mut steps);
        }
        for _ in 0..reps {
            prompt_steps(prompt, batch, ubatch, &mut steps);
            gen_steps(prompt, gen, &mut steps);
        }
        if self.cuda_graphs {
            mark_replays(&mut steps);
        }
        Ok(steps)
    }
}

/// Marks the steps a CUDA graph's replay runs, as `ggml_backend_cuda_graph_compute` (0c1e5709)
/// decides. ggml keeps one graph per first node, and every graph llama.cpp builds starts with
/// the same node, so one graph's state runs through all steps. A call whose graph properties
/// (every node, its sources' pointers and shapes) changed since the previous call, or the first
/// call, runs its ops directly and resets the warm-up; the next call with unchanged properties
/// captures them, running each op's code (its pool requests included, through the pool as a
/// direct run) into the graph; each further unchanged call replays the capture. A step's
/// properties are its shape: llama.cpp reuses the graph of an equal shape (`CUDA Graph id …
/// reused` in the logs) over the same buffers, and a new shape changes the sequence length of
/// the attention's views. ggml disables graphs for a call with an expert matrix multiply whose
/// fallback synchronizes; the profiles' expert path (q8_0 through MMQ) never takes it.
fn mark_replays(steps: &mut [Step]) {
    let mut last = None;
    let mut warm = false;
    for s in steps {
        let changed = last != Some(s.shape);
        last = Some(s.shape);
        if changed {
            warm = false;
        } else if warm {
            s.replayed = true;
        } else {
            // the capture: run as a direct call is
            warm = true;
        }
    }
}

fn pad(n: usize) -> usize {
    n.div_ceil(KV_PADDING) * KV_PADDING
}

/// A prompt of `tokens` from an empty cache: ubatches of `ubatch`, an output row where a batch
/// (or the prompt) ends.
fn prompt_steps(tokens: usize, batch: usize, ubatch: usize, out: &mut Vec<Step>) {
    for start in (0..tokens).step_by(ubatch) {
        let end = (start + ubatch).min(tokens);
        let n_tokens = end - start;
        out.push(Step {
            shape: UbatchShape {
                n_tokens,
                n_kv: pad(end),
                n_outputs: usize::from(end % batch == 0 || end == tokens),
            },
            first_token: start,
            boundary: n_tokens > 1,
            replayed: false,
        });
    }
}

/// `gen` tokens generated one at a time from position `from`.
fn gen_steps(from: usize, gen: usize, out: &mut Vec<Step>) {
    out.extend((from..from + gen).map(|pos| Step {
        shape: UbatchShape {
            n_tokens: 1,
            n_kv: pad(pos + 1),
            n_outputs: 1,
        },
        first_token: pos,
        boundary: false,
        replayed: false,
    }));
}

/// The engine's requests for a `llama-bench` test as a trace laid out as libcupool records it:
/// a phase opens at the start and after each marked ubatch end (the last one may stay empty),
/// so it compares phase for phase with a recorded trace. The trace's `phases` hold one entry
/// per step (its first event and first token): a failing allocation names its step.
pub fn bench_trace(
    profile: Profile,
    setup: &Setup,
    bench: &LlamaBench,
) -> Result<EngineTrace, ProfileError> {
    let steps = bench.steps()?;
    let mut ops = vec![Op::PhaseBegin {
        name: "ubatch 0".into(),
    }];
    let mut phases = Vec::with_capacity(steps.len());
    let (mut id, mut boundaries) = (0, 0);
    for s in &steps {
        phases.push((ops.len(), s.first_token));
        if !s.replayed {
            id = trace_events(&profile.ubatch(setup, s.shape)?, id, &mut ops);
        }
        if s.boundary {
            let name = format!("ubatch {boundaries}");
            boundaries += 1;
            ops.push(Op::PhaseEnd {
                name,
                prefill: true,
            });
            ops.push(Op::PhaseBegin {
                name: format!("ubatch {boundaries}"),
            });
        }
    }
    Ok(EngineTrace {
        profile,
        ops,
        phases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(prompt: usize, gen: usize) -> LlamaBench {
        LlamaBench {
            prompt,
            gen,
            batch: 2048,
            ubatch: 512,
            reps: 1,
            warmup: true,
            cuda_graphs: false,
        }
    }

    #[test]
    fn with_cuda_graphs_only_the_first_two_steps_of_a_shape_reach_the_pool() {
        let mut b = bench(1000, 40);
        b.cuda_graphs = true;
        let steps = b.steps().unwrap();
        let direct: Vec<_> = steps
            .iter()
            .filter(|s| !s.replayed)
            .map(|s| (s.first_token, s.shape.n_tokens))
            .collect();
        // Every prompt ubatch (each a new shape) and the warm-up's token run directly; the
        // measured run's first token too (the prompt ubatch before it changed the graph), the
        // second is captured, the rest of the 1,024 positions replay; position 1,024 opens 1,280
        // positions: run, captured, replayed.
        assert_eq!(
            direct,
            [
                (0, 512),
                (512, 488),
                (1000, 1),
                (0, 512),
                (512, 488),
                (1000, 1),
                (1001, 1),
                (1024, 1),
                (1025, 1)
            ]
        );
        assert_eq!(steps.len() - direct.len(), 22 + 14);
        // Off, every step runs.
        b.cuda_graphs = false;
        assert!(b.steps().unwrap().iter().all(|s| !s.replayed));
        // A one-ubatch prompt repeated: the repetition's is captured, the third replays.
        let mut r = bench(512, 0);
        (r.cuda_graphs, r.reps) = (true, 2);
        let replayed: Vec<_> = r.steps().unwrap().iter().map(|s| s.replayed).collect();
        assert_eq!(replayed, [false, false, true]);
    }

    #[test]
    fn a_prompt_then_generation_runs_as_llama_bench_runs_it() {
        let steps = bench(1000, 3).steps().unwrap();
        let shapes: Vec<_> = steps
            .iter()
            .map(|s| (s.shape.n_tokens, s.shape.n_kv, s.first_token, s.boundary))
            .collect();
        assert_eq!(
            shapes,
            [
                // warm-up: the prompt, one token after it
                (512, 512, 0, true),
                (488, 1024, 512, true),
                (1, 1024, 1000, false),
                // the measured run: the prompt again, three tokens from position 1000
                (512, 512, 0, true),
                (488, 1024, 512, true),
                (1, 1024, 1000, false),
                (1, 1024, 1001, false),
                (1, 1024, 1002, false),
            ]
        );
        // A 256-position boundary crossed while generating.
        let s = bench(255, 2).steps().unwrap();
        assert_eq!(
            s.iter().map(|s| s.shape.n_kv).collect::<Vec<_>>(),
            [256, 256, 256, 256, 512]
        );
        // Only the last token of each batch (and of the prompt) asks for logits; every generated
        // token does.
        let s = bench(4096, 1).steps().unwrap();
        let outputs: Vec<_> = s.iter().map(|s| s.shape.n_outputs).collect();
        assert_eq!(
            outputs,
            [0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 1]
        );
        // No warm-up, two repetitions; a one-token prompt ubatch marks no end.
        let mut b = bench(513, 0);
        b.warmup = false;
        b.reps = 2;
        let s = b.steps().unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(
            s.iter().map(|s| s.boundary).collect::<Vec<_>>(),
            [true, false, true, false]
        );
    }

    #[test]
    fn bad_tests_are_refused() {
        for b in [
            bench(0, 0),
            LlamaBench {
                reps: 0,
                ..bench(8, 0)
            },
            LlamaBench {
                ubatch: 0,
                ..bench(8, 0)
            },
            LlamaBench {
                batch: 700,
                ..bench(8, 0)
            },
        ] {
            let e = b.steps().unwrap_err().to_string();
            assert!(e.contains("accepted"), "{e}");
        }
    }
}
