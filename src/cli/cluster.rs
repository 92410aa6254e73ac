//! `silpgate cluster status`: asks a running instance (`GET /cluster` on its listener) which
//! members it hears, which partitions it serves and waits on as a standby, how many channels
//! that takes, what their takeovers cost, and how far its streams are applied.

use super::EXIT_INVALID;
use clap::Subcommand;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use serde_json::Value;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub(super) enum ClusterCommand {
    /// Show the members, which partitions the instance owns and stands by for, its channels,
    /// its replays and its changelog and lock lag.
    Status {
        /// The instance's configuration: its `http.listen` address is asked.
        #[arg(long, conflicts_with = "url")]
        config: Option<PathBuf>,
        /// The instance's plain-HTTP address, e.g. `http://127.0.0.1:8080` (behind TLS, ask
        /// `GET /cluster` with any HTTPS client).
        #[arg(long)]
        url: Option<String>,
        /// Print the instance's JSON answer as it is.
        #[arg(long)]
        json: bool,
    },
}

pub(super) fn run(command: ClusterCommand) -> ExitCode {
    let ClusterCommand::Status { config, url, json } = command;
    let base = match base_url(url, config) {
        Ok(base) => base,
        Err(e) => return fail(&e),
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let status = match runtime.block_on(fetch(&format!("{}/cluster", base.trim_end_matches('/')))) {
        Ok(status) => status,
        Err(e) => return fail(&e),
    };
    if json {
        println!("{status}");
    } else {
        print!("{}", render(&status));
    }
    ExitCode::SUCCESS
}

/// `silpgate config reload`: asks the instance to read its configuration file again, with the
/// admin token from `token_env`, and prints what changed.
pub(super) fn reload(config: Option<PathBuf>, url: Option<String>, token_env: &str) -> ExitCode {
    let base = match base_url(url, config) {
        Ok(base) => base,
        Err(e) => return fail(&e),
    };
    let Ok(token) = std::env::var(token_env) else {
        return fail(&format!(
            "{token_env} is not set: it holds the token of a principal with the admin role"
        ));
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let url = format!("{}/admin/reload", base.trim_end_matches('/'));
    match runtime.block_on(ask(hyper::Method::POST, &url, Some(&token))) {
        Ok(applied) => {
            let changed = applied["changed"].as_array().map_or_else(Vec::new, |c| {
                c.iter().filter_map(Value::as_str).map(str::to_owned).collect::<Vec<_>>()
            });
            let changed = if changed.is_empty() { "nothing".to_owned() } else { changed.join(", ") };
            println!(
                "reloaded: configuration {} (changed: {changed})",
                applied["digest"].as_str().unwrap_or("?")
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// The instance's base URL: `url`, else the `http.listen` address of the configuration.
fn base_url(url: Option<String>, config: Option<PathBuf>) -> Result<String, String> {
    if let Some(url) = url {
        return Ok(url);
    }
    let loaded = match config {
        Some(path) => crate::config::Config::load(&path),
        None => Ok(crate::config::Config::default()),
    };
    loaded.map(|config| format!("http://{}", config.http.listen)).map_err(|e| e.to_string())
}

fn fail(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_INVALID)
}

/// GETs `url` over plain HTTP/1.1 and parses the JSON answer.
async fn fetch(url: &str) -> Result<Value, String> {
    ask(hyper::Method::GET, url, None).await
}

/// Sends `method` to `url` over plain HTTP/1.1, with `token` as its bearer token, and parses
/// the JSON answer; a non-2xx answer is an error with the NLIP error message's text.
pub(super) async fn ask(method: hyper::Method, url: &str, token: Option<&str>) -> Result<Value, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let host = uri.host().ok_or_else(|| format!("{url}: no host"))?.to_owned();
    let port = uri.port_u16().unwrap_or(80);
    let stream = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| format!("{host}:{port}: {e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let mut request = hyper::Request::builder().method(method).uri(uri.path());
    request = request.header(hyper::header::HOST, format!("{host}:{port}"));
    if let Some(token) = token {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    let value: Value = serde_json::from_slice(&body).map_err(|e| format!("{url} answered no JSON: {e}"))?;
    if !status.is_success() {
        let reason =
            value.pointer("/content/message").or_else(|| value.pointer("/content")).unwrap_or(&value);
        return Err(format!("{url} answered {status}: {reason}"));
    }
    Ok(value)
}

/// The status as a table: the instance's share, one line per partition, then the lock stream.
fn render(status: &Value) -> String {
    render_at(status, crate::util::time::now_millis())
}

/// [`render`], with the last takeovers' ages as of `now` (milliseconds since the epoch).
fn render_at(status: &Value, now: u64) -> String {
    let number = |v: &Value| v.as_u64().map_or("-".to_owned(), |n| n.to_string());
    let list = |v: &Value| {
        let items: Vec<String> = v
            .as_array()
            .into_iter()
            .flatten()
            .map(|item| item.as_str().map_or_else(|| item.to_string(), str::to_owned))
            .collect();
        if items.is_empty() { "none".to_owned() } else { items.join(" ") }
    };
    let owned = status["owned"].as_array().map_or(0, Vec::len);
    let standby = status["standby"].as_array().map_or(0, Vec::len);
    let mut out = format!(
        "instance {}: owns {owned} of {} partitions; broker node {}\nconfiguration: {} (loaded {})\n\
         owned: {}\nstandby for {standby}: {}\nchannels: {} ({} for partitions)\nmembers: {}\ntakeovers since start: {}\n\
         {:<10} {:<28} {:<16} {:>7} {:>9} {:>10} {:>15} {:>15}\n",
        status["instance"].as_str().unwrap_or("?"),
        number(&status["partitions_total"]),
        status["broker"].as_str().unwrap_or("none (not connected)"),
        status["config"]["digest"].as_str().unwrap_or("?"),
        status["config"]["loaded_at"]
            .as_u64()
            .map_or("?".to_owned(), |at| format!("{} s ago", now.saturating_sub(at) / 1000)),
        list(&status["owned"]),
        list(&status["standby"]),
        number(&status["channels"]["total"]),
        number(&status["channels"]["partitions"]),
        list(&status["members"]),
        number(&status["takeovers"]),
        "partition",
        "queue",
        "owner",
        "here",
        "replayed",
        "replay_ms",
        "taken_over_ago",
        "applied_offset",
    );
    for p in status["partitions"].as_array().into_iter().flatten() {
        let owned = match (&p["owned"], &p["subscribed"]) {
            (Value::Bool(true), _) => "yes",
            (_, Value::Bool(true)) => "standby",
            _ => "no",
        };
        let last = &p["last_takeover"];
        let taken_over = last["at_ms"].as_u64().map_or("never".to_owned(), |at| {
            let ago = now.saturating_sub(at);
            format!("{}.{}s", ago / 1000, ago % 1000 / 100)
        });
        out.push_str(&format!(
            "{:<10} {:<28} {:<16} {:>7} {:>9} {:>10} {:>15} {:>15}\n",
            number(&p["partition"]),
            p["queue"].as_str().unwrap_or("?"),
            p["owner"].as_str().unwrap_or("-"),
            owned,
            number(&p["replayed_entries"]),
            number(&last["replay_ms"]),
            taken_over,
            number(&p["changelog_applied_offset"]),
        ));
    }
    let lock = &status["lock"];
    out.push_str(&format!(
        "lock stream {}: applied offset {}, {} records, follow lag {}\n",
        lock["stream"].as_str().unwrap_or("?"),
        number(&lock["applied_offset"]),
        number(&lock["records"]),
        number(&lock["follow_lag"]),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_the_share_the_channels_and_each_partitions_part() {
        let status = serde_json::json!({
            "instance": "d",
            "partitions_total": 3,
            "broker": "127.0.0.1:5672",
            "owned": [0],
            "standby": [2],
            "subscribed": [0, 2],
            "channels": { "partitions": 2, "total": 6 },
            "members": ["a", "d"],
            "takeovers": 1,
            "partitions": [
                { "partition": 0, "queue": "q.0", "owner": "d", "owned": true, "subscribed": true, "replayed_entries": 5,
                  "last_takeover": { "at_ms": 10_000, "replay_ms": 42, "replayed_entries": 5 } },
                { "partition": 1, "queue": "q.1", "owner": "a", "owned": false, "subscribed": false },
                { "partition": 2, "queue": "q.2", "owner": "a", "owned": false, "subscribed": true,
                  "last_takeover": { "at_ms": 2_000, "replay_ms": 7, "replayed_entries": 0 } },
            ],
            "lock": { "stream": "lock", "applied_offset": 7, "records": 2, "follow_lag": 0 },
            "config": { "digest": "ab12", "loaded_at": 2_500 },
        });
        let table = render_at(&status, 12_500);
        let mut lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "instance d: owns 1 of 3 partitions; broker node 127.0.0.1:5672");
        assert_eq!(lines.remove(1), "configuration: ab12 (loaded 10 s ago)");
        assert_eq!(lines[1], "owned: 0");
        assert_eq!(lines[2], "standby for 1: 2");
        assert_eq!(lines[3], "channels: 6 (2 for partitions)");
        assert_eq!(lines[4], "members: a d");
        assert_eq!(lines[5], "takeovers since start: 1");
        let column = |n: usize| -> Vec<&str> {
            lines[7..10].iter().map(|l| l.split_whitespace().nth(n).unwrap()).collect()
        };
        assert_eq!(column(2), ["d", "a", "a"], "the owner as the members rank it, served or idle");
        assert_eq!(column(3), ["yes", "no", "standby"]);
        assert_eq!(column(5), ["42", "-", "7"], "the last takeover's replay");
        assert_eq!(column(6), ["2.5s", "never", "10.5s"], "and how long ago it was");
        assert!(lines[10].starts_with("lock stream lock: applied offset 7"), "{table}");
    }
}
