//! The C API's tests: they run as unit tests because the library builds only a shared and a
//! static library (no Rust library, whose file name would collide with the `cupool` crate's).

mod api;
mod deferred;
mod ggml_stream;
mod header;
mod history;
mod registered;
mod settings;
mod sleep;
mod threads;
mod timing;
