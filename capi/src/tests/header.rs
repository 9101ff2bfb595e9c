// The checked-in header is what cbindgen generates from the sources now.
#[test]
fn the_header_is_current() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config =
        cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut fresh);
    let path = format!("{dir}/include/cupool.h");
    let current = std::fs::read(&path).unwrap_or_default();
    if current != fresh {
        if std::env::var_os("CUPOOL_BLESS").is_some() {
            std::fs::write(&path, &fresh).expect("write the header");
            return;
        }
        panic!("capi/include/cupool.h is stale: regenerate it with `CUPOOL_BLESS=1 cargo test -p cupool-capi --test header`");
    }
}
