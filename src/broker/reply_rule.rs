//! Which queues a producer may name as its reply address (`reply_to`, `nlip-reply-*`).
//! silpgate publishes replies and answers there with its own broker rights, so an address is
//! a write the producer asks silpgate to make for it: one allowed to write only to the inbound
//! exchange could otherwise fill any queue silpgate may write to, silpgate's own among them.
//!
//! Allowed: RabbitMQ's direct reply-to (`amq.rabbitmq.reply-to`), server-named queues
//! (`amq.gen-`, what an exclusive queue declared without a name gets), and queues under one of
//! `amqp.reply_prefixes`. Never a queue silpgate declares itself, whatever prefix covers it.

use std::collections::HashSet;

/// What every broker offers a client that waits for a reply, allowed without configuration.
const ALWAYS: [&str; 2] = ["amq.rabbitmq.reply-to", "amq.gen-"];

/// The reply addresses silpgate publishes to on a producer's behalf.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReplyRule {
    /// `amqp.reply_prefixes`.
    prefixes: Vec<String>,
    /// The queues silpgate declares.
    own: HashSet<String>,
    /// Its reply queue: the instances' own queues and their probes start with it and a dot.
    reply_queue: String,
}

impl ReplyRule {
    pub(crate) fn new(prefixes: &[String], own: impl IntoIterator<Item = String>, reply_queue: &str) -> Self {
        ReplyRule {
            prefixes: prefixes.to_vec(),
            own: own.into_iter().collect(),
            reply_queue: reply_queue.to_owned(),
        }
    }

    /// Why silpgate will not publish to `address` for a producer; `None` when it will.
    pub(crate) fn refusal(&self, address: &str) -> Option<String> {
        let own = self.own.contains(address)
            || address == self.reply_queue
            || address.strip_prefix(self.reply_queue.as_str()).is_some_and(|rest| rest.starts_with('.'));
        if own {
            return Some(format!("the reply address '{address}' is a queue silpgate itself uses"));
        }
        let allowed = ALWAYS.iter().any(|p| address.starts_with(p))
            || self.prefixes.iter().any(|p| !p.is_empty() && address.starts_with(p.as_str()));
        (!allowed).then(|| {
            format!(
                "the reply address '{address}' is not one silpgate replies to: use direct reply-to, a server-named queue, or a queue under amqp.reply_prefixes"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_reply_to_server_named_and_configured_queues_pass_and_silpgates_own_never_do() {
        let own = ["app.in".to_owned(), "silpgate.dead".to_owned(), "app.partition.03".to_owned()];
        let rule = ReplyRule::new(&["app.".to_owned(), String::new()], own, "silpgate.replies");
        for fine in
            ["amq.rabbitmq.reply-to", "amq.rabbitmq.reply-to.g1h2AA==", "amq.gen-JzTY20BRgKO", "app.client-7"]
        {
            assert_eq!(rule.refusal(fine), None, "{fine}");
        }
        for (own, says) in [
            ("app.in", "silpgate itself uses"),
            ("app.partition.03", "silpgate itself uses"),
            ("silpgate.dead", "silpgate itself uses"),
            ("silpgate.replies", "silpgate itself uses"),
            ("silpgate.replies.b", "silpgate itself uses"),
            ("silpgate.replies.b.quorum-probe", "silpgate itself uses"),
            ("silpgate.repliesX", "amqp.reply_prefixes"),
            ("payroll", "amqp.reply_prefixes"),
            ("", "amqp.reply_prefixes"),
        ] {
            let why = rule.refusal(own).unwrap_or_else(|| panic!("{own} is refused"));
            assert!(why.contains(says), "{own}: {why}");
        }
    }
}
