//! User code that nicework runs inside its own thread-exit hook and inside the
//! compaction scan (trims once the scheduler is gone; `on_reclaim`; drops of what a trim
//! releases).
//!
//! - An `enter()` made by `on_reclaim` during the exit hook, while a guard
//!   of the thread lives in a thread-local destroyed after the hook, must return that
//!   guard's id.
//! - A panicking destructor of user state released by a trim (the replaced
//!   `on_reclaim` closure, a `PerCid` whose last handle `on_reclaim` dropped) must be
//!   contained, as the trim contains the callback's panics and the slot values' drops.
//!   Cases that could abort the process run in a child process (this test binary again).

use crate::common;

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use nicework::{Cid, IdSpace, MIN_SCAN_PERIOD, PerCid, Scheduler};

fn leak<T>(value: T) -> &'static T {
    Box::leak(Box::new(value))
}

const NONE: usize = usize::MAX;

// ---------------------------------------------------------------------------------------
// Nested enter from on_reclaim inside the exit hook.
// ---------------------------------------------------------------------------------------

thread_local! {
    static GUARD: RefCell<Option<Cid<'static>>> = const { RefCell::new(None) };
}

static OUTER: AtomicUsize = AtomicUsize::new(NONE);
static INNER: AtomicUsize = AtomicUsize::new(NONE);
static SPACE_S: OnceLock<&'static IdSpace> = OnceLock::new();

#[test]
fn enter_from_on_reclaim_in_the_exit_hook_returns_the_late_guards_id() {
    let sched = Scheduler::manual();
    let s: &'static IdSpace = leak(IdSpace::new(&sched));
    SPACE_S.set(s).unwrap();
    let s2: &'static IdSpace = leak(IdSpace::new(&sched));
    let p2: &'static PerCid<u64> = leak(PerCid::with_reclaim(
        s2,
        || 0,
        |_: &mut u64| {
            let s = SPACE_S.get().unwrap();
            let id = s.enter().get();
            INNER.store(id, Ordering::SeqCst);
        },
    ));
    drop(sched); // trims run at thread exits, on the exiting thread

    std::thread::spawn(move || {
        // GUARD is first used before the thread's first `enter()`: it is destroyed after
        // nicework's exit hook, and its guard pins `s` through the hook.
        GUARD.with(|g| {
            let cid = s.enter();
            OUTER.store(cid.get(), Ordering::SeqCst);
            *g.borrow_mut() = Some(cid);
        });
        // A slot in `p2` (space `s2`): released by the exit hook, so trimmed there, and
        // `on_reclaim` runs inside the hook while GUARD's guard still lives.
        p2.with(|n| *n += 1);
    })
    .join()
    .unwrap();

    let (outer, inner) = (OUTER.load(Ordering::SeqCst), INNER.load(Ordering::SeqCst));
    assert_ne!(inner, NONE, "on_reclaim did not run at the thread's exit");
    assert_eq!((s.held(), s2.held()), (0, 0));
    assert_eq!(
        inner, outer,
        "an enter() on the exiting thread, whose guard (id {outer}) still lives in a \
         thread-local, returned id {inner}: a second id for the same thread"
    );
}

// ---------------------------------------------------------------------------------------
// Panicking destructors released by a trim.
// ---------------------------------------------------------------------------------------

/// Panics when dropped.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("attack: a destructor released by a trim panics");
    }
}

/// Runs the test `name` again in a child process (see `common::child`), and returns its
/// exit status and output; a child that hangs fails the test.
fn in_child(name: &str) -> (std::process::ExitStatus, String) {
    let child = common::child::run(module_path!(), name);
    assert!(
        child.finished,
        "the child running {name} hung:\n{}",
        child.text
    );
    (child.status, child.text)
}

use common::child::is_child;

static P_SWAP: OnceLock<&'static PerCid<u64>> = OnceLock::new();

/// `on_reclaim` replaces itself (allowed: "taken out while a trim runs it, so it may set
/// another"); the replaced closure was dropped at the end of the trim, outside any
/// containment. At a thread's exit (scheduler gone) that is inside the thread-local
/// destructor: a panic there aborted the process. Now the drop is contained.
#[test]
fn a_replaced_on_reclaim_whose_drop_panics_at_thread_exit_is_contained() {
    const NAME: &str = "a_replaced_on_reclaim_whose_drop_panics_at_thread_exit_is_contained";
    if is_child(NAME) {
        common::quiet_panics_starting_with("attack:");
        let sched = Scheduler::manual();
        let s: &'static IdSpace = leak(IdSpace::new(&sched));
        let bomb = Bomb;
        let p: &'static PerCid<u64> = leak(PerCid::with_reclaim(
            s,
            || 0,
            move |_: &mut u64| {
                let _keep = &bomb;
                P_SWAP.get().unwrap().on_reclaim(|_| {});
            },
        ));
        P_SWAP.set(p).unwrap();
        drop(sched);
        std::thread::spawn(move || p.with(|n| *n += 1))
            .join()
            .unwrap();
        println!("CHILD-OK");
        return;
    }
    let (status, text) = in_child(NAME);
    assert!(
        status.success() && text.contains("CHILD-OK"),
        "the process died: {status:?}\n{}",
        text.lines()
            .filter(|l| l.contains("fatal") || l.contains("panicked") || l.contains("abort"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The same on the compaction scan (manual scheduler): the panic escapes the scan, which
/// is an ordinary work, so the compaction work is poisoned and never reclaims an id again.
#[test]
fn a_replaced_on_reclaim_whose_drop_panics_in_a_scan_is_contained() {
    common::quiet_panics_starting_with("attack:");
    let sched = Scheduler::manual();
    let s: &'static IdSpace = leak(
        IdSpace::builder()
            .scan_period(MIN_SCAN_PERIOD)
            .build(&sched),
    );
    static P: OnceLock<&'static PerCid<u64>> = OnceLock::new();
    let bomb = Bomb;
    let p: &'static PerCid<u64> = leak(PerCid::with_reclaim(
        s,
        || 0,
        move |_: &mut u64| {
            let _keep = &bomb;
            P.get().unwrap().on_reclaim(|_| {});
        },
    ));
    P.set(p).unwrap();
    // Two threads: b's id 1 is above the high water once b exits.
    let _a = s.enter();
    std::thread::spawn(move || p.with(|n| *n += 1))
        .join()
        .unwrap();
    drop(_a);
    let runs_before = s.compaction_stats().runs;
    sched.advance(MIN_SCAN_PERIOD * 2); // the scan trims b's slot: on_reclaim replaces itself
    assert!(s.compaction_stats().runs > runs_before);
    // This thread is idle now: two more scans must take its id back.
    drop(s.enter());
    sched.advance(MIN_SCAN_PERIOD * 5);
    assert_eq!(
        s.held(),
        0,
        "the idle thread's id was never reclaimed: the compaction work is dead (poisoned: \
         {})",
        s.compaction_stats().runs
    );
}

static DOOMED: Mutex<Option<PerCid<Bomb>>> = Mutex::new(None);

/// `on_reclaim` of one `PerCid` drops the last handle of another whose remaining value
/// panics when dropped. The trim pass (`trim_all`) holds the storages it upgraded, so the
/// storage, values and all, is dropped inside it: at a thread's exit, inside the exit hook.
#[test]
fn a_percid_dropped_by_on_reclaim_inside_the_exit_hook_is_contained() {
    const NAME: &str = "a_percid_dropped_by_on_reclaim_inside_the_exit_hook_is_contained";
    if is_child(NAME) {
        common::quiet_panics_starting_with("attack:");
        let sched = Scheduler::manual();
        let s: &'static IdSpace = leak(IdSpace::new(&sched));
        let first: &'static PerCid<u64> = leak(PerCid::with_reclaim(
            s,
            || 0,
            |_: &mut u64| {
                // The user drops a handle it no longer needs.
                let doomed = DOOMED.lock().unwrap().take();
                drop(doomed);
            },
        ));
        *DOOMED.lock().unwrap() = Some(PerCid::new(s, || Bomb));
        drop(sched);
        // This thread keeps id 0 and a Bomb in slot 0 (below the high water: not trimmed).
        DOOMED.lock().unwrap().as_ref().unwrap().with(|_| ());
        let keep = s.enter();
        std::thread::spawn(move || first.with(|n| *n += 1))
            .join()
            .unwrap();
        drop(keep);
        println!("CHILD-OK");
        std::process::exit(0);
    }
    let (status, text) = in_child(NAME);
    assert!(
        status.success() && text.contains("CHILD-OK"),
        "the process died: {status:?}\n{}",
        text.lines()
            .filter(|l| l.contains("fatal") || l.contains("panicked") || l.contains("abort"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[allow(dead_code)]
fn unused(_: Duration) {}

/// Control for `a_replaced_on_reclaim_whose_drop_panics_in_a_scan`: the same without the
/// panicking destructor passes.
#[test]
fn control_a_replaced_on_reclaim_in_a_scan() {
    let sched = Scheduler::manual();
    let s: &'static IdSpace = leak(
        IdSpace::builder()
            .scan_period(MIN_SCAN_PERIOD)
            .build(&sched),
    );
    static P: OnceLock<&'static PerCid<u64>> = OnceLock::new();
    let p: &'static PerCid<u64> = leak(PerCid::with_reclaim(
        s,
        || 0,
        move |_: &mut u64| {
            P.get().unwrap().on_reclaim(|_| {});
        },
    ));
    P.set(p).unwrap();
    let _a = s.enter();
    std::thread::spawn(move || p.with(|n| *n += 1))
        .join()
        .unwrap();
    drop(_a);
    sched.advance(MIN_SCAN_PERIOD * 2);
    drop(s.enter());
    sched.advance(MIN_SCAN_PERIOD * 5);
    assert_eq!(s.held(), 0);
}
