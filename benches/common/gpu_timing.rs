//! What the GPU benchmarks share: the device they run on, or why they skip, and the median time
//! of a call measured with CUDA events.
use cudarc::driver::{sys, CudaContext, CudaStream};
use std::sync::Arc;

/// Device 0, or `None` after printing why the benchmark `name` skips.
pub fn device(name: &str) -> Option<Arc<CudaContext>> {
    if !cupool::pool::driver::cuda::is_available() {
        println!("{name} bench skipped: it needs a CUDA GPU");
        return None;
    }
    match CudaContext::new(0) {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            println!("{name} bench skipped: no CUDA device ({e})");
            None
        }
    }
}

/// The median of 20 timings of `f` on `stream` (CUDA events around each call), after 3 warm-up
/// calls, in milliseconds.
pub fn median_ms(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, f: &dyn Fn()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut ms = Vec::new();
    for _ in 0..20 {
        let event = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .unwrap()
        };
        let (start, end) = (event(), event());
        start.record(stream).unwrap();
        f();
        end.record(stream).unwrap();
        end.synchronize().unwrap();
        ms.push(start.elapsed_ms(&end).unwrap() as f64);
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    ms[ms.len() / 2]
}
