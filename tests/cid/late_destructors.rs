//! `enter()` from thread-local destructors that run after nicework's thread-exit hook,
//! when no guard pinned the thread's id at the hook: nested `enter()` returns the outer
//! guard's id, `PerCid::with` uses it, and forgotten guards or dropped spaces do not
//! disturb a new space on the same thread.
use nicework::{IdSpace, PerCid, Scheduler};
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

struct Late {
    ids: &'static IdSpace,
    out: Arc<Mutex<Vec<(usize, usize)>>>,
}
impl Drop for Late {
    fn drop(&mut self) {
        let outer = self.ids.enter();
        let inner = self.ids.enter();
        self.out.lock().unwrap().push((outer.get(), inner.get()));
    }
}
thread_local! {
    static LATE: RefCell<Option<Late>> = const { RefCell::new(None) };
}

#[test]
fn nested_enter_in_a_late_destructor_returns_the_outer_id() {
    let sched: &'static Scheduler = Box::leak(Box::new(Scheduler::manual()));
    let ids: &'static IdSpace = Box::leak(Box::new(IdSpace::new(sched)));
    let out = Arc::new(Mutex::new(Vec::new()));
    let o = out.clone();
    std::thread::spawn(move || {
        // Register LATE's destructor first, so it runs after the registry's (reverse order).
        LATE.with(|l| *l.borrow_mut() = Some(Late { ids, out: o }));
        drop(ids.enter()); // registers nicework's exit hook later
    })
    .join()
    .unwrap();
    let got = out.lock().unwrap().clone();
    eprintln!(
        "late (outer, nested) ids: {got:?}; held after join = {}",
        ids.held()
    );
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].0, got[0].1,
        "nested enter() returned a different id than the outer guard"
    );
}

struct LatePer {
    ids: &'static IdSpace,
    a: &'static PerCid<Vec<usize>>,
    out: Arc<Mutex<Vec<(usize, usize)>>>,
}
impl Drop for LatePer {
    fn drop(&mut self) {
        let g = self.ids.enter();
        let id = g.get();
        // PerCid::with nested under a live guard: which slot does it use?
        self.a.with(|v| v.push(id));
        let slot_owner = self.a.with(|v| *v.last().unwrap());
        self.out.lock().unwrap().push((id, slot_owner));
    }
}
thread_local! {
    static LATE_PER: RefCell<Option<LatePer>> = const { RefCell::new(None) };
}

#[test]
fn percid_with_under_a_guard_in_a_late_destructor_uses_its_id() {
    let sched: &'static Scheduler = Box::leak(Box::new(Scheduler::manual()));
    let ids: &'static IdSpace = Box::leak(Box::new(IdSpace::new(sched)));
    let a: &'static PerCid<Vec<usize>> = Box::leak(Box::new(PerCid::new(ids, Vec::new)));
    let out = Arc::new(Mutex::new(Vec::new()));
    let o = out.clone();
    std::thread::spawn(move || {
        LATE_PER.with(|l| *l.borrow_mut() = Some(LatePer { ids, a, out: o }));
        drop(ids.enter());
    })
    .join()
    .unwrap();
    let got = out.lock().unwrap().clone();
    eprintln!("late PerCid: {got:?}");
    assert_eq!(got.len(), 1);
}

#[test]
fn forgotten_guards_and_dropped_spaces_leave_a_new_space_dense() {
    let sched = Scheduler::manual();
    std::thread::spawn(move || {
        for _ in 0..100 {
            let ids = IdSpace::new(&sched);
            std::mem::forget(ids.enter());
            std::mem::forget(ids.enter());
            drop(ids);
        }
        let ids = IdSpace::new(&sched);
        let a = ids.enter();
        let b = ids.enter();
        assert_eq!(a.get(), b.get());
        assert_eq!(a.get(), 0);
        drop((a, b));
        assert_eq!(ids.held(), 1);
    })
    .join()
    .unwrap();
}
