//! Little-endian fields from a byte source that may lie about its counts: every read is first
//! checked against the bytes left, so no length or count read from the file makes the reader
//! allocate or wait for more than the file holds.

use super::error::GgufError;
use std::io::{self, Read};
use std::path::PathBuf;

/// A reader that knows its position and how many bytes it may still read.
pub(crate) struct Bounded<R> {
    inner: R,
    pos: u64,
    end: u64,
    /// The file, for I/O errors (empty for bytes in memory).
    path: PathBuf,
}

impl<R: Read> Bounded<R> {
    /// Reads at most `end` bytes of `inner`, naming `path` in I/O errors.
    pub(crate) fn new(inner: R, end: u64, path: PathBuf) -> Self {
        Self {
            inner,
            pos: 0,
            end,
            path,
        }
    }

    /// Bytes read so far.
    pub(crate) fn pos(&self) -> u64 {
        self.pos
    }

    /// Bytes that may still be read.
    pub(crate) fn remaining(&self) -> u64 {
        self.end.saturating_sub(self.pos)
    }

    /// Fails unless `n` more bytes (for `what`) are left.
    pub(crate) fn need(&self, n: u64, what: &str) -> Result<(), GgufError> {
        if n > self.remaining() {
            return Err(GgufError::malformed(
                self.pos,
                format!(
                    "{what} needs {n} bytes but only {} are left (of the file, or of the {} MiB a header may take)",
                    self.remaining(),
                    super::MAX_HEADER_BYTES >> 20
                ),
            ));
        }
        Ok(())
    }

    fn io_error(&self, e: io::Error, what: &str) -> GgufError {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            GgufError::malformed(
                self.pos,
                format!("the file ends inside {what} (it is shorter than its length said)"),
            )
        } else {
            GgufError::Io {
                path: self.path.clone(),
                source: e,
            }
        }
    }

    /// The next `N` bytes.
    pub(crate) fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        self.need(N as u64, what)?;
        let mut buf = [0u8; N];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| self.io_error(e, what))?;
        self.pos += N as u64;
        Ok(buf)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A string (a u64 length, then its bytes) of at most `max` bytes; invalid UTF-8 is
    /// replaced.
    pub(crate) fn string(&mut self, max: u64, what: &str) -> Result<String, GgufError> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > max {
            return Err(GgufError::malformed(
                at,
                format!("{what} is {len} bytes long; accepted are at most {max}"),
            ));
        }
        self.need(len, what)?;
        // Bounded by `max` and by the bytes left: the length was checked against both.
        let mut buf = Vec::with_capacity(len as usize);
        let got = (&mut self.inner)
            .take(len)
            .read_to_end(&mut buf)
            .map_err(|e| self.io_error(e, what))?;
        if got as u64 != len {
            return Err(self.io_error(io::ErrorKind::UnexpectedEof.into(), what));
        }
        self.pos += len;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// Skips `n` bytes (after checking that they are there to skip).
    pub(crate) fn skip(&mut self, n: u64, what: &str) -> Result<(), GgufError> {
        self.need(n, what)?;
        let got = io::copy(&mut (&mut self.inner).take(n), &mut io::sink())
            .map_err(|e| self.io_error(e, what))?;
        if got != n {
            return Err(self.io_error(io::ErrorKind::UnexpectedEof.into(), what));
        }
        self.pos += n;
        Ok(())
    }

    /// Skips a string of at most `max` bytes.
    pub(crate) fn skip_string(&mut self, max: u64, what: &str) -> Result<(), GgufError> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > max {
            return Err(GgufError::malformed(
                at,
                format!("{what} is {len} bytes long; accepted are at most {max}"),
            ));
        }
        self.skip(len, what)
    }
}
