//! A replay of ggml's graph allocator (`ggml/src/ggml-alloc.c` of mainline 0c1e5709) over a
//! graph's tensors: what `ggml_gallocr_reserve_n` leaves as each buffer's size.
//!
//! - [`DynAlloc`] is `ggml_dyn_tallocr` with one chunk (a CUDA buffer type reports no maximum
//!   size, so the first chunk never fills): free blocks kept sorted by offset, best fit over
//!   every block but the last (ties go to the later block), else the last block, which is
//!   endless; a freed range merges with the blocks it touches; `max_size`, the highest end any
//!   allocation reached, is the buffer's size.
//! - [`reserve`] is `ggml_gallocr_alloc_graph_impl`: leafs first, then the graph inputs, then
//!   the nodes in order; a node reuses a parent's memory when its op can run in place
//!   (`ggml_op_can_inplace`), the parent is this allocator's, not an output, of the same layout
//!   and has no other consumer left (a view parent only when it is its source's one view);
//!   a tensor is freed once its last consumer and its last view ran; outputs never are.

/// One buffer's dynamic allocator (`ggml_dyn_tallocr`, one chunk).
#[derive(Clone, Debug)]
pub struct DynAlloc {
    align: usize,
    /// Free blocks `(offset, size)`, sorted by offset; the last one is endless.
    blocks: Vec<(usize, usize)>,
    max_size: usize,
}

impl DynAlloc {
    /// An empty buffer with the given alignment (a power of two; 128 on CUDA).
    pub fn new(align: usize) -> Self {
        Self {
            align: align.max(1),
            // `MIN(max_buffer_size, SIZE_MAX/2)`: a CUDA buffer type has no maximum.
            blocks: vec![(0, usize::MAX / 2)],
            max_size: 0,
        }
    }

    fn aligned(&self, size: usize) -> usize {
        size.div_ceil(self.align) * self.align
    }

    /// The offset of `size` bytes (`ggml_dyn_tallocr_alloc`).
    pub fn alloc(&mut self, size: usize) -> usize {
        let size = self.aligned(size);
        let last = self.blocks.len() - 1;
        let mut best: Option<usize> = None;
        let mut best_size = usize::MAX;
        for (i, &(_, s)) in self.blocks[..last].iter().enumerate() {
            // `<=`: of equal fits ggml takes the later block.
            if s >= size && s <= best_size {
                best = Some(i);
                best_size = s;
            }
        }
        let i = best.unwrap_or(last);
        let offset = self.blocks[i].0;
        self.blocks[i].0 += size;
        self.blocks[i].1 -= size;
        if self.blocks[i].1 == 0 {
            self.blocks.remove(i);
        }
        self.max_size = self.max_size.max(offset + size);
        offset
    }

    /// Returns `size` bytes at `offset` (`ggml_dyn_tallocr_free_bytes`).
    pub fn free(&mut self, offset: usize, size: usize) {
        let size = self.aligned(size);
        for i in 0..self.blocks.len() {
            let (o, s) = self.blocks[i];
            if o + s == offset {
                self.blocks[i].1 += size;
                if i + 1 < self.blocks.len() && o + self.blocks[i].1 == self.blocks[i + 1].0 {
                    self.blocks[i].1 += self.blocks[i + 1].1;
                    self.blocks.remove(i + 1);
                }
                return;
            }
            if offset + size == o {
                self.blocks[i] = (offset, s + size);
                if i > 0 && self.blocks[i - 1].0 + self.blocks[i - 1].1 == offset {
                    self.blocks[i - 1].1 += self.blocks[i].1;
                    self.blocks.remove(i);
                }
                return;
            }
        }
        let at = self.blocks.partition_point(|&(o, _)| o < offset);
        self.blocks.insert(at, (offset, size));
    }

    /// The buffer's size: the highest end reached.
    pub fn max_size(&self) -> usize {
        self.max_size
    }
}

/// What the graph allocator sees of a tensor.
#[derive(Clone, Debug, Default)]
pub struct AllocTensor {
    /// `ggml_backend_buft_get_alloc_size`.
    pub size: usize,
    /// The tensor whose memory this one views (always the root, as ggml records it).
    pub view_src: Option<usize>,
    /// A view with op `GGML_OP_NONE` (the scheduler's dependency nodes): not counted as a view.
    pub op_none: bool,
    /// Sources, in order.
    pub src: Vec<usize>,
    /// `GGML_TENSOR_FLAG_INPUT`: allocated before the nodes.
    pub input: bool,
    /// `GGML_TENSOR_FLAG_OUTPUT`: never freed, never written over.
    pub output: bool,
    /// Already in a buffer of its own (weights, the KV cache).
    pub external: bool,
    /// Whether the op may write over its first fitting source (`ggml_op_can_inplace`).
    pub inplace: bool,
    /// Type, shape and strides (`ggml_are_same_layout`).
    pub layout: (u8, [usize; 4], [usize; 4]),
}

#[derive(Clone, Copy, Default)]
struct Hash {
    children: usize,
    views: usize,
    buffer: usize,
    offset: usize,
    allocated: bool,
}

/// A graph for [`reserve`]: tensors, then the nodes and the leafs in order with their buffer.
pub struct AllocGraph {
    /// Every tensor, indexed by the ids below.
    pub tensors: Vec<AllocTensor>,
    /// The nodes in execution order, each with its buffer.
    pub nodes: Vec<(usize, usize)>,
    /// The leafs, each with its buffer.
    pub leafs: Vec<(usize, usize)>,
}

struct Galloc<'a> {
    t: &'a [AllocTensor],
    h: Vec<Hash>,
    bufs: Vec<DynAlloc>,
}

impl Galloc<'_> {
    fn is_view(&self, i: usize) -> bool {
        self.t[i].view_src.is_some()
    }

    fn allocate(&mut self, i: usize, buffer: usize) {
        if self.t[i].external || self.h[i].allocated || self.is_view(i) {
            return;
        }
        self.h[i].allocated = true;
        if self.t[i].inplace {
            for &p in &self.t[i].src {
                let pt = &self.t[p];
                let out = pt.output || pt.view_src.is_some_and(|v| self.t[v].output);
                if !self.h[p].allocated || out || pt.layout != self.t[i].layout {
                    continue;
                }
                if self.h[p].children != 1 || self.h[p].views != 0 {
                    continue;
                }
                let owner = match pt.view_src {
                    Some(v) if self.h[v].views == 1 && self.h[v].children == 0 => v,
                    Some(_) => continue,
                    None => p,
                };
                self.h[i].buffer = self.h[owner].buffer;
                self.h[i].offset = self.h[owner].offset;
                self.h[p].allocated = false;
                self.h[owner].allocated = false;
                // `ggml_gallocr_free_extra_space`: the parent's tail beyond the node's size.
                let b = self.h[owner].buffer;
                let (ps, ns) = (self.t[owner].size, self.t[i].size);
                let (ps, ns) = (self.bufs[b].aligned(ps), self.bufs[b].aligned(ns));
                if ps > ns {
                    self.bufs[b].free(self.h[owner].offset + ns, ps - ns);
                }
                return;
            }
        }
        self.h[i].buffer = buffer;
        self.h[i].offset = self.bufs[buffer].alloc(self.t[i].size);
    }

    fn free(&mut self, i: usize) {
        if self.t[i].output {
            return;
        }
        let b = self.h[i].buffer;
        self.bufs[b].free(self.h[i].offset, self.t[i].size);
        self.h[i].allocated = false;
    }
}

/// The size of each of `n_buffers` buffers (alignment `align`) after ggml-alloc placed `g`.
pub fn reserve(g: &AllocGraph, n_buffers: usize, align: usize) -> Vec<usize> {
    let mut a = Galloc {
        t: &g.tensors,
        h: vec![Hash::default(); g.tensors.len()],
        bufs: vec![DynAlloc::new(align); n_buffers],
    };
    for &(l, b) in &g.leafs {
        a.allocate(l, b);
    }
    for &(n, b) in &g.nodes {
        let t = &g.tensors[n];
        if let (Some(v), false) = (t.view_src, t.op_none) {
            a.h[v].views += 1;
        }
        if t.input {
            a.allocate(n, b);
        }
        for &s in &t.src {
            a.h[s].children += 1;
            if g.tensors[s].input {
                a.allocate(s, b);
            }
        }
    }
    for &(n, b) in &g.nodes {
        for &p in &g.tensors[n].src {
            a.allocate(p, b);
        }
        a.allocate(n, b);
        for &p in &g.tensors[n].src {
            a.h[p].children -= 1;
            if a.h[p].children != 0 || a.h[p].views != 0 {
                continue;
            }
            match g.tensors[p].view_src {
                Some(v) => {
                    a.h[v].views -= 1;
                    if a.h[v].views == 0 && a.h[v].children == 0 && a.h[v].allocated {
                        a.free(v);
                    }
                }
                None if a.h[p].allocated => a.free(p),
                None => {}
            }
        }
    }
    a.bufs.iter().map(DynAlloc::max_size).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_takes_the_smallest_fitting_hole_and_frees_merge() {
        let mut a = DynAlloc::new(128);
        let x = a.alloc(100); // 0..128
        let y = a.alloc(1000); // 128..1152
        let z = a.alloc(300); // 1152..1536
        let w = a.alloc(128); // 1536..1664
        assert_eq!((x, y, z, w), (0, 128, 1152, 1536));
        a.free(y, 1000);
        a.free(x, 100); // merges with y's hole: 0..1152
        a.free(w, 128); // at the end: merges with the endless block
        assert_eq!(a.blocks, vec![(0, 1152), (1536, usize::MAX / 2 - 1536)]);
        // 1152 bytes fit the hole exactly; a larger request goes to the end and raises max_size.
        assert_eq!(a.alloc(1200), 1536);
        assert_eq!(a.max_size(), 2816);
        assert_eq!(a.alloc(1152), 0);
        a.free(z, 300);
        assert_eq!(a.blocks.len(), 2, "z's hole alone below the new block");
    }

    #[test]
    fn of_two_equal_holes_the_later_one_is_taken() {
        let mut a = DynAlloc::new(128);
        let offs: Vec<usize> = (0..4).map(|_| a.alloc(128)).collect();
        a.free(offs[0], 128);
        a.free(offs[2], 128);
        assert_eq!(a.alloc(128), offs[2]);
        assert_eq!(a.max_size(), 512);
    }

    fn t(size: usize, src: &[usize]) -> AllocTensor {
        AllocTensor {
            size,
            src: src.to_vec(),
            layout: (0, [size, 1, 1, 1], [1, size, size, size]),
            ..AllocTensor::default()
        }
    }

    #[test]
    fn a_chain_runs_in_place_and_an_output_is_neither_reused_nor_freed() {
        // a -> b = op(a) in place -> c = op(b) in place: one block; d = op(c) not in place
        // above it; e reads c and d, in place over c (d ran: c has one consumer left).
        let mut ts = vec![t(256, &[]), t(256, &[0]), t(256, &[1]), t(256, &[2])];
        ts.push(t(256, &[2, 3]));
        for i in [1, 2, 4] {
            ts[i].inplace = true;
        }
        let mut g = AllocGraph {
            tensors: ts,
            nodes: (0..5).map(|i| (i, 0)).collect(),
            leafs: vec![],
        };
        assert_eq!(reserve(&g, 1, 128), vec![512]);
        // c an output: e goes over d instead (its one consumer), still two blocks.
        g.tensors[2].output = true;
        assert_eq!(reserve(&g, 1, 128), vec![512]);
        // d an output too: e needs a third block.
        g.tensors[3].output = true;
        assert_eq!(reserve(&g, 1, 128), vec![768]);
        // Not in place at all: a and b and c each a block while their reader runs... a is
        // freed once b ran, so b takes a block above a, c goes into a's hole.
        for t in &mut g.tensors {
            t.inplace = false;
            t.output = false;
        }
        assert_eq!(reserve(&g, 1, 128), vec![768]);
    }

    #[test]
    fn a_freed_tensor_s_hole_is_reused_best_fit() {
        // x (512) and y (256) live; z reads both, x is freed (a hole of 512 at 0); w (256)
        // goes into that hole, not to the end; v reads w and y.
        let ts = vec![
            t(512, &[]),
            t(256, &[]),
            t(128, &[0, 1]),
            t(256, &[2]),
            t(128, &[3, 1]),
        ];
        let g = AllocGraph {
            tensors: ts,
            nodes: (0..5).map(|i| (i, 0)).collect(),
            leafs: vec![],
        };
        // x 0..512, y 512..768, z 768..896; x freed; w at 0; z freed; v at 256 (the hole
        // left of y, 256 bytes, fits best).
        assert_eq!(reserve(&g, 1, 128), vec![896]);
    }
}
