//! A panic in a callback is caught, and a `tracing` error event names the work; every run
//! has a span named after the work. Uses a process-wide subscriber, so it is alone in
//! this test binary.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nicework::{Next, Scheduler};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

#[derive(Default)]
struct Capture {
    errors: Mutex<Vec<String>>,
    spans: Mutex<Vec<String>>,
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push_str(&format!("{}={} ", field.name(), value));
    }
}

struct Shared(Arc<Capture>);

impl Subscriber for Shared {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = Fields(format!("{} ", span.metadata().name()));
        span.record(&mut fields);
        let mut spans = self.0.spans.lock().unwrap();
        spans.push(fields.0);
        Id::from_u64(spans.len() as u64)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        if *event.metadata().level() == Level::ERROR {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            self.0.errors.lock().unwrap().push(fields.0);
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

fn capture() -> &'static Arc<Capture> {
    static CAPTURE: OnceLock<Arc<Capture>> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture = Arc::new(Capture::default());
        tracing::subscriber::set_global_default(Shared(capture.clone())).unwrap();
        capture
    })
}

#[test]
fn a_panicking_work_emits_an_error_event_naming_it() {
    let capture = capture();
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
        assert!(spans
            .iter()
            .any(|s| s.starts_with("nicework.run") && s.contains("work=steady")));
        drop(good);
    }
}
