//! The server's shard ranges that cover a replica's shards (sharded list and watch,
//! `shardSelector`, Kubernetes 1.36+ behind the `ShardedListAndWatch` gate).
//!
//! The server filters on ranges of its own hash of `metadata.namespace` (FNV-1a 64 of the raw
//! field, as 16 hex digits), while a relay shard is the top bits of that hash remixed (see
//! [`ShardingConfig::shard_of`]): a shard's namespaces lie scattered over the server's space,
//! and no few equal ranges hold them. Equal ranges as the shards would not do either: raw
//! FNV-1a's top bits barely depend on a name's last characters, and namespaces `ns-0` to
//! `ns-999` fall in 12 of 64 such ranges. So a replica asks for the ranges that cover the
//! namespaces it knows of its shards and none of the others: each maximal run of its
//! namespaces, in the order of the server's hash, is one range. Where the runs exceed
//! [`MAX_RANGES`] (the request must fit the server's limits), the runs separated by the fewest
//! other namespaces are merged, and those namespaces' objects are received and dropped.
//!
//! A namespace the replica does not know yet is in no range: its objects are not sent until the
//! cover is recomputed with it ([`uncovered`] says which shards then relist).
//!
//! [`ShardingConfig::shard_of`]: crate::config::ShardingConfig::shard_of

use std::collections::BTreeSet;

use crate::config::fnv1a64;

/// Ranges a selector holds at most: about 100 bytes each once URL-encoded, well within the
/// server's limits on an expression (100,000 characters) and a request line.
pub const MAX_RANGES: usize = 400;

/// The namespaces known, as `(the server's hash, the relay's shard)`, sorted by hash.
pub type Points = Vec<(u64, u32)>;

/// The point of `namespace` in the server's space.
pub fn point(namespace: &str) -> u64 {
    fnv1a64(namespace)
}

/// Ranges of the server's hash, each `[start, end)`; `end` is `u64::MAX as u128 + 1` at the top.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cover {
    ranges: Vec<(u64, u128)>,
}

impl Cover {
    /// The whole space.
    pub fn everything() -> Self {
        Self {
            ranges: vec![(0, u128::from(u64::MAX) + 1)],
        }
    }

    /// The ranges covering the namespaces of `shards` among `points`, at most `max` of them.
    pub fn of(points: &[(u64, u32)], shards: &BTreeSet<u32>, max: usize) -> Self {
        // Runs of own points, and between two runs the number of others (their gap).
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut gaps: Vec<usize> = Vec::new();
        let mut others = 0usize;
        let mut i = 0;
        while i < points.len() {
            // Equal points (names that collide) count as one: own if any of them is.
            let p = points[i].0;
            let mut own = false;
            let mut n = 0;
            while i < points.len() && points[i].0 == p {
                own |= shards.contains(&points[i].1);
                n += 1;
                i += 1;
            }
            if !own {
                others += n;
                continue;
            }
            match runs.last_mut() {
                Some(run) if others == 0 => run.1 = p,
                _ => {
                    if !runs.is_empty() {
                        gaps.push(others);
                    }
                    runs.push((p, p));
                }
            }
            others = 0;
        }
        // Too many runs: merge across the smallest gaps (the earliest first among equals).
        if runs.len() > max.max(1) {
            let mut order: Vec<usize> = (0..gaps.len()).collect();
            order.sort_by_key(|&g| (gaps[g], g));
            let merged: BTreeSet<usize> = order.into_iter().take(runs.len() - max.max(1)).collect();
            let mut kept: Vec<(u64, u64)> = Vec::with_capacity(max);
            for (r, run) in runs.into_iter().enumerate() {
                match kept.last_mut() {
                    Some(last) if r > 0 && merged.contains(&(r - 1)) => last.1 = run.1,
                    _ => kept.push(run),
                }
            }
            runs = kept;
        }
        Self {
            ranges: runs
                .into_iter()
                .map(|(start, last)| (start, u128::from(last) + 1))
                .collect(),
        }
    }

    /// Whether the server sends the objects of the namespace at `point`.
    pub fn covers(&self, point: u64) -> bool {
        let i = self.ranges.partition_point(|&(start, _)| start <= point);
        i > 0 && u128::from(point) < self.ranges[i - 1].1
    }

    /// How many ranges it holds.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether it holds no range.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The `shardSelector` asking for these ranges. No range asks for the hash 0 alone (the
    /// server refuses an empty selector, and an empty range): what it sends is dropped.
    pub fn selector(&self) -> String {
        let one = [(0u64, 1u128)];
        let ranges: &[(u64, u128)] = if self.is_empty() { &one } else { &self.ranges };
        let mut s = String::with_capacity(ranges.len() * 80);
        for (i, (start, end)) in ranges.iter().enumerate() {
            if i > 0 {
                s.push_str(" || ");
            }
            // The server compares hex of the same length as text: 16 digits, 17 for 2^64.
            s.push_str(&format!(
                "shardRange(object.metadata.namespace, '0x{start:016x}', '0x{end:016x}')"
            ));
        }
        s
    }
}

/// The shards among `shards` with a namespace among `points` that `cover` leaves out: their
/// streams missed its objects, and relist once the cover holds it.
pub fn uncovered(points: &[(u64, u32)], shards: &BTreeSet<u32>, cover: &Cover) -> BTreeSet<u32> {
    points
        .iter()
        .filter(|(p, k)| shards.contains(k) && !cover.covers(*p))
        .map(|(_, k)| *k)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shards(ks: &[u32]) -> BTreeSet<u32> {
        ks.iter().copied().collect()
    }

    /// Points 10, 20, ... with the shards given in order.
    fn points(owners: &[u32]) -> Points {
        owners
            .iter()
            .enumerate()
            .map(|(i, k)| ((i as u64 + 1) * 10, *k))
            .collect()
    }

    #[test]
    fn each_run_of_own_namespaces_is_one_range() {
        // Own shard 1: points 10, 20 | 30 (shard 2) | 40 | 50, 60 (shard 3) | 70.
        let p = points(&[1, 1, 2, 1, 3, 3, 1]);
        let c = Cover::of(&p, &shards(&[1]), 10);
        assert_eq!(c.ranges, vec![(10, 21), (40, 41), (70, 71)]);
        for (point, k) in &p {
            assert_eq!(c.covers(*point), *k == 1, "point {point}");
        }
        assert!(!c.covers(25) && !c.covers(0) && !c.covers(u64::MAX));
    }

    #[test]
    fn too_many_runs_merge_across_the_fewest_others() {
        // Gaps of 2, 1 and 3 other namespaces between four runs: at most three ranges merge
        // across the gap of one, at most two across the gaps of one and two.
        let p = points(&[1, 2, 2, 1, 2, 1, 2, 2, 2, 1]);
        let three = Cover::of(&p, &shards(&[1]), 3);
        assert_eq!(three.ranges, vec![(10, 11), (40, 61), (100, 101)]);
        let two = Cover::of(&p, &shards(&[1]), 2);
        assert_eq!(two.ranges, vec![(10, 61), (100, 101)]);
        // Whatever the merging, every own namespace stays covered.
        for c in [&three, &two, &Cover::of(&p, &shards(&[1]), 1)] {
            assert!(uncovered(&p, &shards(&[1]), c).is_empty());
        }
    }

    #[test]
    fn colliding_names_are_covered_when_either_is_own() {
        let p = vec![(5, 2), (7, 1), (7, 2), (9, 2)];
        let c = Cover::of(&p, &shards(&[1]), 10);
        assert_eq!(c.ranges, vec![(7, 8)]);
    }

    #[test]
    fn the_top_of_the_space_ends_past_the_last_hash() {
        let p = vec![(u64::MAX, 0)];
        let c = Cover::of(&p, &shards(&[0]), 10);
        assert!(c.covers(u64::MAX));
        assert_eq!(
            c.selector(),
            "shardRange(object.metadata.namespace, '0xffffffffffffffff', '0x10000000000000000')"
        );
    }

    #[test]
    fn no_own_namespace_asks_for_almost_nothing() {
        let c = Cover::of(&points(&[2, 3]), &shards(&[1]), 10);
        assert!(c.is_empty());
        assert_eq!(
            c.selector(),
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0x0000000000000001')"
        );
    }

    #[test]
    fn a_new_namespace_outside_the_cover_names_its_shard() {
        let before = points(&[1, 2, 3]);
        let c = Cover::of(&before, &shards(&[1, 3]), 10);
        let mut after = before.clone();
        after.push((25, 3)); // between 20 (shard 2) and 30 (shard 3): not covered
        after.push((15, 2)); // another replica's
        after.sort_unstable();
        assert_eq!(uncovered(&after, &shards(&[1, 3]), &c), shards(&[3]));
    }

    #[test]
    fn a_thousand_sequential_namespaces_split_exactly_in_few_ranges() {
        let config = crate::config::ShardingConfig {
            enabled: true,
            ..Default::default()
        };
        let mut p: Points = (0..1000)
            .map(|i| {
                let ns = format!("ns-{i}");
                (point(&ns), config.shard_of(&ns))
            })
            .collect();
        p.sort_unstable();
        let mine: BTreeSet<u32> = (0..64).filter(|k| k % 3 == 0).collect();
        let c = Cover::of(&p, &mine, MAX_RANGES);
        assert!(c.len() < MAX_RANGES, "{} ranges", c.len());
        for (point, k) in &p {
            assert_eq!(c.covers(*point), mine.contains(k));
        }
    }
}
