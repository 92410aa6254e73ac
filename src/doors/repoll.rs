//! A connection future that answers its own wake-ups by being polled again at once, instead of
//! through the scheduler.
//!
//! hyper wakes a connection's task from inside that task's poll: as the handler reads the
//! request body, the body channel wakes the dispatcher (the same task) to read on. tokio's
//! multi-thread runtime treats a task woken during its own poll as a yield, and every yield
//! wakes a parked worker to come and steal it: an eventfd write, a futex and, often, the
//! request moving to the other core, on every request (docs/performance.md, "Front door
//! latency"). [`Repoll`] notes a wake that arrives while the inner future is being polled and
//! polls it again straight away; a wake at any other time goes to the task as usual.

use futures_util::task::AtomicWaker;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::task::{Context, Poll, Wake, Waker};

/// The most polls of the inner future in one poll of the task: past them, a future that woke
/// itself yields to the scheduler after all, so that one that always wakes itself still lets
/// others run.
const REPOLLS: usize = 4;

/// `F`, polled again at once when it wakes itself during a poll.
pub struct Repoll<F> {
    inner: Pin<Box<F>>,
    wakes: Arc<Wakes>,
    waker: Waker,
}

/// The waker handed to the inner future.
struct Wakes {
    /// The task's own waker, for wakes outside a poll.
    task: AtomicWaker,
    polling: AtomicBool,
    woken: AtomicBool,
}

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // `woken` first: if `polling` still reads true, the poll's end has not cleared it yet
        // and will see this wake (both orders are sequentially consistent), so none is lost.
        self.woken.store(true, SeqCst);
        if !self.polling.load(SeqCst) {
            self.task.wake();
        }
    }
}

impl<F: Future> Repoll<F> {
    pub fn new(inner: F) -> Self {
        let wakes = Arc::new(Wakes {
            task: AtomicWaker::new(),
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
        });
        let waker = Waker::from(wakes.clone());
        Repoll { inner: Box::pin(inner), wakes, waker }
    }

    /// The inner future, for calls it takes itself (a graceful shutdown).
    pub(crate) fn inner(&mut self) -> Pin<&mut F> {
        self.inner.as_mut()
    }
}

impl<F: Future> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.wakes.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..REPOLLS {
            this.wakes.woken.store(false, SeqCst);
            this.wakes.polling.store(true, SeqCst);
            let polled = this.inner.as_mut().poll(&mut inner_cx);
            this.wakes.polling.store(false, SeqCst);
            if polled.is_ready() || !this.wakes.woken.swap(false, SeqCst) {
                return polled;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Wakes itself during its first `wakes_itself` polls, then finishes.
    struct SelfWaking {
        wakes_itself: usize,
        polls: Arc<AtomicUsize>,
    }

    impl Future for SelfWaking {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, SeqCst);
            if self.wakes_itself == 0 {
                return Poll::Ready(());
            }
            self.wakes_itself -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// Counts the wakes the task receives.
    struct Counting(AtomicUsize);
    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    fn poll_once(future: &mut Repoll<SelfWaking>, task: &Arc<Counting>) -> Poll<()> {
        let waker = Waker::from(task.clone());
        Pin::new(future).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn a_wake_during_the_poll_is_answered_by_polling_again_not_by_waking_the_task() {
        let polls = Arc::new(AtomicUsize::new(0));
        let task = Arc::new(Counting(AtomicUsize::new(0)));
        let mut future = Repoll::new(SelfWaking { wakes_itself: 2, polls: polls.clone() });
        assert_eq!(poll_once(&mut future, &task), Poll::Ready(()));
        assert_eq!(polls.load(SeqCst), 3);
        assert_eq!(task.0.load(SeqCst), 0);
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_to_the_scheduler_after_a_bound() {
        let polls = Arc::new(AtomicUsize::new(0));
        let task = Arc::new(Counting(AtomicUsize::new(0)));
        let mut future = Repoll::new(SelfWaking { wakes_itself: 100, polls: polls.clone() });
        assert_eq!(poll_once(&mut future, &task), Poll::Pending);
        assert_eq!(polls.load(SeqCst), REPOLLS);
        assert_eq!(task.0.load(SeqCst), 1, "the task is woken once, to be polled again later");
    }

    /// Wakes from another thread race the end of every poll; a lost one would hang the task.
    #[test]
    fn no_wake_from_another_thread_is_lost() {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let received = runtime.block_on(async {
            let turns = async {
                let mut received = 0;
                for turn in 0..2_000u32 {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    std::thread::spawn(move || {
                        // Sometimes at once (likely inside the poll), sometimes a little later.
                        if turn % 3 != 0 {
                            std::thread::yield_now();
                        }
                        let _ = tx.send(turn);
                    });
                    received += usize::from(rx.await == Ok(turn));
                }
                received
            };
            tokio::time::timeout(std::time::Duration::from_secs(60), tokio::spawn(Repoll::new(turns))).await
        });
        assert_eq!(received.expect("a wake was lost: the task never finished").unwrap(), 2_000);
    }

    #[test]
    fn a_wake_after_the_poll_reaches_the_task() {
        let task = Arc::new(Counting(AtomicUsize::new(0)));
        // Pending without waking itself: it waits for someone else.
        let mut future = Repoll::new(std::future::pending::<()>());
        let waker = Waker::from(task.clone());
        assert!(Pin::new(&mut future).poll(&mut Context::from_waker(&waker)).is_pending());
        future.waker.wake_by_ref();
        assert_eq!(task.0.load(SeqCst), 1);
    }
}
