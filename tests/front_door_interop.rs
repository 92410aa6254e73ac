//! Interop with real Python NLIP clients: the NLIP SDK builds the messages and parses every
//! reply; the standard library posts over HTTP; the `websockets` package uses /nlip/ws/text.
//! tests/run.sh installs both into target/pyenv.

mod support;

use silpgate::config::Config;
use silpgate::daemon::{self, Overrides};
use std::path::PathBuf;

const CONFIG: &str = r#"
[[routes]]
name = "decode-back"
destination = "reply"
mode = "decode"
[routes.match]
label = "decode"
[http]
plain = true
"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_talks_to_silpgate_over_http_and_websocket() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("interop-{}", std::process::id()));
    let overrides =
        Overrides { listen: Some("127.0.0.1:0".into()), store: Some(dir), ..Overrides::default() };
    let daemon = daemon::start(Config::parse(CONFIG).unwrap(), overrides).await.unwrap();
    let addr = daemon.local_addr().unwrap();
    tokio::spawn(daemon.serve(std::future::pending()));

    let python = std::env::var_os("SILPGATE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/pyenv/bin/python"));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/front_door_check.py");
    let output = tokio::task::spawn_blocking(move || {
        let mut command = std::process::Command::new(&python);
        command.arg(&script).arg(addr.to_string());
        support::process::run_bounded(command, std::time::Duration::from_secs(120))
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("ok: 0 failures"), "{stdout}\n{stderr}");
}
