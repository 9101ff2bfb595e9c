//! Replays the committed fuzz corpus (fuzz/corpus/<target>/) and a bounded fresh run of
//! pseudo-random inputs through the fuzz entry points, on stable Rust. Longer runs use
//! cargo-fuzz: see docs/reliability.md.
use cupool::fuzzing;
use std::path::Path;

type Target = (&'static str, fn(&[u8]));
const TARGETS: [Target; 5] = [
    ("pool_ops", fuzzing::pool_ops),
    ("pool_faults", fuzzing::pool_faults),
    ("trace_parser", fuzzing::trace_parser),
    ("env_config", fuzzing::env_config),
    ("gguf", fuzzing::gguf),
];

#[test]
fn corpus_replays_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut total = 0;
    for (name, f) in TARGETS {
        let dir = root.join(name);
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_file() {
                f(&std::fs::read(&path).unwrap());
                n += 1;
            }
        }
        assert!(n > 0, "the {name} corpus is empty");
        total += n;
    }
    eprintln!("replayed {total} corpus inputs");
}

#[test]
fn bounded_fresh_run() {
    let mut x: u64 = 0x5DEE_CE66_D1CE_4E5B;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for (name, f) in TARGETS {
        let runs = if name.starts_with("pool") { 600 } else { 3000 };
        for _ in 0..runs {
            let len = (next() % 600) as usize;
            let mut data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if name == "trace_parser" {
                // Mostly well-formed lines, so the replay is reached, with random damage.
                data = synth_trace(&mut next).into_bytes();
                if next() % 3 == 0 && !data.is_empty() {
                    let i = (next() as usize) % data.len();
                    data[i] = next() as u8;
                }
            }
            if name == "gguf" {
                // A GGUF header with small counts, so the metadata and tensor infos are
                // reached, then the random bytes.
                let mut head = b"GGUF\x03\0\0\0".to_vec();
                head.extend((next() % 4).to_le_bytes());
                head.extend((next() % 8).to_le_bytes());
                head.append(&mut data);
                data = head;
            }
            f(&data);
        }
    }
}

fn synth_trace(next: &mut impl FnMut() -> u64) -> String {
    let mut out = String::new();
    let mut live: Vec<u64> = Vec::new();
    let mut id = 0;
    for _ in 0..(next() % 60) {
        match next() % 6 {
            0 | 1 => {
                out.push_str(&format!(
                    "{{\"op\":\"alloc\",\"id\":{id},\"size\":{},\"stream\":{}}}\n",
                    next() % (64 << 20),
                    next() % 2
                ));
                live.push(id);
                id += 1;
            }
            2 | 3 if !live.is_empty() => {
                let k = live.swap_remove((next() as usize) % live.len());
                out.push_str(&format!("{{\"op\":\"free\",\"id\":{k}}}\n"));
            }
            4 => out.push_str("{\"op\":\"phase_begin\",\"name\":\"u\"}\n"),
            _ => out.push_str("{\"op\":\"phase_end\",\"name\":\"u\",\"prefill\":true}\n"),
        }
    }
    out
}
