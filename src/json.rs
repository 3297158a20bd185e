//! A strict JSON scanner that validates like a parser but builds nothing: it only reports where
//! values begin and end, so an object can be passed through as bytes while a handful of its
//! fields are read.
//!
//! Strings, most of a Kubernetes object's bytes, are skipped eight bytes at a time. A whole
//! validating pass costs about what serde_json's `RawValue` pass does (most of it is per-token
//! branching); the gain is `delimit`, which finds the end of a value that will be dropped
//! without validating it. UTF-8 is the caller's guarantee: the input is a
//! `&str`.

use std::borrow::Cow;
use std::ops::Range;

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid JSON at byte {at}: {what}")]
pub struct ScanError {
    pub at: usize,
    pub what: &'static str,
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The position of the first byte at or after `from` that ends a run of plain string content:
/// a quote, a backslash or a control character (or `b.len()`). Eight bytes are tested at a time;
/// the tests can flag bytes above a true hit (borrows), never below, so the lowest flag is exact.
fn special_byte(b: &[u8], mut from: usize) -> usize {
    let lt = |v: u64, n: u8| v.wrapping_sub(ONES * n as u64) & !v & HIGHS;
    while let Some(chunk) = b.get(from..from + 8) {
        let v = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let hits = lt(v ^ (ONES * b'"' as u64), 1) | lt(v ^ (ONES * b'\\' as u64), 1) | lt(v, 0x20);
        if hits != 0 {
            return from + (hits.trailing_zeros() / 8) as usize;
        }
        from += 8;
    }
    while from < b.len() && !matches!(b[from], b'"' | b'\\' | 0..=0x1f) {
        from += 1;
    }
    from
}

/// Nesting deeper than this is refused rather than recursed into (the limit serde_json uses).
const MAX_DEPTH: usize = 128;

/// A string token: the bytes between its quotes and whether they contain escapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Str {
    pub inner: Range<usize>,
    pub escaped: bool,
}

pub struct Scanner<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Scanner<'a> {
    pub fn new(src: &'a str) -> Self {
        Self { src, pos: 0 }
    }

    pub fn src(&self) -> &'a str {
        self.src
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    fn bytes(&self) -> &'a [u8] {
        self.src.as_bytes()
    }

    fn err<T>(&self, what: &'static str) -> Result<T, ScanError> {
        Err(ScanError { at: self.pos, what })
    }

    fn peek(&self) -> Option<u8> {
        self.bytes().get(self.pos).copied()
    }

    pub fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// Consumes `c` after optional whitespace.
    pub fn expect(&mut self, c: u8, what: &'static str) -> Result<(), ScanError> {
        self.ws();
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            self.err(what)
        }
    }

    /// After an object's `{` (or a member's value): true when another member follows, false
    /// at the closing `}`. `first` is true right after the `{`.
    pub fn next_member(&mut self, first: bool) -> Result<bool, ScanError> {
        self.ws();
        match self.peek() {
            Some(b'}') => {
                self.pos += 1;
                Ok(false)
            }
            Some(b',') if !first => {
                self.pos += 1;
                Ok(true)
            }
            _ if first => Ok(true),
            _ => self.err("expected , or }"),
        }
    }

    /// A member's key and the colon after it.
    pub fn key(&mut self) -> Result<Str, ScanError> {
        self.ws();
        let k = self.string()?;
        self.expect(b':', "expected :")?;
        Ok(k)
    }

    /// Skips one value after optional whitespace, validating it; returns its span.
    pub fn value(&mut self) -> Result<Range<usize>, ScanError> {
        self.ws();
        let start = self.pos;
        self.skip(0)?;
        Ok(start..self.pos)
    }

    /// Skips one value after optional whitespace, checking only what finding its end needs:
    /// strings (fully) and the nesting of brackets. For values that are dropped, never
    /// published, where full validation would cost the most (managedFields is mostly tiny
    /// tokens) and buy nothing.
    pub fn delimit(&mut self) -> Result<Range<usize>, ScanError> {
        self.ws();
        let start = self.pos;
        if !matches!(self.peek(), Some(b'{' | b'[')) {
            return self.value();
        }
        let b = self.bytes();
        // One bit per open bracket, set for `[`; MAX_DEPTH fits.
        let mut stack: u128 = 0;
        let mut depth = 0usize;
        loop {
            match b.get(self.pos) {
                None => return self.err("unexpected end"),
                Some(b'"') => {
                    self.string()?;
                    continue;
                }
                Some(&c @ (b'{' | b'[')) => {
                    if depth >= MAX_DEPTH {
                        return self.err("nested too deeply");
                    }
                    stack = (stack << 1) | u128::from(c == b'[');
                    depth += 1;
                }
                Some(&c @ (b'}' | b']')) => {
                    if depth == 0 || (stack & 1 == 1) != (c == b']') {
                        return self.err("mismatched bracket");
                    }
                    stack >>= 1;
                    depth -= 1;
                    if depth == 0 {
                        self.pos += 1;
                        return Ok(start..self.pos);
                    }
                }
                Some(_) => {}
            }
            self.pos += 1;
        }
    }

    /// Requires that only whitespace remains.
    pub fn end(&mut self) -> Result<(), ScanError> {
        self.ws();
        if self.pos == self.src.len() {
            Ok(())
        } else {
            self.err("trailing characters")
        }
    }

    fn skip(&mut self, depth: usize) -> Result<(), ScanError> {
        match self.peek() {
            Some(b'{') => {
                if depth >= MAX_DEPTH {
                    return self.err("nested too deeply");
                }
                self.pos += 1;
                let mut first = true;
                while self.next_member(first)? {
                    first = false;
                    self.key()?;
                    self.ws();
                    self.skip(depth + 1)?;
                }
                Ok(())
            }
            Some(b'[') => {
                if depth >= MAX_DEPTH {
                    return self.err("nested too deeply");
                }
                self.pos += 1;
                self.ws();
                if self.peek() == Some(b']') {
                    self.pos += 1;
                    return Ok(());
                }
                loop {
                    self.ws();
                    self.skip(depth + 1)?;
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.pos += 1,
                        Some(b']') => {
                            self.pos += 1;
                            return Ok(());
                        }
                        _ => return self.err("expected , or ]"),
                    }
                }
            }
            Some(b'"') => self.string().map(drop),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(_) => self.err("expected a value"),
            None => self.err("unexpected end"),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), ScanError> {
        if self.bytes()[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            self.err("invalid literal")
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Result<(), ScanError> {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return self.err("invalid number"),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return self.err("invalid number");
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return self.err("invalid number");
            }
        }
        Ok(())
    }

    /// A string starting at its opening quote.
    pub fn string(&mut self) -> Result<Str, ScanError> {
        if self.peek() != Some(b'"') {
            return self.err("expected a string");
        }
        self.pos += 1;
        let start = self.pos;
        let mut escaped = false;
        let b = self.bytes();
        loop {
            self.pos = special_byte(b, self.pos);
            match b.get(self.pos) {
                None => return self.err("unterminated string"),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(Str {
                        inner: start..self.pos - 1,
                        escaped,
                    });
                }
                Some(b'\\') => {}
                Some(_) => return self.err("control character in string"),
            }
            escaped = true;
            self.pos += 1;
            match self.peek() {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.pos += 1,
                Some(b'u') => {
                    let hex = b.get(self.pos + 1..self.pos + 5);
                    if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                        return self.err("invalid unicode escape");
                    }
                    self.pos += 5;
                }
                _ => return self.err("invalid escape"),
            }
        }
    }

    /// The text of a string token of this scanner's source.
    pub fn text(&self, s: &Str) -> Cow<'a, str> {
        s.text(self.src)
    }
}

impl Str {
    /// The text of this token in `src`, unescaped only when it has escapes.
    pub fn text<'a>(&self, src: &'a str) -> Cow<'a, str> {
        let raw = &src[self.inner.clone()];
        if !self.escaped {
            return raw.into();
        }
        serde_json::from_str::<String>(self.quoted(src))
            .map(Into::into)
            // The scanner accepted it, so only a lone surrogate escape can get here.
            .unwrap_or_else(|_| raw.into())
    }

    /// The token as it stands in `src`, quotes and escapes included.
    pub fn quoted<'a>(&self, src: &'a str) -> &'a str {
        &src[self.inner.start - 1..self.inner.end + 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(s: &str) -> bool {
        let mut sc = Scanner::new(s);
        sc.value().is_ok() && sc.end().is_ok()
    }

    #[test]
    fn agrees_with_serde_json() {
        let cases = [
            r#"{}"#,
            r#"[]"#,
            r#"{"a":1,"b":[true,false,null],"c":{"d":"e"}}"#,
            r#" { "a" : [ 1 , 2 ] } "#,
            r#"{"s":"quote \" slash \\ \/ \b\f\n\r\t \u00e9 é"}"#,
            r#"[-0, 0.5, -1.25e+10, 3E-2, 10]"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":.5}"#,
            r#"{"a":1e}"#,
            r#"{"a":-}"#,
            r#"{"a":tru}"#,
            r#"{"a":"\x"}"#,
            r#"{"a":"\u12g4"}"#,
            "{\"a\":\"tab\tinside\"}",
            r#"{"a":"unterminated}"#,
            r#"[1,2"#,
            r#"[1 2]"#,
            r#"{"a":1}}"#,
            r#"{1:2}"#,
            r#"{"type":"MODIFIED","object":{oops this is not json"#,
            r#""#,
            r#"nul"#,
        ];
        for c in cases {
            let serde = serde_json::from_str::<serde::de::IgnoredAny>(c).is_ok();
            assert_eq!(valid(c), serde, "{c:?}");
        }
    }

    #[test]
    fn special_bytes_are_found_at_every_offset() {
        let naive = |b: &[u8], from: usize| {
            (from..b.len())
                .find(|&i| matches!(b[i], b'"' | b'\\' | 0..=0x1f))
                .unwrap_or(b.len())
        };
        // Non-ASCII bytes and bytes just above the thresholds must not be flagged.
        let filler = "aé€ !#[]~\u{7f}";
        for special in ["\"", "\\", "\n", "\u{1}", "\u{1f}"] {
            for at in 0..24 {
                let text: String =
                    filler.chars().cycle().take(at).collect::<String>() + special + "x\"";
                let b = text.as_bytes();
                for from in 0..b.len() {
                    assert_eq!(
                        special_byte(b, from),
                        naive(b, from),
                        "{text:?} from {from}"
                    );
                }
            }
        }
        assert_eq!(special_byte(b"plain", 0), 5);
    }

    #[test]
    fn delimiting_finds_the_same_end_and_catches_truncation() {
        let src = r#"[{"f:a":{},"k:{\"x\":1}":{".":{}}},["]",{"}":[]}]] , 1"#;
        let mut v = Scanner::new(src);
        let mut d = Scanner::new(src);
        assert_eq!(v.value().unwrap(), d.delimit().unwrap());
        for bad in [
            r#"{"a":[1,2}"#,
            r#"{"a":{"b":1}"#,
            r#"[1,"unterminated]"#,
            "}",
        ] {
            assert!(Scanner::new(bad).delimit().is_err(), "{bad:?}");
        }
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(Scanner::new(&deep).delimit().is_err());
    }

    #[test]
    fn refuses_deep_nesting_instead_of_overflowing() {
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert!(!valid(&deep));
        let ok = "[".repeat(100) + &"]".repeat(100);
        assert!(valid(&ok));
    }

    #[test]
    fn reports_spans_and_unescapes_only_when_needed() {
        let src = r#"{"name":"web-1","note":"a\"b"}"#;
        let mut sc = Scanner::new(src);
        sc.expect(b'{', "object").unwrap();
        assert!(sc.next_member(true).unwrap());
        let k = sc.key().unwrap();
        assert_eq!(sc.text(&k), "name");
        sc.ws();
        let v = sc.string().unwrap();
        assert!(!v.escaped);
        assert_eq!(sc.text(&v), "web-1");
        assert!(sc.next_member(false).unwrap());
        sc.key().unwrap();
        let span = sc.value().unwrap();
        assert_eq!(&src[span], r#""a\"b""#);
        assert!(!sc.next_member(false).unwrap());
        sc.end().unwrap();
        let mut sc = Scanner::new(r#""a\"b""#);
        let s = sc.string().unwrap();
        assert!(s.escaped);
        assert_eq!(sc.text(&s), "a\"b");
    }
}
