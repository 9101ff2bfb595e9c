//! A metadata value: scalars and strings read whole, arrays skipped after their lengths are
//! checked against the bytes left, nested at most `MAX_ARRAY_DEPTH` deep.

use super::error::GgufError;
use super::reader::Bounded;
use super::value::{Value, ValueType};
use super::{MAX_ARRAY_DEPTH, MAX_STRING_BYTES};
use std::io::Read;

/// A metadata value of the type that follows.
pub(crate) fn read_value<R: Read>(r: &mut Bounded<R>, key: &str) -> Result<Value, GgufError> {
    let at = r.pos();
    // Errors below name the value by this.
    let key = &format!("metadata {key:?}");
    let id = r.u32("a metadata value type")?;
    let ty = ValueType::from_id(id).ok_or_else(|| {
        GgufError::malformed(
            at,
            format!("{key} has value type {id}; accepted are 0 to 12"),
        )
    })?;
    read_typed(r, ty, key)
}

fn read_typed<R: Read>(r: &mut Bounded<R>, ty: ValueType, key: &str) -> Result<Value, GgufError> {
    use ValueType as T;
    let at = r.pos();
    Ok(match ty {
        T::U8 => Value::Int(ty, r.u8(key)?.into()),
        T::I8 => Value::Int(ty, (r.u8(key)? as i8).into()),
        T::U16 => Value::Int(ty, u16::from_le_bytes(r.array(key)?).into()),
        T::I16 => Value::Int(ty, i16::from_le_bytes(r.array(key)?).into()),
        T::U32 => Value::Int(ty, r.u32(key)?.into()),
        T::I32 => Value::Int(ty, (r.u32(key)? as i32).into()),
        T::U64 => Value::Int(ty, r.u64(key)?.into()),
        T::I64 => Value::Int(ty, (r.u64(key)? as i64).into()),
        T::F32 => Value::Float(f32::from_bits(r.u32(key)?).into()),
        T::F64 => Value::Float(f64::from_bits(r.u64(key)?)),
        T::Bool => match r.u8(key)? {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            b => {
                return Err(GgufError::malformed(
                    at,
                    format!("{key} is a bool of byte {b}; accepted are 0 and 1"),
                ))
            }
        },
        T::String => Value::String(r.string(MAX_STRING_BYTES, key)?),
        T::Array => {
            let (elem, len) = skip_array(r, key, 1)?;
            Value::Array { elem, len }
        }
    })
}

/// Reads an array's element type and length and skips its elements; arrays inside it nest
/// `depth` deep.
fn skip_array<R: Read>(
    r: &mut Bounded<R>,
    key: &str,
    depth: usize,
) -> Result<(ValueType, u64), GgufError> {
    let at = r.pos();
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::malformed(
            at,
            format!("{key} nests arrays {depth} deep; accepted are at most {MAX_ARRAY_DEPTH}"),
        ));
    }
    let id = r.u32(key)?;
    let elem = ValueType::from_id(id).ok_or_else(|| {
        GgufError::malformed(
            at,
            format!("{key} is an array of value type {id}; accepted are 0 to 12"),
        )
    })?;
    let len = r.u64(key)?;
    let least = len.saturating_mul(elem.min_bytes());
    r.need(least, &format!("{key}'s {len} elements"))?;
    if elem.is_fixed() {
        r.skip(least, key)?;
    } else {
        // Each element reads at least 8 bytes of the file, so this loop ends with the file.
        for _ in 0..len {
            match elem {
                ValueType::String => r.skip_string(MAX_STRING_BYTES, key)?,
                _ => {
                    skip_array(r, key, depth + 1)?;
                }
            }
        }
    }
    Ok((elem, len))
}
