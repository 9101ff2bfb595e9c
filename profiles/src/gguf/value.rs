//! A metadata value as the reader keeps it: scalars and strings whole, arrays as their element
//! type and length only (the tokenizer's arrays hold megabytes that no mapping needs).

/// A GGUF metadata value type (the spec's `gguf_metadata_value_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // the spec's names
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    /// The type of spec id `id`.
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The spec's id for it.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Bytes of one value of this type in the file: exact for scalars, the least for a
    /// string (its length field) and an array (its element type and length fields).
    pub(crate) fn min_bytes(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }

    /// Whether every value of this type has the same size.
    pub(crate) fn is_fixed(self) -> bool {
        !matches!(self, ValueType::String | ValueType::Array)
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Any integer type, widened (its type is kept).
    Int(ValueType, i128),
    /// `f32` or `f64`, widened.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string (invalid sequences replaced).
    String(String),
    /// An array: its element type and length; its elements are skipped.
    Array {
        /// The elements' type.
        elem: ValueType,
        /// How many.
        len: u64,
    },
}

impl Value {
    /// The value as a non-negative integer, if it is an integer.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(_, v) => u64::try_from(*v).ok(),
            _ => None,
        }
    }

    /// The value as a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// What it is, for error messages: `u32 4096`, `a string`, `an array of 32 i32`.
    pub fn describe(&self) -> String {
        match self {
            Value::Int(t, v) => format!("{t:?} {v}").to_lowercase(),
            Value::Float(v) => format!("the float {v}"),
            Value::Bool(b) => format!("the bool {b}"),
            Value::String(s) => format!("the string {:?}", s.chars().take(40).collect::<String>()),
            Value::Array { elem, len } => format!("an array of {len} {elem:?}").to_lowercase(),
        }
    }
}
