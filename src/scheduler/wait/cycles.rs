//! The process-wide wait-for graph: which callbacks are blocked waiting for which work.
//!
//! `flush`, `cancel_sync` and drop wait for a running instance to end. Called from inside
//! a callback, that wait blocks every callback on the waiting thread's frame stack (see
//! [`frames`]). Two callbacks that wait for each other, directly or through
//! a chain of other works' waits, would wait forever; the kernel only warns about this
//! (lockdep), nicework breaks the cycle.
//!
//! # Protocol
//!
//! - A thread that is about to wait from inside a callback registers an edge: "the works
//!   on my frame stack wait for `target`". Registration and the cycle check happen
//!   together under one process-wide lock, so of two threads closing a cycle the second
//!   one to register sees the first one's edge.
//! - The check searches the edges from `target`: every waiter whose frames hold `target`
//!   (where `target` is executing, or a `run_chunked` helper running on its behalf) waits
//!   for its own target, and so on. Reaching one of our own frames means the wait would
//!   close a cycle: the caller does not wait and behaves as inside the own callback. If
//!   every path ends at a work nobody registered as waiting, those can still finish, so
//!   the caller waits.
//! - An edge stays registered for the duration of the wait (the registration is a
//!   guard), and a little longer: from the end of the awaited run until the waiter has
//!   woken and taken its scheduler's lock again. An edge knows which run it waits for
//!   (the target's run count), and the search skips edges whose run has ended, so an
//!   edge in that window never reports a cycle: its waiter waits for nobody. The waiter
//!   re-checks its condition under the scheduler's lock, so a stale edge never makes
//!   anyone wait either.
//! - A thread outside every callback registers nothing: it holds no work, so no cycle can
//!   pass through it. The common paths never touch this lock.
//!
//! Lock order: a scheduler's core lock, then this one. This lock is a leaf: nothing is
//! taken and no user code runs while it is held. A `fork()`ed child starts a fresh graph
//! (see `graph`), so a lock held by a parent thread at the fork never blocks it.

use crate::scheduler::WorkRef;
use crate::scheduler::wait::frames;
use crate::sync::{Mutex, lock};

/// One blocked thread: the works on its frame stack wait for `target`'s run to end,
/// the one that completes as `target_work`'s `done_at`-th.
#[derive(Debug)]
struct Edge {
    serial: u64,
    holds: Vec<usize>,
    target: usize,
    /// The work waited for, kept so that the edge can tell when its wait is over.
    target_work: Option<WorkRef>,
    /// The run count at which the awaited run has ended (see `Shared::wait_for_run`).
    done_at: u64,
}

impl Edge {
    /// Whether the run this edge waits for has ended: its waiter no longer waits for
    /// `target`, though it has not woken to remove the edge yet. Runs are counted under
    /// the target's core lock, before a later run of it can start, so a thread running
    /// that later run sees the count.
    fn is_over(&self) -> bool {
        self.target_work
            .as_ref()
            .is_some_and(|work| work.header().stats.runs() >= self.done_at)
    }
}

#[derive(Debug)]
struct Graph {
    next_serial: u64,
    edges: Vec<Edge>,
}

impl Graph {
    /// Whether waiting for `target` by a thread holding `mine` closes a cycle.
    fn closes_cycle(&self, mine: &[usize], target: usize) -> bool {
        // A work may be held by several blocked threads at once (a `run_chunked` caller
        // and its helpers, which run on its behalf), so this is a search over every edge
        // that holds the current work, not a walk along one chain.
        let mut seen = vec![false; self.edges.len()];
        let mut reached = vec![target];
        while let Some(current) = reached.pop() {
            if mine.contains(&current) {
                return true;
            }
            for (index, edge) in self.edges.iter().enumerate() {
                if !seen[index] && edge.holds.contains(&current) && !edge.is_over() {
                    seen[index] = true;
                    reached.push(edge.target);
                }
            }
        }
        false
    }
}

impl Graph {
    fn register(&mut self, holds: Vec<usize>, target: &WorkRef) -> Waiting {
        let serial = self.next_serial;
        self.next_serial += 1;
        self.edges.push(Edge {
            serial,
            holds,
            target: frames::address(target),
            target_work: Some(target.clone()),
            done_at: target.header().stats.runs() + 1,
        });
        Waiting {
            serial: Some(serial),
        }
    }

    const fn new() -> Graph {
        Graph {
            next_serial: 0,
            edges: Vec::new(),
        }
    }
}

/// The graph of the current fork generation. A `fork()`ed child gets a fresh one: its
/// parent's may have been locked at the fork by a thread that does not exist in the child,
/// and the parent's edges describe threads that are gone. The parent's copy is leaked in
/// the child, never freed or locked there.
#[cfg(not(all(loom, feature = "loom")))]
fn graph() -> &'static Mutex<Graph> {
    use std::sync::atomic::{AtomicPtr, Ordering};

    struct ForGeneration {
        generation: u64,
        graph: Mutex<Graph>,
    }

    static CURRENT: AtomicPtr<ForGeneration> = AtomicPtr::new(std::ptr::null_mut());
    let generation = crate::fork::generation();
    loop {
        let current = CURRENT.load(Ordering::Acquire);
        // SAFETY: a published graph is never freed (see above), so the pointer, once
        // loaded, is valid for the rest of the process.
        if let Some(published) = unsafe { current.as_ref() } {
            if published.generation == generation {
                return &published.graph;
            }
        }
        let fresh = Box::into_raw(Box::new(ForGeneration {
            generation,
            graph: Mutex::new(Graph::new()),
        }));
        match CURRENT.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: just published and never freed.
            Ok(_) => return unsafe { &(*fresh).graph },
            // SAFETY: `fresh` lost the race and was never published: it is ours alone.
            Err(_) => drop(unsafe { Box::from_raw(fresh) }),
        }
    }
}

/// Loom models never fork; loom's lazy static is reset for every execution.
#[cfg(all(loom, feature = "loom"))]
fn graph() -> &'static Mutex<Graph> {
    loom::lazy_static! {
        static ref GRAPH: Mutex<Graph> = Mutex::new(Graph::new());
    }
    &GRAPH
}

/// A registered wait; dropping it removes the edge.
#[derive(Debug)]
pub(crate) struct Waiting {
    serial: Option<u64>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(serial) = self.serial {
            let mut graph = lock(graph());
            let index = graph.edges.iter().position(|edge| edge.serial == serial);
            let edge = index.map(|index| graph.edges.swap_remove(index));
            drop(graph);
            // The edge's reference to the waited-for work may be the last one: dropped
            // outside this leaf lock.
            drop(edge);
        }
    }
}

/// Waiting for `target` would close a wait cycle. The caller reports it with
/// [`report`](Self::report) once it let go of its scheduler's lock: a `tracing`
/// subscriber is user code and may call into the scheduler.
#[derive(Debug)]
pub(crate) struct WaitCycle {
    waiting: String,
    waited_for: String,
}

impl WaitCycle {
    /// The wait is on the caller's own frame stack (the own callback): nothing to report.
    pub(crate) fn own() -> WaitCycle {
        WaitCycle {
            waiting: String::new(),
            waited_for: String::new(),
        }
    }

    /// Logs the warning that names both works (nothing for [`own`](Self::own)). Call it
    /// with no lock held.
    pub(crate) fn report(&self) {
        if self.waited_for.is_empty() {
            return;
        }
        tracing::warn!(
            waiting = %self.waiting,
            waited_for = %self.waited_for,
            "wait cycle between works: not waiting, as if called inside the own callback"
        );
    }
}

/// Registers that the calling thread is about to wait for `target`'s run in progress to
/// end, or reports that this wait would close a cycle (see [`WaitCycle::report`]). The
/// caller holds `target`'s core lock and has seen it running, and `target` is not
/// running on this thread (the caller checked [`frames::is_running_here`]).
pub(crate) fn begin_wait(target: &WorkRef) -> Result<Waiting, WaitCycle> {
    let holds = frames::running_here();
    if holds.is_empty() {
        return Ok(Waiting { serial: None });
    }
    let target_address = frames::address(target);
    let mut graph = lock(graph());
    if graph.closes_cycle(&holds, target_address) {
        drop(graph);
        return Err(WaitCycle {
            waiting: frames::innermost_name().unwrap_or_default(),
            waited_for: target.name().to_owned(),
        });
    }
    Ok(graph.register(holds, target))
}

/// Registers that the calling thread waits for `target` without checking for a cycle:
/// for a wait that must happen (see `Work::drop_waiting`). Others still see the edge, so
/// a cycle that would close through it is broken at their side.
pub(crate) fn begin_wait_unchecked(target: &WorkRef) -> Waiting {
    let holds = frames::running_here();
    if holds.is_empty() {
        return Waiting { serial: None };
    }
    lock(graph()).register(holds, target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(serial: u64, holds: &[usize], target: usize) -> Edge {
        Edge {
            serial,
            holds: holds.to_vec(),
            target,
            target_work: None,
            done_at: 0,
        }
    }

    #[test]
    fn every_edge_that_holds_a_work_is_followed() {
        // Work 1 is held by two blocked threads (a run_chunked caller and a helper): one
        // waits for 9, where nothing waits; the other waits for 3, which waits for us.
        let graph = Graph {
            next_serial: 3,
            edges: vec![edge(0, &[5, 1], 9), edge(1, &[6, 1], 3), edge(2, &[3], 7)],
        };
        assert!(graph.closes_cycle(&[7], 1));
        assert!(!graph.closes_cycle(&[8], 1));
    }

    #[test]
    fn a_chain_back_to_the_caller_is_a_cycle_and_an_open_chain_is_not() {
        let graph = Graph {
            next_serial: 3,
            edges: vec![edge(0, &[1], 2), edge(1, &[2, 5], 3), edge(2, &[9], 4)],
        };
        // 3 waits for 1: 1 waits for 2, 2 (on a stack with 5) waits for 3.
        assert!(graph.closes_cycle(&[3], 1));
        // The caller's stack holds 3 below another work: still a cycle.
        assert!(graph.closes_cycle(&[7, 3], 1));
        // 4 waits for nobody: the chain 9 -> 4 ends.
        assert!(!graph.closes_cycle(&[3], 9));
        assert!(!graph.closes_cycle(&[8], 1));
    }
}
