//! A rebuild runs on a task of its own, for the key: the handler's logs
//! during it are inside a span that names the route and the key and follows
//! from the span of the request that started it (a miss, or a stale hit's
//! background refresh).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use stampede_guard::{Backend, StampedeGuard};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Instrument, Metadata, Subscriber};
use tracing_core::span::Current;

use crate::common::{get as get_req, send};

/// A span as the recorder saw it.
#[derive(Clone, Debug, Default)]
struct SpanSeen {
    name: &'static str,
    metadata: Option<&'static Metadata<'static>>,
    fields: HashMap<String, String>,
    follows_from: Vec<u64>,
    parent: Option<u64>,
}

/// An event, with the spans entered on its thread when it fired.
#[derive(Clone, Debug)]
struct EventSeen {
    message: String,
    inside: Vec<u64>,
}

#[derive(Default)]
struct Seen {
    spans: HashMap<u64, SpanSeen>,
    events: Vec<EventSeen>,
}

/// A subscriber that records every span, its fields and follows-from links,
/// and every event with the spans it fired inside.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Seen>>,
    next: Arc<AtomicU64>,
}

thread_local! {
    static ENTERED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl Subscriber for Recorder {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::always()
    }

    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let mut seen = SpanSeen {
            name: span.metadata().name(),
            metadata: Some(span.metadata()),
            parent: match span.parent() {
                Some(parent) => Some(parent.into_u64()),
                None if span.is_contextual() => ENTERED.with(|e| e.borrow().last().copied()),
                None => None,
            },
            ..SpanSeen::default()
        };
        span.record(&mut Fields(&mut seen.fields));
        self.seen.lock().unwrap().spans.insert(id, seen);
        Id::from_u64(id)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some(seen) = self.seen.lock().unwrap().spans.get_mut(&span.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }

    fn record_follows_from(&self, span: &Id, follows: &Id) {
        if let Some(seen) = self.seen.lock().unwrap().spans.get_mut(&span.into_u64()) {
            seen.follows_from.push(follows.into_u64());
        }
    }

    fn event(&self, event: &Event<'_>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        let inside = ENTERED.with(|e| e.borrow().clone());
        self.seen.lock().unwrap().events.push(EventSeen {
            message: fields.remove("message").unwrap_or_default(),
            inside,
        });
    }

    fn current_span(&self) -> Current {
        let Some(id) = ENTERED.with(|e| e.borrow().last().copied()) else {
            return Current::none();
        };
        match self
            .seen
            .lock()
            .unwrap()
            .spans
            .get(&id)
            .and_then(|s| s.metadata)
        {
            Some(metadata) => Current::new(Id::from_u64(id), metadata),
            None => Current::none(),
        }
    }

    fn enter(&self, span: &Id) {
        ENTERED.with(|e| e.borrow_mut().push(span.into_u64()));
    }

    fn exit(&self, span: &Id) {
        let id = span.into_u64();
        ENTERED.with(|e| {
            let mut entered = e.borrow_mut();
            if let Some(at) = entered.iter().rposition(|s| *s == id) {
                entered.remove(at);
            }
        });
    }
}

impl Recorder {
    /// The spans every event with `message` fired inside, with their own
    /// parents, innermost first.
    fn spans_around(&self, message: &str) -> Vec<Vec<(u64, SpanSeen)>> {
        let seen = self.seen.lock().unwrap();
        seen.events
            .iter()
            .filter(|e| e.message == message)
            .map(|e| {
                let mut around = Vec::new();
                let mut ids: Vec<u64> = e.inside.iter().rev().copied().collect();
                while let Some(id) = ids.first().copied() {
                    ids.remove(0);
                    if let Some(span) = seen.spans.get(&id)
                        && !around.iter().any(|(s, _)| *s == id)
                    {
                        around.push((id, span.clone()));
                        ids.extend(span.parent);
                    }
                }
                around
            })
            .collect()
    }

    fn span_named(&self, name: &str, field: &str, value: &str) -> Vec<u64> {
        let seen = self.seen.lock().unwrap();
        let mut ids: Vec<u64> = seen
            .spans
            .iter()
            .filter(|(_, s)| {
                s.name == name && s.fields.get(field).map(String::as_str) == Some(value)
            })
            .map(|(id, _)| *id)
            .collect();
        ids.sort();
        ids
    }
}

fn app(guard: StampedeGuard) -> Router {
    Router::new().route(
        "/report",
        get(|| async {
            tracing::info!("handler ran");
            "v"
        })
        .layer(guard),
    )
}

/// Checks that every "handler ran" event fired inside a flight span with
/// the route and `key`, that follows from the span `request`.
fn assert_rebuild_follows(recorder: &Recorder, key: &str, request: u64, runs: usize) {
    let events = recorder.spans_around("handler ran");
    assert_eq!(events.len(), runs, "the handler's events");
    for around in events {
        let flight = around
            .iter()
            .find(|(_, s)| s.name == "stampede_guard.flight")
            .unwrap_or_else(|| panic!("the handler ran outside any flight span: {around:?}"));
        let fields = &flight.1.fields;
        assert_eq!(fields.get("route").map(String::as_str), Some("report"));
        assert_eq!(fields.get("key").map(String::as_str), Some(key));
        assert_eq!(
            flight.1.follows_from,
            vec![request],
            "the flight follows from the request that started it"
        );
        // Its own task, for the key: not a child of the request it follows
        // from, which may end long before it.
        assert!(around.iter().all(|(id, _)| *id != request), "{around:?}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_rebuild_runs_in_a_span_that_follows_from_its_request() {
    let recorder = Recorder::default();
    let _default = tracing::subscriber::set_default(recorder.clone());
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_secs(600))
        .route_name("report");
    let key = guard.key_for(&get_req("/report")).unwrap().to_string();
    let app = app(guard);
    let answer = send(&app, get_req("/report"))
        .instrument(tracing::info_span!("request", n = 1))
        .await;
    assert_eq!(answer.x_cache(), "MISS");
    let request = recorder.span_named("request", "n", "1");
    assert_eq!(request.len(), 1);
    assert_rebuild_follows(&recorder, &key, request[0], 1);
    // A hit runs no handler, so no flight.
    let hit = send(&app, get_req("/report"))
        .instrument(tracing::info_span!("request", n = 2))
        .await;
    assert_eq!(hit.x_cache(), "HIT");
    assert_eq!(recorder.spans_around("handler ran").len(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_background_refresh_follows_from_the_stale_hit_that_started_it() {
    let recorder = Recorder::default();
    let _default = tracing::subscriber::set_default(recorder.clone());
    let guard = StampedeGuard::new(Backend::local())
        .ttl(Duration::from_millis(100))
        .stale_while_revalidate(Duration::from_secs(600))
        .route_name("report");
    let key = guard.key_for(&get_req("/report")).unwrap().to_string();
    let app = app(guard);
    send(&app, get_req("/report"))
        .instrument(tracing::info_span!("request", n = 1))
        .await;
    // Past the ttl: the next request is a stale hit that starts a refresh.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stale = send(&app, get_req("/report"))
        .instrument(tracing::info_span!("request", n = 2))
        .await;
    assert_eq!(stale.x_cache(), "STALE");
    for _ in 0..2000 {
        if recorder.spans_around("handler ran").len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let first = recorder.span_named("request", "n", "1")[0];
    let second = recorder.span_named("request", "n", "2")[0];
    let events = recorder.spans_around("handler ran");
    assert_eq!(events.len(), 2);
    let follows: Vec<Vec<u64>> = events
        .iter()
        .map(|around| {
            let flight = around
                .iter()
                .find(|(_, s)| s.name == "stampede_guard.flight")
                .expect("inside a flight span");
            assert_eq!(flight.1.fields.get("key"), Some(&key));
            assert_eq!(
                flight.1.fields.get("route").map(String::as_str),
                Some("report")
            );
            flight.1.follows_from.clone()
        })
        .collect();
    assert_eq!(follows, vec![vec![first], vec![second]]);
}
