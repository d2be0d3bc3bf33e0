//! The events logged on this thread, captured for a test's assertions.
//!
//! [`Logs::capture`] makes a subscriber this thread's default: on a
//! current-thread runtime every task of the test, the crate's background
//! tasks included, runs on it, so every event the test causes is seen, and
//! no other test's (each runs on its own thread).

use std::sync::{Arc, Mutex};

/// Events as (level, message followed by ` field=value` for each field).
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<(tracing::Level, String)>>>);

impl Logs {
    /// Captures this thread's events until the guard is dropped.
    pub fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let guard = tracing::subscriber::set_default(logs.clone());
        (logs, guard)
    }

    /// The lines at `level` whose message starts with `starts`.
    pub fn lines(&self, level: tracing::Level, starts: &str) -> Vec<String> {
        let events = self.0.lock().unwrap_or_else(|p| p.into_inner());
        events
            .iter()
            .filter(|(l, m)| *l == level && m.starts_with(starts))
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Every line, for a failure's message.
    pub fn all(&self) -> Vec<(tracing::Level, String)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.insert_str(0, &format!("{value:?}"));
        } else {
            self.0.push_str(&format!(" {}={value:?}", field.name()));
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.0.insert_str(0, value);
        } else {
            self.0.push_str(&format!(" {}={value}", field.name()));
        }
    }
}

impl tracing::Subscriber for Logs {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let level = *event.metadata().level();
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((level, message.0));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
