//! The reclaim queue of a [`PerCid`](crate::PerCid): the values trims took out of their
//! slots on their way to `on_reclaim`, the callback itself, and the two ways through the
//! queue (`percid.rs` puts it together with the slots and the trims).
//!
//! - **A value is always somewhere a sum sees.** A trim queues the values it took before
//!   it lets go of the gate, so a value is in a slot, queued (both visited by readers), or
//!   in an `on_reclaim` call. Readers visit the queue too, taking one value at a time out
//!   of it while they visit it (no lock is held during the callback), so a sum misses at
//!   most the value in the callback, and a reader in a loop cannot stall the drain.
//! - **One reclaimer at a time.** Trims can run on several threads at once (the worker,
//!   exiting threads, readers), and the callback is taken out of its mutex while it runs
//!   (so that it may set another). Whichever trim finds no one draining the queue passes
//!   every queued value to the callback, one at a time, until the queue is empty. No
//!   trim waits for another's callbacks, and none finds the callback missing while
//!   another runs it.
//! - **Exactly once.** A value leaves the queue only into a reader's hands (and back) or
//!   into one callback call, after which it is dropped and `reclaiming` counts it gone.

use super::percid::Storage;
use crate::contain::contain;
use crate::sync::{Ordering, lock};

pub(super) type Reclaim<T> = Box<dyn FnMut(&mut T) + Send>;

/// The reclaim callback and the values waiting for it (see the module docs).
pub(super) struct Reclaimer<T> {
    /// Taken out while a trim runs it, so it may set another.
    pub(super) callback: Option<Reclaim<T>>,
    /// Values trims took, waiting for the callback.
    pub(super) queue: Vec<T>,
    /// Values waiting for the callback that the reader visiting the queue has seen; put
    /// back into `queue` when its visit ends (one reader at a time: the gate).
    pub(super) visited: Vec<T>,
    /// The tag of the thread passing the queue to the callback, or 0.
    pub(super) drainer: usize,
}

impl<T> Storage<T> {
    /// A reader's visit of the values queued for the callback: they are neither in a slot
    /// nor passed on yet, and a sum must not miss them. The reader takes one value at a
    /// time out of the queue while it visits it (no lock is held while `visit` runs), so a
    /// drainer can pass on every other value meanwhile, and a reader that is slow or in a
    /// loop cannot keep the queue from draining.
    pub(super) fn visit_queued(&self, visit: &mut impl FnMut(&T)) {
        /// Puts the visited values back into the queue when the visit ends, also on a panic.
        struct Merge<'s, T>(&'s Storage<T>);
        impl<T> Drop for Merge<'_, T> {
            fn drop(&mut self) {
                let mut reclaimer = lock(&self.0.reclaimer);
                let visited = std::mem::take(&mut reclaimer.visited);
                reclaimer.queue.extend(visited);
            }
        }
        /// The value being visited; into `visited` afterwards, also on a panic.
        struct Held<'s, T> {
            storage: &'s Storage<T>,
            value: Option<T>,
        }
        impl<T> Drop for Held<'_, T> {
            fn drop(&mut self) {
                if let Some(value) = self.value.take() {
                    lock(&self.storage.reclaimer).visited.push(value);
                }
            }
        }
        let _merge = Merge(self);
        loop {
            let Some(value) = lock(&self.reclaimer).queue.pop() else {
                return;
            };
            let held = Held {
                storage: self,
                value: Some(value),
            };
            if let Some(value) = &held.value {
                visit(value);
            }
        }
    }

    /// Unless a thread is passing the queue to the callback already, passes it on here
    /// (`me` is this thread's tag) until it is empty, one value at a time (see the module
    /// docs).
    pub(super) fn drain(&self, me: usize) {
        let mut reclaimer = lock(&self.reclaimer);
        if reclaimer.drainer != 0 || reclaimer.queue.is_empty() && reclaimer.visited.is_empty() {
            return;
        }
        reclaimer.drainer = me;
        let mut callback: Option<Reclaim<T>> = None;
        loop {
            // A callback set meanwhile (by the callback itself, say) takes over.
            if let Some(newer) = reclaimer.callback.take() {
                if let Some(replaced) = callback.replace(newer) {
                    // Outside the lock: its captures may call back in, or panic, as they
                    // drop.
                    drop(reclaimer);
                    contain(
                        "dropping a replaced PerCid on_reclaim callback panicked",
                        || drop(replaced),
                    );
                    reclaimer = lock(&self.reclaimer);
                    continue;
                }
            }
            let next = reclaimer.queue.pop().or_else(|| reclaimer.visited.pop());
            let Some(mut value) = next else {
                reclaimer.callback = callback;
                reclaimer.drainer = 0;
                // The memory of a shrink must not stay behind in the queue's capacity.
                reclaimer.queue = Vec::new();
                reclaimer.visited.shrink_to_fit();
                return;
            };
            drop(reclaimer);
            if let Some(callback) = callback.as_mut() {
                contain(
                    "a PerCid on_reclaim callback panicked; the slot is dropped",
                    || callback(&mut value),
                );
            }
            contain("dropping a reclaimed PerCid slot panicked", move || {
                drop(value)
            });
            self.reclaiming.fetch_sub(1, Ordering::Release);
            reclaimer = lock(&self.reclaimer);
        }
    }
}
