//! [`GuardService`]: HTTP in, engine, HTTP out.
//!
//! `call` does the cheap part synchronously: policy, key, one L1 read. A hit
//! (fresh or stale) is a ready response, with no boxing and no I/O. A miss
//! goes to the engine, which owns the rebuild; the service only says how to
//! rebuild (an `Origin`, origin.rs: the inner service called with a plain
//! GET) and presents what comes back.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};

use bytes::Buf;
use http::{header, Method, Request, Response};
use http_body::Body as HttpBody;
use tokio::sync::oneshot;
use tower_service::Service;

use super::admit::Private;
use super::body::GuardBody as Body;
use super::cache_status::{forward_of, CacheStatus, Forward, Fwd, StatusHeaders};
use super::future::ResponseFuture;
use super::key::{align_host, request_key, KeyRules, Keyed};
use super::labels::RouteLabels;
use super::origin::{Origin, CONDITIONAL};
use super::passes::Pass;
use super::policy::{admission, Admission, Policy};
use super::respond::{self, failure, present, tag_with, try_present, Conditions};
use super::response::CachedResponse;
use super::rfc::date::stamp;
use super::select::{covers, selected, Back, Lane, Selecting};
use super::unsafe_methods::{invalidate, is_unsafe, overrides_to_unsafe, Targets};
use super::upgrades::{is_handshake, strip_upgrade, Ask, Probe};
use crate::backend::Backend;
use crate::engine::{Answer, Engine, Held, Looked, Miss};
use crate::key::Key;
use crate::metrics::Labels;

/// The service a [`StampedeGuard`](crate::StampedeGuard) wraps around an inner
/// service.
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response};
/// use stampede_guard::{Backend, GuardBody, GuardService, StampedeGuard};
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let origin = service_fn(|_req: Request<String>| async {
///     Ok::<_, Infallible>(Response::new(String::from("expensive")))
/// });
/// let service = StampedeGuard::new(Backend::local()).layer(origin);
/// let request = Request::get("/report").header("host", "h").body(String::new()).unwrap();
/// let response: Response<GuardBody<String>> = service.clone().oneshot(request).await.unwrap();
/// assert!(response.status().is_success());
/// let origin = service.into_inner();
/// # let _ = origin;
/// # }
/// ```
#[derive(Clone)]
pub struct GuardService<S> {
    inner: S,
    backend: Backend,
    policy: Arc<Policy>,
    route: Arc<RouteLabels>,
}

impl<S> GuardService<S> {
    pub(crate) fn new(inner: S, backend: Backend, policy: Arc<Policy>) -> Self {
        GuardService {
            inner,
            backend,
            route: Arc::new(RouteLabels::new(&policy)),
            policy,
        }
    }

    /// The inner service. See [`GuardService`] for an example.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably. See [`GuardService`] for an example.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the guard, returning the inner service. See
    /// [`GuardService`] for an example.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for GuardService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardService")
            .field("inner", &self.inner)
            .field("policy", &self.policy)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for GuardService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: HttpBody + Unpin + Send + 'static,
    ResBody: HttpBody + Send + 'static,
    ResBody::Data: Buf + Send,
    ResBody::Error: Send,
{
    type Response = Response<Body<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let policy = &self.policy;
        let (mut parts, body) = request.into_parts();
        let labels = self.route.of(&parts);
        // Host follows the target before anything else, so the inner service
        // sees the host the key is made of on every path, pass-through too.
        // A request whose host cannot be told (several `Host` lines) is
        // malformed (RFC 9112 §3.2): refused, on every path.
        if let Err(reason) = align_host(&mut parts) {
            return self.bad_request(reason, labels);
        }
        if policy.store.invalidate_on_unsafe && is_unsafe(&parts.method) {
            return self.unsafe_method(Request::from_parts(parts, body), Pass::Method, labels);
        }
        // A request whose content the layer already read and threw away
        // (see `Discarded`) has none left, whatever its body type says.
        let discarded = parts.extensions.remove::<Discarded>().is_some();
        let ended = discarded || body.is_end_stream();
        let store = &policy.store;
        let mut admitted = admission(
            store,
            &parts.method,
            parts.version,
            &mut parts.headers,
            ended,
        );
        if admitted == Admission::Upgrade {
            let Some(custom) = self.custom_key(&parts) else {
                let request = Request::from_parts(parts, body);
                return self.pass_through(request, Pass::KeyFn, labels);
            };
            let keyed = Keyed::now(&policy.keys);
            let rules = KeyRules::of(&policy.keys, keyed);
            let key = request_key(&rules, &parts, custom.as_deref());
            match policy.upgrades.ask(key, is_handshake(&parts.headers)) {
                // The key's handler answers a switch as a plain GET: so is
                // this request taken, without the switch.
                Ask::Plain => {
                    strip_upgrade(&mut parts.headers);
                    let (method, version) = (&parts.method, parts.version);
                    admitted = admission(store, method, version, &mut parts.headers, ended);
                }
                Ask::Switch => {
                    let request = Request::from_parts(parts, body);
                    return self.pass_through(request, Pass::Upgrade, labels);
                }
                Ask::Probe(probe) => {
                    let request = Request::from_parts(parts, body);
                    return self.probe_upgrade(request, probe, labels);
                }
                Ask::Wait(done) => {
                    let request = Request::from_parts(parts, body);
                    return self.after_probe(request, done, labels);
                }
            }
        }
        match admitted {
            Admission::Cache => {}
            Admission::Discard => {
                return self.discard_content(parts, body, labels);
            }
            // Stripped of its switch, a request asks for none.
            Admission::Upgrade => {
                let request = Request::from_parts(parts, body);
                return self.pass_through(request, Pass::Upgrade, labels);
            }
            // A method override that names an unsafe method: a framework
            // that honours it runs that method, so its answer invalidates as
            // the method's own would.
            Admission::Pass(Pass::MethodOverride)
                if store.invalidate_on_unsafe && overrides_to_unsafe(&parts.headers) =>
            {
                let request = Request::from_parts(parts, body);
                return self.unsafe_method(request, Pass::MethodOverride, labels);
            }
            Admission::Pass(reason) => {
                return self.pass_through(Request::from_parts(parts, body), reason, labels);
            }
        }
        let custom = match self.custom_key(&parts) {
            Some(custom) => custom,
            None => {
                let request = Request::from_parts(parts, body);
                return self.pass_through(request, Pass::KeyFn, labels);
            }
        };
        // Read once: the rebuild judges the origin's Vary against this key.
        let keyed = Keyed::now(&policy.keys);
        let key = request_key(
            &KeyRules::of(&policy.keys, keyed),
            &parts,
            custom.as_deref(),
        );
        let request = Request::from_parts(parts, body);
        let conditions = Conditions::of(&request);
        let flight = policy.flight.policy(labels);
        let now = Instant::now();
        let engine = &self.backend.engine;
        match engine.lookup::<CachedResponse>(key, &flight, now) {
            Looked::Hit {
                held,
                status,
                refresh,
            } if selected(policy, &held.value().headers, request.headers(), keyed) => {
                let response = present(policy, &conditions, &held, status.into(), None, now);
                if let Some(refresh) = refresh {
                    let origin = Origin {
                        inner: self.inner.clone(),
                        request,
                        policy: policy.clone(),
                        keyed,
                        early: None,
                        labels,
                        forwarded: Arc::default(),
                    };
                    engine.refresh(refresh, flight, Selecting::new(origin, None, Lane::Primary));
                }
                ResponseFuture::ready(response)
            }
            looked => {
                // The readied service goes with the request; a clone takes its place.
                let clone = self.inner.clone();
                let origin = Origin {
                    inner: std::mem::replace(&mut self.inner, clone),
                    request,
                    policy: policy.clone(),
                    keyed,
                    early: None,
                    labels,
                    forwarded: Arc::default(),
                };
                let engine = engine.clone();
                let future = match looked {
                    Looked::Miss(miss) => Box::pin(resolve(
                        engine,
                        miss,
                        conditions,
                        origin,
                        key,
                        Lane::Primary,
                    )),
                    // An entry of another variant of the URL (a learned
                    // `Vary` it does not match): the request's own variant.
                    Looked::Hit { held, .. } => {
                        let stored = held.value().headers.clone();
                        drop(held);
                        next_lane(engine, conditions, origin, key, Lane::Primary, stored)
                    }
                };
                ResponseFuture::miss(future)
            }
        }
    }
}

/// Marks a request whose content the layer read and threw away, on its
/// way back into [`GuardService::call`]: it has no content left.
#[derive(Clone, Copy, Debug)]
struct Discarded;

/// Reads a body to its end and throws it away: whether it ended cleanly.
async fn read_to_end<B: HttpBody + Unpin>(body: &mut B) -> bool {
    loop {
        match std::future::poll_fn(|cx| std::pin::Pin::new(&mut *body).poll_frame(cx)).await {
            None => return true,
            Some(Ok(_)) => {}
            Some(Err(_)) => return false,
        }
    }
}

impl<S> GuardService<S> {
    /// The custom key of a route with a key function, `None` inside when
    /// it has none; `None` when the function declines the request.
    fn custom_key(&self, parts: &http::request::Parts) -> Option<Option<String>> {
        match &self.policy.keys.key_fn {
            Some(key_fn) => key_fn(parts).map(Some),
            None => Some(None),
        }
    }

    /// A GET or HEAD with content: the content is read as it arrives and
    /// thrown away (nothing of it is kept, so its size costs no memory),
    /// then the request, without it, goes the way of any GET. Reading it
    /// keeps the connection's framing whole: the next request on it starts
    /// where this one's content ends. A body that fails (its client hung
    /// up, or broke its framing) gets a `400`.
    fn discard_content<ReqBody, ResBody>(
        &mut self,
        mut parts: http::request::Parts,
        mut body: ReqBody,
        labels: Labels,
    ) -> ResponseFuture<S::Future, ResBody, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqBody: HttpBody + Unpin + Send + 'static,
        ResBody: HttpBody + Send + 'static,
        ResBody::Data: Buf + Send,
        ResBody::Error: Send,
    {
        // The readied service goes with the request; a clone takes its place.
        let clone = self.clone();
        let mut service = std::mem::replace(self, clone);
        ResponseFuture::miss(Box::pin(async move {
            if !read_to_end(&mut body).await {
                return service.bad_request(Pass::RequestBody, labels).await;
            }
            parts.extensions.insert(Discarded);
            service.call(Request::from_parts(parts, body)).await
        }))
    }

    /// The first protocol switch asked of a key whose handler is not known
    /// to switch or not: passed through, and its answer learned.
    fn probe_upgrade<ReqBody, ResBody>(
        &mut self,
        request: Request<ReqBody>,
        probe: Probe,
        labels: Labels,
    ) -> ResponseFuture<S::Future, ResBody, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqBody: HttpBody + Unpin + Send + 'static,
        ResBody: HttpBody + Send + 'static,
        ResBody::Data: Buf + Send,
        ResBody::Error: Send,
    {
        let policy = self.policy.clone();
        let passed = self.pass_through(request, Pass::Upgrade, labels);
        ResponseFuture::miss(Box::pin(async move {
            let response = passed.await?;
            let status = response.status();
            let plain = !status.is_server_error() && policy.store.statuses.contains(&status);
            let window = policy.store.lifetime.ttl.max(policy.store.hit_for_miss);
            probe.learn(
                status == http::StatusCode::SWITCHING_PROTOCOLS,
                plain,
                window,
            );
            Ok(response)
        }))
    }

    /// A protocol switch asked while the key's probe is at the handler:
    /// once it has answered (or the wait budget ran out), asked again.
    fn after_probe<ReqBody, ResBody>(
        &mut self,
        request: Request<ReqBody>,
        mut done: tokio::sync::watch::Receiver<()>,
        labels: Labels,
    ) -> ResponseFuture<S::Future, ResBody, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqBody: HttpBody + Unpin + Send + 'static,
        ResBody: HttpBody + Send + 'static,
        ResBody::Data: Buf + Send,
        ResBody::Error: Send,
    {
        let budget = self.policy.flight.policy(labels).wait_budget;
        let clone = self.clone();
        let mut service = std::mem::replace(self, clone);
        ResponseFuture::miss(Box::pin(async move {
            // The probe never sends: `changed` ends when it is dropped.
            match tokio::time::timeout(budget, done.changed()).await {
                Ok(_) => service.call(request).await,
                Err(_) => service.pass_through(request, Pass::Upgrade, labels).await,
            }
        }))
    }
}

impl<S> GuardService<S> {
    /// An unsafe method (or a method override naming one, `reason` says
    /// which): passed through; a successful answer drops the groups it
    /// touched, everywhere, before it is returned.
    fn unsafe_method<ReqBody, ResBody>(
        &mut self,
        request: Request<ReqBody>,
        reason: Pass,
        labels: Labels,
    ) -> ResponseFuture<S::Future, ResBody, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ResBody: HttpBody + Send + 'static,
    {
        self.policy.passes.request(reason, labels);
        let (mut parts, body) = request.into_parts();
        let targets = Targets::of(&self.policy, &mut parts);
        let future = self.inner.call(Request::from_parts(parts, body));
        let engine = self.backend.engine.clone();
        let policy = self.policy.clone();
        ResponseFuture::miss(Box::pin(async move {
            let mut response = future.await?;
            stamp(response.headers_mut(), SystemTime::now());
            let keys = targets.keys(&policy, response.status(), response.headers());
            invalidate(&engine, keys, labels).await;
            policy.tags.take(response.headers_mut());
            Ok(tag_with(
                &policy,
                response.map(|body| Body::stream_hiding(body, policy.tags.hidden())),
                CacheStatus::Bypass,
                Forward::new(Fwd::of_bypass(reason)),
            ))
        }))
    }

    /// A malformed request: `400`, and the handler never sees it.
    fn bad_request<ReqBody, ResBody>(
        &self,
        reason: Pass,
        labels: Labels,
    ) -> ResponseFuture<S::Future, ResBody, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        ResBody: HttpBody,
    {
        self.policy.passes.request(reason, labels);
        let mut response = Response::new(Body::empty());
        *response.status_mut() = http::StatusCode::BAD_REQUEST;
        // The layer's own 4xx: dated now (RFC 9110 §6.6.1).
        stamp(response.headers_mut(), SystemTime::now());
        let forward = Forward {
            detail: Some(reason.as_str()),
            ..Forward::new(Fwd::of_bypass(reason))
        };
        ResponseFuture::ready(tag_with(
            &self.policy,
            response,
            CacheStatus::Bypass,
            forward,
        ))
    }

    fn pass_through<ReqBody, ResBody>(
        &mut self,
        request: Request<ReqBody>,
        reason: Pass,
        labels: Labels,
    ) -> ResponseFuture<S::Future, ResBody, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        ResBody: HttpBody,
    {
        self.policy.passes.request(reason, labels);
        let forward = Forward {
            detail: (reason != Pass::Method).then_some(reason.as_str()),
            ..Forward::new(Fwd::of_bypass(reason))
        };
        let status = StatusHeaders::new(
            &self.policy.presentation,
            &self.policy.tags,
            CacheStatus::Bypass,
            forward,
        );
        ResponseFuture::passthrough(self.inner.call(request), status)
    }
}

/// A miss: what the engine's flight gives, as a response.
async fn resolve<S, ReqBody, ResBody>(
    engine: Arc<Engine>,
    miss: Miss,
    conditions: Conditions,
    origin: Origin<S, ReqBody, ResBody>,
    primary: Key,
    lane: Lane,
) -> Result<Response<Body<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: HttpBody + Send + 'static,
    ResBody::Data: Buf + Send,
    ResBody::Error: Send,
{
    let policy = origin.policy.clone();
    // A plain GET that starts the rebuild takes the origin's response as it
    // streams in; one asking for less (HEAD, a precondition, a range) is
    // answered from the whole entry.
    let plain = origin.request.method() == Method::GET
        && !CONDITIONAL
            .iter()
            .chain([&header::RANGE])
            .any(|name| origin.request.headers().contains_key(name));
    let (early, mut streamed) = oneshot::channel();
    let mut origin = origin;
    origin.early = plain.then_some(early);
    let flight = policy.flight.policy(origin.labels);
    let forwarded = origin.forwarded.clone();
    let had_stale = miss.has_stale();
    // What selects a variant: the entry that comes back may be another
    // variant of the URL, whose answer this request may not have.
    let (request, keyed, labels) = (
        origin.request.headers().clone(),
        origin.keyed,
        origin.labels,
    );
    let selects = |stored: &http::HeaderMap| selected(&policy, stored, &request, keyed);
    let (back, unrun) = oneshot::channel();
    let back: Back<S, ReqBody, ResBody> = back;
    let rebuild = Selecting::new(origin, Some(back), lane);
    let flying = engine.clone();
    let mut answer = Box::pin(async move { flying.resolve(miss, flight, rebuild).await });
    let answer = tokio::select! {
        biased;
        Ok(response) = &mut streamed => return Ok(settled_by(response, answer)),
        answer = &mut answer => answer,
    };
    // The flight may end within the very poll that saw the response sent.
    if let Ok(response) = streamed.try_recv() {
        return Ok(response);
    }
    // The origin's answer to a failure of another variant (the fleet's
    // failure backoff, or a flight this request waited on) is not this
    // request's to have: its own variant's lane answers it.
    let foreign = match &answer {
        Answer::Failed(failed, status) => failed
            .answer
            .clone()
            .and_then(Held::<CachedResponse>::new)
            .map(|held| held.value().headers.clone())
            .filter(|stored| !selects(stored))
            .map(|stored| (stored, *status)),
        _ => None,
    };
    if let Some((stored, status)) = foreign {
        drop(answer);
        return match unrun.await.ok() {
            Some(origin) => next_lane(engine, conditions, origin, primary, lane, stored).await,
            None => Ok(failure(
                &policy,
                crate::engine::FailureKind::Error,
                status.into(),
            )),
        };
    }
    match answer {
        Answer::Shared(served, rebuild) if !selects(&served.held.value().headers) => {
            let stored = served.held.value().headers.clone();
            drop(served);
            match rebuild.into_origin() {
                Some(origin) => next_lane(engine, conditions, origin, primary, lane, stored).await,
                None => Ok(failure(
                    &policy,
                    crate::engine::FailureKind::Error,
                    CacheStatus::Miss,
                )),
            }
        }
        Answer::Served(served) if !selects(&served.held.value().headers) => {
            let stored = served.held.value().headers.clone();
            drop(served);
            match unrun.await.ok() {
                Some(origin) => next_lane(engine, conditions, origin, primary, lane, stored).await,
                // Its rebuild ran and failed; what stands in for the
                // failure is another variant's.
                None => Ok(failure(
                    &policy,
                    crate::engine::FailureKind::Error,
                    CacheStatus::Miss,
                )),
            }
        }
        Answer::Shared(served, rebuild) => {
            let now = Instant::now();
            let forward = forward_of(
                served.status,
                &served.held,
                served.stored,
                had_stale,
                &forwarded,
                now,
            );
            let status = served.status.into();
            let presented = try_present(&policy, &conditions, &served.held, status, forward, now);
            // The entry is let go before any wait: while a waiter holds it,
            // its body keeps its start for the waiters still to join.
            drop(served);
            match (presented, rebuild.into_origin()) {
                (Some(response), _) => Ok(response),
                // A body over the size cap that went on streaming to the
                // requests that joined it in time: this one came too late
                // to read it from the start, and goes to the origin itself
                // rather than get an error the origin never sent.
                (None, Some(origin)) => {
                    policy.passes.request(Pass::OverCap, labels);
                    crate::metrics::count(crate::metrics::ORIGIN_CALLS, labels);
                    origin.alone().await
                }
                (None, None) => Ok(failure(
                    &policy,
                    crate::engine::FailureKind::Error,
                    CacheStatus::Miss,
                )),
            }
        }
        Answer::Served(served) => {
            let now = Instant::now();
            let forward = forward_of(
                served.status,
                &served.held,
                served.stored,
                had_stale,
                &forwarded,
                now,
            );
            let mut response = present(
                &policy,
                &conditions,
                &served.held,
                served.status.into(),
                forward,
                now,
            );
            if let Some(Private::Headers(headers)) = served.private {
                for (name, value) in headers {
                    response.headers_mut().append(name, value);
                }
            }
            Ok(response)
        }
        // The origin's answer for this request alone, to the whole GET:
        // its own preconditions still apply.
        Answer::Private(Private::Response(response)) => {
            Ok(respond::answer_alone(&policy, &conditions, response))
        }
        Answer::Private(Private::Error(error)) => Err(error),
        Answer::Private(Private::Headers(_)) => Ok(failure(
            &policy,
            crate::engine::FailureKind::Error,
            CacheStatus::Miss,
        )),
        Answer::Failed(failed, status) => Ok(respond::failed(
            &policy,
            &conditions,
            &failed,
            status.into(),
        )),
        Answer::Alone(rebuild) => match rebuild.into_origin() {
            Some(origin) => origin.alone().await,
            None => Ok(failure(
                &policy,
                crate::engine::FailureKind::Error,
                CacheStatus::Miss,
            )),
        },
        // The handler panicked under the request that started the rebuild:
        // it sees the panic as it would without the layer.
        Answer::Panicked(payload) => std::panic::resume_unwind(payload),
    }
}

/// A request that the entry under `lane`'s key (whose headers are `stored`)
/// does not select: the next lane of its URL (`primary`), from the L1 or
/// by its flight; the origin alone, uncached, when there is none.
fn next_lane<S, ReqBody, ResBody>(
    engine: Arc<Engine>,
    conditions: Conditions,
    origin: Origin<S, ReqBody, ResBody>,
    primary: Key,
    lane: Lane,
    stored: http::HeaderMap,
) -> crate::http::future::MissFuture<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: HttpBody + Send + 'static,
    ResBody::Data: Buf + Send,
    ResBody::Error: Send,
{
    Box::pin(async move {
        let policy = origin.policy.clone();
        let covers = covers(&policy, origin.keyed);
        let Some((lane, key)) = lane.next(&primary, &stored, origin.request.headers(), covers)
        else {
            crate::metrics::count(crate::metrics::ORIGIN_CALLS, origin.labels);
            return origin.alone().await;
        };
        let flight = policy.flight.policy(origin.labels);
        let now = Instant::now();
        match engine.lookup::<CachedResponse>(key, &flight, now) {
            Looked::Hit {
                held,
                status,
                refresh,
            } if selected(
                &policy,
                &held.value().headers,
                origin.request.headers(),
                origin.keyed,
            ) =>
            {
                let response = present(&policy, &conditions, &held, status.into(), None, now);
                if let Some(refresh) = refresh {
                    engine.refresh(refresh, flight, Selecting::new(origin, None, lane));
                }
                Ok(response)
            }
            Looked::Hit { held, .. } => {
                let stored = held.value().headers.clone();
                drop(held);
                next_lane(engine, conditions, origin, primary, lane, stored).await
            }
            Looked::Miss(miss) => {
                Box::pin(resolve(engine, miss, conditions, origin, primary, lane)).await
            }
        }
    })
}

/// The starter's streamed response, whose body ends only once the flight has
/// answered it: the engine answers a starter once the fleet has the entry, so
/// that a client that saw the whole body is never served an older one next.
/// The flight's answer is awaited on a task of its own, so a client that hangs
/// up does not stop it.
fn settled_by<B, F>(mut response: Response<Body<B>>, answer: F) -> Response<Body<B>>
where
    B: HttpBody,
    F: std::future::Future + Send + 'static,
{
    let (settled, wait) = oneshot::channel();
    tokio::spawn(async move {
        let _ = answer.await;
        let _ = settled.send(());
    });
    response.body_mut().end_after(wait);
    response
}
