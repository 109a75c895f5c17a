//! The registry's slots: where each live work of a scheduler is listed (`listing.rs`
//! says when a work is listed and why a listed work may be referenced).
//!
//! One word per slot: a pointer to a listed work's header (8-aligned, so its low bit is
//! 0), or a vacant slot's link to the next vacant one (odd). Each work keeps its slot number
//! in its header (`registry_key`), so listing and unlisting are O(1): one lock, a slot
//! write. With the vector's growth a work costs 8–16 B here (about 10.5 B at 100k works).
//! The vector shrinks (moving works to the front, their keys rewritten under the lock)
//! once three quarters of it are vacant, so it follows the live works down as well.
//!
//!
//! The slots hold header addresses and never follow them: the rewritten keys go back to
//! the caller (`remove`'s `rekey`), which holds the registry's lock.

use std::ptr::NonNull;

/// A work's `registry_key` while it is not listed: the largest 31-bit key (the word's top
/// bit says whether the work is named).
pub(crate) const NOT_LISTED: u32 = (1 << 31) - 1;

/// Marks a vacant slot's link (a header address is even).
const VACANT: usize = 1;

/// The end of the vacant slots' chain (a link keeps its slot number shifted left by one).
const NO_VACANT: usize = usize::MAX >> 1;
/// Below this many slots the vector is never shrunk.
const MIN_SHRINK_SLOTS: usize = 64;

/// The slots (see the module docs).
#[derive(Debug)]
pub(crate) struct ListedSlots<H> {
    /// A listed work's header, or a vacant slot's link: a pointer with no provenance
    /// whose address is `next << 1 | VACANT`.
    slots: Vec<*const H>,
    /// The first vacant slot, or `NO_VACANT`.
    vacant: usize,
    /// Listed works.
    pub(crate) listed: usize,
}

// SAFETY: the pointers are to works' headers, which are `Send + Sync`; this file never
// follows them, and `listing.rs` follows them only under the registry's lock, while the
// works are alive.
unsafe impl<H: Sync> Send for ListedSlots<H> {}

impl<H> ListedSlots<H> {
    pub(crate) const fn new() -> ListedSlots<H> {
        ListedSlots {
            slots: Vec::new(),
            vacant: NO_VACANT,
            listed: 0,
        }
    }

    /// Lists `header`'s work; returns its slot, or `None` when the slots would pass
    /// `NOT_LISTED` (two billion live works: it is then simply not listed).
    pub(crate) fn insert(&mut self, header: NonNull<H>) -> Option<u32> {
        const {
            assert!(
                align_of::<H>() > VACANT,
                "a vacant slot's mark is an address bit"
            )
        };
        let header = header.as_ptr().cast_const();
        let key = if self.vacant != NO_VACANT {
            let key = self.vacant;
            self.vacant = self.slots[key].addr() >> 1;
            self.slots[key] = header;
            key
        } else {
            let key = self.slots.len();
            if key >= NOT_LISTED as usize {
                return None;
            }
            self.slots.push(header);
            key
        };
        self.listed += 1;
        Some(key as u32)
    }

    /// Unlists the work in slot `key`. A shrink that follows moves listed works to other
    /// slots and tells `rekey` each one's new slot.
    pub(crate) fn remove(&mut self, key: u32, rekey: impl FnMut(NonNull<H>, u32)) {
        let key = key as usize;
        debug_assert_eq!(self.slots[key].addr() & VACANT, 0, "slot {key} was listed");
        self.slots[key] = std::ptr::without_provenance((self.vacant << 1) | VACANT);
        self.vacant = key;
        self.listed -= 1;
        if self.slots.len() >= MIN_SHRINK_SLOTS && self.listed * 4 <= self.slots.len() {
            self.shrink(rekey);
        }
    }

    /// Moves the listed works to the front and frees the rest.
    fn shrink(&mut self, mut rekey: impl FnMut(NonNull<H>, u32)) {
        let mut kept = 0;
        for key in 0..self.slots.len() {
            let header = self.slots[key];
            if header.addr() & VACANT != 0 {
                continue;
            }
            self.slots[kept] = header;
            rekey(
                NonNull::new(header.cast_mut()).expect("a listed header is not null"),
                kept as u32,
            );
            kept += 1;
        }
        self.slots.truncate(kept);
        self.slots.shrink_to(kept * 2);
        self.vacant = NO_VACANT;
    }

    /// Every listed work's header.
    pub(crate) fn each(&self, mut f: impl FnMut(NonNull<H>)) {
        for &header in &self.slots {
            if header.addr() & VACANT == 0 {
                f(NonNull::new(header.cast_mut()).expect("a listed header is not null"));
            }
        }
    }
}
