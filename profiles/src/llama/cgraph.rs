//! The tensors of a ggml graph as far as the scheduler and ggml-alloc look at them (op, type,
//! shape, strides, sources, views, flags), and `ggml_build_forward_expand`'s order: a
//! depth-first walk from each expanded tensor over its sources in order, a tensor entering the
//! graph after its sources (an op-less tensor as a leaf, any other as a node).

/// The ops the llama, phi3 and qwen3moe graphs use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    None,
    GetRows,
    RmsNorm,
    Mul,
    Add,
    Scale,
    MulMat,
    Rope,
    Glu,
    SetRows,
    FlashAttn,
    Reshape,
    View,
    Permute,
    // the router and the experts (`build_moe_ffn`)
    SoftMax,
    ArgSort,
    SumRows,
    Clamp,
    Div,
    MulMatId,
}

impl Op {
    /// `ggml_op_can_inplace` (`ggml-alloc.c`).
    pub(crate) fn can_inplace(self) -> bool {
        matches!(
            self,
            Op::Scale
                | Op::Add
                | Op::Mul
                | Op::Div
                | Op::Rope
                | Op::RmsNorm
                | Op::Clamp
                | Op::SoftMax
        )
    }

    /// `ggml_is_view_op`: skipped by the scheduler's passes.
    pub(crate) fn is_view_op(self) -> bool {
        matches!(self, Op::Reshape | Op::View | Op::Permute)
    }
}

/// Element types (their size in bytes; q8_0 as 34 bytes a block of 32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ty {
    F32,
    F16,
    I32,
    I64,
}

impl Ty {
    fn size(self) -> usize {
        match self {
            Ty::F32 | Ty::I32 => 4,
            Ty::F16 => 2,
            Ty::I64 => 8,
        }
    }
}

/// Where a tensor's memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Home {
    /// Allocated by the graph allocator.
    Graph,
    /// A weight in a buffer of backend `b` (the scheduler runs ops on their weights' backend).
    Weight(usize),
    /// Other memory of backend `b` outside the graph (the KV cache).
    Cache(usize),
}

#[derive(Clone, Debug)]
pub(crate) struct Tensor {
    pub op: Op,
    pub ty: Ty,
    pub ne: [usize; 4],
    pub nb: [usize; 4],
    pub src: Vec<usize>,
    pub view_src: Option<usize>,
    /// A view's byte offset into its root (`view_offs`): only the CUDA backend's fusion
    /// matching reads it, ggml-alloc never places a view.
    pub offs: usize,
    pub input: bool,
    pub output: bool,
    pub home: Home,
    /// A backend llama.cpp sets before scheduling (`ggml_backend_sched_set_tensor_backend`).
    pub backend: Option<usize>,
    /// Bytes beyond `ggml_nbytes` the backend asks for (flash attention's f16 K/V copies).
    pub alloc_size: Option<usize>,
}

impl Tensor {
    /// `ggml_nbytes`.
    pub(crate) fn nbytes(&self) -> usize {
        if self.ne.contains(&0) {
            return 0;
        }
        let mut n = self.ty.size();
        for i in 0..4 {
            n += (self.ne[i] - 1) * self.nb[i];
        }
        n
    }

    /// `ggml_backend_buft_get_alloc_size` on CUDA for the tensors modelled.
    pub(crate) fn alloc_size(&self) -> usize {
        self.alloc_size.unwrap_or_else(|| self.nbytes())
    }

    /// `ggml_is_contiguous`: rows packed one after the other (dimensions of one skipped).
    pub(crate) fn is_contiguous(&self) -> bool {
        if self.ne[0] != 1 && self.nb[0] != self.ty.size() {
            return false;
        }
        let mut next = self.ty.size() * self.ne[0];
        for i in 1..4 {
            if self.ne[i] != 1 {
                if self.nb[i] != next {
                    return false;
                }
                next *= self.ne[i];
            }
        }
        true
    }
}

fn contiguous(ty: Ty, ne: [usize; 4]) -> [usize; 4] {
    let mut nb = [ty.size(), 0, 0, 0];
    for i in 1..4 {
        nb[i] = nb[i - 1] * ne[i - 1];
    }
    nb
}

/// A graph under construction: tensors, and the nodes and leafs expanded so far.
#[derive(Default)]
pub(crate) struct Ctx {
    pub t: Vec<Tensor>,
    pub nodes: Vec<usize>,
    pub leafs: Vec<usize>,
    visited: Vec<bool>,
}

impl Ctx {
    fn push(&mut self, t: Tensor) -> usize {
        self.t.push(t);
        self.visited.push(false);
        self.t.len() - 1
    }

    /// A new contiguous tensor.
    pub(crate) fn new_tensor(&mut self, home: Home, ty: Ty, ne: [usize; 4]) -> usize {
        self.push(Tensor {
            op: Op::None,
            ty,
            ne,
            nb: contiguous(ty, ne),
            src: vec![],
            view_src: None,
            offs: 0,
            input: false,
            output: false,
            home,
            backend: None,
            alloc_size: None,
        })
    }

    /// A graph input (`ggml_set_input`).
    pub(crate) fn input(&mut self, ty: Ty, ne: [usize; 4]) -> usize {
        let i = self.new_tensor(Home::Graph, ty, ne);
        self.t[i].input = true;
        i
    }

    /// An op's result: a new contiguous tensor of `ty` and `ne`.
    pub(crate) fn op(&mut self, op: Op, ty: Ty, ne: [usize; 4], src: &[usize]) -> usize {
        let i = self.new_tensor(Home::Graph, ty, ne);
        self.t[i].op = op;
        self.t[i].src = src.to_vec();
        i
    }

    /// An op of `a`'s shape (`ggml_dup_tensor`: contiguous whatever `a`'s strides).
    pub(crate) fn unary(&mut self, op: Op, a: usize, src: &[usize]) -> usize {
        let (ty, ne) = (self.t[a].ty, self.t[a].ne);
        self.op(op, ty, ne, src)
    }

    /// `ggml_mul_mat(w, x)`: f32, `w`'s rows by `x`'s columns.
    pub(crate) fn mul_mat(&mut self, w: usize, x: usize) -> usize {
        let (a, b) = (self.t[w].ne, self.t[x].ne);
        self.op(Op::MulMat, Ty::F32, [a[1], b[1], b[2], b[3]], &[w, x])
    }

    /// A view of `a` (the root of `a`'s views, as ggml records it, at `a`'s offset), sources `[a]`.
    pub(crate) fn view(&mut self, op: Op, a: usize, ne: [usize; 4], nb: [usize; 4]) -> usize {
        let root = self.t[a].view_src.unwrap_or(a);
        let (ty, offs) = (self.t[a].ty, self.t[a].offs);
        let i = self.new_tensor(Home::Graph, ty, ne);
        let t = &mut self.t[i];
        t.op = op;
        t.nb = nb;
        t.src = vec![a];
        t.view_src = Some(root);
        t.offs = offs;
        i
    }

    /// A view of `a` at byte `offs` into it (`ggml_view_*`): the offset adds up to the root's.
    pub(crate) fn view_at(
        &mut self,
        a: usize,
        ne: [usize; 4],
        nb: [usize; 4],
        offs: usize,
    ) -> usize {
        let i = self.view(Op::View, a, ne, nb);
        self.t[i].offs += offs;
        i
    }

    /// `ggml_mul_mat_id(w, x, ids)`: f32, `w`'s rows by each token's routed experts.
    pub(crate) fn mul_mat_id(&mut self, w: usize, x: usize, ids: usize) -> usize {
        let (rows, used, tokens) = (self.t[w].ne[1], self.t[ids].ne[0], self.t[x].ne[2]);
        self.op(Op::MulMatId, Ty::F32, [rows, used, tokens, 1], &[w, x, ids])
    }

    /// `ggml_reshape_*` of a contiguous `a`.
    pub(crate) fn reshape(&mut self, a: usize, ne: [usize; 4]) -> usize {
        let nb = contiguous(self.t[a].ty, ne);
        self.view(Op::Reshape, a, ne, nb)
    }

    /// `ggml_permute(a, 0, 2, 1, 3)`.
    pub(crate) fn permute_0213(&mut self, a: usize) -> usize {
        let (ne, nb) = (self.t[a].ne, self.t[a].nb);
        self.view(
            Op::Permute,
            a,
            [ne[0], ne[2], ne[1], ne[3]],
            [nb[0], nb[2], nb[1], nb[3]],
        )
    }

    /// `ggml_build_forward_expand`.
    pub(crate) fn expand(&mut self, i: usize) {
        if self.visited[i] {
            return;
        }
        self.visited[i] = true;
        for k in 0..self.t[i].src.len() {
            let s = self.t[i].src[k];
            self.expand(s);
        }
        if self.t[i].op == Op::None {
            self.leafs.push(i);
        } else {
            self.nodes.push(i);
        }
    }
}
