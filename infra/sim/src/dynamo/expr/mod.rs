//! DynamoDB's expression language, parsed and evaluated as DynamoDB does: condition and key
//! condition expressions (`AND`/`OR`/`NOT`, comparisons, `BETWEEN`, `IN`, `attribute_exists`,
//! `attribute_not_exists`, `attribute_type`, `begins_with`, `contains`, `size`), update
//! expressions (`SET` with `+`/`-`, `if_not_exists`, `list_append`; `REMOVE`; `ADD`; `DELETE`)
//! and projections. The processors' condition and update expressions are the protocol, so this
//! is where the simulator must be exact; what DynamoDB refuses (an unknown placeholder, a value
//! given and not used, two paths of one update overlapping, arithmetic on a non-number, a
//! nested `SET` under a missing map) is refused here with DynamoDB's `ValidationException`.

mod ast;
mod cache;
mod eval;
mod lex;
mod parse;

pub use ast::{Cond, Invalid, Names, Path, Step, Update};
pub use cache::{condition, projection, update};
pub use eval::{apply, get, holds, project, top_level_written};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dynamo::value::{Item, Value};
    use std::collections::BTreeMap;

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
    fn an_expression_parsed_once_binds_each_request_s_own_names_and_values() {
        let text = "SET refunds.#rid = :amount, #a = :note";
        let item: Item = [("refunds".to_string(), Value::M(BTreeMap::new()))]
            .into_iter()
            .collect();
        for (rid, amount) in [("re_1", 300), ("re_2", 500)] {
            let nm = names(&[("#rid", rid), ("#a", "note")]);
            let vals = values(&[(":amount", n(amount)), (":note", s(rid))]);
            let mut used = Names::new(&nm, &vals);
            let after = apply(&update(text, &mut used).unwrap(), &item).unwrap();
            used.check_all_used().unwrap();
            assert_eq!(
                get(
                    &after,
                    &vec![Step::Key("refunds".into()), Step::Key(rid.into())]
                ),
                Some(&n(amount))
            );
            assert_eq!(after["note"], s(rid));
        }
        // Overlapping once the names are bound: refused as DynamoDB refuses it.
        let nm = names(&[("#rid", "x"), ("#a", "refunds")]);
        let vals = values(&[(":amount", n(1)), (":note", s("y"))]);
        let e = update(text, &mut Names::new(&nm, &vals)).unwrap_err();
        assert!(e.0.contains("overlap"), "{e:?}");
        // A value not defined by this request is refused, though an earlier one defined it.
        let nm = names(&[("#rid", "x"), ("#a", "note")]);
        let vals = values(&[(":amount", n(1))]);
        let e = update(text, &mut Names::new(&nm, &vals)).unwrap_err();
        assert!(e.0.contains(":note"), "{e:?}");
        // A condition's values are the request's.
        let c = |v: i64| {
            let vals = values(&[(":v", n(v))]);
            let nm = BTreeMap::new();
            holds(
                &condition("x = :v", &mut Names::new(&nm, &vals)).unwrap(),
                &[("x".to_string(), n(2))].into_iter().collect(),
            )
        };
        assert!(c(2));
        assert!(!c(3));
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
