#!/usr/bin/env python3
"""Writes the patches that put cupool's shim into ik_llama.cpp and mainline llama.cpp.

    python3 ggml/make-patch.py IK_LLAMA.tar.gz > ggml/ik_llama.cpp.patch
    python3 ggml/make-patch.py --mainline LLAMA_CPP.tar.gz > ggml/llama.cpp.patch
    python3 ggml/make-patch.py [--mainline] --excerpt ggml/upstream/NAME.tar.gz TARBALL

--excerpt writes just the engine files a patch touches (unchanged), which the repository keeps
in ggml/upstream/ so that its tests check both patches without the engines' whole trees.

Each edit is anchored on text that must occur exactly once in its file, so a change upstream
fails here, by name, instead of producing a patch that applies wrongly. The shim itself
(ggml-cupool.h, ggml-cupool.cu, cupool.h) is copied into ggml/src/ggml-cuda/ by
scripts/llama/build.sh; the patches only touch the engines' own files.

ik_llama.cpp:
- ggml-cuda/common.cuh: includes the shim's header; a release count per backend context;
- ggml-cuda.cu: opens libcupool at start-up when GGML_POOL is set, makes
  new_pool_for_device return the shim's pool, names each op's pool allocations, and adds
  ggml_backend_cuda_ubatch_end() (the boundary), and recaptures CUDA graphs captured before pool
  memory went back to the driver;
- include/ggml-cuda.h: declares ggml_backend_cuda_ubatch_end() and the context's two memory
  lines;
- the flash-attention launchers: name their pool buffers;
- src/llama.cpp: calls the boundary after each prefill ubatch of llama_decode_internal, and
  the memory lines before the context's KV cache and after its compute buffers.

Mainline llama.cpp (after PR #23907; the pool interface is ik_llama.cpp's with a stream number):
the same pool hook, start-up check, op and buffer names and graph recapture, and
- the start-up hold: each CUDA backend context holds, from its creation to its first compute,
  the memory that compute takes outside every buffer (cuBLAS workspace, kernel modules), and a
  ggml buffer that does not fit prints cupool's report (what was needed, free, held, the context
  that fits);
- ggml_backend_cupool_ubatch_end / ggml_backend_cupool_context, reached through the CUDA
  registry's get_proc_address (so a backend loaded at run time works too);
- src/llama-context.cpp: announces each context's size before its buffers and calls the boundary
  after each prefill ubatch of llama_context::decode;
- fattn.cu, fattn-common.cuh: with CUPOOL_FA_KV=pool, flash attention's f16 copies of a quantized
  K/V cache come from the pool per call (as before PR #23907), not from the compute buffer.
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


def replace_once(text: str, anchor: str, replacement: str, path: str) -> str:
    at = once(text, anchor, path)
    return text[:at] + replacement + text[at + len(anchor):]


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
        "}\n\n"
        "// cupool: a context's buffers are about to be allocated, and are (memory lines).\n"
        "extern \"C\" GGML_CALL void ggml_backend_cuda_context_begin(uint32_t n_ctx) {\n"
        "    ggml_cupool_context(n_ctx);\n"
        "}\n\n"
        "extern \"C\" GGML_CALL void ggml_backend_cuda_context_end(void) {\n"
        "    ggml_cupool_context_ready();\n"
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
        "GGML_API GGML_CALL size_t ggml_backend_cuda_ubatch_end(void);\n"
        "\n// cupool (GGML_POOL set, CUPOOL_LOG=info): the free memory of each device before a context's\n"
        "// buffers (`model-loaded`) and after them (`context-created`).\n"
        "GGML_API GGML_CALL void ggml_backend_cuda_context_begin(uint32_t n_ctx);\n"
        "GGML_API GGML_CALL void ggml_backend_cuda_context_end(void);\n",
        p,
    )


def edit_llama(t: str) -> str:
    p = "src/llama.cpp"
    t = insert_after(
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
    t = insert_before(
        t,
        "        if (!llama_kv_cache_init(ctx->kv_self, ctx, type_k, type_v, params.idx_type_k, kv_size, cparams.offload_kqv,\n",
        "#ifdef GGML_USE_CUDA\n"
        "        ggml_backend_cuda_context_begin(cparams.n_ctx); // cupool: free memory before the buffers\n"
        "#endif\n",
        p,
    )
    return insert_after(
        t,
        "            LLAMA_LOG_INFO(\"%s: graph splits = %d\\n\", __func__, n_splits);\n",
        "#ifdef GGML_USE_CUDA\n"
        "            ggml_backend_cuda_context_end(); // cupool: free memory after them\n"
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
    """The shim in mainline llama.cpp (the whole tree: ggml/ and src/)."""
    cu = "ggml/src/ggml-cuda/ggml-cuda.cu"

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
            "    cudaError_t err = ggml_cuda_device_malloc(&dev_ptr, size, buft_ctx->device);\n",
            "    ggml_cupool_buffer(buft_ctx->device, size, err == cudaSuccess); // cupool: its start-up report\n",
            cu,
        )
        t = insert_after(
            t,
            "    graph_key = ggml_cuda_graph_get_key(cgraph);\n",
            "\n"
            "    // cupool: memory of this device's pools went back to the driver since the last compute\n"
            "    // (a ubatch-boundary purge, a trim before an out-of-memory retry): a graph captured\n"
            "    // before then may hold freed pool addresses. Forgetting its properties runs it directly,\n"
            "    // then recaptures it and updates the executable in place.\n"
            "    if (ggml_cupool_graphs_stale(cuda_ctx->device, &cuda_ctx->cupool_releases)) {\n"
            "        for (auto & kv : cuda_ctx->cuda_graphs) {\n"
            "            kv.second->uid = 0;\n"
            "            kv.second->node_props.clear();\n"
            "            kv.second->warmup_complete = false;\n"
            "        }\n"
            "    }\n",
            cu,
        )
        t = replace_once(
            t,
            "    ggml_cuda_graph_evaluate_and_capture(cuda_ctx, cgraph, use_cuda_graph, cuda_graph_update_required, graph_key);\n"
            "\n"
            "    return GGML_STATUS_SUCCESS;\n",
            "    // cupool: a pool allocation cupool cannot serve inside this compute throws (after printing\n"
            "    // its report) instead of aborting the process: end a capture in progress, forget the\n"
            "    // graph's properties and fail the compute, so llama_decode returns -2 and its caller\n"
            "    // decides (llama-server fails the batch's requests and goes on serving).\n"
            "    try {\n"
            "        ggml_cupool_oom_scope cupool_scope;\n"
            "        ggml_cuda_graph_evaluate_and_capture(cuda_ctx, cgraph, use_cuda_graph, cuda_graph_update_required, graph_key);\n"
            "    } catch (const ggml_cupool_oom &) {\n"
            "        cuda_ctx->curr_stream_no = 0;\n"
            "        if (use_cuda_graph && cuda_graph_update_required) {\n"
            "            cudaGraph_t partial = nullptr;\n"
            "            (void) cudaStreamEndCapture(cuda_ctx->stream(), &partial);\n"
            "            if (partial != nullptr) {\n"
            "                (void) cudaGraphDestroy(partial);\n"
            "            }\n"
            "            std::lock_guard<std::mutex> lock(ggml_cuda_lock);\n"
            "            if (ggml_cuda_lock_counter.fetch_sub(1, std::memory_order_relaxed) == 1) {\n"
            "                ggml_cuda_lock_cv.notify_all();\n"
            "            }\n"
            "        }\n"
            "        (void) cudaGetLastError();\n"
            "#ifdef USE_CUDA_GRAPH\n"
            "        ggml_cuda_graph * failed = cuda_ctx->cuda_graph(graph_key);\n"
            "        failed->uid = 0;\n"
            "        failed->node_props.clear();\n"
            "        failed->warmup_complete = false;\n"
            "#endif\n"
            "        return GGML_STATUS_ALLOC_FAILED;\n"
            "    }\n"
            "\n"
            "    return GGML_STATUS_SUCCESS;\n",
            cu,
        )
        t = insert_after(
            t,
            "static enum ggml_status ggml_backend_cuda_graph_compute(ggml_backend_t backend, ggml_cgraph * cgraph) {\n"
            "    ggml_backend_cuda_context * cuda_ctx = (ggml_backend_cuda_context *) backend->context;\n",
            "    cuda_ctx->cupool_hold.release(); // cupool: the first compute gets the memory held for it\n",
            cu,
        )
        t = insert_after(
            t,
            "static bool ggml_cuda_compute_forward(ggml_backend_cuda_context & ctx, struct ggml_tensor * dst) {\n",
            "    GGML_CUPOOL_LABEL(ggml_op_desc(dst)); // names this op's pool allocations in a cupool trace\n",
            cu,
        )
        t = insert_before(
            t,
            "static void * ggml_backend_cuda_reg_get_proc_address(ggml_backend_reg_t reg, const char * name) {\n",
            "// cupool (GGML_POOL set): the end of a prefill ubatch, where the pools apply CUPOOL_PURGE\n"
            "// (returns the bytes given back), and the context llama.cpp is about to allocate buffers for\n"
            "// (for cupool's start-up report). llama.cpp finds them through get_proc_address, so they\n"
            "// work with backends loaded at run time too.\n"
            "static size_t ggml_backend_cupool_ubatch_end(void) {\n"
            "    return ggml_cupool_ubatch_end();\n"
            "}\n\n"
            "static void ggml_backend_cupool_context(uint32_t n_ctx) {\n"
            "    ggml_cupool_context(n_ctx);\n"
            "}\n\n",
            cu,
        )
        t = insert_before(
            t,
            "    if (strcmp(name, \"ggml_backend_get_features\") == 0) {\n",
            "    if (strcmp(name, \"ggml_backend_cupool_ubatch_end\") == 0) {\n"
            "        return (void *)ggml_backend_cupool_ubatch_end;\n"
            "    }\n"
            "    if (strcmp(name, \"ggml_backend_cupool_context\") == 0) {\n"
            "        return (void *)ggml_backend_cupool_context;\n"
            "    }\n",
            cu,
        )
        return insert_after(
            t,
            "        GGML_LOG_ERROR(\"%s: failed to allocate context\\n\", __func__);\n"
            "        return nullptr;\n"
            "    }\n",
            "\n"
            "    // cupool: hold what the first compute takes outside ggml's buffers (GGML_POOL set), so\n"
            "    // that a context whose buffers leave no room for it fails now, not at that compute\n"
            "    if (!ctx->cupool_hold.take(device)) {\n"
            "        delete ctx;\n"
            "        return nullptr;\n"
            "    }\n",
            cu,
        )

    def edit_common(t: str) -> str:
        p = "ggml/src/ggml-cuda/common.cuh"
        t = common_edits(t, p)
        return insert_after(
            t,
            "    int curr_stream_no = 0;\n",
            "    ggml_cupool_hold cupool_hold; // cupool: held from creation to the first compute (GGML_POOL)\n",
            p,
        )

    def edit_context(t: str) -> str:
        p = "src/llama-context.cpp"
        t = insert_before(
            t,
            "llama_context::llama_context(\n",
            "// A function cupool's shim adds to ggml-cuda (GGML_POOL), or null: no CUDA backend, or one\n"
            "// without the shim. Looked up through the backend registry, like set_n_threads.\n"
            "static void * llama_cupool_fn(const char * name) {\n"
            "    ggml_backend_reg_t reg = ggml_backend_reg_by_name(\"CUDA\");\n"
            "    return reg ? ggml_backend_reg_get_proc_address(reg, name) : nullptr;\n"
            "}\n\n",
            p,
        )
        t = insert_before(
            t,
            "    // init the memory module\n",
            "    // cupool: the buffers allocated from here on are this context's (its start-up report)\n"
            "    if (auto * note = (void (*)(uint32_t)) llama_cupool_fn(\"ggml_backend_cupool_context\")) {\n"
            "        note(cparams.n_ctx);\n"
            "    }\n\n",
            p,
        )
        return insert_after(
            t,
            "        const auto * res = process_ubatch(ubatch, ctx_type_to_graph_type(cparams.ctx_type), mctx.get(), status);\n",
            "\n"
            "        // cupool: the end of a prefill ubatch; the pools apply CUPOOL_PURGE (GGML_POOL set)\n"
            "        if (ubatch.n_tokens > 1) {\n"
            "            static auto * ubatch_end = (size_t (*)(void)) llama_cupool_fn(\"ggml_backend_cupool_ubatch_end\");\n"
            "            if (ubatch_end) {\n"
            "                ubatch_end();\n"
            "            }\n"
            "        }\n",
            p,
        )

    def edit_server(t: str) -> str:
        p = "tools/server/server-context.cpp"
        t = insert_after(t, "#include <utility>\n", "#include <map> // cupool: the out-of-memory handling below\n", p)
        t = insert_before(
            t,
            "    // returns true = success ; false = retry with smaller batch size\n"
            "    // throw std::runtime_error on fatal error\n"
            "    bool decode(int32_t & n_batch, int32_t off) {\n",
            "    // cupool: an out-of-memory in a decode (llama_decode returned -2: a pool allocation or the\n"
            "    // compute buffer failed, and llama.cpp removed the failed ubatch's cells) fails only the\n"
            "    // request with the most tokens in the failed sub-batch. Every other request in the batch\n"
            "    // goes back to its first position in it (its cells from there on removed too) and is\n"
            "    // decoded again in the next round; upstream fails them all.\n"
            "    bool cupool_batch_dropped = false;\n"
            "\n"
            "    bool cupool_fail_largest(int32_t off, int32_t n_view) {\n"
            "        std::map<int32_t, int32_t>   in_view; // slot -> its tokens in the failed sub-batch\n"
            "        std::map<int32_t, llama_pos> first;   // slot -> its first position from there on\n"
            "        for (int32_t i = off; i < (int32_t) batch.tokens.size(); ++i) {\n"
            "            const auto & tok = batch.tokens[i];\n"
            "            if (i < off + n_view) {\n"
            "                in_view[tok.id_slot]++;\n"
            "            }\n"
            "            auto it = first.find(tok.id_slot);\n"
            "            if (it == first.end() || tok.pos < it->second) {\n"
            "                first[tok.id_slot] = tok.pos;\n"
            "            }\n"
            "        }\n"
            "        if (in_view.empty()) {\n"
            "            return false;\n"
            "        }\n"
            "        int32_t victim = in_view.begin()->first;\n"
            "        for (const auto & [id, n] : in_view) {\n"
            "            if (n > in_view[victim]) {\n"
            "                victim = id;\n"
            "            }\n"
            "        }\n"
            "        auto * mem = llama_get_memory(ctx_tgt);\n"
            "        for (auto & slot : slots) {\n"
            "            const auto f = first.find(slot.id);\n"
            "            if (f == first.end()) {\n"
            "                continue;\n"
            "            }\n"
            "            if (slot.id == victim || slot.can_speculate()) {\n"
            "                SRV_ERR(\"out of device memory: failing the request of slot %d (%d tokens in the failed sub-batch)\\n\",\n"
            "                        slot.id, in_view.count(slot.id) ? in_view[slot.id] : 0);\n"
            "                send_error(slot, \"out of device memory while decoding this request (the server log has the allocator's report)\", ERROR_TYPE_SERVER);\n"
            "                slot.release();\n"
            "                llama_memory_seq_rm(mem, slot.id, -1, -1);\n"
            "                slot.prompt_clear();\n"
            "                continue;\n"
            "            }\n"
            "            SRV_WRN(\"out of device memory: slot %d goes back to position %d and is decoded again\\n\", slot.id, f->second);\n"
            "            llama_memory_seq_rm(mem, slot.id, f->second, -1);\n"
            "            slot.prompt.tokens.keep_first(f->second);\n"
            "            slot.i_batch = -1;\n"
            "            if (slot.state == SLOT_STATE_DONE_PROMPT) {\n"
            "                slot.state = SLOT_STATE_PROCESSING_PROMPT;\n"
            "            }\n"
            "        }\n"
            "        return true;\n"
            "    }\n"
            "\n",
            p,
        )
        t = insert_before(
            t,
            "                if (ret < -1) {\n"
            "                    // TODO: update slot state based on llama_memory_seq_pos_min() and llama_memory_seq_pos_max()\n",
            "                if (ret == -2 && cupool_fail_largest(off, batch.view.size())) {\n"
            "                    cupool_batch_dropped = true; // cupool: the others go again next round\n"
            "                    return true;\n"
            "                }\n"
            "\n",
            p,
        )
        return insert_after(
            t,
            "                bool ok = decode(n_batch, off);\n",
            "                if (cupool_batch_dropped) { // cupool: one request failed, the rest go again next round\n"
            "                    cupool_batch_dropped = false;\n"
            "                    break;\n"
            "                }\n",
            p,
        )

    def edit_fattn_size(t: str) -> str:
        p = "ggml/src/ggml-cuda/fattn.cu"
        return insert_after(
            t,
            "size_t ggml_cuda_flash_attn_ext_get_alloc_size(int device, const ggml_tensor * dst) {\n"
            "    GGML_ASSERT(dst->op == GGML_OP_FLASH_ATTN_EXT);\n",
            "\n"
            "    // cupool (CUPOOL_FA_KV=pool): the f16 copies of K and V come from the pool in\n"
            "    // launch_fattn, so the compute buffer reserves no space for them\n"
            "    if (ggml_cupool_fa_kv_pool()) {\n"
            "        return ggml_nbytes(dst);\n"
            "    }\n",
            p,
        )

    def edit_fattn_launch(t: str) -> str:
        p = "ggml/src/ggml-cuda/fattn-common.cuh"
        t = insert_before(
            t,
            "    ggml_cuda_pool_alloc<int>    KV_max(pool);\n",
            "    // cupool (CUPOOL_FA_KV=pool): a quantized cache's f16 copies from the pool, sized by this\n"
            "    // call's KV length, rather than the compute buffer's space sized for the whole context.\n"
            "    // Declared first, so they go back last, as before PR #23907.\n"
            "    const bool cupool_kv_pool = ggml_cupool_fa_kv_pool();\n"
            "    ggml_cuda_pool_alloc<half> cupool_K_f16(pool);\n"
            "    ggml_cuda_pool_alloc<half> cupool_V_f16(pool);\n",
            p,
        )
        t = insert_after(
            t,
            "        half * K_f16 = (half *) f16_extra.K;\n",
            "        if (cupool_kv_pool) {\n"
            "            GGML_CUPOOL_LABEL(\"K_f16\");\n"
            "            K_f16 = cupool_K_f16.alloc(ggml_nelements(K));\n"
            "        }\n",
            p,
        )
        return insert_after(
            t,
            "            half * V_f16 = (half *) f16_extra.V;\n",
            "            if (cupool_kv_pool) {\n"
            "                GGML_CUPOOL_LABEL(\"V_f16\");\n"
            "                V_f16 = cupool_V_f16.alloc(ggml_nelements(V));\n"
            "            }\n",
            p,
        )

    return {cu: edit_cu, "ggml/src/ggml-cuda/common.cuh": edit_common, "src/llama-context.cpp": edit_context,
            "tools/server/server-context.cpp": edit_server, "ggml/src/ggml-cuda/fattn.cu": edit_fattn_size,
            "ggml/src/ggml-cuda/fattn-common.cuh": edit_fattn_launch}


def compose(first, second):
    """Both edits of one file, `first`'s before `second`'s."""
    return lambda t: second(first(t))


def main() -> None:
    args = sys.argv[1:]
    mainline = args[:1] == ["--mainline"]
    if mainline:
        args = args[1:]
    excerpt = None
    if args[:1] == ["--excerpt"] and len(args) == 3:
        excerpt, args = args[1], args[2:]
    if len(args) != 1:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as d:
        with tarfile.open(args[0]) as tar:
            tar.extractall(d, filter="data")
        root = Path(d)
        if mainline:
            edits = mainline_edits()
        else:
            edits = {
                CUDA_CU: edit_ggml_cuda,
                "ggml/src/ggml-cuda/common.cuh": edit_common,
                "ggml/include/ggml-cuda.h": edit_header,
                "src/llama.cpp": edit_llama,
            }
        for f in sorted((root / "ggml/src/ggml-cuda").glob("fattn*.cu*")):
            if any(FA_BUFFER.match(line) for line in f.read_text().split("\n")):
                rel = str(f.relative_to(root))
                edits[rel] = compose(edits[rel], edit_fattn) if rel in edits else edit_fattn
        if excerpt:
            write_excerpt(root, sorted(edits), excerpt)
        else:
            write_diff(root, edits)


def write_excerpt(root: Path, files: list, out: str) -> None:
    """Writes the engine's files the patch touches, unchanged, as a small tarball: the
    repository keeps these (ggml/upstream/) so that CI checks the patches without the engines'
    whole trees."""
    with tarfile.open(out, "w:gz") as tar:
        for rel in files:
            info = tar.gettarinfo(str(root / rel), arcname=rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(root / rel, "rb") as f:
                tar.addfile(info, f)


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
