//! [`Scheduler::run_chunked`]: a big job split into chunks that low-priority helpers run
//! alongside the caller (padata's `padata_do_multithreaded`, ktask).
//!
//! # Design
//!
//! - **Chunking** follows padata: `chunk = max(len / (threads × 4), min_chunk)`, four
//!   chunks per participating thread so a slow thread (a helper at nice 19 on a busy
//!   machine) holds up at most a quarter of its share. Chunks are claimed from one atomic
//!   word holding the unclaimed interval, so each index is handed out exactly once: the
//!   caller claims from the front, helpers from the back. The two sides meet in the
//!   middle and touch memory far apart until then, which matters when the range was
//!   built in order by different threads: with glibc's malloc, objects are freed into the
//!   arena of the thread that allocated them, and two threads freeing into one arena
//!   mostly fight over its bins.
//! - **Who runs it:** the caller claims chunks at its own priority; up to
//!   [`workers`](Scheduler::workers) helpers are one-shot [`Work`]s on the scheduler and
//!   claim chunks at the scheduler's priority. When the caller runs out of chunks it
//!   [`flush`](Work::flush)es every helper: a helper that has not started runs on the
//!   caller (and finds nothing left); one in the middle of a chunk is waited for, raised
//!   to the caller's nice where the process may (priority lending).
//! - **Helpers back off.** A helper runs one chunk per run and returns
//!   [`Next::Yield`] while chunks remain, so between chunks its worker defers while every
//!   CPU is busy ([`Builder::back_off`](crate::Builder::back_off)); the caller, out of
//!   chunks, takes over a deferred helper's remaining increments through `flush`, which
//!   finds nothing left. On a busy machine the caller ends up running most chunks itself.
//! - **A worker as the caller** (a maintenance work that calls `run_chunked`) backs off
//!   between its chunks in the same way, unless a flusher lent it priority: then it runs
//!   its chunks at the flusher's nice.
//! - **Stopping:** the first error or panic sets a stop flag that every thread checks
//!   before claiming the next chunk, so only chunks already in flight finish. A panic is
//!   caught where it happens (a helper never unwinds into the worker) and resumed on the
//!   caller once every helper is done; it wins over an error.
//! - **Borrowing:** the closure may borrow from the caller's stack, as with
//!   `std::thread::scope`. The helpers reach the job through a lifetime-erased pointer,
//!   which is sound because `run_chunked` neither returns nor unwinds before every helper
//!   `Work` was flushed and dropped, and a dropped work's closure is gone. That last wait
//!   is unconditional: helpers run their chunks on behalf of the caller's callbacks
//!   (`frames::Frame::on_behalf`), so a helper that waits for the caller's work does not
//!   wait (as inside the own callback), and the caller's wait for a helper never closes
//!   a wait cycle.
//! - **No deadlock from a worker:** called from inside a work on the same scheduler, the
//!   caller is one of the workers. Helpers that no free worker picks up are flushed, that
//!   is run on the caller, once its own claims run dry; so the job finishes even with
//!   `workers(1)`, on the caller alone. A manual scheduler has no workers: the job runs on
//!   the caller.

use std::any::Any;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::scheduler::backoff::Backoff;
use crate::scheduler::wait::frames;
use crate::sync::lock_std;
use crate::{Next, Scheduler, Work};

/// Which end of the unclaimed chunks a thread takes from.
#[derive(Clone, Copy)]
enum End {
    /// The caller, from the front.
    Front,
    /// The helpers, from the back.
    Back,
}

/// Chunks per participating thread (padata uses 4).
const CHUNKS_PER_THREAD: usize = 4;

/// One job, on the caller's stack.
/// One `run_chunked` call, shared by the caller and its helpers. Each field is tagged with
/// what guards it (see the legend in `sync`; here `I:` means set before any helper
/// starts).
struct Job<'f, E> {
    /// I: the range and the chunk length.
    start: usize,
    /// I: as `start`.
    end: usize,
    /// I: as `start`.
    chunk: usize,
    /// A: unclaimed chunks are `front..back`: `front` in the high half, `back` in the low;
    /// claimed by compare-exchange from either end.
    unclaimed: AtomicU64,
    /// A: set by the first error or panic; every thread checks it before claiming.
    stop: AtomicBool,
    /// T: the first error.
    error: Mutex<Option<E>>,
    /// T: the first panic's payload.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// I: the caller's closure.
    f: &'f (dyn Fn(Range<usize>) -> Result<(), E> + Sync),
}

impl<E> Job<'_, E> {
    /// Claims and runs chunks until none are left or the job stopped.
    fn run_chunks(&self, end: End) {
        while self.run_one_chunk(end) {}
    }

    /// Claims the next chunk from one end of the unclaimed ones.
    fn claim(&self, end: End) -> Option<usize> {
        let mut unclaimed = self.unclaimed.load(Ordering::Relaxed);
        loop {
            let (front, back) = (unclaimed >> 32, unclaimed & u64::from(u32::MAX));
            if front >= back {
                return None;
            }
            let (claimed, next) = match end {
                End::Front => (front, unclaimed + (1 << 32)),
                End::Back => (back - 1, unclaimed - 1),
            };
            match self.unclaimed.compare_exchange_weak(
                unclaimed,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(claimed as usize),
                Err(actual) => unclaimed = actual,
            }
        }
    }

    /// Claims and runs one chunk; returns whether more may be left.
    fn run_one_chunk(&self, end: End) -> bool {
        if self.stop.load(Ordering::Acquire) {
            return false;
        }
        let Some(index) = self.claim(end) else {
            return false;
        };
        {
            let from = self.start + index * self.chunk;
            let to = from + self.chunk.min(self.end - from);
            match catch_unwind(AssertUnwindSafe(|| (self.f)(from..to))) {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    lock_std(&self.error).get_or_insert(error);
                    self.stop.store(true, Ordering::Release);
                }
                Err(payload) => {
                    self.stop.store(true, Ordering::Release);
                    let mut first = lock_std(&self.panic);
                    if first.is_none() {
                        *first = Some(payload);
                    } else {
                        // Only the first panic is resumed. Dropping a payload runs user
                        // code that may panic again: do it outside the lock, contained.
                        drop(first);
                        crate::contain::drop_payload(payload);
                    }
                }
            }
        }
        true
    }

    /// The job's result, once no helper touches it any more.
    fn finish(self) -> Result<(), E> {
        if let Some(payload) = into_inner(self.panic) {
            resume_unwind(payload);
        }
        match into_inner(self.error) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

fn into_inner<T>(mutex: Mutex<T>) -> T {
    mutex
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A job as the helpers see it: its address and a function that runs its chunks, with
/// the job's lifetime and error type erased.
#[derive(Clone, Copy)]
struct ErasedJob {
    job: *const (),
    run_one_chunk: unsafe fn(*const ()) -> bool,
    /// The caller's running works (see `frames::Frame::on_behalf`), in a `Vec` that lives
    /// as long as the job.
    caller_frames: *const [frames::RunningWork],
}

// SAFETY: the job it points to is `Sync` (atomics, mutexes, and a `Sync` closure; `E:
// Send` makes `Mutex<Option<E>>` Sync) and outlives every use (see the module docs).
unsafe impl Send for ErasedJob {}

/// # Safety
///
/// `job` must point to a live `Job<'_, E>`.
unsafe fn run_one_erased<E>(job: *const ()) -> bool {
    // SAFETY: the caller passes the address of a live `Job<'_, E>`.
    let job = unsafe { &*job.cast::<Job<'_, E>>() };
    job.run_one_chunk(End::Back)
}

/// The caller's share of the chunks. A caller that is one of this scheduler's own
/// workers is maintenance work itself: like the helpers, it backs off between chunks
/// while every CPU is busy, unless a flusher lent it priority.
fn run_caller_chunks<E>(sched: &Scheduler, job: &Job<'_, E>) {
    if !(sched.backs_off() && crate::scheduler::worker::is_worker_of(sched.shared())) {
        job.run_chunks(End::Front);
        return;
    }
    let tid = crate::priority::current_tid();
    let mut backoff = Backoff::new(true);
    while job.run_one_chunk(End::Front) {
        if sched.shared().is_lent_to(tid) {
            continue;
        }
        let delay = backoff.after_yield();
        if delay > 0 {
            std::thread::sleep(Duration::from_nanos(delay));
        }
    }
}

/// [`Scheduler::run_chunked`]: the job, its helpers and the caller's share.
pub(crate) fn run_chunked<E, F>(
    sched: &Scheduler,
    range: Range<usize>,
    min_chunk: usize,
    f: F,
) -> Result<(), E>
where
    F: Fn(Range<usize>) -> Result<(), E> + Sync,
    E: Send,
{
    if range.is_empty() {
        return Ok(());
    }
    let len = range.end - range.start;
    let min_chunk = min_chunk.max(1);
    let threads = sched.workers() + 1;
    let chunk = (len / (threads * CHUNKS_PER_THREAD)).max(min_chunk);
    let chunks = len.div_ceil(chunk);
    // At most about 4 per thread (or `len` < 4 × threads when that is smaller).
    debug_assert!(chunks <= u32::MAX as usize);
    let job = Job {
        start: range.start,
        end: range.end,
        chunk,
        unclaimed: AtomicU64::new(chunks as u64),
        stop: AtomicBool::new(false),
        error: Mutex::new(None),
        panic: Mutex::new(None),
        f: &f,
    };
    let helpers = sched.workers().min(chunks - 1);
    if helpers > 0 {
        let caller_frames = frames::snapshot();
        let erased = ErasedJob {
            job: (&job as *const Job<'_, E>).cast(),
            run_one_chunk: run_one_erased::<E>,
            caller_frames: caller_frames.as_slice(),
        };
        let works: Vec<Work> = (0..helpers)
            .map(|_| {
                let work = sched
                    .work(move |_| {
                        let erased = erased;
                        // SAFETY: the frames live as long as the job, and their works
                        // keep running until every helper's run ended (see below).
                        let on_behalf = unsafe { frames::Frame::on_behalf(&*erased.caller_frames) };
                        let _entered = on_behalf.enter();
                        // SAFETY: the job lives until every helper work was flushed
                        // and dropped below with `drop_waiting`, which returns only
                        // once the helper's run ended, and a dropped work never runs
                        // again.
                        if unsafe { (erased.run_one_chunk)(erased.job) } {
                            // One chunk per run: between chunks the worker backs off
                            // while every CPU is busy.
                            Next::Yield
                        } else {
                            Next::Park
                        }
                    })
                    .named("nicework.run_chunked");
                work.schedule(Duration::ZERO);
                work
            })
            .collect();
        run_caller_chunks(sched, &job);
        for work in &works {
            work.flush();
        }
        // cancel_sync + the closure freed: no helper can reach `job` after this. The
        // wait is unconditional (memory safety rests on it); no wait cycle can pass
        // through it, since every helper runs on behalf of our frames.
        for work in works {
            work.drop_waiting();
        }
    } else {
        job.run_chunks(End::Front);
    }
    job.finish()
}
