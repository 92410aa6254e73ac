//! One HTTP request on a connection of its own, written by hand: the tests that use it control
//! every header and read the status whatever the body.

#![allow(dead_code, reason = "each test binary uses its own part of the support module")]

use std::io::{Read, Write};
use std::time::Duration;

/// POSTs the JSON `body` to `/nlip` at `addr` with `headers` (each `Name: value`) and returns
/// the answer's status, 0 when there is none. A daemon that accepts and never answers fails
/// the caller after 60 s, not the whole run.
pub fn post_nlip(addr: &str, headers: &[String], body: &[u8]) -> u16 {
    post(addr, "/nlip", headers, body)
}

/// [`post_nlip`] to any `path`.
pub fn post(addr: &str, path: &str, headers: &[String], body: &[u8]) -> u16 {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    let headers: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
}
