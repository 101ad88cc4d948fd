//! The next offset per partition, as a topic tail and each of its readers keep it.

/// The next offset per partition: a short list sorted by partition (a log has few). One
/// partition costs 16 bytes of heap, where a `BTreeMap` allocated a 144-byte node — one in
/// every topic tail and one in every reader.
#[derive(Debug, Clone, Default)]
pub(super) struct Offsets(Vec<(u32, u64)>);

impl Offsets {
    /// Where `partition`'s entry is, or would go.
    fn find(&self, partition: u32) -> Result<usize, usize> {
        self.0.binary_search_by_key(&partition, |(p, _)| *p)
    }

    /// The next offset of `partition`, if known.
    pub(super) fn get(&self, partition: u32) -> Option<u64> {
        self.find(partition).ok().map(|i| self.0[i].1)
    }

    /// Set the next offset of `partition`.
    pub(super) fn set(&mut self, partition: u32, offset: u64) {
        *self.get_or_insert(partition, offset) = offset;
    }

    /// The next offset of `partition`, set to `offset` first if it has none.
    pub(super) fn get_or_insert(&mut self, partition: u32, offset: u64) -> &mut u64 {
        let i = match self.find(partition) {
            Ok(i) => i,
            Err(i) => {
                self.0.insert(i, (partition, offset));
                i
            }
        };
        &mut self.0[i].1
    }

    /// The lowest partition and its next offset.
    pub(super) fn first(&self) -> Option<(u32, u64)> {
        self.0.first().copied()
    }
}

impl FromIterator<(u32, u64)> for Offsets {
    /// Offsets from pairs; a partition given twice keeps its last offset.
    fn from_iter<I: IntoIterator<Item = (u32, u64)>>(pairs: I) -> Self {
        let mut offsets = Self::default();
        for (partition, offset) in pairs {
            offsets.set(partition, offset);
        }
        offsets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Partitions stay sorted whatever order they come in; the last offset given wins.
    #[test]
    fn offsets_keep_partitions_sorted_and_the_last_offset() {
        let mut offsets: Offsets = [(3, 30), (1, 10), (2, 20), (1, 11)].into_iter().collect();
        assert_eq!(offsets.first(), Some((1, 11)));
        assert_eq!(offsets.get(2), Some(20));
        assert_eq!(offsets.get(4), None);
        *offsets.get_or_insert(4, 40) += 1;
        assert_eq!(offsets.get_or_insert(4, 99), &mut 41);
        offsets.set(0, 5);
        assert_eq!(offsets.0, vec![(0, 5), (1, 11), (2, 20), (3, 30), (4, 41)]);
    }
}
