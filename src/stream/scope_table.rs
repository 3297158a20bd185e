//! The invertible table of a filtered stream's namespaces: what tells, at a start under other
//! namespaces, which namespaces moved since the saved position, including those the start
//! cannot name (out of scope now and without a member: unlabelled or deleted while it was
//! down). The set-sum ([`super::scope_sum`]) cannot tell those: it only chooses among names it
//! is given.
//!
//! An invertible Bloom lookup table (Goodrich and Mitzenmacher) over the namespaces' 64-bit
//! seeds: each namespace is XORed into one cell in each of [`HASHES`] parts of [`PART`] cells
//! (its seed, and a 32-bit check of it). The table of the scope now, XORed into the saved one,
//! holds only the namespaces in one of the two scopes, and peeling its pure cells (a seed
//! whose check matches) reads them back as seeds ([`difference`]): the caller names those it
//! knows, and those it cannot name are namespaces of the saved scope alone. Up to about
//! [`CELLS`] / 3 namespaces moved, it reads them all; past that it may not tell: a cell left
//! unpeeled fails the read. A seed is the one the set-sum draws the namespace's vector from,
//! so what the table reads is checked against the sum saved beside it, unnamed namespaces
//! included (the fingerprint needs their names).
//!
//! Saved as hex beside the sum: the query's check (16 digits), then each cell's seeds (16) and
//! check (8): 784 digits in all.

use crate::config::{fmix64, fnv1a64};

/// Cell positions per namespace, one in each part of the table.
const HASHES: usize = 4;

/// Cells in each part: two namespaces share all their cells with odds of 1 in 8^4.
const PART: usize = 8;

/// Cells in the table.
const CELLS: usize = HASHES * PART;

/// Hex digits of a saved table: the query's check, then the cells.
const DIGITS: usize = 16 + CELLS * (16 + 8);

/// Salts of the cell positions, one a part, and of the check.
const SALTS: [u64; HASHES] = [
    0x9e37_79b9_7f4a_7c15,
    0xbf58_476d_1ce4_e5b9,
    0x94d0_49bb_1331_11eb,
    0x2545_f491_4f6c_dd1d,
];
const CHECK_SALT: u64 = 0xd6e8_feb8_6659_fd93;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Cell {
    seeds: u64,
    checks: u32,
}

pub(super) use super::scope_sum::seed;

fn check(seed: u64) -> u32 {
    (fmix64(seed ^ CHECK_SALT) >> 32) as u32
}

fn query_check(base: &str) -> u64 {
    fmix64(fnv1a64(&format!("query\n{base}")))
}

/// Adds `seed` to `cells`, or takes it out.
fn toggle(cells: &mut [Cell; CELLS], seed: u64) {
    for (part, salt) in SALTS.iter().enumerate() {
        let c = &mut cells[part * PART + (fmix64(seed ^ salt) % PART as u64) as usize];
        c.seeds ^= seed;
        c.checks ^= check(seed);
    }
}

/// The table of `namespaces` over the query whose fingerprint is `base`, as hex.
pub(super) fn table<'a>(namespaces: impl Iterator<Item = &'a str>, base: &str) -> String {
    let mut cells = [Cell::default(); CELLS];
    for ns in namespaces {
        toggle(&mut cells, seed(ns));
    }
    let mut out = format!("{:016x}", query_check(base));
    for c in &cells {
        out.push_str(&format!("{:016x}{:08x}", c.seeds, c.checks));
    }
    out
}

/// The seeds (see [`seed`]) of the namespaces in `saved` (a [`table`]) or in `now`, not both,
/// over the query whose fingerprint is `base`; `None` when `saved` is no table, was saved
/// under another query, or more moved than it can read.
pub(super) fn difference<'a>(
    saved: &str,
    base: &str,
    now: impl Iterator<Item = &'a str>,
) -> Option<Vec<u64>> {
    let mut cells = parse(saved, base)?;
    for ns in now {
        toggle(&mut cells, seed(ns));
    }
    let mut moved = Vec::new();
    while let Some(c) = cells
        .iter()
        .find(|c| c.seeds != 0 && check(c.seeds) == c.checks)
    {
        let seed = c.seeds;
        // A seed read twice was no namespace (cells whose XOR passed the check by chance),
        // and peeling it again would only put it back.
        if moved.contains(&seed) {
            return None;
        }
        toggle(&mut cells, seed);
        moved.push(seed);
    }
    cells.iter().all(|c| *c == Cell::default()).then_some(moved)
}

/// Whether `saved` is a [`table`] written over the query whose fingerprint is `base`.
pub(super) fn over(saved: &str, base: &str) -> bool {
    parse(saved, base).is_some()
}

/// A saved table's cells, `None` for anything [`table`] does not write over `base`.
fn parse(saved: &str, base: &str) -> Option<[Cell; CELLS]> {
    if saved.len() != DIGITS || !saved.is_ascii() {
        return None;
    }
    let hex = |from: usize, len: usize| u64::from_str_radix(&saved[from..from + len], 16).ok();
    if hex(0, 16)? != query_check(base) {
        return None;
    }
    let mut cells = [Cell::default(); CELLS];
    for (i, c) in cells.iter_mut().enumerate() {
        let at = 16 + i * 24;
        *c = Cell {
            seeds: hex(at, 16)?,
            checks: hex(at + 16, 8)? as u32,
        };
    }
    Some(cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i:04}")).collect()
    }

    fn seeds<'a>(names: impl IntoIterator<Item = &'a String>) -> Vec<u64> {
        let mut s: Vec<u64> = names.into_iter().map(|n| seed(n)).collect();
        s.sort_unstable();
        s
    }

    /// The table of `stayed` and `left`, read against `stayed` and `entered`.
    fn read(stayed: &[String], left: &[String], entered: &[String]) -> Option<Vec<u64>> {
        let saved = table(stayed.iter().chain(left).map(String::as_str), "base");
        assert_eq!(saved.len(), DIGITS);
        let now = stayed.iter().chain(entered).map(String::as_str);
        let mut moved = difference(&saved, "base", now)?;
        moved.sort_unstable();
        Some(moved)
    }

    #[test]
    fn the_namespaces_that_moved_are_read_back_whatever_the_scope_size() {
        for n in [0, 1, 40, 5_000] {
            let stayed = names("stayed", n);
            let (left, entered) = (names("left", 3), names("entered", 4));
            assert_eq!(
                read(&stayed, &left, &entered),
                Some(seeds(left.iter().chain(&entered))),
                "{n} namespaces stayed"
            );
            assert_eq!(read(&stayed, &[], &[]), Some(vec![]));
        }
    }

    #[test]
    fn a_few_moves_are_read_in_nearly_every_scope_and_none_is_read_wrong() {
        // For each number of moves, 1,000 scopes (half of the moves leaving, half entering):
        // how many were read. Whatever is read is right.
        let read_of = |moved: usize| {
            (0..1_000)
                .filter(|scope| {
                    let stayed = names(&format!("s{scope}"), 20);
                    let left = names(&format!("l{scope}"), moved / 2);
                    let entered = names(&format!("e{scope}"), moved - moved / 2);
                    read(&stayed, &left, &entered)
                        .inspect(|read| {
                            assert_eq!(*read, seeds(left.iter().chain(&entered)));
                        })
                        .is_some()
                })
                .count()
        };
        assert_eq!(read_of(1), 1_000);
        assert!(read_of(4) >= 995, "four moves");
        assert!(read_of(8) >= 950, "eight moves");
        assert!(read_of(40) < 100, "forty moves in 32 cells are not read");
    }

    #[test]
    fn a_cell_that_passes_its_check_by_chance_ends_the_read() {
        // One cell holding a seed that is no namespace's: peeling it puts it into the cells of
        // its other parts, which then read as pure; the read ends, not loops.
        let saved = table(std::iter::empty(), "base");
        let forged = 0x1234_5678_9abc_def0;
        let at = 16;
        let saved = format!(
            "{}{:016x}{:08x}{}",
            &saved[..at],
            forged,
            check(forged),
            &saved[at + 24..]
        );
        assert_eq!(difference(&saved, "base", std::iter::empty()), None);
    }

    #[test]
    fn another_query_or_anything_else_is_no_table() {
        let then = names("ns", 5);
        let saved = table(then.iter().map(String::as_str), "base");
        assert_eq!(
            difference(&saved, "other", then.iter().map(String::as_str)),
            None
        );
        assert!(over(&saved, "base") && !over(&saved, "other"));
        for bad in ["", "xyz", &"g".repeat(DIGITS), &"é".repeat(DIGITS / 2)] {
            assert_eq!(difference(bad, "base", std::iter::empty()), None, "{bad:?}");
            assert!(!over(bad, "base"), "{bad:?}");
        }
    }
}
