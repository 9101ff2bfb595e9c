"""The memory history and snapshot with cupool installed as PyTorch's allocator: tensor work on
the default stream and a side stream and under a tag, then the snapshot checked (every live
tensor an active block of a segment, the blocks tiling each segment, the history's events with
their streams) and read by PyTorch's own tools (`python -m torch.cuda._memory_viz trace_plot`,
`segment_plot`, `stats`, `trace`). What PyTorch's own `torch.cuda.memory._snapshot()` gives is
printed.
Usage: python3 torch_memory_viz.py OUT_DIR"""
import os
import pickle
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import cupool  # noqa: E402
import cupool.torch  # noqa: E402
import torch  # noqa: E402

out_dir = sys.argv[1]
cupool.torch.install(pool=os.environ.get("POOL", "vmm"))
cupool.torch.record_memory_history(max_entries=100_000)

x = torch.randn(2048, 2048, device="cuda")
y = x @ x
del x
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    s = torch.ones(1 << 20, device="cuda") * 3
side.synchronize()
with cupool.torch.tag("weights"):
    model = torch.nn.Linear(1024, 1024).cuda()
out = model(torch.randn(64, 1024, device="cuda"))
out.sum().backward()
torch.cuda.synchronize()

path = os.path.join(out_dir, "snapshot.pickle")
snap = cupool.torch.dump_snapshot(path)
with open(path, "rb") as f:
    assert pickle.load(f) == snap

active = {}
for seg in snap["segments"]:
    at = seg["address"]
    for b in seg["blocks"]:
        assert b["address"] == at, b
        if b["state"] == "active_allocated":
            active[b["address"]] = b
        at += b["size"]
    assert at == seg["address"] + seg["total_size"], "the blocks tile the segment"
for t in [y, s, out, model.weight, model.bias, model.weight.grad]:
    ptr = t.untyped_storage().data_ptr()
    assert ptr in active, f"tensor at {ptr:#x} is not an active block"
    assert active[ptr]["requested_size"] >= t.untyped_storage().nbytes()
assert {"name": "tag weights", "filename": "cupool", "line": 0} in active[model.weight.data_ptr()]["frames"]
trace = snap["device_traces"][torch.cuda.current_device()]
actions = {e["action"] for e in trace}
assert {"alloc", "free_requested", "free_completed"} <= actions, actions
assert "segment_map" in actions or "segment_alloc" in actions, actions
streams = {e["stream"] for e in trace if e["action"] == "alloc"}
assert side.cuda_stream in streams, (side.cuda_stream, streams)
print(f"{len(snap['segments'])} segments, {len(active)} live blocks, {len(trace)} events, "
      f"streams {sorted(streams)}")
try:  # what PyTorch's own snapshot makes of a plug-in: nothing, or a refusal
    native = f"{len(torch.cuda.memory._snapshot()['segments'])} segments"
except Exception as e:  # noqa: BLE001 (reported, not needed)
    native = f"an error: {str(e).splitlines()[0] if str(e) else e!r}"
print(f"torch.cuda.memory._snapshot() gives {native}")

for cmd in ("trace_plot", "segment_plot"):
    html = os.path.join(out_dir, f"{cmd}.html")
    subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", cmd, path, "-o", html], check=True)
    with open(html) as f:
        assert "snapshot.pickle" in f.read(), cmd
for cmd in ("stats", "trace"):
    text = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", cmd, path], check=True,
                          capture_output=True, text=True).stdout
    assert text.strip(), cmd
    print(text.splitlines()[0] if cmd == "trace" else text.split("Legend")[0])

cupool.torch.record_memory_history(None)
print("memory snapshot through torch: ok")
