"""The timing the PyTorch baselines share with the Rust benchmarks: CUDA events around each
call, 3 warm-up calls, the median of 20, in milliseconds."""
import torch


def median_ms(run):
    for _ in range(3):
        run()
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]
