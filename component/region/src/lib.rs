//! The allocator coord's guests use: a call's allocations come from a
//! region inside the module's initial memory, and only what does not fit
//! from the standard allocator.
//!
//! Why: an edge host makes a fresh instance per request. The standard
//! allocator (dlmalloc) takes its first bytes with `memory.grow`, and a
//! pooling host answers a grow by opening more of the slot (an `mprotect`)
//! and closes it again when it resets the slot for the next instance: two
//! system calls per request, the second a TLB flush on every core running
//! the host. The region is zero-initialised data, part of the memory the
//! instance starts with, so a request whose allocations fit never grows its
//! memory (measured in commit d62b8ed, which added it).
//!
//! The region is a bump allocator that starts over whenever everything
//! allocated from it has been freed, which is the case between calls when a
//! guest keeps nothing from one call to the next (coord keeps only a
//! watcher's state). Freeing the newest allocation gives its bytes back at
//! once, and growing it (a `Vec` being pushed to) extends it in place.
//! Other freed bytes wait for the region to empty. When the region is full,
//! allocations go to the standard allocator until it empties, so memory
//! stays bounded: the region's size plus what the standard allocator would
//! have used.
//!
//! A guest installs it on wasm32 only, where it has one thread:
//!
//! ```text
//! #[cfg(target_arch = "wasm32")]
//! #[global_allocator]
//! static ALLOCATOR: coord_region::Region<{ 64 * 1024 }> = coord_region::Region::new();
//! ```

// An allocator hands out raw memory: unsafe by contract.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, UnsafeCell};

/// The region's bytes, aligned for any allocation the component makes
/// without padding at its start.
#[repr(C, align(16))]
struct Bytes<const N: usize>([u8; N]);

/// A bump region of `N` bytes in front of the standard allocator.
pub struct Region<const N: usize> {
    /// The region itself.
    bytes: UnsafeCell<Bytes<N>>,
    /// Offset of the first free byte.
    top: Cell<usize>,
    /// Allocations from the region not yet freed.
    live: Cell<usize>,
}

// SAFETY: guests install the allocator only on wasm32 without the atomics
// feature, where there is one thread.
#[cfg(target_arch = "wasm32")]
unsafe impl<const N: usize> Sync for Region<N> {}

impl<const N: usize> Region<N> {
    /// An empty region.
    pub const fn new() -> Self {
        Region {
            bytes: UnsafeCell::new(Bytes([0; N])),
            top: Cell::new(0),
            live: Cell::new(0),
        }
    }

    fn base(&self) -> *mut u8 {
        self.bytes.get().cast()
    }

    /// The offset of `ptr` in the region, if it points into it.
    fn offset_of(&self, ptr: *mut u8) -> Option<usize> {
        let offset = (ptr as usize).checked_sub(self.base() as usize)?;
        (offset < N).then_some(offset)
    }
}

impl<const N: usize> Default for Region<N> {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every block handed out is either `size` bytes of the region at the
// requested alignment, below `top` and not handed out again until freed (or
// until every block is freed), or the standard allocator's, which gets back
// exactly what it handed out.
unsafe impl<const N: usize> GlobalAlloc for Region<N> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let base = self.base() as usize;
        // Alignments are powers of two; the region's base is 16-aligned.
        let start = (base + self.top.get())
            .checked_next_multiple_of(layout.align())
            .map(|aligned| aligned - base);
        let end = start.and_then(|start| start.checked_add(layout.size()));
        match (start, end) {
            (Some(start), Some(end)) if end <= N => {
                self.top.set(end);
                self.live.set(self.live.get() + 1);
                // SAFETY: start <= end <= N, inside the region.
                unsafe { self.base().add(start) }
            }
            // SAFETY: the caller's layout, passed on unchanged.
            _ => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(offset) = self.offset_of(ptr) else {
            // SAFETY: not the region's, so the standard allocator's block.
            return unsafe { System.dealloc(ptr, layout) };
        };
        let live = self.live.get() - 1;
        self.live.set(live);
        if live == 0 {
            self.top.set(0);
        } else if offset + layout.size() == self.top.get() {
            self.top.set(offset);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Some(offset) = self.offset_of(ptr) else {
            // SAFETY: the standard allocator's block stays with it.
            return unsafe { System.realloc(ptr, layout, new_size) };
        };
        // The newest block grows or shrinks where it is, when it fits.
        if offset + layout.size() == self.top.get()
            && offset.checked_add(new_size).is_some_and(|end| end <= N)
        {
            self.top.set(offset + new_size);
            return ptr;
        }
        // SAFETY: the caller guarantees `new_size` is valid for `layout.align()`.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: a non-zero size, as `realloc`'s contract requires.
        let moved = unsafe { self.alloc(new_layout) };
        if !moved.is_null() {
            // SAFETY: both blocks are live, distinct, and at least this long.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).expect("a valid layout")
    }

    #[test]
    fn blocks_are_aligned_distinct_and_inside_the_region() {
        let region = Region::<256>::new();
        unsafe {
            let a = region.alloc(layout(3, 1));
            let b = region.alloc(layout(8, 8));
            let c = region.alloc(layout(16, 16));
            for (p, align) in [(a, 1), (b, 8), (c, 16)] {
                assert!(region.offset_of(p).is_some(), "in the region");
                assert_eq!(p as usize % align, 0, "aligned to {align}");
            }
            assert!(b as usize >= a as usize + 3 && c as usize >= b as usize + 8);
            a.write_bytes(0xaa, 3);
            b.write_bytes(0xbb, 8);
            c.write_bytes(0xcc, 16);
            assert_eq!(*a.add(2), 0xaa);
            assert_eq!(*b.add(7), 0xbb);
        }
    }

    #[test]
    fn the_region_starts_over_once_every_block_is_freed() {
        let region = Region::<256>::new();
        unsafe {
            let a = region.alloc(layout(40, 8));
            let b = region.alloc(layout(40, 8));
            region.dealloc(a, layout(40, 8));
            // b is still live: a's bytes are not handed out again.
            let c = region.alloc(layout(8, 8));
            assert!(c as usize >= b as usize + 40);
            region.dealloc(b, layout(40, 8));
            region.dealloc(c, layout(8, 8));
            assert_eq!(region.top.get(), 0);
            assert_eq!(region.alloc(layout(8, 8)), a, "the first block again");
        }
    }

    #[test]
    fn freeing_the_newest_block_gives_its_bytes_back() {
        let region = Region::<256>::new();
        unsafe {
            let _a = region.alloc(layout(16, 8));
            let b = region.alloc(layout(16, 8));
            region.dealloc(b, layout(16, 8));
            assert_eq!(region.alloc(layout(16, 8)), b);
        }
    }

    #[test]
    fn the_newest_block_grows_in_place_and_an_older_one_moves() {
        let region = Region::<256>::new();
        unsafe {
            let a = region.alloc(layout(8, 8));
            a.write_bytes(7, 8);
            let grown = region.realloc(a, layout(8, 8), 64);
            assert_eq!(grown, a, "in place");
            let b = region.alloc(layout(8, 8));
            let moved = region.realloc(a, layout(64, 8), 100);
            assert!(moved != a && moved as usize > b as usize, "moved past b");
            assert_eq!(
                std::slice::from_raw_parts(moved, 8),
                &[7; 8],
                "contents kept"
            );
        }
    }

    #[test]
    fn what_does_not_fit_goes_to_the_standard_allocator_and_back() {
        let region = Region::<64>::new();
        unsafe {
            let small = region.alloc(layout(48, 8));
            let big = region.alloc(layout(32, 8));
            assert!(region.offset_of(small).is_some());
            assert!(region.offset_of(big).is_none(), "past the region");
            big.write_bytes(1, 32);
            // Growing a block that outgrows the region moves it out, intact;
            // the standard allocator's blocks stay with it.
            small.write_bytes(2, 48);
            let moved = region.realloc(small, layout(48, 8), 200);
            assert!(region.offset_of(moved).is_none());
            assert_eq!(std::slice::from_raw_parts(moved, 48), &[2; 48]);
            let big = region.realloc(big, layout(32, 8), 300);
            assert!(region.offset_of(big).is_none());
            assert_eq!(std::slice::from_raw_parts(big, 32), &[1; 32]);
            region.dealloc(big, layout(300, 8));
            region.dealloc(moved, layout(200, 8));
            assert_eq!(region.top.get(), 0, "empty again");
            assert!(region.offset_of(region.alloc(layout(48, 8))).is_some());
        }
    }
}
