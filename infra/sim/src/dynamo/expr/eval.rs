//! Conditions evaluated on an item, updates applied to it, projections cut from it.

use std::collections::BTreeSet;

use super::ast::{
    invalid, Cond, Invalid, Operand, Operand2, Path, SetOperand, SetValue, Step, Update,
};
use crate::dynamo::value::{number, Item, Value};

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

pub(super) fn operand_value<'i>(
    item: &'i Item,
    o: &'i Operand2,
) -> Option<std::borrow::Cow<'i, Value>> {
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

pub(super) fn eval_set(item: &Item, o: &SetOperand) -> Result<Value, Invalid> {
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

pub(super) fn arithmetic(a: Value, b: Value, minus: bool) -> Result<Value, Invalid> {
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

pub(super) fn put(item: &mut Item, path: &Path, v: Value) -> Result<(), Invalid> {
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

pub(super) fn remove(item: &mut Item, path: &Path) {
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

pub(super) fn union(a: &[String], b: &[String]) -> Vec<String> {
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
