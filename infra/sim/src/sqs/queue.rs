//! One queue and its messages: attributes as set, the redrive policy read from them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Map, Value as Json};

/// One message in a queue.
#[derive(Debug, Clone)]
pub struct Message {
    /// Its id (kept by a dead-letter move, shared by a duplicate delivery's twin).
    pub id: String,
    /// Its body.
    pub body: String,
    /// Message attributes, in the wire's form (`{"DataType": .., "StringValue": ..}`).
    pub attributes: Map<String, Json>,
    /// FIFO group.
    pub group: Option<String>,
    /// FIFO deduplication id.
    pub dedup: Option<String>,
    /// Order of sending (FIFO sequence number).
    pub sequence: u64,
    /// When it was first enqueued (retention counts from here), ms.
    pub sent_ms: i64,
    /// Not receivable before this, ms.
    pub visible_ms: i64,
    /// Times received.
    pub receives: u32,
    /// First receive, ms.
    pub first_receive_ms: Option<i64>,
    /// The latest receive, ms: its visibility can be extended to 12 hours from here, no more.
    pub received_ms: i64,
    /// The latest receive's handle.
    pub handle: Option<String>,
}

/// A queue.
#[derive(Debug, Clone)]
pub struct Queue {
    /// Its name (`.fifo` for a FIFO queue).
    pub name: String,
    /// Its attributes as set (`VisibilityTimeout`, `RedrivePolicy`, ...): set them with
    /// [`Queue::set_attributes`], which reads the redrive policy again.
    pub(super) attributes: BTreeMap<String, String>,
    /// The redrive policy as read from the attributes (every receive needs it).
    pub(super) policy: Option<(String, u32)>,
    /// Its messages, in the order they were put in (a slot each, increasing): each request
    /// reaches only those it concerns, through the indexes below.
    pub(super) store: Store,
    /// FIFO deduplication ids seen, with when, ms ...
    pub(super) dedup_seen: BTreeMap<String, i64>,
    /// ... and the same ids in the order seen (each is forgotten five minutes on).
    pub(super) dedup_order: std::collections::VecDeque<(i64, String)>,
    /// Its tags.
    pub tags: BTreeMap<String, String>,
    /// Woken at each send: a long poll of this queue returns as soon as a message arrives.
    pub(super) arrivals: std::sync::Arc<tokio::sync::Notify>,
}

impl Message {
    /// A `String` message attribute's value (`error_code`, ...).
    pub fn string_attribute(&self, name: &str) -> Option<&str> {
        self.attributes.get(name)?["StringValue"].as_str()
    }
}

impl Queue {
    pub(super) fn attr_i64(&self, name: &str, default: i64) -> i64 {
        self.attributes
            .get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// True for a FIFO queue.
    pub fn fifo(&self) -> bool {
        self.name.ends_with(".fifo")
    }

    /// The visibility timeout, s.
    pub fn visibility_s(&self) -> i64 {
        self.attr_i64("VisibilityTimeout", 30)
    }

    /// The retention, s.
    pub fn retention_s(&self) -> i64 {
        self.attr_i64("MessageRetentionPeriod", 345_600)
    }

    /// Its messages, in the order they were put in.
    pub fn messages(&self) -> impl Iterator<Item = &Message> {
        self.store.messages.values()
    }

    /// How many messages it holds.
    pub fn len(&self) -> usize {
        self.store.messages.len()
    }

    /// True when it holds none.
    pub fn is_empty(&self) -> bool {
        self.store.messages.is_empty()
    }

    /// Its attributes as set.
    pub fn attributes(&self) -> &BTreeMap<String, String> {
        &self.attributes
    }

    /// Sets attributes (`CreateQueue`, `SetQueueAttributes`).
    pub fn set_attributes(&mut self, attributes: impl IntoIterator<Item = (String, String)>) {
        self.attributes.extend(attributes);
        self.policy = Self::read_redrive(&self.attributes);
    }

    /// The redrive policy: the dead-letter queue's name and `maxReceiveCount`.
    pub fn redrive(&self) -> Option<(String, u32)> {
        self.policy.clone()
    }

    pub(super) fn read_redrive(attributes: &BTreeMap<String, String>) -> Option<(String, u32)> {
        let p: Json = serde_json::from_str(attributes.get("RedrivePolicy")?).ok()?;
        let arn = p["deadLetterTargetArn"].as_str()?;
        let max = match &p["maxReceiveCount"] {
            Json::String(s) => s.parse().ok()?,
            v => v.as_u64()? as u32,
        };
        Some((arn.rsplit(':').next()?.to_owned(), max))
    }
}

/// A queue's messages by slot (the order they were put in), with what each request looks them
/// up by: the receipt handle, the time a message becomes visible, its first enqueue (retention),
/// and the visible ones counted in slot order, so that a receive picks its k-th visible message
/// without walking the queue.
#[derive(Debug, Clone, Default)]
pub(super) struct Store {
    pub(super) messages: BTreeMap<u64, Message>,
    next_slot: u64,
    by_handle: HashMap<String, u64>,
    /// Those not visible as of the last [`Store::reveal`]: (visible from, slot).
    hidden: BTreeSet<(i64, u64)>,
    /// Those visible as of the last [`Store::reveal`].
    visible: Ranks,
    /// (first enqueued, slot): what retention drops first.
    by_sent: BTreeSet<(i64, u64)>,
}

impl Store {
    /// Puts a message in at the end; `now_ms` says whether it is visible.
    pub(super) fn push(&mut self, m: Message, now_ms: i64) -> u64 {
        let slot = self.next_slot;
        self.next_slot += 1;
        if let Some(h) = &m.handle {
            self.by_handle.insert(h.clone(), slot);
        }
        self.by_sent.insert((m.sent_ms, slot));
        if m.visible_ms <= now_ms {
            self.visible.insert(slot);
        } else {
            self.hidden.insert((m.visible_ms, slot));
        }
        self.messages.insert(slot, m);
        slot
    }

    /// Takes a message out.
    pub(super) fn remove(&mut self, slot: u64) -> Option<Message> {
        let m = self.messages.remove(&slot)?;
        if let Some(h) = &m.handle {
            self.by_handle.remove(h);
        }
        self.by_sent.remove(&(m.sent_ms, slot));
        if !self.hidden.remove(&(m.visible_ms, slot)) {
            self.visible.remove(slot);
        }
        Some(m)
    }

    /// Empties the queue (`PurgeQueue`).
    pub(super) fn clear(&mut self) {
        let next_slot = self.next_slot;
        *self = Self {
            next_slot,
            ..Self::default()
        };
    }

    /// Counts as visible every message whose time has come by `now_ms`.
    pub(super) fn reveal(&mut self, now_ms: i64) {
        while let Some(&(at, slot)) = self.hidden.first() {
            if at > now_ms {
                break;
            }
            self.hidden.pop_first();
            self.visible.insert(slot);
        }
    }

    /// How many are visible at `now_ms` (after [`Store::reveal`] at it).
    pub(super) fn visible_count(&self) -> usize {
        self.visible.len()
    }

    /// The slot of the `k`-th visible message in slot order (0-based).
    pub(super) fn visible_at(&self, k: usize) -> u64 {
        self.visible.select(k)
    }

    /// When the first message not visible at `now_ms` becomes visible.
    pub(super) fn next_visible(&self, now_ms: i64) -> Option<i64> {
        self.hidden
            .range((now_ms.saturating_add(1), 0)..)
            .next()
            .map(|(at, _)| *at)
    }

    /// The messages not visible at `now_ms` that were received (in flight).
    pub(super) fn in_flight(&self, now_ms: i64) -> usize {
        self.hidden
            .range((now_ms.saturating_add(1), 0)..)
            .filter(|(_, slot)| self.messages[slot].receives > 0)
            .count()
    }

    /// The slot the receipt handle names (its message's latest receive only).
    pub(super) fn slot_of(&self, handle: &str) -> Option<u64> {
        self.by_handle.get(handle).copied()
    }

    /// Changes a message in place, keeping the indexes true (its handle, when it is visible).
    pub(super) fn update<T>(
        &mut self,
        slot: u64,
        now_ms: i64,
        change: impl FnOnce(&mut Message) -> T,
    ) -> Option<T> {
        let m = self.messages.get_mut(&slot)?;
        let (handle, visible_ms) = (m.handle.clone(), m.visible_ms);
        let out = change(m);
        if m.handle != handle {
            if let Some(h) = &handle {
                self.by_handle.remove(h);
            }
            if let Some(h) = &m.handle {
                self.by_handle.insert(h.clone(), slot);
            }
        }
        if m.visible_ms != visible_ms {
            if !self.hidden.remove(&(visible_ms, slot)) {
                self.visible.remove(slot);
            }
            if m.visible_ms <= now_ms {
                self.visible.insert(slot);
            } else {
                self.hidden.insert((m.visible_ms, slot));
            }
        }
        Some(out)
    }

    /// The slots of the messages first enqueued at or before `at_ms`, in slot order.
    pub(super) fn sent_by(&self, at_ms: i64) -> Vec<u64> {
        let mut slots: Vec<u64> = self
            .by_sent
            .range(..(at_ms.saturating_add(1), 0))
            .map(|(_, slot)| *slot)
            .collect();
        slots.sort_unstable();
        slots
    }
}

/// A set of slots with rank and select in O(log n): a Fenwick tree of counts by slot.
#[derive(Debug, Clone, Default)]
pub(super) struct Ranks {
    /// 1-based Fenwick tree over slots `0..present.len()`.
    tree: Vec<u32>,
    present: Vec<bool>,
    len: usize,
}

impl Ranks {
    fn len(&self) -> usize {
        self.len
    }

    fn grow(&mut self, slot: u64) {
        let need = slot as usize + 1;
        if need <= self.present.len() {
            return;
        }
        let cap = need.next_power_of_two().max(64);
        self.present.resize(cap, false);
        // Rebuilt in O(n): each node adds itself into its parent.
        self.tree = vec![0; cap + 1];
        for (i, p) in self.present.iter().enumerate() {
            self.tree[i + 1] += u32::from(*p);
            let parent = (i + 1) + ((i + 1) & (i + 1).wrapping_neg());
            if parent <= cap {
                self.tree[parent] += self.tree[i + 1];
            }
        }
    }

    fn add(&mut self, slot: u64, up: bool) {
        let mut i = slot as usize + 1;
        while i < self.tree.len() {
            if up {
                self.tree[i] += 1;
            } else {
                self.tree[i] -= 1;
            }
            i += i & i.wrapping_neg();
        }
    }

    fn insert(&mut self, slot: u64) {
        self.grow(slot);
        if !std::mem::replace(&mut self.present[slot as usize], true) {
            self.len += 1;
            self.add(slot, true);
        }
    }

    fn remove(&mut self, slot: u64) {
        if self
            .present
            .get_mut(slot as usize)
            .is_some_and(|p| std::mem::replace(p, false))
        {
            self.len -= 1;
            self.add(slot, false);
        }
    }

    /// The `k`-th present slot (0-based); `k` below [`Ranks::len`].
    fn select(&self, k: usize) -> u64 {
        let cap = self.tree.len() - 1;
        let (mut pos, mut left) = (0usize, k as u32 + 1);
        let mut step = cap.next_power_of_two();
        while step > 0 {
            if pos + step <= cap && self.tree[pos + step] < left {
                pos += step;
                left -= self.tree[pos];
            }
            step /= 2;
        }
        pos as u64
    }
}

#[cfg(test)]
mod tests {
    use super::Ranks;

    #[test]
    fn ranks_select_the_k_th_present_slot_as_a_sorted_list_would() {
        let mut r = Ranks::default();
        let mut list: Vec<u64> = Vec::new();
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..5_000 {
            let slot = rng.u64(0..3_000);
            if rng.bool() {
                r.insert(slot);
                if let Err(at) = list.binary_search(&slot) {
                    list.insert(at, slot);
                }
            } else {
                r.remove(slot);
                if let Ok(at) = list.binary_search(&slot) {
                    list.remove(at);
                }
            }
            assert_eq!(r.len(), list.len());
            if !list.is_empty() {
                let k = rng.usize(0..list.len());
                assert_eq!(r.select(k), list[k]);
            }
        }
    }
}
