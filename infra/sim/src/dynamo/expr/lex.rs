//! An expression's tokens.

use super::ast::{invalid, Invalid};

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Name(String),
    Placeholder(String),
    Value(String),
    Int(usize),
    Punct(&'static str),
}

pub(super) fn tokens(text: &str) -> Result<Vec<Tok>, Invalid> {
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
