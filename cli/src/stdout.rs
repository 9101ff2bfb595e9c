//! Writing results to standard output without panicking when the reader has gone (`| head`):
//! the output is no longer wanted, so the command stops quietly with success.

use std::io::{ErrorKind, Write};

/// Writes `text` to standard output and flushes it. A closed pipe ends the process with exit
/// code 0; any other write error is reported on stderr and ends it with 1.
pub fn out(text: &str) {
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_all(text.as_bytes()).and_then(|()| o.flush()) {
        if e.kind() == ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        let _ = writeln!(std::io::stderr(), "error: writing the output failed: {e}");
        std::process::exit(1);
    }
}

/// Writes one line to standard error, ignoring a closed stream.
pub fn err(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// `println!` through [`out`].
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::stdout::out(&format!("{}\n", format_args!($($arg)*)))
    };
}
