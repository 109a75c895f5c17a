//! Waiting without blocking a thread: the future behind `Work::cancel_async` and
//! `Work::drop_async`, on `std::task` alone, so any executor can poll it.
//!
//! The call itself does what `cancel_sync` and drop do at once, under the core lock
//! (`Shared::begin_cancel`): it disarms the work and refuses re-arms. When a run is in
//! progress the future is counted among the work's cancel waiters (`CANCEL_WAITING`, as
//! a blocked `cancel_sync` is), and resolves once that run is over: `poll` registers its
//! waker in `Core::run_wakers`, and the run's completion moves it to the wakes that the
//! core lock's guard makes after releasing the lock.
//!
//! # Invariants
//!
//! - A future that resolves ends its wait (`Shared::end_cancel_wait`) exactly once, after
//!   the run it waited for; for `drop_async` it then frees the closure on the polling
//!   thread (the work is orphaned: nothing runs it again).
//! - A future dropped before it resolves never blocks. If the run is still going on it
//!   ends its wait as it leaves: the run's own re-arm stays refused (`REARM_REFUSED`)
//!   and, for `drop_async`, the work is orphaned while running, so the runner frees the
//!   closure when the callback returns, as for a work dropped inside its own callback.
//!   If the run already ended, the drop frees the closure itself.
//! - A future blocks no thread, so it closes no wait cycle: it is the remedy for a wait
//!   that would stall an executor thread.
//! - It lends priority as a blocked `cancel_sync` does (see `lending`): each poll that
//!   finds the run still going on, from a thread that has not lent to it yet, raises the
//!   worker running it to that thread's nice where the process may, for the rest of that
//!   run; the worker puts itself back when the run completes, whether or not the future
//!   is still there. A later poller with a lower priority does not lower it: a worker is
//!   only moved up by waiters, and back down by itself.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use crate::priority;
use crate::scheduler::WorkRef;
use crate::scheduler::shared::{CoreGuard, RunWaker, Shared};
use crate::scheduler::wait::frames;
use crate::scheduler::work::cancel::{CancelStart, Release, Waiter};

/// Tells the futures' waker registrations apart.
static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// The wait of a `cancel_async` or `drop_async` call for the run in progress.
pub(crate) struct CancelWait {
    shared: Arc<Shared>,
    /// The work waited for; `None` once the wait is over (or there was none).
    work: Option<WorkRef>,
    /// Whether the work was pending when the call came (the result).
    was_pending: bool,
    /// `drop_async`: the closure is freed when the wait ends.
    released: bool,
    /// The run count that means the awaited run is over.
    done_at: u64,
    id: usize,
    /// The threads that lent their priority to the awaited run (each lends once).
    lenders: Vec<priority::Tid>,
}

// === `impl Shared`, this file's part: the waits of `cancel_async` and `drop_async`, and
// their wakers. ===
impl Shared {
    /// Disarms and refuses re-arms now; the returned future waits for a run in progress.
    /// A released handle's closure is freed now if no run is in progress, else when the
    /// wait ends (or by the runner, if the future is dropped first).
    pub(crate) fn cancel_without_blocking(
        self: &Arc<Self>,
        work: &WorkRef,
        release: Release,
    ) -> CancelWait {
        let released = release != Release::Keep;
        let mut wait = CancelWait {
            shared: self.clone(),
            work: None,
            was_pending: false,
            released,
            done_at: 0,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            lenders: Vec::new(),
        };
        let Some(mut core) = self.lock_unless_forked() else {
            if released {
                // As a drop in a `fork()`ed child: the closure may be running in the
                // parent's copy of a worker that does not exist here; keep it (leaked).
                std::mem::forget(work.clone());
            }
            return wait;
        };
        match self.begin_cancel(&mut core, work, release, Waiter::Async) {
            CancelStart::Done {
                was_pending,
                drop_closure,
            } => {
                drop(core);
                wait.was_pending = was_pending;
                if drop_closure {
                    self.end_life(work);
                }
            }
            CancelStart::Refused { was_pending, cycle } => {
                drop(core);
                wait.was_pending = was_pending;
                cycle.report();
            }
            CancelStart::Waiting { was_pending, .. } => {
                wait.was_pending = was_pending;
                wait.done_at = work.header().stats.runs() + 1;
                wait.work = Some(work.clone());
            }
        }
        wait
    }
}

impl CancelWait {
    /// Whether the awaited run is over; call under the core lock.
    fn run_over(work: &WorkRef, done_at: u64) -> bool {
        !work.header().state.load().is_running() || work.header().stats.runs() >= done_at
    }

    /// Ends the wait (under the lock), then frees a released closure if the run is over.
    fn finish(&mut self) {
        if self.work.is_none() {
            return;
        }
        match self.shared.lock_unless_forked() {
            Some(core) => {
                let work = self.work.take().expect("checked above");
                Self::end_wait(
                    &self.shared,
                    core,
                    work,
                    self.id,
                    self.released,
                    self.done_at,
                );
            }
            None => std::mem::forget(self.work.take()),
        }
    }

    /// [`finish`](Self::finish) with the core lock held already.
    fn end_wait(
        shared: &Shared,
        mut core: CoreGuard<'_>,
        work: WorkRef,
        id: usize,
        released: bool,
        done_at: u64,
    ) {
        core.run_wakers.retain(|waiter| waiter.id != id);
        let over = Self::run_over(&work, done_at);
        shared.end_cancel_wait(&mut core, &work, released);
        drop(core);
        if over && released {
            shared.end_life(&work);
        }
    }
}

impl Future for CancelWait {
    type Output = bool;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let this = &mut *self;
        let Some(work) = &this.work else {
            return Poll::Ready(this.was_pending);
        };
        let Some(mut core) = this.shared.lock_unless_forked() else {
            return Poll::Ready(this.was_pending);
        };
        if Self::run_over(work, this.done_at) {
            let work = this.work.take().expect("checked above");
            Self::end_wait(
                &this.shared,
                core,
                work,
                this.id,
                this.released,
                this.done_at,
            );
            return Poll::Ready(this.was_pending);
        }
        let address = frames::address(work);
        match core
            .run_wakers
            .iter_mut()
            .find(|waiter| waiter.id == this.id)
        {
            Some(waiter) => waiter.waker.clone_from(cx.waker()),
            None => core.run_wakers.push(RunWaker {
                work: address,
                id: this.id,
                waker: cx.waker().clone(),
            }),
        }
        // Lend this thread's priority to the worker running it, as `cancel_sync` does:
        // an executor thread awaiting a drop must not wait on a starved nice-19 run.
        let tid = priority::current_tid();
        let lent = if !this.lenders.contains(&tid) {
            this.lenders.push(tid);
            core.lending.lend_from_current_thread(address)
        } else {
            Ok(())
        };
        drop(core);
        if let Err(failure) = lent {
            failure.log();
        }
        Poll::Pending
    }
}

impl Drop for CancelWait {
    fn drop(&mut self) {
        self.finish();
    }
}

/// `drop_async`'s future: a [`CancelWait`] whose result is `()`. Polled again after it
/// resolved it stays ready, as `cancel_async`'s does.
pub(crate) struct DropWait(pub(crate) CancelWait);

impl Future for DropWait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}
