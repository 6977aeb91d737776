//! The expression grammar (DynamoDB's, as its developer guide gives it), by recursive descent.

use std::collections::BTreeSet;

use super::ast::{
    invalid, Cond, Invalid, Names, Operand, Operand2, Path, SetOperand, SetValue, Step, Update,
};
use super::lex::{tokens, Tok};
use crate::dynamo::reserved::RESERVED;
use crate::dynamo::value::Value;

pub(super) struct Parser<'n, 'a> {
    toks: Vec<Tok>,
    at: usize,
    names: &'n mut Names<'a>,
    text: String,
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
            let clause = match self.next() {
                Some(Tok::Name(n)) => n.to_ascii_uppercase(),
                t => {
                    return invalid(format!(
                        "Invalid syntax: expected SET, REMOVE, ADD or DELETE, found {t:?} in {}",
                        self.text
                    ))
                }
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
        overlap(&u)?;
        Ok(u)
    }
}

/// DynamoDB refuses an update two of whose paths overlap.
pub(super) fn overlap(u: &Update) -> Result<(), Invalid> {
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
    Ok(())
}

pub(super) fn show(p: &Path) -> String {
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
