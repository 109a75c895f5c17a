//! The reader protocol: [`PerCid::for_each`](crate::PerCid::for_each) beside owners in
//! `with` and beside trims, with the owner's side free of atomic read-modify-write.
//!
//! # Reader against owner
//!
//! A slot has two words: `borrowed`, written only by the id's owner, and `reading`,
//! written only by a reader holding the gate. It is the pin protocol of `mod.rs` again,
//! with the reader in the reclaimer's place: the reader sets a flag and pays for the
//! barrier, the owner stores and loads.
//!
//! ```text
//!  owner (`with` on its pinned id's slot)        reader (`for_each`, holding the gate)
//!  ──────────────────────────────────────        ─────────────────────────────────────
//!  borrowed := 1                        (B)      every linked slot: reading := FLAGGED (F)
//!  light barrier                                 heavy barrier (membarrier)
//!  if reading != IDLE (acquire):        (L)      for each slot:
//!    borrowed := 0 (release), notify,              under the gate lock, if borrowed != 0:
//!    wait until reading == IDLE, retry B             the later slots := IDLE, notify    (U)
//!  f(&mut value)                                     wait while borrowed != 0 (acq.)    (W)
//!  borrowed := 0 (release)              (E)        reading := VISITING; f(&value)
//!  light barrier                                   under the gate lock:
//!  if reading != IDLE: notify           (N)          reading := IDLE (release), notify  (D)
//!    (under the gate lock)                         after a U: F and the heavy barrier
//!                                                    again for the later slots
//! ```
//!
//! - **Exclusion.** B→L and F→W are store→load pairs, and the heavy barrier puts a full
//!   fence on the owner's side between them, so either L sees the flag (the owner backs
//!   off before touching the value) or W sees the borrow (the reader waits for E). A
//!   reader therefore visits a slot only while no owner is between B and E, and an owner
//!   whose B comes after the reader's W saw 0 sees the flag at L and waits for D.
//! - **Visibility.** E (release) → W (acquire) orders the owner's writes before the
//!   visit; D (release) → L (acquire) orders the visit before the owner's next writes.
//! - **No lost wakeup.** A reader waits at W only after it saw `borrowed == 1` after the
//!   heavy barrier. The store of 1 it saw is either a B after the owner's fence point,
//!   whose L then sees the flag and backs off (storing 0, then notifying under the gate
//!   lock), or a B before it whose E is after it (else the reader would have seen E's
//!   0), and then N after it sees the flag and notifies under the gate lock. The reader
//!   checks `borrowed` under that lock, so the notify cannot fall between its check and
//!   its wait. An owner waits at L under the gate lock for `reading == IDLE`, which D
//!   writes under the same lock.
//! - **Waiting for one owner at a time.** While the reader waits at W for one owner, no
//!   other slot is flagged (U cleared the later ones; the earlier ones are done): an
//!   owner inside `with` may wait for another owner's `with` (a barrier, a channel)
//!   without a deadlock. Each U costs one more heavy barrier, paid only when the reader
//!   meets a slot in use.
//! - **Owner cost.** `with` adds a relaxed store (B), an acquire load (L), a release store
//!   (E), a relaxed load (N) and two compiler fences (real fences only where membarrier is
//!   unavailable) to the pin protocol: plain moves on x86, no read-modify-write, no lock,
//!   unless a reader has flagged its slot.
//!
//! # Reader against trim
//!
//! A trim takes values out of slots and frees arrays, so it must not run beside a
//! reader. Both take the **gate**, a flag under a mutex: a reader holds it for its whole
//! pass, a trim only while it detaches values and arrays under the space lock (no user
//! code). Its `on_reclaim` calls run after it let go (`percid.rs`).
//!
//! **A trim never waits for a reader.** A reader can wait for owners, and owners for
//! anything (the compaction work's next run, a thread's exit, the reader's callback), and
//! trims run on the scheduler's worker and on exiting threads. A trim that finds a reader
//! holding the gate marks the gate `trim_deferred` and returns; the reader that holds the
//! gate then detaches the values and arrays itself once it let go (`PerCid::for_each`;
//! no user code), so a reader calling `for_each` in a loop cannot starve the trim (and
//! memory), and the compaction work passes the values to `on_reclaim` at its next run. A
//! trim waits only for another trim's detach, and new readers wait behind waiting trims.
//!
//! # Re-entrancy on one thread
//!
//! - `for_each` inside `with` on the same `PerCid`: the reader would wait at W for its
//!   own borrow. It panics before flagging anything.
//! - `with` inside `for_each`'s callback: the owner is the reader's own thread. A slot
//!   only `FLAGGED` is not being read (the reader is on this thread's stack, elsewhere),
//!   so the owner goes on; a slot `VISITING` is behind the `&T` the callback holds, so
//!   `with` panics.
//! - `for_each` inside `for_each`'s callback: the gate is held by this thread; it panics
//!   instead of waiting for itself. Inside `on_reclaim` it works: the trim let go first.
//!
//! A `for_each` inside `with` on *another* `PerCid` waits for that one's owners, and a
//! `with` inside a `for_each` callback waits for another `PerCid`'s reader that flagged
//! its slot (FLAGGED blocks owners as VISITING does), like a lock taken under another
//! lock: two threads nesting two `PerCid`s in opposite orders deadlock, as with two
//! `RwLock`s. The docs of `for_each` say so.
//!
//! A trim on the reader's own thread (once the scheduler is gone a thread's exit trims,
//! and a `for_each` callback can release an id) is deferred like any other.

use super::barrier;
use super::slots::Slot;
use crate::sync::{AtomicUsize, Condvar, Mutex, Ordering, lock, thread_local, wait};

/// `Slot::reading`: no reader is interested.
pub(super) const IDLE: u32 = 0;
/// `Slot::reading`: a reader will visit the slot; an owner waits for `IDLE`.
pub(super) const FLAGGED: u32 = 1;
/// `Slot::reading`: a reader's callback holds `&T` to the value.
pub(super) const VISITING: u32 = 2;

thread_local! {
    // loom's thread_local! has no `const { }` form, and this must build with both.
    #[allow(clippy::missing_const_for_thread_local)]
    static THREAD_TAG: std::cell::Cell<usize> = std::cell::Cell::new(0);
}

/// A number no other thread has (0 and 1 are never given out): drawn from a counter at
/// the thread's first reader-protocol call. Only cold paths ask for it. A std atomic: it
/// is not part of any modelled protocol, and loom's thread-local addresses can repeat.
pub(super) fn thread_tag() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(2);
    THREAD_TAG
        .try_with(|tag| {
            if tag.get() == 0 {
                tag.set(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            }
            tag.get()
        })
        // Only loom destroys this local (std's has no destructor); such a late caller
        // gets a tag no reader holds.
        .unwrap_or(1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    Free,
    Reader(usize),
    Trim(usize),
}

#[derive(Debug)]
struct GateState {
    holder: Holder,
    /// Trims waiting for the gate (behind another trim); new readers wait behind them.
    trims_waiting: usize,
    /// A trim found a reader holding the gate and left its work to it.
    trim_deferred: bool,
}

/// Excludes readers and trims of one storage from each other, and carries the wakeups of
/// the reader protocol. Tags (the legend is in `sync`): `G:` under `state`, the gate's
/// own lock; `A:` atomic, with its writers named.
#[derive(Debug)]
pub(super) struct Gate {
    /// G: who holds the gate, and who waits for it.
    state: Mutex<GateState>,
    /// Signalled whenever the holder changes, a slot is released by a reader (D), or an
    /// owner lets go of a flagged slot (L, N).
    changed: Condvar,
    /// A: the thread tag of the reader holding the gate (0: none); written by that reader
    /// under `state`, read by owners in their cold path.
    reader: AtomicUsize,
}

impl Gate {
    pub(super) fn new() -> Self {
        Gate {
            state: Mutex::new(GateState {
                holder: Holder::Free,
                trims_waiting: 0,
                trim_deferred: false,
            }),
            changed: Condvar::new(),
            reader: AtomicUsize::new(0),
        }
    }

    /// Takes the gate for a reader.
    ///
    /// # Panics
    ///
    /// If this thread holds it already (a `for_each` inside `for_each` on the same
    /// storage).
    pub(super) fn enter_reader(&self) -> GateHold<'_> {
        let me = thread_tag();
        let mut state = lock(&self.state);
        loop {
            match state.holder {
                Holder::Reader(tag) if tag == me => panic!(
                    "PerCid::for_each called from inside a for_each callback on the same \
                     PerCid; collect what you need and iterate again after it returns"
                ),
                Holder::Free if state.trims_waiting == 0 => break,
                _ => state = wait(&self.changed, state),
            }
        }
        state.holder = Holder::Reader(me);
        self.reader.store(me, Ordering::Relaxed);
        GateHold { gate: self }
    }

    /// Takes the gate for a trim, ahead of readers that come later; `None` if a reader
    /// holds it: the trim is deferred to that reader (see the module docs), never
    /// waited for. Waits only while another trim detaches.
    pub(super) fn enter_trim(&self) -> Option<GateHold<'_>> {
        let me = thread_tag();
        let mut state = lock(&self.state);
        loop {
            match state.holder {
                Holder::Free => break,
                // A trim holds the gate only while it detaches, which runs no user code and
                // cannot come back here on its own thread.
                Holder::Trim(tag) => debug_assert_ne!(tag, me),
                Holder::Reader(_) => {
                    state.trim_deferred = true;
                    return None;
                }
            }
            state.trims_waiting += 1;
            state = wait(&self.changed, state);
            state.trims_waiting -= 1;
        }
        // This trim does the work of any deferred one.
        state.trim_deferred = false;
        state.holder = Holder::Trim(me);
        Some(GateHold { gate: self })
    }

    /// For a reader that has let go of the gate: whether a trim was deferred to it and no
    /// one else has the gate now (then the caller runs the trim; otherwise the reader or
    /// trim holding the gate takes care of it).
    pub(super) fn take_deferred_trim(&self) -> bool {
        let mut state = lock(&self.state);
        if state.holder == Holder::Free && state.trim_deferred {
            state.trim_deferred = false;
            true
        } else {
            false
        }
    }

    /// The owner's side after it saw `reading != IDLE` at L (its `borrowed` is 1): waits
    /// until the reader is done with the slot, then borrows it again (B, barrier, L).
    ///
    /// # Panics
    ///
    /// If this thread is the reader and its callback is visiting this very slot.
    #[cold]
    #[inline(never)]
    pub(super) fn wait_for_reader<T>(&self, slot: &Slot<T>) {
        assert!(
            self.try_wait_for_reader(slot),
            "PerCid::with called from inside a for_each callback on the slot that \
             callback is visiting (the calling thread's own slot); use the `&T` \
             for_each passed"
        );
    }

    /// [`wait_for_reader`](Self::wait_for_reader), but `false` at once, with the slot
    /// still borrowed, if this thread is the reader and its callback is visiting this
    /// very slot (waiting would wait for itself).
    #[cold]
    #[inline(never)]
    pub(super) fn try_wait_for_reader<T>(&self, slot: &Slot<T>) -> bool {
        loop {
            let reading = slot.reading.load(Ordering::Acquire);
            if reading == IDLE {
                return true;
            }
            if self.reader.load(Ordering::Relaxed) == thread_tag() {
                // This thread is the reader, somewhere up its own stack: a slot it only
                // flagged is not being read.
                return reading != VISITING;
            }
            slot.borrowed.store(0, Ordering::Release);
            let mut state = lock(&self.state);
            // A reader may be waiting at W for the borrow we just dropped.
            self.changed.notify_all();
            while slot.reading.load(Ordering::Acquire) != IDLE {
                state = wait(&self.changed, state);
            }
            drop(state);
            slot.borrowed.store(1, Ordering::Relaxed);
            barrier::light();
        }
    }

    /// Whether this thread holds the gate as a reader: it is inside a `for_each` callback
    /// of this storage, somewhere up its stack.
    pub(super) fn is_read_by_this_thread(&self) -> bool {
        // Only this thread stores its own tag here, so a match is not stale.
        self.reader.load(Ordering::Relaxed) == thread_tag()
    }

    /// The owner's side at N: a reader flagged the slot while it was borrowed and may be
    /// waiting at W.
    #[cold]
    #[inline(never)]
    pub(super) fn wake_reader(&self) {
        let _state = lock(&self.state);
        self.changed.notify_all();
    }
}

/// The gate, held; let go on drop (also when a callback panics).
#[derive(Debug)]
pub(super) struct GateHold<'a> {
    gate: &'a Gate,
}

impl GateHold<'_> {
    /// The reader's pass over `slots` (F, the heavy barrier, then W, visit, D per slot;
    /// U and F again around a wait). `visit` is called for every slot that holds a value,
    /// with no lock held.
    pub(super) fn read<'s, T: 's>(
        &self,
        slots: impl Iterator<Item = &'s Slot<T>> + Clone,
        mut visit: impl FnMut(&T),
    ) {
        for slot in slots.clone() {
            slot.reading.store(FLAGGED, Ordering::Relaxed);
        }
        // Clears the flags of the slots not visited yet if `visit` panics, so their owners
        // are not left waiting.
        struct Unflag<'g, 's, T: 's, I: Iterator<Item = &'s Slot<T>>> {
            rest: I,
            gate: &'g Gate,
        }
        impl<'s, T: 's, I: Iterator<Item = &'s Slot<T>>> Drop for Unflag<'_, 's, T, I> {
            fn drop(&mut self) {
                let _state = lock(&self.gate.state);
                for slot in &mut self.rest {
                    slot.reading.store(IDLE, Ordering::Release);
                }
                self.gate.changed.notify_all();
            }
        }
        // Built before the heavy barrier, so the flags are cleared if it panics too.
        let mut pending = Unflag {
            rest: slots,
            gate: self.gate,
        };
        barrier::heavy();
        let gate = self.gate;
        while let Some(slot) = pending.rest.next() {
            let mut state = lock(&gate.state);
            let mut unflagged_later = false;
            if slot.borrowed.load(Ordering::Acquire) != 0 {
                // U: while this owner finishes, the later owners must not wait for this
                // reader (this owner may be waiting for one of them).
                for later in pending.rest.clone() {
                    later.reading.store(IDLE, Ordering::Release);
                    unflagged_later = true;
                }
                gate.changed.notify_all();
                while slot.borrowed.load(Ordering::Acquire) != 0 {
                    state = wait(&gate.changed, state);
                }
            }
            slot.reading.store(VISITING, Ordering::Relaxed);
            drop(state);
            // Un-visits the slot whether `visit` returns or panics.
            struct Done<'s, T> {
                slot: &'s Slot<T>,
                gate: &'s Gate,
            }
            impl<T> Drop for Done<'_, T> {
                fn drop(&mut self) {
                    let _state = lock(&self.gate.state);
                    self.slot.reading.store(IDLE, Ordering::Release);
                    self.gate.changed.notify_all();
                }
            }
            let done = Done { slot, gate };
            slot.value.with(|value| {
                // SAFETY: the slot is flagged and was seen not borrowed after the heavy
                // barrier, so no owner holds `&mut` to it until D (see the module docs);
                // trims are excluded by the gate.
                if let Some(value) = unsafe { &*value } {
                    visit(value);
                }
            });
            drop(done);
            if unflagged_later {
                // F and the heavy barrier again for the slots U cleared.
                for later in pending.rest.clone() {
                    later.reading.store(FLAGGED, Ordering::Relaxed);
                }
                barrier::heavy();
            }
        }
    }
}

impl Drop for GateHold<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.gate.state);
        state.holder = Holder::Free;
        self.gate.reader.store(0, Ordering::Relaxed);
        self.gate.changed.notify_all();
    }
}
