//! [`StampedeGuard`]: the layer, the per-route policy it carries, and every
//! method that configures it (each builder, [`RouteConfig`] applied whole,
//! tags) or acts on its backend (invalidation by request, tag or all).

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Request, StatusCode};
use tower_layer::Layer;

use super::cache_status::Rfc9211;
use super::flight::WaitTimeout;
use super::key::{request_key, KeyFn, KeyRules, Keyed};
use super::policy::Policy;
use super::route_config::RouteConfig;
use super::service::GuardService;
use super::tags::TagFn;
use crate::backend::Backend;
use crate::key::Key;
use crate::limits;
use crate::store::generations::Field;

/// A tower layer that caches responses and lets only one request per key
/// rebuild an expired entry while the others wait for it or are served stale.
///
/// Configure it in one expression; every method takes and returns `self`.
/// Clones share the backend (and so the cache), each with its own policy, which
/// is how routes get different settings:
///
/// ```
/// use std::time::Duration;
/// use axum::{routing::get, Router};
/// use stampede_guard::{Backend, StampedeGuard};
///
/// async fn report() -> &'static str { "expensive" }
/// async fn feed() -> &'static str { "fast-moving" }
///
/// let guard = StampedeGuard::new(Backend::local())
///     .ttl(Duration::from_secs(30))
///     .stale_while_revalidate(Duration::from_secs(60));
/// let app: Router = Router::new()
///     .route("/report", get(report).layer(guard.clone()))
///     .route("/feed", get(feed).layer(guard.clone().ttl(Duration::from_secs(2))));
/// ```
///
/// # The knobs most routes need
///
/// - [`ttl`](Self::ttl): how long an answer is fresh.
/// - [`stale_while_revalidate`](Self::stale_while_revalidate) and
///   [`stale_if_error`](Self::stale_if_error): after the ttl, serve the old
///   answer while one request rebuilds it, or in place of a failed rebuild
///   (an error or a 5xx).
/// - [`respect_cache_control`](Self::respect_cache_control): let the
///   origin's `Cache-Control` set the freshness.
/// - [`vary`](Self::vary): request headers that select different answers.
/// - [`namespace`](Self::namespace): keep apart the services or versions
///   that share a backend.
/// - [`invalidate`](Self::invalidate), [`invalidate_tag`](Self::invalidate_tag)
///   and [`invalidate_url`](Self::invalidate_url): purge after a write.
///
/// # All the other methods, by what they do
///
/// - Freshness: [`early_refresh`](Self::early_refresh),
///   [`refresh_ahead`](Self::refresh_ahead),
///   [`hit_for_miss`](Self::hit_for_miss),
///   [`cacheable_statuses`](Self::cacheable_statuses),
///   [`cache_control_targets`](Self::cache_control_targets),
///   [`respect_request_cache_control`](Self::respect_request_cache_control).
/// - Coalescing and waiting: [`wait_budget`](Self::wait_budget),
///   [`on_wait_timeout`](Self::on_wait_timeout), [`lease`](Self::lease),
///   [`rebuild_timeout`](Self::rebuild_timeout).
/// - Keys: [`key_fn`](Self::key_fn), [`ignore_vary`](Self::ignore_vary),
///   [`forwarded_headers`](Self::forwarded_headers),
///   [`key_for`](Self::key_for).
/// - Storage safety: [`max_body_bytes`](Self::max_body_bytes),
///   [`allow_credentials`](Self::allow_credentials),
///   [`strip_set_cookie`](Self::strip_set_cookie),
///   [`cache_private`](Self::cache_private).
/// - Invalidation: [`invalidate_all`](Self::invalidate_all),
///   [`invalidate_on_unsafe`](Self::invalidate_on_unsafe),
///   [`tags`](Self::tags), [`tag_headers`](Self::tag_headers),
///   [`expose_tag_headers`](Self::expose_tag_headers).
/// - Observability: [`cache_status`](Self::cache_status),
///   [`cache_status_name`](Self::cache_status_name),
///   [`x_cache_header`](Self::x_cache_header),
///   [`route_name`](Self::route_name).
/// - Setup: [`new`](Self::new), [`with_config`](Self::with_config) (a
///   [`RouteConfig`] read with serde), [`backend`](Self::backend).
///
/// Only `GET` and `HEAD` requests are cached (HEAD is answered from the GET
/// entry). Requests with credentials and responses that must not be shared pass
/// through untouched unless the route opts in; see the methods below.
///
/// With a compression layer (tower-http's `CompressionLayer`), the guard
/// goes inside it to store one uncompressed copy and compress each response
/// on the way out, or outside it to store one copy per content coding, keyed
/// on the normalised `Accept-Encoding` (see [`vary`](Self::vary)):
///
/// ```
/// use std::time::Duration;
/// use axum::{routing::get, Router};
/// use stampede_guard::{Backend, StampedeGuard};
///
/// async fn report() -> &'static str { "expensive" }
///
/// let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(30));
/// // Inside: `.route("/report", get(report).layer(guard))` under the
/// // compression layer. Outside, declared up front:
/// let app: Router = Router::new()
///     .route("/report", get(report))
///     .layer(tower_http::compression::CompressionLayer::new())
///     .layer(guard.vary([http::header::ACCEPT_ENCODING]));
/// ```
#[derive(Clone, Debug)]
pub struct StampedeGuard {
    pub(super) backend: Backend,
    policy: Arc<Policy>,
}

impl StampedeGuard {
    /// A guard on `backend` with the default policy: 10 s ttl, no stale
    /// windows, 10 s wait budget, bodies up to 4 MiB, the `x-cache` and
    /// `Cache-Status` headers on.
    ///
    /// A request that names no host (HTTP/1.0 without `Host`, an in-process
    /// call with an origin-form URI, an empty `Host`) is keyed under its
    /// guard: the Nth guard built on a backend keys it under N, so two
    /// services sharing a backend never answer each other's host-less
    /// requests, while instances of a fleet that build their guards in the
    /// same order share them. Clones of a guard and every builder method keep
    /// its ordinal; requests that name a host are keyed without it.
    ///
    /// ```
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// let guard = StampedeGuard::new(Backend::local());
    /// ```
    #[must_use]
    pub fn new(backend: Backend) -> Self {
        crate::metrics::describe_once();
        let mut policy = Policy::default();
        policy.store.keep_bound = backend.engine.keep_bound();
        policy.keys.guard = backend
            .guards
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        StampedeGuard {
            backend,
            policy: Arc::new(policy),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Policy)) -> Self {
        change(Arc::make_mut(&mut self.policy));
        self
    }

    /// How long a response is served as fresh (default 10 s).
    ///
    /// From 0 to 2^31 s; a longer one is taken as 2^31 s. At 0 nothing is
    /// stored on the route's own lifetime: requests still coalesce, and with
    /// [`respect_cache_control`](Self::respect_cache_control) an answer the
    /// origin gives freshness to is stored for that long.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).ttl(Duration::from_secs(30));
    /// ```
    #[must_use]
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|p| p.store.lifetime.ttl = limits::TTL.clamp(ttl))
    }

    /// After the ttl, how long an entry is still served at once while one
    /// request refreshes it in the background (RFC 5861). Default 0 (none);
    /// from 0 to 2^31 s, a longer one taken as 2^31 s.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local())
    ///     .ttl(Duration::from_secs(30))
    ///     .stale_while_revalidate(Duration::from_secs(60));
    /// ```
    #[must_use]
    pub fn stale_while_revalidate(self, window: Duration) -> Self {
        self.with(|p| {
            p.store.lifetime.stale_while_revalidate = limits::STALE_WHILE_REVALIDATE.clamp(window);
        })
    }

    /// After the ttl, how long an entry may stand in for a failed rebuild: an
    /// inner-service error or a 5xx response (RFC 5861). Default 0 (none);
    /// from 0 to 2^31 s, a longer one taken as 2^31 s.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).stale_if_error(Duration::from_secs(600));
    /// ```
    #[must_use]
    pub fn stale_if_error(self, window: Duration) -> Self {
        self.with(|p| p.store.lifetime.stale_if_error = limits::STALE_IF_ERROR.clamp(window))
    }

    /// How long a request waits for a rebuild it did not start before
    /// [`on_wait_timeout`](Self::on_wait_timeout) applies (default 10 s;
    /// from 0 to 2^31 s, a longer one taken as 2^31 s).
    ///
    /// Failing open (the default), nobody is sent to the origin when it runs
    /// out: a request keeps waiting for its own process's rebuild, and that
    /// rebuild waits for another instance's as long as the other may run
    /// (the [rebuild timeout](Self::rebuild_timeout) plus a lease, or the
    /// budget if longer), so a slow origin is still called once for the
    /// fleet. Failing closed, the budget is when the route answers.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).wait_budget(Duration::from_secs(2));
    /// ```
    #[must_use]
    pub fn wait_budget(self, budget: Duration) -> Self {
        self.with(|p| p.flight.wait_budget = limits::WAIT_BUDGET.clamp(budget))
    }

    /// What a waiter does when its wait budget runs out (default: keep
    /// waiting for this process's own rebuild; see [`WaitTimeout`]).
    ///
    /// # Panics
    ///
    /// On [`WaitTimeout::Respond`] with a status outside 200..=599: it
    /// would not be a final answer (a server turns a 1xx into a 500). The
    /// status is a constant in code, so this is a programmer error, seen
    /// when the guard is built rather than in the answers.
    ///
    /// ```
    /// # use std::time::Duration;
    /// use http::StatusCode;
    /// use stampede_guard::{Backend, StampedeGuard, WaitTimeout};
    ///
    /// let guard = StampedeGuard::new(Backend::local())
    ///     .wait_budget(Duration::from_secs(2))
    ///     .on_wait_timeout(WaitTimeout::Respond(StatusCode::SERVICE_UNAVAILABLE));
    /// ```
    #[must_use]
    pub fn on_wait_timeout(self, action: WaitTimeout) -> Self {
        if let WaitTimeout::Respond(code) = action {
            assert!(
                limits::ANSWER_STATUS.contains(&code.as_u16()),
                "StampedeGuard::on_wait_timeout: status {} is out of range; it accepts {}",
                code.as_u16(),
                limits::ANSWER_STATUS_ACCEPTED,
            );
        }
        self.with(|p| p.flight.on_wait_timeout = action)
    }

    /// Largest body stored (default 4 MiB; at least 1 byte, 0 is taken as
    /// 1). A larger response is not stored:
    /// it is read from the origin once and streamed to every request that
    /// waited for it, each from the start, within `4 × bytes` of memory
    /// (plus one chunk). No request holds the others back: when that window
    /// is full and a request waits for more while another lags behind, the
    /// oldest chunks go to a temporary file (unlinked as it is made), at
    /// most `64 × bytes` per body and never more than its declared length;
    /// the lagging request reads them from there, the others read on. A
    /// request's body ends with an error, so its connection is closed, only
    /// when it reads nothing for 10 seconds while the bytes it would read
    /// next were already read by another (a client whose receive window
    /// stays shut), or falls further behind than the file holds (the others
    /// then wait for it until the next chunk has waited 10 seconds). A
    /// request that keeps reading within that, however slowly, ends whole;
    /// one that hangs up lets go at once; one reading alone is never cut
    /// off. If the file
    /// cannot be made, the window alone serves: the origin is read on as the
    /// slowest request reads, and one whose next chunk has waited 10 seconds
    /// while others read ahead is cut off. A request that comes after the
    /// start was let go calls the origin itself. The key then skips
    /// coalescing for the [`hit_for_miss`](Self::hit_for_miss) window, so
    /// later requests go to the origin side by side rather than queue
    /// behind a body that will not be stored.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).max_body_bytes(16 << 20);
    /// ```
    #[must_use]
    pub fn max_body_bytes(self, bytes: usize) -> Self {
        let bytes = bytes.max(*limits::MAX_BODY_BYTES.start());
        self.with(|p| p.store.max_body_bytes = bytes)
    }

    /// Statuses that may be stored (default 200, 203, 204, 300, 301, 308, 404,
    /// 410). Other responses go to the request that caused them alone (a 429
    /// or 403 may be meant for that client only): the requests waiting on the
    /// same rebuild do not get them, one of them rebuilds instead. A 5xx is a
    /// failed rebuild: the waiters share it (or the stale-if-error copy).
    ///
    /// # Panics
    ///
    /// On a status outside 100..=599 (the statuses HTTP defines): statuses
    /// are constants in code, so this is a programmer error, seen when the
    /// guard is built.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).cacheable_statuses([http::StatusCode::OK]);
    /// ```
    #[must_use]
    pub fn cacheable_statuses(self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        let statuses: Arc<[StatusCode]> = statuses.into_iter().collect();
        for code in statuses.iter() {
            assert!(
                limits::STORED_STATUS.contains(&code.as_u16()),
                "StampedeGuard::cacheable_statuses: status {} is out of range; it accepts {}",
                code.as_u16(),
                limits::STORED_STATUS_ACCEPTED,
            );
        }
        self.with(|p| p.store.statuses = statuses)
    }

    /// Request headers whose values select different responses (for example
    /// `accept-language`). They become part of the key. A response whose own
    /// `Vary` names a header not listed here is stored too, per URL, and
    /// served only to requests with the same values of the headers it
    /// nominates (at most 65 variants per URL; `Vary: *` is never stored):
    /// listing a header keys on it from the first request instead.
    ///
    /// `accept-encoding` is keyed in a normalised form: the codings among
    /// zstd, br, gzip and deflate the client accepts (q > 0), ordered by q
    /// then name, so `gzip, br` and `br,gzip` share an entry while `gzip`
    /// alone has its own. (A value in an unusual shape, with a wildcard or
    /// `x-gzip`, is keyed as sent.) A route need not list it: the first
    /// answer whose `Vary` names `accept-encoding` makes the route key on it
    /// from then on, and that answer is not stored. List it to skip that
    /// first unprotected answer.
    ///
    /// With tower-http's `CompressionLayer`, put the guard *inside* it to
    /// store one uncompressed copy and compress each response on the way out,
    /// or *outside* it to store one copy per coding (compressed once per
    /// entry, not per response).
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).vary([http::header::ACCEPT_LANGUAGE]);
    /// ```
    #[must_use]
    pub fn vary(self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        let vary: Arc<[HeaderName]> = headers.into_iter().collect();
        self.with(|p| p.keys.vary = vary)
    }

    /// The forwarding headers this deployment's handlers may read the host,
    /// scheme, port or path prefix from, keyed on so that a client cannot
    /// store an answer built from values it forged. Default:
    /// `x-forwarded-host`, `x-forwarded-proto`, `x-forwarded-port`,
    /// `x-forwarded-prefix` and `forwarded`. Behind one load balancer these
    /// are the same for every request, so they split nothing.
    ///
    /// `forwarded` is keyed without its `for=` parameters (they name the
    /// client, and would give each client its own entry); the rest of it
    /// (`host=`, `proto=`, …) is kept byte for byte, and a value whose
    /// quoting parsers could read two ways is keyed whole.
    ///
    /// Pass an empty list when the deployment's edge strips these five
    /// headers from client requests, or name the ones your edge sets; the
    /// list may also name headers of your own (a site header the edge
    /// sets). Every other header of the class frameworks and proxies
    /// honour to rewrite the request's URL, path, prefix, host, port or
    /// scheme is keyed when a request carries it, whatever this list says:
    /// the class is told by the name's words (`x-original-url`,
    /// `x-rewrite-url`, `x-forwarded-uri`, `x-host`, `x-envoy-original-path`,
    /// `front-end-https`: any name with `url`, `uri`, `host`, `path`,
    /// `original`, `rewrite`, `override` or `forwarded`, or ending in
    /// `prefix`, `port`, `proto`, `scheme`, …; never a name ending in `for`
    /// or `ip`, which names the client). A header with the word `method` or `verb`
    /// (`X-HTTP-Method-Override` and kin) sends the request past the cache
    /// instead: a framework that honours it answers another method.
    ///
    /// Forwarding headers select a variant of the URL, as the
    /// [`vary`](Self::vary) headers do: a request given to
    /// [`invalidate`](Self::invalidate) (or an unsafe method) drops the
    /// entries of every value, whether it carries them or not.
    ///
    /// ```
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// // The edge strips client forwarding headers and sets X-Forwarded-Proto.
    /// let guard = StampedeGuard::new(Backend::local())
    ///     .forwarded_headers([http::HeaderName::from_static("x-forwarded-proto")]);
    /// ```
    #[must_use]
    pub fn forwarded_headers(self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        let forwarded: Arc<[HeaderName]> = headers.into_iter().collect();
        self.with(|p| p.keys.forwarded = forwarded)
    }

    /// The route's own key, in place of host, path and query. Return `None` to
    /// pass a request through uncached. The namespace, the target's scheme,
    /// the forwarding headers and the Vary headers are still part of the key.
    ///
    /// ```
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// // One entry per tenant, whatever the query says.
    /// let guard = StampedeGuard::new(Backend::local()).key_fn(|req| {
    ///     let tenant = req.headers.get("x-tenant")?.to_str().ok()?;
    ///     Some(format!("{}:{}", tenant, req.uri.path()))
    /// });
    /// ```
    #[must_use]
    pub fn key_fn<F>(self, key_fn: F) -> Self
    where
        F: Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
    {
        let key_fn: KeyFn = Arc::new(key_fn);
        self.with(|p| p.keys.key_fn = Some(key_fn))
    }

    /// The non-standard one-word outcome header (`HIT`, `STALE`, `MISS`,
    /// `COALESCED`, `BYPASS`): its name (default `x-cache`), or `None` to
    /// send none. The standard RFC 9211 [`Cache-Status`](Self::cache_status)
    /// header is set beside it, or alone: this method never changes it.
    ///
    /// ```
    /// use http::HeaderName;
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// // Cache-Status alone, without x-cache:
    /// let guard = StampedeGuard::new(Backend::local()).x_cache_header(None);
    /// // The outcome under another name:
    /// let guard = StampedeGuard::new(Backend::local())
    ///     .x_cache_header(Some(HeaderName::from_static("x-edge-cache")));
    /// ```
    #[must_use]
    pub fn x_cache_header(self, header: Option<HeaderName>) -> Self {
        self.with(|p| p.presentation.status_header = header)
    }

    /// The old name of [`x_cache_header`](Self::x_cache_header), which it
    /// calls: it names the `x-cache` header, not `Cache-Status`.
    #[doc(hidden)]
    #[deprecated(
        note = "renamed `x_cache_header`: it sets the `x-cache` header, not `Cache-Status`"
    )]
    #[must_use]
    pub fn cache_status_header(self, header: Option<HeaderName>) -> Self {
        self.x_cache_header(header)
    }

    /// Whether responses carry this layer's member of the RFC 9211
    /// `Cache-Status` header (on by default), beside or instead of
    /// [`x-cache`](Self::x_cache_header):
    /// `stampede-guard; hit; ttl=27`, `stampede-guard; fwd=uri-miss; stored`,
    /// `stampede-guard; fwd=uri-miss; collapsed` for a request that waited on
    /// another's rebuild, `stampede-guard; hit; ttl=-3` for a stale entry
    /// served while it is revalidated, `stampede-guard; fwd=stale;
    /// fwd-status=503; ttl=-40; detail=stale-if-error` for one standing in
    /// for a failure, `fwd=method`, `fwd=request` or `fwd=bypass` for a
    /// request passed through.
    ///
    /// A `Cache-Status` the origin's response already carries (a cache
    /// between the layer and the origin) is kept on the responses that come
    /// straight from the origin (a miss's streamed answer, a pass-through),
    /// and this layer's member is added after it, as RFC 9211 orders them;
    /// it is never stored with the entry, so a response made from an entry
    /// (a hit, a waiter's answer) carries this layer's member alone.
    ///
    /// ```
    /// use stampede_guard::{Backend, StampedeGuard};
    /// // Cache-Status alone, without x-cache:
    /// let guard = StampedeGuard::new(Backend::local()).x_cache_header(None);
    /// // x-cache alone:
    /// let guard = StampedeGuard::new(Backend::local()).cache_status(false);
    /// ```
    #[must_use]
    pub fn cache_status(self, on: bool) -> Self {
        self.with(|p| match (on, &p.presentation.cache_status) {
            (false, _) => p.presentation.cache_status = None,
            (true, None) => p.presentation.cache_status = Some(Rfc9211::default_name()),
            (true, Some(_)) => {}
        })
    }

    /// The cache's name in its `Cache-Status` member (default
    /// `stampede-guard`), and turns the member on. A name that is not a
    /// structured-field token is sent as a quoted string, without the
    /// characters a string cannot hold. An empty name, which
    /// [`RouteConfig`] refuses, is taken as the default.
    ///
    /// ```
    /// use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).cache_status_name("api-edge");
    /// ```
    #[must_use]
    pub fn cache_status_name(self, name: impl AsRef<str>) -> Self {
        let members = match name.as_ref() {
            "" => Rfc9211::default_name(),
            name => Rfc9211::new(name),
        };
        self.with(|p| p.presentation.cache_status = Some(members))
    }

    /// The `route` label of this route's metrics. Without one, a route is
    /// labelled with its matched path as axum's router records it (with
    /// the `axum` feature: `/users/{id}`, never the path a client sent), or
    /// `unnamed`. A name the code gives, never data from a request: every
    /// distinct name is a series of its own for the life of the process.
    /// An empty name, which [`RouteConfig`] refuses, is no name.
    ///
    /// ```
    /// use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).route_name("report");
    /// ```
    #[must_use]
    pub fn route_name(self, name: impl Into<String>) -> Self {
        let name: String = name.into();
        let name: Option<Arc<str>> = (!name.is_empty()).then(|| Arc::from(name));
        self.with(|p| p.route_name = name)
    }

    /// Take freshness from the origin's `Cache-Control` (`s-maxage`, then
    /// `max-age`, `stale-while-revalidate`, `stale-if-error`) or, without
    /// those, from `Expires` minus `Date`, falling back to the route's
    /// settings where the origin says nothing.
    ///
    /// On every route, respected or not: `s-maxage`, `must-revalidate` and
    /// `proxy-revalidate` forbid serving stale (the route's stale windows are
    /// zeroed for that response), and an `Expires` already past or invalid
    /// (`0`) keeps the response out of the cache.
    ///
    /// Respected, an answer of any final status with explicit freshness
    /// (`s-maxage`, `max-age` or a future `Expires`; not a `206`) is stored
    /// for that long (RFC 9111 §3): a `302`, a `400` or a `503` the origin
    /// marks `max-age=60` is the key's answer for a minute. Without explicit
    /// freshness only the route's [`cacheable_statuses`](Self::cacheable_statuses)
    /// are stored.
    /// Not respected (the default), the route's statuses alone are stored,
    /// on the route's ttl: a ttl chosen for the route's good answers is not
    /// one to keep its errors for, so a server error is never stored there.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).respect_cache_control(true);
    /// ```
    #[must_use]
    pub fn respect_cache_control(self, on: bool) -> Self {
        self.with(|p| p.store.respect_cache_control = on)
    }

    /// The targeted cache-control fields this cache follows (RFC 9213), in
    /// order of precedence; default `["cdn-cache-control"]`. The first one
    /// present with a valid value (an RFC 8941 dictionary whose directives
    /// have the right types) speaks for this cache: with
    /// [`respect_cache_control`](Self::respect_cache_control) on, it
    /// replaces `Cache-Control` and `Expires` entirely (`CDN-Cache-Control:
    /// max-age=600` beside `Cache-Control: no-store` is stored for ten
    /// minutes); off, its `private`, `no-store`, `no-cache` and
    /// `must-revalidate` count beside those of `Cache-Control` and the
    /// route's ttl stays. An invalid field is ignored as if absent. Targeted
    /// fields are forwarded downstream untouched, for the caches after this
    /// one (RFC 9213 §3). An empty list reads `Cache-Control` alone.
    ///
    /// ```
    /// # use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local())
    ///     .respect_cache_control(true)
    ///     .cache_control_targets([
    ///         http::HeaderName::from_static("acme-cache-control"),
    ///         http::HeaderName::from_static("cdn-cache-control"),
    ///     ]);
    /// ```
    #[must_use]
    pub fn cache_control_targets(self, fields: impl IntoIterator<Item = HeaderName>) -> Self {
        let fields: Arc<[HeaderName]> = fields.into_iter().collect();
        self.with(|p| p.store.cache_control_targets = fields)
    }

    /// Opt in to following a request's own cache directives (RFC 9111
    /// §5.2.1), off by default.
    ///
    /// Off, a request's `Cache-Control` and `Pragma` change nothing: a
    /// request with `no-store`, `no-cache`, `max-age=0` or `Pragma: no-cache`
    /// is answered from a fresh entry, or joins (or starts) the key's one
    /// flight, like any other, so no client can cost the origin more than
    /// one miss per key (nginx and Varnish ignore them by default too).
    ///
    /// On, a request with `no-store` goes to the origin on its own and
    /// nothing of its answer is stored; one with `no-cache`, `max-age=0` or
    /// (without `Cache-Control`) `Pragma: no-cache` goes to the origin on its
    /// own, since no stored entry may answer it. Every such request is then
    /// one origin call. Other request directives (`max-age` above 0,
    /// `max-stale`, `min-fresh`, `only-if-cached`) are not followed.
    /// Only for routes whose clients are trusted (an internal API behind
    /// the edge), or whose origin can take a call per such request.
    ///
    /// ```
    /// # use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).respect_request_cache_control(true);
    /// ```
    #[must_use]
    pub fn respect_request_cache_control(self, on: bool) -> Self {
        self.with(|p| p.store.respect_request_cache_control = on)
    }

    /// Opt in to caching requests that carry `Authorization`, `Cookie` or
    /// `Proxy-Authorization`. Only for routes whose answer does not depend on
    /// who asks (or that key on the credential with [`vary`](Self::vary)).
    ///
    /// ```
    /// # use stampede_guard::{Backend, StampedeGuard};
    /// // The answer depends on who asks: key on the credential.
    /// let guard = StampedeGuard::new(Backend::local())
    ///     .allow_credentials(true)
    ///     .vary([http::header::AUTHORIZATION]);
    /// ```
    #[must_use]
    pub fn allow_credentials(self, on: bool) -> Self {
        self.with(|p| p.store.allow_credentials = on)
    }

    /// Opt in to storing responses that set cookies, with the `Set-Cookie`
    /// headers removed from the stored copy: the client that caused the
    /// rebuild gets its cookie, nobody else does.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).strip_set_cookie(true);
    /// ```
    #[must_use]
    pub fn strip_set_cookie(self, on: bool) -> Self {
        self.with(|p| p.store.strip_set_cookie = on)
    }

    /// Opt in to storing responses marked `private`, `no-store` or `no-cache`.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).cache_private(true);
    /// ```
    #[must_use]
    pub fn cache_private(self, on: bool) -> Self {
        self.with(|p| p.store.cache_private = on)
    }

    /// Opt in to ignoring a response's `Vary`: stored under the request's
    /// key whatever it nominates (`*` too), and served to every request for
    /// that key, whatever its values of the nominated headers. A coded body
    /// (`Content-Encoding`) still goes only to requests that accept its
    /// coding as the request it was made for did.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).ignore_vary(true);
    /// ```
    #[must_use]
    pub fn ignore_vary(self, on: bool) -> Self {
        self.with(|p| p.store.ignore_vary = on)
    }

    /// How long a key is marked after an answer it could not share or store
    /// (default 5 s; from 0, never marked, to 2^31 s, a longer one taken as
    /// 2^31 s).
    ///
    /// An answer for one client (it sets a cookie, says `private`, or is a
    /// second refusal in a row) releases the requests waiting on it at once,
    /// each to the origin on its own, and marks the key. The mark never
    /// turns coalescing off: requests still wait for the key's one flight,
    /// whose shareable answer is stored and ends the mark; only if that
    /// answer is again for one client are its waiters released at once,
    /// rather than queue behind another leader. On a route whose every
    /// answer is per client, a request that arrives while another is at the
    /// origin so waits for that one's response head, then makes its own
    /// call: at most about twice the origin's latency.
    ///
    /// An answer over [`max_body_bytes`](Self::max_body_bytes) makes the key
    /// skip coalescing for the window, so its requests run side by side,
    /// not behind a body that will not be stored; the first storable answer
    /// one of them gets ends it.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).hit_for_miss(Duration::from_secs(1));
    /// ```
    #[must_use]
    pub fn hit_for_miss(self, window: Duration) -> Self {
        self.with(|p| p.store.hit_for_miss = limits::HIT_FOR_MISS.clamp(window))
    }

    /// How long the fleet-wide rebuild lease lasts before it must be renewed
    /// (default 5 s). While the handler runs, a watchdog renews it every third
    /// of this; if the instance dies, another may rebuild after at most this
    /// long. Only used with a Redis backend. From 1 ms to 2^31 s: a shorter
    /// one is taken as 1 ms, a longer one as 2^31 s.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).lease(Duration::from_secs(2));
    /// ```
    #[must_use]
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|p| p.flight.lease = limits::LEASE.clamp(lease))
    }

    /// The longest a rebuild may run (default 30 s). A rebuild runs on its
    /// own task and finishes even if every request waiting for it has gone;
    /// past this it is abandoned, and its waiters get stale-if-error or
    /// `504 Gateway Timeout`. From 1 ms to 2^31 s: a shorter one is taken
    /// as 1 ms, a longer one as 2^31 s.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// let guard = StampedeGuard::new(Backend::local()).rebuild_timeout(Duration::from_secs(5));
    /// ```
    #[must_use]
    pub fn rebuild_timeout(self, timeout: Duration) -> Self {
        self.with(|p| p.flight.rebuild_timeout = limits::REBUILD_TIMEOUT.clamp(timeout))
    }

    /// Probabilistic early refresh (XFetch): a fresh entry is refreshed in
    /// the background, by one request in the fleet, with a chance that grows
    /// as its expiry nears and with how long it took to build. `beta` scales
    /// how early (1.0 is the usual choice; larger refreshes earlier). A hot key
    /// then rarely expires at all.
    ///
    /// Off by default. `beta` is a finite number, at least 0; 0 turns it
    /// off, and so does a value out of that range (NaN, an infinity, a
    /// negative number): no value read from the environment makes every
    /// request refresh.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).early_refresh(1.0);
    /// ```
    #[must_use]
    pub fn early_refresh(self, beta: f64) -> Self {
        let beta = Some(limits::ratio(beta)).filter(|beta| *beta > 0.0);
        self.with(|p| p.flight.early_refresh = beta)
    }

    /// Lease-based refresh-ahead, deterministic where
    /// [`early_refresh`](Self::early_refresh) draws: once a fresh entry has
    /// no more than `multiple` times its last rebuild time left before it
    /// expires (and never less than `floor`), the first request to see it
    /// refreshes it in the background, with the process's flight and, on
    /// Redis, the fleet's lease; every request meanwhile, that one included,
    /// is served the entry, which is still fresh. An instance tries each
    /// entry it holds at most once per half margin (a copy read afresh from
    /// Redis counts anew), so a failing refresh is not retried by every
    /// request; a failed one also leaves the fleet's failure backoff. Set,
    /// it replaces `early_refresh`.
    ///
    /// `multiple` is headroom for a rebuild slower than the last: `2.0` with
    /// a `floor` of 50 ms is a good start. Off by default. `multiple` is a
    /// finite number, at least 0: a value out of that range (NaN, an
    /// infinity, a negative number) counts as 0, the floor alone. `floor`
    /// is from 0 to 2^31 s, a longer one taken as 2^31 s. The margin is
    /// never more than half the entry's freshness lifetime, so a margin as
    /// long as the ttl refreshes an entry halfway, not at its first hit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// let guard = StampedeGuard::new(Backend::local())
    ///     .ttl(Duration::from_secs(1))
    ///     .refresh_ahead(2.0, Duration::from_millis(50));
    /// # let _ = guard;
    /// ```
    #[must_use]
    pub fn refresh_ahead(self, multiple: f64, floor: Duration) -> Self {
        let ahead = crate::engine::RefreshAhead {
            multiple: limits::ratio(multiple),
            floor: limits::REFRESH_AHEAD_FLOOR.clamp(floor),
        };
        self.with(|p| p.flight.refresh_ahead = Some(ahead))
    }

    /// Whether a successful (2xx or 3xx) answer to an unsafe method (any
    /// but GET, HEAD, OPTIONS and TRACE) drops, on every instance and before
    /// the response is returned, every variant of the request's URI and of
    /// the same-host URIs in its `Location` and `Content-Location` (RFC 9111
    /// §4.4). On by default.
    ///
    /// Anyone who can make the origin accept a write can so make the fleet
    /// rebuild that URI once: the rebuild is still coalesced.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).invalidate_on_unsafe(false);
    /// ```
    #[must_use]
    pub fn invalidate_on_unsafe(self, on: bool) -> Self {
        self.with(|p| p.store.invalidate_on_unsafe = on)
    }

    /// Prefix for every key, to keep apart services or versions that share a
    /// backend. (Requests that name no host are kept apart without it: see
    /// [`new`](Self::new).)
    ///
    /// A namespace is a service's whole cache world: every purge made
    /// through this guard ([`invalidate`](Self::invalidate),
    /// [`invalidate_url`](Self::invalidate_url),
    /// [`invalidate_tag`](Self::invalidate_tag),
    /// [`invalidate_all`](Self::invalidate_all), an
    /// `Admin` router (feature `admin`) built from it) reaches the entries of
    /// its namespace only, on every instance of the fleet. Guards and caches
    /// with the same namespace (or all with none) are one service and share
    /// their purges.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).namespace("catalog-v2");
    /// ```
    #[must_use]
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        let namespace: Arc<str> = Arc::from(namespace.into());
        let scope = self.backend.engine.scope(&namespace);
        self.with(|p| {
            p.keys.namespace = namespace;
            p.flight.scope = scope;
        })
    }

    /// Tags every entry of the route with what `tag_fn` returns for the
    /// request that built it, beside the tags of the response's
    /// [tag headers](Self::tag_headers). Invalidate them with
    /// [`invalidate_tag`](Self::invalidate_tag). Tags are compared exactly
    /// (case matters), without surrounding whitespace; an empty one is none.
    ///
    /// ```
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// // `/products/42` is tagged `product:42`.
    /// let guard = StampedeGuard::new(Backend::local()).tags(|req| {
    ///     let id = req.uri.path().strip_prefix("/products/").unwrap_or("");
    ///     vec![format!("product:{id}"), "products".to_owned()]
    /// });
    /// # let _ = guard;
    /// ```
    #[must_use]
    pub fn tags<F>(self, tag_fn: F) -> Self
    where
        F: Fn(&http::request::Parts) -> Vec<String> + Send + Sync + 'static,
    {
        let tag_fn: TagFn = Arc::new(tag_fn);
        self.with(|p| p.tags.tag_fn = Some(tag_fn))
    }

    /// Response headers whose values tag the entry (default `Surrogate-Key`
    /// and `Cache-Tag`; an empty list reads none). Tags are separated by
    /// commas or whitespace (a tag in UTF-8 is read as such; bytes that are
    /// not text never hide the other tags of their line); an answer with
    /// tags in more than 256 of the
    /// 4096 tag buckets is served but not stored.
    ///
    /// ```
    /// use http::HeaderName;
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// let guard = StampedeGuard::new(Backend::local())
    ///     .tag_headers([HeaderName::from_static("x-cache-tags")]);
    /// ```
    #[must_use]
    pub fn tag_headers(self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        let headers: Arc<[HeaderName]> = headers.into_iter().collect();
        self.with(|p| p.tags.headers = headers)
    }

    /// Leave the tag headers on the answer of the request that rebuilt the
    /// entry (default: removed, as a CDN removes `Surrogate-Key`). They are
    /// never stored, so hits never carry them.
    ///
    /// ```
    /// # use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).expose_tag_headers(true);
    /// ```
    #[must_use]
    pub fn expose_tag_headers(self, on: bool) -> Self {
        self.with(|p| p.tags.expose = on)
    }

    /// Drops every entry tagged `tag` (by any route on this backend, or by
    /// [`tags`](Self::tags)) in this guard's [namespace](Self::namespace),
    /// here and, with a Redis backend, in Redis and on every instance: O(1),
    /// whatever the number of entries (a generation of the namespace moves;
    /// entries recorded the older one).
    ///
    /// A namespace is a service's whole cache world: the purge reaches the
    /// entries of every guard and [`Cache`](crate::Cache) with the same
    /// namespace (two with none share one), on every instance and on either
    /// backend, and no entry of another namespace on the same backend or
    /// Redis, whatever its tags.
    ///
    /// The same barrier as [`invalidate`](Self::invalidate): once it returns
    /// `Ok`, no request that starts afterwards, on any instance, is answered
    /// with a value built before it. Every rebuild running when it is called
    /// (whatever its tags: they are known only when it ends) stores nothing
    /// and answers only the requests already waiting for it.
    ///
    /// Tags share 4096 buckets: invalidating one also drops the entries of
    /// the tags that share its bucket (more misses, never a stale answer).
    ///
    /// # Errors
    ///
    /// When the backend has a Redis tier and the invalidation did not reach
    /// it (Redis down, the deadline passed; it was tried for four
    /// deadlines). This process has dropped its entries of the tag all the
    /// same (the generation moved here): it serves none of them again. It
    /// may have reached Redis without an answer, or not at all: nothing is
    /// promised for the other instances then (they may serve their copies
    /// as an outage allows), and it is not retried once the backend is
    /// connected (before the join it is kept, and made once it joins). Call
    /// it again.
    ///
    /// ```
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let guard = StampedeGuard::new(Backend::local());
    /// // After a write to product 42, whose pages are tagged `product:42`:
    /// guard.invalidate_tag("product:42").await.unwrap();
    /// # }
    /// ```
    pub async fn invalidate_tag(&self, tag: &str) -> Result<(), crate::Error> {
        self.backend
            .engine
            .invalidate_field(
                Field::of_tag(self.policy.flight.scope, tag.trim()),
                &format!("tag {}", tag.trim()),
            )
            .await
    }

    /// Drops every entry of this guard's [namespace](Self::namespace) (every
    /// route and every [`Cache`](crate::Cache) on the backend with the same
    /// namespace; two with none share one), here and on every instance, in
    /// O(1): the same barrier and errors as
    /// [`invalidate_tag`](Self::invalidate_tag). The entries of other
    /// namespaces on the same backend or Redis are kept.
    ///
    /// ```
    /// # use stampede_guard::{Backend, StampedeGuard};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let guard = StampedeGuard::new(Backend::local());
    /// guard.invalidate_all().await.unwrap();
    /// # }
    /// ```
    pub async fn invalidate_all(&self) -> Result<(), crate::Error> {
        let scope = self.policy.flight.scope;
        self.backend
            .engine
            .invalidate_field(Field::Own(scope), "everything")
            .await
    }

    /// This guard with every field `config` sets applied, through the method
    /// of the same name (so with the same bounds); fields left out keep this
    /// guard's settings. A config read with serde was validated; one built
    /// in code is clamped as the methods clamp (and a status code out of
    /// range panics, as in the methods), unless [`RouteConfig::validate`]
    /// refused it first.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stampede_guard::{Backend, RouteConfig, StampedeGuard};
    ///
    /// let mut config = RouteConfig::default();
    /// config.ttl = Some(Duration::from_secs(30));
    /// let guard = StampedeGuard::new(Backend::local()).with_config(&config);
    /// ```
    #[must_use]
    pub fn with_config(self, config: &RouteConfig) -> Self {
        fn apply<T: Clone>(
            guard: StampedeGuard,
            value: &Option<T>,
            set: impl FnOnce(StampedeGuard, T) -> StampedeGuard,
        ) -> StampedeGuard {
            match value {
                Some(value) => set(guard, value.clone()),
                None => guard,
            }
        }
        let c = config;
        let g = apply(self, &c.ttl, Self::ttl);
        let g = apply(g, &c.stale_while_revalidate, Self::stale_while_revalidate);
        let g = apply(g, &c.stale_if_error, Self::stale_if_error);
        let g = apply(g, &c.wait_budget, Self::wait_budget);
        let g = apply(g, &c.on_wait_timeout, Self::on_wait_timeout);
        let g = apply(g, &c.lease, Self::lease);
        let g = apply(g, &c.rebuild_timeout, Self::rebuild_timeout);
        let g = apply(g, &c.hit_for_miss, Self::hit_for_miss);
        let g = apply(g, &c.early_refresh, Self::early_refresh);
        let g = apply(g, &c.max_body_bytes, Self::max_body_bytes);
        let g = apply(g, &c.cacheable_statuses, Self::cacheable_statuses);
        let g = apply(g, &c.vary, Self::vary);
        let g = apply(g, &c.forwarded_headers, Self::forwarded_headers);
        let g = apply(g, &c.namespace, Self::namespace);
        let g = apply(g, &c.respect_cache_control, Self::respect_cache_control);
        let g = apply(g, &c.cache_control_targets, Self::cache_control_targets);
        let g = apply(g, &c.allow_credentials, Self::allow_credentials);
        let g = apply(
            g,
            &c.respect_request_cache_control,
            Self::respect_request_cache_control,
        );
        let g = apply(g, &c.strip_set_cookie, Self::strip_set_cookie);
        let g = apply(g, &c.cache_private, Self::cache_private);
        let g = apply(g, &c.ignore_vary, Self::ignore_vary);
        let g = apply(g, &c.refresh_ahead, |g, r| {
            g.refresh_ahead(r.multiple, r.floor)
        });
        let g = apply(g, &c.route_name, Self::route_name);
        let g = apply(g, &c.cache_status, Self::cache_status);
        let g = apply(g, &c.cache_status_name, Self::cache_status_name);
        let g = apply(g, &c.tag_headers, Self::tag_headers);
        let g = apply(g, &c.expose_tag_headers, Self::expose_tag_headers);
        apply(g, &c.invalidate_on_unsafe, Self::invalidate_on_unsafe)
    }

    /// The namespace, as the generations name it.
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) fn scope(&self) -> crate::store::generations::Scope {
        self.policy.flight.scope
    }

    #[cfg(test)]
    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The backend this guard runs on.
    ///
    /// ```
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// let guard = StampedeGuard::new(Backend::local());
    /// let stats = guard.backend().stats();
    /// # let _ = stats;
    /// ```
    #[must_use]
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The key this route gives a request, or `None` if it would not be cached
    /// under the route's key function.
    ///
    /// The URL is the one the client sent: with the `axum` feature, the
    /// `OriginalUri` a router records, so `/v1/items` names the entry of the
    /// route nested under `/v1` wherever the guard sits.
    ///
    /// ```
    /// use http::Request;
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// let guard = StampedeGuard::new(Backend::local());
    /// let request = Request::get("/report?x=1")
    ///     .header("host", "api.example.com")
    ///     .body(())
    ///     .unwrap();
    /// let key = guard.key_for(&request).expect("no key_fn: every request has a key");
    /// # let _ = key;
    /// ```
    pub fn key_for<B>(&self, request: &Request<B>) -> Option<Key> {
        let (mut parts, ()) = Request::new(()).into_parts();
        parts.method = request.method().clone();
        parts.uri = request.uri().clone();
        parts.headers = request.headers().clone();
        #[cfg(feature = "axum")]
        if let Some(original) = request.extensions().get::<axum::extract::OriginalUri>() {
            parts.extensions.insert(original.clone());
        }
        let custom = match &self.policy.keys.key_fn {
            Some(key_fn) => Some(key_fn(&parts)?),
            None => None,
        };
        let rules = KeyRules::of(&self.policy.keys, Keyed::now(&self.policy.keys));
        Some(request_key(&rules, &parts, custom.as_deref()))
    }

    /// Drops the entry a request would be answered from, and every other
    /// variant of its URL (the entries for other values of the route's
    /// [`vary`](Self::vary) headers), so the next request rebuilds them: in
    /// this process and, with a Redis backend, in Redis and in every
    /// instance's in-process tier. The key holds the guard's
    /// [namespace](Self::namespace): the same URL's entries in another
    /// namespace are kept.
    ///
    /// Every variant goes: the entries for other values of the Vary headers,
    /// on a route keyed on `Accept-Encoding` (listed or learned) every
    /// coding, every scheme of an absolute-form target (`http://h/x`,
    /// `https://h/x`, `/x`) and every value of the
    /// [forwarding headers](Self::forwarded_headers): a request with only the
    /// path (and the host) reaches the entries stored behind a proxy that
    /// sets `X-Forwarded-Proto`.
    ///
    /// It is a barrier: once it returns `Ok`, no request that starts
    /// afterwards, here or (with Redis) on any instance of the fleet, is
    /// answered with a value built before it. A rebuild that was already
    /// running stores nothing, and may answer only the requests that were
    /// already waiting for it.
    ///
    /// With Redis, the call returns once every instance that received the
    /// invalidation acknowledged it (it had dropped its copies first), or
    /// after one *subscription lease* (3 s, the same for every instance
    /// whatever its deadline) if some did not: an instance serves its
    /// in-process tier only while its subscription was confirmed live (a
    /// PONG to a keepalive PING sent less than a lease ago, which comes
    /// after every message published before the PING), and once that lapses
    /// it drops the tier and serves only what it built afterwards. So an
    /// instance that did not acknowledge has either dropped its copy or
    /// stopped trusting everything it read before the invalidation. (This
    /// assumes the instances' clocks tick at the same rate; on Redis Cluster
    /// the call waits only for the instances subscribed through the node
    /// that ran it, and the others rely on the cluster bus delivering the
    /// message promptly, see the [topology guide](crate::guide::topology).)
    ///
    /// # Errors
    ///
    /// When the backend has a Redis tier and the invalidation did not reach
    /// it (Redis down, the circuit open, the deadline passed). This process
    /// has dropped the entry all the same, remembers the invalidation, and
    /// until Redis has it takes nothing of this URL from Redis (it rebuilds
    /// from the origin instead); it retries in the background until Redis
    /// takes it (up to 10,000 URLs remembered per process). Other instances
    /// may serve the old value until then.
    ///
    /// ```
    /// use http::Request;
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let guard = StampedeGuard::new(Backend::local());
    /// let request = Request::get("/report?x=1")
    ///     .header("host", "api.example.com")
    ///     .body(())
    ///     .unwrap();
    /// guard.invalidate(&request).await.unwrap();
    /// # }
    /// ```
    pub async fn invalidate<B>(&self, request: &Request<B>) -> Result<(), crate::Error> {
        match self.key_for(request) {
            Some(key) => {
                let what = format!("url {}", request.uri());
                self.backend.engine.invalidate(&key, &what).await
            }
            None => Ok(()),
        }
    }

    /// Drops the entries of the URL a user types, as
    /// [`invalidate`](Self::invalidate) drops those of a `GET` request for
    /// it: every variant (other values of the [`vary`](Self::vary) headers,
    /// learned ones included, every scheme, every value of the forwarding
    /// headers), here and on every instance, with the same barrier.
    ///
    /// The URL names the host the clients send (`Host`, or the authority of
    /// an absolute-form target), port included when they send one, and the
    /// path and query as the handler sees them (the query's pairs in any
    /// order, as the key sorts them by name). With a
    /// [`key_fn`](Self::key_fn), the function is given a `GET` request for
    /// the URL, its `Host` set to the URL's host.
    ///
    /// ```
    /// use stampede_guard::{Backend, ErrorKind, StampedeGuard};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let guard = StampedeGuard::new(Backend::local());
    /// guard.invalidate_url("https://api.example.com/report?x=1").await.unwrap();
    /// let e = guard.invalidate_url("/report?x=1").await.unwrap_err();
    /// assert_eq!(e.kind(), ErrorKind::InvalidInput);
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) when
    /// `url` is not an absolute `http` or `https` URL with a host; otherwise
    /// those of [`invalidate`](Self::invalidate).
    pub async fn invalidate_url(&self, url: &str) -> Result<(), crate::Error> {
        self.invalidate(&request_for_url(url)?).await
    }
}

/// A `GET` request for `url` as a client sends it: the URL as an
/// absolute-form target, its authority (without userinfo) in `Host`. The
/// key of such a request is the key of the same request in origin form.
fn request_for_url(url: &str) -> Result<Request<()>, crate::Error> {
    let invalid = |why: &str| {
        crate::Error::new(
            crate::ErrorKind::InvalidInput,
            format!("cannot purge {url:?}: {why}; write a URL like \"https://api.example.com/report?x=1\""),
        )
    };
    let uri: http::Uri = url.trim().parse().map_err(|_| invalid("not a URL"))?;
    match uri.scheme_str() {
        Some(scheme)
            if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") => {}
        Some(_) => return Err(invalid("the scheme is not http or https")),
        None => return Err(invalid("it names no scheme and host")),
    }
    let authority = uri.authority().ok_or_else(|| invalid("it names no host"))?;
    let host = authority.as_str();
    let host = host.rsplit_once('@').map_or(host, |(_, host)| host);
    if host.is_empty() {
        return Err(invalid("it names no host"));
    }
    let host = http::HeaderValue::from_str(host).map_err(|_| invalid("the host is not valid"))?;
    let mut request = Request::new(());
    *request.uri_mut() = uri;
    request.headers_mut().insert(http::header::HOST, host);
    Ok(request)
}

impl<S> Layer<S> for StampedeGuard {
    type Service = GuardService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GuardService::new(inner, self.backend.clone(), self.policy.clone())
    }
}
