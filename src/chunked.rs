//! [`Scheduler::run_chunked`]: a big job split into chunks that low-priority helpers run
//! alongside the caller (padata's `padata_do_multithreaded`, ktask).
//!
//! # Design
//!
//! - **Chunking** follows padata: `chunk = max(len / (threads × 4), min_chunk)`, four
//!   chunks per participating thread so a slow thread (a helper at nice 19 on a busy
//!   machine) holds up at most a quarter of its share. Chunks are claimed from one atomic
//!   counter, so each index is handed out exactly once, to whoever asks first.
//! - **Who runs it:** the caller claims chunks at its own priority; up to
//!   [`workers`](Scheduler::workers) helpers are one-shot [`Work`]s on the scheduler and
//!   claim chunks at the scheduler's priority. When the caller runs out of chunks it
//!   [`flush`](Work::flush)es every helper: a helper that has not started runs on the
//!   caller (and finds nothing left); one in the middle of a chunk is waited for, raised
//!   to the caller's nice where the process may (priority lending).
//! - **Stopping:** the first error or panic sets a stop flag that every thread checks
//!   before claiming the next chunk, so only chunks already in flight finish. A panic is
//!   caught where it happens (a helper never unwinds into the worker) and resumed on the
//!   caller once every helper is done; it wins over an error.
//! - **Borrowing:** the closure may borrow from the caller's stack, as with
//!   `std::thread::scope`. The helpers reach the job through a lifetime-erased pointer,
//!   which is sound because `run_chunked` neither returns nor unwinds before every helper
//!   `Work` was flushed and dropped, and a dropped work's closure is gone (semantic 4).
//! - **No deadlock from a worker:** called from inside a work on the same scheduler, the
//!   caller is one of the workers. Helpers that no free worker picks up are flushed, that
//!   is run on the caller, once its own claims run dry; so the job finishes even with
//!   `workers(1)`, on the caller alone. A manual scheduler has no workers: the job runs on
//!   the caller.

use std::any::Any;
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::{Next, Scheduler, Work};

/// Chunks per participating thread (padata uses 4).
const CHUNKS_PER_THREAD: usize = 4;

/// One job, on the caller's stack.
struct Job<'f, E> {
    start: usize,
    end: usize,
    chunk: usize,
    chunks: usize,
    next_chunk: AtomicUsize,
    stop: AtomicBool,
    error: Mutex<Option<E>>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    f: &'f (dyn Fn(Range<usize>) -> Result<(), E> + Sync),
}

impl<E> Job<'_, E> {
    /// Claims and runs chunks until none are left or the job stopped.
    fn run_chunks(&self) {
        while !self.stop.load(Ordering::Acquire) {
            let index = self.next_chunk.fetch_add(1, Ordering::Relaxed);
            if index >= self.chunks {
                return;
            }
            let from = self.start + index * self.chunk;
            let to = from + self.chunk.min(self.end - from);
            match catch_unwind(AssertUnwindSafe(|| (self.f)(from..to))) {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    lock(&self.error).get_or_insert(error);
                    self.stop.store(true, Ordering::Release);
                }
                Err(payload) => {
                    lock(&self.panic).get_or_insert(payload);
                    self.stop.store(true, Ordering::Release);
                }
            }
        }
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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
    run_chunks: unsafe fn(*const ()),
}

// SAFETY: the job it points to is `Sync` (atomics, mutexes, and a `Sync` closure; `E:
// Send` makes `Mutex<Option<E>>` Sync) and outlives every use (see the module docs).
unsafe impl Send for ErasedJob {}

/// # Safety
///
/// `job` must point to a live `Job<'_, E>`.
unsafe fn run_erased<E>(job: *const ()) {
    // SAFETY: the caller passes the address of a live `Job<'_, E>`.
    let job = unsafe { &*job.cast::<Job<'_, E>>() };
    job.run_chunks();
}

impl Scheduler {
    /// Runs `f` over `range` in chunks, on the calling thread and on up to
    /// [`workers`](Self::workers) helpers at the scheduler's priority (padata's
    /// multithreaded jobs, ktask). `f` may borrow from the caller's stack.
    ///
    /// - Chunks are at least `min_chunk` long (0 counts as 1), and about four per thread
    ///   for load balance; every index of `range` is passed to `f` exactly once unless
    ///   the job stops early.
    /// - The caller runs chunks at its own priority; when none are left it lends its
    ///   priority to the helpers still running, as [`Work::flush`] does.
    /// - An empty range returns `Ok(())` at once; a range no longer than `min_chunk` runs
    ///   inline on the caller, and so does every job on a manual scheduler.
    /// - Called from inside a work of this scheduler it never deadlocks: chunks no free
    ///   worker takes run on the caller (with `workers(1)`, all of them).
    ///
    /// # Errors
    ///
    /// The first `Err` returned by `f` stops handing out chunks; `run_chunked` returns it
    /// after the chunks in flight have ended.
    ///
    /// # Panics
    ///
    /// If `f` panics, no more chunks are handed out and the panic is resumed on the
    /// caller once every helper has stopped (a helper never unwinds).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use nicework::Scheduler;
    ///
    /// let sched = Scheduler::builder().workers(2).build()?;
    /// let data: Vec<u64> = (0..100_000).collect();
    /// let sum = AtomicU64::new(0);
    /// sched.run_chunked(0..data.len(), 1_000, |range| {
    ///     sum.fetch_add(data[range].iter().sum::<u64>(), Ordering::Relaxed);
    ///     Ok::<(), ()>(())
    /// }).unwrap();
    /// assert_eq!(sum.into_inner(), 100_000 * 99_999 / 2);
    ///
    /// let failed = sched.run_chunked(0..100, 1, |range| {
    ///     if range.contains(&42) { Err("bad element") } else { Ok(()) }
    /// });
    /// assert_eq!(failed, Err("bad element"));
    /// # Ok::<(), nicework::Error>(())
    /// ```
    pub fn run_chunked<E, F>(&self, range: Range<usize>, min_chunk: usize, f: F) -> Result<(), E>
    where
        F: Fn(Range<usize>) -> Result<(), E> + Sync,
        E: Send,
    {
        if range.is_empty() {
            return Ok(());
        }
        let len = range.end - range.start;
        let min_chunk = min_chunk.max(1);
        let threads = self.workers() + 1;
        let chunk = (len / (threads * CHUNKS_PER_THREAD)).max(min_chunk);
        let chunks = len.div_ceil(chunk);
        let job = Job {
            start: range.start,
            end: range.end,
            chunk,
            chunks,
            next_chunk: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            error: Mutex::new(None),
            panic: Mutex::new(None),
            f: &f,
        };
        let helpers = self.workers().min(chunks - 1);
        if helpers > 0 {
            let erased = ErasedJob {
                job: (&job as *const Job<'_, E>).cast(),
                run_chunks: run_erased::<E>,
            };
            let works: Vec<Work> = (0..helpers)
                .map(|_| {
                    let work = self
                        .work(move |_| {
                            let erased = erased;
                            // SAFETY: the job lives until every helper work was flushed
                            // and dropped below, and a dropped work never runs again.
                            unsafe { (erased.run_chunks)(erased.job) };
                            Next::Park
                        })
                        .named("nicework.run_chunked");
                    work.schedule(Duration::ZERO);
                    work
                })
                .collect();
            job.run_chunks();
            for work in &works {
                work.flush();
            }
            // cancel_sync + the closure freed: no helper can reach `job` after this.
            drop(works);
        } else {
            job.run_chunks();
        }
        job.finish()
    }
}
