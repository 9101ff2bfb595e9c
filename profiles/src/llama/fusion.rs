//! What the CUDA backend's `graph_optimize` (`ggml_backend_cuda_graph_optimize`, `ggml-cuda.cu`
//! of mainline 0c1e5709) changes for ggml-alloc: for two fusions it will run it asks the
//! scheduler to keep tensors alive up to a later node ("alloc deps"; `ggml_backend_sched_split_graph`
//! adds, after that node, `GGML_OP_NONE` views whose sources are the kept tensors, ten a node).
//! A kept tensor thus has one more consumer, so no later op writes over it in place, and it
//! lives until that node ran. With `GGML_CUDA_DISABLE_FUSION` unset:
//!
//! - **weighted expert reduction** (`ggml_cuda_match_moe_weighted_reduction`): the experts'
//!   output times the routing weights, its `k` per-expert views and the `k - 1` adds that sum
//!   them: the experts' output and the weights are kept until the last add. So the multiply
//!   cannot run in place over the experts' output: both live through the sum.
//! - **top-k routing** (`ggml_cuda_topk_moe_fusion` with `ggml_cuda_should_use_topk_moe`): the
//!   softmax, its reshape, the argsort, the top-k view and the weights' row lookup, then the
//!   weights' normalization (reshape, sum, clamp, divide, reshape) and a scale where present.
//!   Every node of the group and each of its sources is kept until the node after the group
//!   (`add_alloc_deps(i, i + ops.size())`: the first node the fusion does not cover).
//!
//! The matchers read the nodes of one split in order, as the backend does; both also require
//! that no node outside the group reads the group's inner nodes (`ggml_can_fuse_subgraph`).

use super::cgraph::{Ctx, Op, Ty};

/// `GGML_MAX_SRC`: each dependency node holds at most this many kept tensors.
pub(crate) const MAX_SRC: usize = 10;

/// `MOE_WEIGHTED_REDUCTION_MAX_EXPERTS`: the weighted reduction's group must stay within the
/// 31 nodes `ggml_can_fuse_subgraph` accepts.
const MAX_EXPERTS: usize = 15;

/// The tensors kept until each node (`until`, in the order first asked), each list in the order
/// added, without repeats.
#[derive(Default)]
pub(crate) struct Deps(pub Vec<(usize, Vec<usize>)>);

impl Deps {
    fn keep(&mut self, t: usize, until: usize) {
        let at = match self.0.iter().position(|d| d.0 == until) {
            Some(at) => at,
            None => {
                self.0.push((until, vec![]));
                self.0.len() - 1
            }
        };
        if !self.0[at].1.contains(&t) {
            self.0[at].1.push(t);
        }
    }

    /// The kept tensors of node `until`.
    pub(crate) fn of(&self, until: usize) -> Option<&[usize]> {
        self.0.iter().find(|d| d.0 == until).map(|d| &d.1[..])
    }
}

/// One split's nodes as the backend sees them.
struct Split<'a> {
    g: &'a Ctx,
    /// Each tensor's sources in the scheduler's graph (split inputs replaced by their copies).
    srcs: &'a [Vec<usize>],
    /// How many times each tensor is a source of a node of the whole graph (`use_counts`).
    uses: &'a [usize],
    nodes: &'a [usize],
}

/// Adds the alloc deps of one CUDA split's `nodes` to `deps`.
pub(crate) fn split_deps(
    g: &Ctx,
    srcs: &[Vec<usize>],
    uses: &[usize],
    nodes: &[usize],
    deps: &mut Deps,
) {
    let s = Split {
        g,
        srcs,
        uses,
        nodes,
    };
    let mut i = 0;
    while i < nodes.len() {
        if let Some((keep, count)) = s.weighted_reduction(i) {
            let dst = nodes[i + count - 1];
            for t in keep {
                deps.keep(t, dst);
            }
            i += count - 1;
        }
        if s.op(i) == Some(Op::SoftMax) {
            if let Some(count) = s.topk_moe(i) {
                // ggml reads the node after the group unchecked; a group ending the split
                // keeps nothing here.
                if let Some(&until) = nodes.get(i + count) {
                    for k in i..i + count {
                        deps.keep(nodes[k], until);
                        for &src in &srcs[nodes[k]] {
                            deps.keep(src, until);
                        }
                    }
                }
                i += count - 1;
            }
        }
        i += 1;
    }
}

impl Split<'_> {
    fn op(&self, i: usize) -> Option<Op> {
        self.nodes.get(i).map(|&t| self.g.t[t].op)
    }

    /// Source `k` of the node at `i`.
    fn src(&self, i: usize, k: usize) -> Option<usize> {
        self.srcs[self.nodes[i]].get(k).copied()
    }

    /// Whether the node at `i` is `op` and reads the node at `from` as source `k`.
    fn reads(&self, i: usize, op: Op, k: usize, from: usize) -> bool {
        self.op(i) == Some(op) && self.src(i, k) == Some(self.nodes[from])
    }

    fn f32_contiguous(&self, t: usize) -> bool {
        self.g.t[t].ty == Ty::F32 && self.g.t[t].is_contiguous()
    }

    /// `ggml_can_fuse_subgraph` over the nodes `i..i + count` whose results other nodes may
    /// read (`outputs`): each other node is no graph output, is read only inside the group,
    /// and views only a node of the group (or a weight).
    fn can_fuse(&self, i: usize, count: usize, outputs: &[usize]) -> bool {
        let group = &self.nodes[i..i + count];
        for (k, &t) in group.iter().enumerate() {
            if outputs.contains(&(i + k)) {
                continue;
            }
            if self.g.t[t].output {
                return false;
            }
            let inside: usize = group[k + 1..]
                .iter()
                .map(|&o| self.srcs[o].iter().filter(|&&s| s == t).count())
                .sum();
            if inside != self.uses[t] {
                return false;
            }
            if let Some(v) = self.g.t[t].view_src {
                let weight = self.g.t[v].home != super::cgraph::Home::Graph;
                if !group.contains(&v) && !weight {
                    return false;
                }
            }
        }
        true
    }

    /// The top-k routing group from the softmax at `i` (`ggml_cuda_topk_moe_fusion` for a
    /// softmax gate without a selection bias): its node count, if the backend fuses it.
    fn topk_moe(&self, i: usize) -> Option<usize> {
        // softmax -> reshape; argsort of the softmax -> view; rows of the reshape by the view
        let routed = self.reads(i + 1, Op::Reshape, 0, i)
            && self.reads(i + 2, Op::ArgSort, 0, i)
            && self.reads(i + 3, Op::View, 0, i + 2)
            && self.reads(i + 4, Op::GetRows, 0, i + 1)
            && self.src(i + 4, 1) == Some(self.nodes[i + 3]);
        if !routed {
            // (a selection bias, `ADD` after the reshape, is not modelled: no fusion assumed)
            return None;
        }
        let mut count = 5;
        // reshape -> sum_rows -> clamp -> div(reshape, clamp) -> reshape: all or nothing, and
        // a partial match ends the group before any scale
        let norm = self.reads(i + 5, Op::Reshape, 0, i + 4)
            && self.reads(i + 6, Op::SumRows, 0, i + 5)
            && self.reads(i + 7, Op::Clamp, 0, i + 6);
        let norm = norm
            && self.reads(i + 8, Op::Div, 1, i + 7)
            && self.reads(i + 8, Op::Div, 0, i + 5)
            && self.reads(i + 9, Op::Reshape, 0, i + 8);
        let partial = self.op(i + 5) == Some(Op::Reshape) && !norm;
        if norm {
            count += 5;
        }
        if !partial
            && i + count < self.nodes.len()
            && self.reads(i + count, Op::Scale, 0, i + count - 1)
        {
            count += 1;
        }
        if i + count > self.nodes.len() {
            return None;
        }
        let (softmax, ids) = (self.nodes[i], self.nodes[i + 3]);
        let weights = self.nodes[i + count - 1];
        let logits = self.src(i, 0)?;
        // ggml_cuda_should_use_topk_moe: an instantiated expert count, contiguous logits and
        // weights, a plain softmax (scale 1, no mask: the only softmax modelled)
        let t = &self.g.t;
        let n_expert = t[ids].nb[1] / t[ids].nb[0];
        let instantiated =
            (n_expert.is_power_of_two() && n_expert <= 512) || [288, 576].contains(&n_expert);
        let should = instantiated
            && t[weights].is_contiguous()
            && t[logits].is_contiguous()
            && self.srcs[softmax].len() == 1;
        (should && self.can_fuse(i, count, &[i + 3, i + count - 1])).then_some(count)
    }

    /// The weighted reduction from the multiply at `i`: the tensors it keeps (the experts'
    /// output, a per-expert scale where there is one, the routing weights) and its node count.
    fn weighted_reduction(&self, i: usize) -> Option<(Vec<usize>, usize)> {
        let t = &self.g.t;
        let first = self.nodes[i];
        if t[first].op != Op::Mul || !self.f32_contiguous(first) {
            return None;
        }
        // (full, broadcast) of a multiply: the experts' shape times one value per expert row
        let split = |mul: usize| -> Option<(usize, usize)> {
            let (a, b) = (*self.srcs[mul].first()?, *self.srcs[mul].get(1)?);
            let experts = |x: usize| self.f32_contiguous(x) && t[x].ne == t[mul].ne;
            let weights = |x: usize| {
                self.f32_contiguous(x) && t[x].ne[0] == 1 && t[x].ne[1..] == t[mul].ne[1..]
            };
            if experts(a) && weights(b) {
                Some((a, b))
            } else if experts(b) && weights(a) {
                Some((b, a))
            } else {
                None
            }
        };
        let mut keep = vec![];
        let mut weighted = first;
        let mut muls = 1;
        if let Some(&second) = self.nodes.get(i + 1) {
            if t[second].op == Op::Mul && self.f32_contiguous(second) {
                if let (Some((scaled, route)), Some((raw, scale))) = (split(second), split(first)) {
                    if scaled == first {
                        (weighted, muls) = (second, 2);
                        // ggml adds the experts, the weights, then the scale
                        keep = vec![raw, route, scale];
                    }
                }
            }
        }
        if keep.is_empty() {
            let (experts, weights) = split(first)?;
            keep = vec![experts, weights];
        }
        let k = t[weighted].ne[1];
        let n_tokens = t[weighted].ne[2] * t[weighted].ne[3];
        if !(2..=MAX_EXPERTS).contains(&k) || n_tokens == 0 {
            return None;
        }
        let count = 2 * k + muls - 1;
        if i + count > self.nodes.len() {
            return None;
        }
        // k views of the weighted result, one per expert row, then the adds chaining them
        let nb = t[weighted].nb;
        let (mut views, mut previous) = (vec![], None);
        for at in i + muls..i + count {
            let c = &t[self.nodes[at]];
            if c.op == Op::View {
                let e = views.len();
                let ok = e < k
                    && self.src(at, 0) == Some(weighted)
                    && c.view_src == Some(weighted)
                    && c.ty == Ty::F32
                    && c.ne == [t[weighted].ne[0], n_tokens, 1, 1]
                    && c.nb[0] == nb[0]
                    && c.nb[1] == nb[2]
                    && c.offs == e * nb[1];
                if !ok {
                    return None;
                }
                views.push(self.nodes[at]);
                continue;
            }
            let adds = at - i - muls - views.len();
            if c.op != Op::Add || views.len() < 2 || adds + 1 >= views.len() {
                return None;
            }
            let lhs = if adds == 0 { views[0] } else { previous? };
            if self.src(at, 0) != Some(lhs)
                || self.src(at, 1) != Some(views[adds + 1])
                || c.ty != Ty::F32
            {
                return None;
            }
            previous = Some(self.nodes[at]);
        }
        let last = previous?;
        let full = views.len() == k && t[last].is_contiguous();
        let full = full && t[last].ne == [t[weighted].ne[0], n_tokens, 1, 1];
        (full && self.can_fuse(i, count, &[i + count - 1])).then_some((keep, count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::reserve::{build, Placement};
    use crate::llama::Version;
    use crate::model::EngineModel;
    use cupool_kernels::KvType;

    /// The alloc deps of `m`'s reserve graph on one device (two layers).
    fn deps_of(mut m: EngineModel) -> (Ctx, Deps) {
        m.n_layer = 2;
        let p = Placement {
            n_gpus: 1,
            layer_dev: vec![0; 2],
            output_dev: 0,
        };
        let g = build(Version::D99724f2, &m, KvType::Q8_0, 4096, 512, &p);
        let srcs: Vec<Vec<usize>> = g.t.iter().map(|t| t.src.clone()).collect();
        let mut uses = vec![0; g.t.len()];
        for &i in &g.nodes {
            for &s in &g.t[i].src {
                uses[s] += 1;
            }
        }
        let mut deps = Deps::default();
        split_deps(&g, &srcs, &uses, &g.nodes, &mut deps);
        (g, deps)
    }

    #[test]
    fn each_moe_layer_keeps_its_routing_and_its_experts() {
        let qwen = EngineModel::preset("qwen3-30b-a3b").unwrap();
        let (g, deps) = deps_of(qwen.clone());
        let ops = |ts: &[usize]| ts.iter().map(|&t| g.t[t].op).collect::<Vec<_>>();
        // per layer, the routing group's ten nodes and the router's logits until the node
        // after the group (the experts' input reshaped), then the down projection and the
        // weights until the last add of the sum over the experts
        let routing = [
            Op::SoftMax,
            Op::MulMat,
            Op::Reshape,
            Op::ArgSort,
            Op::View,
            Op::GetRows,
            Op::Reshape,
            Op::SumRows,
            Op::Clamp,
            Op::Div,
            Op::Reshape,
        ];
        assert_eq!(deps.0.len(), 4);
        for layer in deps.0.chunks(2) {
            assert_eq!(g.t[layer[0].0].op, Op::Reshape);
            assert_eq!(ops(&layer[0].1), routing);
            assert_eq!(g.t[layer[1].0].op, Op::Add);
            assert_eq!(ops(&layer[1].1), [Op::MulMatId, Op::Reshape]);
        }
        // a dense model fuses neither
        let (_, none) = deps_of(EngineModel::preset("llama3-8b").unwrap());
        assert!(none.0.is_empty());
        // 16 experts a token: beyond the reduction's fusion; 96 experts: no top-k kernel
        let mut wide = qwen.clone();
        wide.moe.as_mut().unwrap().n_expert_used = 16;
        let (g16, deps) = deps_of(wide);
        assert!(deps.0.iter().all(|d| g16.t[d.0].op == Op::Reshape));
        assert_eq!(deps.0.len(), 2);
        let mut odd = qwen;
        odd.moe.as_mut().unwrap().n_expert = 96;
        let (g96, deps) = deps_of(odd);
        assert!(deps.0.iter().all(|d| g96.t[d.0].op == Op::Add));
        assert_eq!(deps.0.len(), 2);
    }
}
