//! Reading a model from a GGUF file's header: DeepSeek-V3's shape in q8_0 (about 713 GB of
//! weights; a 4 MB header of tensor infos and a 129,280-token vocabulary with its types and
//! 127,741 merges, as a real file holds them), as a sparse file of the full length.
//!
//! Goal: a few milliseconds, however large the file, since only the header region (a few MB
//! of metadata and tensor infos) is read. Where the file system holds no sparse file of that
//! length, the same header is read from memory as the start of a file of that length.
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use cupool_profiles::gguf::GgufModel;
use std::fs::OpenOptions;

#[path = "../tests/gguf/mod.rs"]
mod gguf;
use gguf::models::{write, Dims};
use gguf::writer::Q8_0;

/// DeepSeek-V3's numbers as its config gives them.
fn deepseek_v3() -> Dims {
    let mut d = Dims::dense("deepseek2", [61, 7168, 128, 128, 192, 18432, 129280]);
    d.moe = Some((256, 8, 2048));
    d.n_dense_lead = 3;
    d.n_shared_experts = 1;
    d.mla = Some((1536, 512, 64, 128));
    d
}

fn header(c: &mut Criterion) {
    let d = deepseek_v3();
    let mut w = write(&d, Q8_0, true);
    w.i32s("tokenizer.ggml.token_type", &vec![1; d.n_vocab as usize])
        .tokens("tokenizer.ggml.merges", 127_741);
    let (header, len) = w.header();
    let mut g = c.benchmark_group("gguf_header");
    g.throughput(Throughput::Bytes(header.len() as u64));
    g.sample_size(20);

    let path = std::env::temp_dir().join(format!("cupool-gguf-bench-{}.gguf", std::process::id()));
    std::fs::write(&path, &header).expect("a temporary file");
    let sparse = OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(len))
        .is_ok();
    if sparse {
        g.bench_function("read_deepseek_v3_q8_0_file", |b| {
            b.iter(|| GgufModel::read(&path).expect("a valid file"))
        });
    } else {
        eprintln!("this file system holds no sparse file of {len} bytes: reading from memory");
    }
    g.bench_function("from_bytes_deepseek_v3_q8_0_header", |b| {
        b.iter(|| GgufModel::from_bytes(&header, len).expect("a valid header"))
    });
    g.finish();
    let _ = std::fs::remove_file(&path);
}

criterion_group!(benches, header);
criterion_main!(benches);
