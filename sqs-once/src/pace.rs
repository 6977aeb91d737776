//! Pacing calls to a downstream that limits its callers' rate (a payment provider allows an
//! account so many requests a second, shared with everything else that uses it).
//!
//! Why ~600 lines: the pace's booking, give-back and task-local hand-over to the client's
//! requests are one state machine, and half the file is its paused-clock tests.
//!
//! A [`Pace`] hands out *slots*: times at which one request may start, at most `rate` a second
//! (the generic cell rate algorithm: each slot is booked `1/rate` after the previous one, none
//! before now). The runner books the slots of a message's requests before it claims the
//! message ([`crate::Work::requests_per_attempt`]: one, or a lookup's and then a write's), no
//! later than the latest start its invocation allows: a message whose slots would come too
//! late is handed back as never attempted (no claim written, no receive budget spent), and a
//! slot booked for a message that then did not use it is given back, to be booked again. The
//! downstream's client calls [`Pace::acquire`] before each request: the first ones take the
//! slots booked for them, later ones (a retry) book their own, no later than the latest start
//! the call loop allows, and are refused as never sent past it. (Were a later request to book
//! its own, it would come after every slot the batch's other messages booked meanwhile: at a
//! low rate, past its attempt's lease, so that a message whose write follows a read could
//! never make both.)
//!
//! An instance works in batches: between its batches it waits for the slowest call of the last
//! one, the queue's answer and the next receive, and its slots meanwhile go unused. A slot no
//! more than [`CATCH_UP`] in the past is still handed out, so that an instance at work makes up
//! that gap and keeps its rate over the drain; one idle longer (an empty queue), or one that
//! never handed out a slot (a new instance), starts at its rate, so that instances woken
//! together by a backlog do not burst. Over any window of `T`, a pace hands out at most
//! `rate × (T + CATCH_UP) + 1` slots (a request starts at its slot, or later by the claim's
//! write).
//!
//! The rate adapts (additive increase, multiplicative decrease): [`Pace::slowed`] when the
//! downstream says the account or an endpoint is over its limit halves it (at most once per
//! cut window, down to a floor), and each [`Pace::succeeded`] adds a hundredth of the ceiling
//! back. A refusal about one object (a lock) is not about the rate: the caller retries that
//! object later and tells the pace nothing.
//!
//! Times are `tokio::time::Instant`s, so tests move them with a paused runtime.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The fraction of the ceiling the rate never drops below.
const FLOOR_FRACTION: f64 = 0.05;

/// What each answer adds back to the rate, as a fraction of the ceiling: a halving is undone
/// over about fifty answers, so one refusal's cut is not spent on the slots already booked.
const INCREASE_FRACTION: f64 = 0.01;

/// How far in the past the next slot may be and still be handed out (see the module's doc).
pub const CATCH_UP: Duration = Duration::from_secs(1);

/// The longest pause a refusal's `Retry-After` imposes (a downstream's hint, not a command
/// to stop for an hour).
const MAX_PAUSE: Duration = Duration::from_secs(60);

/// Why a request was not started: no slot before the latest start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "not sent: no request budget before {latest_in_ms} ms from now (next slot in {next_in_ms} ms)"
)]
pub struct NoSlot {
    /// How far the latest start allowed was, ms.
    pub latest_in_ms: u64,
    /// How far the next free slot is, ms.
    pub next_in_ms: u64,
}

#[derive(Debug)]
struct State {
    /// Requests a second now.
    rate: f64,
    /// The next free slot.
    next: Instant,
    /// The last multiplicative cut, so that one burst of refusals cuts once.
    last_cut: Option<Instant>,
    /// The last slot booked (given back, the schedule steps back to it).
    last_booked: Option<Instant>,
    /// Slots booked before the last one and given back unused: booked again first, earliest
    /// first, while they are no more than [`CATCH_UP`] in the past.
    returned: std::collections::BTreeSet<Instant>,
    /// No slot before this (a refusal's pause).
    paused_until: Instant,
    /// Whether a slot was ever handed out: a new pace has no gap to make up.
    worked: bool,
}

/// A per-process request pace. Share one between everything that calls the same downstream.
#[derive(Debug)]
pub struct Pace {
    ceiling: f64,
    state: Mutex<State>,
}

/// What [`within`] keeps of one call's requests (see `LATEST`).
type Latest = (
    Instant,
    std::cell::Cell<Option<Instant>>,
    std::cell::Cell<Option<NoSlot>>,
    std::cell::Cell<bool>,
);

tokio::task_local! {
    /// The slots the runner booked for the running message's requests, not taken yet.
    static BOOKED: std::cell::RefCell<std::collections::VecDeque<Instant>>;
    /// The latest start the call loop allows for the requests of the call being made now, when
    /// the last of them started (after its slot's wait), the last refusal (no slot in time),
    /// and whether a request that may change something downstream (not a read) started.
    static LATEST: Latest;
}

impl Pace {
    /// At most `per_second` requests a second (positive).
    pub fn new(per_second: f64) -> Self {
        let ceiling = if per_second.is_finite() && per_second > 0.0 {
            per_second
        } else {
            f64::MAX
        };
        Self {
            ceiling,
            state: Mutex::new(State {
                rate: ceiling,
                next: Instant::now(),
                last_cut: None,
                last_booked: None,
                returned: Default::default(),
                paused_until: Instant::now(),
                worked: false,
            }),
        }
    }

    /// The configured rate, requests a second.
    pub fn ceiling(&self) -> f64 {
        self.ceiling
    }

    /// The rate now, requests a second.
    pub fn rate(&self) -> f64 {
        self.state.lock().map(|s| s.rate).unwrap_or(self.ceiling)
    }

    fn interval(rate: f64) -> Duration {
        Duration::from_secs_f64((1.0 / rate).min(3600.0))
    }

    /// Books the next slot if it is no later than `latest`. It may be in the past (up to
    /// [`CATCH_UP`]): the request may start at once.
    pub fn book(&self, latest: Instant) -> Result<Instant, NoSlot> {
        let now = Instant::now();
        let Ok(mut s) = self.state.lock() else {
            return Ok(now);
        };
        // A slot given back comes first (one further back than CATCH_UP is gone), never
        // before a refusal's pause.
        let (paused_until, stale) = (s.paused_until, now.checked_sub(CATCH_UP));
        s.returned
            .retain(|t| *t >= paused_until && stale.is_none_or(|stale| *t >= stale));
        if let Some(slot) = s.returned.first().copied().filter(|t| *t <= latest) {
            s.returned.remove(&slot);
            return Ok(slot);
        }
        // A slot of a working instance's gap between batches is still its own; an idle
        // instance's next slot is now.
        let slot = if s.next >= now || (s.worked && now - s.next <= CATCH_UP) {
            s.next
        } else {
            now
        };
        if slot > latest {
            return Err(NoSlot {
                latest_in_ms: latest.saturating_duration_since(now).as_millis() as u64,
                next_in_ms: slot.saturating_duration_since(now).as_millis() as u64,
            });
        }
        s.next = slot + Self::interval(s.rate);
        s.last_booked = Some(slot);
        s.worked = true;
        Ok(slot)
    }

    /// Books `n` slots (at least one), the last no later than `latest`: the requests of one
    /// attempt, booked together so that its later ones do not come after every slot booked
    /// meanwhile. Refused whole: the slots it booked are given back.
    pub fn book_many(&self, n: usize, latest: Instant) -> Result<Vec<Instant>, NoSlot> {
        let mut slots = Vec::with_capacity(n.max(1));
        for _ in 0..n.max(1) {
            match self.book(latest) {
                Ok(slot) => slots.push(slot),
                Err(refused) => {
                    for slot in slots.into_iter().rev() {
                        self.give_back(slot);
                    }
                    return Err(refused);
                }
            }
        }
        Ok(slots)
    }

    /// Gives back a slot booked and not used: the next booking may take it (not before a
    /// refusal's pause, nor once it is more than [`CATCH_UP`] in the past).
    pub fn give_back(&self, slot: Instant) {
        if let Ok(mut s) = self.state.lock() {
            if s.last_booked == Some(slot) {
                // In the past, it is handed out again while within CATCH_UP of now.
                s.next = slot.max(s.paused_until).min(s.next);
                s.last_booked = None;
            } else if slot >= s.paused_until {
                s.returned.insert(slot);
            }
        }
    }

    /// Waits for a slot for one request that may change something downstream (a write, or a
    /// request whose effect the caller does not know): the one the runner booked for this
    /// message's first request, else a new one no later than the latest start the call loop
    /// set (or `wait` from now, outside it).
    pub async fn acquire(&self, wait: Duration) -> Result<(), NoSlot> {
        self.acquire_for(wait, true).await
    }

    /// [`Pace::acquire`] for a request that only reads: a call whose requests were all reads
    /// when the pace refused one did nothing downstream ([`Requests::only_read`]), so the
    /// call loop hands its message back as never attempted.
    pub async fn acquire_read(&self, wait: Duration) -> Result<(), NoSlot> {
        self.acquire_for(wait, false).await
    }

    async fn acquire_for(&self, wait: Duration, writes: bool) -> Result<(), NoSlot> {
        let booked = BOOKED
            .try_with(|b| b.borrow_mut().pop_front())
            .ok()
            .flatten();
        let call_latest = LATEST.try_with(|l| l.0).ok();
        let latest = call_latest.unwrap_or_else(|| Instant::now() + wait);
        // A slot booked before the claim holds only while it is no later than the call loop's
        // latest start for this request and not within a refusal's pause that came since;
        // else it goes back and the request books anew (or is refused).
        let slot = match booked {
            Some(slot) if call_latest.is_none_or(|l| slot <= l) && !self.paused_at(slot) => slot,
            stale => {
                if let Some(slot) = stale {
                    self.give_back(slot);
                }
                self.book(latest).inspect_err(|refused| {
                    let _ = LATEST.try_with(|l| l.2.set(Some(*refused)));
                })?
            }
        };
        tokio::time::sleep_until(slot).await;
        let _ = LATEST.try_with(|l| {
            l.1.set(Some(Instant::now()));
            if writes {
                l.3.set(true);
            }
        });
        Ok(())
    }

    /// Whether `slot` falls within a refusal's pause.
    fn paused_at(&self, slot: Instant) -> bool {
        self.state.lock().is_ok_and(|s| slot < s.paused_until)
    }

    /// The downstream refused a request for the account's or an endpoint's rate: halves the
    /// rate (once per the interval the new rate gives, so one burst of refusals cuts once),
    /// not below a twentieth of the ceiling, and moves the next slot `after` on (its
    /// `Retry-After`, when it gave one).
    pub fn slowed(&self, after: Option<Duration>) {
        let now = Instant::now();
        if let Ok(mut s) = self.state.lock() {
            let recent = s
                .last_cut
                .is_some_and(|at| now.saturating_duration_since(at) < Self::interval(s.rate) * 2);
            if !recent {
                s.rate = (s.rate / 2.0).max(self.ceiling * FLOOR_FRACTION);
                s.last_cut = Some(now);
            }
            let pause = after
                .unwrap_or_else(|| Self::interval(s.rate))
                .min(MAX_PAUSE);
            s.paused_until = s.paused_until.max(now + pause);
            s.next = s.next.max(now + pause);
        }
    }

    /// A request went through: the rate grows back towards the ceiling.
    pub fn succeeded(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.rate = (s.rate + self.ceiling * INCREASE_FRACTION).min(self.ceiling);
        }
    }

    /// Runs `work` (one message's processing) with `slots` booked for its requests, in
    /// order; gives back those no request took.
    pub async fn with_booked<F: Future>(&self, slots: Vec<Instant>, work: F) -> F::Output {
        let cell = std::cell::RefCell::new(slots.into_iter().collect());
        let (output, unused) = BOOKED
            .scope(cell, async move {
                let output = work.await;
                (
                    output,
                    BOOKED.with(|b| std::mem::take(&mut *b.borrow_mut())),
                )
            })
            .await;
        for slot in unused.into_iter().rev() {
            self.give_back(slot);
        }
        output
    }
}

/// What the paced requests of one call did (see [`within`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requests {
    /// When the last paced request started, after its slot's wait (`None`: none started).
    pub last_start: Option<Instant>,
    /// The last request the pace refused: no slot before the latest start, so it was not sent.
    pub refused: Option<NoSlot>,
    /// Whether a request that may change something downstream started ([`Pace::acquire`], not
    /// [`Pace::acquire_read`]).
    pub wrote: bool,
}

impl Requests {
    /// True when the call sent nothing because the pace had no slot in time: a request was
    /// refused and none started. (A call whose requests are not paced reports neither.)
    pub fn none_sent(&self) -> bool {
        self.refused.is_some() && self.last_start.is_none()
    }

    /// True when the pace refused a request of the call and every request that started only
    /// read: the call changed nothing downstream, whatever it read before its write was
    /// refused (so waiting for the pace is not an attempt).
    pub fn only_read(&self) -> bool {
        self.refused.is_some() && !self.wrote
    }
}

/// Runs `call` (one call of the downstream) with `latest` as the latest time its requests may
/// start: a request that would wait for a slot past it is not sent ([`NoSlot`]). Returns the
/// call's output and what its paced requests did: when the last one started, so that the
/// caller knows how late what it sent may land, and whether the pace refused one.
pub async fn within<F: Future>(latest: Instant, call: F) -> (F::Output, Requests) {
    let cells = (
        latest,
        std::cell::Cell::new(None),
        std::cell::Cell::new(None),
        std::cell::Cell::new(false),
    );
    LATEST
        .scope(cells, async move {
            let output = call.await;
            let requests = LATEST.with(|l| Requests {
                last_start: l.1.get(),
                refused: l.2.get(),
                wrote: l.3.get(),
            });
            (output, requests)
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn slots_come_at_the_rate_and_none_past_the_latest_start() {
        let pace = Pace::new(10.0);
        let t0 = Instant::now();
        let slots: Vec<Duration> = (0..5)
            .map(|_| pace.book(t0 + ms(1000)).unwrap() - t0)
            .collect();
        assert_eq!(slots, [ms(0), ms(100), ms(200), ms(300), ms(400)]);
        assert_eq!(
            pace.book(t0 + ms(450)).unwrap_err(),
            NoSlot {
                latest_in_ms: 450,
                next_in_ms: 500
            }
        );
        // An unused slot given back is booked again.
        pace.give_back(t0 + ms(400));
        assert_eq!(pace.book(t0 + ms(450)).unwrap() - t0, ms(400));
        // Idle longer than CATCH_UP frees nothing in the past: the next slot is now.
        tokio::time::advance(ms(2000)).await;
        assert_eq!(pace.book(Instant::now()).unwrap(), Instant::now());
    }

    #[tokio::test(start_paused = true)]
    async fn a_working_instance_makes_up_the_gap_between_its_batches_and_an_idle_one_does_not() {
        let pace = Pace::new(10.0);
        let t0 = Instant::now();
        let far = t0 + ms(60_000);
        // A batch of five: slots at the rate.
        for i in 0..5 {
            assert_eq!(pace.book(far).unwrap() - t0, ms(100 * i));
        }
        // Its slowest call ends 700 ms in: the slots at 500 and 600 went unused. The next batch
        // takes them at once, then the rate goes on.
        tokio::time::advance(ms(700)).await;
        let next: Vec<Duration> = (0..4).map(|_| pace.book(far).unwrap() - t0).collect();
        assert_eq!(next, [ms(500), ms(600), ms(700), ms(800)]);
        // Over the whole: 9 slots from 0 to 800 ms, never more than the rate allows.
        // Idle longer than CATCH_UP (the queue was empty): the next slot is now, no burst.
        tokio::time::advance(CATCH_UP + ms(1000)).await;
        let now = Instant::now();
        assert_eq!(pace.book(far).unwrap(), now);
        assert_eq!(pace.book(far).unwrap() - now, ms(100));
        // A next slot exactly CATCH_UP behind is still handed out; a millisecond more is not.
        tokio::time::advance(ms(1200)).await;
        assert_eq!(Instant::now() - pace.book(far).unwrap(), CATCH_UP);
        // The next is now 900 ms behind; 101 ms on, it is 1,001 ms behind.
        tokio::time::advance(ms(101)).await;
        assert_eq!(pace.book(far).unwrap(), Instant::now());
        // A slot in the past given back unused is handed out again.
        tokio::time::advance(ms(300)).await;
        let past = pace.book(far).unwrap();
        assert!(past < Instant::now());
        pace.give_back(past);
        assert_eq!(pace.book(far).unwrap(), past);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_instance_starts_at_its_rate_however_long_its_init_took() {
        // The pace is made at init; the first batch comes later: no gap to make up.
        let pace = Pace::new(10.0);
        tokio::time::advance(ms(500)).await;
        let now = Instant::now();
        let slots: Vec<Duration> = (0..3)
            .map(|_| pace.book(now + ms(60_000)).unwrap() - now)
            .collect();
        assert_eq!(slots, [ms(0), ms(100), ms(200)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_refusal_halves_the_rate_once_per_burst_and_successes_restore_it() {
        let pace = Pace::new(20.0);
        pace.slowed(None);
        assert_eq!(pace.rate(), 10.0);
        // The same burst's other refusals do not cut again.
        pace.slowed(None);
        pace.slowed(None);
        assert_eq!(pace.rate(), 10.0);
        tokio::time::advance(ms(500)).await;
        pace.slowed(None);
        assert_eq!(pace.rate(), 5.0);
        for _ in 0..10 {
            tokio::time::advance(ms(1000)).await;
            pace.slowed(None);
        }
        assert_eq!(pace.rate(), 1.0, "never below a twentieth of the ceiling");
        for _ in 0..200 {
            pace.succeeded();
        }
        assert_eq!(pace.rate(), 20.0, "never above the ceiling");
        // A Retry-After moves the next slot.
        let before = Instant::now();
        pace.slowed(Some(ms(3000)));
        assert!(pace.book(before + ms(2999)).is_err());
        assert_eq!(pace.book(before + ms(3000)).unwrap() - before, ms(3000));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_request_takes_the_booked_slot_and_later_ones_book_their_own() {
        let pace = Pace::new(2.0);
        let t0 = Instant::now();
        let booked = pace.book(t0 + ms(10_000)).unwrap();
        let at = pace
            .with_booked(vec![booked], async {
                pace.acquire(ms(0)).await.unwrap();
                let first = Instant::now() - t0;
                // The second books the next slot (500 ms on), within the call's latest start,
                // and says when it started.
                let (sent, requests) = within(Instant::now() + ms(600), pace.acquire(ms(0))).await;
                sent.unwrap();
                let second = Instant::now() - t0;
                assert_eq!(requests.last_start.map(|s| s - t0), Some(second));
                assert!(!requests.none_sent());
                // A third would start after its latest start: not sent, and the call says so.
                let (third, requests) = within(Instant::now() + ms(100), pace.acquire(ms(0))).await;
                assert!(requests.none_sent(), "{requests:?}");
                assert_eq!(requests.refused.map(|r| r.next_in_ms), Some(500));
                (first, second, third)
            })
            .await;
        assert_eq!((at.0, at.1), (ms(0), ms(500)));
        assert!(at.2.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_given_back_is_booked_again_first_and_never_into_a_refusal_s_pause() {
        let pace = Pace::new(10.0);
        let t0 = Instant::now();
        let far = t0 + ms(10_000);
        let (a, b) = (pace.book(far).unwrap(), pace.book(far).unwrap());
        // A slot booked before another comes back as itself: b's is not handed out again.
        pace.give_back(a);
        assert_eq!(pace.book(far).unwrap(), a);
        assert_eq!(pace.book(far).unwrap() - t0, ms(200));
        // One given back and then left more than CATCH_UP in the past is gone.
        let spare = pace.book(far).unwrap();
        let _after = pace.book(far).unwrap();
        pace.give_back(spare);
        tokio::time::advance(CATCH_UP + ms(400)).await;
        assert!(pace.book(far).unwrap() > spare);
        let t0 = Instant::now();
        // The last one booked comes back.
        let c = pace.book(far).unwrap();
        pace.give_back(c);
        assert_eq!(pace.book(far).unwrap(), c);
        assert!(b < c);
        // A refusal's pause (clamped to a minute) holds whatever is given back.
        let d = pace.book(far).unwrap();
        pace.slowed(Some(Duration::from_secs(3600)));
        pace.give_back(d);
        assert_eq!(pace.book(t0 + ms(120_000)).unwrap() - t0, ms(60_000));
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_s_slots_are_booked_together_or_not_at_all_and_its_spares_come_back() {
        let pace = Pace::new(1.0);
        let t0 = Instant::now();
        // One message's lookup and write: two slots a second apart, both before the latest.
        let first = pace.book_many(2, t0 + ms(1_500)).unwrap();
        assert_eq!(first, [t0, t0 + ms(1_000)]);
        // The next message's two would end past its latest start: refused whole, and the one
        // it could have had is free again.
        assert_eq!(
            pace.book_many(2, t0 + ms(2_500)).unwrap_err().next_in_ms,
            3_000
        );
        assert_eq!(pace.book(t0 + ms(2_500)).unwrap(), t0 + ms(2_000));
        // A message that made one request of its two gives the other back: booked next.
        let second = pace.book_many(2, t0 + ms(10_000)).unwrap();
        assert_eq!(second, [t0 + ms(3_000), t0 + ms(4_000)]);
        let third = pace.book(t0 + ms(10_000)).unwrap();
        pace.with_booked(second, async {
            pace.acquire(ms(0)).await.unwrap();
        })
        .await;
        assert_eq!(third, t0 + ms(5_000));
        assert_eq!(pace.book(t0 + ms(10_000)).unwrap(), t0 + ms(4_000));
        assert_eq!(pace.book(t0 + ms(10_000)).unwrap(), t0 + ms(6_000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_booked_slot_past_the_call_s_latest_start_or_in_a_pause_is_not_taken() {
        let pace = Pace::new(1.0);
        let t0 = Instant::now();
        let booked = pace.book_many(2, t0 + ms(10_000)).unwrap();
        assert_eq!(booked, [t0, t0 + ms(1_000)]);
        pace.with_booked(booked, async {
            pace.acquire(ms(0)).await.unwrap();
            // The lease now lets the next request start within 500 ms: its booked slot (1 s)
            // is past that, so it is not sent (and the slot goes back).
            let (sent, requests) = within(Instant::now() + ms(500), pace.acquire(ms(0))).await;
            assert!(sent.is_err() && requests.none_sent(), "{requests:?}");
        })
        .await;
        assert_eq!(pace.book(t0 + ms(10_000)).unwrap(), t0 + ms(1_000));
        // A refusal's pause after the booking moves a booked request past it.
        let t1 = Instant::now();
        let booked = pace.book_many(2, t1 + ms(10_000)).unwrap();
        pace.with_booked(booked, async {
            pace.acquire(ms(0)).await.unwrap();
            pace.slowed(Some(ms(5_000)));
            pace.acquire(ms(60_000)).await.unwrap();
            assert!(Instant::now() >= t1 + ms(5_000), "not within the pause");
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_booked_for_a_message_that_made_no_call_is_given_back() {
        let pace = Pace::new(1.0);
        let t0 = Instant::now();
        let booked = pace.book(t0 + ms(10_000)).unwrap();
        pace.with_booked(vec![booked], async {}).await;
        assert_eq!(
            pace.book(t0 + ms(10_000)).unwrap(),
            t0,
            "the slot is free again"
        );
    }
}
