//! A tiny GGUF writer for the tests: metadata of the types the mapping reads, tensor infos
//! laid out as llama.cpp's writer lays them (each at the next multiple of the alignment), and
//! the whole file's length, so a test can read the header alone as the start of a file of that
//! length. Its block sizes are its own table, kept apart from the reader's.
#![allow(dead_code)] // each test file takes what it needs

/// ggml type ids the tests write, with (elements, bytes) per block.
pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q8_0: u32 = 8;
pub const Q4_K: u32 = 12;
pub const Q6_K: u32 = 14;
pub const BF16: u32 = 30;

pub fn block(ty: u32) -> (u64, u64) {
    match ty {
        F32 => (1, 4),
        F16 | BF16 => (1, 2),
        Q8_0 => (32, 34),
        Q4_K => (256, 144),
        Q6_K => (256, 210),
        _ => panic!("the test writer has no block size for type {ty}"),
    }
}

#[derive(Clone, Default)]
pub struct Writer {
    pub version: u32,
    pub alignment: u64,
    kv: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32)>,
}

impl Writer {
    pub fn new() -> Self {
        Self {
            version: 3,
            alignment: 32,
            ..Default::default()
        }
    }

    pub fn raw(&mut self, key: &str, ty: u32, value: Vec<u8>) -> &mut Self {
        self.kv.push((key.into(), ty, value));
        self
    }

    pub fn u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.raw(key, 4, v.to_le_bytes().into())
    }

    pub fn u64(&mut self, key: &str, v: u64) -> &mut Self {
        self.raw(key, 10, v.to_le_bytes().into())
    }

    pub fn f32(&mut self, key: &str, v: f32) -> &mut Self {
        self.raw(key, 6, v.to_le_bytes().into())
    }

    pub fn str(&mut self, key: &str, v: &str) -> &mut Self {
        self.raw(key, 8, string(v))
    }

    /// An array of `n` short strings (the tokenizer's tokens).
    pub fn tokens(&mut self, key: &str, n: u64) -> &mut Self {
        let mut v = 8u32.to_le_bytes().to_vec();
        v.extend(n.to_le_bytes());
        for i in 0..n {
            v.extend(string(&format!("t{i}")));
        }
        self.raw(key, 9, v)
    }

    /// An array of i32.
    pub fn i32s(&mut self, key: &str, xs: &[i32]) -> &mut Self {
        let mut v = 5u32.to_le_bytes().to_vec();
        v.extend((xs.len() as u64).to_le_bytes());
        for x in xs {
            v.extend(x.to_le_bytes());
        }
        self.raw(key, 9, v)
    }

    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32) -> &mut Self {
        self.tensors.push((name.into(), dims.to_vec(), ty));
        self
    }

    /// A tensor's data bytes.
    pub fn bytes_of(dims: &[u64], ty: u32) -> u64 {
        let (b, s) = block(ty);
        if dims.is_empty() {
            return 0;
        }
        assert_eq!(
            dims[0] % b,
            0,
            "a row of {} is not whole blocks of {b}",
            dims[0]
        );
        dims[0] / b * s * dims[1..].iter().product::<u64>()
    }

    /// Every tensor's data bytes, summed.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors
            .iter()
            .map(|(_, d, t)| Self::bytes_of(d, *t))
            .sum()
    }

    /// Every tensor's elements, summed (the model's parameter count).
    pub fn elements(&self) -> u64 {
        self.tensors
            .iter()
            .map(|(_, d, _)| d.iter().product::<u64>())
            .sum()
    }

    /// The header (padded to the alignment) and the whole file's length.
    pub fn header(&self) -> (Vec<u8>, u64) {
        let (mut out, data) = self.unpadded();
        out.resize(
            (out.len() as u64).next_multiple_of(self.alignment) as usize,
            0,
        );
        let len = out.len() as u64 + data;
        (out, len)
    }

    /// The header up to its last tensor info's end, and the data section's length.
    pub fn unpadded(&self) -> (Vec<u8>, u64) {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kv {
            out.extend(string(k));
            out.extend(ty.to_le_bytes());
            out.extend(v);
        }
        let mut offset = 0u64;
        for (name, dims, ty) in &self.tensors {
            out.extend(string(name));
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset = (offset + Self::bytes_of(dims, *ty)).next_multiple_of(self.alignment);
        }
        (out, offset)
    }

    /// The whole file, its tensor data zeros (for small models).
    pub fn file(&self) -> Vec<u8> {
        let (mut out, len) = self.header();
        out.resize(len as usize, 0);
        out
    }
}

pub fn string(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend(s.as_bytes());
    v
}
