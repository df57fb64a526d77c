//! What the operator commands print, made safe for a terminal.
//!
//! Keys, values, tenants and names are written by clients (an editor's
//! session is a URL path segment of the example function), so a raw newline
//! in one forged a table row, and an escape sequence cleared the operator's
//! screen. In text, every character that a terminal acts on or does not
//! show is written as a visible escape instead: `\n`, `\r`, `\t`, `\xNN`
//! for the other C0 controls and DEL, `\u{NNNN}` for C1 controls, bidi
//! controls and invisible format characters; a backslash is `\\`, so the
//! escapes are unambiguous; a byte that is not UTF-8 is `\xNN` (0x80 and
//! up, so never mistaken for a control character). In JSON, the same
//! characters are written as `\uNNNN` escapes: the same JSON string, which
//! no terminal acts on.

use std::borrow::Cow;
use std::fmt::Write as _;

use base64::Engine as _;
use serde::Serialize as _;

/// Whether a terminal would act on `c` or not show it: the control
/// characters (C0, DEL, C1), the line and paragraph separators, the bidi
/// controls, and the invisible format characters and fillers.
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{ad}'
                | '\u{34f}'
                | '\u{600}'..='\u{605}'
                | '\u{61c}'
                | '\u{6dd}'
                | '\u{70f}'
                | '\u{890}'..='\u{891}'
                | '\u{8e2}'
                | '\u{115f}'..='\u{1160}'
                | '\u{17b4}'..='\u{17b5}'
                | '\u{180b}'..='\u{180f}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{3164}'
                | '\u{feff}'
                | '\u{ffa0}'
                | '\u{fff0}'..='\u{fffb}'
                | '\u{fffe}'..='\u{ffff}'
                | '\u{110bd}'
                | '\u{110cd}'
                | '\u{13430}'..='\u{1343f}'
                | '\u{1bca0}'..='\u{1bca3}'
                | '\u{1d173}'..='\u{1d17a}'
                | '\u{e0000}'..='\u{e0fff}'
        )
}

/// `s` for a table or a message: hidden characters escaped visibly.
pub fn text(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c == '\\' || is_hidden(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        push_char(&mut out, c);
    }
    Cow::Owned(out)
}

/// A stored value for a table: its text, escaped as [`text`] does, with
/// each byte that is not UTF-8 as `\xNN`.
pub fn bytes(value: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(value) {
        return text(s);
    }
    let mut out = String::with_capacity(value.len() + 16);
    for chunk in value.utf8_chunks() {
        for c in chunk.valid().chars() {
            push_char(&mut out, c);
        }
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02x}");
        }
    }
    Cow::Owned(out)
}

fn push_char(out: &mut String, c: char) {
    match c {
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if u32::from(c) < 0x20 || c == '\u{7f}' => {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        }
        c if is_hidden(c) => {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
        c => out.push(c),
    }
}

/// A stored value as a JSON field: `"value"` with its text when it is
/// UTF-8, else `"valueBase64"` with its bytes in standard base64 (RFC 4648,
/// padded), so that any value comes out exactly.
pub fn value_field(value: &[u8]) -> (&'static str, serde_json::Value) {
    match std::str::from_utf8(value) {
        Ok(s) => ("value", s.into()),
        Err(_) => (
            "valueBase64",
            base64::engine::general_purpose::STANDARD
                .encode(value)
                .into(),
        ),
    }
}

/// `value` as one line of JSON in which every hidden character is a
/// `\uNNNN` escape (serde_json writes DEL, C1 and bidi controls raw).
pub fn json_line(value: &serde_json::Value) -> String {
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, Escaping);
    // Writing to a Vec, a JSON value cannot fail to serialize.
    let _ = value.serialize(&mut serializer);
    String::from_utf8(out).unwrap_or_default()
}

/// serde_json's compact format, with hidden characters escaped.
struct Escaping;

impl serde_json::ser::Formatter for Escaping {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (at, c) in fragment.char_indices() {
            if is_hidden(c) {
                writer.write_all(fragment.get(start..at).unwrap_or("").as_bytes())?;
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(writer, "\\u{unit:04x}")?;
                }
                start = at + c.len_utf8();
            }
        }
        writer.write_all(fragment.get(start..).unwrap_or("").as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_characters_are_escaped_visibly_in_text() {
        assert_eq!(text("apple"), "apple");
        assert!(matches!(text("apple"), Cow::Borrowed(_)));
        assert_eq!(
            text("evil\nforged-row\x1b[2J\t\r\\"),
            "evil\\nforged-row\\x1b[2J\\t\\r\\\\"
        );
        assert_eq!(
            text("\u{202e}gnp.exe\u{9b}\u{7f}\u{200b}\u{2066}\u{e0041}é"),
            "\\u{202e}gnp.exe\\u{9b}\\x7f\\u{200b}\\u{2066}\\u{e0041}é"
        );
        assert_eq!(bytes(&[0xff, 0x00, b'a', 0x80]), "\\xff\\x00a\\x80");
        assert_eq!(bytes("ünï\n".as_bytes()), "ünï\\n");
    }

    #[test]
    fn json_keeps_the_value_and_escapes_what_a_terminal_acts_on() {
        let value = serde_json::json!({ "k\u{202e}": "a\u{7f}\u{9b}\n\u{1}\u{e0041}é" });
        let line = json_line(&value);
        assert!(!line.chars().any(is_hidden), "{line:?}");
        assert!(
            line.contains("\\u202e") && line.contains("\\udb40\\udc41"),
            "{line}"
        );
        assert!(line.contains('é'), "{line}");
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back, value);
    }

    #[test]
    fn a_value_that_is_not_utf8_is_base64() {
        assert_eq!(value_field(b"ok"), ("value", "ok".into()));
        assert_eq!(
            value_field(&[0xff, 0x00, b'a', 0x80]),
            ("valueBase64", "/wBhgA==".into())
        );
    }
}
