//! Status codes, the thread-local error text, and the guard that keeps panics inside.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a call did. 0 is success; every other value comes with an error text.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CupoolStatus {
    /// Done.
    Ok = 0,
    /// An argument is out of range (a device, a size, a null pointer, a configuration value).
    InvalidArgument = 1,
    /// The device has no memory for the request.
    OutOfMemory = 2,
    /// The library is not initialised (or was shut down).
    NotInitialized = 3,
    /// A pointer cupool did not hand out on that device and stream, or one already freed.
    UnknownPointer = 4,
    /// A pointer freed with another size than it was allocated with.
    SizeMismatch = 5,
    /// A driver call failed.
    Driver = 6,
    /// A bug in cupool (a caught panic); the text says where.
    Internal = 7,
}

thread_local! {
    /// This thread's last failure text. Replaced only by the next failure, never freed by a
    /// success (`cupool_shutdown` included), so a pointer `cupool_last_error` returned stays
    /// readable until this thread's next failed call.
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
    /// Whether this thread's last call failed. No destructor: readable even while the
    /// thread's locals are being destroyed.
    static FAILED: Cell<bool> = const { Cell::new(false) };
}

/// An error: a status and its text.
#[derive(Debug)]
pub(crate) struct Failure {
    pub status: CupoolStatus,
    pub text: String,
}

impl Failure {
    pub fn new(status: CupoolStatus, text: impl Into<String>) -> Self {
        Self {
            status,
            text: text.into(),
        }
    }
}

impl Failure {
    /// The same failure, saying where it happened.
    pub fn context(mut self, at: impl std::fmt::Display) -> Self {
        self.text = format!("{at}: {}", self.text);
        self
    }
}

impl From<cupool_pool::PoolError> for Failure {
    fn from(e: cupool_pool::PoolError) -> Self {
        use cupool_pool::PoolError as E;
        let status = match &e {
            E::OutOfMemory(_) => CupoolStatus::OutOfMemory,
            E::Driver(_) => CupoolStatus::Driver,
            E::NoSuchDevice { .. } | E::InvalidSize { .. } | E::InvalidConfig(_) => {
                CupoolStatus::InvalidArgument
            }
            _ => CupoolStatus::InvalidArgument,
        };
        Self::new(status, e.to_string())
    }
}

impl From<cupool_pool::driver::DriverError> for Failure {
    fn from(e: cupool_pool::driver::DriverError) -> Self {
        Self::new(CupoolStatus::Driver, e.to_string())
    }
}

fn set_error(text: &str) {
    // An interior NUL would cut the text short; replace it rather than lose the message.
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    // `try_with`: a call from an exit handler runs after this thread's locals are destroyed;
    // `cupool_last_error` then says the text is gone (the call still failed).
    let _ = LAST_ERROR.try_with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            *e = Some(c);
        }
    });
    let _ = FAILED.try_with(|f| f.set(true));
}

/// Runs `f` with panics caught; a failure sets the error text and becomes `fail`'s value.
pub(crate) fn guard<T>(
    fail: impl FnOnce(CupoolStatus) -> T,
    f: impl FnOnce() -> Result<T, Failure>,
) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => {
            let _ = FAILED.try_with(|f| f.set(false));
            v
        }
        Ok(Err(failure)) => {
            tracing::debug!(status = ?failure.status, "{}", failure.text);
            set_error(&failure.text);
            fail(failure.status)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            tracing::error!("panic caught at the C boundary: {what}");
            set_error(&format!(
                "internal error (a bug in cupool; please report it): {what}"
            ));
            fail(CupoolStatus::Internal)
        }
    }
}

/// A status call: `CupoolStatus::Ok` or the failure's status.
pub(crate) fn status(f: impl FnOnce() -> Result<(), Failure>) -> CupoolStatus {
    guard(|s| s, || f().map(|()| CupoolStatus::Ok))
}

/// The text of the last failure on this thread ("" after a success). The text stays valid
/// until this thread's next failed call, or its exit: successful calls, `cupool_shutdown`
/// included, leave it in place.
#[no_mangle]
pub extern "C" fn cupool_last_error() -> *const c_char {
    if !FAILED.try_with(Cell::get).unwrap_or(false) {
        return c"".as_ptr();
    }
    LAST_ERROR
        .try_with(|e| {
            e.try_borrow()
                .ok()
                .and_then(|e| e.as_ref().map(|t| t.as_ptr()))
        })
        .ok()
        .flatten()
        .unwrap_or(c"(cupool: the error text is gone: this thread is exiting)".as_ptr())
}
