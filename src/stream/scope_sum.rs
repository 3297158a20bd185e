//! The set-sum of a filtered stream's namespaces: what tells, at a start under other
//! namespaces, which of the many namespaces in scope now without a member the saved position
//! covered.
//!
//! Each namespace maps to a pseudo-random vector of `64 × words` bits, and the sum of a set is
//! the XOR of its namespaces' vectors with the query's own (see [`sum`]). Saved beside the
//! position's fingerprint, it turns "which subset of these candidates" into a linear system
//! over GF(2): the candidates whose vectors XOR to the saved sum, less the members'
//! namespaces', which Gaussian elimination solves in `n² · words` word operations for `n`
//! candidates ([`Solutions::of`]). While the candidates' vectors are independent (`n` well
//! under the width, as the width follows the scope's size) the answer is one subset; each
//! answer is then checked against the fingerprint, so a sum can only fail to tell, never tell
//! wrong.
//!
//! The width is stamped with the sum (its length): 256 bits for up to 191 namespaces, then
//! 64 more per 64, up to [`MAX_WORDS`] words.

use crate::config::{fmix64, fnv1a64};

/// The widest sum, in 64-bit words: 1,024 bits, 256 hex digits in a checkpoint entry. A
/// scope past about a thousand namespaces without a member is not told by it.
const MAX_WORDS: usize = 16;

/// The narrowest sum, in 64-bit words.
const MIN_WORDS: usize = 4;

/// The sum of `namespaces` over the query whose fingerprint is `base`, as hex: `64 × words`
/// bits, wide enough to tell apart a scope of their number.
pub(super) fn sum<'a>(namespaces: impl ExactSizeIterator<Item = &'a str>, base: &str) -> String {
    let words = (namespaces.len() / 64 + 2).clamp(MIN_WORDS, MAX_WORDS);
    let mut acc = vector(Domain::Base, base, words);
    for ns in namespaces {
        xor(&mut acc, &vector(Domain::Namespace, ns, words));
    }
    acc.iter().map(|w| format!("{w:016x}")).collect()
}

/// What a saved sum says of a set of candidates: each subset whose vectors, with those of the
/// namespaces known to be in it, XOR to the sum is `particular` XOR any combination of
/// `kernel` (each a set of candidates, as a bitset over their indices).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Solutions {
    /// One subset that sums right.
    pub particular: Vec<u64>,
    /// Subsets that sum to nothing: adding any of them to a solution gives another.
    pub kernel: Vec<Vec<u64>>,
}

impl Solutions {
    /// The subsets of `candidates` that, with `known`, sum to `saved` over `base`; `None` when
    /// none does (a namespace of the saved scope is in neither) or `saved` is no sum.
    pub(super) fn of<'a>(
        saved: &str,
        base: &str,
        known: impl IntoIterator<Item = &'a str>,
        candidates: &[&str],
    ) -> Option<Self> {
        let mut target = parse(saved)?;
        let words = target.len();
        xor(&mut target, &vector(Domain::Base, base, words));
        for ns in known {
            xor(&mut target, &vector(Domain::Namespace, ns, words));
        }
        let tag_words = candidates.len().div_ceil(64);
        let mut basis = Basis::new(words * 64);
        let mut kernel = Vec::new();
        for (i, ns) in candidates.iter().enumerate() {
            let tag = unit(i, tag_words);
            let (rest, tag) = basis.reduce(vector(Domain::Namespace, ns, words), tag);
            match highest(&rest) {
                Some(pivot) => basis.rows[pivot] = Some((rest, tag)),
                None => kernel.push(tag),
            }
        }
        let (rest, particular) = basis.reduce(target, vec![0u64; tag_words]);
        highest(&rest)
            .is_none()
            .then_some(Self { particular, kernel })
    }

    /// Every subset of `n` candidates: what is left to try without a sum.
    pub(super) fn any(n: usize) -> Self {
        let words = n.div_ceil(64);
        Self {
            particular: vec![0; words],
            kernel: (0..n).map(|i| unit(i, words)).collect(),
        }
    }

    /// Every solution, as a bitset over the candidates: `2^kernel` of them.
    pub(super) fn each(&self) -> impl Iterator<Item = Vec<u64>> + '_ {
        (0u64..1 << self.kernel.len()).map(|mask| {
            let mut x = self.particular.clone();
            for (j, k) in self.kernel.iter().enumerate() {
                if mask >> j & 1 == 1 {
                    xor(&mut x, k);
                }
            }
            x
        })
    }
}

/// The bitset of `words` words naming candidate `i` alone.
fn unit(i: usize, words: usize) -> Vec<u64> {
    let mut v = vec![0u64; words];
    v[i / 64] |= 1 << (i % 64);
    v
}

/// The candidates bitset `bits` names.
pub(super) fn chosen<'a>(
    bits: &'a [u64],
    candidates: &'a [&'a str],
) -> impl Iterator<Item = &'a str> + 'a {
    (0..candidates.len())
        .filter(|i| bits[i / 64] >> (i % 64) & 1 == 1)
        .map(|i| candidates[i])
}

/// Rows of reduced vectors, each with the candidates it is the XOR of, indexed by its highest
/// bit.
struct Basis {
    rows: Vec<Option<(Vec<u64>, Vec<u64>)>>,
}

impl Basis {
    fn new(bits: usize) -> Self {
        Self {
            rows: vec![None; bits],
        }
    }

    /// `v` (the XOR of the candidates in `tag`) less every row whose highest bit it holds,
    /// from the highest bit down: a row only touches bits at or below its own.
    fn reduce(&self, mut v: Vec<u64>, mut tag: Vec<u64>) -> (Vec<u64>, Vec<u64>) {
        for bit in (0..self.rows.len()).rev() {
            if v[bit / 64] >> (bit % 64) & 1 == 0 {
                continue;
            }
            if let Some((row, row_tag)) = &self.rows[bit] {
                xor(&mut v, row);
                xor(&mut tag, row_tag);
            }
        }
        (v, tag)
    }
}

/// What a vector is of: the query, or a namespace (so that no namespace's is the query's).
#[derive(Clone, Copy)]
enum Domain {
    Base,
    Namespace,
}

/// The `words`-word vector of `name`.
fn vector(domain: Domain, name: &str, words: usize) -> Vec<u64> {
    vector_of(seed_in(domain, name), words)
}

/// The seed of `name` in `domain`: what its vector is drawn from.
fn seed_in(domain: Domain, name: &str) -> u64 {
    let tag = match domain {
        Domain::Base => "query\n",
        Domain::Namespace => "namespace\n",
    };
    fnv1a64(&format!("{tag}{name}"))
}

/// The `words`-word vector of the name whose seed is `seed` (see [`seed`]).
fn vector_of(seed: u64, words: usize) -> Vec<u64> {
    (1..=words as u64)
        .map(|i| fmix64(seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect()
}

/// The seed of namespace `ns`: what its vector is drawn from, and what the invertible table
/// holds of it (see [`super::scope_table`]).
pub(super) fn seed(ns: &str) -> u64 {
    seed_in(Domain::Namespace, ns)
}

/// Whether `saved` is the sum of `namespaces` and of the namespaces whose seeds are `seeds`
/// (named or not) over `base`.
pub(super) fn sums_to<'a>(
    saved: &str,
    base: &str,
    namespaces: impl Iterator<Item = &'a str>,
    seeds: &[u64],
) -> bool {
    let Some(mut acc) = parse(saved) else {
        return false;
    };
    let words = acc.len();
    xor(&mut acc, &vector(Domain::Base, base, words));
    for ns in namespaces {
        xor(&mut acc, &vector(Domain::Namespace, ns, words));
    }
    for s in seeds {
        xor(&mut acc, &vector_of(*s, words));
    }
    acc.iter().all(|w| *w == 0)
}

fn xor(acc: &mut [u64], v: &[u64]) {
    for (a, b) in acc.iter_mut().zip(v) {
        *a ^= b;
    }
}

/// The highest set bit of `v`.
fn highest(v: &[u64]) -> Option<usize> {
    v.iter()
        .enumerate()
        .rev()
        .find(|(_, w)| **w != 0)
        .map(|(i, w)| i * 64 + 63 - w.leading_zeros() as usize)
}

/// A saved sum's words; `None` for anything [`sum`] does not write.
fn parse(saved: &str) -> Option<Vec<u64>> {
    let words = saved.len() / 16;
    if !saved.is_ascii()
        || !saved.len().is_multiple_of(16)
        || !(MIN_WORDS..=MAX_WORDS).contains(&words)
    {
        return None;
    }
    (0..words)
        .map(|i| u64::from_str_radix(&saved[i * 16..i * 16 + 16], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i:04}")).collect()
    }

    #[test]
    fn the_width_follows_the_scope_within_its_bounds() {
        for (n, words) in [(0, 4), (191, 4), (192, 5), (900, 16), (5_000, 16)] {
            let scope = names("ns", n);
            let s = sum(scope.iter().map(String::as_str), "base");
            assert_eq!(s.len(), words * 16, "{n} namespaces");
            assert!(parse(&s).is_some());
        }
        for bad in [
            "",
            "xyz",
            &"é".repeat(32),
            &"0".repeat(16 * 3),
            &"0".repeat(16 * 17),
            &"g".repeat(64),
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_saved_subset_of_many_candidates_is_the_one_solution() {
        // 120 namespaces in scope then, 30 of them with members; 200 in scope now without a
        // member: 90 of the old ones and 110 that entered.
        let then = names("then", 120);
        let now = names("new", 110);
        let saved = sum(then.iter().map(String::as_str), "base");
        let known: Vec<&str> = then[..30].iter().map(String::as_str).collect();
        let candidates: Vec<&str> = then[30..].iter().chain(&now).map(String::as_str).collect();
        let solved = Solutions::of(&saved, "base", known, &candidates).expect("told");
        assert!(solved.kernel.is_empty(), "independent vectors");
        let mut told: Vec<&str> = chosen(&solved.particular, &candidates).collect();
        told.sort_unstable();
        let mut want: Vec<&str> = then[30..].iter().map(String::as_str).collect();
        want.sort_unstable();
        assert_eq!(told, want);
    }

    #[test]
    fn a_saved_namespace_among_no_candidate_or_another_query_is_not_told() {
        let then = names("then", 40);
        let saved = sum(then.iter().map(String::as_str), "base");
        // The first is neither known nor a candidate (out of scope now, without a member).
        let candidates: Vec<&str> = then[1..].iter().map(String::as_str).collect();
        assert_eq!(Solutions::of(&saved, "base", [], &candidates), None);
        // The selectors changed.
        let all: Vec<&str> = then.iter().map(String::as_str).collect();
        assert_eq!(Solutions::of(&saved, "other", [], &all), None);
        // A member too many: known, but not in the saved scope.
        assert_eq!(Solutions::of(&saved, "base", ["x"], &all), None);
        assert!(Solutions::of(&saved, "base", [], &all).is_some());
    }

    #[test]
    fn candidates_past_the_width_leave_a_kernel_to_try() {
        // 300 candidates in 256 bits: at least 44 combinations sum to nothing.
        let then = names("then", 10);
        let saved = sum(then.iter().map(String::as_str), "base");
        let more = names("more", 290);
        let candidates: Vec<&str> = then.iter().chain(&more).map(String::as_str).collect();
        let solved = Solutions::of(&saved, "base", [], &candidates).expect("consistent");
        assert_eq!(solved.kernel.len(), 300 - 256);
    }

    #[test]
    fn without_a_sum_every_subset_is_a_solution() {
        let any = Solutions::any(3);
        let mut subsets: Vec<u64> = any.each().map(|x| x[0]).collect();
        subsets.sort_unstable();
        assert_eq!(subsets, (0..8).collect::<Vec<u64>>());
        let candidates = ["a", "b", "c"];
        assert_eq!(
            chosen(&[0b101], &candidates).collect::<Vec<_>>(),
            ["a", "c"]
        );
    }
}
