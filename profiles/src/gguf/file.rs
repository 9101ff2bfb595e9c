//! A GGUF file's header: its version, metadata and tensor infos, read without touching the
//! tensor data. The layout (little-endian): `GGUF`, a u32 version, u64 tensor and metadata
//! counts, the metadata (key string, u32 value type, value), then each tensor's name, u32 rank,
//! u64 dimensions, u32 ggml type and u64 offset into the data section, which starts at the
//! next multiple of `general.alignment` (32 when absent).

use super::error::GgufError;
use super::metadata::read_value;
use super::reader::Bounded;
use super::tensor::{read_tensor_info, TensorInfo};
use super::value::{Value, ValueType};
use super::{MAX_HEADER_BYTES, MAX_KEY_BYTES, MAX_KV, MAX_TENSORS};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

/// The least bytes of one tensor info: name length, rank, one dimension, type and offset.
const MIN_TENSOR_INFO: u64 = 8 + 4 + 8 + 4 + 8;
/// The least bytes of one metadata pair: key length, value type and a one-byte value.
const MIN_KV: u64 = 8 + 4 + 1;
/// The data section's alignment when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;

/// A GGUF file's header.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufFile {
    /// The format version (2 or 3).
    pub version: u32,
    /// The metadata, by key.
    pub metadata: BTreeMap<String, Value>,
    /// The tensor infos, in file order.
    pub tensors: Vec<TensorInfo>,
    /// The data section's alignment.
    pub alignment: u64,
    /// Where the data section starts: the header region's size.
    pub data_offset: u64,
    /// The file's length.
    pub file_len: u64,
}

impl GgufFile {
    /// Reads the header of the GGUF file at `path` (the tensor data is not read).
    pub fn read(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        Self::parse(BufReader::new(file), len, path.to_path_buf())
    }

    /// Reads a header from `bytes`: a whole file, or its start when `file_len` (the whole
    /// file's length, at least `bytes.len()`) says how long the file is.
    pub fn from_bytes(bytes: &[u8], file_len: u64) -> Result<Self, GgufError> {
        if file_len < bytes.len() as u64 {
            return Err(GgufError::malformed(
                0,
                format!(
                    "a file length of {file_len} given for {} bytes; accepted is at least the bytes' length",
                    bytes.len()
                ),
            ));
        }
        Self::parse(bytes, file_len, PathBuf::new())
    }

    /// Reads a header from `reader`, which holds a file of `file_len` bytes from its start; it
    /// reads no byte past the last tensor info.
    pub fn from_reader(reader: impl Read, file_len: u64) -> Result<Self, GgufError> {
        Self::parse(reader, file_len, PathBuf::new())
    }

    fn parse(reader: impl Read, file_len: u64, path: PathBuf) -> Result<Self, GgufError> {
        let mut r = Bounded::new(reader, file_len.min(MAX_HEADER_BYTES), path);
        let magic = r.array::<4>("the magic")?;
        if &magic != b"GGUF" {
            return Err(GgufError::malformed(
                0,
                format!(
                    "the file starts with \"{}\"; accepted are GGUF files, which start with \"GGUF\"",
                    magic.escape_ascii()
                ),
            ));
        }
        let version = r.u32("the version")?;
        match version {
            2 | 3 => {}
            1 => {
                return Err(GgufError::malformed(
                    4,
                    "GGUF version 1 (32-bit counts); accepted are versions 2 and 3",
                ))
            }
            v if (1..=3).contains(&v.swap_bytes()) => {
                return Err(GgufError::malformed(
                    4,
                    "a big-endian GGUF file; accepted are little-endian files (versions 2 and 3)",
                ))
            }
            v => {
                return Err(GgufError::malformed(
                    4,
                    format!("GGUF version {v}; accepted are versions 2 and 3"),
                ))
            }
        }
        let n_tensors = r.u64("the tensor count")?;
        let n_kv = r.u64("the metadata count")?;
        for (n, max, what) in [
            (n_tensors, MAX_TENSORS, "tensors"),
            (n_kv, MAX_KV, "metadata pairs"),
        ] {
            if n > max {
                return Err(GgufError::malformed(
                    8,
                    format!("{n} {what}; accepted are at most {max}"),
                ));
            }
        }
        // Both counts are bounded above, so this does not overflow.
        r.need(
            n_tensors * MIN_TENSOR_INFO + n_kv * MIN_KV,
            "the tensor and metadata counts",
        )?;

        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let at = r.pos();
            let key = r.string(MAX_KEY_BYTES, "a metadata key")?;
            let value = read_value(&mut r, &key)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(GgufError::malformed(
                    at,
                    format!("metadata key {key:?} appears twice; accepted is each key once"),
                ));
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(Value::Int(ValueType::U32, a)) if *a > 0 && (*a as u64).is_power_of_two() => {
                *a as u64
            }
            Some(v) => {
                return Err(GgufError::metadata(
                    "general.alignment",
                    format!("{}; accepted is a u32 power of two", v.describe()),
                ))
            }
        };

        let mut tensors: Vec<TensorInfo> = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        for _ in 0..n_tensors {
            let at = r.pos();
            let info = read_tensor_info(&mut r, alignment)?;
            if !names.insert(info.name.clone()) {
                return Err(GgufError::malformed(
                    at,
                    format!(
                        "tensor {:?} appears twice; accepted is each name once",
                        info.name
                    ),
                ));
            }
            tensors.push(info);
        }
        let header_end = r.pos();
        let data_offset = header_end.next_multiple_of(alignment);
        for t in &tensors {
            let end = data_offset
                .checked_add(t.offset)
                .and_then(|s| s.checked_add(t.bytes));
            if end.is_none_or(|end| end > file_len) {
                return Err(GgufError::malformed(
                    header_end,
                    format!(
                        "tensor {:?}'s {} bytes at data offset {} end past the file's {file_len} bytes (a truncated file?); accepted are tensors inside the file",
                        t.name, t.bytes, t.offset
                    ),
                ));
            }
        }
        Ok(Self {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            file_len,
        })
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// A tensor's info.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The tensors' data bytes, summed (padding between tensors not counted).
    pub fn tensor_bytes(&self) -> u64 {
        // Each tensor lies inside the file (checked when read), but they may overlap.
        self.tensors
            .iter()
            .fold(0u64, |s, t| s.saturating_add(t.bytes))
    }
}
