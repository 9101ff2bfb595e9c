#!/usr/bin/env python3
"""Writes ggml/ik_llama.cpp.patch: the edits that put cupool's shim into ik_llama.cpp.

    python3 ggml/make-patch.py SOURCE.tar.gz > ggml/ik_llama.cpp.patch
    python3 ggml/make-patch.py --mainline GGML_CUDA.tar.gz > ggml/ggml-cuda-mainline.patch

Each edit is anchored on text that must occur exactly once in its file, so a change upstream
fails here, by name, instead of producing a patch that applies wrongly. The shim itself
(ggml-cupool.h, ggml-cupool.cu, cupool.h) is copied into ggml/src/ggml-cuda/ by
scripts/llama/build.sh; the patch only touches ik_llama.cpp's own files:

- ggml-cuda/common.cuh: includes the shim's header; a release count per backend context;
- ggml-cuda.cu: opens libcupool at start-up when GGML_POOL is set, makes
  new_pool_for_device return the shim's pool, names each op's pool allocations, and adds
  ggml_backend_cuda_ubatch_end() (the boundary), and recaptures CUDA graphs captured before pool
  memory went back to the driver;
- include/ggml-cuda.h: declares ggml_backend_cuda_ubatch_end();
- the flash-attention launchers: name their K/V conversion and split-KV buffers;
- src/llama.cpp: calls the boundary after each prefill ubatch of llama_decode_internal.

With --mainline, the same shim goes into mainline ggml's CUDA backend (the ggml-cuda sources
after PR #23907, whose pool interface is ik_llama.cpp's with a stream number): the pool hook, the
start-up check, the op names and the graph recapture. Mainline keeps CUDA graphs per backend context with no
registry of contexts, and its ubatch loop (llama-context.cpp) is not in those sources: the
boundary is not wired there.
"""
import difflib
import re
import sys
import tarfile
import tempfile
from pathlib import Path


def once(text: str, anchor: str, path: str) -> int:
    n = text.count(anchor)
    if n != 1:
        sys.exit(f"make-patch: {path}: expected the anchor once, found it {n} times:\n{anchor}")
    return text.index(anchor)


def insert_after(text: str, anchor: str, addition: str, path: str) -> str:
    at = once(text, anchor, path) + len(anchor)
    return text[:at] + addition + text[at:]


def insert_before(text: str, anchor: str, addition: str, path: str) -> str:
    at = once(text, anchor, path)
    return text[:at] + addition + text[at:]


CUDA_CU = "ggml/src/ggml-cuda.cu"


def edit_ggml_cuda(t: str) -> str:
    p = CUDA_CU
    t = insert_after(
        t,
        "    for (int id = 0; id < info.device_count; ++id) {\n"
        "        info.default_tensor_split[id] /= total_vram;\n"
        "    }\n",
        "\n    // cupool: with GGML_POOL set, open libcupool now, so that a bad setting stops the\n"
        "    // program at start-up rather than at the first allocation\n"
        "    ggml_cupool_startup();\n",
        p,
    )
    t = insert_after(
        t,
        "std::unique_ptr<ggml_cuda_pool> ggml_backend_cuda_context::new_pool_for_device(int device) {\n",
        "    if (ggml_cupool_enabled()) {\n"
        "        return ggml_cupool_new_pool(device, 0);\n"
        "    }\n",
        p,
    )
    t = insert_before(
        t,
        "// #define DEBUG_CUDA_MALLOC\n",
        "// cupool: the end of a prefill ubatch. The pools apply CUPOOL_PURGE after a synchronize;\n"
        "// graphs that captured memory given back are recaptured at their next use (graph_compute).\n"
        "extern \"C\" GGML_CALL size_t ggml_backend_cuda_ubatch_end(void) {\n"
        "    return ggml_cupool_ubatch_end();\n"
        "}\n\n",
        p,
    )
    t = insert_after(
        t,
        "    bool use_cuda_graph = !disable_cuda_graphs_due_to_env && cuda_ctx->use_cuda_graph;\n",
        "\n"
        "    // cupool: memory of this device's pools went back to the driver since the last compute\n"
        "    // (a ubatch-boundary purge, a trim before an out-of-memory retry): a graph captured\n"
        "    // before then may hold freed pool addresses. Its properties are forgotten, so its next\n"
        "    // use recaptures it and updates the executable in place; dropping the graphs instead\n"
        "    // would re-instantiate them and forget which ones ggml had disabled.\n"
        "    if (ggml_cupool_graphs_stale(cuda_ctx->device, &cuda_ctx->cupool_releases)) {\n"
        "        for (auto & kv : cuda_ctx->cuda_graphs) {\n"
        "            kv.second->ggml_graph_properties.clear();\n"
        "        }\n"
        "    }\n",
        p,
    )
    t = insert_after(
        t,
        "static bool ggml_cuda_compute_forward(ggml_backend_cuda_context & ctx, struct ggml_tensor * dst, const ggml_cgraph * cgraph, int & i) {\n",
        "    GGML_CUPOOL_LABEL(ggml_op_desc(dst)); // names this op's pool allocations in a cupool trace\n",
        p,
    )
    return t


def common_edits(t: str, p: str) -> str:
    """common.cuh, the same in both engines: the shim's header, and a release count per backend
    context beside its CUDA graphs."""
    t = insert_before(
        t,
        "struct ggml_cuda_pool {\n",
        "#include \"ggml-cupool.h\" // cupool's pool shim (GGML_POOL)\n\n",
        p,
    )
    return insert_after(
        t,
        "    std::unordered_map<const void *, std::unique_ptr<ggml_cuda_graph>> cuda_graphs;\n",
        "    uint64_t cupool_releases = 0; // cupool's release count when the graphs were last checked\n",
        p,
    )


def edit_common(t: str) -> str:
    return common_edits(t, "ggml/src/ggml-cuda/common.cuh")


def edit_header(t: str) -> str:
    p = "ggml/include/ggml-cuda.h"
    return insert_after(
        t,
        "GGML_API GGML_CALL void ggml_backend_cuda_invalidate_graphs(const void * model);\n",
        "\n// cupool (GGML_POOL set): the end of a prefill ubatch; the pools apply CUPOOL_PURGE. Returns\n"
        "// the bytes given back to the driver (0 with ggml's own pools).\n"
        "GGML_API GGML_CALL size_t ggml_backend_cuda_ubatch_end(void);\n",
        p,
    )


def edit_llama(t: str) -> str:
    p = "src/llama.cpp"
    return insert_after(
        t,
        "        //fprintf(stderr, \"%s: invoking llama_graph_compute\\n\", __func__);\n"
        "        llama_graph_compute(lctx, gf, n_threads);\n",
        "#ifdef GGML_USE_CUDA\n"
        "        if (n_tokens > 1) {\n"
        "            ggml_backend_cuda_ubatch_end(); // cupool: purge at the prefill ubatch boundary\n"
        "        }\n"
        "#endif\n",
        p,
    )


# The pool buffers of the flash-attention launchers: `NAME.alloc(...)` on a line of its own.
FA_BUFFER = re.compile(r"^(\s*)(K_f16|V_f16|KV_max|KV_min_max|dst_tmp|dst_tmp_meta|q_data|dst_data|k_data|v_data)(\.alloc\(.*\);)\s*$")


def edit_fattn(t: str) -> str:
    out = []
    for line in t.split("\n"):
        m = FA_BUFFER.match(line)
        if m:
            indent, name, call = m.groups()
            line = f'{indent}{{ GGML_CUPOOL_LABEL("{name}"); {name}{call} }}'
        out.append(line)
    return "\n".join(out)


def mainline_edits() -> dict:
    cu = "src/ggml-cuda/ggml-cuda.cu"

    def edit_cu(t: str) -> str:
        t = insert_after(
            t,
            "    for (int id = 0; id < info.device_count; ++id) {\n"
            "        info.default_tensor_split[id] /= total_vram;\n"
            "    }\n",
            "\n    // cupool: with GGML_POOL set, open libcupool now (a bad setting stops start-up)\n"
            "    ggml_cupool_startup();\n",
            cu,
        )
        t = insert_after(
            t,
            "std::unique_ptr<ggml_cuda_pool> ggml_backend_cuda_context::new_pool_for_device(int                  device,\n"
            "                                                                               [[maybe_unused]] int stream_no) {\n",
            "    if (ggml_cupool_enabled()) {\n"
            "        return ggml_cupool_new_pool(device, stream_no);\n"
            "    }\n",
            cu,
        )
        t = insert_after(
            t,
            "    graph_key = ggml_cuda_graph_get_key(cgraph);\n",
            "\n"
            "    // cupool: memory of this device's pools went back to the driver since the last compute\n"
            "    // (a trim before an out-of-memory retry): a graph captured before then may hold freed\n"
            "    // pool addresses. Forgetting its properties runs it directly, then recaptures it and\n"
            "    // updates the executable in place.\n"
            "    if (ggml_cupool_graphs_stale(cuda_ctx->device, &cuda_ctx->cupool_releases)) {\n"
            "        for (auto & kv : cuda_ctx->cuda_graphs) {\n"
            "            kv.second->uid = 0;\n"
            "            kv.second->node_props.clear();\n"
            "            kv.second->warmup_complete = false;\n"
            "        }\n"
            "    }\n",
            cu,
        )
        return insert_after(
            t,
            "static bool ggml_cuda_compute_forward(ggml_backend_cuda_context & ctx, struct ggml_tensor * dst) {\n",
            "    GGML_CUPOOL_LABEL(ggml_op_desc(dst)); // names this op's pool allocations in a cupool trace\n",
            cu,
        )

    def edit_common(t: str) -> str:
        return common_edits(t, "src/ggml-cuda/common.cuh")

    return {cu: edit_cu, "src/ggml-cuda/common.cuh": edit_common}


def main() -> None:
    args = sys.argv[1:]
    mainline = args[:1] == ["--mainline"]
    if mainline:
        args = args[1:]
    if len(args) != 1:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as d:
        with tarfile.open(args[0]) as tar:
            tar.extractall(d, filter="data")
        root = Path(d)
        if mainline:
            write_diff(root, mainline_edits())
            return
        edits = {
            CUDA_CU: edit_ggml_cuda,
            "ggml/src/ggml-cuda/common.cuh": edit_common,
            "ggml/include/ggml-cuda.h": edit_header,
            "src/llama.cpp": edit_llama,
        }
        for f in sorted((root / "ggml/src/ggml-cuda").glob("fattn*.cu*")):
            if any(FA_BUFFER.match(line) for line in f.read_text().split("\n")):
                edits[str(f.relative_to(root))] = edit_fattn
        write_diff(root, edits)


def write_diff(root: Path, edits: dict) -> None:
    """Applies `edits` (path -> function of the text) under `root` and prints the unified diff."""
    for rel, edit in edits.items():
        before = (root / rel).read_text()
        after = edit(before)
        if after == before:
            sys.exit(f"make-patch: {rel}: the edit changed nothing")
        sys.stdout.writelines(
            difflib.unified_diff(
                before.splitlines(keepends=True),
                after.splitlines(keepends=True),
                fromfile=f"a/{rel}",
                tofile=f"b/{rel}",
            )
        )


if __name__ == "__main__":
    main()
