//! The name of what is being allocated, for traces: a caller that knows (the runtime's
//! flash-attention scratch, a ggml op) sets it around its allocations on its thread, and the
//! [`Recorder`](super::Recorder) writes it beside each allocation. Nothing else reads it, so a
//! label costs one thread-local write when set and nothing when not.

use std::cell::Cell;

thread_local! {
    static CURRENT: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// The label set on this thread, if any.
pub fn current() -> Option<&'static str> {
    CURRENT.with(Cell::get)
}

/// Runs `f` with `name` as this thread's label, restoring the one before afterwards (labels
/// nest: the innermost names the allocation).
pub fn with<R>(name: &'static str, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<&'static str>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(Some(name))));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_nest_and_are_restored_even_on_unwind() {
        assert_eq!(current(), None);
        with("outer", || {
            assert_eq!(current(), Some("outer"));
            with("inner", || assert_eq!(current(), Some("inner")));
            assert_eq!(current(), Some("outer"));
            let r = std::panic::catch_unwind(|| with("boom", || panic!("x")));
            assert!(r.is_err());
            assert_eq!(current(), Some("outer"));
        });
        assert_eq!(current(), None);
        std::thread::spawn(|| assert_eq!(current(), None))
            .join()
            .unwrap();
    }
}
