//! The template's `Conditions`, evaluated for the parameters given, so that a local stack has
//! the shape a deployment with the same parameters would (`ProviderEventsDelivery`: the
//! webhook's function and route, or the EventBridge bus, rule and DLQ).

use std::collections::HashMap;

use anyhow::{anyhow, bail, Result};
use serde_yaml_ng::{Mapping, Value};

use super::resolve::{get, intrinsic};

/// Evaluates the template's conditions on demand, each once.
pub(super) struct Conditions<'a> {
    doc: &'a Value,
    parameters: &'a HashMap<String, String>,
    known: HashMap<String, bool>,
}

impl<'a> Conditions<'a> {
    pub(super) fn new(doc: &'a Value, parameters: &'a HashMap<String, String>) -> Self {
        Self {
            doc,
            parameters,
            known: HashMap::new(),
        }
    }

    /// Every condition of the template and whether it holds.
    pub(super) fn all(&mut self) -> Result<HashMap<String, bool>> {
        let names: Vec<String> = self
            .doc
            .get("Conditions")
            .and_then(Value::as_mapping)
            .map(|m| {
                m.keys()
                    .filter_map(|k| k.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        names
            .into_iter()
            .map(|n| Ok((n.clone(), self.holds(&n)?)))
            .collect()
    }

    /// Whether the condition `name` holds.
    pub(super) fn holds(&mut self, name: &str) -> Result<bool> {
        if let Some(v) = self.known.get(name) {
            return Ok(*v);
        }
        let expr = get(self.doc, "Conditions")
            .and_then(|c| get(c, name))
            .ok_or_else(|| anyhow!("the template has no condition {name}"))?;
        let v = self.truth(expr)?;
        self.known.insert(name.to_owned(), v);
        Ok(v)
    }

    fn truth(&mut self, expr: &Value) -> Result<bool> {
        if let Some(name) = get(expr, "Condition").and_then(|n| n.as_str()) {
            return self.holds(name);
        }
        let (f, arg) =
            intrinsic(expr).ok_or_else(|| anyhow!("a condition is not a function: {expr:?}"))?;
        let args = || arg.as_sequence().cloned().unwrap_or_default();
        Ok(match f.as_str() {
            "Fn::Equals" => {
                let a = args();
                if a.len() != 2 {
                    bail!("Fn::Equals needs two values");
                }
                self.value(&a[0])? == self.value(&a[1])?
            }
            "Fn::Not" => {
                !self.truth(args().first().ok_or_else(|| anyhow!("Fn::Not needs one"))?)?
            }
            "Fn::And" => {
                let mut all = true;
                for a in args() {
                    all &= self.truth(&a)?;
                }
                all
            }
            "Fn::Or" => {
                let mut any = false;
                for a in args() {
                    any |= self.truth(&a)?;
                }
                any
            }
            "Fn::Condition" | "Condition" => {
                let name = arg
                    .as_str()
                    .ok_or_else(|| anyhow!("Condition needs a name"))?;
                self.holds(name)?
            }
            other => bail!("{other} in a condition is not supported locally"),
        })
    }

    fn value(&mut self, v: &Value) -> Result<String> {
        if let Some((f, arg)) = intrinsic(v) {
            if f == "Ref" {
                let name = arg.as_str().ok_or_else(|| anyhow!("Ref needs a name"))?;
                return self.parameters.get(name).cloned().ok_or_else(|| {
                    anyhow!("the condition needs the parameter {name}, which has no value")
                });
            }
            if f == "Fn::Join" {
                // Of a list, or of a CommaDelimitedList parameter (its value as given: "a,b").
                let a = arg.as_sequence().cloned().unwrap_or_default();
                let (Some(sep), Some(items)) = (a.first().and_then(|s| s.as_str()), a.get(1))
                else {
                    bail!("Fn::Join needs a separator and a list");
                };
                let parts: Vec<String> = match items.as_sequence() {
                    Some(list) => list.iter().map(|x| self.value(x)).collect::<Result<_>>()?,
                    None => self.value(items)?.split(',').map(str::to_owned).collect(),
                };
                return Ok(parts.join(sep));
            }
            bail!("{f} in a condition's value is not supported locally");
        }
        Ok(match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => bail!("a condition compares {v:?}"),
        })
    }

    /// The resources this shape has: those without a `Condition`, or whose condition holds.
    pub(super) fn resources(&mut self, resources: &Mapping) -> Result<Mapping> {
        let mut kept = Mapping::new();
        for (k, v) in resources {
            if let Some(c) = get(v, "Condition").and_then(|c| c.as_str()) {
                if !self.holds(c)? {
                    continue;
                }
            }
            kept.insert(k.clone(), v.clone());
        }
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_is_kept_when_its_condition_holds() {
        let doc: Value = serde_yaml_ng::from_str(
            "Conditions:\n  IsB: !Equals [!Ref Mode, b]\n  NotB: !Not [!Condition IsB]\n  Either: !Or [!Condition IsB, !Condition NotB]\nResources:\n  OnlyB: {Type: X, Condition: IsB}\n  NotB: {Type: X, Condition: NotB}\n  Always: {Type: Y}\n",
        )
        .unwrap();
        let resources = get(&doc, "Resources").unwrap().as_mapping().unwrap();
        let names = |mode: &str| {
            let params = HashMap::from([("Mode".to_owned(), mode.to_owned())]);
            let mut c = Conditions::new(&doc, &params);
            assert!(c.holds("Either").unwrap());
            c.resources(resources)
                .unwrap()
                .keys()
                .map(|k| k.as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(names("b"), ["OnlyB", "Always"]);
        assert_eq!(names("a"), ["NotB", "Always"]);
        let none = HashMap::new();
        assert!(Conditions::new(&doc, &none).holds("IsB").is_err());
        // A CommaDelimitedList joined: empty or not.
        let listed: Value = serde_yaml_ng::from_str(
            "Conditions:\n  Has: !Not [!Equals [!Join ['', !Ref Roles], '']]\n",
        )
        .unwrap();
        let has = |roles: &str| {
            let params = HashMap::from([("Roles".to_owned(), roles.to_owned())]);
            Conditions::new(&listed, &params).holds("Has").unwrap()
        };
        assert!(!has(""));
        assert!(has("arn:aws:iam::1:role/a,arn:aws:iam::1:role/b"));
        assert!(Conditions::new(&doc, &none).holds("Missing").is_err());
    }
}
