//! [`Admin`]: an axum router for operators, which the application mounts
//! behind its own authentication (feature `admin`).
//!
//! | method and path | body | answer |
//! |---|---|---|
//! | `POST` or `DELETE` `/purge/url` | `{"url": "https://host/path?q"}` | `200 {"purged":"url"}`; `400` for a URL that is not one |
//! | `POST` or `DELETE` `/purge/tag` | `{"tag": "report"}` | `200 {"purged":"tag"}` (in the guards' namespaces) |
//! | `POST` or `DELETE` `/purge/all` | none | `200 {"purged":"all"}` (every entry of the guards' namespaces) |
//! | `GET` `/stats` | | [`BackendStats`](crate::BackendStats) as JSON |
//! | `GET` `/health` | | `200` when ready, `503` when degraded; the body says why |
//!
//! A purge that did not reach Redis answers:
//!
//! - `202 Accepted` with `{"queued":"url","kind":…,"message":…}` when the
//!   backend kept it and makes it once Redis answers (a URL's purge during
//!   an outage or before the backend first connected; a tag's or
//!   everything's before it first connected): do not retry;
//! - `503 Service Unavailable` with `{"error":{"kind":…,"message":…}}`
//!   when it is not kept (a tag's or everything's during an outage, a
//!   backend shut down): call it again once Redis answers.
//!
//! Purges take effect as [`StampedeGuard::invalidate_url`],
//! [`invalidate_tag`](StampedeGuard::invalidate_tag) and
//! [`invalidate_all`](StampedeGuard::invalidate_all) say (see
//! [`Error::is_queued`]).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::layer::StampedeGuard;
use crate::backend::{Health, Status};
use crate::error::{Error, ErrorKind};

/// An admin router over one backend: purges by URL, tag or all, the
/// backend's counters and its readiness, as JSON. It authenticates nobody:
/// mount it behind the application's own authentication.
///
/// A purge by URL drops the URL's entries under the key rules (namespace,
/// key function) of each guard given, so give one guard per distinct rule
/// set (routes in one namespace without a key function share one). A purge
/// by tag or of all reaches the namespaces of the guards given, each once,
/// and no other namespace on the backend (see
/// [`StampedeGuard::invalidate_tag`]).
///
/// ```
/// use axum::{middleware, Router};
/// use axum::extract::Request;
/// use axum::middleware::Next;
/// use axum::response::Response;
/// use http::StatusCode;
/// use stampede_guard::{Admin, Backend, StampedeGuard};
///
/// async fn operators_only(request: Request, next: Next) -> Result<Response, StatusCode> {
///     match request.headers().get("authorization") {
///         Some(token) if token == "Bearer let-me-in" => Ok(next.run(request).await),
///         _ => Err(StatusCode::UNAUTHORIZED),
///     }
/// }
///
/// let guard = StampedeGuard::new(Backend::local());
/// let app: Router = Router::new()
///     // .route("/report", get(report).layer(guard.clone()))
///     .nest(
///         "/admin/cache",
///         Admin::new(guard).router().layer(middleware::from_fn(operators_only)),
///     );
/// ```
#[derive(Clone, Debug)]
pub struct Admin {
    guards: Vec<StampedeGuard>,
}

impl Admin {
    /// An admin router's settings over `guard`'s backend, purging URLs
    /// under `guard`'s key rules.
    ///
    /// ```
    /// use stampede_guard::{Admin, Backend, StampedeGuard};
    ///
    /// let admin = Admin::new(StampedeGuard::new(Backend::local()));
    /// ```
    #[must_use]
    pub fn new(guard: StampedeGuard) -> Self {
        Admin {
            guards: vec![guard],
        }
    }

    /// Purges by URL also under `guard`'s key rules (another namespace, or
    /// a key function), and by tag and of all also in its namespace. It
    /// should be on the same backend.
    ///
    /// ```
    /// use stampede_guard::{Admin, Backend, StampedeGuard};
    ///
    /// let guard = StampedeGuard::new(Backend::local());
    /// let admin = Admin::new(guard.clone()).route(guard.namespace("feeds"));
    /// ```
    #[must_use]
    pub fn route(mut self, guard: StampedeGuard) -> Self {
        self.guards.push(guard);
        self
    }

    /// The router, to [`nest`](Router::nest) under a path of the
    /// application's behind its authentication (see [`Admin`]).
    ///
    /// ```
    /// use axum::Router;
    /// use stampede_guard::{Admin, Backend, StampedeGuard};
    ///
    /// let admin: Router = Admin::new(StampedeGuard::new(Backend::local())).router();
    /// ```
    pub fn router<S>(self) -> Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        Router::new()
            .route(
                "/purge/url",
                post(Admin::purge_url).delete(Admin::purge_url),
            )
            .route(
                "/purge/tag",
                post(Admin::purge_tag).delete(Admin::purge_tag),
            )
            .route(
                "/purge/all",
                post(Admin::purge_all).delete(Admin::purge_all),
            )
            .route("/stats", get(Admin::stats))
            .route("/health", get(Admin::health))
            .with_state(self)
    }

    /// Every guard's key rules are purged, whatever an earlier one
    /// answered: the answer is the worst (an error not kept, then one kept,
    /// then done).
    async fn purge_url(State(admin): State<Admin>, Json(body): Json<UrlBody>) -> Answer {
        let mut worst: Option<Error> = None;
        for guard in &admin.guards {
            if let Err(e) = guard.invalidate_url(&body.url).await {
                if e.kind() == ErrorKind::InvalidInput {
                    return Answer::failed("url", &e);
                }
                if worst.as_ref().is_none_or(Error::is_queued) {
                    worst = Some(e);
                }
            }
        }
        match worst {
            None => Answer::purged("url"),
            Some(e) => Answer::failed("url", &e),
        }
    }

    /// One guard per namespace among the guards given, in order.
    fn namespaces(&self) -> Vec<&StampedeGuard> {
        let mut seen = Vec::new();
        self.guards
            .iter()
            .filter(|guard| {
                let fresh = !seen.contains(&guard.scope());
                seen.push(guard.scope());
                fresh
            })
            .collect()
    }

    async fn purge_tag(State(admin): State<Admin>, Json(body): Json<TagBody>) -> Answer {
        let mut worst: Option<Error> = None;
        for guard in admin.namespaces() {
            keep_worst(&mut worst, guard.invalidate_tag(&body.tag).await);
        }
        match worst {
            None => Answer::purged("tag"),
            Some(e) => Answer::failed("tag", &e),
        }
    }

    async fn purge_all(State(admin): State<Admin>) -> Answer {
        let mut worst: Option<Error> = None;
        for guard in admin.namespaces() {
            keep_worst(&mut worst, guard.invalidate_all().await);
        }
        match worst {
            None => Answer::purged("all"),
            Some(e) => Answer::failed("all", &e),
        }
    }

    async fn stats(State(admin): State<Admin>) -> Json<crate::backend::BackendStats> {
        Json(admin.guards[0].backend().stats())
    }

    async fn health(State(admin): State<Admin>) -> (StatusCode, Json<Readiness>) {
        let health = admin.guards[0].backend().health();
        let readiness = Readiness::of(health);
        let status = if readiness.ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        (status, Json(readiness))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UrlBody {
    url: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TagBody {
    tag: String,
}

/// A purge's answer: what was purged, or why not.
type Answer = (StatusCode, Json<Outcome>);

#[derive(Serialize)]
#[serde(untagged)]
enum Outcome {
    Purged {
        purged: &'static str,
    },
    Queued {
        queued: &'static str,
        kind: String,
        message: String,
    },
    Error {
        error: Failure,
    },
}

#[derive(Serialize)]
struct Failure {
    kind: String,
    message: String,
}

trait AnswerExt {
    fn purged(what: &'static str) -> Self;
    fn failed(what: &'static str, error: &Error) -> Self;
}

impl AnswerExt for Answer {
    fn purged(what: &'static str) -> Self {
        (StatusCode::OK, Json(Outcome::Purged { purged: what }))
    }

    /// `202` for a purge kept to be made once Redis answers, `400` for an
    /// argument that is not one, else `503`.
    fn failed(what: &'static str, error: &Error) -> Self {
        let kind = format!("{:?}", error.kind());
        let message = error.to_string();
        if error.is_queued() {
            let outcome = Outcome::Queued {
                queued: what,
                kind,
                message,
            };
            return (StatusCode::ACCEPTED, Json(outcome));
        }
        let status = match error.kind() {
            ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        let outcome = Outcome::Error {
            error: Failure { kind, message },
        };
        (status, Json(outcome))
    }
}

/// The readiness answer: [`Health`] and, when degraded, why.
#[derive(Serialize)]
struct Readiness {
    ready: bool,
    #[serde(flatten)]
    health: Health,
    why: Vec<&'static str>,
}

impl Readiness {
    fn of(health: Health) -> Self {
        let ready = health.status != Status::Degraded;
        let mut why = Vec::new();
        #[cfg(feature = "redis")]
        if let (false, Some(redis)) = (ready, &health.redis) {
            if !redis.connected {
                why.push("not connected to Redis yet");
            }
            if !redis.reachable {
                why.push("Redis does not answer: a circuit is open");
            }
            if !redis.subscription_live {
                why.push("the subscription to the fleet's invalidations is not confirmed live");
            }
        }
        if !ready && why.is_empty() {
            why.push("serving from the in-process tier alone");
        }
        Readiness { ready, health, why }
    }
}

/// Keeps the worse of two purge errors: one not kept over one kept.
fn keep_worst(worst: &mut Option<Error>, result: Result<(), Error>) {
    if let Err(e) = result
        && worst.as_ref().is_none_or(Error::is_queued)
    {
        *worst = Some(e);
    }
}
