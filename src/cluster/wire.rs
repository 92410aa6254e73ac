//! What cluster mode uses of the AMQP side's connection, and nothing more: the link and its
//! publisher, where to say that the connection must end, the consumer prefetch, the inbound
//! queues ingress takes from, and the limits a delivery is decoded under. The AMQP door hands
//! it over when a connection comes up; the cluster never sees the door itself.

use crate::broker::ending::Endings;
use crate::broker::link::BrokerLink;
use crate::broker::publish::Publisher;

#[derive(Clone)]
pub(crate) struct Wire {
    /// The connection now (its broker user is the cluster's own).
    pub link: BrokerLink,
    /// The connection's confirm-mode publisher.
    pub publisher: Publisher,
    /// Where the cluster says the connection must end (reconnect, or stop on a damaged store).
    pub endings: Endings,
    /// The consumer prefetch of each partition's channel.
    pub prefetch: u16,
    /// The inbound queues ingress moves to the partitions.
    pub inbound: Vec<String>,
    /// The limits a delivery is decoded under (ingress reads each one's conversation).
    pub limits: crate::nlip::Limits,
}
