//! Reading command input: a whole document, or one bounded line at a time.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

/// Input is read from the file or pipe this many bytes at a time.
const READ_CHUNK: usize = 64 * 1024;

/// Opens FILE, or stdin for `None` and `-`.
pub(super) fn open(path: Option<&Path>) -> io::Result<Box<dyn BufRead>> {
    match path {
        None => Ok(Box::new(BufReader::with_capacity(READ_CHUNK, io::stdin()))),
        Some(p) if p.as_os_str() == "-" => Ok(Box::new(BufReader::with_capacity(READ_CHUNK, io::stdin()))),
        Some(p) => Ok(Box::new(BufReader::with_capacity(READ_CHUNK, File::open(p)?))),
    }
}

/// Why an input could not be read as text.
#[derive(Debug)]
pub(super) enum InputError {
    Io(io::Error),
    TooLarge { limit: usize },
    NotUtf8 { at: usize },
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InputError::Io(e) => write!(f, "cannot read input: {e}"),
            InputError::TooLarge { limit } => write!(f, "input is larger than the limit of {limit} bytes"),
            InputError::NotUtf8 { at } => write!(f, "input is not UTF-8 (invalid byte at offset {at})"),
        }
    }
}

/// Reads the whole input, refusing more than `limit` bytes.
pub(super) fn read_all(reader: &mut dyn BufRead, limit: usize) -> Result<String, InputError> {
    let mut bytes = Vec::new();
    reader.take(limit as u64 + 1).read_to_end(&mut bytes).map_err(InputError::Io)?;
    if bytes.len() > limit {
        return Err(InputError::TooLarge { limit });
    }
    String::from_utf8(bytes).map_err(|e| InputError::NotUtf8 { at: e.utf8_error().valid_up_to() })
}

/// Reads input one bounded line at a time into a buffer it reuses: no allocation per line,
/// and line ends found with `memchr`.
pub(super) struct Lines {
    reader: Box<dyn BufRead>,
    line: Vec<u8>,
    limit: usize,
}

impl Lines {
    pub(super) fn new(reader: Box<dyn BufRead>, limit: usize) -> Self {
        Lines { reader, line: Vec::with_capacity(4096), limit }
    }

    /// The next line without its line ending; `None` at end of input. A line longer than the
    /// limit is consumed whole (never held in memory past the limit) and reported as too large.
    pub(super) fn next_line(&mut self) -> Option<Result<&str, InputError>> {
        self.line.clear();
        let mut overflow = false;
        let mut seen_any = false;
        loop {
            let buf = match self.reader.fill_buf() {
                Ok(b) => b,
                Err(e) => return Some(Err(InputError::Io(e))),
            };
            if buf.is_empty() {
                if !seen_any {
                    return None;
                }
                break;
            }
            seen_any = true;
            let end = memchr::memchr(b'\n', buf);
            let chunk = &buf[..end.unwrap_or(buf.len())];
            // One byte over the limit is kept: it may be the `\r` of a `\r\n` ending.
            if !overflow && self.line.len() + chunk.len() <= self.limit + 1 {
                self.line.extend_from_slice(chunk);
            } else {
                overflow = true;
                self.line.clear();
            }
            let consumed = end.map_or(buf.len(), |i| i + 1);
            self.reader.consume(consumed);
            if end.is_some() {
                break;
            }
        }
        if self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        if overflow || self.line.len() > self.limit {
            return Some(Err(InputError::TooLarge { limit: self.limit }));
        }
        Some(std::str::from_utf8(&self.line).map_err(|e| InputError::NotUtf8 { at: e.valid_up_to() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_lines(input: &'static [u8], limit: usize) -> Vec<Result<String, String>> {
        // A small read buffer makes lines span several fills.
        let mut lines = Lines::new(Box::new(BufReader::with_capacity(3, input)), limit);
        let mut out = Vec::new();
        while let Some(line) = lines.next_line() {
            out.push(line.map(str::to_owned).map_err(|e| e.to_string()));
        }
        out
    }

    #[test]
    fn lines_end_at_newlines_with_or_without_a_carriage_return() {
        let got = all_lines(b"one\r\n\ntwo\nlast", 100);
        assert_eq!(got, ["one", "", "two", "last"].map(|l| Ok(l.to_owned())));
        assert!(all_lines(b"", 100).is_empty());
        assert_eq!(all_lines(b"x\n", 100), [Ok("x".to_owned())]);
    }

    #[test]
    fn a_line_over_the_limit_is_refused_and_the_next_one_read() {
        let got = all_lines(b"12345\r\n123456\n1234567890\nok\n", 6);
        assert_eq!(got[0], Ok("12345".to_owned()));
        assert_eq!(got[1], Ok("123456".to_owned()), "exactly the limit");
        assert_eq!(got[2], Err("input is larger than the limit of 6 bytes".to_owned()));
        assert_eq!(got[3], Ok("ok".to_owned()));
        assert_eq!(all_lines(b"1234567", 6), [Err("input is larger than the limit of 6 bytes".to_owned())]);
    }

    #[test]
    fn a_line_that_is_not_utf8_says_where() {
        let got = all_lines(b"ok\nab\xffc\n", 100);
        assert_eq!(got[1], Err("input is not UTF-8 (invalid byte at offset 2)".to_owned()));
    }
}
