//! A strict JSON scanner that validates like a parser but builds nothing: it only reports where
//! values begin and end, so an object can be passed through as bytes while a handful of its
//! fields are read.
//!
//! It works in two stages, the way simdjson does. Stage one ([`index`]) finds every token of
//! the line many bytes at a time and checks its strings; stage two, the [`Scanner`], parses the
//! tokens, never the bytes between them: the grammar, every number and literal, nesting. So a
//! line is checked in full as serde_json would check it, except in what [`Scanner::delimit`]
//! skips (a value that is dropped, never published): there only the strings and the nesting of
//! brackets are checked, not the grammar between them nor its numbers and literals. UTF-8 is the
//! caller's guarantee: the input is a `&str`.

mod index;

pub use index::ScanError;

use std::borrow::Cow;
use std::ops::Range;

/// Nesting deeper than this is refused: the API server's own JSON decoder refuses it too (Go's
/// encoding/json, 10,000 levels), so no object the server stores is lost to it. No depth
/// recurses past [`RECURSE`] levels.
const MAX_DEPTH: usize = 10_000;

/// Levels a value is skipped through by recursion; deeper ones iterate.
const RECURSE: usize = 64;

/// The brackets open around a position below the recursion, innermost last (`true` for `[`),
/// counting the `depth` levels above them.
#[derive(Default)]
struct Brackets {
    depth: usize,
    open: Vec<bool>,
}

impl Brackets {
    fn push(&mut self, array: bool) -> bool {
        if self.depth >= MAX_DEPTH {
            return false;
        }
        self.open.push(array);
        self.depth += 1;
        true
    }

    /// The innermost bracket opened here, if any (`true` for `[`).
    fn last(&self) -> Option<bool> {
        self.open.last().copied()
    }

    fn pop(&mut self) {
        self.open.pop();
        self.depth -= 1;
    }
}

/// A string token: the bytes between its quotes and whether they contain escapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Str {
    pub inner: Range<usize>,
    pub escaped: bool,
}

/// Stage two: a cursor over the tokens of one source, asking stage one for them a block at a
/// time.
pub struct Scanner<'a> {
    src: &'a str,
    /// Where the current block begins.
    base: usize,
    /// The current block's tokens not consumed yet (bit `i` for byte `base + i`).
    pending: u64,
    /// The current block's brackets.
    brackets: u64,
    /// Where the next block begins.
    next: usize,
    /// What the blocks so far leave the next.
    carry: index::Carry,
    /// Where the last token consumed ends.
    end: usize,
}

impl<'a> Scanner<'a> {
    pub fn new(src: &'a str) -> Self {
        Self {
            src,
            base: 0,
            pending: 0,
            brackets: 0,
            next: 0,
            carry: index::Carry::default(),
            end: 0,
        }
    }

    pub fn src(&self) -> &'a str {
        self.src
    }

    /// Makes sure a token is pending unless the source has no more.
    #[inline]
    fn fill(&mut self) -> Result<(), ScanError> {
        if self.pending == 0 {
            self.refill()?;
        }
        Ok(())
    }

    fn refill(&mut self) -> Result<(), ScanError> {
        while self.pending == 0 && self.next < self.src.len() {
            let block = index::block(self.src.as_bytes(), self.next, &mut self.carry)?;
            self.base = self.next;
            self.next += 64;
            self.pending = block.tokens;
            self.brackets = block.brackets;
        }
        if self.pending == 0 && self.carry.in_string() {
            return Err(ScanError {
                at: self.src.len(),
                what: "unterminated string",
            });
        }
        Ok(())
    }

    /// Where the next token begins (the source's length at its end).
    pub fn pos(&mut self) -> Result<usize, ScanError> {
        self.fill()?;
        Ok(self.here())
    }

    /// Where the last token consumed ends: the end of the value just scanned.
    pub fn end_of_last(&self) -> usize {
        self.end
    }

    /// The position of the pending token, once filled.
    #[inline]
    fn here(&self) -> usize {
        if self.pending == 0 {
            self.src.len()
        } else {
            self.base + self.pending.trailing_zeros() as usize
        }
    }

    /// Scans on from `pos`, where a value of this source begins (a span's start that this
    /// scanner reported): stage one starts over there, outside any string.
    pub fn seek(&mut self, pos: usize) {
        self.pending = 0;
        self.next = pos;
        self.carry = index::Carry::default();
    }

    fn err<T>(&self, what: &'static str) -> Result<T, ScanError> {
        Err(ScanError {
            at: self.here(),
            what,
        })
    }

    #[inline]
    fn peek(&mut self) -> Result<Option<u8>, ScanError> {
        self.fill()?;
        Ok((self.pending != 0).then(|| self.src.as_bytes()[self.here()]))
    }

    /// Consumes the pending token, one byte long.
    #[inline]
    fn bump(&mut self) {
        self.end = self.here() + 1;
        self.pending &= self.pending - 1;
    }

    /// Consumes `c`.
    #[inline]
    pub fn expect(&mut self, c: u8, what: &'static str) -> Result<(), ScanError> {
        if self.peek()? == Some(c) {
            self.bump();
            Ok(())
        } else {
            self.err(what)
        }
    }

    /// After an object's `{` (or a member's value): true when another member follows, false
    /// at the closing `}`. `first` is true right after the `{`.
    #[inline]
    pub fn next_member(&mut self, first: bool) -> Result<bool, ScanError> {
        match self.peek()? {
            Some(b'}') => {
                self.bump();
                Ok(false)
            }
            Some(b',') if !first => {
                self.bump();
                Ok(true)
            }
            _ if first => Ok(true),
            _ => self.err("expected , or }"),
        }
    }

    /// A member's key and the colon after it.
    #[inline]
    pub fn key(&mut self) -> Result<Str, ScanError> {
        let k = self.string()?;
        self.expect(b':', "expected :")?;
        Ok(k)
    }

    /// Skips one value, validating it; returns its span.
    pub fn value(&mut self) -> Result<Range<usize>, ScanError> {
        let start = self.pos()?;
        self.skip()?;
        Ok(start..self.end)
    }

    /// Skips one value, checking only what finding its end needs: strings (stage one checks
    /// them all) and the nesting of brackets. For values that are dropped, never published,
    /// where full validation would cost the most (managedFields is mostly tiny tokens) and buy
    /// nothing. Only the brackets among the tokens are looked at.
    pub fn delimit(&mut self) -> Result<Range<usize>, ScanError> {
        let start = self.pos()?;
        if !matches!(self.peek()?, Some(b'{' | b'[')) {
            return self.value();
        }
        let b = self.src.as_bytes();
        // One bit per open bracket, set for `[`, for the first 128; deeper ones (rare) spill
        // into `deeper`.
        let mut stack: u128 = 0;
        let mut depth = 0usize;
        let mut deeper: Vec<bool> = Vec::new();
        loop {
            let mut brackets = self.pending & self.brackets;
            while brackets != 0 {
                let i = brackets.trailing_zeros();
                let at = self.base + i as usize;
                let c = b[at];
                if c == b'{' || c == b'[' {
                    if depth < 128 {
                        stack = (stack << 1) | u128::from(c == b'[');
                    } else if depth < MAX_DEPTH {
                        deeper.push(c == b'[');
                    } else {
                        return Err(ScanError {
                            at,
                            what: "nested too deeply",
                        });
                    }
                    depth += 1;
                } else {
                    let innermost = if depth <= 128 {
                        (depth > 0).then_some(stack & 1 == 1)
                    } else {
                        deeper.pop()
                    };
                    if innermost != Some(c == b']') {
                        return Err(ScanError {
                            at,
                            what: "mismatched bracket",
                        });
                    }
                    if depth <= 128 {
                        stack >>= 1;
                    }
                    depth -= 1;
                    if depth == 0 {
                        // Everything up to and including this bracket is consumed.
                        self.pending &= u64::MAX.checked_shl(i + 1).unwrap_or(0);
                        self.end = at + 1;
                        return Ok(start..self.end);
                    }
                }
                brackets &= brackets - 1;
            }
            self.pending = 0;
            self.refill()?;
            if self.pending == 0 {
                return self.err("unexpected end");
            }
        }
    }

    /// Requires that no token remains.
    pub fn end(&mut self) -> Result<(), ScanError> {
        match self.peek()? {
            None => Ok(()),
            Some(_) => self.err("trailing characters"),
        }
    }

    /// Skips one value, validating it: recursing through the first [`RECURSE`] levels (the
    /// fast way, and all an ordinary object has), iterating below them ([`Scanner::skip_deep`])
    /// so no depth the API server accepts overflows a thread's stack.
    fn skip(&mut self) -> Result<(), ScanError> {
        self.skip_at(0)
    }

    fn skip_at(&mut self, depth: usize) -> Result<(), ScanError> {
        match self.peek()? {
            Some(b'{' | b'[') if depth >= RECURSE => self.skip_deep(depth),
            Some(b'{') => {
                self.bump();
                let mut first = true;
                while self.next_member(first)? {
                    first = false;
                    self.skip_string()?;
                    self.expect(b':', "expected :")?;
                    self.skip_at(depth + 1)?;
                }
                Ok(())
            }
            Some(b'[') => {
                self.bump();
                if self.peek()? == Some(b']') {
                    self.bump();
                    return Ok(());
                }
                loop {
                    self.skip_at(depth + 1)?;
                    match self.peek()? {
                        Some(b',') => self.bump(),
                        Some(b']') => {
                            self.bump();
                            return Ok(());
                        }
                        _ => return self.err("expected , or ]"),
                    }
                }
            }
            Some(b'"') => self.skip_string(),
            Some(b'}' | b']' | b':' | b',') => self.err("expected a value"),
            Some(_) => self.scalar(),
            None => self.err("unexpected end"),
        }
    }

    /// [`Scanner::skip_at`] for a value `depth` levels down, without recursion: `open` holds the
    /// containers around the value being read.
    #[cold]
    fn skip_deep(&mut self, depth: usize) -> Result<(), ScanError> {
        let mut open = Brackets {
            depth,
            ..Brackets::default()
        };
        let outer = depth;
        loop {
            // A value starts here.
            match self.peek()? {
                Some(b'{') => {
                    self.bump();
                    if self.next_member(true)? {
                        if !open.push(false) {
                            return self.err("nested too deeply");
                        }
                        self.skip_string()?;
                        self.expect(b':', "expected :")?;
                        continue;
                    }
                }
                Some(b'[') => {
                    self.bump();
                    if self.peek()? == Some(b']') {
                        self.bump();
                    } else {
                        if !open.push(true) {
                            return self.err("nested too deeply");
                        }
                        continue;
                    }
                }
                Some(b'"') => self.skip_string()?,
                Some(b'}' | b']' | b':' | b',') => return self.err("expected a value"),
                Some(_) => self.scalar()?,
                None => return self.err("unexpected end"),
            }
            // A value ended: close what ends with it, up to the next value.
            loop {
                if open.depth == outer {
                    return Ok(());
                }
                match open.last() {
                    Some(false) => {
                        if self.next_member(false)? {
                            self.skip_string()?;
                            self.expect(b':', "expected :")?;
                            break;
                        }
                        open.pop();
                    }
                    _ => match self.peek()? {
                        Some(b',') => {
                            self.bump();
                            break;
                        }
                        Some(b']') => {
                            self.bump();
                            open.pop();
                        }
                        _ => return self.err("expected , or ]"),
                    },
                }
            }
        }
    }

    /// A number or literal: stage one marked where its run of bytes begins; it must be exactly
    /// one of them, so what follows it ends the run (whitespace, a structural character, a
    /// quote, or the end).
    fn scalar(&mut self) -> Result<(), ScanError> {
        let b = self.src.as_bytes();
        let start = self.here();
        let end = match b[start] {
            b't' => literal(b, start, b"true"),
            b'f' => literal(b, start, b"false"),
            b'n' => literal(b, start, b"null"),
            _ => number(b, start),
        };
        let ends_run = |c: &u8| {
            matches!(
                c,
                b' ' | b'\t' | b'\n' | b'\r' | b'"' | b'{' | b'}' | b'[' | b']' | b':' | b','
            )
        };
        match end {
            Some(end) if b.get(end).is_none_or(ends_run) => {
                self.pending &= self.pending - 1;
                self.end = end;
                Ok(())
            }
            _ => self.err("invalid number or literal"),
        }
    }

    /// Skips a string whose contents stage one has checked.
    #[inline]
    fn skip_string(&mut self) -> Result<(), ScanError> {
        if self.peek()? != Some(b'"') {
            return self.err("expected a string");
        }
        self.bump();
        // Stage one paired the opening quote with its closing one: the next token.
        self.fill()?;
        self.bump();
        Ok(())
    }

    /// A string token.
    #[inline]
    pub fn string(&mut self) -> Result<Str, ScanError> {
        let open = self.pos()?;
        self.skip_string()?;
        let inner = open + 1..self.end - 1;
        let escaped = memchr::memchr(b'\\', &self.src.as_bytes()[inner.clone()]).is_some();
        Ok(Str { inner, escaped })
    }

    /// The text of a string token of this scanner's source.
    pub fn text(&self, s: &Str) -> Cow<'a, str> {
        s.text(self.src)
    }
}

/// The end of `word` at `at`, when it is there.
fn literal(b: &[u8], at: usize, word: &[u8]) -> Option<usize> {
    b[at..].starts_with(word).then_some(at + word.len())
}

/// The end of a number at `at`, when it is one.
fn number(b: &[u8], mut at: usize) -> Option<usize> {
    let digits = |at: &mut usize| {
        let start = *at;
        while b.get(*at).is_some_and(u8::is_ascii_digit) {
            *at += 1;
        }
        *at > start
    };
    if b.get(at) == Some(&b'-') {
        at += 1;
    }
    match b.get(at)? {
        b'0' => at += 1,
        b'1'..=b'9' => {
            digits(&mut at);
        }
        _ => return None,
    }
    if b.get(at) == Some(&b'.') {
        at += 1;
        if !digits(&mut at) {
            return None;
        }
    }
    if let Some(b'e' | b'E') = b.get(at) {
        at += 1;
        if let Some(b'+' | b'-') = b.get(at) {
            at += 1;
        }
        if !digits(&mut at) {
            return None;
        }
    }
    Some(at)
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

    /// The string value spanning `span` of `src` (quotes included), when it is one.
    pub fn at(src: &str, span: &Range<usize>) -> Option<Str> {
        let raw = src.as_bytes().get(span.clone())?;
        if raw.len() < 2 || raw[0] != b'"' {
            return None;
        }
        let inner = span.start + 1..span.end - 1;
        let escaped = memchr::memchr(b'\\', &src.as_bytes()[inner.clone()]).is_some();
        Some(Str { inner, escaped })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan<R>(
        src: &str,
        f: impl FnOnce(&mut Scanner<'_>) -> Result<R, ScanError>,
    ) -> Result<R, ScanError> {
        f(&mut Scanner::new(src))
    }

    fn valid(s: &str) -> bool {
        scan(s, |sc| {
            sc.value()?;
            sc.end()
        })
        .is_ok()
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
            r#"{"a":truex}"#,
            r#"{"a":true"x"}"#,
            r#"{"a":1 2}"#,
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
            r#""a"#,
            r#"["a":1]"#,
            r#"{"a"}"#,
            r#"{:1}"#,
            r#"[,]"#,
            r#"[1,]"#,
            "[1,\u{1}]",
            "[\"é\",\u{a0}1]",
        ];
        for c in cases {
            let serde = serde_json::from_str::<serde::de::IgnoredAny>(c).is_ok();
            assert_eq!(valid(c), serde, "{c:?}");
        }
    }

    #[test]
    fn delimiting_finds_the_same_end_and_catches_truncation() {
        let src = r#"[{"f:a":{},"k:{\"x\":1}":{".":{}}},["]",{"}":[]}]] , 1"#;
        let v = scan(src, |sc| sc.value()).unwrap();
        let d = scan(src, |sc| sc.delimit()).unwrap();
        assert_eq!(v, d);
        for bad in [
            r#"{"a":[1,2}"#,
            r#"{"a":{"b":1}"#,
            r#"[1,"unterminated]"#,
            "}",
        ] {
            assert!(scan(bad, |sc| sc.delimit()).is_err(), "{bad:?}");
        }
        // Any depth the API server accepts (10,000 levels), and no more.
        let deep = |n: usize| "[{\"a\":".repeat(n / 2) + &"}]".repeat(n / 2);
        assert!(scan(&deep(10_000), |sc| sc.delimit()).is_ok());
        assert!(scan(&deep(10_002), |sc| sc.delimit()).is_err());
    }

    #[test]
    fn any_depth_the_api_server_accepts_without_recursion() {
        // Objects and arrays alternating, 10,000 levels: validated without recursing (a
        // recursive skip would overflow a runtime thread's stack long before).
        let deep = |n: usize| "[{\"a\":".repeat(n / 2) + "1" + &"}]".repeat(n / 2);
        assert!(valid(&deep(10_000)));
        assert!(!valid(&deep(10_002)), "deeper than the API server accepts");
        assert!(!valid(
            &("[{\"a\":".repeat(300) + "1" + &"}]".repeat(299) + "]")
        ));
    }

    #[test]
    fn reports_spans_and_unescapes_only_when_needed() {
        let src = r#"{"name":"web-1","note":"a\"b", "n" : 12 }"#;
        scan(src, |sc| {
            sc.expect(b'{', "object")?;
            assert!(sc.next_member(true)?);
            let k = sc.key()?;
            assert_eq!(sc.text(&k), "name");
            let v = sc.string()?;
            assert!(!v.escaped);
            assert_eq!(sc.text(&v), "web-1");
            assert!(sc.next_member(false)?);
            sc.key()?;
            let span = sc.value()?;
            assert_eq!(&src[span.clone()], r#""a\"b""#);
            let s = Str::at(src, &span).unwrap();
            assert!(s.escaped);
            assert_eq!(s.text(src), "a\"b");
            assert!(sc.next_member(false)?);
            sc.key()?;
            let span = sc.value()?;
            assert_eq!(&src[span], "12");
            assert!(!sc.next_member(false)?);
            sc.end()
        })
        .unwrap();
    }

    #[test]
    fn seeks_to_a_value_already_scanned() {
        let src = r#"{"a":{"b":"c"},"d":1}"#;
        scan(src, |sc| {
            sc.value()?;
            sc.end()?;
            sc.seek(5);
            sc.expect(b'{', "object")?;
            let k = sc.key()?;
            assert_eq!(sc.text(&k), "b");
            assert_eq!(sc.value()?, 10..13);
            Ok(())
        })
        .unwrap();
    }
}
