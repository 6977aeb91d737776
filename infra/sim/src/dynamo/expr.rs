//! DynamoDB's expression language, parsed and evaluated as DynamoDB does: condition and key
//! condition expressions (`AND`/`OR`/`NOT`, comparisons, `BETWEEN`, `IN`, `attribute_exists`,
//! `attribute_not_exists`, `attribute_type`, `begins_with`, `contains`, `size`), update
//! expressions (`SET` with `+`/`-`, `if_not_exists`, `list_append`; `REMOVE`; `ADD`; `DELETE`)
//! and projections. The processors' condition and update expressions are the protocol, so this
//! is where the simulator must be exact; what DynamoDB refuses (an unknown placeholder, a value
//! given and not used, two paths of one update overlapping, arithmetic on a non-number, a
//! nested `SET` under a missing map) is refused here with DynamoDB's `ValidationException`.

use std::collections::{BTreeMap, BTreeSet};

use super::reserved::RESERVED;
use super::value::{number, Item, Value};

/// Why DynamoDB refuses an expression (a `ValidationException`'s message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

fn invalid<T>(msg: impl Into<String>) -> Result<T, Invalid> {
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

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Placeholder(String),
    Value(String),
    Int(usize),
    Punct(&'static str),
}

fn tokens(text: &str) -> Result<Vec<Tok>, Invalid> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let word = |i: usize| {
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        j
    };
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'#' || c == b':' {
            let j = word(i + 1);
            if j == i + 1 {
                return invalid(format!("Invalid syntax: a bare '{}' in {text}", c as char));
            }
            let s = text[i..j].to_owned();
            out.push(if c == b'#' {
                Tok::Placeholder(s)
            } else {
                Tok::Value(s)
            });
            i = j;
        } else if c.is_ascii_digit() {
            let j = word(i);
            let n = text[i..j]
                .parse()
                .map_err(|_| Invalid(format!("Invalid syntax: {}", &text[i..j])))?;
            out.push(Tok::Int(n));
            i = j;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let j = word(i);
            out.push(Tok::Name(text[i..j].to_owned()));
            i = j;
        } else {
            let two = text.get(i..i + 2).unwrap_or("");
            let p: &'static str = match two {
                "<>" => "<>",
                "<=" => "<=",
                ">=" => ">=",
                _ => match c {
                    b'=' => "=",
                    b'<' => "<",
                    b'>' => ">",
                    b'(' => "(",
                    b')' => ")",
                    b',' => ",",
                    b'.' => ".",
                    b'[' => "[",
                    b']' => "]",
                    b'+' => "+",
                    b'-' => "-",
                    _ => {
                        return invalid(format!("Invalid syntax: token '{}' in {text}", c as char))
                    }
                },
            };
            i += p.len();
            out.push(Tok::Punct(p));
        }
    }
    Ok(out)
}

/// The placeholders of a request: their values, and which ones the expressions used.
pub struct Names<'a> {
    names: &'a BTreeMap<String, String>,
    values: &'a BTreeMap<String, Value>,
    used_names: BTreeSet<String>,
    used_values: BTreeSet<String>,
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

struct Parser<'n, 'a> {
    toks: Vec<Tok>,
    at: usize,
    names: &'n mut Names<'a>,
    text: String,
}

/// An operand of a condition.
#[derive(Debug, Clone)]
enum Operand {
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
pub struct Operand2(Operand);

/// The right side of one `SET` action.
#[derive(Debug, Clone)]
enum SetValue {
    Plain(SetOperand),
    Plus(SetOperand, SetOperand),
    Minus(SetOperand, SetOperand),
}

#[derive(Debug, Clone)]
enum SetOperand {
    Path(Path),
    Value(Value),
    IfNotExists(Path, Box<SetOperand>),
    ListAppend(Box<SetOperand>, Box<SetOperand>),
}

/// An update expression, parsed.
#[derive(Debug, Clone, Default)]
pub struct Update {
    set: Vec<(Path, SetValue)>,
    remove: Vec<Path>,
    add: Vec<(Path, Value)>,
    delete: Vec<(Path, Value)>,
}

impl<'n, 'a> Parser<'n, 'a> {
    fn new(text: &str, names: &'n mut Names<'a>) -> Result<Self, Invalid> {
        Ok(Self {
            toks: tokens(text)?,
            at: 0,
            names,
            text: text.to_owned(),
        })
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.at).cloned();
        self.at += 1;
        t
    }

    fn keyword(&self, k: &str) -> bool {
        matches!(self.peek(), Some(Tok::Name(n)) if n.eq_ignore_ascii_case(k))
    }

    fn punct(&self, p: &str) -> bool {
        matches!(self.peek(), Some(Tok::Punct(q)) if *q == p)
    }

    fn expect(&mut self, p: &str) -> Result<(), Invalid> {
        if self.punct(p) {
            self.at += 1;
            Ok(())
        } else {
            invalid(format!("Invalid syntax: expected '{p}' in {}", self.text))
        }
    }

    fn done(&self) -> Result<(), Invalid> {
        match self.peek() {
            None => Ok(()),
            Some(t) => invalid(format!("Invalid syntax: unexpected {t:?} in {}", self.text)),
        }
    }

    fn path(&mut self) -> Result<Path, Invalid> {
        let mut path = vec![Step::Key(self.path_name()?)];
        loop {
            if self.punct(".") {
                self.at += 1;
                path.push(Step::Key(self.path_name()?));
            } else if self.punct("[") {
                self.at += 1;
                match self.next() {
                    Some(Tok::Int(n)) => path.push(Step::Index(n)),
                    _ => return invalid(format!("Invalid syntax: a list index in {}", self.text)),
                }
                self.expect("]")?;
            } else {
                return Ok(path);
            }
        }
    }

    fn path_name(&mut self) -> Result<String, Invalid> {
        match self.next() {
            Some(Tok::Name(n)) => {
                if RESERVED.binary_search(&n.to_ascii_uppercase().as_str()).is_ok() {
                    return invalid(format!(
                        "Invalid {}: Attribute name is a reserved keyword; reserved keyword: {n}",
                        self.text
                    ));
                }
                Ok(n)
            }
            Some(Tok::Placeholder(p)) => match self.names.names.get(&p) {
                Some(n) => {
                    self.names.used_names.insert(p);
                    Ok(n.clone())
                }
                None => invalid(format!(
                    "Value provided in ExpressionAttributeNames unused in expressions: An expression attribute name used in the document path is not defined; attribute name: {p}"
                )),
            },
            t => invalid(format!("Invalid syntax: expected a path, found {t:?} in {}", self.text)),
        }
    }

    fn value(&mut self, v: &str) -> Result<Value, Invalid> {
        match self.names.values.get(v) {
            Some(x) => {
                self.names.used_values.insert(v.to_owned());
                Ok(x.clone())
            }
            None => invalid(format!(
                "An expression attribute value used in expression is not defined; attribute value: {v}"
            )),
        }
    }

    fn operand(&mut self) -> Result<Operand, Invalid> {
        match self.peek().cloned() {
            Some(Tok::Value(v)) => {
                self.at += 1;
                Ok(Operand::Value(self.value(&v)?))
            }
            Some(Tok::Name(n))
                if n == "size" && self.toks.get(self.at + 1) == Some(&Tok::Punct("(")) =>
            {
                self.at += 2;
                let p = self.path()?;
                self.expect(")")?;
                Ok(Operand::Size(p))
            }
            _ => Ok(Operand::Path(self.path()?)),
        }
    }

    fn or(&mut self) -> Result<Cond, Invalid> {
        let mut left = self.and()?;
        while self.keyword("OR") {
            self.at += 1;
            left = Cond::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Cond, Invalid> {
        let mut left = self.not()?;
        while self.keyword("AND") {
            self.at += 1;
            left = Cond::And(Box::new(left), Box::new(self.not()?));
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Cond, Invalid> {
        if self.keyword("NOT") {
            self.at += 1;
            return Ok(Cond::Not(Box::new(self.not()?)));
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<Cond, Invalid> {
        if self.punct("(") {
            self.at += 1;
            let c = self.or()?;
            self.expect(")")?;
            return Ok(c);
        }
        if let Some(Tok::Name(f)) = self.peek().cloned() {
            let is_call = self.toks.get(self.at + 1) == Some(&Tok::Punct("("));
            let known = [
                "attribute_exists",
                "attribute_not_exists",
                "attribute_type",
                "begins_with",
                "contains",
            ];
            if is_call && known.contains(&f.as_str()) {
                self.at += 2;
                let c = match f.as_str() {
                    "attribute_exists" => Cond::Exists(self.path()?),
                    "attribute_not_exists" => Cond::NotExists(self.path()?),
                    _ => {
                        let a = self.operand()?;
                        self.expect(",")?;
                        let b = self.operand()?;
                        match f.as_str() {
                            "attribute_type" => match a {
                                Operand::Path(p) => Cond::Type(p, Operand2(b)),
                                _ => return invalid("attribute_type needs a path"),
                            },
                            "begins_with" => Cond::BeginsWith(Operand2(a), Operand2(b)),
                            _ => Cond::Contains(Operand2(a), Operand2(b)),
                        }
                    }
                };
                self.expect(")")?;
                return Ok(c);
            }
        }
        let left = self.operand()?;
        if self.keyword("BETWEEN") {
            self.at += 1;
            let lo = self.operand()?;
            if !self.keyword("AND") {
                return invalid(format!(
                    "Invalid syntax: BETWEEN without AND in {}",
                    self.text
                ));
            }
            self.at += 1;
            let hi = self.operand()?;
            return Ok(Cond::Between(Operand2(left), Operand2(lo), Operand2(hi)));
        }
        if self.keyword("IN") {
            self.at += 1;
            self.expect("(")?;
            let mut list = vec![Operand2(self.operand()?)];
            while self.punct(",") {
                self.at += 1;
                list.push(Operand2(self.operand()?));
            }
            self.expect(")")?;
            return Ok(Cond::In(Operand2(left), list));
        }
        let op = match self.next() {
            Some(Tok::Punct(p)) if ["=", "<>", "<", "<=", ">", ">="].contains(&p) => p,
            t => {
                return invalid(format!(
                    "Invalid syntax: expected a comparison, found {t:?} in {}",
                    self.text
                ))
            }
        };
        let right = self.operand()?;
        Ok(Cond::Cmp(Operand2(left), op, Operand2(right)))
    }

    fn set_operand(&mut self) -> Result<SetOperand, Invalid> {
        match self.peek().cloned() {
            Some(Tok::Value(v)) => {
                self.at += 1;
                Ok(SetOperand::Value(self.value(&v)?))
            }
            Some(Tok::Name(f))
                if (f == "if_not_exists" || f == "list_append")
                    && self.toks.get(self.at + 1) == Some(&Tok::Punct("(")) =>
            {
                self.at += 2;
                let out = if f == "if_not_exists" {
                    let p = self.path()?;
                    self.expect(",")?;
                    SetOperand::IfNotExists(p, Box::new(self.set_operand()?))
                } else {
                    let a = self.set_operand()?;
                    self.expect(",")?;
                    SetOperand::ListAppend(Box::new(a), Box::new(self.set_operand()?))
                };
                self.expect(")")?;
                Ok(out)
            }
            _ => Ok(SetOperand::Path(self.path()?)),
        }
    }

    fn update(&mut self) -> Result<Update, Invalid> {
        let mut u = Update::default();
        let mut seen = BTreeSet::new();
        while self.peek().is_some() {
            let clause =
                match self.next() {
                    Some(Tok::Name(n)) => n.to_ascii_uppercase(),
                    t => return invalid(format!(
                        "Invalid syntax: expected SET, REMOVE, ADD or DELETE, found {t:?} in {}",
                        self.text
                    )),
                };
            if !seen.insert(clause.clone()) {
                return invalid(format!(
                    "Invalid UpdateExpression: The \"{clause}\" section can only be used once in an update expression;"
                ));
            }
            loop {
                let path = self.path()?;
                match clause.as_str() {
                    "SET" => {
                        self.expect("=")?;
                        let a = self.set_operand()?;
                        let v = if self.punct("+") {
                            self.at += 1;
                            SetValue::Plus(a, self.set_operand()?)
                        } else if self.punct("-") {
                            self.at += 1;
                            SetValue::Minus(a, self.set_operand()?)
                        } else {
                            SetValue::Plain(a)
                        };
                        u.set.push((path, v));
                    }
                    "REMOVE" => u.remove.push(path),
                    "ADD" | "DELETE" => {
                        let v = match self.next() {
                            Some(Tok::Value(v)) => self.value(&v)?,
                            t => {
                                return invalid(format!(
                                    "Invalid syntax: {clause} needs a value, found {t:?}"
                                ))
                            }
                        };
                        if clause == "ADD" {
                            u.add.push((path, v));
                        } else {
                            u.delete.push((path, v));
                        }
                    }
                    other => return invalid(format!("Invalid syntax: {other} in {}", self.text)),
                }
                if self.punct(",") {
                    self.at += 1;
                } else {
                    break;
                }
            }
        }
        let mut paths: Vec<&Path> = u.set.iter().map(|(p, _)| p).collect();
        paths.extend(u.remove.iter());
        paths.extend(u.add.iter().map(|(p, _)| p));
        paths.extend(u.delete.iter().map(|(p, _)| p));
        for (i, a) in paths.iter().enumerate() {
            for b in &paths[i + 1..] {
                let n = a.len().min(b.len());
                if a[..n] == b[..n] {
                    return invalid(format!(
                        "Invalid UpdateExpression: Two document paths overlap with each other; must remove or rewrite one of these paths; path one: [{}], path two: [{}]",
                        show(a),
                        show(b)
                    ));
                }
            }
        }
        Ok(u)
    }
}

fn show(p: &Path) -> String {
    p.iter()
        .map(|s| match s {
            Step::Key(k) => k.clone(),
            Step::Index(i) => format!("[{i}]"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses a condition (or key condition) expression.
pub fn condition(text: &str, names: &mut Names<'_>) -> Result<Cond, Invalid> {
    let mut p = Parser::new(text, names)?;
    let c = p.or()?;
    p.done()?;
    Ok(c)
}

/// Parses an update expression.
pub fn update(text: &str, names: &mut Names<'_>) -> Result<Update, Invalid> {
    let mut p = Parser::new(text, names)?;
    p.update()
}

/// Parses a projection expression (paths separated by commas).
pub fn projection(text: &str, names: &mut Names<'_>) -> Result<Vec<Path>, Invalid> {
    let mut p = Parser::new(text, names)?;
    let mut out = vec![p.path()?];
    while p.punct(",") {
        p.at += 1;
        out.push(p.path()?);
    }
    p.done()?;
    Ok(out)
}

/// The value at a path of an item.
pub fn get<'i>(item: &'i Item, path: &Path) -> Option<&'i Value> {
    let Step::Key(first) = &path[0] else {
        return None;
    };
    let mut v = item.get(first)?;
    for step in &path[1..] {
        v = match (step, v) {
            (Step::Key(k), Value::M(m)) => m.get(k)?,
            (Step::Index(i), Value::L(l)) => l.get(*i)?,
            _ => return None,
        };
    }
    Some(v)
}

fn operand_value<'i>(item: &'i Item, o: &'i Operand2) -> Option<std::borrow::Cow<'i, Value>> {
    use std::borrow::Cow;
    match &o.0 {
        Operand::Path(p) => get(item, p).map(Cow::Borrowed),
        Operand::Value(v) => Some(Cow::Borrowed(v)),
        Operand::Size(p) => {
            let n = match get(item, p)? {
                Value::S(s) | Value::B(s) => s.len(),
                Value::M(m) => m.len(),
                Value::L(l) => l.len(),
                Value::Ss(v) | Value::Ns(v) | Value::Bs(v) => v.len(),
                _ => return None,
            };
            Some(Cow::Owned(Value::N(n.to_string())))
        }
    }
}

/// Evaluates a condition on an item (an absent item is the empty one).
pub fn holds(c: &Cond, item: &Item) -> bool {
    match c {
        Cond::Or(a, b) => holds(a, item) || holds(b, item),
        Cond::And(a, b) => holds(a, item) && holds(b, item),
        Cond::Not(a) => !holds(a, item),
        Cond::Exists(p) => get(item, p).is_some(),
        Cond::NotExists(p) => get(item, p).is_none(),
        Cond::Type(p, t) => match (get(item, p), operand_value(item, t).as_deref()) {
            (Some(v), Some(Value::S(t))) => v.type_name() == t,
            _ => false,
        },
        Cond::Cmp(a, op, b) => {
            let (Some(x), Some(y)) = (operand_value(item, a), operand_value(item, b)) else {
                return *op == "<>";
            };
            match *op {
                "=" => x.same(&y),
                "<>" => !x.same(&y),
                _ => match x.compare(&y) {
                    Some(o) => match *op {
                        "<" => o.is_lt(),
                        "<=" => o.is_le(),
                        ">" => o.is_gt(),
                        _ => o.is_ge(),
                    },
                    None => false,
                },
            }
        }
        Cond::Between(a, lo, hi) => {
            match (
                operand_value(item, a),
                operand_value(item, lo),
                operand_value(item, hi),
            ) {
                (Some(x), Some(l), Some(h)) => {
                    x.compare(&l).is_some_and(|o| o.is_ge())
                        && x.compare(&h).is_some_and(|o| o.is_le())
                }
                _ => false,
            }
        }
        Cond::In(a, list) => match operand_value(item, a) {
            Some(x) => list
                .iter()
                .any(|o| operand_value(item, o).is_some_and(|y| x.same(&y))),
            None => false,
        },
        Cond::BeginsWith(a, b) => match (
            operand_value(item, a).as_deref(),
            operand_value(item, b).as_deref(),
        ) {
            (Some(Value::S(x)), Some(Value::S(y))) | (Some(Value::B(x)), Some(Value::B(y))) => {
                x.starts_with(y.as_str())
            }
            _ => false,
        },
        Cond::Contains(a, b) => match (
            operand_value(item, a).as_deref(),
            operand_value(item, b).as_deref(),
        ) {
            (Some(Value::S(x)), Some(Value::S(y))) => x.contains(y.as_str()),
            (Some(Value::Ss(x)), Some(Value::S(y))) => x.contains(y),
            (Some(Value::Ns(x)), Some(Value::N(y))) => x.iter().any(|n| number(n) == number(y)),
            (Some(Value::L(x)), Some(y)) => x.iter().any(|v| v.same(y)),
            _ => false,
        },
    }
}

fn eval_set(item: &Item, o: &SetOperand) -> Result<Value, Invalid> {
    match o {
        SetOperand::Value(v) => Ok(v.clone()),
        SetOperand::Path(p) => get(item, p).cloned().ok_or_else(|| {
            Invalid("The provided expression refers to an attribute that does not exist in the item".into())
        }),
        SetOperand::IfNotExists(p, d) => match get(item, p) {
            Some(v) => Ok(v.clone()),
            None => eval_set(item, d),
        },
        SetOperand::ListAppend(a, b) => match (eval_set(item, a)?, eval_set(item, b)?) {
            (Value::L(mut x), Value::L(y)) => {
                x.extend(y);
                Ok(Value::L(x))
            }
            _ => invalid("Invalid UpdateExpression: Incorrect operand type for operator or function; operator or function: list_append"),
        },
    }
}

fn arithmetic(a: Value, b: Value, minus: bool) -> Result<Value, Invalid> {
    let op = if minus { "-" } else { "+" };
    match (&a, &b) {
        (Value::N(x), Value::N(y)) => {
            let (x, y) = (number(x), number(y));
            let sum = match (x, y) {
                (Some(x), Some(y)) => x.plus(if minus { y.negated() } else { y }),
                _ => None,
            };
            sum.map(|n| Value::N(n.text()))
                .ok_or_else(|| Invalid("Number overflow. Attempting to store a number with magnitude larger than supported range".into()))
        }
        _ => invalid(format!(
            "Invalid UpdateExpression: Incorrect operand type for operator or function; operator: {op}, operand type: {}",
            if matches!(a, Value::N(_)) { b.type_name() } else { a.type_name() }
        )),
    }
}

fn put(item: &mut Item, path: &Path, v: Value) -> Result<(), Invalid> {
    let bad = || {
        Invalid("The document path provided in the update expression is invalid for update".into())
    };
    let Step::Key(first) = &path[0] else {
        return Err(bad());
    };
    if path.len() == 1 {
        item.insert(first.clone(), v);
        return Ok(());
    }
    let mut cur = item.get_mut(first).ok_or_else(bad)?;
    for (i, step) in path[1..].iter().enumerate() {
        let last = i + 2 == path.len();
        cur = match (step, cur) {
            (Step::Key(k), Value::M(m)) => {
                if last {
                    m.insert(k.clone(), v);
                    return Ok(());
                }
                m.get_mut(k).ok_or_else(bad)?
            }
            (Step::Index(n), Value::L(l)) => {
                if last {
                    if *n < l.len() {
                        l[*n] = v;
                    } else {
                        l.push(v);
                    }
                    return Ok(());
                }
                l.get_mut(*n).ok_or_else(bad)?
            }
            _ => return Err(bad()),
        };
    }
    Err(bad())
}

fn remove(item: &mut Item, path: &Path) {
    let Step::Key(first) = &path[0] else {
        return;
    };
    if path.len() == 1 {
        item.remove(first);
        return;
    }
    let Some(mut cur) = item.get_mut(first) else {
        return;
    };
    for (i, step) in path[1..].iter().enumerate() {
        let last = i + 2 == path.len();
        cur = match (step, cur) {
            (Step::Key(k), Value::M(m)) => {
                if last {
                    m.remove(k);
                    return;
                }
                match m.get_mut(k) {
                    Some(v) => v,
                    None => return,
                }
            }
            (Step::Index(n), Value::L(l)) => {
                if last {
                    if *n < l.len() {
                        l.remove(*n);
                    }
                    return;
                }
                match l.get_mut(*n) {
                    Some(v) => v,
                    None => return,
                }
            }
            _ => return,
        };
    }
}

/// Applies an update to a copy of the item (every right side is read from the item as it was,
/// as DynamoDB does), refusing what DynamoDB refuses.
pub fn apply(u: &Update, before: &Item) -> Result<Item, Invalid> {
    let mut after = before.clone();
    for (path, v) in &u.set {
        let value = match v {
            SetValue::Plain(o) => eval_set(before, o)?,
            SetValue::Plus(a, b) => arithmetic(eval_set(before, a)?, eval_set(before, b)?, false)?,
            SetValue::Minus(a, b) => arithmetic(eval_set(before, a)?, eval_set(before, b)?, true)?,
        };
        put(&mut after, path, value)?;
    }
    for path in &u.remove {
        remove(&mut after, path);
    }
    for (path, v) in &u.add {
        let next = match (get(before, path), v) {
            (None, v @ (Value::N(_) | Value::Ss(_) | Value::Ns(_) | Value::Bs(_))) => v.clone(),
            (Some(Value::N(_)), Value::N(_)) => arithmetic(get(before, path).cloned().expect("present"), v.clone(), false)?,
            (Some(Value::Ss(a)), Value::Ss(b)) => Value::Ss(union(a, b)),
            (Some(Value::Ns(a)), Value::Ns(b)) => Value::Ns(union(a, b)),
            (Some(Value::Bs(a)), Value::Bs(b)) => Value::Bs(union(a, b)),
            _ => return invalid("Invalid UpdateExpression: Incorrect operand type for operator or function; operator: ADD"),
        };
        put(&mut after, path, next)?;
    }
    for (path, v) in &u.delete {
        let left = match (get(before, path), v) {
            (None, _) => continue,
            (Some(Value::Ss(a)), Value::Ss(b)) => a.iter().filter(|x| !b.contains(x)).cloned().collect::<Vec<_>>(),
            (Some(Value::Ns(a)), Value::Ns(b)) => a.iter().filter(|x| !b.contains(x)).cloned().collect(),
            _ => return invalid("Invalid UpdateExpression: Incorrect operand type for operator or function; operator: DELETE"),
        };
        if left.is_empty() {
            remove(&mut after, path);
        } else {
            let kept = match v {
                Value::Ss(_) => Value::Ss(left),
                _ => Value::Ns(left),
            };
            put(&mut after, path, kept)?;
        }
    }
    Ok(after)
}

fn union(a: &[String], b: &[String]) -> Vec<String> {
    let mut out: Vec<String> = a.iter().chain(b).cloned().collect();
    out.sort();
    out.dedup();
    out
}

/// The attributes of an update's top-level paths (what it writes), to refuse a key's update.
pub fn top_level_written(u: &Update) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let paths = u
        .set
        .iter()
        .map(|(p, _)| p)
        .chain(u.remove.iter())
        .chain(u.add.iter().map(|(p, _)| p))
        .chain(u.delete.iter().map(|(p, _)| p));
    for p in paths {
        if let Step::Key(k) = &p[0] {
            out.insert(k.clone());
        }
    }
    out
}

/// The item cut to a projection's paths.
pub fn project(item: &Item, paths: &[Path]) -> Item {
    let mut out = Item::new();
    for p in paths {
        if let (Some(v), Step::Key(first)) = (get(item, p), &p[0]) {
            if p.len() == 1 {
                out.insert(first.clone(), v.clone());
            } else {
                // Nested projections keep the path's shape: maps of one key each.
                let mut nested = v.clone();
                for step in p[1..].iter().rev() {
                    nested = match step {
                        Step::Key(k) => Value::M([(k.clone(), nested)].into_iter().collect()),
                        Step::Index(_) => Value::L(vec![nested]),
                    };
                }
                out.insert(first.clone(), nested);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[(&str, &str)]) -> BTreeMap<String, String> {
        n.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    fn values(v: &[(&str, Value)]) -> BTreeMap<String, Value> {
        v.iter().map(|(a, b)| (a.to_string(), b.clone())).collect()
    }

    fn n(x: i64) -> Value {
        Value::N(x.to_string())
    }

    fn s(x: &str) -> Value {
        Value::S(x.to_owned())
    }

    #[test]
    fn the_claim_condition_admits_a_new_key_an_expired_lease_and_a_failure_past_not_before() {
        let nm = names(&[("#pk", "pk"), ("#s", "status")]);
        let vals = values(&[
            (":h", s("h1")),
            (":in_progress", s("IN_PROGRESS")),
            (":failed", s("FAILED")),
            (":now", n(1000)),
        ]);
        let mut used = Names::new(&nm, &vals);
        let c = condition(
            "attribute_not_exists(#pk) OR (payload_hash = :h AND \
             ((#s = :in_progress AND lease_expires_at < :now) OR \
              (#s = :failed AND (attribute_not_exists(not_before) OR not_before < :now))))",
            &mut used,
        )
        .unwrap();
        used.check_all_used().unwrap();
        let rec = |st: &str, lease: i64, nb: Option<i64>| {
            let mut i: Item = [
                ("pk".to_string(), s("k")),
                ("payload_hash".into(), s("h1")),
                ("status".into(), s(st)),
                ("lease_expires_at".into(), n(lease)),
            ]
            .into_iter()
            .collect();
            if let Some(nb) = nb {
                i.insert("not_before".into(), n(nb));
            }
            i
        };
        assert!(holds(&c, &Item::new()));
        assert!(holds(&c, &rec("IN_PROGRESS", 999, None)));
        assert!(!holds(&c, &rec("IN_PROGRESS", 1000, None)));
        assert!(holds(&c, &rec("FAILED", 5000, Some(999))));
        assert!(!holds(&c, &rec("FAILED", 5000, Some(2000))));
        assert!(!holds(&c, &rec("COMPLETED", 0, None)));
        let mut other = rec("IN_PROGRESS", 0, None);
        other.insert("payload_hash".into(), s("h2"));
        assert!(!holds(&c, &other));
    }

    #[test]
    fn an_update_reads_the_item_as_it_was_and_refuses_what_dynamodb_refuses() {
        let nm = names(&[("#rid", "re_1")]);
        let vals = values(&[
            (":amount", n(300)),
            (":zero", n(0)),
            (":note", Value::L(vec![s("x")])),
            (":empty", Value::L(vec![])),
        ]);
        let mut used = Names::new(&nm, &vals);
        let u = update(
            "SET refunds.#rid = :amount, refunded_amount = if_not_exists(refunded_amount, :zero) + :amount, \
             events = list_append(if_not_exists(events, :empty), :note)",
            &mut used,
        )
        .unwrap();
        used.check_all_used().unwrap();
        let before: Item = [("refunds".to_string(), Value::M(BTreeMap::new()))]
            .into_iter()
            .collect();
        let after = apply(&u, &before).unwrap();
        assert_eq!(
            get(
                &after,
                &vec![Step::Key("refunds".into()), Step::Key("re_1".into())]
            ),
            Some(&n(300))
        );
        assert_eq!(after["refunded_amount"], n(300));
        assert_eq!(after["events"], Value::L(vec![s("x")]));
        // A nested SET under a missing map is refused.
        assert!(apply(&u, &Item::new()).is_err());
        // Two overlapping paths, an unused value, a reserved word bare, arithmetic on a string.
        let mut used = Names::new(&nm, &vals);
        assert!(update("SET refunds.#rid = :amount REMOVE refunds", &mut used).is_err());
        let mut used = Names::new(&nm, &vals);
        update("SET a = :amount", &mut used).unwrap();
        assert!(used.check_all_used().is_err());
        let mut used = Names::new(&nm, &vals);
        assert!(condition("status = :amount", &mut used).is_err());
        let mut used = Names::new(&nm, &vals);
        let u = update("SET a = a - :amount", &mut used).unwrap();
        let strings: Item = [("a".to_string(), s("x"))].into_iter().collect();
        assert!(apply(&u, &strings).is_err());
    }

    #[test]
    fn comparisons_with_a_missing_attribute_are_false_except_not_equal() {
        let nm = BTreeMap::new();
        let vals = values(&[(":v", n(1)), (":a", s("A")), (":b", s("B"))]);
        let check = |text: &str, item: &Item| {
            let mut used = Names::new(&nm, &vals);
            holds(&condition(text, &mut used).unwrap(), item)
        };
        let empty = Item::new();
        assert!(!check("x = :v", &empty));
        assert!(!check("x < :v", &empty));
        assert!(check("x <> :v", &empty));
        let item: Item = [("x".to_string(), s("A")), ("y".into(), n(1))]
            .into_iter()
            .collect();
        assert!(check("x IN (:a, :b)", &item));
        assert!(!check("x < :v", &item));
        assert!(check("NOT x = :b AND size(x) = :v", &item));
        assert!(check("y BETWEEN :v AND :v", &item));
        assert!(check("begins_with(x, :a)", &item));
    }
}
