//! What `ggml_backend_sched` (`ggml/src/ggml-backend.cpp` of mainline 0c1e5709) makes of a graph
//! before ggml-alloc sees it, for CUDA devices `0..n_gpus` and the CPU (backend `n_gpus`, the
//! last): each node's backend (pass 1: set by llama.cpp, else its own or its view source's
//! buffer, graph inputs to the CPU, else its weights' backend save for ROPE and FLASH_ATTN_EXT,
//! a GET_ROWS on host weights staying there; pass 2: the rest spread down then up from the GPU
//! nodes, then from any; views take their source's), the splits (a new one where the backend
//! changes), and each split's inputs from another backend: a copy in the split's backend,
//! allocated at the split's start behind a dependency on the original, freed after its last
//! reader — or with a pipeline `copies` copies of each, flagged input and output (never freed)
//! and allocated before any node as leafs; and after each node a CUDA split's fusions keep
//! tensors alive until (`fusion.rs`), a dependency node reading them.

use super::cgraph::{Ctx, Home, Op};
use super::fusion::{self, Deps, MAX_SRC};
use super::galloc::{AllocGraph, AllocTensor};

/// Each backend's buffer size after ggml-alloc placed the scheduler's copy of `g`.
pub(crate) fn buffer_sizes(g: &Ctx, n_gpus: usize, copies: usize, align: usize) -> Vec<usize> {
    super::galloc::reserve(&schedule(g, n_gpus, copies), n_gpus + 1, align)
}

/// Tensors the scheduler adds, numbered after the graph's.
struct Copies {
    extra: Vec<Extra>,
}

#[derive(Clone)]
enum Extra {
    /// A split input's copy of tensor `of`.
    Copy { of: usize, flagged: bool },
    /// A `GGML_OP_NONE` view of `srcs[0]` reading `srcs`, so that they live until it ran:
    /// `input_dep` (a split input, until its copy is made) or a fusion's kept tensors.
    Dep { srcs: Vec<usize> },
}

fn schedule(g: &Ctx, n_gpus: usize, copies: usize) -> AllocGraph {
    let cpu = n_gpus;
    let n = g.t.len();
    let mut be: Vec<Option<usize>> = vec![None; n];
    // pass 1
    for &i in g.leafs.iter().chain(&g.nodes) {
        let t = &g.t[i];
        let home = |h: Home| match h {
            Home::Weight(b) | Home::Cache(b) => Some(b),
            Home::Graph => None,
        };
        be[i] = t
            .backend
            .or_else(|| home(t.home))
            .or_else(|| t.view_src.and_then(|v| home(g.t[v].home)))
            .or(if t.input { Some(cpu) } else { None })
            .or_else(|| {
                if matches!(t.op, Op::Rope | Op::FlashAttn) {
                    return None;
                }
                t.src.iter().find_map(|&s| match g.t[s].home {
                    Home::Weight(b) => Some(b),
                    _ => None,
                })
            });
    }
    // pass 2: expand GPU down, GPU up, any down, any up
    let mut expand = |order: &mut dyn Iterator<Item = usize>, gpu_only: bool| {
        let mut cur = None;
        for i in order {
            if g.t[i].op.is_view_op() {
                continue;
            }
            match be[i] {
                Some(b) if gpu_only && b == cpu => cur = None,
                Some(b) => cur = Some(b),
                None => be[i] = cur,
            }
        }
    };
    expand(&mut g.nodes.iter().copied(), true);
    expand(&mut g.nodes.iter().rev().copied(), true);
    expand(&mut g.nodes.iter().copied(), false);
    expand(&mut g.nodes.iter().rev().copied(), false);
    // pass 4: views on their source's backend
    for &i in &g.nodes {
        if be[i].is_none() {
            be[i] = g.t[i].view_src.and_then(|v| be[v]);
        }
    }
    let of = |i: usize| be[i].unwrap_or(cpu);
    // pass 5: splits and their inputs
    let mut splits: Vec<(usize, Vec<usize>, Vec<usize>)> = vec![]; // backend, inputs, nodes
    let mut srcs: Vec<Vec<usize>> = g.t.iter().map(|t| t.src.clone()).collect();
    let mut copy_of: std::collections::HashMap<(usize, usize), usize> = Default::default();
    let mut c = Copies { extra: vec![] };
    for &i in &g.nodes {
        if g.t[i].op.is_view_op() {
            if let Some(s) = splits.last_mut() {
                s.2.push(i);
            }
            continue;
        }
        let b = of(i);
        if splits.last().is_none_or(|s| s.0 != b) {
            splits.push((b, vec![], vec![]));
        }
        let split = splits.last_mut().expect("pushed above");
        for s in srcs[i].iter_mut() {
            let home = match g.t[*s].home {
                Home::Weight(h) | Home::Cache(h) => h,
                Home::Graph => g.t[*s].view_src.map_or(of(*s), |v| match g.t[v].home {
                    Home::Weight(h) | Home::Cache(h) => h,
                    Home::Graph => of(v),
                }),
            };
            if home == b {
                continue;
            }
            let src = *s;
            *s = *copy_of.entry((src, b)).or_insert_with(|| {
                let first = n + c.extra.len();
                for _ in 0..copies {
                    c.extra.push(Extra::Copy {
                        of: src,
                        flagged: copies > 1,
                    });
                }
                split.1.push(src);
                first
            });
        }
        split.2.push(i);
    }
    // each CUDA split's fusions: the tensors they keep, and until which node
    let mut uses = vec![0; n];
    for &i in &g.nodes {
        for &s in &g.t[i].src {
            uses[s] += 1;
        }
    }
    let mut deps = Deps::default();
    for (b, _, split_nodes) in &splits {
        if *b != cpu {
            fusion::split_deps(g, &srcs, &uses, split_nodes, &mut deps);
        }
    }
    // the graph copy: per split its inputs' dependency and copy, then its nodes, each followed
    // by the dependencies keeping what a fusion needs until it
    let mut nodes = vec![];
    let mut leafs = vec![];
    for (b, inputs, split_nodes) in &splits {
        for &s in inputs {
            c.extra.push(Extra::Dep { srcs: vec![s] });
            nodes.push((n + c.extra.len() - 1, of(s)));
            nodes.push((copy_of[&(s, *b)], *b));
        }
        for &i in split_nodes {
            nodes.push((i, of(i)));
            for keep in deps.of(i).unwrap_or_default().chunks(MAX_SRC) {
                c.extra.push(Extra::Dep {
                    srcs: keep.to_vec(),
                });
                nodes.push((n + c.extra.len() - 1, *b));
            }
        }
    }
    if copies > 1 {
        for (b, inputs, _) in &splits {
            for &s in inputs {
                let first = copy_of[&(s, *b)];
                leafs.extend((first..first + copies).map(|k| (k, *b)));
            }
        }
    }
    leafs.extend(g.leafs.iter().map(|&i| (i, of(i))));
    AllocGraph {
        tensors: tensors(g, srcs, c.extra),
        nodes,
        leafs,
    }
}

/// The allocator's view of the graph's tensors (their sources rewired to the copies) and of
/// the scheduler's.
fn tensors(g: &Ctx, srcs: Vec<Vec<usize>>, extra: Vec<Extra>) -> Vec<AllocTensor> {
    let mut out: Vec<AllocTensor> =
        g.t.iter()
            .zip(srcs)
            .map(|(t, src)| AllocTensor {
                size: t.alloc_size(),
                view_src: t.view_src,
                op_none: t.op == Op::None,
                src,
                input: t.input,
                output: t.output,
                external: t.home != Home::Graph,
                inplace: t.op.can_inplace(),
                layout: (t.ty as u8, t.ne, t.nb),
            })
            .collect();
    for e in extra {
        out.push(match e {
            Extra::Copy { of, flagged } => AllocTensor {
                size: g.t[of].nbytes(),
                input: flagged,
                output: flagged,
                layout: (g.t[of].ty as u8, g.t[of].ne, g.t[of].nb),
                ..AllocTensor::default()
            },
            Extra::Dep { srcs } => AllocTensor {
                // (a scheduler's copy is no view: its own root)
                view_src: Some(g.t.get(srcs[0]).and_then(|t| t.view_src).unwrap_or(srcs[0])),
                op_none: true,
                src: srcs,
                ..AllocTensor::default()
            },
        });
    }
    out
}
