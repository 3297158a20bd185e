//! [`Arena`]: the byte store of a membership set's entries, in chunks of one size.
//!
//! A set's entries used to live in one growing vector. A restore grows a hundred such vectors
//! at once, a step at a time, and each step of a vector too large to grow in place copies it and
//! leaves its old block as a hole the allocator rarely fills again: the holes, not the entries,
//! set the process's peak. Chunks of one size (64 KiB) are never copied to grow, and a chunk one
//! set frees is exactly what another set's next chunk needs.
//!
//! An entry never spans chunks: one that does not fit in the last chunk's room starts the next
//! one (an entry longer than a chunk has a chunk of its own). An offset is the chunk's index and
//! the entry's position in it (16 bits each; the top bit of the index is left to the set, which
//! marks tombstones with it), so offsets grow in the order entries were pushed.

/// Bytes in a chunk (and the bits of an offset that are the position in its chunk).
const CHUNK_BITS: u32 = 16;
const CHUNK: usize = 1 << CHUNK_BITS;

/// The largest chunk index an offset holds: its top bit is the set's (see the module doc).
const MAX_CHUNKS: usize = 1 << (31 - CHUNK_BITS);

#[derive(Default)]
pub(super) struct Arena {
    /// Each with the capacity of a chunk, or of the one entry longer than a chunk it holds.
    chunks: Vec<Vec<u8>>,
    /// Bytes of the entries (and of the garbage among them), without the chunks' unused room.
    used: usize,
}

impl Arena {
    /// Appends `entry`; returns its offset.
    pub(super) fn push(&mut self, entry: &[u8]) -> u32 {
        let fits = self
            .chunks
            .last()
            .is_some_and(|c| c.len() + entry.len() <= CHUNK);
        if !fits {
            assert!(self.chunks.len() < MAX_CHUNKS, "a member arena under 2 GiB");
            self.chunks.push(Vec::with_capacity(entry.len().max(CHUNK)));
        }
        let index = self.chunks.len() - 1;
        let chunk = &mut self.chunks[index];
        let at = offset(index, chunk.len());
        chunk.extend_from_slice(entry);
        self.used += entry.len();
        at
    }

    /// The bytes from the entry at `at` to the end of its chunk (an entry knows its own length).
    pub(super) fn entry(&self, at: u32) -> &[u8] {
        let (index, position) = split(at);
        &self.chunks[index][position..]
    }

    /// Bytes the entries pushed since the last rewrite take.
    pub(super) fn used(&self) -> usize {
        self.used
    }

    /// Bytes the chunks hold on the heap.
    pub(super) fn heap_bytes(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum::<usize>()
            + self.chunks.capacity() * size_of::<Vec<u8>>()
    }

    /// Keeps only the entries at `offsets`, given in increasing order (`len` says how long the
    /// entry at the start of its bytes is): moves each down to where the previous one ended (in
    /// place: an entry only ever moves to an earlier offset) and sets its new offset; frees the
    /// chunks left empty.
    pub(super) fn retain<'a>(
        &mut self,
        offsets: impl Iterator<Item = &'a mut u32>,
        len: impl Fn(&[u8]) -> usize,
    ) {
        let (mut to_index, mut to_position) = (0, 0);
        let mut last = None;
        for at in offsets {
            debug_assert!(last.is_none_or(|l| l < *at), "offsets in increasing order");
            last = Some(*at);
            let len = len(self.entry(*at));
            let (from_index, from_position) = split(*at);
            if to_position > 0 && to_position + len > CHUNK {
                // An entry that does not fit here lies in a later chunk: every entry of this one
                // was read, and what follows the last one written is garbage.
                self.chunks[to_index].truncate(to_position);
                (to_index, to_position) = (to_index + 1, 0);
            }
            if (to_index, to_position) != (from_index, from_position) {
                if to_index == from_index {
                    let chunk = &mut self.chunks[to_index];
                    chunk.copy_within(from_position..from_position + len, to_position);
                } else {
                    debug_assert!(to_index < from_index, "entries only move down");
                    // Every entry of an earlier chunk was read already: what follows the
                    // destination there is garbage.
                    let (before, after) = self.chunks.split_at_mut(from_index);
                    let to = &mut before[to_index];
                    to.truncate(to_position);
                    to.extend_from_slice(&after[0][from_position..from_position + len]);
                }
            }
            *at = offset(to_index, to_position);
            to_position += len;
        }
        if to_position == 0 {
            self.chunks.truncate(to_index);
        } else {
            self.chunks.truncate(to_index + 1);
            self.chunks[to_index].truncate(to_position);
        }
        self.used = self.chunks.iter().map(Vec::len).sum();
    }

    /// Frees what the chunk list itself holds beyond its chunks.
    pub(super) fn shrink_to_fit(&mut self) {
        self.chunks.shrink_to_fit();
    }
}

fn offset(index: usize, position: usize) -> u32 {
    debug_assert!(position < CHUNK && index < MAX_CHUNKS);
    (index << CHUNK_BITS | position) as u32
}

fn split(at: u32) -> (usize, usize) {
    ((at >> CHUNK_BITS) as usize, at as usize & (CHUNK - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry whose first four bytes say its length (as the set's entries know theirs).
    fn entry(i: usize, len: usize) -> Vec<u8> {
        let mut e = vec![(i % 251) as u8; len];
        e[..4].copy_from_slice(&(len as u32).to_le_bytes());
        e
    }

    fn entry_len(bytes: &[u8]) -> usize {
        u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize
    }

    #[test]
    fn entries_never_span_chunks_and_survive_retain() {
        let mut arena = Arena::default();
        let lens = |i: usize| match i % 97 {
            0 => CHUNK + 10,
            n => 4 + n * 13,
        };
        let mut at: Vec<(u32, usize, usize)> = (0..5_000)
            .map(|i| (arena.push(&entry(i, lens(i))), i, lens(i)))
            .collect();
        assert!(
            at.windows(2).all(|w| w[0].0 < w[1].0),
            "offsets in push order"
        );
        for &(a, i, len) in &at {
            assert_eq!(&arena.entry(a)[..len], &entry(i, len)[..]);
        }
        let before = arena.heap_bytes();
        // Keep one in three, twice over.
        for _ in 0..2 {
            at = at
                .into_iter()
                .enumerate()
                .filter(|(n, _)| n % 3 == 0)
                .map(|(_, e)| e)
                .collect();
            arena.retain(at.iter_mut().map(|(a, _, _)| a), entry_len);
            for &(a, i, len) in &at {
                assert_eq!(&arena.entry(a)[..len], &entry(i, len)[..]);
            }
            assert_eq!(arena.used(), at.iter().map(|e| e.2).sum::<usize>());
        }
        assert!(
            arena.heap_bytes() < before / 4,
            "{} of {before}",
            arena.heap_bytes()
        );
        // Then only the entries longer than a chunk and the ones just before them: a chunk is
        // left with a tail after the last entry moved within it, which must not count as used.
        let all = at.clone();
        at = (0..all.len())
            .filter(|&n| all[n].2 > CHUNK || all.get(n + 1).is_some_and(|e| e.2 > CHUNK))
            .map(|n| all[n])
            .collect();
        assert!(at.iter().any(|e| e.2 > CHUNK) && at.iter().any(|e| e.2 < CHUNK));
        arena.retain(at.iter_mut().map(|(a, _, _)| a), entry_len);
        for &(a, i, len) in &at {
            assert_eq!(&arena.entry(a)[..len], &entry(i, len)[..]);
        }
        assert_eq!(arena.used(), at.iter().map(|e| e.2).sum::<usize>());
        // Pushing goes on after what was kept.
        let next = arena.push(&entry(1, 40));
        assert!(next > at.last().unwrap().0);
        arena.retain(std::iter::empty(), entry_len);
        assert_eq!((arena.used(), arena.chunks.len()), (0, 0));
    }
}
