//! The broker nodes silpgate may connect to, and the order it tries them in.
//!
//! A RabbitMQ cluster is reached through any of its nodes. silpgate keeps the list, starts at
//! a random place in it (so that many instances spread over the nodes), and after a
//! connection is lost tries the next node at once: a dead node is skipped in one round, and a
//! backoff is due only once every node of a round has refused. Nodes are named `host:port`
//! everywhere they are shown; a URI carries a password and is never shown.
//!
//! An `amqps://` address is TLS (rustls on ring, the provider of the rest of the stack): the
//! broker's certificate is verified against the system's roots plus `[amqp] ca_file`, never
//! skipped, and a client certificate (`cert_file` + `key_file`) may be presented for RabbitMQ's
//! EXTERNAL mechanism (`?auth_mechanism=external` on the URI).

use crate::config::AmqpConfig;
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::uri::AMQPUri;
use lapin::{Connection, ConnectionProperties, DefaultConnectionBuilder};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// A broker node as logs, spans, metrics and `/readyz` name it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Node {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// One address of the list: where to connect, and how to name it.
#[derive(Debug, Clone)]
pub(crate) struct Address {
    pub uri: AMQPUri,
    pub node: Node,
    /// The certificates an `amqps://` connection verifies and presents.
    tls: Arc<OwnedTLSConfig>,
}

impl Address {
    /// Opens a connection to the node: TLS for `amqps://`, verified.
    ///
    /// # Errors
    /// What lapin says (the node refused, the certificate did not verify, the login failed).
    pub(crate) async fn connect(&self, properties: ConnectionProperties) -> lapin::Result<Connection> {
        DefaultConnectionBuilder::new()?
            .with_uri(self.uri.clone())
            .with_properties(properties)
            .with_tls_config(OwnedTLSConfig::clone(&self.tls))
            .connect()
            .await
    }
}

/// The certificates of `amqps://` connections, read once at start.
///
/// # Errors
/// A file that cannot be read or holds no PEM certificate, named by its key; a client
/// certificate without its key, or a key without its certificate.
pub(crate) fn tls(
    ca_file: Option<&Path>,
    cert_file: Option<&Path>,
    key_file: Option<&Path>,
) -> Result<OwnedTLSConfig, String> {
    let read =
        |path: &Path, key: &str| std::fs::read(path).map_err(|e| format!("{key} {}: {e}", path.display()));
    let cert_chain = match ca_file {
        Some(path) => {
            let pem = String::from_utf8(read(path, "amqp.ca_file")?)
                .map_err(|_| format!("amqp.ca_file {}: not PEM text", path.display()))?;
            if !pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(format!("amqp.ca_file {}: holds no PEM certificate", path.display()));
            }
            Some(pem)
        }
        None => None,
    };
    let identity = match (cert_file, key_file) {
        (Some(cert), Some(key)) => Some(OwnedIdentity::PKCS8 {
            pem: read(cert, "amqp.cert_file")?,
            key: read(key, "amqp.key_file")?,
        }),
        (None, None) => None,
        _ => return Err("amqp.cert_file and amqp.key_file go together: set both or neither".into()),
    };
    Ok(OwnedTLSConfig { identity, cert_chain })
}

/// Parses one broker URI. The parser's own error quotes the URI, password included, so it is
/// replaced by one that says what is wrong without the value.
///
/// # Errors
/// A message naming `key` (the configuration key the URI came from), never the URI.
pub(crate) fn parse(uri: &str, key: &str) -> Result<Address, String> {
    let uri = uri.trim().parse::<AMQPUri>().map_err(|_| {
        format!("{key} is not an AMQP URI of the form amqp://user:password@host:port/vhost (the value is not shown)")
    })?;
    let node = Node { host: uri.authority.host.clone(), port: uri.authority.port };
    Ok(Address { uri, node, tls: Arc::default() })
}

/// The address list and where the next round of connection attempts starts.
#[derive(Debug, Clone)]
pub(crate) struct Addresses {
    list: Vec<Address>,
    next: usize,
}

impl Addresses {
    /// The configured broker addresses, parsed, with the TLS settings and, when
    /// `password_env` names a set variable, its password for every address.
    ///
    /// # Errors
    /// An address that is not an AMQP URI (named by its key, never shown), or a certificate
    /// file that cannot be read.
    pub(crate) fn of(amqp: &AmqpConfig) -> Result<Addresses, String> {
        let (uris, key) = amqp.addresses();
        let mut addresses = Addresses::parse(&uris, &key)?;
        addresses.set_tls(tls(amqp.ca_file.as_deref(), amqp.cert_file.as_deref(), amqp.key_file.as_deref())?);
        if let Some(password) = amqp.password_env.as_deref().and_then(|name| std::env::var(name).ok()) {
            addresses.set_password(&password);
        }
        Ok(addresses)
    }

    /// Parses every URI (`key` names where they came from, for errors).
    ///
    /// # Errors
    /// The first URI that does not parse, named by its position; or an empty list.
    pub(crate) fn parse(uris: &[String], key: &str) -> Result<Addresses, String> {
        if uris.is_empty() {
            return Err(format!("{key} holds no broker address"));
        }
        let list = uris
            .iter()
            .enumerate()
            .map(|(i, uri)| parse(uri, &if uris.len() == 1 { key.to_owned() } else { format!("{key}[{i}]") }))
            .collect::<Result<Vec<_>, _>>()?;
        let next = usize::try_from(crate::util::backoff::random() % list.len() as u64).unwrap_or(0);
        Ok(Addresses { list, next })
    }

    /// The addresses of one round, each once, starting where the last round should go on.
    pub(crate) fn round(&self) -> impl Iterator<Item = (usize, &Address)> {
        let len = self.list.len();
        (0..len).map(move |step| {
            let index = (self.next + step) % len;
            (index, &self.list[index])
        })
    }

    /// Every address authenticates with `password` (kept out of the configured URIs).
    pub(crate) fn set_password(&mut self, password: &str) {
        for address in &mut self.list {
            address.uri.authority.userinfo.password = password.to_owned();
        }
    }

    /// Every `amqps://` address verifies and presents these certificates.
    pub(crate) fn set_tls(&mut self, tls: OwnedTLSConfig) {
        let tls = Arc::new(tls);
        for address in &mut self.list {
            address.tls = tls.clone();
        }
    }

    /// A connection to `index` was made: when it is lost, the next round starts after it.
    pub(crate) fn connected(&mut self, index: usize) {
        self.next = (index + 1) % self.list.len();
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// Every node of the list, for a log line.
    pub(crate) fn nodes(&self) -> Vec<String> {
        self.list.iter().map(|a| a.node.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn a_bad_address_is_named_by_its_key_and_never_shown() {
        let config =
            Config::parse("[amqp]\nurls = [\"amqp://guest:guest@a:5672/%2f\", \"nope://x:hunter2@b\"]\n")
                .unwrap();
        let bad = Addresses::of(config.amqp.as_ref().unwrap()).unwrap_err();
        assert!(bad.contains("amqp.urls[1]") && !bad.contains("hunter2"), "{bad}");
    }

    #[test]
    fn a_password_from_the_environment_goes_to_every_address() {
        let config = Config::parse(
            "[amqp]\nurls = [\"amqp://silpgate@a:5672/%2f\", \"amqp://silpgate@b:5672/%2f\"]\npassword_env = \"SILPGATE_TEST_BROKER_PASSWORD_A\"\n",
        )
        .unwrap();
        // SAFETY: no other test reads or writes this variable.
        unsafe { std::env::set_var("SILPGATE_TEST_BROKER_PASSWORD_A", "s3cret") };
        let addresses = Addresses::of(config.amqp.as_ref().unwrap()).unwrap();
        let passwords: Vec<String> =
            addresses.round().map(|(_, a)| a.uri.authority.userinfo.password.clone()).collect();
        assert_eq!(passwords, ["s3cret", "s3cret"]);
    }

    fn three() -> Addresses {
        let uris: Vec<String> =
            (5672..5675).map(|port| format!("amqp://guest:secret@127.0.0.1:{port}/%2f")).collect();
        Addresses::parse(&uris, "amqp.urls").unwrap()
    }

    #[test]
    fn a_round_visits_every_node_once_and_the_next_starts_after_the_one_connected() {
        let mut addresses = three();
        let first: Vec<usize> = addresses.round().map(|(i, _)| i).collect();
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2]);
        addresses.connected(1);
        let ports: Vec<u16> = addresses.round().map(|(_, a)| a.node.port).collect();
        assert_eq!(ports, [5674, 5672, 5673]);
        addresses.connected(2);
        assert_eq!(addresses.round().next().map(|(_, a)| a.node.port), Some(5672));
    }

    #[test]
    fn a_bad_address_is_named_by_its_place_and_never_shown() {
        let uris = vec!["amqp://guest:guest@127.0.0.1:5672/%2f".to_owned(), "http://x:hunter2@y".to_owned()];
        let e = Addresses::parse(&uris, "amqp.urls").unwrap_err();
        assert!(e.contains("amqp.urls[1]") && !e.contains("hunter2"), "{e}");
        assert!(Addresses::parse(&[], "amqp.urls").unwrap_err().contains("no broker address"));
    }

    #[test]
    fn nodes_are_shown_as_host_and_port_only() {
        let addresses = three();
        let mut nodes = addresses.nodes();
        nodes.sort();
        assert_eq!(nodes, ["127.0.0.1:5672", "127.0.0.1:5673", "127.0.0.1:5674"]);
        assert!(!format!("{:?}", addresses.nodes()).contains("secret"));
    }
}
