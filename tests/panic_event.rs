//! A panic in a callback is caught, and a `tracing` error event names the work; every run
//! has a DEBUG span with the work's name, its deadline and its lateness. Uses a process-wide subscriber, so it is alone in
//! this test binary.

mod common;

use std::time::Duration;

use nicework::{Next, Scheduler};

#[test]
fn a_panicking_work_emits_an_error_event_naming_it() {
    let capture = common::events::captured();
    for sched in [Scheduler::manual(), Scheduler::new().unwrap()] {
        let name = format!("boom-{}", sched.is_manual());
        let bad = sched
            .every(Duration::from_millis(1), |_| panic!("callback exploded"))
            .named(name.clone());
        let good = sched
            .every(Duration::from_millis(1), |_| Next::Again)
            .named("steady");
        if sched.is_manual() {
            sched.advance(Duration::from_millis(5));
        } else {
            let start = std::time::Instant::now();
            while !bad.is_poisoned() && start.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert!(bad.is_poisoned());
        let errors = capture.errors.lock().unwrap().clone();
        let event = errors
            .iter()
            .find(|e| e.contains(&format!("work={name} ")))
            .unwrap_or_else(|| panic!("no error event for {name}: {errors:?}"));
        assert!(event.contains("callback exploded"), "{event}");
        let spans = capture.spans.lock().unwrap().clone();
        let run = spans
            .iter()
            .find(|s| s.starts_with("nicework.run ") && s.contains("work=steady "))
            .unwrap_or_else(|| panic!("no run span for steady: {spans:?}"));
        // DEBUG, with the deadline and how late the run started.
        assert!(run.starts_with("nicework.run DEBUG "), "{run}");
        assert!(run.contains("deadline=Instant"), "{run}");
        assert!(run.contains("lateness="), "{run}");
        drop(good);
    }
}
