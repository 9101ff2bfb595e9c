"""The Python package over libcupool on simulated cards (no GPU): configuration, stats, errors,
trim, recording a trace that repro-prefill replays, and eight threads.

Run: CUPOOL_LIB=target/release python3 -m pytest python/tests/test_sim.py
"""
import ctypes
import json
import os
import subprocess
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import cupool  # noqa: E402
from cupool import _lib  # noqa: E402

MIB = 1 << 20


@pytest.fixture
def sim():
    cupool.init(pool="vmm", device="sim", sim_gib=1, sim_devices=2)
    yield _lib.load()
    cupool.shutdown()


def alloc(lib, size, device=0, stream=0):
    actual = ctypes.c_size_t(0)
    p = lib.cupool_alloc(device, stream, size, ctypes.byref(actual))
    assert p, _lib.last_error()
    return p, actual.value


def test_importing_does_not_import_torch():
    code = f"import sys; sys.path.insert(0, {os.path.dirname(HERE)!r}); import cupool, cupool.torch, cupool.cupy; assert 'torch' not in sys.modules and 'cupy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_stats_trim_and_peaks(sim):
    a, actual = alloc(sim, 3 * MIB)
    assert actual >= 3 * MIB
    b, _ = alloc(sim, 512, stream=7)
    s = cupool.stats(0)
    assert s["allocated_bytes.all.current"] == 3 * MIB + 512
    assert s["cupool.pools"] == 2
    assert cupool.device_count() == 2
    _lib.check(sim.cupool_free(0, 0, a, 3 * MIB))
    assert cupool.trim(0) > 0
    s = cupool.stats(0)
    assert s["allocated_bytes.all.current"] == 512 and s["allocated_bytes.all.peak"] == 3 * MIB + 512
    cupool.reset_peaks()
    assert cupool.stats(0)["allocated_bytes.all.peak"] == 512
    _lib.check(sim.cupool_free(0, 7, b, 512))
    assert cupool.stats(-1)["allocation.all.freed"] == 2


def test_torch_style_statistics_keep_their_peaks_over_ubatch_boundaries(sim):
    """cupool.torch's memory_stats and friends, with torch.cuda's names and meanings: peaks
    restart only at reset_peak_memory_stats, not at an engine's ubatch boundary."""
    import cupool.torch as ct
    a, _ = alloc(sim, 3 * MIB)
    _lib.check(sim.cupool_free(0, 0, a, 3 * MIB))
    cupool.ubatch_end(0)
    s = ct.memory_stats(0)
    assert list(s) == sorted(s) and not any(k.startswith("cupool.") for k in s)
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                "reserved_bytes.all.peak", "active_bytes.all.current", "active_bytes.all.peak",
                "num_ooms", "num_alloc_retries", "num_device_alloc", "num_device_free"):
        assert key in s, key
    assert ct.memory_allocated(0) == 0 and ct.max_memory_allocated(0) == 3 * MIB
    assert ct.max_memory_reserved(0) >= 3 * MIB
    assert ct.memory_allocated("cuda:0") == 0 and ct.max_memory_allocated(None) == 3 * MIB
    ct.reset_peak_memory_stats(0)
    assert ct.max_memory_allocated(0) == 0
    assert ct.max_memory_reserved(0) == ct.memory_reserved(0)
    # Exact for the stream, not the sum of its size classes' own peaks (small and large requests
    # go to pools of their own): 512 KiB then 4 MiB, never held together, peak at 4 MiB.
    for size in (512 << 10, 4 * MIB):
        b, _ = alloc(sim, size)
        _lib.check(sim.cupool_free(0, 0, b, size))
    assert ct.max_memory_allocated(0) == 4 * MIB, ct.memory_stats(0)


def test_errors_say_what_was_wrong(sim):
    with pytest.raises(cupool.CupoolError, match="already initialised"):
        cupool.init(pool="legacy", device="sim")
    with pytest.raises(TypeError, match="accepted are fallback_managed"):
        cupool.config_string(pool="vmm", colour="red")
    p, _ = alloc(sim, MIB)
    with pytest.raises(cupool.CupoolError, match="size mismatch.*allocated with 1048576"):
        _lib.check(sim.cupool_free(0, 0, p, 5))
    _lib.check(sim.cupool_free(0, 0, p, MIB))
    with pytest.raises(cupool.CupoolError, match="freed already"):
        _lib.check(sim.cupool_free(0, 0, p, MIB))
    with pytest.raises(cupool.CupoolError, match="device 5 does not exist"):
        cupool.trim(5)
    # The simulated card has 1 GiB: a 2 GiB request is refused and the pool stays usable.
    assert not sim.cupool_alloc(0, 0, 2 << 30, None)
    assert "out of memory" in _lib.last_error().lower() or "no room" in _lib.last_error()
    q, _ = alloc(sim, MIB)
    _lib.check(sim.cupool_free(0, 0, q, MIB))


def test_an_open_library_takes_no_new_settings(sim):
    cupool.ensure_open(None, "vmm", None, {})  # what install() does when init() came first
    with pytest.raises(cupool.CupoolError, match="already open with another configuration"):
        cupool.ensure_open("legacy", "vmm", None, {})


def test_bad_configuration_names_the_accepted_values():
    with pytest.raises(cupool.CupoolError, match="accepted values are vmm, legacy, managed, torch, direct"):
        cupool.init(pool="fancy", device="sim")
    assert not cupool.is_initialized()


def test_settings_in_the_environment_reach_an_install(monkeypatch):
    """install() and init(pool=...) build a configuration string, which libcupool takes instead
    of the environment: the environment's settings must be in it (a keyword still wins)."""
    monkeypatch.setenv("CUPOOL_VMM_RECYCLE", "off")
    monkeypatch.setenv("CUPOOL_LIMIT_MIB", "512")
    monkeypatch.setenv("GGML_POOL", "legacy")
    pool, options = cupool.with_environment(None, {"limit_mib": 256})
    assert pool == "legacy"
    assert options == {"vmm_recycle": "off", "limit_mib": 256}
    assert cupool.with_environment("vmm", {})[0] == "vmm"
    monkeypatch.setenv("CUPOOL_LIMIT_MIB", "64")
    cupool.init(pool="vmm", device="sim", sim_gib=1)
    try:
        lib = _lib.load()
        p, _ = alloc(lib, 32 * MIB)
        assert p
        assert not lib.cupool_alloc(0, 0, 64 * MIB, ctypes.byref(ctypes.c_size_t())), "the limit from the environment"
        lib.cupool_free(0, 0, p, 32 * MIB)
    finally:
        cupool.shutdown()


def test_the_keywords_and_pool_kinds_are_the_settings_table():
    lib = _lib.load()
    lib.cupool_settings_json.restype, lib.cupool_settings_json.argtypes = ctypes.c_char_p, []
    table = json.loads(lib.cupool_settings_json())
    keywords = {s["keyword"]: s["name"] for s in table["settings"] if s["keyword"]}
    assert keywords.pop("pool") == "GGML_POOL"
    assert cupool.OPTIONS == keywords
    kinds = next(s["choices"] for s in table["settings"] if s["name"] == "GGML_POOL")
    import cupool.torch as cupool_torch
    for kind in kinds:
        for doc in (cupool.config_string.__doc__, cupool_torch.install.__doc__):
            assert kind in doc, f"{kind} is missing from {doc!r}"
        cupool.init(pool=kind, device="sim", sim_gib=1)
        cupool.shutdown()


def test_pytorch_entry_points_from_eight_threads(sim):
    errors = []

    def work(t):
        try:
            for i in range(300):
                size = 512 + 4096 * ((i * 7 + t) % 50)
                p = sim.cupool_torch_alloc(size, 0, t)
                assert p, _lib.last_error()
                sim.cupool_torch_free(p, size, 0, t)
                assert _lib.last_error() == ""
        except AssertionError as e:
            errors.append(str(e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    s = cupool.stats(0)
    assert s["allocation.all.allocated"] == s["allocation.all.freed"] == 2400
    assert s["cupool.pools"] == 8


def repro_prefill():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(HERE, "..", "..", "target"))
    path = os.path.join(target, "release", "repro-prefill")
    assert os.path.exists(path), f"{path} is missing: cargo build --release -p cupool-cli"
    return path


def test_a_recorded_trace_replays(sim, tmp_path):
    path = tmp_path / "t.jsonl"
    with cupool.record(path) as rec:
        for chunk in range(4):
            with cupool.phase(f"chunk {chunk}", prefill=True):
                kv, _ = alloc(sim, (chunk + 1) * 4 * MIB)
                tmp, _ = alloc(sim, 3 * MIB)
                _lib.check(sim.cupool_free(0, 0, tmp, 3 * MIB))
                if chunk:
                    _lib.check(sim.cupool_free(0, 0, old, chunk * 4 * MIB))  # noqa: F821
                old = kv
    assert rec.allocations == 8
    _lib.check(sim.cupool_free(0, 0, old, 16 * MIB))
    lines = [json.loads(l) for l in path.read_text().splitlines() if not l.startswith("#")]
    assert sum(1 for e in lines if e["op"] == "alloc") == 8
    assert sum(1 for e in lines if e["op"] == "phase_end" and e["prefill"]) == 4
    reports = {}
    for pool in ("vmm", "legacy", "torch"):
        out = subprocess.run([repro_prefill(), "replay", str(path), "--pool", pool, "--format", "json", "--quiet"],
                             capture_output=True, text=True, check=True).stdout
        reports[pool] = json.loads(out)
        assert reports[pool]["ooms"] == 0
        # At the last chunk: the old KV (12 MiB), the new one (16 MiB) and the temporary (3 MiB).
        assert reports[pool]["peak_live_bytes"] == 31 * MIB
    # PyTorch's policy by hand: the 4 and 8 MiB KV and the temporaries share one 20 MiB segment;
    # the 12 MiB KV (10 MiB or more) gets a segment of its own; the 16 MiB one then fits the
    # first segment again, whole once the 8 MiB KV is freed.
    assert reports["torch"]["peak_reserved_bytes"] == 32 * MIB
    assert reports["torch"]["driver_mallocs"] == 2


#: What the last ubatch of ``engine_prefill`` holds at once: its K and V.
LAST_UBATCH_LIVE = 2 * 24 * 768 * 1024


def engine_prefill(lib, ubatches=24, layers=4):
    """What a llama.cpp prefill asks of its pool, in miniature: per layer a fixed temporary, then
    K and V conversion buffers that grow with the KV length (by 6% a ubatch late in the run,
    past the legacy pool's 5% look-ahead), freed with the usable size as ggml frees; a ubatch
    boundary after each ubatch. Returns the bytes each boundary gave back and the highest reserve
    (read at each ubatch's end; a boundary does not restart the reported peaks)."""
    released, peak = [], 0
    for ub in range(ubatches):
        kv = (ub + 1) * 768 * 1024
        for _ in range(layers):
            actual = ctypes.c_size_t(0)
            tmp = lib.cupool_alloc_named(0, 0, 3 * MIB, ctypes.byref(actual), b"MUL_MAT")
            assert tmp, _lib.last_error()
            _lib.check(lib.cupool_free(0, 0, tmp, actual.value))
            k = lib.cupool_alloc_named(0, 0, kv, ctypes.byref(actual), b"K_f16")
            k_usable = actual.value
            v = lib.cupool_alloc_named(0, 0, kv, ctypes.byref(actual), b"V_f16")
            assert k and v, _lib.last_error()
            _lib.check(lib.cupool_free(0, 0, v, actual.value))
            _lib.check(lib.cupool_free(0, 0, k, k_usable))
        peak = max(peak, cupool.stats(0)["reserved_bytes.all.peak"])
        released.append(cupool.ubatch_end())
    return released, peak


@pytest.mark.parametrize("policy,headroom,card_gib", [
    ("never", None, 4), ("always", None, 4),
    ("auto", "inf", 4),      # returns what it can at every boundary
    ("auto", None, 4),       # the card has room: everything stays
    ("auto", None, 0.2),     # starts returning when the card runs short
])
def test_ubatch_boundaries_purge_and_the_replay_reproduces_the_run(policy, headroom, card_gib, tmp_path):
    cupool.init(pool="legacy", device="sim", sim_gib=card_gib, purge=policy, auto_headroom=headroom)
    try:
        lib = _lib.load()
        path = tmp_path / "engine.jsonl"
        with cupool.record(path):
            cupool.reset_peaks(-1)
            released, peak = engine_prefill(lib)
        s = cupool.stats(0)
    finally:
        cupool.shutdown()
    lines = [json.loads(l) for l in path.read_text().splitlines() if not l.startswith("#")]
    names = {e.get("name") for e in lines if e["op"] == "alloc"}
    assert names == {"MUL_MAT", "K_f16", "V_f16"}
    assert sum(1 for e in lines if e["op"] == "phase_end" and e["prefill"]) == 24
    if policy == "never":
        assert not any(released) and s["cupool.purges"] == 0
        # Every outgrown K/V buffer stays: the reserve is far above what one ubatch holds.
        assert s["reserved_bytes.all.current"] > 4 * LAST_UBATCH_LIVE
    elif policy == "auto":
        keeps = [e for e in lines if e["op"] == "keep"]
        assert len(keeps) == 24
        if headroom is None and card_gib == 4:
            # Never short of memory: no boundary returned anything, and the trace says so.
            assert not any(released) and all(e.get("all") for e in keeps)
            assert s["reserved_bytes.all.current"] > 4 * LAST_UBATCH_LIVE
        else:
            assert any(released) and not all(released)
            # Only what the last ubatch did not reuse went: at most its buffers and the new ones.
            assert s["reserved_bytes.all.current"] <= 3 * LAST_UBATCH_LIVE
        if card_gib < 1:
            # Room at first, then short now and then: the reserve climbs until the card is
            # short, the outgrown buffers go back, and it climbs again.
            assert all(e.get("all") for e in keeps[:4]) and not all(e.get("all") for e in keeps), keeps
            assert not any(released[:4]), released
            assert [bool(r) for r in released] == [not e.get("all") for e in keeps]
            assert s["num_alloc_retries"] == 0, s
    else:
        assert all(released) and s["cupool.cached_bytes.current"] == 0
    out = subprocess.run([repro_prefill(), "replay", str(path), "--pool", "legacy", "--purge", policy,
                          "--format", "json", "--quiet"], capture_output=True, text=True, check=True).stdout
    r = json.loads(out)
    # The replay builds its pool from the trace alone and purges at the recorded boundaries as
    # the library did (auto: with the keep lists the library wrote): the same reserve and the
    # same driver traffic.
    assert r["peak_reserved_bytes"] == peak, (r, peak)
    assert r["end_reserved_bytes"] == s["reserved_bytes.all.current"], (r, s)
    assert r["driver_mallocs"] == s["cupool.driver_allocations"], (r, s)
    assert r["driver_frees"] == s["cupool.driver_releases"], (r, s)


def test_purge_never_takes_no_out_of_memory_retry_and_says_so():
    cupool.init(pool="legacy", device="sim", sim_gib=0.05, purge="never")
    try:
        lib = _lib.load()
        a = lib.cupool_alloc(0, 0, 30 * MIB, None)
        assert a, _lib.last_error()
        _lib.check(lib.cupool_free(0, 0, a, 30 * MIB))
        assert not lib.cupool_alloc(0, 0, 40 * MIB, None)  # the 30 MiB buffer is stranded
        err = _lib.last_error()
        assert "CUPOOL_PURGE=never" in err and "stranded" in err, err
    finally:
        cupool.shutdown()
    cupool.init(pool="legacy", device="sim", sim_gib=0.05)  # auto: trims and retries
    try:
        lib = _lib.load()
        a = lib.cupool_alloc(0, 0, 30 * MIB, None)
        _lib.check(lib.cupool_free(0, 0, a, 30 * MIB))
        b = lib.cupool_alloc(0, 0, 40 * MIB, None)
        assert b, _lib.last_error()
        _lib.check(lib.cupool_free(0, 0, b, 40 * MIB))
    finally:
        cupool.shutdown()
    with pytest.raises(cupool.CupoolError, match="CUPOOL_PURGE=.*accepted values are never, always, auto"):
        cupool.init(pool="legacy", device="sim", purge="sometimes")


def test_tagged_memory_sleeps_alone_and_wakes_with_its_bytes(sim):
    with cupool.tag("weights"):
        assert cupool.current_tag() == "weights"
        w, _ = alloc(sim, 3 * MIB)
        with cupool.tag("kv_cache"):
            kv, _ = alloc(sim, 2 * MIB)
        assert cupool.current_tag() == "weights", "the outer tag comes back"
    assert cupool.current_tag() == ""
    plain, _ = alloc(sim, MIB)
    # The simulated card's addresses are host memory: write a pattern to read back.
    pattern = bytes(range(256)) * (3 * MIB // 256)
    ctypes.memmove(w, pattern, len(pattern))
    with pytest.raises(ValueError, match="not among the tags"):
        cupool.sleep("kv_cache", offload=["weights"])
    released = cupool.sleep(["weights", "kv_cache"], offload=["weights"])
    assert released >= 5 * MIB
    assert cupool.asleep_bytes("weights") >= 3 * MIB
    assert cupool.stats(0)["cupool.asleep_bytes.current"] == released
    with cupool.tag("weights"):
        assert not sim.cupool_alloc(0, 0, 64, None)
        assert "asleep" in _lib.last_error()
    assert cupool.wake(["weights", "kv_cache"]) == released
    assert ctypes.string_at(w, len(pattern)) == pattern
    assert cupool.asleep_bytes("weights") == 0
    for p, n in ((w, 3 * MIB), (kv, 2 * MIB), (plain, MIB)):
        _lib.check(sim.cupool_free(0, 0, p, n))
    with pytest.raises(cupool.CupoolError, match='ever tagged "nope"'):
        cupool.sleep("nope")


class _Backend:
    """A stand-in for ProcessGroupNCCL's registration calls."""

    def __init__(self, fail=False):
        self.calls, self.fail = [], fail

    def register_mem_pool(self, pool):
        self.calls.append("register")
        if self.fail:
            raise RuntimeError("NCCL says no")

    def deregister_mem_pool(self, pool):
        self.calls.append("deregister")


class _Pool:
    """A stand-in for a torch.cuda.MemPool: its id and the segments its snapshot lists."""

    id = (0, 42)

    def __init__(self, segments):
        self.segments = segments

    def snapshot(self, include_traces=True):
        return [{"address": a, "total_size": n, "device": 0, "segment_type": "large"} for a, n in self.segments]


def _torch_with_a_process_group(monkeypatch, backend, initialized=True):
    """A stand-in torch whose default process group has ``backend`` for CUDA (no GPU, no torch)."""
    import types
    group = types.SimpleNamespace(_get_backend=lambda device: backend)
    dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: initialized,
                                 distributed_c10d=types.SimpleNamespace(_get_default_group=lambda: group))
    torch = types.SimpleNamespace(__version__="stand-in", device=lambda *a: a, distributed=dist,
                                  cuda=types.SimpleNamespace(synchronize=lambda *a: None))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)


needs_register = pytest.mark.skipif(not hasattr(cupool, "register"), reason="this libcupool package has no cupool.register")


@needs_register
def test_register_mem_pool_pins_the_pools_segments_until_deregistered(sim, monkeypatch):
    """cupool.torch.register_mem_pool: NCCL's registration through the process group, and every
    segment pinned in libcupool; a segment PyTorch frees meanwhile stays until deregistration;
    a second call pins only what the pool gained."""
    import cupool.torch as ct
    backend = _Backend()
    _torch_with_a_process_group(monkeypatch, backend)
    a, _ = alloc(sim, 4 * MIB)
    b, _ = alloc(sim, 6 * MIB)
    pool = _Pool([(a, 4 * MIB), (b, 6 * MIB)])
    assert ct.register_mem_pool(pool) == 10 * MIB
    assert backend.calls == ["register"]
    assert cupool.registered_bytes(0) == 10 * MIB and ct.pinned_bytes(pool) == 10 * MIB
    # PyTorch empties its cache: the free of a registered segment is taken and deferred.
    sim.cupool_torch_free(a, 4 * MIB, 0, None)
    assert _lib.last_error() == ""
    cupool.trim(0)
    s = cupool.stats(0)
    assert s["allocated_bytes.all.current"] == 10 * MIB and s["reserved_bytes.all.current"] >= 10 * MIB, s
    # The pool grew (and no longer lists the freed segment): only the new segment is pinned.
    c, _ = alloc(sim, 2 * MIB)
    pool.segments = [(b, 6 * MIB), (c, 2 * MIB)]
    assert ct.register_mem_pool(pool) == 2 * MIB
    assert cupool.registered_bytes(0) == 12 * MIB
    assert ct.deregister_mem_pool(pool) == 12 * MIB
    assert backend.calls == ["register", "register", "deregister"]
    assert cupool.registered_bytes(0) == 0 and ct.pinned_bytes(pool) == 0
    assert cupool.stats(0)["allocated_bytes.all.current"] == 8 * MIB, "the deferred free is done"
    with pytest.raises(ValueError, match="not registered"):
        ct.deregister_mem_pool(pool)
    for p, n in ((b, 6 * MIB), (c, 2 * MIB)):
        _lib.check(sim.cupool_free(0, 0, p, n))


@needs_register
def test_register_mem_pool_undoes_its_pins_when_nccl_refuses(sim, monkeypatch):
    import cupool.torch as ct
    _torch_with_a_process_group(monkeypatch, _Backend(fail=True))
    a, _ = alloc(sim, 4 * MIB)
    pool = _Pool([(a, 4 * MIB)])
    with pytest.raises(RuntimeError, match="NCCL says no"):
        ct.register_mem_pool(pool)
    assert cupool.registered_bytes(0) == 0 and ct.pinned_bytes(pool) == 0
    with pytest.raises(ValueError, match="not registered"):
        ct.deregister_mem_pool(pool)
    _lib.check(sim.cupool_free(0, 0, a, 4 * MIB))


def test_register_mem_pool_says_what_is_missing(monkeypatch):
    import types
    import cupool.torch as ct
    _torch_with_a_process_group(monkeypatch, types.SimpleNamespace())
    with pytest.raises(RuntimeError, match="has no register_mem_pool"):
        ct.register_mem_pool(_Pool([]))
    _torch_with_a_process_group(monkeypatch, _Backend(), initialized=False)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ct.register_mem_pool(_Pool([]))


SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}


def snapshot_workload(lib):
    """Allocations on two streams and both devices, one named, one freed; returns the live ones."""
    cupool.record_memory_history(max_entries=1000)
    a, _ = alloc(lib, 3 * MIB)
    b, _ = alloc(lib, 4096, stream=7)
    name = ctypes.c_char_p(b"kv cache")
    c = lib.cupool_alloc_named(0, 0, 5 * MIB, None, name)
    assert c, _lib.last_error()
    d, _ = alloc(lib, MIB, device=1)
    _lib.check(lib.cupool_free(0, 0, a, 3 * MIB))
    return [(0, 7, b, 4096), (0, 0, c, 5 * MIB), (1, 0, d, MIB)]


def free_all(lib, live):
    for device, stream, p, n in live:
        _lib.check(lib.cupool_free(device, stream, p, n))
    cupool.record_memory_history(None)


@pytest.mark.parametrize("pool", ["vmm", "legacy"])
def test_memory_snapshot_is_pytorchs_format_and_pickles(tmp_path, pool):
    cupool.init(pool=pool, device="sim", sim_gib=1, sim_devices=2)
    lib = _lib.load()
    live = snapshot_workload(lib)
    try:
        from cupool import torch as cupool_torch  # the torch module's stand-ins need no torch
        snap = cupool_torch.dump_snapshot(str(tmp_path / "snap.pickle"))
        import pickle
        with open(tmp_path / "snap.pickle", "rb") as f:
            assert pickle.load(f) == snap
        assert len(snap["device_traces"]) == 2
        active = {}
        for seg in snap["segments"]:
            assert set(seg) == SEGMENT_KEYS, seg
            assert seg["is_expandable"] == (pool == "vmm")
            assert seg["segment_type"] in ("small", "large") and isinstance(seg["segment_pool_id"], tuple)
            at = seg["address"]
            for blk in seg["blocks"]:
                assert set(blk) == BLOCK_KEYS and blk["address"] == at, blk
                assert blk["state"] in ("active_allocated", "inactive")
                if blk["state"] == "active_allocated":
                    active[(seg["device"], blk["address"])] = (blk["requested_size"], blk["frames"])
                at += blk["size"]
            assert at == seg["address"] + seg["total_size"], "the blocks tile the segment"
        assert {k: v[0] for k, v in active.items()} == {(dev, p): n for dev, _, p, n in live}
        assert active[(0, live[1][2])][1] == [{"filename": "cupool", "line": 0, "name": "kv cache"}]
        trace = snap["device_traces"][0]
        assert all(set(e) == TRACE_KEYS for e in trace), trace
        actions = [e["action"] for e in trace]
        assert actions.count("alloc") == 3 and actions.count("free_completed") == 1, actions
        assert ("segment_map" if pool == "vmm" else "segment_alloc") in actions, actions
        assert {e["stream"] for e in trace if e["action"] == "alloc"} == {0, 7}
        times = [e["time_us"] for e in trace]
        assert times == sorted(times) and times[0] > 1_600_000_000_000_000, "µs since the epoch"
        one = cupool.memory_snapshot(1)
        assert {s["device"] for s in one["segments"]} == {1} and one["device_traces"][0] == []
    finally:
        free_all(lib, live)
        cupool.shutdown()
    assert cupool.record_memory_history is cupool.history.record_memory_history


def test_memory_history_settings_are_checked(sim):
    with pytest.raises(ValueError, match="accepted are"):
        cupool.record_memory_history("everything")
    with pytest.raises(ValueError, match="1 or more"):
        cupool.record_memory_history(max_entries=0)
    cupool.record_memory_history(max_entries=2)
    p, _ = alloc(sim, 4096)
    _lib.check(sim.cupool_free(0, 0, p, 4096))
    assert [e["action"] for e in cupool.memory_snapshot()["device_traces"][0]] == ["free_requested", "free_completed"]
    cupool.record_memory_history(max_entries=5, clear_history=True)
    assert cupool.memory_snapshot()["device_traces"][0] == []
    cupool.record_memory_history("state")  # PyTorch's "live blocks only": the history is off
    p, _ = alloc(sim, 4096)
    snap = cupool.memory_snapshot()
    assert snap["device_traces"][0] == [] and snap["segments"], snap
    _lib.check(sim.cupool_free(0, 0, p, 4096))
    with pytest.raises(cupool.CupoolError, match="device 5 does not exist"):
        cupool.memory_snapshot(5)


def test_memory_snapshot_needs_the_library_open():
    with pytest.raises(cupool.CupoolError, match="cupool_init") as e:
        cupool.memory_snapshot()
    assert e.value.status == _lib.NOT_INITIALIZED


@pytest.mark.parametrize("pool", ["vmm", "legacy"])
def test_pytorchs_memory_viz_reads_the_snapshot(tmp_path, pool):
    # PyTorch's own tools over a snapshot made on simulated cards (no GPU needed): its text
    # summaries check that the blocks add up, and its plots embed the snapshot for the viewer.
    pytest.importorskip("torch.cuda._memory_viz")
    cupool.init(pool=pool, device="sim", sim_gib=1, sim_devices=2)
    lib = _lib.load()
    live = snapshot_workload(lib)
    path = str(tmp_path / "snap.pickle")
    try:
        cupool.dump_snapshot(path)
    finally:
        free_all(lib, live)
        cupool.shutdown()
    for cmd in ("trace_plot", "segment_plot"):
        out = str(tmp_path / f"{cmd}.html")
        subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", cmd, path, "-o", out], check=True)
        with open(out) as f:
            assert "snapshot.pickle" in f.read()
    stats = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", path], check=True,
                           capture_output=True, text=True).stdout
    assert "total_reserved" in stats, stats
    trace = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace", path], check=True,
                           capture_output=True, text=True).stdout
    assert "Device 0" in trace and "del " in trace, trace
