//! The ggml element types a GGUF tensor may have, with their block sizes: a row of `n`
//! elements takes `n / block` blocks of `bytes` each. The ids are ggml's `enum ggml_type`
//! (ids 4, 5 and 31 to 38 were removed from ggml and are refused). The sizes are those of
//! ggml's `block_*` structs.

/// A ggml element type: how a tensor's values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)] // the names are ggml's own
#[non_exhaustive]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq4Nl,
    Iq3S,
    Iq2S,
    Iq4Xs,
    I8,
    I16,
    I32,
    I64,
    F64,
    Iq1M,
    Bf16,
    Tq1_0,
    Tq2_0,
    Mxfp4,
}

/// QK_K: the super-block of the k-quants and most i-quants.
const QK_K: u64 = 256;

/// Every known type: (type, ggml id, name, elements per block, bytes per block).
const TABLE: [(GgmlType, u32, &str, u64, u64); 32] = [
    (GgmlType::F32, 0, "f32", 1, 4),
    (GgmlType::F16, 1, "f16", 1, 2),
    (GgmlType::Q4_0, 2, "q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "q8_1", 32, 36),
    (GgmlType::Q2K, 10, "q2_K", QK_K, 84),
    (GgmlType::Q3K, 11, "q3_K", QK_K, 110),
    (GgmlType::Q4K, 12, "q4_K", QK_K, 144),
    (GgmlType::Q5K, 13, "q5_K", QK_K, 176),
    (GgmlType::Q6K, 14, "q6_K", QK_K, 210),
    (GgmlType::Q8K, 15, "q8_K", QK_K, 292),
    (GgmlType::Iq2Xxs, 16, "iq2_xxs", QK_K, 66),
    (GgmlType::Iq2Xs, 17, "iq2_xs", QK_K, 74),
    (GgmlType::Iq3Xxs, 18, "iq3_xxs", QK_K, 98),
    (GgmlType::Iq1S, 19, "iq1_s", QK_K, 50),
    (GgmlType::Iq4Nl, 20, "iq4_nl", 32, 18),
    (GgmlType::Iq3S, 21, "iq3_s", QK_K, 110),
    (GgmlType::Iq2S, 22, "iq2_s", QK_K, 82),
    (GgmlType::Iq4Xs, 23, "iq4_xs", QK_K, 136),
    (GgmlType::I8, 24, "i8", 1, 1),
    (GgmlType::I16, 25, "i16", 1, 2),
    (GgmlType::I32, 26, "i32", 1, 4),
    (GgmlType::I64, 27, "i64", 1, 8),
    (GgmlType::F64, 28, "f64", 1, 8),
    (GgmlType::Iq1M, 29, "iq1_m", QK_K, 56),
    (GgmlType::Bf16, 30, "bf16", 1, 2),
    (GgmlType::Tq1_0, 34, "tq1_0", QK_K, 54),
    (GgmlType::Tq2_0, 35, "tq2_0", QK_K, 66),
    (GgmlType::Mxfp4, 39, "mxfp4", 32, 17),
];

impl GgmlType {
    /// Every known type, in id order.
    pub fn all() -> impl Iterator<Item = GgmlType> {
        TABLE.iter().map(|row| row.0)
    }

    /// The type of ggml id `id`, if its block size is known.
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|row| row.1 == id).map(|row| row.0)
    }

    fn row(self) -> &'static (GgmlType, u32, &'static str, u64, u64) {
        // Every variant has exactly one row (a unit test checks it).
        TABLE.iter().find(|row| row.0 == self).unwrap_or(&TABLE[0])
    }

    /// ggml's id for it.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// ggml's name for it (`q8_0`, `q4_K`, `iq2_xxs`, ...).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block: a row's length must be a multiple of it.
    pub fn block_elems(self) -> u64 {
        self.row().3
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> u64 {
        self.row().4
    }

    /// Bytes of a row of `n` elements; `None` when `n` is not a whole number of blocks or the
    /// size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        if n % self.block_elems() != 0 {
            return None;
        }
        (n / self.block_elems()).checked_mul(self.block_bytes())
    }

    /// The known types' names, for error messages.
    pub(crate) fn known_names() -> String {
        TABLE.iter().map(|row| row.2).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_one_row_and_ids_are_unique() {
        for (i, row) in TABLE.iter().enumerate() {
            assert_eq!(TABLE.iter().filter(|r| r.0 == row.0).count(), 1);
            assert_eq!(TABLE.iter().filter(|r| r.1 == row.1).count(), 1);
            assert_eq!(row.0.row().1, row.1, "row {i}");
            assert_eq!(GgmlType::from_id(row.1), Some(row.0));
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 40, 1000] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
    }

    #[test]
    fn a_row_is_whole_blocks() {
        for t in GgmlType::all() {
            let b = t.block_elems();
            assert_eq!(t.row_bytes(4 * b), Some(4 * t.block_bytes()));
            if b > 1 {
                assert_eq!(t.row_bytes(b + 1), None, "{}", t.name());
            }
        }
        assert_eq!(GgmlType::Q8_0.row_bytes(u64::MAX - 31), None);
    }
}
