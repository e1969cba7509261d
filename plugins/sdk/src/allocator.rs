//! The allocator a plugin built with this crate uses in wasm: size classes with free lists,
//! over the system allocator.
//!
//! A plugin call allocates many small blocks and frees them all: the host lowers every string
//! of the task and the transcript with one `cabi_realloc` call into the guest each, the
//! plugin builds its result, and `cabi_post_return` frees both. With the system allocator
//! (wasi-libc's dlmalloc), a `decide` that returns at once on a 3-agent × 3-turn transcript
//! ran 12,426 wasm instructions (fuel); with this one, 5,815. Here a request of at most
//! [`SMALL_MAX`] bytes (alignment at most 16) takes a block of the next power of two (16 B
//! to 64 KiB) from that size's free list, or carves one from the current 64 KiB chunk (the
//! classes above 4 KiB take theirs from the system allocator one at a time); a free pushes
//! the block back on its list. Larger or more aligned requests go to the system allocator
//! unchanged.
//!
//! Memory. Free blocks stay on their lists for the next request of their size. When the
//! system allocator refuses a request (the plugin's memory cap), every free block of the
//! classes above 4 KiB, which came from it one by one, is given back to it and the request
//! is tried once more; the carved blocks (4 KiB and under) are kept. So a plugin can hold
//! more memory than it uses only in blocks of 4 KiB and under that it freed earlier, at
//! most what it once held in each such size (and a plugin instance is fresh at every
//! training step).
//!
//! wasm32-wasip2 is single-threaded, which is what makes the unsynchronised state sound;
//! the feature `allocator` (on by default) installs it as the global allocator in wasm
//! builds only. A plugin that wants its own allocator turns the feature off.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::ptr::{self, NonNull};

/// Number of size classes: class `k` holds blocks of `16 << k` bytes.
const CLASSES: usize = 13;
/// The smallest block (and the alignment of every block).
const MIN_BLOCK: usize = 16;
/// The largest request served from the size classes.
pub const SMALL_MAX: usize = MIN_BLOCK << (CLASSES - 1);
/// Blocks up to this size are carved from chunks; larger classes ask the system allocator
/// for each block.
const CARVED_MAX: usize = 4096;
/// The chunk the small blocks are carved from.
const CHUNK: usize = 64 * 1024;

/// Free lists per size class over a backing allocator (see the module docs).
pub struct SizeClasses<A> {
    backing: A,
    state: UnsafeCell<State>,
}

struct State {
    /// Head of each class's free list; a free block's first word points to the next.
    free: [*mut u8; CLASSES],
    /// The unused part of the current chunk.
    next: *mut u8,
    end: *mut u8,
}

// SAFETY: the state is only touched through `&self` methods that are never called
// concurrently: the global instance exists only on wasm32-wasip2 (single-threaded), and
// tests use their own instances from one thread.
unsafe impl<A: Sync> Sync for SizeClasses<A> {}

impl<A> SizeClasses<A> {
    /// An allocator with empty free lists over `backing`.
    pub const fn new(backing: A) -> Self {
        Self {
            backing,
            state: UnsafeCell::new(State {
                free: [ptr::null_mut(); CLASSES],
                next: ptr::null_mut(),
                end: ptr::null_mut(),
            }),
        }
    }
}

/// The size class of a layout, `None` when it goes to the backing allocator.
#[inline]
fn class(layout: Layout) -> Option<usize> {
    if layout.size() > SMALL_MAX || layout.align() > MIN_BLOCK {
        return None;
    }
    let size = layout.size().max(MIN_BLOCK);
    Some((usize::BITS - (size - 1).leading_zeros()) as usize - MIN_BLOCK.trailing_zeros() as usize)
}

#[inline]
fn block_size(class: usize) -> usize {
    MIN_BLOCK << class
}

impl<A: GlobalAlloc> SizeClasses<A> {
    /// A new block of class `k`: carved from the chunk, or from the backing allocator.
    #[cold]
    unsafe fn refill(&self, k: usize) -> *mut u8 {
        let size = block_size(k);
        if size > CARVED_MAX {
            return self.backing_alloc(Layout::from_size_align_unchecked(size, MIN_BLOCK));
        }
        let (next, end) = {
            let state = &*self.state.get();
            (state.next, state.end)
        };
        let block = if (end as usize) - (next as usize) >= size {
            next
        } else {
            let chunk = self.backing_alloc(Layout::from_size_align_unchecked(CHUNK, MIN_BLOCK));
            if chunk.is_null() {
                return chunk;
            }
            (*self.state.get()).end = chunk.add(CHUNK);
            chunk
        };
        (*self.state.get()).next = block.add(size);
        block
    }

    /// The backing allocator's block; when it refuses, the free blocks it gave one by one
    /// go back to it and it is asked once more.
    unsafe fn backing_alloc(&self, layout: Layout) -> *mut u8 {
        let block = self.backing.alloc(layout);
        if block.is_null() && self.release() {
            return self.backing.alloc(layout);
        }
        block
    }

    /// Gives every free block of the classes above [`CARVED_MAX`] back to the backing
    /// allocator; whether there was any.
    #[cold]
    unsafe fn release(&self) -> bool {
        let state = &mut *self.state.get();
        let mut released = false;
        for (k, head) in state.free.iter_mut().enumerate() {
            if block_size(k) <= CARVED_MAX {
                continue;
            }
            let layout = Layout::from_size_align_unchecked(block_size(k), MIN_BLOCK);
            while let Some(block) = NonNull::new(*head) {
                *head = *block.as_ptr().cast::<*mut u8>();
                self.backing.dealloc(block.as_ptr(), layout);
                released = true;
            }
        }
        released
    }
}

unsafe impl<A: GlobalAlloc> GlobalAlloc for SizeClasses<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let Some(k) = class(layout) else {
            return self.backing_alloc(layout);
        };
        let state = &mut *self.state.get();
        match NonNull::new(state.free[k]) {
            Some(block) => {
                state.free[k] = *block.as_ptr().cast::<*mut u8>();
                block.as_ptr()
            }
            None => self.refill(k),
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let Some(k) = class(layout) else {
            return self.backing.dealloc(ptr, layout);
        };
        let state = &mut *self.state.get();
        *ptr.cast::<*mut u8>() = state.free[k];
        state.free[k] = ptr;
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        match (class(layout), class(new_layout)) {
            (Some(old), Some(new)) if old == new => ptr,
            (None, None) => {
                let moved = self.backing.realloc(ptr, layout, new_size);
                if moved.is_null() && self.release() {
                    return self.backing.realloc(ptr, layout, new_size);
                }
                moved
            }
            _ => {
                let new = self.alloc(new_layout);
                if !new.is_null() {
                    ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                new
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn requests_map_to_the_next_power_of_two() {
        assert_eq!(class(layout(1, 1)), Some(0));
        assert_eq!(class(layout(16, 8)), Some(0));
        assert_eq!(class(layout(17, 1)), Some(1));
        assert_eq!(class(layout(32, 16)), Some(1));
        assert_eq!(class(layout(1000, 4)), Some(6)); // 1024
        assert_eq!(class(layout(SMALL_MAX, 1)), Some(CLASSES - 1));
        assert_eq!(class(layout(SMALL_MAX + 1, 1)), None);
        assert_eq!(class(layout(8, 32)), None);
        for size in 1..=SMALL_MAX {
            let k = class(layout(size, 1)).unwrap();
            assert!(
                block_size(k) >= size && (k == 0 || block_size(k - 1) < size),
                "{size}"
            );
        }
    }

    #[test]
    fn a_freed_block_is_the_next_one_of_its_class() {
        let a = SizeClasses::new(System);
        unsafe {
            let x = a.alloc(layout(100, 8));
            let y = a.alloc(layout(120, 8));
            assert_ne!(x, y);
            a.dealloc(x, layout(100, 8));
            // 100 and 128 bytes share the 128-byte class; 20 bytes does not.
            let z = a.alloc(layout(20, 4));
            assert_ne!(z, x);
            assert_eq!(a.alloc(layout(128, 16)), x);
            // Growing within the class keeps the block; across classes it moves the bytes.
            ptr::write_bytes(y, 7, 120);
            assert_eq!(a.realloc(y, layout(120, 8), 128), y);
            let w = a.realloc(y, layout(128, 8), 5000);
            assert_ne!(w, y);
            assert!((0..120).all(|i| *w.add(i) == 7));
            assert_eq!(
                a.alloc(layout(128, 8)),
                y,
                "the old block went back on its list"
            );
        }
    }

    /// A backing allocator that refuses beyond a budget, as a plugin's memory cap does.
    struct Budget {
        left: std::cell::Cell<usize>,
    }

    unsafe impl GlobalAlloc for Budget {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if layout.size() > self.left.get() {
                return ptr::null_mut();
            }
            self.left.set(self.left.get() - layout.size());
            System.alloc(layout)
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            self.left.set(self.left.get() + layout.size());
            System.dealloc(ptr, layout)
        }
    }

    #[test]
    fn under_a_cap_the_large_free_blocks_go_back_before_a_request_fails() {
        let a = SizeClasses::new(Budget {
            left: std::cell::Cell::new(4 * SMALL_MAX),
        });
        unsafe {
            // Three 64 KiB blocks, freed onto their list: 64 KiB of the budget left.
            let blocks: Vec<_> = (0..3).map(|_| a.alloc(layout(SMALL_MAX, 8))).collect();
            assert!(blocks.iter().all(|b| !b.is_null()));
            for b in blocks {
                a.dealloc(b, layout(SMALL_MAX, 8));
            }
            // 150 KiB goes to the backing allocator, which has room only once they are back.
            let big = a.alloc(layout(150 * 1024, 8));
            assert!(!big.is_null(), "the free 64 KiB blocks were not given back");
            // Past the cap a request still fails, with nothing left to give back.
            assert!(a.alloc(layout(200 * 1024, 8)).is_null());
            a.dealloc(big, layout(150 * 1024, 8));
        }
    }

    /// Random allocations, frees and reallocations of every size class and of the backing
    /// allocator's sizes: every live block is aligned, keeps its bytes, and overlaps no other.
    #[test]
    fn live_blocks_keep_their_bytes_and_never_overlap() {
        let a = SizeClasses::new(System);
        let mut live: Vec<(*mut u8, Layout, u8)> = Vec::new();
        let mut rng = crate::testing::Xorshift::new(0x9e37_79b9_7f4a_7c15);
        let mut next = move || rng.next_u64();
        let check = |p: *mut u8, l: Layout, tag: u8| unsafe {
            assert_eq!(p as usize % l.align(), 0);
            assert!(
                (0..l.size()).all(|i| *p.add(i) == tag),
                "block {p:?} {l:?} was overwritten"
            );
        };
        for step in 0..20_000u32 {
            let r = next();
            let tag = (step % 251) as u8;
            match r % 4 {
                0 | 1 => {
                    let size = match r % 7 {
                        0 => 1 + (next() as usize % 16),
                        1..=4 => 1 + (next() as usize % 2048),
                        5 => 1 + (next() as usize % SMALL_MAX),
                        _ => SMALL_MAX + 1 + (next() as usize % 100_000),
                    };
                    let align = [1, 2, 4, 8, 16, 32][(next() % 6) as usize];
                    let l = layout(size, align);
                    let p = unsafe { a.alloc(l) };
                    assert!(!p.is_null());
                    unsafe { ptr::write_bytes(p, tag, size) };
                    live.push((p, l, tag));
                }
                2 if !live.is_empty() => {
                    let (p, l, t) = live.swap_remove(next() as usize % live.len());
                    check(p, l, t);
                    unsafe { a.dealloc(p, l) };
                }
                3 if !live.is_empty() => {
                    let i = next() as usize % live.len();
                    let (p, l, t) = live[i];
                    check(p, l, t);
                    let size = 1 + (next() as usize % (2 * SMALL_MAX));
                    let q = unsafe { a.realloc(p, l, size) };
                    assert!(!q.is_null());
                    let nl = layout(size, l.align());
                    unsafe {
                        assert!((0..l.size().min(size)).all(|j| *q.add(j) == t));
                        ptr::write_bytes(q, tag, size);
                    }
                    live[i] = (q, nl, tag);
                }
                _ => {}
            }
        }
        let mut spans: Vec<(usize, usize)> = live
            .iter()
            .map(|&(p, l, t)| {
                check(p, l, t);
                (p as usize, p as usize + l.size())
            })
            .collect();
        spans.sort();
        assert!(
            spans.windows(2).all(|w| w[0].1 <= w[1].0),
            "two live blocks overlap"
        );
        for (p, l, _) in live {
            unsafe { a.dealloc(p, l) };
        }
    }
}
