//! Parsed expressions kept by their text. The processors send a handful of expressions, each
//! thousands of times with other values (and, for a refund's map entry, another name): each is
//! parsed once against markers for its placeholders, and each request binds the markers to its
//! own names and values. What DynamoDB refuses is refused as before: an expression that does not
//! parse with markers is parsed again with the request's placeholders (its message exact), and
//! an update's overlapping paths are checked once bound (they depend on the names).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;

use super::ast::{
    Cond, Invalid, Names, Operand, Operand2, Path, SetOperand, SetValue, Step, Update,
};
use super::parse;
use crate::dynamo::value::Value;

/// What marks a placeholder in a parsed expression: no name or value DynamoDB takes starts with
/// NUL, and markers never leave this module.
const MARK: char = '\u{0}';

#[derive(Clone)]
enum Parsed {
    Cond(Cond),
    Update(Update),
    Projection(Vec<Path>),
}

struct Entry {
    parsed: Parsed,
    used_names: BTreeSet<String>,
    used_values: BTreeSet<String>,
}

/// The kind of expression, its text, and the request's placeholder keys (not their values).
type Key = (u8, String, Vec<String>, Vec<String>);

thread_local! {
    /// `None`: the expression does not parse with markers (parsed each time, for its message).
    static CACHE: RefCell<HashMap<Key, Option<Rc<Entry>>>> = RefCell::new(HashMap::new());
}

/// At most this many expressions are kept (a run sends far fewer; a bound all the same).
const KEPT: usize = 10_000;

fn cached(
    kind: u8,
    text: &str,
    names: &mut Names<'_>,
    parse: impl Fn(&str, &mut Names<'_>) -> Result<Parsed, Invalid>,
) -> Result<Parsed, Invalid> {
    let key: Key = (
        kind,
        text.to_owned(),
        names.names.keys().cloned().collect(),
        names.values.keys().cloned().collect(),
    );
    let entry = CACHE.with(|c| c.borrow().get(&key).cloned());
    let entry = match entry {
        Some(e) => e,
        None => {
            let marked_names: BTreeMap<String, String> = names
                .names
                .keys()
                .map(|k| (k.clone(), format!("{MARK}{k}")))
                .collect();
            let marked_values: BTreeMap<String, Value> = names
                .values
                .keys()
                .map(|k| (k.clone(), Value::S(format!("{MARK}{k}"))))
                .collect();
            let mut marked = Names::new(&marked_names, &marked_values);
            let e = parse(text, &mut marked).ok().map(|parsed| {
                Rc::new(Entry {
                    parsed,
                    used_names: marked.used_names,
                    used_values: marked.used_values,
                })
            });
            CACHE.with(|c| {
                let mut c = c.borrow_mut();
                if c.len() >= KEPT {
                    c.clear();
                }
                c.insert(key, e.clone());
            });
            e
        }
    };
    let Some(entry) = entry else {
        return parse(text, names);
    };
    names.used_names.extend(entry.used_names.iter().cloned());
    names.used_values.extend(entry.used_values.iter().cloned());
    let b = Binder { names };
    Ok(match &entry.parsed {
        Parsed::Cond(c) => Parsed::Cond(b.cond(c)),
        Parsed::Update(u) => {
            let u = b.update(u);
            parse::overlap(&u)?;
            Parsed::Update(u)
        }
        Parsed::Projection(p) => Parsed::Projection(p.iter().map(|p| b.path(p)).collect()),
    })
}

/// Parses a condition (or key condition) expression.
pub fn condition(text: &str, names: &mut Names<'_>) -> Result<Cond, Invalid> {
    match cached(0, text, names, |t, n| {
        parse::condition(t, n).map(Parsed::Cond)
    })? {
        Parsed::Cond(c) => Ok(c),
        _ => unreachable!("a condition's entry"),
    }
}

/// Parses an update expression.
pub fn update(text: &str, names: &mut Names<'_>) -> Result<Update, Invalid> {
    match cached(1, text, names, |t, n| {
        parse::update(t, n).map(Parsed::Update)
    })? {
        Parsed::Update(u) => Ok(u),
        _ => unreachable!("an update's entry"),
    }
}

/// Parses a projection expression (paths separated by commas).
pub fn projection(text: &str, names: &mut Names<'_>) -> Result<Vec<Path>, Invalid> {
    match cached(2, text, names, |t, n| {
        parse::projection(t, n).map(Parsed::Projection)
    })? {
        Parsed::Projection(p) => Ok(p),
        _ => unreachable!("a projection's entry"),
    }
}

/// Puts the request's names and values where the markers are.
struct Binder<'b, 'n> {
    names: &'b Names<'n>,
}

impl Binder<'_, '_> {
    fn path(&self, p: &Path) -> Path {
        p.iter()
            .map(|s| match s {
                Step::Key(k) => match k.strip_prefix(MARK) {
                    Some(placeholder) => Step::Key(self.names.names[placeholder].clone()),
                    None => s.clone(),
                },
                Step::Index(_) => s.clone(),
            })
            .collect()
    }

    fn value(&self, v: &Value) -> Value {
        match v {
            Value::S(s) => match s.strip_prefix(MARK) {
                Some(placeholder) => self.names.values[placeholder].clone(),
                None => v.clone(),
            },
            _ => v.clone(),
        }
    }

    fn operand(&self, o: &Operand2) -> Operand2 {
        Operand2(match &o.0 {
            Operand::Path(p) => Operand::Path(self.path(p)),
            Operand::Value(v) => Operand::Value(self.value(v)),
            Operand::Size(p) => Operand::Size(self.path(p)),
        })
    }

    fn cond(&self, c: &Cond) -> Cond {
        let b = |c: &Cond| Box::new(self.cond(c));
        match c {
            Cond::Or(x, y) => Cond::Or(b(x), b(y)),
            Cond::And(x, y) => Cond::And(b(x), b(y)),
            Cond::Not(x) => Cond::Not(b(x)),
            Cond::Cmp(x, op, y) => Cond::Cmp(self.operand(x), op, self.operand(y)),
            Cond::Between(x, lo, hi) => {
                Cond::Between(self.operand(x), self.operand(lo), self.operand(hi))
            }
            Cond::In(x, list) => Cond::In(
                self.operand(x),
                list.iter().map(|o| self.operand(o)).collect(),
            ),
            Cond::Exists(p) => Cond::Exists(self.path(p)),
            Cond::NotExists(p) => Cond::NotExists(self.path(p)),
            Cond::Type(p, t) => Cond::Type(self.path(p), self.operand(t)),
            Cond::BeginsWith(x, y) => Cond::BeginsWith(self.operand(x), self.operand(y)),
            Cond::Contains(x, y) => Cond::Contains(self.operand(x), self.operand(y)),
        }
    }

    fn set_operand(&self, o: &SetOperand) -> SetOperand {
        match o {
            SetOperand::Path(p) => SetOperand::Path(self.path(p)),
            SetOperand::Value(v) => SetOperand::Value(self.value(v)),
            SetOperand::IfNotExists(p, d) => {
                SetOperand::IfNotExists(self.path(p), Box::new(self.set_operand(d)))
            }
            SetOperand::ListAppend(a, b) => {
                SetOperand::ListAppend(Box::new(self.set_operand(a)), Box::new(self.set_operand(b)))
            }
        }
    }

    fn update(&self, u: &Update) -> Update {
        Update {
            set: u
                .set
                .iter()
                .map(|(p, v)| {
                    let v = match v {
                        SetValue::Plain(a) => SetValue::Plain(self.set_operand(a)),
                        SetValue::Plus(a, b) => {
                            SetValue::Plus(self.set_operand(a), self.set_operand(b))
                        }
                        SetValue::Minus(a, b) => {
                            SetValue::Minus(self.set_operand(a), self.set_operand(b))
                        }
                    };
                    (self.path(p), v)
                })
                .collect(),
            remove: u.remove.iter().map(|p| self.path(p)).collect(),
            add: u
                .add
                .iter()
                .map(|(p, v)| (self.path(p), self.value(v)))
                .collect(),
            delete: u
                .delete
                .iter()
                .map(|(p, v)| (self.path(p), self.value(v)))
                .collect(),
        }
    }
}
