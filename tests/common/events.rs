//! A process-wide `tracing` subscriber that keeps what nicework logs: error and warning
//! events and the run spans (name, level, then `name=value ` fields) as strings. Each test binary is its own
//! process, so a binary that installs it gets every event of its tests.

use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// What the subscriber kept.
#[derive(Default)]
pub struct Captured {
    pub errors: Mutex<Vec<String>>,
    pub warnings: Mutex<Vec<String>>,
    pub spans: Mutex<Vec<String>>,
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

struct Capture(&'static Captured);

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let metadata = span.metadata();
        let mut fields = Fields(format!("{} {} ", metadata.name(), metadata.level()));
        span.record(&mut fields);
        let mut spans = self.0.spans.lock().unwrap();
        spans.push(fields.0);
        Id::from_u64(spans.len() as u64)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let kept = match *event.metadata().level() {
            Level::ERROR => &self.0.errors,
            Level::WARN => &self.0.warnings,
            _ => return,
        };
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        kept.lock().unwrap().push(fields.0);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Installs the subscriber (once per process) and returns what it keeps.
pub fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<&'static Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured: &'static Captured = Box::leak(Box::default());
        tracing::subscriber::set_global_default(Capture(captured)).unwrap();
        captured
    })
}
