//! llama.cpp's spellings of the options that mean the same here, rewritten to ours before
//! parsing: `-c` → `--ctx`, `-b` → `--batch`, `-ub` → `--ubatch`, `-ctk`/`-ctv` →
//! `--kv-type` (K and V share one type here), `-fa [on|1]` → nothing (flash attention is
//! always on). `-fa off` is refused: this runtime has no other attention path.

/// The arguments with llama.cpp's spellings replaced, or what cannot be mapped.
pub fn rewrite(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<Vec<std::ffi::OsString>, String> {
    let mut out = Vec::new();
    let mut it = args.into_iter().peekable();
    let mut kv: Option<String> = None;
    while let Some(a) = it.next() {
        let Some(s) = a.to_str() else {
            out.push(a);
            continue;
        };
        match s {
            "-c" => out.push("--ctx".into()),
            "-b" => out.push("--batch".into()),
            "-ub" => out.push("--ubatch".into()),
            "-ctk" | "-ctv" => {
                let v = it
                    .next()
                    .and_then(|v| v.into_string().ok())
                    .ok_or_else(|| format!("{s} needs a KV type (f16 or q8_0)"))?;
                match &kv {
                    Some(k) if *k != v => {
                        return Err(format!(
                            "-ctk and -ctv differ ({k} and {v}): K and V share one type here"
                        ))
                    }
                    Some(_) => {}
                    None => {
                        out.push("--kv-type".into());
                        out.push(v.clone().into());
                        kv = Some(v);
                    }
                }
            }
            "-fa" | "--flash-attn" => {
                let value = it
                    .peek()
                    .and_then(|v| v.to_str())
                    .map(str::to_ascii_lowercase);
                match value.as_deref() {
                    Some("on" | "1" | "true" | "auto") => {
                        it.next();
                    }
                    Some("off" | "0" | "false") => {
                        return Err(
                            "-fa off: this runtime always uses flash attention (its scratch is what the pool serves)".into(),
                        )
                    }
                    _ => {}
                }
            }
            _ => out.push(a),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::rewrite;

    fn words(s: &str) -> Result<Vec<String>, String> {
        rewrite(s.split(' ').map(Into::into))
            .map(|v| v.into_iter().map(|o| o.into_string().unwrap()).collect())
    }

    #[test]
    fn llama_cpp_spellings() {
        assert_eq!(
            words("p -c 8192 -b 2048 -ub 512 -ctk q8_0 -ctv q8_0 -fa 1 --quiet").unwrap(),
            "p --ctx 8192 --batch 2048 --ubatch 512 --kv-type q8_0 --quiet"
                .split(' ')
                .collect::<Vec<_>>()
        );
        assert_eq!(words("p -fa").unwrap(), ["p"]);
        assert!(words("p -ctk f16 -ctv q8_0")
            .unwrap_err()
            .contains("differ"));
        assert!(words("p -fa off")
            .unwrap_err()
            .contains("always uses flash attention"));
        assert!(words("p -ctk").unwrap_err().contains("needs a KV type"));
    }
}
