#![cfg(loom)]
//! Loom model of a guard that outlives its thread's exit hook: a `Cid` kept in a
//! thread-local destroyed after nicework's own. Loom cannot order thread-local destructors
//! (it takes all of a finishing thread's locals away first, then runs them in an order
//! that varies), so the thread runs the hook itself through
//! `nicework::hooks::run_thread_exit_hook_for_loom` while its guard lives, as std does when
//! the guard's thread-local was registered before nicework's.
//!
//! In every interleaving with another thread entering and the scan running: the exiting
//! thread's guard keeps its id (no other guard gets it), a nested `enter()` after the hook
//! returns the same id, and the id is released when the guard drops.

use std::sync::Arc;
use std::time::Duration;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use nicework::{IdSpace, Scheduler};

const SCAN: Duration = Duration::from_millis(100);

/// Which thread claims each id; a second claim of a held id is a bug.
struct Claims(Vec<AtomicUsize>);

impl Claims {
    fn claim(&self, id: usize, token: usize) {
        assert!(id < self.0.len(), "id {id} out of range");
        assert_eq!(
            self.0[id].swap(token, Ordering::SeqCst),
            0,
            "id {id} held twice"
        );
    }

    fn unclaim(&self, id: usize) {
        self.0[id].store(0, Ordering::SeqCst);
    }
}

#[test]
fn a_guard_that_outlives_the_exit_hook_keeps_its_id() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let ids = Arc::new(IdSpace::new(&sched));
        let claims = Arc::new(Claims((0..4).map(|_| AtomicUsize::new(0)).collect()));
        let exiting = {
            let (ids, claims) = (ids.clone(), claims.clone());
            thread::spawn(move || {
                let guard = ids.enter();
                let mine = guard.get();
                claims.claim(mine, 1);
                // The thread "exits" with `guard` still alive in a later thread-local.
                nicework::hooks::run_thread_exit_hook_for_loom();
                assert_eq!(ids.enter().get(), mine, "nested enter after the exit hook");
                assert_eq!(guard.get(), mine);
                claims.unclaim(mine);
                drop(guard); // the last guard: the id is free now
            })
        };
        let other = {
            let (ids, claims) = (ids.clone(), claims.clone());
            thread::spawn(move || {
                let guard = ids.enter();
                claims.claim(guard.get(), 2);
                claims.unclaim(guard.get());
            })
        };
        // The scan may run while the exiting thread's guard is orphaned.
        sched.advance(SCAN);
        exiting.join().unwrap();
        other.join().unwrap();
        // The exiting thread's id was released by its guard's drop. (Loom keeps the other
        // thread's registry, and so its id, until after the model.)
        assert!(
            ids.held() <= 1,
            "held {} after the guard dropped",
            ids.held()
        );
    });
}
