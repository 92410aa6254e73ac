//! A child process's CPU time, read from /proc: the benchmarks that run silpgate as a process
//! of its own report CPU per message with it.

use std::process::Command;
use std::time::Duration;

/// The user + system CPU time process `pid` has used so far.
///
/// # Panics
/// The process is gone, or /proc is not Linux's.
pub fn cpu_time(pid: u32) -> Duration {
    read_cpu_time(pid).expect("the process runs and /proc is Linux's")
}

/// [`cpu_time`], or `None` when the process is gone.
fn read_cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_secs_f64(ticks as f64 / clock_ticks_per_second()))
}

/// The user + system CPU time of every RabbitMQ node on this machine (`beam.smp` processes)
/// so far: on a machine the broker shares, what it spends per message is not the relay's to
/// spend.
#[allow(dead_code)] // not every benchmark reports it
pub fn broker_cpu_time() -> Duration {
    let processes = std::fs::read_dir("/proc").expect("/proc is mounted");
    processes
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "beam.smp")
        })
        .filter_map(read_cpu_time)
        .sum()
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
    // Asked once: reading the CPU of every broker node would otherwise start `getconf` once a
    // node, inside the window being measured.
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        let out = Command::new("getconf").arg("CLK_TCK").output().expect("getconf runs");
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("CLK_TCK is a number")
    })
}
