//! The broker nodes silpgate may connect to, and the order it tries them in.
//!
//! A RabbitMQ cluster is reached through any of its nodes. silpgate keeps the list, starts at
//! a random place in it (so that many instances spread over the nodes), and after a
//! connection is lost tries the next node at once: a dead node is skipped in one round, and a
//! backoff is due only once every node of a round has refused. Nodes are named `host:port`
//! everywhere they are shown; a URI carries a password and is never shown.

use lapin::uri::AMQPUri;
use std::fmt;

/// A broker node as logs, spans, metrics and `/readyz` name it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
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
pub struct Address {
    pub uri: AMQPUri,
    pub node: Node,
}

/// Parses one broker URI. The parser's own error quotes the URI, password included, so it is
/// replaced by one that says what is wrong without the value.
///
/// # Errors
/// A message naming `key` (the configuration key the URI came from), never the URI.
pub fn parse(uri: &str, key: &str) -> Result<Address, String> {
    let uri = uri.trim().parse::<AMQPUri>().map_err(|_| {
        format!("{key} is not an AMQP URI of the form amqp://user:password@host:port/vhost (the value is not shown)")
    })?;
    let node = Node { host: uri.authority.host.clone(), port: uri.authority.port };
    Ok(Address { uri, node })
}

/// The address list and where the next round of connection attempts starts.
#[derive(Debug, Clone)]
pub struct Addresses {
    list: Vec<Address>,
    next: usize,
}

impl Addresses {
    /// Parses every URI (`key` names where they came from, for errors).
    ///
    /// # Errors
    /// The first URI that does not parse, named by its position; or an empty list.
    pub fn parse(uris: &[String], key: &str) -> Result<Addresses, String> {
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
    pub fn round(&self) -> impl Iterator<Item = (usize, &Address)> {
        let len = self.list.len();
        (0..len).map(move |step| {
            let index = (self.next + step) % len;
            (index, &self.list[index])
        })
    }

    /// Every address authenticates with `password` (kept out of the configured URIs).
    pub fn set_password(&mut self, password: &str) {
        for address in &mut self.list {
            address.uri.authority.userinfo.password = password.to_owned();
        }
    }

    /// A connection to `index` was made: when it is lost, the next round starts after it.
    pub fn connected(&mut self, index: usize) {
        self.next = (index + 1) % self.list.len();
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Every node of the list, for a log line.
    pub fn nodes(&self) -> Vec<String> {
        self.list.iter().map(|a| a.node.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
