//! What shoppers type and paste into a payment's free text (its `description`, a `metadata`
//! value): any Unicode, line breaks, emoji, right-to-left text, long digit runs, and now and
//! then what no door may take: a character SQS refuses (U+FFFE, U+FFFF), a control character,
//! a card number pasted into a note. The simulator knows which it put in (it judges by its own
//! list, not by the processor's rules), so it can hold the doors to their answer.

use std::collections::{BTreeMap, BTreeSet};

use super::super::World;

/// The payments whose shoppers' text no door may take.
#[derive(Debug, Clone, Default)]
pub(in crate::world) struct Refused {
    /// By payment id, with why.
    pub(in crate::world) text: BTreeMap<String, &'static str>,
    /// Those of them the API answered 202 all the same.
    pub(in crate::world) accepted: BTreeSet<String>,
}

/// A piece of shopper text, and why a door must refuse it (`None`: it must be taken).
const PIECES: &[(&str, Option<&str>)] = &[
    ("Bestellung für Müller", None),
    ("注文番号 1234567890", None),
    ("🎁 gift for mum ❤️", None),
    ("line one\nline two", None),
    ("tab\tseparated", None),
    ("e\u{301}te\u{301} (combining accents)", None),
    ("مرحبا بالعالم", None),
    ("zero\u{200D}width joiner", None),
    ("order 4242 4242 4242 4241", None),
    ("ref 123-456-789-012-345-678-901", None),
    ("𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈", None),
    (
        "pasted \u{FFFF} from a spreadsheet",
        Some("U+FFFF, which SQS refuses"),
    ),
    ("odd \u{FFFE} byte order", Some("U+FFFE, which SQS refuses")),
    ("bell \u{7} in a note", Some("a control character")),
    (
        "my card 4242 4242 4242 4242 exp 12/30",
        Some("a card number"),
    ),
    ("4000-0566-5566-5556", Some("a card number")),
];

/// Shopper text of one to three pieces: the text, and why a door must refuse it, if it must.
pub(in crate::world) fn text(w: &World) -> (String, Option<&'static str>) {
    let pieces = 1 + (w.draw() * 3.0) as usize;
    let mut out = Vec::with_capacity(pieces);
    let mut refused = None;
    for _ in 0..pieces {
        // The refused pieces are the last five: drawn one time in five.
        let last_good = PIECES.len() - 5;
        let i = if w.draw() < 0.2 {
            last_good + (w.draw() * 5.0) as usize
        } else {
            (w.draw() * last_good as f64) as usize
        };
        let (piece, why) = PIECES[i.min(PIECES.len() - 1)];
        out.push(piece);
        refused = refused.or(why);
    }
    (out.join(" · "), refused)
}

/// A message body as a producer's JSON library writes it for SQS: U+FFFE and U+FFFF (which a
/// JSON text may hold raw and SQS refuses) written as JSON escapes, the same JSON.
pub(in crate::world) fn sqs_json(value: &serde_json::Value) -> String {
    value
        .to_string()
        .replace('\u{FFFE}', "\\ufffe")
        .replace('\u{FFFF}', "\\uffff")
}
