//! The template's intrinsic functions (`Ref`, `Fn::GetAtt`, `Fn::Sub`, `Fn::If`, ..., short
//! and long form), resolved against what exists so far.

use std::collections::HashMap;

use anyhow::{anyhow, bail, Context, Result};
use serde_yaml_ng::{Mapping, Value};

pub(super) fn tag_name(tag: &serde_yaml_ng::value::Tag) -> String {
    tag.to_string().trim_start_matches('!').to_owned()
}

/// The function a `!Ref F` or `!Ref F.Alias` names (SAM's AutoPublishAlias of F), by its
/// logical id: an event-source mapping's `FunctionName`, an integration's `IntegrationUri`.
pub(super) fn referenced_function(v: Option<&Value>) -> Option<String> {
    v.and_then(intrinsic)
        .filter(|(f, _)| f == "Ref")
        .and_then(|(_, arg)| {
            arg.as_str()
                .map(|f| f.trim_end_matches(".Alias").to_owned())
        })
}

/// Splits an intrinsic function (short tag or long `Fn::X` / `Ref` map) into name and argument.
pub(super) fn intrinsic(v: &Value) -> Option<(String, &Value)> {
    match v {
        Value::Tagged(t) => {
            let name = tag_name(&t.tag);
            let name = if name == "Ref" {
                name
            } else {
                format!("Fn::{name}")
            };
            Some((name, &t.value))
        }
        Value::Mapping(m) if m.len() == 1 => {
            let (k, arg) = m.iter().next()?;
            let k = k.as_str()?;
            (k == "Ref" || k.starts_with("Fn::")).then(|| (k.to_owned(), arg))
        }
        _ => None,
    }
}

/// Resolves template values against what exists so far.
pub(super) struct Resolver<'a> {
    pub(super) stack_name: &'a str,
    pub(super) region: String,
    /// The caller's account, read from the first queue's ARN (the endpoint's own).
    pub(super) account: Option<String>,
    pub(super) parameters: HashMap<String, String>,
    pub(super) refs: HashMap<String, String>,
    pub(super) attrs: HashMap<String, String>,
    /// The template's conditions, evaluated on its parameters (for `Fn::If`).
    pub(super) conditions: HashMap<String, bool>,
}

impl Resolver<'_> {
    pub(super) fn resolve(&self, v: &Value) -> Result<Option<String>> {
        if let Some((f, arg)) = intrinsic(v) {
            return match f.as_str() {
                "Ref" => {
                    let name = arg.as_str().ok_or_else(|| anyhow!("Ref needs a name"))?;
                    Ok(self.lookup(name))
                }
                "Fn::GetAtt" => {
                    let path = match arg {
                        Value::String(s) => s.clone(),
                        Value::Sequence(parts) => parts
                            .iter()
                            .filter_map(|p| p.as_str())
                            .collect::<Vec<_>>()
                            .join("."),
                        _ => bail!("Fn::GetAtt needs Resource.Attribute"),
                    };
                    Ok(self.attrs.get(&path).cloned())
                }
                "Fn::Sub" => {
                    let template = match arg {
                        Value::String(s) => s.clone(),
                        Value::Sequence(p) => p
                            .first()
                            .and_then(|s| s.as_str())
                            .map(str::to_owned)
                            .ok_or_else(|| anyhow!("Fn::Sub needs a string"))?,
                        _ => bail!("Fn::Sub needs a string"),
                    };
                    self.substitute(&template)
                }
                "Fn::If" => {
                    let parts = arg
                        .as_sequence()
                        .filter(|p| p.len() == 3)
                        .ok_or_else(|| anyhow!("Fn::If needs [condition, then, else]"))?;
                    let name = parts[0]
                        .as_str()
                        .ok_or_else(|| anyhow!("Fn::If needs a condition's name"))?;
                    let holds = *self
                        .conditions
                        .get(name)
                        .ok_or_else(|| anyhow!("Fn::If names no condition {name}"))?;
                    let chosen = &parts[if holds { 1 } else { 2 }];
                    if intrinsic(chosen)
                        .is_some_and(|(f, a)| f == "Ref" && a.as_str() == Some("AWS::NoValue"))
                    {
                        return Ok(None);
                    }
                    self.resolve(chosen)
                }
                other => bail!("intrinsic function {other} is not supported locally"),
            };
        }
        Ok(match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        })
    }

    pub(super) fn lookup(&self, name: &str) -> Option<String> {
        match name {
            "AWS::StackName" => Some(self.stack_name.to_owned()),
            "AWS::Region" => Some(self.region.clone()),
            "AWS::AccountId" => self.account.clone(),
            "AWS::Partition" => Some("aws".to_owned()),
            "AWS::URLSuffix" => Some("amazonaws.com".to_owned()),
            _ => self
                .parameters
                .get(name)
                .or_else(|| self.refs.get(name))
                .cloned(),
        }
    }

    pub(super) fn substitute(&self, template: &str) -> Result<Option<String>> {
        let mut out = String::new();
        let mut rest = template;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let end = rest[start..]
                .find('}')
                .ok_or_else(|| anyhow!("unclosed ${{ in Fn::Sub"))?;
            let name = &rest[start + 2..start + end];
            let value = if name.contains('.') && !name.starts_with("AWS::") {
                self.attrs.get(name).cloned()
            } else {
                self.lookup(name)
            };
            match value {
                Some(v) => out.push_str(&v),
                None => return Ok(None),
            }
            rest = &rest[start + end + 1..];
        }
        out.push_str(rest);
        Ok(Some(out))
    }

    /// A property's value as a string (`None` when it is absent or does not resolve here).
    pub(super) fn string(&self, v: Option<&Value>) -> Result<Option<String>> {
        Ok(v.map(|v| self.resolve(v)).transpose()?.flatten())
    }

    pub(super) fn int(&self, v: Option<&Value>) -> Result<Option<i64>> {
        match v {
            None => Ok(None),
            Some(v) => match self.resolve(v)? {
                Some(s) => Ok(Some(
                    s.parse()
                        .with_context(|| format!("expected a number, got {s}"))?,
                )),
                None => Ok(None),
            },
        }
    }
}

/// The template's resources of one `Type`, with their logical ids.
pub(super) fn of_type<'m>(resources: &'m Mapping, kind: &str) -> Vec<(&'m str, &'m Value)> {
    resources
        .iter()
        .filter(|(_, v)| get(v, "Type").and_then(|t| t.as_str()) == Some(kind))
        .filter_map(|(k, v)| Some((k.as_str()?, v)))
        .collect()
}

pub(super) fn get<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    v.as_mapping().and_then(|m| m.get(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fn_if_takes_the_branch_its_condition_chooses_and_no_value_is_nothing() {
        let r = Resolver {
            stack_name: "s",
            region: "us-east-1".into(),
            account: None,
            parameters: [(
                "Url".to_owned(),
                "https://pay.example/v1/provider-events".to_owned(),
            )]
            .into(),
            refs: HashMap::new(),
            attrs: HashMap::new(),
            conditions: [("HasUrl".to_owned(), true), ("Never".to_owned(), false)].into(),
        };
        let v = |text: &str| serde_yaml_ng::from_str::<Value>(text).unwrap();
        assert_eq!(
            r.resolve(&v("!If [HasUrl, !Ref Url, other]"))
                .unwrap()
                .as_deref(),
            Some("https://pay.example/v1/provider-events")
        );
        assert_eq!(
            r.resolve(&v("!If [Never, !Ref Url, other]"))
                .unwrap()
                .as_deref(),
            Some("other")
        );
        assert_eq!(
            r.resolve(&v("!If [Never, x, !Ref AWS::NoValue]")).unwrap(),
            None
        );
        assert!(r.resolve(&v("!If [Unknown, x, y]")).is_err());
    }
}
