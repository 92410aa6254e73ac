//! A small load client for benches/bench-latency.sh: sequential round trips of a small text
//! envelope over a keep-alive HTTP/1.1 connection or a WebSocket, 200 warm-up then 1,000
//! measured, on each of 5 connections one after another; prints `median_us p99_us
//! fastest_connection_median_us slowest_connection_median_us` over all measured round trips.
//!
//! Several connections, because on this VM a connection settles into one of two speeds for its
//! whole life (17.5 or about 45 µs for the same echo server, from one connection to the next):
//! one connection's median says more about where the scheduler put it than about the server.
//!
//! `cargo bench --bench latency -- http HOST:PORT PATH` or `... ws ws://HOST:PORT/PATH`.
//!
//! `... floor HTTP_ADDR HYPER_ADDR WS_ADDR` serves the floors the same client is timed against:
//! echo servers on the runtime silpgate runs on (tokio's multi-thread runtime, default
//! workers), one answering HTTP/1.1 POSTs with their body with headers read by hand (no HTTP
//! library), one doing the same with hyper (silpgate's HTTP library, its connections wrapped as
//! silpgate wraps them), and one answering WebSocket text messages with themselves
//! (tokio-tungstenite over a plain TCP socket). What the first and the last take is loopback TCP, the runtime's wake-ups and
//! this machine; what silpgate takes above the hyper floor is its own.
//! With `LATENCY_CONVERSATION=TOKEN` in the environment the envelope belongs to that
//! conversation (benches/bench-forward.sh: a cluster forwards it to its partition's owner).
//! Under `cargo test` (no arguments) it does nothing.

use futures_util::{SinkExt, StreamExt};
use std::io::{BufRead, BufReader, Read, Write};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

const WARM_UP: usize = 200;
const MEASURED: usize = 1000;
const CONNECTIONS: usize = 5;
const BODY: &str = r#"{"format":"text","subformat":"english","content":"hello"}"#;

/// The envelope sent: [`BODY`], in the conversation `LATENCY_CONVERSATION` names, if any.
fn body() -> String {
    match std::env::var("LATENCY_CONVERSATION") {
        Ok(token) => format!(
            r#"{{"format":"text","subformat":"english","content":"hello","submessages":[{{"format":"token","subformat":"conversation","content":"{token}"}}]}}"#
        ),
        Err(_) => BODY.to_owned(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let connection: Box<dyn Fn() -> Vec<Duration>> =
        match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
            ["http", addr, path] => {
                let (addr, path) = (addr.to_string(), path.to_string());
                Box::new(move || http(&addr, &path))
            }
            ["ws", url] => {
                let url = url.to_string();
                Box::new(move || ws(&url))
            }
            ["floor", http_addr, hyper_addr, ws_addr] => return floor(http_addr, hyper_addr, ws_addr),
            _ => return,
        };
    let mut all = Vec::with_capacity(CONNECTIONS * MEASURED);
    let mut medians = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let mut micros: Vec<f64> = connection().iter().map(|d| d.as_secs_f64() * 1e6).collect();
        micros.sort_by(f64::total_cmp);
        medians.push(micros[micros.len() / 2]);
        all.extend(micros);
    }
    all.sort_by(f64::total_cmp);
    medians.sort_by(f64::total_cmp);
    let (median, p99) = (all[all.len() / 2], all[all.len() * 99 / 100]);
    println!("{median:.1} {p99:.1} {:.1} {:.1}", medians[0], medians[CONNECTIONS - 1]);
}

/// Every server here echoes the envelope: an answer without its content is an error answer,
/// and timing it would measure the wrong thing.
fn assert_echoed(body: &[u8]) {
    let text = String::from_utf8_lossy(body);
    assert!(text.contains("\"hello\""), "the answer is not the echo: {text}");
}

fn http(addr: &str, path: &str) -> Vec<Duration> {
    let stream = std::net::TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let body = body();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut times = Vec::with_capacity(MEASURED);
    for i in 0..WARM_UP + MEASURED {
        let start = Instant::now();
        writer.write_all(request.as_bytes()).unwrap();
        let mut length = 0usize;
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "unexpected answer: {status}");
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body).unwrap();
        assert_echoed(&body);
        if i >= WARM_UP {
            times.push(start.elapsed());
        }
    }
    times
}

/// A minimal blocking WebSocket client (RFC 6455: handshake, masked text frames out, unmasked
/// frames in), so that both protocols are driven the same way and the server is what is timed.
fn ws(url: &str) -> Vec<Duration> {
    let rest = url.strip_prefix("ws://").expect("a ws:// URL");
    let (addr, path) = rest.split_once('/').map_or((rest, "/".to_owned()), |(a, p)| (a, format!("/{p}")));
    let stream = std::net::TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let handshake = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    writer.write_all(handshake.as_bytes()).unwrap();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
    }
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let body = body();
    let mut frame = match u16::try_from(body.len()).expect("a small envelope") {
        short @ 0..=125 => vec![0x81, 0x80 | short as u8],
        length => [vec![0x81, 0x80 | 126], length.to_be_bytes().to_vec()].concat(),
    };
    frame.extend_from_slice(&mask);
    frame.extend(body.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    let mut times = Vec::with_capacity(MEASURED);
    for i in 0..WARM_UP + MEASURED {
        let start = Instant::now();
        writer.write_all(&frame).unwrap();
        loop {
            let mut head = [0u8; 2];
            reader.read_exact(&mut head).unwrap();
            let mut length = u64::from(head[1] & 0x7f);
            if length == 126 {
                let mut ext = [0u8; 2];
                reader.read_exact(&mut ext).unwrap();
                length = u64::from(u16::from_be_bytes(ext));
            } else if length == 127 {
                let mut ext = [0u8; 8];
                reader.read_exact(&mut ext).unwrap();
                length = u64::from_be_bytes(ext);
            }
            let mut payload = vec![0u8; length as usize];
            reader.read_exact(&mut payload).unwrap();
            if head[0] & 0x0f == 0x1 {
                assert_echoed(&payload);
                break; // the text reply; pings in between are skipped
            }
        }
        if i >= WARM_UP {
            times.push(start.elapsed());
        }
    }
    times
}

/// Serves the floor servers until killed.
fn floor(http_addr: &str, hyper_addr: &str, ws_addr: &str) {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let http = tokio::net::TcpListener::bind(http_addr).await.expect("bind the HTTP floor");
        let hyper = tokio::net::TcpListener::bind(hyper_addr).await.expect("bind the hyper floor");
        let ws = tokio::net::TcpListener::bind(ws_addr).await.expect("bind the WebSocket floor");
        let serve_http = async {
            loop {
                let (stream, _) = http.accept().await.expect("accept");
                stream.set_nodelay(true).unwrap();
                tokio::spawn(echo_http(stream));
            }
        };
        let serve_hyper = async {
            loop {
                let (stream, _) = hyper.accept().await.expect("accept");
                stream.set_nodelay(true).unwrap();
                tokio::spawn(echo_hyper(stream));
            }
        };
        let serve_ws = async {
            loop {
                let (stream, _) = ws.accept().await.expect("accept");
                stream.set_nodelay(true).unwrap();
                tokio::spawn(echo_ws(stream));
            }
        };
        tokio::join!(serve_http, serve_hyper, serve_ws);
    });
}

/// Answers each POST on the connection with its body, until the client leaves.
async fn echo_http(stream: tokio::net::TcpStream) {
    let (reader, mut writer) = stream.into_split();
    let mut reader = tokio::io::BufReader::new(reader);
    let mut line = String::new();
    let mut body = Vec::new();
    let mut answer = Vec::new();
    loop {
        let mut length = 0usize;
        loop {
            line.clear();
            if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        body.resize(length, 0);
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        answer.clear();
        answer.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ");
        answer.extend_from_slice(length.to_string().as_bytes());
        answer.extend_from_slice(b"\r\n\r\n");
        answer.extend_from_slice(&body);
        if writer.write_all(&answer).await.is_err() {
            return;
        }
    }
}

/// Answers each POST on the connection with its body, through hyper, as silpgate serves it.
async fn echo_hyper(stream: tokio::net::TcpStream) {
    use http_body_util::{BodyExt, Full};
    let echo = hyper::service::service_fn(|request: hyper::Request<hyper::body::Incoming>| async move {
        let body = request.into_body().collect().await?.to_bytes();
        let mut response = hyper::Response::new(Full::new(body));
        response
            .headers_mut()
            .insert("content-type", hyper::header::HeaderValue::from_static("application/json"));
        Ok::<_, hyper::Error>(response)
    });
    // Wrapped as silpgate wraps its connections (doors/repoll.rs), so that the floor does not
    // pay the scheduler's wake that silpgate saves.
    let serve = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(stream), echo);
    let _ = silpgate::doors::repoll::Repoll::new(serve).await;
}

/// Answers each text message on the WebSocket with itself, until the client leaves.
async fn echo_ws(stream: tokio::net::TcpStream) {
    let Ok(mut socket) = tokio_tungstenite::accept_async(stream).await else { return };
    while let Some(Ok(message)) = socket.next().await {
        if message.is_text() && socket.send(message).await.is_err() {
            return;
        }
    }
}
