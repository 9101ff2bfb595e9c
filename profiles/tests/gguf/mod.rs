//! What the GGUF tests share: a tiny writer and the tensor lists of the supported
//! architectures as llama.cpp's converter writes them.
#![allow(dead_code)] // each test file takes what it needs

pub mod models;
pub mod writer;
