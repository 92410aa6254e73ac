//! The OTLP receiver of the telemetry tests: the official OpenTelemetry protos read by
//! tests/interop/otlp_sink.py, which writes each span and metric point it receives as a JSON
//! line.
#![allow(dead_code, reason = "each test binary uses its own part of the support module")]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The OTLP receiver, killed when dropped.
pub struct Sink(std::process::Child);

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = self.0.kill();
        // Reaped within a bound: a receiver that outlived SIGKILL must not hang the test run.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while matches!(self.0.try_wait(), Ok(None)) {
            assert!(
                std::time::Instant::now() < deadline,
                "the OTLP receiver did not exit within 10 s of SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts the OTLP receiver on a port it picks itself (a port picked here and released could be
/// taken by someone else before the receiver binds it).
pub fn start_sink(out: &std::path::Path) -> (Sink, u16) {
    let python = std::env::var_os("SILPGATE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/pyenv/bin/python"));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/otlp_sink.py");
    let mut child =
        Command::new(&python).arg(script).arg("0").arg(out).stdout(Stdio::piped()).spawn().unwrap_or_else(
            |e| panic!("cannot run {} ({e}); tests/run.sh installs opentelemetry-proto", python.display()),
        );
    let stdout = child.stdout.take().unwrap();
    // Killed on drop from here on, whatever the wait below finds.
    let sink = Sink(child);
    // A pipe read has no time bound of its own: the first line is read on a thread.
    let (said, first) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = said.send(line);
    });
    let first = first
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("the OTLP receiver did not say its port within 60 s"));
    let port = first.trim().strip_prefix("listening ").and_then(|p| p.parse().ok());
    let port = port.unwrap_or_else(|| panic!("the OTLP receiver starts and says its port: {first:?}"));
    (sink, port)
}

/// What the receiver wrote to `out`: the metric points, then the spans.
pub fn received(out: &std::path::Path) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    std::fs::read_to_string(out)
        .expect("spans arrived at the receiver")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .partition(|v| v.get("metric").is_some())
}
