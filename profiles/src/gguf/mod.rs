//! GGUF files: a model's architecture, shape, tensor types and exact weight bytes, read from
//! the file's header and tensor infos (never the weights: a file of any size is read up to
//! its last tensor info), and mapped to the profiles' model description.
//!
//! ```no_run
//! use cupool_profiles::gguf::GgufModel;
//! let m = GgufModel::read("model.gguf")?;
//! let model = m.to_model(); // the profiles' EngineModel
//! println!("{} weights: {} bytes, mostly {}", m.arch.name(), m.weight_bytes, m.weight_type.name());
//! # Ok::<(), cupool_profiles::gguf::GgufError>(())
//! ```
//!
//! The architectures mapped are those the profiles model ([`SUPPORTED_ARCHS`]); others are
//! [`GgufError::UnsupportedArch`]. A file's bytes are never trusted: every count and length is
//! checked against the bytes left and a bound below before anything is allocated for it, so a
//! bad file is an error in bounded memory, never a panic.

mod arch;
mod error;
mod file;
mod metadata;
mod model;
mod reader;
mod shape;
mod tensor;
mod types;
mod value;

pub use arch::GgufArch;
pub use error::GgufError;
pub use file::GgufFile;
pub use model::GgufModel;
pub use tensor::TensorInfo;
pub use types::GgmlType;
pub use value::{Value, ValueType};

/// The `general.architecture` names mapped.
pub const SUPPORTED_ARCHS: [&str; 5] = ["llama", "phi3", "qwen3", "qwen3moe", "deepseek2"];

/// The most bytes a header (metadata and tensor infos) may take.
pub const MAX_HEADER_BYTES: u64 = 1 << 30;
/// The longest metadata key (the GGUF spec's limit).
const MAX_KEY_BYTES: u64 = 65_535;
/// The longest string value (a chat template, a token).
const MAX_STRING_BYTES: u64 = 16 << 20;
/// The longest tensor name (ggml's `GGML_MAX_NAME`, less its terminating zero).
const MAX_TENSOR_NAME_BYTES: u64 = 63;
/// The most tensors.
const MAX_TENSORS: u64 = 1 << 20;
/// The most metadata pairs.
const MAX_KV: u64 = 1 << 20;
/// The most dimensions of a tensor (ggml's `GGML_MAX_DIMS`).
const MAX_DIMS: usize = 4;
/// How deep arrays may nest (an array of arrays is the deepest).
const MAX_ARRAY_DEPTH: usize = 2;
