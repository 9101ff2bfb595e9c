//! Why a GGUF file gave no model: it could not be read, its bytes are not a GGUF header this
//! reader accepts, or its metadata describes a model the profiles do not cover. Every message
//! says what was found and what is accepted.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// What was wrong with a GGUF file (or the bytes given as one).
#[derive(Debug)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened or read.
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// The header is not one this reader accepts: wrong magic or version, a count or length
    /// beyond the bytes left or a sane bound, a truncated file, a bad tensor shape.
    Malformed {
        /// Where in the file the bad field starts.
        offset: u64,
        /// What was found, and what is accepted.
        what: String,
    },
    /// A tensor's element type is not one whose block size this reader knows.
    UnknownType {
        /// The tensor.
        tensor: String,
        /// The ggml type id found.
        id: u32,
    },
    /// `general.architecture` names an architecture the profiles do not model.
    UnsupportedArch {
        /// The architecture the file names.
        arch: String,
    },
    /// A metadata key the mapping needs is absent, of the wrong type or out of range.
    Metadata {
        /// The key.
        key: String,
        /// What was found, and what is accepted.
        what: String,
    },
    /// The model is well formed but is not one the profiles model (its matmul weights'
    /// type, unequal K and V heads, ...).
    Unsupported(String),
}

impl GgufError {
    pub(crate) fn malformed(offset: u64, what: impl Into<String>) -> Self {
        Self::Malformed {
            offset,
            what: what.into(),
        }
    }

    pub(crate) fn metadata(key: impl Into<String>, what: impl Into<String>) -> Self {
        Self::Metadata {
            key: key.into(),
            what: what.into(),
        }
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { path, source } if path.as_os_str().is_empty() => {
                write!(f, "GGUF input: {source}")
            }
            Self::Io { path, source } => write!(f, "GGUF file {}: {source}", path.display()),
            Self::Malformed { offset, what } => {
                write!(f, "not a usable GGUF header (at byte {offset}): {what}")
            }
            Self::UnknownType { tensor, id } => write!(
                f,
                "tensor {tensor:?} has ggml type id {id}, whose block size is not known; known are {}",
                super::GgmlType::known_names()
            ),
            Self::UnsupportedArch { arch } => write!(
                f,
                "GGUF architecture {arch:?} is not modelled; supported are {}",
                super::SUPPORTED_ARCHS.join(", ")
            ),
            Self::Metadata { key, what } => write!(f, "GGUF metadata {key}: {what}"),
            Self::Unsupported(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for GgufError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
