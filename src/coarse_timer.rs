//! The store's own timeout: one coarse timer per store, shared by all its calls, instead of a
//! `tokio::time::timeout` per call.
//!
//! A call registers its waker once, when it first waits, and removes it when it ends: two
//! uncontended lock round trips, where a tokio timer entry costs several times as many
//! instructions (the `throughput` benchmark's `diag` variants measure both). A task ticks
//! `tick` at a time while calls are waiting, wakes those whose deadline has passed, and ends
//! when none are left or when the store is gone. A call fails after between `timeout` and
//! `timeout` plus two ticks (a 32nd of the timeout each, at most 25 ms).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// The shared timer of one store (and its clones), or of one layer's releases.
#[derive(Debug)]
pub(crate) struct CoarseTimer {
    tick: Duration,
    /// Ticks until a call that starts now is overdue: at least the timer's whole duration, since
    /// the clock may be up to one tick behind.
    ticks: u64,
    /// Ticks since the timer first ran: the coarse clock every deadline is measured on.
    now: AtomicU64,
    waiting: Mutex<Waiting>,
}

#[derive(Debug, Default)]
struct Waiting {
    /// Registered calls: their deadline (in ticks) and waker; `None` for a free slot.
    slots: Vec<Option<(u64, Waker)>>,
    free: Vec<usize>,
    /// The ticking task that is alive, if any (it clears this when it ends or is dropped).
    ticking: Option<u64>,
    /// How many ticking tasks were started.
    started: u64,
}

impl CoarseTimer {
    pub(crate) fn new(timeout: Duration) -> Arc<Self> {
        let tick = (timeout / 32).clamp(Duration::from_millis(1), Duration::from_millis(25));
        Arc::new(Self {
            tick,
            ticks: ticks_for(timeout, tick),
            now: AtomicU64::new(0),
            waiting: Mutex::new(Waiting::default()),
        })
    }

    /// Ticks until a wait of `wait` that starts now is over.
    fn ticks_for(&self, wait: Duration) -> u64 {
        ticks_for(wait, self.tick)
    }

    fn lock(&self) -> MutexGuard<'_, Waiting> {
        // A panic while holding it leaves nothing half-done that matters here.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(self: &Arc<Self>, deadline: u64, waker: &Waker) -> usize {
        let mut waiting = self.lock();
        let entry = Some((deadline, waker.clone()));
        let slot = match waiting.free.pop() {
            Some(slot) => {
                waiting.slots[slot] = entry;
                slot
            }
            None => {
                waiting.slots.push(entry);
                waiting.slots.len() - 1
            }
        };
        if waiting.ticking.is_none() {
            waiting.started += 1;
            let id = waiting.started;
            waiting.ticking = Some(id);
            drop(waiting);
            tokio::spawn(tick(Arc::downgrade(self), id));
        }
        slot
    }

    fn update(&self, slot: usize, waker: &Waker) {
        if let Some((_, registered)) = &mut self.lock().slots[slot] {
            registered.clone_from(waker);
        }
    }

    fn remove(&self, slot: usize) {
        let mut waiting = self.lock();
        waiting.slots[slot] = None;
        waiting.free.push(slot);
    }
}

/// Ticks of `tick` until a wait of `wait` that starts now is over: at least the whole wait,
/// since the clock may be up to one tick behind.
fn ticks_for(wait: Duration, tick: Duration) -> u64 {
    (wait.as_nanos().div_ceil(tick.as_nanos()) as u64).saturating_add(1)
}

/// Clears `ticking` however ticking task `id` ends, dropped with its runtime included, so
/// that the next call starts another.
struct Ticking(Weak<CoarseTimer>, u64);

impl Drop for Ticking {
    fn drop(&mut self) {
        if let Some(timer) = self.0.upgrade() {
            let mut waiting = timer.lock();
            if waiting.ticking == Some(self.1) {
                waiting.ticking = None;
            }
        }
    }
}

/// Ticking task `id`: advances the clock of `timer` and wakes the calls that are overdue.
async fn tick(timer: Weak<CoarseTimer>, id: u64) {
    let _ticking = Ticking(timer.clone(), id);
    let Some(period) = timer.upgrade().map(|timer| timer.tick) else {
        return;
    };
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    loop {
        interval.tick().await;
        let Some(timer) = timer.upgrade() else {
            return;
        };
        let mut waiting = timer.lock();
        if waiting.ticking != Some(id) {
            return;
        }
        // Advanced under the lock: only the one live task moves the clock.
        let now = timer.now.fetch_add(1, Ordering::AcqRel) + 1;
        if waiting.free.len() == waiting.slots.len() {
            // Nothing waits: end, and let the next call start the clock again. Cleared
            // here, under the lock, so that a call registering now starts a new task.
            waiting.ticking = None;
            return;
        }
        for (deadline, waker) in waiting.slots.iter().flatten() {
            if *deadline <= now {
                waker.wake_by_ref();
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// `call`, or `None` once `timeout` has passed.
    pub(crate) struct Timeout<'a, F> {
        #[pin]
        call: F,
        timer: &'a Arc<CoarseTimer>,
        // The slot, deadline (in ticks) and waker once registered.
        registered: Option<(usize, u64, Waker)>,
    }

    impl<F> PinnedDrop for Timeout<'_, F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some((slot, _, _)) = this.registered.take() {
                this.timer.remove(slot);
            }
        }
    }
}

// A store's calls are bounded with the timer (by `RedisStore`, and by the `Store` handle for
// another backend); every other user asks `Overdue`.
impl<'a, F> Timeout<'a, F> {
    pub(crate) fn new(timer: &'a Arc<CoarseTimer>, call: F) -> Self {
        Self {
            call,
            timer,
            registered: None,
        }
    }
}

impl<F: Future> Future for Timeout<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(reply) = this.call.poll(cx) {
            if let Some((slot, _, _)) = this.registered.take() {
                this.timer.remove(slot);
            }
            return Poll::Ready(Some(reply));
        }
        let ticks = this.timer.ticks;
        poll_overdue(this.timer, ticks, this.registered, cx).map(|()| None)
    }
}

/// Ready once the deadline of `registered` has passed; on the first call, registers `cx` for a
/// deadline `ticks` from now.
fn poll_overdue(
    timer: &Arc<CoarseTimer>,
    ticks: u64,
    registered: &mut Option<(usize, u64, Waker)>,
    cx: &mut Context<'_>,
) -> Poll<()> {
    let now = timer.now.load(Ordering::Acquire);
    match registered {
        None => {
            let deadline = now + ticks;
            let slot = timer.register(deadline, cx.waker());
            *registered = Some((slot, deadline, cx.waker().clone()));
        }
        Some((slot, deadline, _)) if *deadline <= now => {
            let slot = *slot;
            *registered = None;
            timer.remove(slot);
            return Poll::Ready(());
        }
        Some((slot, _, waker)) => {
            // The task moved (another waker): the timer must wake the new one.
            if !waker.will_wake(cx.waker()) {
                waker.clone_from(cx.waker());
                timer.update(*slot, cx.waker());
            }
        }
    }
    Poll::Pending
}

/// A wait of a timer's duration, counted from its first poll, that owns its handle on the
/// timer: for the layer's response future and body, which cannot borrow one. A tokio timer
/// per wait costs about a thousand instructions to register and remove; this, two uncontended
/// lock round trips.
#[derive(Debug)]
pub(crate) struct Overdue {
    timer: Arc<CoarseTimer>,
    /// Ticks from the first poll to the deadline.
    ticks: u64,
    registered: Option<(usize, u64, Waker)>,
}

impl Overdue {
    /// A wait of the timer's own duration.
    pub(crate) fn new(timer: Arc<CoarseTimer>) -> Self {
        let ticks = timer.ticks;
        Self {
            timer,
            ticks,
            registered: None,
        }
    }

    /// A wait until `deadline` on the timer's clock (at most two of its ticks late): the
    /// coarse `sleep_until`. Poll it at once, as its ticks count from now.
    pub(crate) fn until(timer: Arc<CoarseTimer>, deadline: tokio::time::Instant) -> Self {
        let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
        let ticks = timer.ticks_for(wait);
        Self {
            timer,
            ticks,
            registered: None,
        }
    }

    /// Ready once the deadline has passed; the task of `cx` is woken then.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        poll_overdue(&self.timer, self.ticks, &mut self.registered, cx)
    }
}

impl Drop for Overdue {
    fn drop(&mut self) {
        if let Some((slot, _, _)) = self.registered.take() {
            self.timer.remove(slot);
        }
    }
}
