//! The template reader's own cases.

use super::number_in;
use std::collections::HashMap;

#[test]
fn a_limit_is_a_number_or_a_parameters_value_and_nothing_else() {
    let settings: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        "{Literal: 100, Given: !Ref Rate, Missing: !Ref Nowhere, Text: fast}",
    )
    .unwrap();
    let parameters = HashMap::from([("Rate".to_owned(), "1000".to_owned())]);
    let read = |k: &str| number_in(Some(&settings), k, &parameters);
    assert_eq!(read("Literal").unwrap(), Some(100.0));
    assert_eq!(read("Given").unwrap(), Some(1000.0));
    assert_eq!(read("Absent").unwrap(), None);
    // Where CloudFormation would refuse the template, so does the model: no silent "no limit".
    assert!(read("Missing").is_err());
    assert!(read("Text").is_err());
}
