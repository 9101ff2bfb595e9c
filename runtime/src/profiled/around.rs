//! What a dry run keeps of its engine profile's answers from one ubatch to the next
//! ([`Around`]), and what an auto purge keeps for a ubatch's ops ([`Keep`]).

use super::layer_kind;
use crate::error::RuntimeError;
use cupool_profiles::{OpCall, Profile, Setup, UbatchShape};
use std::sync::Arc;

/// The ops around a layer's attention ([`Profile::layer_around`]) a dry run has asked, by
/// ubatch size (tokens and output rows) and kind of layer: layers of one kind make the same
/// requests, and a prompt's ubatches come in a size or two. And the attention's ops and what
/// an auto purge keeps, for the last ubatch shapes asked: a ubatch's are asked at the boundary
/// before it (for what that purge keeps), and again by the ubatch.
#[derive(Debug, Default)]
pub(crate) struct Around {
    parts: Vec<(AroundKey, Parts)>,
    attention: Vec<(UbatchShape, Arc<[OpCall]>)>,
    keep: Vec<(UbatchShape, Vec<usize>)>,
}

/// Ubatch shapes whose attention and keep list [`Around`] remembers.
const SHAPES: usize = 2;

/// (tokens, output rows, kind of layer).
type AroundKey = (usize, usize, (bool, bool));

/// The ops before a layer's attention and after it, and what an auto purge keeps for them
/// (asked at every boundary of a dry run: counted once).
type Parts = (Vec<OpCall>, Vec<OpCall>, Keep);

impl Around {
    /// The attention's ops in ubatch `u` ([`Profile::attention`]), asked of the profile where
    /// `u` is not among the last shapes asked (a refusal is asked again).
    pub(super) fn attention(
        &mut self,
        profile: Profile,
        s: &Setup,
        u: UbatchShape,
    ) -> Result<Arc<[OpCall]>, RuntimeError> {
        if let Some((_, a)) = self.attention.iter().find(|(k, _)| *k == u) {
            return Ok(a.clone());
        }
        let a: Arc<[OpCall]> = profile.attention(s, u)?.into();
        remember(&mut self.attention, u, a.clone());
        Ok(a)
    }

    /// What an auto purge keeps for ubatch `u`: `make`'s answer, made where `u` is not among
    /// the last shapes asked (an error is made again).
    pub(super) fn keep(
        &mut self,
        u: UbatchShape,
        make: impl FnOnce(&mut Self) -> Result<Vec<usize>, RuntimeError>,
    ) -> Result<Vec<usize>, RuntimeError> {
        if let Some((_, k)) = self.keep.iter().find(|(k, _)| *k == u) {
            return Ok(k.clone());
        }
        let k = make(self)?;
        remember(&mut self.keep, u, k.clone());
        Ok(k)
    }

    /// Layer `l`'s ops before and after its attention in ubatch `u`, asked of the profile the
    /// first time.
    pub(super) fn get(
        &mut self,
        profile: Profile,
        s: &Setup,
        u: UbatchShape,
        l: usize,
    ) -> (&[OpCall], &[OpCall]) {
        let (before, after, _) = self.parts(profile, s, u, l);
        (before, after)
    }

    /// What an auto purge keeps for layer `l`'s ops around its attention in ubatch `u`.
    pub(super) fn kept(&mut self, profile: Profile, s: &Setup, u: UbatchShape, l: usize) -> &Keep {
        &self.parts(profile, s, u, l).2
    }

    fn parts(&mut self, profile: Profile, s: &Setup, u: UbatchShape, l: usize) -> &Parts {
        let key = (u.n_tokens, u.n_outputs, layer_kind(&s.model, l));
        let at = match self.parts.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                // A few sizes per run: a long list means another run's sizes.
                if self.parts.len() >= 16 {
                    self.parts.clear();
                }
                let (before, after) = profile.layer_around(s, u.n_tokens, u.n_outputs, l);
                let mut keep = Keep::default();
                before.iter().chain(&after).for_each(|c| keep.add(c));
                self.parts.push((key, (before, after, keep)));
                self.parts.len() - 1
            }
        };
        &self.parts[at].1
    }
}

/// Adds `v` for shape `u` to `list`, the oldest of [`SHAPES`] going.
fn remember<T>(list: &mut Vec<(UbatchShape, T)>, u: UbatchShape, v: T) {
    if list.len() >= SHAPES {
        list.remove(0);
    }
    list.push((u, v));
}

/// What an auto purge keeps for a ubatch's ops: for each request size, as many buffers as
/// one op holds at once (ops run one after another), largest first.
#[derive(Debug, Default)]
pub(super) struct Keep {
    /// (size, most buffers of it one op holds). A few dozen sizes: a list, not a hash map
    /// (the boundary of every dry-run ubatch asks).
    most: Vec<(usize, usize)>,
    here: Vec<usize>,
}

impl Keep {
    /// Counts op `c`.
    pub(super) fn add(&mut self, c: &OpCall) {
        self.here.clear();
        self.here.extend(c.request_bytes());
        self.here.sort_unstable();
        let here = std::mem::take(&mut self.here);
        for run in here.chunk_by(|a, b| a == b) {
            self.count(run[0], run.len());
        }
        self.here = here;
    }

    /// Counts what `other` counted.
    pub(super) fn merge(&mut self, other: &Keep) {
        for &(b, n) in &other.most {
            self.count(b, n);
        }
    }

    fn count(&mut self, b: usize, n: usize) {
        match self.most.iter_mut().find(|(m, _)| *m == b) {
            Some(e) => e.1 = e.1.max(n),
            None => self.most.push((b, n)),
        }
    }

    /// The sizes to keep, largest first.
    pub(super) fn sizes(self) -> Vec<usize> {
        let mut keep: Vec<usize> = self
            .most
            .into_iter()
            .flat_map(|(b, n)| std::iter::repeat_n(b, n))
            .collect();
        keep.sort_unstable_by(|a, b| b.cmp(a));
        keep
    }
}
