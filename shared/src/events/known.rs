//! What the inbox has read from the provider that never changes: a charge's PaymentIntent, and
//! the payment a PaymentIntent of ours was created for (`metadata[payment_id]`, set at its
//! creation). Kept for the life of the process, at most [`CAPACITY`] of each, the oldest
//! forgotten first.
//!
//! Why: a dispute's event reads up to three objects (its charge's PaymentIntent, that intent's
//! payment, and past a loss the dispute itself), each at a slot of the function's pace. At a
//! small pace an invocation is given one slot (the event function's part of
//! `ProviderRequestsPerSecond`, divided among `MaximumConcurrency` instances: at 1 a second,
//! one slot every 50 s), and an event whose second read had no slot was handed back with
//! nothing kept, to read the first again: no dispute event was ever applied (the simulator,
//! seed 81). With the first reads kept, each invocation of the instance goes one read further;
//! and every later event of the same dispute needs one read where it needed three, which the
//! merchant's own traffic shares the account's limit with.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// How many of each the process keeps (ids of 30 bytes or so: a few hundred KB at most).
pub const CAPACITY: usize = 4096;

/// One map of ids, bounded, the oldest forgotten first.
#[derive(Debug, Default)]
struct Bounded {
    values: HashMap<String, String>,
    order: VecDeque<String>,
}

impl Bounded {
    fn get(&self, key: &str) -> Option<String> {
        self.values.get(key).cloned()
    }

    fn put(&mut self, key: &str, value: &str) {
        if self
            .values
            .insert(key.to_owned(), value.to_owned())
            .is_none()
        {
            self.order.push_back(key.to_owned());
            while self.order.len() > CAPACITY {
                if let Some(old) = self.order.pop_front() {
                    self.values.remove(&old);
                }
            }
        }
    }
}

/// The facts kept (see the module's doc).
#[derive(Debug, Default)]
pub struct Known {
    intents: Mutex<Bounded>,
    payments: Mutex<Bounded>,
}

impl Known {
    /// The PaymentIntent of charge `charge`, if read before.
    pub fn intent_of(&self, charge: &str) -> Option<String> {
        self.intents.lock().ok()?.get(charge)
    }

    /// Keeps `intent` as the PaymentIntent of `charge`.
    pub fn keep_intent(&self, charge: &str, intent: &str) {
        if let Ok(mut m) = self.intents.lock() {
            m.put(charge, intent);
        }
    }

    /// The payment PaymentIntent `intent` was created for, if read before.
    pub fn payment_of(&self, intent: &str) -> Option<String> {
        self.payments.lock().ok()?.get(intent)
    }

    /// Keeps `payment_id` as the payment of `intent`.
    pub fn keep_payment(&self, intent: &str, payment_id: &str) {
        if let Ok(mut m) = self.payments.lock() {
            m.put(intent, payment_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_is_forgotten_first_and_a_fact_kept_again_is_not_counted_twice() {
        let k = Known::default();
        for i in 0..CAPACITY {
            k.keep_intent(&format!("ch_{i}"), &format!("pi_{i}"));
        }
        k.keep_intent("ch_0", "pi_0");
        assert_eq!(k.intent_of("ch_0").as_deref(), Some("pi_0"));
        k.keep_intent("ch_new", "pi_new");
        assert_eq!(k.intent_of("ch_0"), None, "the oldest, forgotten");
        assert_eq!(k.intent_of("ch_1").as_deref(), Some("pi_1"));
        assert_eq!(k.intent_of("ch_new").as_deref(), Some("pi_new"));
        assert_eq!(k.payment_of("pi_1"), None, "two maps");
        k.keep_payment("pi_1", "p1");
        assert_eq!(k.payment_of("pi_1").as_deref(), Some("p1"));
    }
}
