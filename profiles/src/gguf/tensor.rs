//! A tensor info: the tensor's name, shape, element type and where its data starts, checked
//! as it is read (a known type, whole blocks per row, a size that fits, an aligned offset).

use super::error::GgufError;
use super::reader::Bounded;
use super::types::GgmlType;
use super::{MAX_DIMS, MAX_TENSOR_NAME_BYTES};
use std::io::Read;

/// One tensor as its info describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Its dimensions, innermost first (ggml's `ne`): a matrix is `[columns, rows]`.
    pub dims: Vec<u64>,
    /// Its element type.
    pub ty: GgmlType,
    /// Where its data starts, from the start of the data section.
    pub offset: u64,
    /// Its data's bytes (whole blocks of its type).
    pub bytes: u64,
}

impl TensorInfo {
    /// Its elements (the product of its dimensions).
    pub fn elements(&self) -> u64 {
        // Checked when the info was read: the product fits.
        self.dims.iter().product()
    }

    /// Its rows: the product of every dimension but the first.
    pub fn rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

/// One tensor info: name, rank, dimensions, type and data offset.
pub(crate) fn read_tensor_info<R: Read>(
    r: &mut Bounded<R>,
    alignment: u64,
) -> Result<TensorInfo, GgufError> {
    let at = r.pos();
    let name = r.string(MAX_TENSOR_NAME_BYTES, "a tensor name")?;
    let rank_at = r.pos();
    let rank = r.u32("a tensor's rank")?;
    if rank == 0 || rank as usize > MAX_DIMS {
        return Err(GgufError::malformed(
            rank_at,
            format!("tensor {name:?} has {rank} dimensions; accepted are 1 to {MAX_DIMS}"),
        ));
    }
    let mut dims = Vec::with_capacity(rank as usize);
    let mut elements: u64 = 1;
    for _ in 0..rank {
        let d = r.u64("a tensor dimension")?;
        // ggml keeps dimensions and element counts in an int64_t.
        elements = elements.checked_mul(d).filter(|&n| n > 0 && n <= i64::MAX as u64).ok_or_else(|| {
            GgufError::malformed(rank_at, format!("tensor {name:?} has dimensions {dims:?} then {d}; accepted are dimensions of 1 or more whose product is below 2^63"))
        })?;
        dims.push(d);
    }
    let id = r.u32("a tensor type")?;
    let ty = GgmlType::from_id(id).ok_or_else(|| GgufError::UnknownType {
        tensor: name.clone(),
        id,
    })?;
    let bytes =
        ty.row_bytes(dims[0])
            .and_then(|row| row.checked_mul(elements / dims[0]))
            .ok_or_else(|| {
                GgufError::malformed(
                    at,
                    format!(
                "tensor {name:?} ({}) has rows of {} elements; accepted are whole blocks of {}",
                ty.name(), dims[0], ty.block_elems()
            ),
                )
            })?;
    let offset_at = r.pos();
    let offset = r.u64("a tensor offset")?;
    if offset % alignment != 0 {
        return Err(GgufError::malformed(offset_at, format!("tensor {name:?} starts at data offset {offset}; accepted are multiples of the alignment, {alignment}")));
    }
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        bytes,
    })
}
