//! The hasher of libcupool's hot-path maps (live blocks, request sizes, a thread's pools):
//! their keys are addresses, sizes and small tuples, never chosen by an adversary, and SipHash
//! cost a fifth of an allocation.

use std::hash::Hasher;

/// A hasher for device addresses, sizes and pool keys: a rotate, a xor and a multiply per
/// word (Fibonacci hashing), the high half folded into the low at the end. Not for keys an
/// adversary chooses.
#[derive(Default)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        // The product's low bits are poor (addresses and sizes are multiples of large powers of
        // two, and a multiply only carries upwards), and hash tables index by the low bits:
        // the high half, the well-mixed one, is folded down.
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(26) ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }

    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}
