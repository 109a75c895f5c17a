//! A global allocator that counts live heap bytes, shared by the examples, the tests and
//! the benches that report memory; a binary that wants the count installs
//! it with `#[global_allocator] static ALLOCATOR: Counting = Counting;`.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Forwards to the system allocator and counts live bytes.
pub struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

/// Heap bytes allocated and not yet freed, through [`Counting`].
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::SeqCst)
}

// SAFETY: forwards to the system allocator and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Begins one test's byte count: while the guard lives no other test that took it runs,
/// so the live bytes move only with that test's own work. A poisoned lock, from a failed
/// test, still serialises.
///
/// The test harness allocates and frees a few hundred bytes as one test ends and it
/// starts the next (the ended test's thread and output, the next one's thread), right
/// as the lock changes hands; so the guard is returned once the live bytes held still
/// for 20 ms (at most a second of waiting).
pub fn measuring() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let start = std::time::Instant::now();
    let mut last = live_bytes();
    let mut still_since = std::time::Instant::now();
    while still_since.elapsed() < std::time::Duration::from_millis(20)
        && start.elapsed() < std::time::Duration::from_secs(1)
    {
        std::thread::sleep(std::time::Duration::from_millis(2));
        let now = live_bytes();
        if now != last {
            last = now;
            still_since = std::time::Instant::now();
        }
    }
    guard
}
