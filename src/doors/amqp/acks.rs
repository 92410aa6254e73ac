//! Acknowledgements for one consuming channel, sent the way RabbitMQ's Shovel sends them: one
//! `basic.ack` with `multiple` for every run of settled deliveries, instead of one frame (and,
//! in lapin, one spawned task) per message.
//!
//! A delivery counts as settled once it is safe to forget: its state flushed and everything
//! it caused confirmed (to be acknowledged), or already given back to the broker one by one (a
//! nack). Delivery tags on a channel are consecutive from 1, so the book knows the lowest tag
//! not yet settled; a `multiple` acknowledgement up to the highest settled tag below it covers
//! exactly the deliveries that are done, never one still in work, whatever order the workers
//! finish in. A tag the book never hears of (a delivery still in a worker's retries) holds the
//! run back: settled deliveries above it that have waited [`LINGER`] are acknowledged one by
//! one, so one slow conversation does not hold everyone's acknowledgements.
//!
//! RabbitMQ closes the channel on an acknowledgement for a tag it no longer holds, so frames
//! go out in the order the book computed them: computing and sending are one critical section.

use lapin::Acker;
use lapin::message::Delivery;
use lapin::options::BasicAckOptions;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a settled delivery may wait for the deliveries below it before it is acknowledged
/// on its own.
pub(crate) const LINGER: Duration = Duration::from_millis(50);

/// The acknowledgements of one channel.
#[derive(Default)]
pub(crate) struct AckBook {
    book: Mutex<Book>,
    /// Held while acknowledgements are computed and sent, so that they reach the broker in
    /// the order they were computed.
    sending: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Book {
    /// Every tag below this one is settled and its acknowledgement sent (or not needed).
    next: u64,
    /// Settled tags at or above `next`.
    settled: BTreeMap<u64, Settled>,
}

struct Settled {
    /// `None` once nothing is left to send for it (acknowledged alone, or nacked).
    acker: Option<Acker>,
    since: Instant,
    /// The message's `amqp ack` span: it ends once the frame acknowledging it is sent.
    span: Option<tracing::Span>,
}

/// What to send, computed under the book's lock.
#[derive(Default)]
struct Frames {
    /// One `multiple` acknowledgement, up to this delivery's tag.
    up_to: Option<Acker>,
    /// Acknowledgements of single deliveries.
    single: Vec<Acker>,
    /// The spans of the deliveries these frames acknowledge, ended once they are sent.
    spans: Vec<tracing::Span>,
}

impl AckBook {
    pub(crate) fn new() -> Self {
        AckBook { book: Mutex::new(Book { next: 1, settled: BTreeMap::new() }), sending: Default::default() }
    }

    /// The delivery is safe to forget: it is to be acknowledged. `span` (the message's `amqp
    /// ack`) ends when the acknowledgement is sent.
    pub(crate) fn settled(&self, delivery: &Delivery, span: tracing::Span) {
        self.record(delivery.delivery_tag, Some(delivery.acker.clone()), Some(span));
    }

    /// The delivery was given back to the broker on its own (a nack): nothing to send for it.
    pub(crate) fn returned(&self, delivery: &Delivery) {
        self.record(delivery.delivery_tag, None, None);
    }

    fn record(&self, tag: u64, acker: Option<Acker>, span: Option<tracing::Span>) {
        let mut book = self.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if tag >= book.next {
            book.settled.insert(tag, Settled { acker, since: Instant::now(), span });
        }
    }

    /// Acknowledges the run of settled deliveries at the bottom of the book.
    ///
    /// # Errors
    /// The channel failed; the broker redelivers what was not acknowledged.
    pub(crate) async fn send(&self) -> lapin::Result<()> {
        self.send_with(|book| book.run()).await
    }

    /// As [`send`](Self::send), and acknowledges one by one whatever has waited [`LINGER`]
    /// above a delivery still in work.
    ///
    /// # Errors
    /// The channel failed.
    pub(crate) async fn send_lingering(&self) -> lapin::Result<()> {
        self.send_with(|book| {
            let mut frames = book.run();
            book.older_than(LINGER, &mut frames);
            frames
        })
        .await
    }

    /// Acknowledges everything settled, whatever is still in work below it: for the end of a
    /// connection, when nothing more will settle.
    ///
    /// # Errors
    /// The channel failed.
    pub(crate) async fn send_all(&self) -> lapin::Result<()> {
        self.send_with(|book| {
            let mut frames = book.run();
            book.older_than(Duration::ZERO, &mut frames);
            frames
        })
        .await
    }

    async fn send_with(&self, compute: impl FnOnce(&mut Book) -> Frames) -> lapin::Result<()> {
        let _sending = self.sending.lock().await;
        let Frames { up_to, single, spans } = {
            let mut book = self.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            compute(&mut book)
        };
        if let Some(top) = up_to {
            top.ack(BasicAckOptions { multiple: true }).await?;
        }
        for acker in single {
            acker.ack(BasicAckOptions { multiple: false }).await?;
        }
        drop(spans);
        Ok(())
    }
}

impl Book {
    /// Takes the run of consecutive settled tags starting at `next`: one `multiple`
    /// acknowledgement up to the highest of them that still needs one covers them all (the
    /// others the broker no longer holds).
    fn run(&mut self) -> Frames {
        let mut frames = Frames::default();
        while let Some(entry) = self.settled.first_entry() {
            if *entry.key() != self.next {
                break;
            }
            let settled = entry.remove();
            if let Some(acker) = settled.acker {
                frames.up_to = Some(acker);
            }
            frames.spans.extend(settled.span);
            self.next += 1;
        }
        frames
    }

    /// Adds the acknowledgements of settled deliveries older than `age`, to be sent one by
    /// one; their tags stay in the book until the run reaches them.
    fn older_than(&mut self, age: Duration, frames: &mut Frames) {
        for settled in self.settled.values_mut().filter(|s| s.since.elapsed() >= age) {
            if let Some(acker) = settled.acker.take() {
                frames.single.push(acker);
                frames.spans.extend(settled.span.take());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book_with(tags: &[u64]) -> Book {
        let mut book = Book { next: 1, settled: BTreeMap::new() };
        for &tag in tags {
            book.settled.insert(tag, Settled { acker: None, since: Instant::now(), span: None });
        }
        book
    }

    #[test]
    fn the_run_stops_below_the_first_delivery_still_in_work() {
        let mut book = book_with(&[1, 2, 3, 5, 6]);
        book.run();
        assert_eq!(book.next, 4, "tag 4 is still in work");
        assert_eq!(book.settled.keys().copied().collect::<Vec<_>>(), vec![5, 6]);
        book.settled.insert(4, Settled { acker: None, since: Instant::now(), span: None });
        book.run();
        assert_eq!(book.next, 7);
        assert!(book.settled.is_empty());
    }

    #[test]
    fn nothing_below_the_run_is_recorded_twice() {
        let book = AckBook::new();
        book.record(1, None, None);
        book.book.lock().unwrap().run();
        book.record(1, None, None);
        assert!(book.book.lock().unwrap().settled.is_empty(), "tag 1 is already behind the run");
    }
}
