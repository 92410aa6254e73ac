//! A child process's CPU time, read from /proc: the benchmarks that run silpgate as a process
//! of its own report CPU per message with it.

use std::process::Command;
use std::time::Duration;

/// The user + system CPU time process `pid` has used so far.
///
/// # Panics
/// The process is gone, or /proc is not Linux's.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process runs");
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')').expect("a stat line").1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_secs_f64(ticks as f64 / clock_ticks_per_second())
}

/// How many times the threads of process `pid` have given up or lost their CPU so far
/// (voluntary and involuntary context switches, summed over its live threads): on this VM a
/// hand-off between threads costs more than most work done per message.
#[allow(dead_code)] // not every benchmark reports it
pub fn context_switches(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process runs");
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("status")).ok())
        .map(|status| {
            status
                .lines()
                .filter_map(|line| line.split_once(':'))
                .filter(|(key, _)| key.ends_with("ctxt_switches"))
                .filter_map(|(_, value)| value.trim().parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// The unit of /proc's CPU times.
fn clock_ticks_per_second() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().expect("getconf runs");
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("CLK_TCK is a number")
}
