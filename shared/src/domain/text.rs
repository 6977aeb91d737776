//! One rule for the text of a payment or a refund, at every door (the payments API, a raw queue
//! message, `payctl send`): what SQS, DynamoDB and Stripe all take, and no card number.
//!
//! - SQS takes only XML's characters (`#x9 | #xA | #xD | #x20-#xD7FF | #xE000-#xFFFD |
//!   #x10000-#x10FFFF`): a JSON text may hold U+FFFE and U+FFFF raw, and a payment holding one
//!   would be answered `202` and then never relayed. They are refused here.
//! - Control characters (C0, DEL, C1) are refused, but for the tab and the line breaks of free
//!   text (a description, a metadata value), which Stripe's dashboard shows as such.
//! - A provider id (`customer_id`, `payment_method`) is printable ASCII without spaces, as every
//!   Stripe id is.
//! - A card number (12 to 19 digits passing the Luhn check, spaces or dashes between them) in
//!   any field is refused: it would be kept in the row for its 43 days, in the backups, in the
//!   queue and in a dead letter, and sent to Stripe in the clear.
//!
//! Lengths are counted in Unicode characters, as Stripe counts them (its limits are stated in
//! characters; a code point is one). A message never holds the value it refuses: a refused
//! value may be the card number it must not keep. A field's name is shown only when it is
//! one a person chose for a field ([`shown_name`]).

/// The known bugs the simulator can put back (`sqs_once::mutation`), to show it finds them.
pub const MUTATIONS: &[(&str, &str)] = &[(
    "intake_takes_any_text",
    "the doors check text for its length only (main before issue 63): a payment holding U+FFFF is answered 202 and its row reaches the relay",
)];

/// What kind of text a field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A provider's id: printable ASCII, no spaces.
    Id,
    /// One line: no control character at all (a metadata key).
    Line,
    /// Free text: tabs and line breaks allowed (a description, a metadata value).
    Free,
}

/// Whether SQS takes `c` in a message body (XML 1.0's `Char`).
pub fn sqs_takes(c: char) -> bool {
    matches!(c as u32, 0x9 | 0xA | 0xD | 0x20..=0xD7FF | 0xE000..=0xFFFD | 0x10000..=0x10FFFF)
}

/// Checks `value` of the field `what` (as a person reads it: `description`, `a metadata
/// value`) against the rule of its kind: the reason, never holding the value, or `Ok`.
pub fn check(what: &str, value: &str, kind: Kind) -> Result<(), String> {
    if sqs_once::mutation::on("intake_takes_any_text") {
        return Ok(());
    }
    for c in value.chars() {
        let allowed = match kind {
            Kind::Id => c.is_ascii_graphic(),
            Kind::Line => sqs_takes(c) && !c.is_control(),
            Kind::Free => sqs_takes(c) && (!c.is_control() || matches!(c, '\t' | '\n' | '\r')),
        };
        if !allowed {
            return Err(match kind {
                Kind::Id => format!("{what} must be printable ASCII without spaces, as the provider's ids are; it holds U+{:04X}", c as u32),
                Kind::Line if c.is_control() => format!(
                    "{what} holds the control character U+{:04X}",
                    c as u32
                ),
                Kind::Free if c.is_control() => format!(
                    "{what} holds the control character U+{:04X} (only tabs and line breaks are taken)",
                    c as u32
                ),
                _ => format!(
                    "{what} holds U+{:04X}, a character the queue cannot carry (SQS takes XML's characters only)",
                    c as u32
                ),
            });
        }
    }
    let card = match kind {
        Kind::Id => id_holds_card_number(value),
        Kind::Line | Kind::Free => holds_card_number(value),
    };
    if card {
        return Err(format!(
            "{what} holds a card number: send a payment method id, never card data, in any field"
        ));
    }
    Ok(())
}

/// Whether `text` holds a card number anywhere in it (a run of 12 to 19 digits, spaces or
/// dashes between them, passing the Luhn check).
pub fn holds_card_number(text: &str) -> bool {
    mask_card_numbers(text).is_some()
}

/// A field's name as a reason may show it: itself when it is a name a person chose (1 to 40 of
/// `A-Z a-z 0-9 _ -`, beginning with a letter, and no card number), else `None`. An unknown
/// field's name or a metadata key is the sender's text: it may be anything, a card number too.
pub fn shown_name(name: &str) -> Option<&str> {
    let mut chars = name.chars();
    let named = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.len() <= 40
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        && !holds_card_number(name);
    named.then_some(name)
}

/// Where the longest run of digits, spaces and dashes from `i` (a digit) that ends on a digit
/// ends: the text a card number may be in.
fn run_end(chars: &[char], i: usize) -> usize {
    let mut end = i;
    for (j, c) in chars.iter().enumerate().skip(i) {
        if c.is_ascii_digit() {
            end = j + 1;
        } else if !matches!(c, ' ' | '-') {
            break;
        }
    }
    end
}

/// Masks every card number in `text`: each run of 12 to 19 digits (spaces and dashes between
/// them allowed) that passes the Luhn check keeps its first six and last four digits, and the
/// digits between become `*` (separators stay). `None` when there is none. Dead letters of
/// rejected bodies go through this, so no primary account number is kept at rest.
pub fn mask_card_numbers(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut masked = false;
    let mut i = 0;
    while i < chars.len() {
        if !chars[i].is_ascii_digit() {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let end = run_end(&chars, i);
        let run: String = chars[i..end].iter().collect();
        match card_within(&run, false) {
            Some((from, to)) => {
                // The card's digits: its first six and last four kept.
                let card: String = run[from..to].chars().collect();
                let digits = card.chars().filter(char::is_ascii_digit).count();
                out.push_str(&run[..from]);
                let mut seen = 0;
                for c in card.chars() {
                    if c.is_ascii_digit() {
                        seen += 1;
                        out.push(if seen <= 6 || seen > digits - 4 {
                            c
                        } else {
                            '*'
                        });
                    } else {
                        out.push(c);
                    }
                }
                // What follows the card in the run (an expiry date, another number) is read
                // again from there.
                let rest: String = run[to..].to_owned();
                match mask_card_numbers(&rest) {
                    Some(m) => out.push_str(&m),
                    None => out.push_str(&rest),
                }
                masked = true;
            }
            None => out.push_str(&run),
        }
        i = end;
    }
    masked.then_some(out)
}

/// Where a card number is in a run of digits, spaces and dashes (byte offsets): the whole run,
/// or the longest span of whole groups in it that is one (a card followed by its expiry date
/// or its code, `4242 4242 4242 4242 12 30`, or after another number, `qty 2 4242...`).
/// `as_written`: only digits grouped as cards are written ([`card_grouping`]), the rule for
/// ids, whose digits are grouped otherwise (`env-89116809-000002`).
fn card_within(run: &str, as_written: bool) -> Option<(usize, usize)> {
    // Dashes are an id's separators as much as a card's: digits joined by a dash must be
    // grouped as a card is written; joined by spaces (a shopper's paste) any grouping is one.
    let card = |v: &str| {
        looks_like_card_number(v) && (!(as_written || v.contains('-')) || card_grouping(v))
    };
    if card(run) {
        return Some((0, run.len()));
    }
    // The groups of digits, by byte offsets (the run is ASCII).
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let bytes = run.as_bytes();
    let mut k = 0;
    while k < bytes.len() {
        if bytes[k].is_ascii_digit() {
            let from = k;
            while k < bytes.len() && bytes[k].is_ascii_digit() {
                k += 1;
            }
            groups.push((from, k));
        } else {
            k += 1;
        }
    }
    // A card with a short number or two beside it (an expiry, a code, a quantity): the
    // longest span of whole groups, of 13 to 19 digits, that leaves at most two groups of at
    // most four digits on either side. (Twelve-digit spans are left alone: a longer number
    // that is no card, `4242 4242 4242 4241`, often has one that passes Luhn.)
    let short = |gs: &[(usize, usize)]| gs.len() <= 2 && gs.iter().all(|(f, t)| t - f <= 4);
    let mut best: Option<(usize, usize, usize)> = None;
    for first in 0..groups.len() {
        if !short(&groups[..first]) {
            break;
        }
        for last in (first..groups.len()).rev() {
            if !short(&groups[last + 1..]) {
                break;
            }
            let digits: usize = groups[first..=last].iter().map(|(f, t)| t - f).sum();
            let (from, to) = (groups[first].0, groups[last].1);
            if (13..=19).contains(&digits)
                && best.is_none_or(|(_, _, d)| digits > d)
                && card(&run[from..to])
            {
                best = Some((from, to, digits));
            }
        }
    }
    best.map(|(from, to, _)| (from, to))
}

/// Whether an id holds a card number as cards are written (see [`card_grouping`]).
pub fn id_holds_card_number(id: &str) -> bool {
    let chars: Vec<char> = id.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if !chars[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let end = run_end(&chars, i);
        let run: String = chars[i..end].iter().collect();
        if card_within(&run, true).is_some() {
            return true;
        }
        i = end;
    }
    false
}

/// True when the value is 12 to 19 digits (spaces and dashes allowed) that pass the Luhn check:
/// such a value is a primary account number and must never reach the provider or a log.
pub fn looks_like_card_number(value: &str) -> bool {
    looks_like_card_number_digits(value)
}

/// Whether the digits could be a payment card's: any but those that begin with 0, with 2
/// outside 2200-2204 (Mir) and 2221-2720 (Mastercard), or with 1 in fewer than 15 digits
/// (UATP's airline cards are 15). Ids and notes built from a timestamp
/// (`order-1796624069-003`, a millisecond time: 13 digits beginning with 1, one in ten passing
/// Luhn) are not taken for a card; every card network's numbers are (Visa, Mastercard,
/// Maestro, American Express, Diners, JCB, Discover, UnionPay, RuPay, Troy, Mir and the rest).
fn card_network_prefix(digits: &[u32]) -> bool {
    let four = digits.iter().take(4).fold(0, |n, d| n * 10 + d);
    match digits.first() {
        Some(0) | None => false,
        Some(1) => digits.len() >= 15,
        Some(2) => (2200..=2204).contains(&four) || (2221..=2720).contains(&four),
        Some(_) => true,
    }
}

/// Whether the digits are grouped as a card is written: in one run, in groups of four (the
/// last of one to four: `4242 4242 4242 4242`, `6011-0009-9013-9424-123`), or as American
/// Express and Diners print theirs (4-6-5, 4-6-4). The rule for ids, whose digits grouped
/// otherwise are the id's own (`env-89116809-000002`), and for digits joined by dashes
/// anywhere (an id quoted in a description); digits joined by spaces in free text keep the
/// wider rule (a shopper may paste `4242 424242424242`).
fn card_grouping(value: &str) -> bool {
    let groups: Vec<usize> = value
        .split([' ', '-'])
        .filter(|g| !g.is_empty())
        .map(str::len)
        .collect();
    match groups.as_slice() {
        [_] => true,
        [4, 6, 5] | [4, 6, 4] => true,
        [init @ .., last] => init.iter().all(|g| *g == 4) && (1..=4).contains(last),
        [] => false,
    }
}

fn looks_like_card_number_digits(value: &str) -> bool {
    if !value
        .chars()
        .all(|c| c.is_ascii_digit() || c == ' ' || c == '-')
    {
        return false;
    }
    let digits: Vec<u32> = value.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(12..=19).contains(&digits.len()) || !card_network_prefix(&digits) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 {
                    x - 9
                } else {
                    x
                }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_numbers_are_masked_to_their_first_six_and_last_four_digits() {
        let body = r#"{"payment_method":"4242 4242 4242 4242","description":"also 4000056655665556, order 1234567890123"}"#;
        let masked = mask_card_numbers(body).expect("two card numbers");
        assert_eq!(
            masked,
            r#"{"payment_method":"4242 42** **** 4242","description":"also 400005******5556, order 1234567890123"}"#
        );
        assert!(!masked.contains("4242 4242 4242 4242"));
        assert_eq!(mask_card_numbers(r#"{"amount":1999,"id":"pay_1"}"#), None);
        assert_eq!(mask_card_numbers("4242424242424241"), None, "fails Luhn");
    }

    #[test]
    fn digits_that_fail_luhn_are_not_card_numbers() {
        assert!(looks_like_card_number("4242424242424242"));
        assert!(!looks_like_card_number("4242424242424241"));
        assert!(!looks_like_card_number("123456789012"));
        assert!(!looks_like_card_number("pm_card_visa"));
    }

    #[test]
    fn digits_grouped_as_no_card_is_written_are_an_id_not_a_card() {
        // Found by operator_safety's generated ids: a name of eight digits and a sequence,
        // `89116809-000002`, joined into fourteen digits that passed Luhn.
        let luhn_ok = |d: &str| looks_like_card_number(d);
        let mut found = None;
        for n in 0..100_000u32 {
            let id = format!("5{:07}-{:06}", n, n % 97);
            if luhn_ok(&id.replace('-', "")) {
                found = Some(id);
                break;
            }
        }
        let id = found.expect("an id whose digits pass Luhn");
        assert!(!id_holds_card_number(&format!("env-{id}")), "{id}");
        // Nor in a description quoting it (payctl send's generated payments: "Order for ...").
        assert!(!holds_card_number(&format!("Order for env-{id}")), "{id}");
        assert!(check("description", &format!("Order for env-{id}"), Kind::Free).is_ok());
        assert!(check("payment_id", &format!("env-{id}"), Kind::Id).is_ok());
        // In free text the wider rule holds: pasted any way, a card is one.
        for pasted in [
            "4242 424242424242",
            "42424242 42424242",
            "378282 246310005",
            "4242 4242 4242 4242 12/30",
            "4242424242424242 12/30",
            "5555 5555 5555 4444 09/27",
            "4242 4242 4242 4242 123",
            "3782 822463 10005 12/30",
            "qty 2 4242424242424242",
        ] {
            assert!(holds_card_number(pasted), "{pasted}");
            assert!(
                check("description", pasted, Kind::Free).is_err(),
                "{pasted}"
            );
            let masked = mask_card_numbers(pasted).unwrap();
            assert!(
                !masked.contains("4242 4242 4242 4242") && !masked.contains("424242424242"),
                "{masked}"
            );
        }
        // As cards are written, they are cards, in ids too.
        for card in [
            "4242 4242 4242 4242",
            "4242-4242-4242-4242",
            "4242424242424242",
            "3782 822463 10005",
            "3056 930902 5904",
            "6011 0009 9013 9424",
        ] {
            assert!(holds_card_number(card), "{card}");
            assert!(id_holds_card_number(card), "{card}");
        }
    }

    #[test]
    fn what_sqs_refuses_is_refused_and_what_shoppers_type_is_taken() {
        for good in [
            "Bestellung für Müller",
            "注文番号 1234567890",
            "🎁 gift ❤️",
            "line one\nline two\r\n\ttabbed",
            "e\u{301}te\u{301}",
            "مرحبا",
            "zero\u{200D}width",
            "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u{10FFFD}",
            "order 4242 4242 4242 4241",
        ] {
            assert_eq!(check("description", good, Kind::Free), Ok(()), "{good:?}");
        }
        for (bad, says) in [
            (
                "pasted \u{FFFF}",
                "U+FFFF, a character the queue cannot carry",
            ),
            ("odd \u{FFFE}", "U+FFFE"),
            ("bell \u{7}", "control character U+0007"),
            ("nul \u{0}", "U+0000"),
            ("c1 \u{85}", "U+0085"),
            ("del \u{7F}", "U+007F"),
        ] {
            let e = check("description", bad, Kind::Free).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(e.starts_with("description "), "{e}");
        }
        assert!(check("a metadata key", "two\nlines", Kind::Line).is_err());
        assert!(check("a metadata key", "Order note", Kind::Line).is_ok());
        assert!(check("customer_id", "cus_42", Kind::Id).is_ok());
        assert!(check("customer_id", "cus 42", Kind::Id).is_err());
        assert!(check("customer_id", "cüs_42", Kind::Id).is_err());
    }

    #[test]
    fn a_card_number_anywhere_is_refused_and_never_shown() {
        for text in [
            "4242424242424242",
            "my card 4242 4242 4242 4242 exp 12/30",
            "4000-0566-5566-5556",
            // Twelve digits (a Maestro number's length) pass Luhn here.
            "card 501800000009",
        ] {
            let e = check("a metadata value", text, Kind::Free).unwrap_err();
            assert!(e.contains("card number"), "{text}: {e}");
            assert!(
                !e.contains("4242") && !e.contains("5556") && !e.contains("0009"),
                "{e}"
            );
        }
        assert!(check("customer_id", "4242424242424242", Kind::Id).is_err());
        assert!(
            check("description", "ref 123456789012", Kind::Free).is_ok(),
            "fails Luhn"
        );
        // Luhn-valid, but no card network's: ids made of a timestamp (seen in make e2e-sam).
        for id in [
            "e2e-1796624069-003",
            "order-1796624069011",
            "2026120700000005",
        ] {
            assert!(check("payment_id", id, Kind::Id).is_ok(), "{id}");
        }
        assert!(check("payment_id", "pay-501800000009", Kind::Id).is_err());
        // Every network's numbers, and a card followed by its expiry date in one run.
        for card in [
            "9792 0200 0000 0001",
            "1000 0000 0000 009",
            "4242 4242 4242 4242 12 30",
            "card 4242-4242-4242-4242-1230 ok",
        ] {
            assert!(holds_card_number(card), "{card}");
        }
        assert_eq!(
            mask_card_numbers("card 4242 4242 4242 4242 12 30 thanks").as_deref(),
            Some("card 4242 42** **** 4242 12 30 thanks")
        );
    }

    #[test]
    fn only_names_a_person_chose_are_shown() {
        assert_eq!(shown_name("ammount"), Some("ammount"));
        assert_eq!(shown_name("order_id"), Some("order_id"));
        assert_eq!(shown_name("4242424242424242"), None);
        assert_eq!(shown_name("x4242424242424242"), None);
        assert_eq!(shown_name("note with spaces"), None);
        assert_eq!(shown_name(&"k".repeat(41)), None);
        assert_eq!(shown_name(""), None);
    }
}
