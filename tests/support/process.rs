//! Child processes with a bound: a test that runs a helper program fails with a message when
//! the program hangs, instead of hanging the test run.

#![allow(dead_code, reason = "each test binary uses its own part of the support module")]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `command` to its end and returns its output; kills it and fails past `limit`. The
/// output is read while it runs, so a chatty program cannot block on a full pipe.
pub fn run_bounded(command: Command, limit: Duration) -> Output {
    run(command, None, limit)
}

/// As [`run_bounded`], with `input` written to the program's stdin (by a thread of its own,
/// so that a program answering line by line never waits on a test still writing).
pub fn run_bounded_with_input(command: Command, input: &[u8], limit: Duration) -> Output {
    run(command, Some(input.to_vec()), limit)
}

fn run(mut command: Command, input: Option<Vec<u8>>, limit: Duration) -> Output {
    let stdin = if input.is_some() { Stdio::piped() } else { Stdio::null() };
    let child = command.stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let mut child =
        child.unwrap_or_else(|e| panic!("cannot run {command:?} (tests/run.sh installs it): {e}"));
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // A program that stops reading early (a usage error) closes the pipe: not a failure.
        std::thread::spawn(move || {
            let _ = std::io::Write::write_all(&mut stdin, &input);
        });
    }
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut bytes);
        bytes
    });
    let err = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stderr, &mut bytes);
        bytes
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child can be waited for") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() }
}
