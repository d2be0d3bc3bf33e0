//! An origin whose answer and delay a test changes as it goes, for the
//! refresh-ahead attack tests.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::{header, StatusCode};
use stampede_guard::StampedeGuard;

use super::{get as get_req, send, Answer, Origin};

/// What the origin answers from now on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reply {
    Good,
    NoStore,
    Private,
    SetCookie,
    Unavailable,
    /// A 200 whose body is 64 KiB.
    Huge,
    /// A 503 marked `no-store`.
    UnavailableNoStore,
    /// `Vary: Accept-Language`, the body naming the language asked for.
    VaryLanguage,
    /// A 200 whose body names the request's credentials and cookie, with
    /// no `Cache-Control` (an origin that trusts its shared cache).
    Personal,
}

/// An origin whose answer and delay the test changes as it goes.
#[derive(Clone)]
pub struct Scripted {
    pub origin: Origin,
    pub reply: Arc<Mutex<Reply>>,
    pub delay_ms: Arc<AtomicU64>,
    pub done: Arc<AtomicUsize>,
    /// When each origin call began.
    pub began: Arc<Mutex<Vec<Instant>>>,
}

impl Scripted {
    pub fn new(delay: Duration) -> Self {
        Scripted {
            origin: Origin::default(),
            reply: Arc::new(Mutex::new(Reply::Good)),
            delay_ms: Arc::new(AtomicU64::new(delay.as_millis() as u64)),
            done: Arc::new(AtomicUsize::new(0)),
            began: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn set(&self, reply: Reply) {
        *self.reply.lock().unwrap() = reply;
    }

    pub fn delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    pub fn calls(&self) -> usize {
        self.origin.calls()
    }

    /// Waits (bounded) until `n` origin calls have finished.
    pub async fn finished(&self, n: usize) {
        let started = Instant::now();
        while self.done.load(Ordering::SeqCst) < n {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{n} origin calls did not finish"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn app(&self, guard: &StampedeGuard) -> Router {
        let me = self.clone();
        let handler = move |headers: http::HeaderMap| {
            let me = me.clone();
            async move {
                let (n, _running) = me.origin.enter();
                me.began.lock().unwrap().push(Instant::now());
                let reply = *me.reply.lock().unwrap();
                let delay = me.delay_ms.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                me.done.fetch_add(1, Ordering::SeqCst);
                let language = headers
                    .get(header::ACCEPT_LANGUAGE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_owned();
                let who = |name: header::HeaderName| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned()
                };
                let body = match reply {
                    Reply::VaryLanguage => format!("v{n}-{language}"),
                    Reply::Personal => {
                        format!("v{n}-{}{}", who(header::AUTHORIZATION), who(header::COOKIE))
                    }
                    _ => format!("v{n}"),
                };
                let response: Response = match reply {
                    Reply::Good | Reply::Personal => body.into_response(),
                    Reply::Huge => format!("{body}{}", "x".repeat(64 * 1024)).into_response(),
                    Reply::NoStore => ([(header::CACHE_CONTROL, "no-store")], body).into_response(),
                    Reply::Private => {
                        ([(header::CACHE_CONTROL, "private, max-age=60")], body).into_response()
                    }
                    Reply::SetCookie => {
                        ([(header::SET_COOKIE, "session=victim")], body).into_response()
                    }
                    Reply::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, body).into_response(),
                    Reply::UnavailableNoStore => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [(header::CACHE_CONTROL, "no-store")],
                        body,
                    )
                        .into_response(),
                    Reply::VaryLanguage => {
                        ([(header::VARY, "accept-language")], body).into_response()
                    }
                };
                response
            }
        };
        Router::new().route("/report", get(handler).layer(guard.clone()))
    }
}

/// Sequential requests every 10 ms for `span`.
pub async fn traffic(apps: &[Router], span: Duration) -> Vec<Answer> {
    let started = Instant::now();
    let mut answers = Vec::new();
    let mut i = 0;
    while started.elapsed() < span {
        answers.push(send(&apps[i % apps.len()], get_req("/report")).await);
        i += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    answers
}

/// Waits (bounded) until the origin was called `n` times, sending requests
/// to `app` meanwhile; the answers.
pub async fn until_calls(s: &Scripted, app: &Router, n: usize) -> Vec<Answer> {
    let started = Instant::now();
    let mut answers = Vec::new();
    while s.calls() < n {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the origin was not called {n} times"
        );
        answers.push(send(app, get_req("/report")).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    answers
}
