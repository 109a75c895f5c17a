#![cfg(loom)]
//! Loom models of the space's two id modes (src/cid/mode.rs) and the per-CPU table
//! (src/cid/cpu_ids.rs): the switch between per-thread and per-CPU ids against `enter()`,
//! against a guard's drop, against a thread's first `enter()` (which makes it visible to
//! the space) and against the compaction scan; and per-CPU borrowing from one CPU's id
//! while a holder of it is preempted inside its guard.
//!
//! In every interleaving: no two live guards of different threads have the same id (a
//! per-id "inside" flag, or the `Count` fixture in a `PerCid`, whose cell loom checks for
//! overlapping `&mut`), a nested `enter()` returns its outer guard's id, no slot is
//! trimmed while its id is held, every count is live or folded exactly once, and once
//! every thread has exited the space holds no id (no id leaked by a switch or the table).
//!
//! The switches are placed with `nicework::hooks::switch_id_mode`, which switches under the
//! space lock exactly as a scan that decided so, or made by a scan that counts the CPUs
//! `nicework::hooks::count_cpus_as` sets. Loom does not run a spawned thread's
//! thread-local destructors before `join` returns, so each thread runs its exit hook
//! itself (`run_thread_exit_hook_for_loom`) after its last guard; the main thread never
//! enters (loom runs its thread-local destructors after the execution ends). Every thread
//! that enters says which CPU it runs on (`pretend_cpu_for_loom`): without it the hint is
//! the record's address, which differs from run to run once more than one CPU is counted,
//! and loom needs the same steps in the same order each time.

use std::sync::Arc;
use std::time::Duration;

use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::thread;
use loom_tests::percid_fixtures::{Count, check, counters, sum};
use nicework::hooks::{
    count_cpus_as, id_mode, pretend_cpu_for_loom, run_thread_exit_hook_for_loom, switch_id_mode,
};
use nicework::{IdSpace, Scheduler};

const SCAN: Duration = Duration::from_millis(100);

/// One "inside" flag per id: a guard sets its id's flag for its life; finding it set is
/// two live guards on one id.
struct Inside(Vec<AtomicBool>);

impl Inside {
    fn new() -> Arc<Inside> {
        Arc::new(Inside((0..8).map(|_| AtomicBool::new(false)).collect()))
    }

    /// A guard of id `id` starts: no other thread's guard may have it.
    fn claim(&self, id: usize) {
        assert!(id < self.0.len(), "id {id} out of range");
        assert!(
            !self.0[id].swap(true, Ordering::SeqCst),
            "id {id} held by two live guards"
        );
    }

    /// The guard of id `id` is about to drop.
    fn unclaim(&self, id: usize) {
        self.0[id].store(false, Ordering::SeqCst);
    }

    /// An outermost guard and a nested one: the nested one has the outer id, and no other
    /// thread's guard has it meanwhile.
    fn hold(&self, ids: &IdSpace) {
        let outer = ids.enter();
        let id = outer.get();
        self.claim(id);
        assert_eq!(ids.enter().get(), id, "a nested enter() changed the id");
        self.unclaim(id);
        drop(outer);
    }
}

/// Spawns a thread on CPU `cpu` that holds a guard (and a nested one) `times` times, then
/// exits.
fn holder(
    ids: &Arc<IdSpace>,
    inside: &Arc<Inside>,
    cpu: usize,
    times: usize,
) -> thread::JoinHandle<()> {
    let (ids, inside) = (ids.clone(), inside.clone());
    thread::spawn(move || {
        pretend_cpu_for_loom(cpu);
        for _ in 0..times {
            inside.hold(&ids);
        }
        run_thread_exit_hook_for_loom();
    })
}

/// Makes the space's per-CPU table (at its first switch to per-CPU mode) and switches back,
/// before the model's threads are spawned: the model's interleavings then go to the switch
/// protocol rather than the table's creation, which
/// `first_switch_to_per_cpu_against_a_lock_free_borrow` races on its own.
fn make_table(ids: &IdSpace) {
    switch_id_mode(ids, true);
    switch_id_mode(ids, false);
}

// --- 1. the switch against enter() and a guard's drop ---

/// Three threads hold a guard (two of them twice, the second time after the first's drop;
/// two of them on CPU 0) while the main thread switches the space to per-CPU mode: before
/// a thread's first `enter()`, between its pin and its read of `cid`, while it holds an id
/// it owns (then marked `MOVE`), or against the drop of a guard. Live guards of different
/// threads never share an id (the two on CPU 0 borrow its id and a spare), nested guards
/// return the outer id, and after all exited no id is held. The table was made before
/// (`make_table`), so the switch is the space's third.
#[test]
fn switch_to_per_cpu_against_enter_and_drop() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let ids = Arc::new(IdSpace::new(&sched));
        make_table(&ids);
        let inside = Inside::new();
        let a = holder(&ids, &inside, 0, 2);
        let b = holder(&ids, &inside, 1, 2);
        let c = holder(&ids, &inside, 0, 1);
        switch_id_mode(&ids, true);
        a.join().unwrap();
        b.join().unwrap();
        c.join().unwrap();
        assert_eq!(id_mode(&ids), (true, 3));
        assert_eq!(ids.held(), 0, "an id outlived every thread");
    });
}

/// As above, the other way: the space is in per-CPU mode, so the threads borrow ids of
/// the table (its CPU's id, or a spare), while the main thread switches it back to
/// per-thread mode. A thread that
/// read `CPU_MODE` before the switch still borrows once and gives the id back at its
/// drop; one that reads `NO_ID` takes an id of its own. The table's ids go back to the
/// space as the threads exit.
#[test]
fn switch_to_per_thread_against_enter_and_drop() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let ids = Arc::new(IdSpace::new(&sched));
        switch_id_mode(&ids, true);
        let inside = Inside::new();
        let a = holder(&ids, &inside, 0, 2);
        let b = holder(&ids, &inside, 1, 2);
        let c = holder(&ids, &inside, 0, 1);
        switch_id_mode(&ids, false);
        a.join().unwrap();
        b.join().unwrap();
        c.join().unwrap();
        assert_eq!(id_mode(&ids), (false, 2));
        assert_eq!(ids.held(), 0, "an id outlived every thread");
    });
}

/// The space's first switch to per-CPU mode makes the table, under the space lock, while
/// a thread registered before it reads `CPU_MODE` with the fast path's relaxed load and
/// borrows from the table without the lock: it must see the table whole (the table's
/// pointer is published with a release store and read with acquire loads).
#[test]
fn first_switch_to_per_cpu_against_a_lock_free_borrow() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let ids = Arc::new(IdSpace::new(&sched));
        let inside = Inside::new();
        let a = holder(&ids, &inside, 0, 2);
        switch_id_mode(&ids, true);
        a.join().unwrap();
        assert_eq!(ids.held(), 0, "an id outlived every thread");
    });
}

// --- 2. the switch made by a scan, against a thread inside `with` ---

/// Executions of `scan_switches_to_per_cpu_while_a_thread_is_inside_with` whose scan
/// switched (std atomics: counted across executions, outside the model).
static SCAN_SWITCHED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// H is inside `with` on its own id (per-thread mode) for the whole scan; O counts twice
/// meanwhile. The scan counts one CPU, so once it sees both threads active it switches to
/// per-CPU mode: H's id is marked `MOVE` under it, and O's next `with` gives its own id
/// back and borrows one of the table. H's slot is never trimmed nor lent while H is
/// inside (loom checks the count's cell against O's `&mut` and the trim's fold), H's
/// next `with` after the scan borrows too, every count is live or folded, and no id is
/// held once both exited. (The model checks that some executions do switch.)
#[test]
fn scan_switches_to_per_cpu_while_a_thread_is_inside_with() {
    use std::sync::atomic::Ordering::Relaxed;
    check(|| {
        let sched = Scheduler::manual();
        let ids = IdSpace::new(&sched);
        count_cpus_as(&ids, Some(1));
        let folded = Arc::new(AtomicU64::new(0));
        let counters = counters(&ids, &folded);
        // 1: H is inside `with`; 2: the scan ran.
        let phase = Arc::new(AtomicU64::new(0));
        let h = {
            let (counters, phase) = (counters.clone(), phase.clone());
            thread::spawn(move || {
                pretend_cpu_for_loom(0);
                counters.with(|count| {
                    count.add();
                    phase.store(1, Ordering::SeqCst);
                    while phase.load(Ordering::SeqCst) != 2 {
                        thread::yield_now();
                    }
                    count.add();
                });
                counters.with(Count::add);
                run_thread_exit_hook_for_loom();
            })
        };
        let o = {
            let counters = counters.clone();
            thread::spawn(move || {
                pretend_cpu_for_loom(1);
                counters.with(Count::add);
                counters.with(Count::add);
                run_thread_exit_hook_for_loom();
            })
        };
        while phase.load(Ordering::SeqCst) != 1 {
            thread::yield_now();
        }
        sched.advance(SCAN);
        if id_mode(&ids).0 {
            SCAN_SWITCHED.fetch_add(1, Relaxed);
        }
        phase.store(2, Ordering::SeqCst);
        h.join().unwrap();
        o.join().unwrap();
        assert_eq!(sum(&counters) + folded.load(Ordering::SeqCst), 5);
        assert_eq!(ids.held(), 0, "an id outlived every thread");
    });
    assert!(
        SCAN_SWITCHED.load(Relaxed) > 0,
        "the scan never switched to per-CPU mode"
    );
}

/// The space is in per-CPU mode and H is inside `with` on an id borrowed from the table,
/// while O counts once and a scan that now counts four CPUs sees too few threads,
/// switches back to per-thread mode and gives back to the space every table id no guard
/// holds (which may lower the high water and trim O's slot). H's id stays reserved and
/// its slot untouched, O's id never meets H's, and a second scan races with H's drop
/// (which gives its id back to the table) and H's next `with` (an id of its own). Every
/// count is live or folded, and no id is held once both exited.
#[test]
fn scan_switches_to_per_thread_while_a_thread_holds_a_lent_id() {
    check(|| {
        let sched = Scheduler::manual();
        let ids = IdSpace::new(&sched);
        count_cpus_as(&ids, Some(1));
        switch_id_mode(&ids, true);
        let folded = Arc::new(AtomicU64::new(0));
        let counters = counters(&ids, &folded);
        let phase = Arc::new(AtomicU64::new(0));
        let h = {
            let (counters, phase) = (counters.clone(), phase.clone());
            thread::spawn(move || {
                pretend_cpu_for_loom(0);
                counters.with(|count| {
                    count.add();
                    phase.store(1, Ordering::SeqCst);
                    while phase.load(Ordering::SeqCst) != 2 {
                        thread::yield_now();
                    }
                    count.add();
                });
                counters.with(Count::add);
                run_thread_exit_hook_for_loom();
            })
        };
        let o = {
            let counters = counters.clone();
            thread::spawn(move || {
                pretend_cpu_for_loom(1);
                counters.with(Count::add);
                run_thread_exit_hook_for_loom();
            })
        };
        while phase.load(Ordering::SeqCst) != 1 {
            thread::yield_now();
        }
        count_cpus_as(&ids, Some(4));
        sched.advance(SCAN);
        assert_eq!(
            id_mode(&ids),
            (false, 2),
            "the scan saw at most 2 of 4 CPUs busy"
        );
        phase.store(2, Ordering::SeqCst);
        // Against H's drop, which gives its id back to the table: unreserved once free.
        sched.advance(SCAN);
        h.join().unwrap();
        o.join().unwrap();
        assert_eq!(sum(&counters) + folded.load(Ordering::SeqCst), 4);
        assert_eq!(ids.held(), 0, "an id outlived every thread");
    });
}

// --- 3. per-CPU borrowing against a holder preempted inside its guard ---

/// Executions of `holders_preempted_on_one_cpu_leave_the_others_a_spare` in which a
/// `with` ran on a spare, not CPU 0's id (std atomics: counted across executions).
static SPARES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Per-CPU mode, one CPU counted, and three threads that all run on CPU 0 and count twice
/// each: whichever holds CPU 0's id when loom preempts it inside `with` keeps it, and the
/// others take a spare (lock-free once reserved, else reserved under the lock); a later
/// guard takes CPU 0's id again once it is free. A nested `enter()` inside `with` returns
/// the slot's id, no two `with`s share a slot (loom checks the count's cell), the sum is
/// exact, and the table's ids go back as the threads exit. (The model checks that some
/// executions do take a spare.)
#[test]
fn holders_preempted_on_one_cpu_leave_the_others_a_spare() {
    use std::sync::atomic::Ordering::Relaxed;
    check(|| {
        let sched = Scheduler::manual();
        let ids = Arc::new(IdSpace::new(&sched));
        count_cpus_as(&ids, Some(1));
        switch_id_mode(&ids, true);
        let folded = Arc::new(AtomicU64::new(0));
        let counters = counters(&ids, &folded);
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (ids, counters) = (ids.clone(), counters.clone());
                thread::spawn(move || {
                    pretend_cpu_for_loom(0);
                    counters.with(|count| {
                        count.add();
                        if ids.enter().get() != 0 {
                            SPARES.fetch_add(1, Relaxed);
                        }
                    });
                    counters.with(Count::add);
                    run_thread_exit_hook_for_loom();
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(sum(&counters) + folded.load(Ordering::SeqCst), 6);
        assert_eq!(ids.held(), 0, "an id outlived every thread");
    });
    assert!(SPARES.load(Relaxed) > 0, "no guard ever took a spare");
}

// --- 4. a thread made visible to the space against a switch ---

/// Spawns E, on CPU 0, which enters (so it owns an id), sets `entered` and waits inside
/// its guard for `go` (parked: unpark it after setting `go`), then checks that a nested
/// guard has the same id, holds a guard again and exits.
fn earlier(
    ids: &Arc<IdSpace>,
    inside: &Arc<Inside>,
    entered: &Arc<AtomicBool>,
    go: &Arc<AtomicBool>,
) -> thread::JoinHandle<()> {
    let (ids, inside, entered, go) = (ids.clone(), inside.clone(), entered.clone(), go.clone());
    thread::spawn(move || {
        pretend_cpu_for_loom(0);
        let outer = ids.enter();
        let id = outer.get();
        inside.claim(id);
        entered.store(true, Ordering::SeqCst);
        while !go.load(Ordering::SeqCst) {
            thread::park();
        }
        assert_eq!(ids.enter().get(), id, "a nested enter() changed the id");
        inside.unclaim(id);
        drop(outer);
        inside.hold(&ids);
        run_thread_exit_hook_for_loom();
    })
}

/// E is inside a guard on an id it owns while N makes its first `enter()`, which
/// registers N's record under the space lock, and the main thread switches to per-CPU
/// mode (marking E's id `MOVE`). Whether N's record joined the list before the switch
/// (which rewrites its `NO_ID` to `CPU_MODE`: N borrows without the lock) or after (N
/// reads `NO_ID` and takes the lock path, which reads the mode), N's guards get ids E's
/// guard does not have, nested guards the outer id, E's next guard gives its id back and
/// borrows, and once both exited the space holds no id and no record.
#[test]
fn first_enter_against_a_switch() {
    loom::model(|| {
        let sched = Scheduler::manual();
        let ids = Arc::new(IdSpace::new(&sched));
        make_table(&ids);
        let inside = Inside::new();
        let (entered, go) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let e = earlier(&ids, &inside, &entered, &go);
        while !entered.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        let n = holder(&ids, &inside, 1, 2);
        switch_id_mode(&ids, true);
        go.store(true, Ordering::SeqCst);
        e.thread().unpark();
        e.join().unwrap();
        n.join().unwrap();
        assert_eq!(id_mode(&ids), (true, 3));
        assert_eq!(ids.held(), 0, "an id outlived every thread");
        assert_eq!(ids.threads(), 0, "a record outlived its thread");
    });
}

/// Executions of `first_enter_against_a_scan_that_switches` whose scan switched.
static FIRST_ENTER_SWITCHED: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// As above, with the switch made by a scan that counts one CPU: E is pinned, so the scan
/// switches to per-CPU mode if it also counts N, which it does only once N's record is in
/// the list (the scan counts the threads the space can see, under the lock N's
/// registration takes) and N entered. N's first guard comes from the lock path, before
/// the scan (an id of its own, then marked `MOVE`) or after it (N read `NO_ID` before the
/// switch, waited for the lock, and borrows in the mode it finds there). N waits after its
/// first guard, so that it is still registered when the scan runs. N's and E's guards
/// never share an id, and once both exited the space holds no id and no record. (The
/// model checks that some executions do switch.)
#[test]
fn first_enter_against_a_scan_that_switches() {
    use std::sync::atomic::Ordering::Relaxed;
    check(|| {
        let sched = Scheduler::manual();
        let ids = Arc::new(IdSpace::new(&sched));
        count_cpus_as(&ids, Some(1));
        make_table(&ids);
        let inside = Inside::new();
        let (entered, go) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let e = earlier(&ids, &inside, &entered, &go);
        while !entered.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        let n = {
            let (ids, inside, go) = (ids.clone(), inside.clone(), go.clone());
            thread::spawn(move || {
                pretend_cpu_for_loom(1);
                inside.hold(&ids);
                while !go.load(Ordering::SeqCst) {
                    thread::park();
                }
                inside.hold(&ids);
                run_thread_exit_hook_for_loom();
            })
        };
        sched.advance(SCAN);
        if id_mode(&ids).0 {
            FIRST_ENTER_SWITCHED.fetch_add(1, Relaxed);
        }
        go.store(true, Ordering::SeqCst);
        e.thread().unpark();
        n.thread().unpark();
        e.join().unwrap();
        n.join().unwrap();
        assert_eq!(ids.held(), 0, "an id outlived every thread");
        assert_eq!(ids.threads(), 0, "a record outlived its thread");
    });
    assert!(
        FIRST_ENTER_SWITCHED.load(Relaxed) > 0,
        "the scan never switched to per-CPU mode"
    );
}
