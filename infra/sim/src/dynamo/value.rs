//! DynamoDB's attribute values as its JSON protocol writes them (`{"S": ".."}`, `{"N": ".."}`,
//! `{"M": {..}}`, ...), ordered (a `BTreeMap`) so that every answer is the same bytes each run.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde_json::{json, Map, Value as Json};

/// One attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string.
    S(String),
    /// A number, kept as DynamoDB's decimal text.
    N(String),
    /// Binary, base64 as the wire carries it.
    B(String),
    /// A boolean.
    Bool(bool),
    /// `NULL`.
    Null,
    /// A map.
    M(BTreeMap<String, Value>),
    /// A list.
    L(Vec<Value>),
    /// A string set.
    Ss(Vec<String>),
    /// A number set.
    Ns(Vec<String>),
    /// A binary set.
    Bs(Vec<String>),
}

/// An item: attribute name to value.
pub type Item = BTreeMap<String, Value>;

/// A value the wire sent that is not an attribute value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadValue(pub String);

impl Value {
    /// Reads one wire value (`{"S": "x"}`).
    pub fn from_json(v: &Json) -> Result<Value, BadValue> {
        let obj = v
            .as_object()
            .filter(|o| o.len() == 1)
            .ok_or_else(|| BadValue(format!("not an attribute value: {v}")))?;
        let (tag, inner) = obj.iter().next().expect("one entry");
        let text = |x: &Json| {
            x.as_str()
                .map(str::to_owned)
                .ok_or_else(|| BadValue(format!("{tag} needs a string: {x}")))
        };
        let texts = |x: &Json| -> Result<Vec<String>, BadValue> {
            let list = x
                .as_array()
                .ok_or_else(|| BadValue(format!("{tag} needs a list")))?;
            let mut out = list.iter().map(text).collect::<Result<Vec<_>, _>>()?;
            if out.is_empty() {
                return Err(BadValue(format!("an empty set ({tag}) is not allowed")));
            }
            out.sort();
            out.dedup();
            Ok(out)
        };
        Ok(match tag.as_str() {
            "S" => Value::S(text(inner)?),
            "N" => {
                let n = text(inner)?;
                number(&n).ok_or_else(|| BadValue(format!("not a number: {n}")))?;
                Value::N(n)
            }
            "B" => Value::B(text(inner)?),
            "BOOL" => Value::Bool(
                inner
                    .as_bool()
                    .ok_or_else(|| BadValue("BOOL needs a boolean".into()))?,
            ),
            "NULL" => Value::Null,
            "M" => Value::M(item_from_json(inner)?),
            "L" => Value::L(
                inner
                    .as_array()
                    .ok_or_else(|| BadValue("L needs a list".into()))?
                    .iter()
                    .map(Value::from_json)
                    .collect::<Result<_, _>>()?,
            ),
            "SS" => Value::Ss(texts(inner)?),
            "NS" => Value::Ns(texts(inner)?),
            "BS" => Value::Bs(texts(inner)?),
            other => return Err(BadValue(format!("unknown attribute type {other}"))),
        })
    }

    /// The wire form.
    pub fn to_json(&self) -> Json {
        match self {
            Value::S(s) => json!({ "S": s }),
            Value::N(n) => json!({ "N": n }),
            Value::B(b) => json!({ "B": b }),
            Value::Bool(b) => json!({ "BOOL": b }),
            Value::Null => json!({ "NULL": true }),
            Value::M(m) => json!({ "M": item_to_json(m) }),
            Value::L(l) => json!({ "L": l.iter().map(Value::to_json).collect::<Vec<_>>() }),
            Value::Ss(v) => json!({ "SS": v }),
            Value::Ns(v) => json!({ "NS": v }),
            Value::Bs(v) => json!({ "BS": v }),
        }
    }

    /// The type's name as `attribute_type` and error messages spell it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::S(_) => "S",
            Value::N(_) => "N",
            Value::B(_) => "B",
            Value::Bool(_) => "BOOL",
            Value::Null => "NULL",
            Value::M(_) => "M",
            Value::L(_) => "L",
            Value::Ss(_) => "SS",
            Value::Ns(_) => "NS",
            Value::Bs(_) => "BS",
        }
    }

    /// DynamoDB's size of the value in bytes (its item-size rule: names and values as UTF-8,
    /// numbers about one byte per two digits, one byte per container element).
    pub fn size(&self) -> usize {
        match self {
            Value::S(s) | Value::B(s) => s.len(),
            Value::N(n) => n.len().div_ceil(2) + 1,
            Value::Bool(_) | Value::Null => 1,
            Value::M(m) => 3 + m.iter().map(|(k, v)| k.len() + v.size() + 1).sum::<usize>(),
            Value::L(l) => 3 + l.iter().map(|v| v.size() + 1).sum::<usize>(),
            Value::Ss(v) | Value::Bs(v) => v.iter().map(String::len).sum(),
            Value::Ns(v) => v.iter().map(|n| n.len().div_ceil(2) + 1).sum(),
        }
    }

    /// DynamoDB's ordering of two values of one comparable type (numbers by value, strings and
    /// binaries by their bytes); `None` for other pairs (a comparison of them is false).
    pub fn compare(&self, other: &Value) -> Option<Ordering> {
        match (self, other) {
            (Value::N(a), Value::N(b)) => number(a)?.partial_cmp(&number(b)?),
            (Value::S(a), Value::S(b)) | (Value::B(a), Value::B(b)) => {
                Some(a.as_bytes().cmp(b.as_bytes()))
            }
            _ => None,
        }
    }

    /// Equality as conditions test it: numbers by value, sets as sets, the rest structurally.
    pub fn same(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::N(a), Value::N(b)) => number(a).is_some() && number(a) == number(b),
            (Value::M(a), Value::M(b)) => {
                a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| v.same(w)))
            }
            (Value::L(a), Value::L(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same(y))
            }
            _ => self == other,
        }
    }
}

/// A DynamoDB number as an exact decimal: (mantissa, exponent of ten), normalised, so that
/// "10", "10.0" and "1e1" are one value. Up to 38 significant digits, as DynamoDB keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Number {
    /// The digits, signed, without trailing zeros.
    mantissa: i128,
    /// The power of ten they are multiplied by.
    exponent: i32,
}

impl PartialOrd for Number {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        let e = self.exponent.min(other.exponent);
        let scale = |n: &Number| -> Option<i128> {
            let up = u32::try_from(n.exponent - e).ok()?;
            n.mantissa.checked_mul(10i128.checked_pow(up)?)
        };
        match (scale(self), scale(other)) {
            (Some(a), Some(b)) => Some(a.cmp(&b)),
            _ => self.as_f64().partial_cmp(&other.as_f64()),
        }
    }
}

impl Number {
    fn normal(mut mantissa: i128, mut exponent: i32) -> Number {
        if mantissa == 0 {
            return Number {
                mantissa: 0,
                exponent: 0,
            };
        }
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exponent += 1;
        }
        Number { mantissa, exponent }
    }

    fn as_f64(&self) -> f64 {
        self.mantissa as f64 * 10f64.powi(self.exponent)
    }

    /// The sum, or `None` past 38 digits.
    pub fn plus(self, other: Number) -> Option<Number> {
        let e = self.exponent.min(other.exponent);
        let a = self
            .mantissa
            .checked_mul(10i128.checked_pow(u32::try_from(self.exponent - e).ok()?)?)?;
        let b = other
            .mantissa
            .checked_mul(10i128.checked_pow(u32::try_from(other.exponent - e).ok()?)?)?;
        Some(Number::normal(a.checked_add(b)?, e))
    }

    /// The negation.
    pub fn negated(self) -> Number {
        Number {
            mantissa: -self.mantissa,
            exponent: self.exponent,
        }
    }

    /// DynamoDB's text of the number (no exponent, no trailing zeros).
    pub fn text(&self) -> String {
        let digits = self.mantissa.unsigned_abs().to_string();
        let sign = if self.mantissa < 0 { "-" } else { "" };
        if self.exponent >= 0 {
            format!("{sign}{digits}{}", "0".repeat(self.exponent as usize))
        } else {
            let point = digits.len() as i64 + self.exponent as i64;
            if point > 0 {
                let (i, f) = digits.split_at(point as usize);
                format!("{sign}{i}.{f}")
            } else {
                format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
            }
        }
    }
}

/// Parses DynamoDB's number text (`-12`, `3.50`, `1e3`).
pub fn number(text: &str) -> Option<Number> {
    // Most numbers are plain integers: no allocation for them.
    if let Ok(m) = text.parse::<i64>() {
        return Some(Number::normal(m as i128, 0));
    }
    let t = text.trim();
    let (body, exp) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], t[i + 1..].parse::<i32>().ok()?),
        None => (t, 0),
    };
    let (neg, body) = match body.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, body.strip_prefix('+').unwrap_or(body)),
    };
    let (int, frac) = match body.split_once('.') {
        Some((i, f)) => (i, f),
        None => (body, ""),
    };
    if int.is_empty() && frac.is_empty()
        || !(int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()))
    {
        return None;
    }
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 38 {
        return None;
    }
    let m: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    Some(Number::normal(
        if neg { -m } else { m },
        exp - frac.len() as i32,
    ))
}

/// Reads a wire item (`{"pk": {"S": ..}, ..}`).
pub fn item_from_json(v: &Json) -> Result<Item, BadValue> {
    v.as_object()
        .ok_or_else(|| BadValue(format!("not an item: {v}")))?
        .iter()
        .map(|(k, v)| Ok((k.clone(), Value::from_json(v)?)))
        .collect()
}

/// The wire form of an item.
pub fn item_to_json(item: &Item) -> Json {
    Json::Object(
        item.iter()
            .map(|(k, v)| (k.clone(), v.to_json()))
            .collect::<Map<_, _>>(),
    )
}

/// The item's size as DynamoDB counts it against its 400 KB limit.
pub fn item_size(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + v.size()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_equal_by_value_and_added_exactly() {
        assert_eq!(number("10"), number("10.0"));
        assert_eq!(number("1e1"), number("10"));
        assert!(number("9").unwrap() < number("10").unwrap());
        assert!(number("-1.5").unwrap() < number("-1").unwrap());
        let sum = number("0.1").unwrap().plus(number("0.2").unwrap()).unwrap();
        assert_eq!(sum.text(), "0.3");
        assert_eq!(number("1700000000123").unwrap().text(), "1700000000123");
        assert_eq!(number("-0.05").unwrap().text(), "-0.05");
        assert!(number("1x").is_none());
        assert!(number("").is_none());
    }

    #[test]
    fn a_wire_item_reads_back_to_the_same_json() {
        let wire = serde_json::json!({
            "pk": {"S": "p1"}, "n": {"N": "5"}, "m": {"M": {"a": {"BOOL": true}, "z": {"NULL": true}}},
            "l": {"L": [{"S": "x"}]}, "ss": {"SS": ["b", "a"]}
        });
        let item = item_from_json(&wire).unwrap();
        let back = item_to_json(&item);
        assert_eq!(back["ss"], serde_json::json!({"SS": ["a", "b"]}));
        assert_eq!(back["m"], wire["m"]);
        assert!(Value::from_json(&serde_json::json!({"SS": []})).is_err());
        assert!(Value::from_json(&serde_json::json!({"N": "abc"})).is_err());
    }
}
