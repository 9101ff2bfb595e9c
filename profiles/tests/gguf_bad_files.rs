//! Bad GGUF files are errors that say what was wrong and what is accepted, read in bounded
//! memory: wrong magic or version, counts and lengths beyond the bytes left or a bound,
//! nested arrays, duplicate names, bad tensor shapes, offsets and types, truncation.
mod gguf;

use cupool_profiles::gguf::{GgufError, GgufFile, GgufModel};
use gguf::models::{write, Dims};
use gguf::writer::{string, Writer, F16, F32, Q8_0};

/// A small valid llama file, tensor data included.
fn small() -> Writer {
    write(
        &Dims::dense("llama", [2, 64, 4, 4, 16, 128, 64]),
        Q8_0,
        true,
    )
}

/// The error reading `bytes` as a whole file.
fn error(bytes: &[u8]) -> GgufError {
    match GgufModel::from_bytes(bytes, bytes.len() as u64) {
        Ok(_) => panic!("a bad file was read as good"),
        Err(e) => e,
    }
}

/// Checks that `e` is malformed and its message names every `words`, and says what is
/// accepted.
fn malformed(e: GgufError, words: &[&str]) {
    let msg = e.to_string();
    assert!(matches!(e, GgufError::Malformed { .. }), "{msg}");
    for w in words {
        assert!(msg.contains(w), "{w:?} not in: {msg}");
    }
    assert!(msg.contains("accepted") || msg.contains("left"), "{msg}");
}

#[test]
fn the_small_file_is_good_and_every_prefix_of_it_is_an_error() {
    let file = small().file();
    GgufModel::from_bytes(&file, file.len() as u64).unwrap();
    for n in 0..file.len() {
        assert!(
            GgufModel::from_bytes(&file[..n], n as u64).is_err(),
            "a prefix of {n} of {} bytes",
            file.len()
        );
    }
}

#[test]
fn a_wrong_magic_or_version_is_named() {
    let good = small().file();
    let mut f = good.clone();
    f[..4].copy_from_slice(b"ggjt");
    malformed(error(&f), &["GGUF"]);
    for (v, word) in [
        (1u32, "version 1"),
        (0x0300_0000, "big-endian"),
        (4, "version 4"),
        (0, "version 0"),
    ] {
        let mut f = good.clone();
        f[4..8].copy_from_slice(&v.to_le_bytes());
        malformed(error(&f), &[word]);
    }
    let mut w = small();
    w.version = 2;
    let f = w.file();
    GgufModel::from_bytes(&f, f.len() as u64).unwrap();
}

#[test]
fn counts_beyond_a_bound_or_the_bytes_left_are_refused() {
    let good = small().file();
    for (at, n, word) in [
        (8, u64::MAX, "at most"),
        (16, u64::MAX, "at most"),
        (8, 1 << 20, "needs"),
        (16, 1 << 20, "needs"),
    ] {
        let mut f = good.clone();
        f[at..at + 8].copy_from_slice(&n.to_le_bytes());
        malformed(error(&f), &[word]);
        // The same header as the start of a file of 100 GB.
        assert!(GgufModel::from_bytes(&f, 100 << 30).is_err());
    }
    // The first key's length.
    let mut f = good.clone();
    f[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    malformed(error(&f), &["metadata key", "at most 65535"]);
}

/// A file whose only metadata is `key` of value type `ty` and raw `value`, plus one tensor.
fn with_value(key: &str, ty: u32, value: Vec<u8>) -> Vec<u8> {
    let mut w = Writer::new();
    w.str("general.architecture", "llama");
    w.raw(key, ty, value);
    w.tensor("output.weight", &[32, 2], F16);
    w.file()
}

fn array(elem: u32, len: u64, body: &[u8]) -> Vec<u8> {
    let mut v = elem.to_le_bytes().to_vec();
    v.extend(len.to_le_bytes());
    v.extend(body);
    v
}

#[test]
fn bad_values_are_named() {
    // A string longer than the file, and longer than any string value may be.
    let mut long = (1u64 << 40).to_le_bytes().to_vec();
    long.extend(b"abc");
    malformed(error(&with_value("k", 8, long)), &["\"k\"", "at most"]);
    // An array whose elements cannot fit, of fixed and of variable size.
    for elem in [10, 8, 9] {
        let e = error(&with_value("k", 9, array(elem, 1 << 60, &[])));
        malformed(e, &["needs"]);
    }
    // Arrays of arrays of arrays.
    let inner = array(0, 1, &[7]);
    let middle = array(9, 1, &inner);
    let outer = array(9, 1, &middle);
    malformed(error(&with_value("k", 9, outer)), &["nests", "at most 2"]);
    // An array of arrays is accepted.
    let f = with_value("k", 9, middle);
    GgufFile::from_bytes(&f, f.len() as u64).unwrap();
    // An unknown value type, a bool that is neither 0 nor 1.
    malformed(error(&with_value("k", 13, vec![0; 8])), &["value type 13"]);
    malformed(
        error(&with_value("k", 9, array(99, 0, &[]))),
        &["value type 99"],
    );
    malformed(error(&with_value("k", 7, vec![2])), &["bool"]);
    // A duplicate key.
    let f = with_value("general.architecture", 8, string("phi3"));
    malformed(error(&f), &["twice"]);
    // An alignment that is no power of two, or not a u32.
    for (ty, v) in [(4u32, 3u64), (4, 0), (10, 32)] {
        let bytes = if ty == 4 {
            (v as u32).to_le_bytes().to_vec()
        } else {
            v.to_le_bytes().to_vec()
        };
        let e = error(&with_value("general.alignment", ty, bytes));
        assert!(
            matches!(&e, GgufError::Metadata { key, .. } if key == "general.alignment"),
            "{e}"
        );
    }
    // The architecture as a number.
    let mut w = Writer::new();
    w.u32("general.architecture", 1);
    let e = error(&w.file());
    assert!(e.to_string().contains("accepted is a string"), "{e}");
}

#[test]
fn bad_tensor_infos_are_named() {
    let one = |name: &str, dims: &[u64], ty: u32| {
        let mut w = Writer::new();
        w.str("general.architecture", "llama");
        w.tensor(name, dims, ty);
        w.file()
    };
    malformed(
        error(&one("t", &[1, 1, 1, 1, 1], F32)),
        &["5 dimensions", "1 to 4"],
    );
    malformed(error(&one("t", &[], F32)), &["0 dimensions"]);
    malformed(error(&one("t", &[32, 0], F32)), &["dimensions"]);
    malformed(
        error(&one(&"x".repeat(64), &[4], F32)),
        &["tensor name", "at most 63"],
    );
    // A row of q8_0 that is not whole blocks of 32: written by hand (the writer refuses).
    let mut f = one("t", &[64], Q8_0);
    let at = f
        .windows(8)
        .rposition(|x| x == 64u64.to_le_bytes())
        .unwrap();
    f[at..at + 8].copy_from_slice(&33u64.to_le_bytes());
    malformed(error(&f), &["q8_0", "blocks of 32"]);
    // Dimensions whose product overflows.
    let mut f = one("t", &[4, 4, 4], F32);
    let at = f
        .windows(24)
        .position(|x| x[..8] == 4u64.to_le_bytes())
        .unwrap();
    f[at + 8..at + 16].copy_from_slice(&(1u64 << 62).to_le_bytes());
    f[at + 16..at + 24].copy_from_slice(&(1u64 << 62).to_le_bytes());
    malformed(error(&f), &["2^63"]);
    // Two tensors of one name.
    let mut w = Writer::new();
    w.tensor("t", &[4], F32).tensor("t", &[4], F32);
    malformed(error(&w.file()), &["twice"]);
    // An offset off the alignment: the last 8 bytes of the infos.
    let mut w = Writer::new();
    w.tensor("t", &[4], F32);
    let (mut infos, data) = w.unpadded();
    let n = infos.len();
    infos[n - 8..].copy_from_slice(&4u64.to_le_bytes());
    let len = (infos.len() as u64).next_multiple_of(32) + data;
    malformed(
        GgufFile::from_bytes(&infos, len).unwrap_err(),
        &["offset 4", "multiples of the alignment, 32"],
    );
}

#[test]
fn a_file_cut_before_its_data_ends_is_named() {
    let w = small();
    let (header, len) = w.header();
    let e = GgufFile::from_bytes(&header, header.len() as u64).unwrap_err();
    malformed(e, &["past the file", "truncated"]);
    // Its start, with the whole file's length, is good.
    GgufFile::from_bytes(&header, len).unwrap();
    // A length below the bytes given is refused.
    assert!(GgufFile::from_bytes(&header, 3).is_err());
}
