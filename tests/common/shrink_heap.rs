//! The heap a per-thread storage holds after its threads shrink from `peak` to
//! `survivors`, in bytes, counted by the counting allocator (`counting.rs`), which the
//! binary must install. Shared by `tests/costs/` (which asserts on it) and
//! `benches/cid.rs` (which prints it next to `thread_local`).
//!
//! The survivors are the threads that came last, so they start on the highest ids: the
//! case where a storage that does not compact keeps everything up to the peak.
#![allow(dead_code)]

use std::sync::Barrier;

use super::counting::live_bytes;

/// Heap held by the storage `make` returns (`make`'s own allocations included) once
/// `peak` threads used it at the same time (`touch`) and all but the last `survivors`
/// exited. The survivors touch it again, then `settle` runs (a storage's maintenance, such
/// as two compaction scans), then the heap is counted while the survivors are still alive.
///
/// Nothing else in the process may allocate meanwhile.
pub fn heap_after_shrink<S: Sync>(
    make: impl FnOnce() -> S,
    touch: impl Fn(&S) + Sync,
    settle: impl Fn(&S),
    peak: usize,
    survivors: usize,
) -> isize {
    assert!(survivors >= 1 && survivors <= peak);
    let base = live_bytes();
    let storage = make();
    let transients = peak - survivors;
    let transients_in = Barrier::new(transients + 1);
    let all_in = Barrier::new(peak + 1);
    let transients_gone = Barrier::new(survivors + 1);
    let settled = Barrier::new(survivors + 1);
    let measured = Barrier::new(survivors + 1);
    let held = std::thread::scope(|s| {
        let leaving: Vec<_> = (0..transients)
            .map(|_| {
                s.spawn(|| {
                    touch(&storage);
                    transients_in.wait();
                    all_in.wait();
                })
            })
            .collect();
        transients_in.wait();
        let staying: Vec<_> = (0..survivors)
            .map(|_| {
                s.spawn(|| {
                    touch(&storage);
                    all_in.wait();
                    transients_gone.wait();
                    // The pool goes on working on the survivors.
                    touch(&storage);
                    settled.wait();
                    measured.wait();
                })
            })
            .collect();
        all_in.wait();
        // An explicit join waits for the thread's exit, thread-local destructors included.
        for thread in leaving {
            thread.join().unwrap();
        }
        transients_gone.wait();
        settled.wait();
        settle(&storage);
        let held = live_bytes() - base;
        measured.wait();
        for thread in staying {
            thread.join().unwrap();
        }
        held
    });
    drop(storage);
    held
}
