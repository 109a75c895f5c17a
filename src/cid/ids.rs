//! The set of owned ids: a bitmap with "lowest free" and "highest owned" queries.

/// Which ids are owned. Kept under the space's lock.
#[derive(Debug, Default)]
pub(crate) struct IdSet {
    words: Vec<u64>,
    owned: usize,
}

impl IdSet {
    /// Takes the lowest free id (the kernel's `cpumask_first_zero` on `mm_cidmask`).
    pub(crate) fn take_lowest(&mut self) -> usize {
        let word = match self.words.iter().position(|w| *w != u64::MAX) {
            Some(index) => index,
            None => {
                self.words.push(0);
                self.words.len() - 1
            }
        };
        let bit = self.words[word].trailing_ones() as usize;
        self.words[word] |= 1 << bit;
        self.owned += 1;
        word * 64 + bit
    }

    pub(crate) fn release(&mut self, id: usize) {
        let (word, bit) = (id / 64, id % 64);
        debug_assert!(self.words[word] & (1 << bit) != 0, "releasing a free id");
        self.words[word] &= !(1 << bit);
        self.owned -= 1;
    }

    /// Drops trailing words with no owned id, so the bitmap follows the high water.
    pub(crate) fn shrink(&mut self) {
        let used = self
            .words
            .iter()
            .rposition(|w| *w != 0)
            .map_or(0, |index| index + 1);
        self.words.truncate(used);
        if self.words.capacity() >= 4 * used.max(1) {
            self.words.shrink_to(used);
        }
    }

    /// Number of owned ids.
    pub(crate) fn owned(&self) -> usize {
        self.owned
    }

    /// One past the highest owned id (0 when none is owned).
    pub(crate) fn high_water(&self) -> usize {
        self.words.iter().rposition(|w| *w != 0).map_or(0, |index| {
            index * 64 + 64 - self.words[index].leading_zeros() as usize
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_free_first_and_high_water_follows_the_top() {
        let mut ids = IdSet::default();
        let taken: Vec<usize> = (0..130).map(|_| ids.take_lowest()).collect();
        assert_eq!(taken, (0..130).collect::<Vec<_>>());
        assert_eq!(ids.high_water(), 130);
        ids.release(5);
        ids.release(129);
        assert_eq!(ids.high_water(), 129);
        assert_eq!(ids.take_lowest(), 5);
        assert_eq!(ids.owned(), 129);
        for id in 0..129 {
            ids.release(id);
        }
        assert_eq!((ids.owned(), ids.high_water()), (0, 0));
    }
}
