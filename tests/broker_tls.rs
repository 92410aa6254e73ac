//! `amqps://` is TLS, verified: the first bytes silpgate sends to an `amqps` address are a TLS
//! handshake (never the AMQP header, never the password); against the real RabbitMQ's TLS
//! listener (127.0.0.1:5671, its certificate signed by a CA tests/run.sh makes and names in
//! `SILPGATE_TEST_BROKER_CA`) silpgate relays with `[amqp] ca_file` naming that CA, and refuses
//! the broker without it.

mod support;

use std::io::Read;
use std::time::{Duration, Instant};
use support::broker::{self, Daemon, Names};

/// The CA that signed the broker's TLS certificate; tests/run.sh makes it.
fn broker_ca() -> String {
    let ca = std::env::var("SILPGATE_TEST_BROKER_CA")
        .unwrap_or_else(|_| "/var/lib/rabbitmq/silpgate-test-tls/ca.pem".to_owned());
    assert!(
        std::path::Path::new(&ca).exists(),
        "{ca} is missing: tests/run.sh makes the test CA and RabbitMQ's TLS listener on 127.0.0.1:5671"
    );
    ca
}

/// The broker's TLS listener, in this binary's virtual host.
fn tls_url() -> String {
    format!("amqps://guest:guest@localhost:5671/{}", broker::vhost())
}

/// `names`' configuration on `url`, with `extra` in its `[amqp]` section.
fn config_on(names: &Names, dir: &std::path::Path, url: &str, extra: &str) -> String {
    let config = names.config(&dir.join("store"), extra, true);
    let (start, _) = config.match_indices("url = \"").next().expect("the configuration names a url");
    let end = start + config[start..].find('\n').expect("one line");
    format!("{}url = \"{url}\"{}", &config[..start], &config[end..])
}

#[test]
fn the_first_bytes_to_an_amqps_address_are_a_tls_handshake_and_carry_no_password() {
    let names = Names::new("tls-first-bytes");
    let dir = broker::temp_dir("tls-first-bytes");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let url = format!("amqps://guest:s3cret-broker-pass@127.0.0.1:{port}/%2f");
    let _daemon = Daemon::start(&config_on(&names, &dir, &url, ""), &dir);
    let (mut socket, _) = listener.accept().expect("silpgate connects");
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut first = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buffer = [0u8; 1024];
    while first.len() < 64 && Instant::now() < deadline {
        match socket.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => first.extend_from_slice(&buffer[..n]),
        }
    }
    assert!(first.len() >= 5, "silpgate sent something: {first:?}");
    assert_eq!(
        &first[..2],
        &[0x16, 0x03],
        "a TLS handshake record, not {:?}",
        String::from_utf8_lossy(&first)
    );
    let text = String::from_utf8_lossy(&first);
    assert!(!text.contains("AMQP"), "no AMQP protocol header in clear: {text:?}");
    assert!(!text.contains("s3cret-broker-pass"), "no password in clear");
}

#[test]
fn amqps_to_rabbitmq_relays_when_the_broker_is_verified_against_ca_file() {
    let ca = broker_ca();
    let names = Names::new("tls-verified");
    let dir = broker::temp_dir("tls-verified");
    let url = tls_url();
    let daemon = Daemon::start(&config_on(&names, &dir, &url, &format!("ca_file = \"{ca}\"")), &dir);
    daemon.wait_ready(Duration::from_secs(30));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (connection, channel) = broker::channel().await;
        let properties = lapin::BasicProperties::default()
            .with_message_id("tls-1".into())
            .with_content_type("application/json".into());
        let one = vec![(names.inbound(), broker::envelope(1, 0, None), properties)];
        broker::publish_all(&channel, &names.inbound_exchange(), one).await;
        let sink =
            broker::collect(&channel, &names.sink(), Duration::from_secs(30), |got| !got.is_empty()).await;
        assert_eq!(sink.len(), 1, "relayed over the TLS connection");
        assert_eq!(sink[0].message_id, "tls-1:0");
        drop(daemon);
        let _ = connection.close(200, "done".into()).await;
    });
}

#[test]
fn amqps_to_a_broker_whose_certificate_does_not_verify_never_connects() {
    broker_ca();
    let names = Names::new("tls-unverified");
    let dir = broker::temp_dir("tls-unverified");
    // The system's roots do not know the test CA.
    let daemon = Daemon::start(&config_on(&names, &dir, &tls_url(), ""), &dir);
    daemon.wait_logged("Cannot connect to a broker node", 1, Duration::from_secs(30));
    assert_ne!(daemon.readyz(), 200, "not ready on a broker it could not verify");
    let log = daemon.log_text();
    assert!(log.to_lowercase().contains("certificate"), "the log says why: {log}");
    assert!(!log.contains("guest:guest"), "the URI is never shown");
}

#[test]
fn a_missing_ca_file_stops_the_start_saying_which() {
    let names = Names::new("tls-no-ca");
    let dir = broker::temp_dir("tls-no-ca");
    let missing = dir.join("no-such-ca.pem");
    let config = config_on(&names, &dir, &tls_url(), &format!("ca_file = \"{}\"", missing.display()));
    let path = dir.join("silpgate.toml");
    std::fs::write(&path, config).unwrap();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_silpgate"));
    command.args(["run", "--config"]).arg(&path);
    // Bounded: a daemon that starts anyway would otherwise hang the test instead of failing it.
    let run = support::process::run_bounded(command, Duration::from_secs(30));
    assert!(!run.status.success(), "silpgate must not start without its CA file");
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(said.contains("amqp.ca_file") && said.contains("no-such-ca.pem"), "{said}");
}
