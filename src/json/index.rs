//! Stage one of the scanner: the structural index of a line, one 64-byte block at a time.
//!
//! Each block is classified into bit masks (quotes, backslashes, spaces, control characters,
//! the six structural characters). Escapes and strings then follow from bit arithmetic, not
//! from branching per byte: a quote is escaped when an odd run of backslashes precedes it, and
//! the bytes inside strings are the prefix XOR of the unescaped quotes. What is left is a mask
//! of the block's tokens: every structural character outside strings, both quotes of every
//! string, and the first byte of every scalar (a run of other bytes outside strings). Stage two
//! ([`super::Scanner`]) parses those tokens, never the bytes in between, and asks for the next
//! block only when it has used up the tokens of this one.
//!
//! Everything about strings is checked here, in every block the scan reaches (a decode reaches
//! them all: it requires the end of the line): no control character inside one (nor anywhere
//! outside whitespace), no backslash outside one, every escape one of JSON's, every string
//! closed. The scalars and the grammar are stage two's.
//!
//! On x86_64 the classification uses SSE2, which every x86_64 processor has, through the
//! `safe_arch` crate: it exposes the intrinsics the build enables as safe functions. Calling
//! `std::arch`'s own would need `unsafe` (or `#[target_feature]` on every caller up to one
//! that is not safe to call), which the crate's `unsafe_code = "forbid"` rules out; wider
//! registers (AVX2) would need runtime dispatch, hence `unsafe`, or a build for newer
//! processors. Other architectures classify byte by byte, with the same result (a test
//! compares the two).

use thiserror::Error;

/// Where a line stops being JSON, and why.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid JSON at byte {at}: {what}")]
pub struct ScanError {
    pub at: usize,
    pub what: &'static str,
}

/// One block's classes, bit `i` for byte `i`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Masks {
    quote: u64,
    backslash: u64,
    /// Spaces (the other whitespace bytes are control characters, rare in a line: they are
    /// told apart only when a block has any).
    space: u64,
    /// `{ } [ ] : ,`
    structural: u64,
    /// `{ } [ ]`
    brackets: u64,
    /// Bytes below 0x20.
    control: u64,
}

/// The classes of one block, byte by byte: the reference, and the path of other architectures.
#[cfg_attr(target_arch = "x86_64", cfg(test))]
fn classify_bytes(block: &[u8; 64]) -> Masks {
    let mut m = Masks::default();
    for (i, &c) in block.iter().enumerate() {
        let bit = 1u64 << i;
        match c {
            b'"' => m.quote |= bit,
            b'\\' => m.backslash |= bit,
            b' ' => m.space |= bit,
            b'{' | b'}' | b'[' | b']' => {
                m.structural |= bit;
                m.brackets |= bit;
            }
            b':' | b',' => m.structural |= bit,
            0..=0x1f => m.control |= bit,
            _ => {}
        }
    }
    m
}

#[cfg(not(target_arch = "x86_64"))]
use classify_bytes as classify;

/// The classes of one block, sixteen bytes at a time.
#[cfg(target_arch = "x86_64")]
fn classify(block: &[u8; 64]) -> Masks {
    use safe_arch::{
        bitor_m128i as or, cmp_eq_mask_i8_m128i as eq, load_unaligned_m128i, m128i, max_u8_m128i,
        move_mask_i8_m128i, set_splat_i8_m128i,
    };
    let splat = |c: u8| set_splat_i8_m128i(i8::from_ne_bytes([c]));
    let bits = |v: m128i| u64::from(move_mask_i8_m128i(v).cast_unsigned() & 0xffff);
    let mut m = Masks::default();
    for (i, chunk) in block.chunks_exact(16).enumerate() {
        let v = load_unaligned_m128i(chunk.try_into().expect("16 bytes"));
        let is = |c: u8| eq(v, splat(c));
        // `[` and `]` are `{` and `}` without 0x20.
        let folded = or(v, splat(0x20));
        let shift = 16 * i;
        m.quote |= bits(is(b'"')) << shift;
        m.backslash |= bits(is(b'\\')) << shift;
        m.space |= bits(is(b' ')) << shift;
        let brackets = bits(or(eq(folded, splat(b'{')), eq(folded, splat(b'}')))) << shift;
        m.brackets |= brackets;
        m.structural |= brackets | (bits(or(is(b':'), is(b','))) << shift);
        // Unsigned c <= 0x1f: max(c, 0x1f) == 0x1f.
        m.control |= bits(eq(max_u8_m128i(v, splat(0x1f)), splat(0x1f))) << shift;
    }
    m
}

/// Bit `i` set when an odd number of the bits at or below `i` are set: the bytes from each
/// opening quote up to (not including) its closing one.
fn prefix_xor(mut x: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        x ^= x << shift;
    }
    x
}

/// The bytes escaped by a backslash in this block (the byte after each backslash that is not
/// itself escaped). `carry` says the block's first byte is escaped, and is set for the next
/// block. Backslashes are rare in Kubernetes objects, so this walks them one by one.
fn escaped(backslash: u64, carry: &mut bool) -> u64 {
    let mut escaped = u64::from(*carry);
    *carry = false;
    let mut pending = backslash & !escaped;
    while pending != 0 {
        let i = pending.trailing_zeros();
        if i == 63 {
            *carry = true;
            break;
        }
        let next = 1u64 << (i + 1);
        escaped |= next;
        pending &= (pending - 1) & !next;
    }
    escaped
}

/// The tabs, line feeds and carriage returns among the `control` bytes of `block`.
fn whitespace_controls(block: &[u8; 64], control: u64) -> u64 {
    let (mut ws, mut rest) = (0, control);
    while rest != 0 {
        let i = rest.trailing_zeros();
        if matches!(block[i as usize], b'\t' | b'\n' | b'\r') {
            ws |= 1 << i;
        }
        rest &= rest - 1;
    }
    ws
}

fn err<T>(at: usize, what: &'static str) -> Result<T, ScanError> {
    Err(ScanError { at, what })
}

/// Checks the escape at `at` (the byte after its backslash).
fn check_escape(src: &[u8], at: usize) -> Result<(), ScanError> {
    match src.get(at) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(()),
        Some(b'u') => match src.get(at + 1..at + 5) {
            Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => Ok(()),
            _ => err(at - 1, "invalid unicode escape"),
        },
        _ => err(at - 1, "invalid escape"),
    }
}

/// What one block leaves the next: whether it ends inside a string, whether its last byte is
/// an unescaped backslash, whether its last byte belongs to a scalar.
#[derive(Clone, Copy, Debug, Default)]
pub struct Carry {
    in_string: u64,
    escape: bool,
    scalar: u64,
}

impl Carry {
    /// True when the blocks so far end inside a string.
    pub fn in_string(&self) -> bool {
        self.in_string != 0
    }
}

/// The tokens of one block, bit `i` for the byte at `base + i`.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    /// Every token: structural characters outside strings, both quotes of every string, the
    /// first byte of every scalar.
    pub tokens: u64,
    /// The brackets among them.
    pub brackets: u64,
}

/// The block of `src` at `base` (the last one padded with spaces), after the blocks `carry`
/// describes. Fails on anything wrong with a string (see the module doc).
pub fn block(src: &[u8], base: usize, carry: &mut Carry) -> Result<Block, ScanError> {
    let mut tail = [b' '; 64];
    let block: &[u8; 64] = match src.get(base..base + 64) {
        Some(b) => b.try_into().expect("64 bytes"),
        None => {
            let rest = &src[base..];
            tail[..rest.len()].copy_from_slice(rest);
            &tail
        }
    };
    let m = classify(block);
    let escaped = if m.backslash == 0 && !carry.escape {
        0
    } else {
        escaped(m.backslash, &mut carry.escape)
    };
    let quotes = m.quote & !escaped;
    let inside = prefix_xor(quotes) ^ carry.in_string;
    carry.in_string = 0u64.wrapping_sub(inside >> 63);
    let ws = if m.control == 0 {
        m.space
    } else {
        m.space | whitespace_controls(block, m.control)
    };
    let bad = (m.control & (inside | !ws)) | (m.backslash & !inside);
    if bad != 0 {
        let i = bad.trailing_zeros();
        let what = match block[i as usize] {
            b'\\' => "backslash outside a string",
            _ if inside & (1 << i) != 0 => "control character in string",
            _ => "control character",
        };
        return err(base + i as usize, what);
    }
    let mut escapes = escaped & inside;
    while escapes != 0 {
        check_escape(src, base + escapes.trailing_zeros() as usize)?;
        escapes &= escapes - 1;
    }
    let scalar = !(ws | m.structural | quotes | inside);
    let scalar_start = scalar & !((scalar << 1) | carry.scalar);
    carry.scalar = scalar >> 63;
    let outside = !inside;
    Ok(Block {
        tokens: (m.structural & outside) | quotes | scalar_start,
        brackets: m.brackets & outside,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_at_a_time_classifies_as_byte_by_byte() {
        let mut block = [0u8; 64];
        for start in (0..=255u8).step_by(64) {
            for (i, b) in block.iter_mut().enumerate() {
                *b = start.wrapping_add(i as u8);
            }
            assert_eq!(classify(&block), classify_bytes(&block), "from {start}");
        }
        let text = br#"{"a":[1, 2],	"b\"":"x\\"}"#;
        let mut block = [b' '; 64];
        block[..text.len()].copy_from_slice(text);
        assert_eq!(classify(&block), classify_bytes(&block));
    }

    /// Every token of `src`, block after block.
    fn tokens(src: &str) -> Result<Vec<usize>, ScanError> {
        let (mut out, mut carry) = (Vec::new(), Carry::default());
        for base in (0..src.len()).step_by(64) {
            let mut t = block(src.as_bytes(), base, &mut carry)?.tokens;
            while t != 0 {
                out.push(base + t.trailing_zeros() as usize);
                t &= t - 1;
            }
        }
        if carry.in_string() {
            return err(src.len(), "unterminated string");
        }
        Ok(out)
    }

    /// The tokens found byte by byte, the way stage one defines them.
    fn naive(src: &str) -> Vec<usize> {
        let b = src.as_bytes();
        let (mut out, mut i, mut scalar) = (Vec::new(), 0, false);
        while i < b.len() {
            match b[i] {
                b'"' => {
                    out.push(i);
                    i += 1;
                    while b[i] != b'"' {
                        i += if b[i] == b'\\' { 2 } else { 1 };
                    }
                    out.push(i);
                    scalar = false;
                }
                b'{' | b'}' | b'[' | b']' | b':' | b',' => {
                    out.push(i);
                    scalar = false;
                }
                b' ' | b'\t' | b'\n' | b'\r' => scalar = false,
                _ if !scalar => {
                    out.push(i);
                    scalar = true;
                }
                _ => {}
            }
            i += 1;
        }
        out
    }

    #[test]
    fn tokens_are_found_across_block_boundaries() {
        // Strings, escapes and scalars cut at every offset of a block boundary.
        let unit = r#"{"k\\":"v\"\\\"",  "n":[-12.5e3,true,null] ,"é":"\u00e9"}"#;
        for pad in 0..70 {
            let src = " ".repeat(pad) + &unit.repeat(3);
            assert_eq!(tokens(&src).unwrap(), naive(&src), "pad {pad}");
        }
    }

    #[test]
    fn broken_strings_are_refused_with_their_position() {
        let at = |s: &str| tokens(s).unwrap_err().at;
        assert_eq!(at(r#"["abc"#), 5);
        assert_eq!(at("[\"a\tb\"]"), 3);
        assert_eq!(at("[1,\u{1}]"), 3);
        assert_eq!(at(r#"[\"a"]"#), 1);
        assert_eq!(at(r#"["a\x"]"#), 3);
        assert_eq!(at(r#"["\u12g4"]"#), 2);
        // The escape's hex digits may lie in the next block.
        let long = format!("[\"{}\\u00e9\"]", "a".repeat(60));
        assert!(tokens(&long).is_ok());
        let long = format!("[\"{}\\u00g9\"]", "a".repeat(60));
        assert!(tokens(&long).is_err());
        // A backslash that ends one block escapes the first byte of the next.
        for pad in 58..66 {
            let src = format!("[\"{}\\\"\"]", "a".repeat(pad));
            assert_eq!(tokens(&src).unwrap(), naive(&src), "pad {pad}");
        }
    }
}
