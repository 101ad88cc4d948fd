//! How many entries a catch-up page asks for: sized by the bytes the last page carried, not by a
//! fixed count. A page of small entries grows (fewer calls through the component per entry); a
//! page of large ones shrinks, so a page never needs more than [`PAGE_BYTES`] or so of the
//! instance's memory, and a page that trapped is asked again at half its size. The host's log
//! readers use it, and so do the drivers' native benches, so both sides of a catch-up row read
//! the same pages.

/// What the first page of a read asks for, before any entry's size is known.
pub const FIRST_PAGE: u32 = 256;
/// The most entries a page asks for, however small they are.
pub const MAX_PAGE: u32 = 4096;
/// The bytes a page aims at: values, keys and headers, plus [`ENTRY_OVERHEAD`] per entry.
pub const PAGE_BYTES: usize = 256 * 1024;
/// What an entry costs beside its value, key and headers: its id, position and record
/// structure, on each side of the boundary.
pub const ENTRY_OVERHEAD: usize = 96;

/// The size of a reader's next page, adapted after each page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageSize {
    limit: u32,
}

impl Default for PageSize {
    fn default() -> Self {
        Self { limit: FIRST_PAGE }
    }
}

impl PageSize {
    /// The `limit` to ask the next page with.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// A page came back with `entries` entries holding `bytes` bytes of values, keys and
    /// headers: the next asks for as many entries of that mean size as fill [`PAGE_BYTES`]
    /// (at least 1, at most [`MAX_PAGE`]). An empty page changes nothing.
    pub fn after_page(&mut self, entries: usize, bytes: usize) {
        if entries == 0 {
            return;
        }
        let mean = bytes / entries + ENTRY_OVERHEAD;
        self.limit = (PAGE_BYTES / mean).clamp(1, MAX_PAGE as usize) as u32;
    }

    /// The page trapped (most likely the instance ran out of memory holding it): the next asks
    /// for half as many entries. True if it did shrink (false at one entry already).
    pub fn after_trap(&mut self) -> bool {
        let shrunk = self.limit > 1;
        self.limit = (self.limit / 2).max(1);
        shrunk
    }
}

/// The bytes an entry counts for in [`PageSize::after_page`]: its value, key and headers.
pub fn entry_bytes(value: &[u8], key: Option<&[u8]>, headers: &[(String, Vec<u8>)]) -> usize {
    value.len()
        + key.map_or(0, <[u8]>::len)
        + headers
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_entries_make_larger_pages_up_to_the_most() {
        let mut page = PageSize::default();
        assert_eq!(page.limit(), FIRST_PAGE);
        page.after_page(256, 256 * 100);
        assert_eq!(page.limit() as usize, PAGE_BYTES / (100 + ENTRY_OVERHEAD));
        assert!(page.limit() > FIRST_PAGE);
        page.after_page(256, 0);
        assert_eq!(page.limit() as usize, PAGE_BYTES / ENTRY_OVERHEAD);
        page.after_page(10, 0);
        page.after_page(4000, 4000);
        assert!(page.limit() <= MAX_PAGE);
    }

    #[test]
    fn large_entries_make_pages_of_a_few_down_to_one() {
        let mut page = PageSize::default();
        page.after_page(256, 256 * 1024);
        assert_eq!(page.limit() as usize, PAGE_BYTES / (1024 + ENTRY_OVERHEAD));
        page.after_page(3, 3 << 20);
        assert_eq!(page.limit(), 1);
    }

    #[test]
    fn an_empty_page_keeps_the_size_and_a_trap_halves_it_down_to_one() {
        let mut page = PageSize::default();
        page.after_page(0, 0);
        assert_eq!(page.limit(), FIRST_PAGE);
        let mut halvings = 0;
        while page.after_trap() {
            halvings += 1;
        }
        assert_eq!((halvings, page.limit()), (8, 1));
        assert!(!page.after_trap());
        assert_eq!(page.limit(), 1);
    }

    #[test]
    fn an_entry_counts_its_value_key_and_headers() {
        let headers = vec![("k".to_string(), b"vv".to_vec())];
        assert_eq!(entry_bytes(b"12345", Some(b"ab"), &headers), 5 + 2 + 3);
        assert_eq!(entry_bytes(b"", None, &[]), 0);
    }
}
