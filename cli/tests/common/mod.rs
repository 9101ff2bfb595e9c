//! What the tests of every subcommand share: the binary with the pool's environment cleared and
//! the log off, its JSON output and exit code, and temporary files.
// Each test file uses some of these.
#![allow(dead_code)]

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// The binary, with the pool's environment variables removed and the log off.
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_repro-prefill"));
    c.env_remove("GGML_POOL")
        .env_remove("GGML_CUDA_NO_VMM")
        .env_remove("GGML_CUDA_POOL_USE_MANAGED")
        .env_remove("GGML_CUDA_ALLOC_FALLBACK_MANAGED");
    c.env("RUST_LOG", "off");
    c
}

/// `repro-prefill ARGS --device sim --format json`: its output and exit code.
pub fn json(args: &[&str]) -> (Value, i32) {
    let out = bin()
        .args(args)
        .args(["--device", "sim", "--format", "json"])
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (v, out.status.code().unwrap())
}

/// A path `name` in this test process's temporary folder.
pub fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cupool-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `repro-prefill predict ARGS --format json`: its output and exit code.
pub fn predict_json(args: &[&str]) -> (Value, i32) {
    let out = bin()
        .arg("predict")
        .args(args)
        .args(["--format", "json"])
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (v, out.status.code().unwrap())
}

/// Checks that the picture at `picture` (from the workspace root) is byte for byte what `drawn`
/// holds, the file a command just drew; with `CUPOOL_BLESS=1` copies it there instead.
pub fn same_picture(picture: &str, drawn: &std::path::Path, command: &str) {
    let path = format!("{}/../{picture}", env!("CARGO_MANIFEST_DIR"));
    let now = std::fs::read(drawn).unwrap();
    if std::env::var("CUPOOL_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &now).unwrap();
    } else {
        assert!(
            std::fs::read(&path).unwrap() == now,
            "{picture} is not what `{command}` draws now: CUPOOL_BLESS=1 redraws it"
        );
    }
}
