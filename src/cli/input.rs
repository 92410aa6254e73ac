//! Reading command input: a whole document, or one bounded line at a time.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

/// Opens FILE, or stdin for `None` and `-`.
pub fn open(path: Option<&Path>) -> io::Result<Box<dyn BufRead>> {
    match path {
        None => Ok(Box::new(BufReader::new(io::stdin()))),
        Some(p) if p.as_os_str() == "-" => Ok(Box::new(BufReader::new(io::stdin()))),
        Some(p) => Ok(Box::new(BufReader::new(File::open(p)?))),
    }
}

/// Why an input could not be read as text.
#[derive(Debug)]
pub enum InputError {
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
pub fn read_all(reader: &mut dyn BufRead, limit: usize) -> Result<String, InputError> {
    let mut bytes = Vec::new();
    reader.take(limit as u64 + 1).read_to_end(&mut bytes).map_err(InputError::Io)?;
    if bytes.len() > limit {
        return Err(InputError::TooLarge { limit });
    }
    String::from_utf8(bytes).map_err(|e| InputError::NotUtf8 { at: e.utf8_error().valid_up_to() })
}

/// Reads the next line (without its line ending) into `line`, keeping at most `limit` bytes in
/// memory. `Ok(None)` at end of input; a longer line is consumed and reported as too large.
pub fn next_line(reader: &mut dyn BufRead, limit: usize) -> Option<Result<String, InputError>> {
    let mut bytes = Vec::new();
    let mut overflow = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) => return Some(Err(InputError::Io(e))),
        };
        if buf.is_empty() {
            if bytes.is_empty() && !overflow {
                return None;
            }
            break;
        }
        let (chunk, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if !overflow && bytes.len() + chunk.len() <= limit + 1 {
            bytes.extend_from_slice(chunk);
        } else {
            overflow = true;
            bytes.clear();
        }
        let consumed = done.unwrap_or(buf.len());
        reader.consume(consumed);
        if done.is_some() {
            break;
        }
    }
    if overflow || bytes.len() > limit + 1 {
        return Some(Err(InputError::TooLarge { limit }));
    }
    if bytes.last() == Some(&b'\r') {
        bytes.pop();
    }
    Some(String::from_utf8(bytes).map_err(|e| InputError::NotUtf8 { at: e.utf8_error().valid_up_to() }))
}
