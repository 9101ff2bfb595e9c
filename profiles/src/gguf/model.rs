//! A GGUF file as the profiles see it: its architecture, its model's shape, the type most of
//! its matrix weights have and its exact weight bytes.

use super::arch::GgufArch;
use super::error::GgufError;
use super::file::GgufFile;
use super::shape::engine_model;
use super::types::GgmlType;
use crate::model::EngineModel;
use crate::setup::{Device, Setup, Weights};
use cupool_kernels::KvType;
use std::collections::BTreeMap;
use std::path::Path;

/// A model read from a GGUF file's header.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufModel {
    /// Its architecture.
    pub arch: GgufArch,
    /// `general.name`, when the file gives one.
    pub name: Option<String>,
    /// The type most of its matrix weights' elements have (the matmul path it takes).
    pub weight_type: GgmlType,
    /// Every tensor's data bytes, summed: what its weights take in memory.
    pub weight_bytes: u64,
    /// The header it was read from.
    pub file: GgufFile,
    model: EngineModel,
}

impl GgufModel {
    /// Reads the model of the GGUF file at `path`, from its header only: a file of any size
    /// is read up to its last tensor info.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        Self::from_file(GgufFile::read(path)?)
    }

    /// The model of a GGUF file held in `bytes`: the whole file, or its start when `file_len`
    /// is the whole file's length.
    pub fn from_bytes(bytes: &[u8], file_len: u64) -> Result<Self, GgufError> {
        Self::from_file(GgufFile::from_bytes(bytes, file_len)?)
    }

    /// The model of a header already read.
    pub fn from_file(file: GgufFile) -> Result<Self, GgufError> {
        let arch = match file.get("general.architecture") {
            Some(v) => {
                let name = v.as_str().ok_or_else(|| {
                    GgufError::metadata(
                        "general.architecture",
                        format!("{}; accepted is a string", v.describe()),
                    )
                })?;
                GgufArch::parse(name).ok_or_else(|| GgufError::UnsupportedArch {
                    arch: name.to_string(),
                })?
            }
            None => {
                return Err(GgufError::metadata(
                    "general.architecture",
                    format!(
                        "absent; accepted is one of {}",
                        super::SUPPORTED_ARCHS.join(", ")
                    ),
                ))
            }
        };
        let model = engine_model(&file, arch)?;
        Ok(Self {
            arch,
            name: file
                .get("general.name")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            weight_type: matmul_type(&file)?,
            weight_bytes: file.tensor_bytes(),
            file,
            model,
        })
    }

    /// The profiles' description of the model. DeepSeek's `attn_max_batch_mib` (ik_llama.cpp's
    /// `-amb`, a run setting the file does not hold) is 256, as in the presets.
    pub fn to_model(&self) -> EngineModel {
        self.model.clone()
    }

    /// The profiles' weight type: f16 or q8_0 matrix weights; any other type is an error
    /// naming it (the profiles model those two matmul paths).
    pub fn weights(&self) -> Result<Weights, GgufError> {
        match self.weight_type {
            GgmlType::F16 => Ok(Weights::F16),
            GgmlType::Q8_0 => Ok(Weights::Q8_0),
            t => Err(GgufError::Unsupported(format!(
                "the matrix weights are mostly {}; the profiles model f16 and q8_0 weights",
                t.name()
            ))),
        }
    }

    /// What a profile is asked about for this file, with the cache's type and the device.
    pub fn to_setup(&self, kv: KvType, dev: Device) -> Result<Setup, GgufError> {
        Ok(Setup {
            model: self.to_model(),
            weights: self.weights()?,
            kv,
            dev,
        })
    }
}

/// The type most matrix-weight elements have. Matrix weights are the tensors of two or more
/// dimensions but the token embedding (a row lookup, not a matmul); a tie goes to the lower
/// type id.
fn matmul_type(file: &GgufFile) -> Result<GgmlType, GgufError> {
    let mut by_type: BTreeMap<GgmlType, u64> = BTreeMap::new();
    for t in &file.tensors {
        if t.dims.len() >= 2 && t.name != "token_embd.weight" {
            let n = by_type.entry(t.ty).or_default();
            *n = n.saturating_add(t.elements());
        }
    }
    let mut best: Option<(GgmlType, u64)> = None;
    for (ty, n) in by_type {
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((ty, n));
        }
    }
    best.map(|(ty, _)| ty).ok_or_else(|| {
        GgufError::Unsupported(format!(
            "no matrix weights among its {} tensors; accepted is a model file with its weights",
            file.tensors.len()
        ))
    })
}
