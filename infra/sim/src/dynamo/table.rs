//! One table: its key schema, items, secondary indexes, time to live and stream.

use std::collections::BTreeMap;

use serde_json::{json, Value as Json};

use super::value::{number, Item, Value};

/// A key schema: the partition key and the optional sort key, with their scalar types.
#[derive(Debug, Clone, PartialEq)]
pub struct KeySchema {
    /// Partition key attribute and its type (`S`, `N` or `B`).
    pub hash: (String, String),
    /// Sort key attribute and its type.
    pub range: Option<(String, String)>,
}

impl KeySchema {
    /// The wire `KeySchema`.
    pub fn to_json(&self) -> Json {
        let mut out = vec![json!({"AttributeName": self.hash.0, "KeyType": "HASH"})];
        if let Some((r, _)) = &self.range {
            out.push(json!({"AttributeName": r, "KeyType": "RANGE"}));
        }
        Json::Array(out)
    }

    /// The attribute names of the key.
    pub fn names(&self) -> Vec<&str> {
        let mut out = vec![self.hash.0.as_str()];
        if let Some((r, _)) = &self.range {
            out.push(r.as_str());
        }
        out
    }
}

/// A global secondary index (all attributes projected).
#[derive(Debug, Clone)]
pub struct Index {
    /// Its name.
    pub name: String,
    /// Its keys.
    pub keys: KeySchema,
    /// The wire `Projection`, echoed by `DescribeTable`.
    pub projection: Json,
}

/// One change as the table's stream carries it.
#[derive(Debug, Clone)]
pub struct Change {
    /// Increasing per table.
    pub sequence: u64,
    /// `INSERT`, `MODIFY` or `REMOVE`.
    pub event: &'static str,
    /// The item's key.
    pub keys: Item,
    /// The item before (absent for an insert, and unless the view keeps old images).
    pub old: Option<Item>,
    /// The item after (absent for a remove, and unless the view keeps new images).
    pub new: Option<Item>,
    /// The record's `SizeBytes`: the item's size after (before, for a remove).
    pub size_bytes: usize,
    /// True for a deletion by time to live (the stream's `userIdentity` says so).
    pub by_ttl: bool,
    /// Simulated epoch seconds of the change.
    pub at_s: i64,
}

/// A table.
#[derive(Debug)]
pub struct Table {
    /// Its name.
    pub name: String,
    /// Its primary key.
    pub keys: KeySchema,
    /// Its attribute definitions, echoed by `DescribeTable`.
    pub definitions: Json,
    /// Its global secondary indexes.
    pub indexes: Vec<Index>,
    /// The time-to-live attribute, once enabled ([`Table::set_ttl`]).
    ttl_attribute: Option<String>,
    /// Items by their time to live (epoch s) and key: the sweep reads only those past it.
    by_expiry: std::collections::BTreeSet<(i64, String)>,
    /// The stream's view type, when the table has one.
    pub stream_view: Option<String>,
    /// Items by their key's canonical text.
    pub items: BTreeMap<String, Item>,
    /// The stream's records not yet trimmed (24 h, as DynamoDB Streams keeps them), their
    /// sequence numbers consecutive: [`Table::changes_from`] reads from a position.
    changes: std::collections::VecDeque<Change>,
    /// The next stream sequence number.
    next_sequence: u64,
    /// A check of every write (its key, the item before and after), installed by whoever
    /// watches the table (the simulator's invariants); what it returns is kept in `findings`.
    pub watch: Option<Watch>,
    /// What [`Table::watch`] found, until its reader takes it.
    pub findings: Vec<String>,
    /// Woken at each record on the stream (Lambda's stream poller waits on it).
    pub streamed: std::sync::Arc<tokio::sync::Notify>,
    /// The keys of the items under each partition key value, for the table (first) and for
    /// each index (in `indexes`' order): a query reads its partition, not the whole table.
    partitions: Vec<BTreeMap<String, std::collections::BTreeSet<String>>>,
}

/// A check of one write: the key, the item before and after; `Some` is a finding.
pub type Watch = fn(&str, Option<&Item>, Option<&Item>) -> Option<String>;

/// Why a key or item does not fit the table (a `ValidationException`).
pub type Refused = String;

impl Table {
    /// A new, empty table.
    pub fn new(
        name: String,
        keys: KeySchema,
        definitions: Json,
        indexes: Vec<Index>,
        stream_view: Option<String>,
    ) -> Self {
        let indexes_len = indexes.len();
        Self {
            name,
            keys,
            definitions,
            indexes,
            ttl_attribute: None,
            by_expiry: std::collections::BTreeSet::new(),
            stream_view,
            items: BTreeMap::new(),
            changes: Default::default(),
            next_sequence: 1,
            watch: None,
            findings: Vec::new(),
            streamed: Default::default(),
            partitions: vec![BTreeMap::new(); 1 + indexes_len],
        }
    }

    /// The partition an item falls in under `schema` (`None` when the index skips it).
    fn partition_of(schema: &KeySchema, item: &Item) -> Option<String> {
        Self::key_text_of(schema, item).ok().flatten()?;
        Self::part(item.get(&schema.hash.0)?, &schema.hash.1, &schema.hash.0).ok()
    }

    /// Files (`add`) or unfiles an item's key under each schema's partition.
    fn file(&mut self, key: &str, item: &Item, add: bool) {
        let schemas = std::iter::once(&self.keys).chain(self.indexes.iter().map(|i| &i.keys));
        for (parts, schema) in self.partitions.iter_mut().zip(schemas) {
            let Some(part) = Self::partition_of(schema, item) else {
                continue;
            };
            if add {
                parts.entry(part).or_default().insert(key.to_owned());
            } else if let Some(keys) = parts.get_mut(&part) {
                keys.remove(key);
                if keys.is_empty() {
                    parts.remove(&part);
                }
            }
        }
    }

    /// The items of one partition of the table (`index` `None`) or of an index, in key order:
    /// those whose partition key is `value`.
    pub fn partition<'a>(
        &'a self,
        index: Option<&str>,
        value: &Value,
    ) -> impl Iterator<Item = (&'a String, &'a Item)> + 'a {
        let at = match index {
            None => Some((0, &self.keys)),
            Some(name) => self
                .indexes
                .iter()
                .position(|i| i.name == name)
                .map(|n| (n + 1, &self.indexes[n].keys)),
        };
        let keys = at.and_then(|(n, schema)| {
            let part = Self::part(value, &schema.hash.1, &schema.hash.0).ok()?;
            self.partitions[n].get(&part)
        });
        keys.into_iter()
            .flatten()
            .filter_map(|k| self.items.get_key_value(k))
    }

    fn part(v: &Value, ty: &str, name: &str) -> Result<String, Refused> {
        match (v, ty) {
            (Value::S(s), "S") | (Value::B(s), "B") => {
                if s.is_empty() {
                    return Err(format!(
                        "One or more parameter values are not valid. The AttributeValue for a key attribute cannot contain an empty string value. Key: {name}"
                    ));
                }
                Ok(format!("{ty}:{s}"))
            }
            (Value::N(n), "N") => Ok(format!("N:{}", number(n).map(|x| x.text()).unwrap_or_default())),
            _ => Err(format!(
                "One or more parameter values were invalid: Type mismatch for key {name} expected: {ty} actual: {}",
                v.type_name()
            )),
        }
    }

    /// The canonical text of an item's key under a schema; `Ok(None)` when the item lacks one of
    /// the key's attributes (an index skips such items; the table refuses them).
    pub fn key_text_of(schema: &KeySchema, item: &Item) -> Result<Option<String>, Refused> {
        let Some(h) = item.get(&schema.hash.0) else {
            return Ok(None);
        };
        let mut text = Self::part(h, &schema.hash.1, &schema.hash.0)?;
        if let Some((r, ty)) = &schema.range {
            let Some(v) = item.get(r) else {
                return Ok(None);
            };
            text.push('\u{0}');
            text.push_str(&Self::part(v, ty, r)?);
        }
        Ok(Some(text))
    }

    /// The canonical text of a request's `Key`, which must name exactly the key's attributes.
    pub fn key_text(&self, key: &Item) -> Result<String, Refused> {
        if key.len() != self.keys.names().len()
            || !self.keys.names().iter().all(|n| key.contains_key(*n))
        {
            return Err("The provided key element does not match the schema".into());
        }
        Self::key_text_of(&self.keys, key)?
            .ok_or_else(|| "The provided key element does not match the schema".into())
    }

    /// Checks an item about to be stored: its key, its indexes' key types, its size.
    pub fn check_item(&self, item: &Item) -> Result<String, Refused> {
        let key = Self::key_text_of(&self.keys, item)?.ok_or_else(|| {
            format!(
                "One or more parameter values were invalid: Missing the key {} in the item",
                self.keys.names().join(", ")
            )
        })?;
        for index in &self.indexes {
            for (name, ty) in std::iter::once(&index.keys.hash).chain(index.keys.range.iter()) {
                if let Some(v) = item.get(name) {
                    if v.type_name() != ty {
                        return Err(format!(
                            "One or more parameter values were invalid: Type mismatch for Index Key {name} Expected: {ty} Actual: {} IndexName: {}",
                            v.type_name(),
                            index.name
                        ));
                    }
                }
            }
        }
        if super::value::item_size(item) > 400 * 1024 {
            return Err("Item size has exceeded the maximum allowed size".into());
        }
        Ok(key)
    }

    /// The sequence number of the oldest change the stream still keeps.
    pub fn first_sequence(&self) -> Option<u64> {
        self.changes.front().map(|c| c.sequence)
    }

    /// The stream's changes from sequence number `next` on, oldest first.
    pub fn changes_from(&self, next: u64) -> impl Iterator<Item = &Change> {
        let skip = self
            .first_sequence()
            .map_or(0, |first| next.saturating_sub(first) as usize);
        self.changes
            .range(skip.min(self.changes.len())..)
            .inspect(|_| crate::cost::visit(1))
    }

    /// The sequence number the next change will get.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// The key attributes of an item.
    pub fn key_of(&self, item: &Item) -> Item {
        self.keys
            .names()
            .iter()
            .filter_map(|n| item.get(*n).map(|v| (n.to_string(), v.clone())))
            .collect()
    }

    /// Stores (or, with `None`, deletes) the item at `key`, recording the change on the stream.
    pub fn write(&mut self, key: &str, after: Option<Item>, at_s: i64, by_ttl: bool) {
        let before = match &after {
            Some(item) => self.items.insert(key.to_owned(), item.clone()),
            None => self.items.remove(key),
        };
        if let Some(item) = &before {
            self.file(key, item, false);
        }
        if let Some(item) = &after {
            self.file(key, item, true);
        }
        if let Some(at) = before.as_ref().and_then(|i| self.expiry_of(i)) {
            self.by_expiry.remove(&(at, key.to_owned()));
        }
        if let Some(at) = after.as_ref().and_then(|i| self.expiry_of(i)) {
            self.by_expiry.insert((at, key.to_owned()));
        }
        if let Some(found) = self
            .watch
            .and_then(|watch| watch(key, before.as_ref(), after.as_ref()))
        {
            self.findings.push(found);
        }
        if self.stream_view.is_none() || (before.is_none() && after.is_none()) {
            return;
        }
        let event = match (&before, &after) {
            (None, Some(_)) => "INSERT",
            (Some(_), Some(_)) => "MODIFY",
            _ => "REMOVE",
        };
        let changed = after.as_ref().or(before.as_ref()).expect("one side");
        let keys = self.key_of(changed);
        let size_bytes = super::value::item_size(changed);
        // Only the images the view carries are kept.
        let view = self.stream_view.as_deref().unwrap_or("KEYS_ONLY");
        let old = before.filter(|_| matches!(view, "OLD_IMAGE" | "NEW_AND_OLD_IMAGES"));
        let new = after.filter(|_| matches!(view, "NEW_IMAGE" | "NEW_AND_OLD_IMAGES"));
        self.changes.push_back(Change {
            sequence: self.next_sequence,
            event,
            keys,
            old,
            new,
            size_bytes,
            by_ttl,
            at_s,
        });
        self.next_sequence += 1;
        self.streamed.notify_waiters();
        // DynamoDB Streams keeps a record 24 hours (changes are in time order).
        let horizon = at_s - 24 * 3600;
        while self.changes.front().is_some_and(|c| c.at_s < horizon) {
            self.changes.pop_front();
        }
    }

    /// The items whose time to live has passed and whose deletion is due by `now_s`: DynamoDB
    /// deletes an expired item at any time within about 48 hours after its `expires_at`; here the
    /// delay is drawn per item from `delay_of` (deterministic in the run's seed).
    pub fn expired(&self, now_s: i64, delay_of: impl Fn(&str, i64) -> i64) -> Vec<String> {
        let mut keys: Vec<String> = self
            .by_expiry
            .range(..(now_s.saturating_add(1), String::new()))
            // DynamoDB skips a TTL more than five years in the past.
            .filter(|(at, _)| *at >= now_s - 5 * 365 * 86_400)
            .filter(|(at, k)| at + delay_of(k, *at) <= now_s)
            .map(|(_, k)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    /// The time-to-live attribute, when enabled.
    pub fn ttl_attribute(&self) -> Option<&str> {
        self.ttl_attribute.as_deref()
    }

    /// Enables time to live on `attribute`, or disables it (`None`).
    pub fn set_ttl(&mut self, attribute: Option<String>) {
        self.ttl_attribute = attribute;
        let expiring: std::collections::BTreeSet<(i64, String)> = self
            .items
            .iter()
            .filter_map(|(k, item)| Some((self.expiry_of(item)?, k.clone())))
            .collect();
        self.by_expiry = expiring;
    }

    /// An item's time to live, epoch s, when it has one.
    fn expiry_of(&self, item: &Item) -> Option<i64> {
        let Some(Value::N(n)) = item.get(self.ttl_attribute.as_deref()?) else {
            return None;
        };
        // Epoch seconds are written as integers; anything else is read exactly.
        match n.parse::<i64>() {
            Ok(at) => Some(at),
            Err(_) => number(n)?.text().split('.').next()?.parse::<i64>().ok(),
        }
    }
}
