//! What the engine-profile tests share: the profile's requests for a ubatch, the recorded
//! traces (tests/data, gzipped) and their phases with ids replaced by positions, so that a
//! predicted phase and a recorded one compare event for event.
#![allow(dead_code)] // each test file takes what it needs

pub mod two_gpus;

use cupool_kernels::KvType;
use cupool_pool::trace::{self, Op};
use cupool_profiles::{Device, EngineModel, OpCall, Profile, Setup, UbatchShape, Weights};
use std::io::Read;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

pub fn setup(model: &EngineModel, weights: Weights, kv: KvType, dev: Device) -> Setup {
    Setup {
        model: model.clone(),
        weights,
        kv,
        dev,
    }
}

/// Ubatch `j` of a llama-bench prompt of `tokens` in batches of `batch`: each batch's last
/// token asks for logits.
pub fn prompt_ubatch(j: usize, tokens: usize, batch: usize, ubatch: usize) -> UbatchShape {
    let start = j * ubatch;
    let end = (start + ubatch).min(tokens);
    UbatchShape {
        n_tokens: end - start,
        n_kv: end.next_multiple_of(256),
        n_outputs: usize::from(end % batch == 0 || end == tokens),
    }
}

/// ik_llama.cpp's requests for a ubatch of `n_tokens` over `n_kv` positions.
pub fn ubatch(s: &Setup, n_tokens: usize, n_kv: usize, n_outputs: usize) -> Vec<OpCall> {
    let u = UbatchShape {
        n_tokens,
        n_kv,
        n_outputs,
    };
    Profile::IkLlama.ubatch(s, u).unwrap()
}

pub fn read_trace(rel: &str) -> Vec<Op> {
    let f = std::fs::File::open(format!("{ROOT}/{rel}")).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(f)
        .read_to_string(&mut text)
        .unwrap();
    trace::parse(&text).unwrap()
}

/// A phase's allocations and frees with ids replaced by positions: an allocation is (size,
/// name), a free names the position of the allocation it returns.
#[derive(Debug, PartialEq)]
pub enum Event {
    Alloc(usize, String),
    Free(usize),
}

/// A profile's calls for one step as events, their frees numbered from `offset` (the step's
/// place in its phase).
pub fn step_events(calls: &[OpCall], offset: usize) -> Vec<Event> {
    let mut ops = vec![Op::PhaseBegin {
        name: String::new(),
    }];
    cupool_profiles::trace_events(calls, 0, &mut ops);
    phases(&ops)
        .pop()
        .unwrap()
        .into_iter()
        .map(|e| match e {
            Event::Free(at) => Event::Free(at + offset),
            alloc => alloc,
        })
        .collect()
}

pub fn phases(ops: &[Op]) -> Vec<Vec<Event>> {
    phases_of(ops, None)
}

/// As `phases`, for one stream's pool only (a device of a multi-GPU run) when `stream` is set.
pub fn phases_of(ops: &[Op], stream: Option<u64>) -> Vec<Vec<Event>> {
    let mut out: Vec<Vec<Event>> = Vec::new();
    let mut pos = std::collections::HashMap::new();
    for op in ops {
        match op {
            Op::PhaseBegin { .. } => {
                out.push(Vec::new());
                pos.clear();
            }
            Op::Alloc { stream: s, .. } if stream.is_some_and(|want| want != *s) => {}
            Op::Free { id } if !pos.contains_key(id) && stream.is_some() => {}
            Op::Alloc { id, size, name, .. } => {
                let phase = out.last_mut().expect("allocations before the first phase");
                pos.insert(*id, phase.len());
                phase.push(Event::Alloc(*size, name.clone().unwrap_or_default()));
            }
            Op::Free { id } => {
                let phase = out.last_mut().unwrap();
                let at = *pos
                    .get(id)
                    .expect("a free of an allocation of another phase");
                phase.push(Event::Free(at));
            }
            _ => {}
        }
    }
    out
}

pub fn same(trace: &str, k: usize, got: &[Event], want: &[Event]) {
    if got != want {
        let at = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{trace}: step {k}: {} events predicted, {} recorded; first difference at event {at}: predicted {:?}, recorded {:?}",
            got.len(),
            want.len(),
            got.get(at),
            want.get(at)
        );
    }
}
