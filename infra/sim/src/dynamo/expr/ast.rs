//! What an expression is, once parsed, and the request's placeholders it reads.

use std::collections::{BTreeMap, BTreeSet};

use crate::dynamo::value::Value;

/// Why DynamoDB refuses an expression (a `ValidationException`'s message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

pub(super) fn invalid<T>(msg: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid(msg.into()))
}

/// One step of a document path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// A map key (or the top-level attribute).
    Key(String),
    /// A list index.
    Index(usize),
}

/// A document path (`outcome.status`, `events[0]`).
pub type Path = Vec<Step>;

/// The placeholders of a request: their values, and which ones the expressions used.
pub struct Names<'a> {
    pub(super) names: &'a BTreeMap<String, String>,
    pub(super) values: &'a BTreeMap<String, Value>,
    pub(super) used_names: BTreeSet<String>,
    pub(super) used_values: BTreeSet<String>,
}

impl<'a> Names<'a> {
    /// The request's `ExpressionAttributeNames` and `ExpressionAttributeValues`.
    pub fn new(names: &'a BTreeMap<String, String>, values: &'a BTreeMap<String, Value>) -> Self {
        Self {
            names,
            values,
            used_names: BTreeSet::new(),
            used_values: BTreeSet::new(),
        }
    }

    /// DynamoDB refuses a request that defines a placeholder no expression uses.
    pub fn check_all_used(&self) -> Result<(), Invalid> {
        let unused: Vec<&String> = self
            .names
            .keys()
            .filter(|k| !self.used_names.contains(*k))
            .collect();
        if !unused.is_empty() {
            return invalid(format!(
                "Value provided in ExpressionAttributeNames unused in expressions: keys: {{{}}}",
                unused
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let unused: Vec<&String> = self
            .values
            .keys()
            .filter(|k| !self.used_values.contains(*k))
            .collect();
        if !unused.is_empty() {
            return invalid(format!(
                "Value provided in ExpressionAttributeValues unused in expressions: keys: {{{}}}",
                unused
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        Ok(())
    }
}

/// An operand of a condition.
#[derive(Debug, Clone)]
pub(super) enum Operand {
    Path(Path),
    Value(Value),
    Size(Path),
}

/// A condition, parsed.
#[derive(Debug, Clone)]
pub enum Cond {
    /// `a OR b`.
    Or(Box<Cond>, Box<Cond>),
    /// `a AND b`.
    And(Box<Cond>, Box<Cond>),
    /// `NOT a`.
    Not(Box<Cond>),
    /// `a op b`.
    Cmp(Operand2, &'static str, Operand2),
    /// `a BETWEEN b AND c`.
    Between(Operand2, Operand2, Operand2),
    /// `a IN (b, c)`.
    In(Operand2, Vec<Operand2>),
    /// `attribute_exists(p)`.
    Exists(Path),
    /// `attribute_not_exists(p)`.
    NotExists(Path),
    /// `attribute_type(p, :t)`.
    Type(Path, Operand2),
    /// `begins_with(p, :v)`.
    BeginsWith(Operand2, Operand2),
    /// `contains(p, :v)`.
    Contains(Operand2, Operand2),
}

/// An operand (public only through [`Cond`]).
#[derive(Debug, Clone)]
pub struct Operand2(pub(super) Operand);

/// The right side of one `SET` action.
#[derive(Debug, Clone)]
pub(super) enum SetValue {
    Plain(SetOperand),
    Plus(SetOperand, SetOperand),
    Minus(SetOperand, SetOperand),
}

#[derive(Debug, Clone)]
pub(super) enum SetOperand {
    Path(Path),
    Value(Value),
    IfNotExists(Path, Box<SetOperand>),
    ListAppend(Box<SetOperand>, Box<SetOperand>),
}

/// An update expression, parsed.
#[derive(Debug, Clone, Default)]
pub struct Update {
    pub(super) set: Vec<(Path, SetValue)>,
    pub(super) remove: Vec<Path>,
    pub(super) add: Vec<(Path, Value)>,
    pub(super) delete: Vec<(Path, Value)>,
}

impl Cond {
    /// The value `attr` must equal for the condition to hold, when it says so plainly
    /// (`attr = :v`, alone or under `AND`): a key condition's partition key.
    pub fn equality_on(&self, attr: &str) -> Option<&Value> {
        match self {
            Cond::And(a, b) => a.equality_on(attr).or_else(|| b.equality_on(attr)),
            Cond::Cmp(Operand2(a), "=", Operand2(b)) => match (a, b) {
                (Operand::Path(p), Operand::Value(v)) | (Operand::Value(v), Operand::Path(p))
                    if matches!(p.as_slice(), [Step::Key(k)] if k == attr) =>
                {
                    Some(v)
                }
                _ => None,
            },
            _ => None,
        }
    }
}
