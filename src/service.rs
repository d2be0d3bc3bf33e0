//! The tower service: HTTP in, engine, HTTP out.
//!
//! `call` does the cheap part synchronously: policy, key, one L1 read. A hit
//! (fresh or stale) is answered from a ready future, with no boxing and no
//! I/O. Only misses take the slow path, a boxed future that asks the fleet,
//! leads the rebuild or waits for it.

use std::collections::VecDeque;
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame};
use pin_project_lite::pin_project;
use tower_service::Service;
use tracing::Instrument;

use crate::backend::Backend;
use crate::body::Body;
use crate::engine::{Engine, Finish, FleetPolicy, Leader, Lease, Lookup, Outcome, Plan};
use crate::entry::{CachedResponse, Entry};
use crate::key::{request_key, Key};
use crate::metrics::{self as m, count};
use crate::policy::{classify, request_bypass, Policy, Verdict, WaitTimeout};

/// How a response was answered, as told in the cache-status header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CacheStatus {
    Hit,
    Stale,
    Miss,
    Coalesced,
    Bypass,
}

impl CacheStatus {
    fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            CacheStatus::Hit => "HIT",
            CacheStatus::Stale => "STALE",
            CacheStatus::Miss => "MISS",
            CacheStatus::Coalesced => "COALESCED",
            CacheStatus::Bypass => "BYPASS",
        })
    }
}

/// The service a [`StampedeGuard`](crate::StampedeGuard) wraps around an inner
/// service.
#[derive(Clone)]
pub struct GuardService<S> {
    inner: S,
    backend: Backend,
    policy: Arc<Policy>,
}

impl<S> GuardService<S> {
    pub(crate) fn new(inner: S, backend: Backend, policy: Arc<Policy>) -> Self {
        GuardService {
            inner,
            backend,
            policy,
        }
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

type SlowFuture<B, E> = Pin<Box<dyn Future<Output = Result<Response<Body<B>>, E>> + Send>>;

pin_project! {
    /// Response future of [`GuardService`].
    pub struct ResponseFuture<F, B, E> where B: HttpBody {
        #[pin]
        state: State<F, B, E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, B, E> where B: HttpBody {
        Ready { response: Option<Response<Body<B>>> },
        Passthrough { #[pin] future: F, status: Option<(HeaderName, HeaderValue)> },
        Slow { future: SlowFuture<B, E> },
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: HttpBody,
{
    type Output = Result<Response<Body<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Ready { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => panic!("ResponseFuture polled after completion"),
            },
            StateProj::Passthrough { future, status } => {
                let response = std::task::ready!(future.poll(cx))?;
                let mut response = response.map(Body::stream);
                if let Some((name, value)) = status.take() {
                    response.headers_mut().insert(name, value);
                }
                Poll::Ready(Ok(response))
            }
            StateProj::Slow { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B: HttpBody, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}

/// What a request carries into the slow path and background work.
#[derive(Clone)]
struct Ctx {
    backend: Backend,
    policy: Arc<Policy>,
    key: Key,
    ask: Ask,
}

/// What the client asked for beyond the entry itself.
#[derive(Clone, Default)]
struct Ask {
    /// Only the head (HEAD).
    head: bool,
    /// Only news: the entity tags it already has (`If-None-Match`).
    if_none_match: Option<HeaderValue>,
}

impl Ask {
    fn of<B>(request: &Request<B>) -> Self {
        Ask {
            head: request.method() == Method::HEAD,
            if_none_match: request.headers().get(header::IF_NONE_MATCH).cloned(),
        }
    }
}

impl Ctx {
    fn engine(&self) -> &Engine {
        &self.backend.engine
    }

    fn fleet(&self) -> FleetPolicy {
        FleetPolicy {
            lease: self.policy.lease,
            wait_budget: self.policy.wait_budget,
        }
    }

    fn respond<B: HttpBody>(
        &self,
        entry: &Entry,
        status: CacheStatus,
    ) -> Option<Response<Body<B>>> {
        respond(&self.policy, &self.ask, entry, status, Instant::now())
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for GuardService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
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
        if request_bypass(policy, request.method(), request.headers()).is_some() {
            return self.pass_through(request);
        }
        let (parts, body) = request.into_parts();
        let custom = match &policy.key_fn {
            Some(key_fn) => match key_fn(&parts) {
                Some(custom) => Some(custom),
                None => return self.pass_through(Request::from_parts(parts, body)),
            },
            None => None,
        };
        let key = request_key(&policy.namespace, &parts, &policy.vary, custom.as_deref());
        let request = Request::from_parts(parts, body);
        let ask = Ask::of(&request);
        let now = Instant::now();
        match self.backend.engine.lookup(key, now) {
            Lookup::Fresh(entry) => {
                let Some(response) = respond(policy, &ask, &entry, CacheStatus::Hit, now) else {
                    return self.pass_through(request);
                };
                count(m::HITS);
                if let Some(beta) = policy.early_refresh {
                    if let Some(leader) = self.backend.engine.early_refresh(key, &entry, beta, now)
                    {
                        let ctx = self.ctx(key, ask);
                        let left = entry.fresh_for(now) + EARLY_SLACK;
                        spawn_background(
                            ctx,
                            self.inner.clone(),
                            request,
                            leader,
                            None,
                            Background::Early(left),
                        );
                    }
                }
                ready(response)
            }
            Lookup::Stale { entry, refresh } => {
                let Some(response) = respond(policy, &ask, &entry, CacheStatus::Stale, now) else {
                    return self.pass_through(request);
                };
                count(m::STALE);
                if let Some(leader) = refresh {
                    let ctx = self.ctx(key, ask);
                    spawn_background(
                        ctx,
                        self.inner.clone(),
                        request,
                        leader,
                        Some(entry),
                        Background::Refresh,
                    );
                }
                ready(response)
            }
            Lookup::Bypass => self.pass_through(request),
            lookup => {
                let ctx = self.ctx(key, ask);
                // The readied service goes with the request; a clone takes its place.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                ResponseFuture {
                    state: State::Slow {
                        future: Box::pin(slow_path(ctx, inner, request, lookup)),
                    },
                }
            }
        }
    }
}

impl<S> GuardService<S> {
    fn ctx(&self, key: Key, ask: Ask) -> Ctx {
        Ctx {
            backend: self.backend.clone(),
            policy: self.policy.clone(),
            key,
            ask,
        }
    }

    fn pass_through<ReqBody, ResBody>(
        &mut self,
        request: Request<ReqBody>,
    ) -> ResponseFuture<S::Future, ResBody, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        ResBody: HttpBody,
    {
        count(m::BYPASS);
        let status = self
            .policy
            .status_header
            .clone()
            .map(|name| (name, CacheStatus::Bypass.header_value()));
        ResponseFuture {
            state: State::Passthrough {
                future: self.inner.call(request),
                status,
            },
        }
    }
}

fn ready<F, B: HttpBody, E>(response: Response<Body<B>>) -> ResponseFuture<F, B, E> {
    ResponseFuture {
        state: State::Ready {
            response: Some(response),
        },
    }
}

/// Builds a response from a cached entry: the whole entry, its head for
/// HEAD, or `304 Not Modified` when the client already has it. `None` if the
/// entry holds something other than a response (never for keys this layer
/// writes).
fn respond<B: HttpBody>(
    policy: &Policy,
    ask: &Ask,
    entry: &Entry,
    status: CacheStatus,
    now: Instant,
) -> Option<Response<Body<B>>> {
    let cached = entry.value::<CachedResponse>()?;
    let not_modified = cached.status == StatusCode::OK
        && ask
            .if_none_match
            .as_ref()
            .is_some_and(|tags| etag_matches(tags, cached.headers.get(header::ETAG)));
    let body = if ask.head || not_modified {
        Body::empty()
    } else {
        Body::full(cached.body.clone())
    };
    let mut response = Response::new(body);
    *response.headers_mut() = cached.headers.clone();
    // A 304 carries the headers of the 200 it stands for (RFC 9110 §15.4.5),
    // Content-Length included: it may, as long as it is the 200's (§8.6).
    *response.status_mut() = if not_modified {
        StatusCode::NOT_MODIFIED
    } else {
        cached.status
    };
    let headers = response.headers_mut();
    headers.insert(header::AGE, age_value(entry.age(now).as_secs()));
    if let Some(name) = &policy.status_header {
        headers.insert(name.clone(), status.header_value());
    }
    Some(response)
}

/// `If-None-Match` against a stored `ETag`, by weak comparison (RFC 9110
/// §13.1.2): `W/"a"` matches `"a"`; `*` matches any tag.
fn etag_matches(if_none_match: &HeaderValue, etag: Option<&HeaderValue>) -> bool {
    let Some(etag) = etag.and_then(|e| e.to_str().ok()) else {
        return false;
    };
    fn opaque(tag: &str) -> &str {
        tag.trim().trim_start_matches("W/")
    }
    let stored = opaque(etag);
    match if_none_match.to_str() {
        Ok(list) => list
            .split(',')
            .any(|tag| tag.trim() == "*" || opaque(tag) == stored),
        Err(_) => false,
    }
}

/// `Age` values, made once: formatting a number into a fresh header value on
/// every hit would allocate.
fn age_value(seconds: u64) -> HeaderValue {
    static AGES: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    let ages = AGES.get_or_init(|| (0..3600u64).map(HeaderValue::from).collect());
    match ages.get(seconds as usize) {
        Some(value) => value.clone(),
        None => HeaderValue::from(seconds),
    }
}

fn tag<B>(ctx: &Ctx, mut response: Response<B>, status: CacheStatus) -> Response<B> {
    if let Some(name) = &ctx.policy.status_header {
        response
            .headers_mut()
            .insert(name.clone(), status.header_value());
    }
    response
}

fn empty_response<B: HttpBody>(ctx: &Ctx, code: StatusCode) -> Response<Body<B>> {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = code;
    tag(ctx, response, CacheStatus::Bypass)
}

async fn call_inner<S, ReqBody, ResBody>(
    inner: &mut S,
    request: Request<ReqBody>,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    poll_fn(|cx| inner.poll_ready(cx)).await?;
    count(m::ORIGIN_CALLS);
    inner.call(request).await
}

/// A miss: lead the rebuild, or wait for it, until there is an answer.
async fn slow_path<S, ReqBody, ResBody>(
    ctx: Ctx,
    mut inner: S,
    request: Request<ReqBody>,
    mut lookup: Lookup,
) -> Result<Response<Body<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: HttpBody + Send + 'static,
    ResBody::Data: Buf + Send,
    ResBody::Error: Send,
{
    loop {
        let (follower, stale) = match lookup {
            Lookup::Lead { leader, stale } => {
                count(m::MISSES);
                let span = tracing::debug_span!("stampede_guard.lead", key = %ctx.key);
                return lead(ctx, inner, request, leader, stale)
                    .instrument(span)
                    .await;
            }
            Lookup::Follow { follower, stale } => (follower, stale),
            Lookup::Fresh(entry) => {
                if let Some(response) = ctx.respond(&entry, CacheStatus::Hit) {
                    count(m::HITS);
                    return Ok(response);
                }
                return bypass(&ctx, &mut inner, request).await;
            }
            Lookup::Stale { entry, refresh } => {
                if let Some(response) = ctx.respond(&entry, CacheStatus::Stale) {
                    count(m::STALE);
                    if let Some(leader) = refresh {
                        spawn_background(
                            ctx,
                            inner,
                            request,
                            leader,
                            Some(entry),
                            Background::Refresh,
                        );
                    }
                    return Ok(response);
                }
                return bypass(&ctx, &mut inner, request).await;
            }
            Lookup::Bypass => return bypass(&ctx, &mut inner, request).await,
        };

        let span = tracing::debug_span!("stampede_guard.wait", key = %ctx.key);
        let outcome = follower.wait(ctx.policy.wait_budget).instrument(span).await;
        match outcome {
            Some(Outcome::Value { entry, stale }) => {
                let status = if stale {
                    CacheStatus::Stale
                } else {
                    CacheStatus::Coalesced
                };
                if let Some(response) = ctx.respond(&entry, status) {
                    count(if stale { m::STALE } else { m::COALESCED });
                    return Ok(response);
                }
                return bypass(&ctx, &mut inner, request).await;
            }
            Some(Outcome::Abandoned) => {
                // The leader is gone; look again, and perhaps lead.
                lookup = ctx.engine().lookup(ctx.key, Instant::now());
            }
            Some(Outcome::Failed(_)) => {
                let now = Instant::now();
                if let Some(response) = stale
                    .filter(|e| e.usable_on_error(now))
                    .and_then(|e| ctx.respond(&e, CacheStatus::Stale))
                {
                    count(m::STALE);
                    return Ok(response);
                }
                return match ctx.policy.on_wait_timeout {
                    WaitTimeout::Respond(code) => Ok(empty_response(&ctx, code)),
                    WaitTimeout::FailOpen => bypass(&ctx, &mut inner, request).await,
                };
            }
            Some(Outcome::Pass) => return bypass(&ctx, &mut inner, request).await,
            None => {
                count(m::WAIT_TIMEOUTS);
                tracing::debug!(key = %ctx.key, budget = ?ctx.policy.wait_budget, "wait budget ran out");
                return match ctx.policy.on_wait_timeout {
                    WaitTimeout::FailOpen => bypass(&ctx, &mut inner, request).await,
                    WaitTimeout::Respond(code) => Ok(empty_response(&ctx, code)),
                };
            }
        }
    }
}

/// The leader of this process's flight: ask the fleet, then serve what it
/// says, rebuilding if it is our turn.
async fn lead<S, ReqBody, ResBody>(
    ctx: Ctx,
    mut inner: S,
    request: Request<ReqBody>,
    leader: Leader,
    stale: Option<Arc<Entry>>,
) -> Result<Response<Body<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: HttpBody + Send + 'static,
    ResBody::Data: Buf + Send,
    ResBody::Error: Send,
{
    let engine = ctx.engine();
    let plan = engine
        .plan::<CachedResponse>(ctx.key, stale, ctx.fleet(), true, None)
        .await;
    let (lease, stale) = match plan {
        Plan::Hit { entry, waited } => {
            engine.finish(leader, Finish::Store(entry.clone()));
            // A request that waited for another instance's rebuild was
            // coalesced, not a hit, whatever tier answered it.
            let status = if waited {
                CacheStatus::Coalesced
            } else {
                CacheStatus::Hit
            };
            return match ctx.respond(&entry, status) {
                Some(response) => Ok(response),
                None => unreachable_entry(),
            };
        }
        Plan::StaleNow { entry, lease } => {
            count(m::STALE);
            engine.serve_stale_meanwhile(&leader, &entry);
            let response = ctx.respond(&entry, CacheStatus::Stale);
            let work = match lease {
                Some(lease) => Background::Rebuild(lease),
                None => Background::Refresh,
            };
            spawn_background(ctx, inner, request, leader, Some(entry), work);
            return match response {
                Some(response) => Ok(response),
                None => unreachable_entry(),
            };
        }
        Plan::Rebuild { lease, stale } => (lease, stale),
        Plan::TimedOut { stale } => match ctx.policy.on_wait_timeout {
            // Nobody else's rebuild came: rebuild here, for this process.
            WaitTimeout::FailOpen => (None, stale),
            WaitTimeout::Respond(code) => {
                count(m::WAIT_TIMEOUTS);
                engine.finish(leader, Finish::Failed(None));
                let now = Instant::now();
                if let Some(response) = stale
                    .filter(|e| e.usable_on_error(now))
                    .and_then(|e| ctx.respond(&e, CacheStatus::Stale))
                {
                    return Ok(response);
                }
                return Ok(empty_response(&ctx, code));
            }
        },
    };
    match rebuild(&ctx, &mut inner, request, leader, stale, lease).await {
        Rebuilt::Entry {
            entry,
            status,
            extra,
        } => match ctx.respond(&entry, status) {
            Some(mut response) => {
                for (name, value) in extra {
                    response.headers_mut().append(name, value);
                }
                Ok(response)
            }
            None => unreachable_entry(),
        },
        Rebuilt::Response(response) => Ok(response),
        Rebuilt::Error(error) => Err(error),
    }
}

#[cold]
fn unreachable_entry<T>() -> T {
    // Entries under this layer's keys are only ever built from responses.
    unreachable!("an entry under a response key always holds a response")
}

/// Calls the origin for this request alone, without the cache.
async fn bypass<S, ReqBody, ResBody>(
    ctx: &Ctx,
    inner: &mut S,
    request: Request<ReqBody>,
) -> Result<Response<Body<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: HttpBody,
{
    count(m::BYPASS);
    let response = call_inner(inner, request).await?;
    Ok(tag(ctx, response.map(Body::stream), CacheStatus::Bypass))
}

/// Work on a key that no client waits for.
enum Background {
    /// Refresh a stale entry: ask the fleet, rebuild if it is our turn.
    Refresh,
    /// Refresh a fresh entry that has this much freshness left, unless
    /// another instance already refreshed it or is doing so.
    Early(Duration),
    /// The lease is already ours: rebuild.
    Rebuild(Lease),
}

fn spawn_background<S, ReqBody, ResBody>(
    ctx: Ctx,
    mut inner: S,
    request: Request<ReqBody>,
    leader: Leader,
    stale: Option<Arc<Entry>>,
    work: Background,
) where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: HttpBody + Send + 'static,
    ResBody::Data: Buf + Send,
    ResBody::Error: Send,
{
    // Without a runtime there is nobody to run the work; dropping the leader
    // lets the next request try.
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    count(m::REFRESHES);
    let span = tracing::debug_span!("stampede_guard.refresh", key = %ctx.key);
    runtime.spawn(
        async move {
            let engine = ctx.engine();
            let plan = match work {
                Background::Rebuild(lease) => Plan::Rebuild {
                    lease: Some(lease),
                    stale,
                },
                Background::Refresh => {
                    engine
                        .plan::<CachedResponse>(ctx.key, stale, ctx.fleet(), false, None)
                        .await
                }
                Background::Early(left) => {
                    engine
                        .plan::<CachedResponse>(ctx.key, stale, ctx.fleet(), false, Some(left))
                        .await
                }
            };
            match plan {
                Plan::Hit { entry, .. } => engine.finish(leader, Finish::Store(entry)),
                // A stale entry stays in place if the refresh fails; nobody
                // waits on it, so its own response is dropped.
                Plan::Rebuild { lease, stale } => {
                    let _ = rebuild(&ctx, &mut inner, request, leader, stale, lease).await;
                }
                Plan::StaleNow { .. } | Plan::TimedOut { .. } => {
                    engine.finish(leader, Finish::Failed(None))
                }
            }
        }
        .instrument(span),
    );
}

/// What the leader's own client gets.
enum Rebuilt<B: HttpBody, E> {
    /// Built from this entry (fresh, or stale after a failure), with `extra`
    /// headers for the leader alone (its `Set-Cookie`).
    Entry {
        entry: Arc<Entry>,
        status: CacheStatus,
        extra: Vec<(HeaderName, HeaderValue)>,
    },
    /// The origin's response, not shared.
    Response(Response<Body<B>>),
    Error(E),
}

/// Allowance for the instants of this process and Redis's clock to differ
/// when an early refresh asks whether Redis still holds the entry it judged
/// due.
pub(crate) const EARLY_SLACK: Duration = Duration::from_millis(50);

/// Request headers that would let the origin answer with less than the whole
/// entry (a 304 or a 412), which the waiters did not ask for.
const CONDITIONAL: [HeaderName; 5] = [
    header::IF_MATCH,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
];

/// Runs the origin as the key's leader and settles the key: in the L1 and
/// this process's flight at once, then in Redis under the lease.
async fn rebuild<S, ReqBody, ResBody>(
    ctx: &Ctx,
    inner: &mut S,
    request: Request<ReqBody>,
    leader: Leader,
    stale: Option<Arc<Entry>>,
    lease: Option<Lease>,
) -> Rebuilt<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: HttpBody,
    ResBody::Data: Buf,
{
    let (finish, rebuilt) = origin(ctx, inner, request, stale).await;
    ctx.engine()
        .settle::<CachedResponse>(leader, finish, lease)
        .await;
    rebuilt
}

/// Calls the origin and decides what its answer becomes.
async fn origin<S, ReqBody, ResBody>(
    ctx: &Ctx,
    inner: &mut S,
    mut request: Request<ReqBody>,
    stale: Option<Arc<Entry>>,
) -> (Finish, Rebuilt<ResBody, S::Error>)
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: HttpBody,
    ResBody::Data: Buf,
{
    // The entry is the GET answer, whatever this request's method and
    // conditions; HEAD is answered from it afterwards.
    *request.method_mut() = Method::GET;
    for name in &CONDITIONAL {
        request.headers_mut().remove(name);
    }
    let started = Instant::now();
    let response = match call_inner(inner, request).await {
        Ok(response) => response,
        Err(error) => {
            return match usable_stale(&stale) {
                Some(entry) => serve_stale(entry),
                None => (Finish::Failed(None), Rebuilt::Error(error)),
            };
        }
    };
    if response.status().is_server_error() {
        if let Some(entry) = usable_stale(&stale) {
            return serve_stale(entry);
        }
    }
    decide(ctx, response, started, stale).await
}

fn usable_stale(stale: &Option<Arc<Entry>>) -> Option<Arc<Entry>> {
    stale
        .as_ref()
        .filter(|e| e.usable_on_error(Instant::now()))
        .cloned()
}

fn serve_stale<B: HttpBody, E>(entry: Arc<Entry>) -> (Finish, Rebuilt<B, E>) {
    tracing::debug!("rebuild failed; serving stale");
    (
        Finish::ServeStale(entry.clone()),
        Rebuilt::Entry {
            entry,
            status: CacheStatus::Stale,
            extra: Vec::new(),
        },
    )
}

/// Decides what the origin's response may become, and buffers its body if it
/// may be shared.
async fn decide<B, E>(
    ctx: &Ctx,
    response: Response<B>,
    started: Instant,
    stale: Option<Arc<Entry>>,
) -> (Finish, Rebuilt<B, E>)
where
    B: HttpBody,
    B::Data: Buf,
{
    let policy = &ctx.policy;
    let (mut parts, body) = response.into_parts();
    let pass = |reason: &'static str| {
        tracing::debug!(reason, "response not shared");
        Finish::Pass {
            hit_for_miss: policy.hit_for_miss,
        }
    };
    let unshared = |parts, body| {
        Rebuilt::Response(tag(
            ctx,
            Response::from_parts(parts, body),
            CacheStatus::Miss,
        ))
    };

    let (lifetime, store) = match classify(policy, parts.status, &parts.headers) {
        Verdict::Pass(reason) => return (pass(reason), unshared(parts, Body::stream(body))),
        Verdict::Share { lifetime, store } => (lifetime, store),
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > policy.max_body_bytes as u64) {
        return (
            pass("body larger than max_body_bytes"),
            unshared(parts, Body::stream(body)),
        );
    }

    // Read the body, giving up (and streaming the rest) past the size cap.
    let mut body = Box::pin(body);
    let mut frames: VecDeque<Frame<Bytes>> = VecDeque::new();
    let mut len = 0usize;
    loop {
        match poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            None => break,
            Some(Ok(frame)) => {
                let frame = frame.map_data(|mut d| d.copy_to_bytes(d.remaining()));
                let trailers = frame.is_trailers();
                len += frame.data_ref().map_or(0, Bytes::len);
                frames.push_back(frame);
                if trailers || len > policy.max_body_bytes {
                    let body = Body::replay(frames, None, false, body);
                    return (
                        pass("body too large or has trailers"),
                        unshared(parts, body),
                    );
                }
            }
            Some(Err(error)) => {
                if let Some(entry) = usable_stale(&stale) {
                    return serve_stale(entry);
                }
                let body = Body::replay(frames, Some(error), true, body);
                return (Finish::Failed(None), unshared(parts, body));
            }
        }
    }
    let body = concat(frames, len);

    strip_hop_by_hop(&mut parts.headers);
    let initial_age = parts
        .headers
        .remove(header::AGE)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_secs);
    let mut extra = Vec::new();
    if policy.strip_set_cookie {
        // The stored copy loses every cookie; the leader's own answer keeps them.
        extra.extend(
            parts
                .headers
                .get_all(header::SET_COOKIE)
                .iter()
                .map(|v| (header::SET_COOKIE, v.clone())),
        );
        parts.headers.remove(header::SET_COOKIE);
    }
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    // Slots for the headers every hit fills in: replacing a value in the
    // cloned map is cheaper than growing it.
    parts
        .headers
        .insert(header::AGE, HeaderValue::from_static("0"));
    if let Some(name) = &policy.status_header {
        parts
            .headers
            .insert(name.clone(), CacheStatus::Hit.header_value());
    }
    let cached = CachedResponse {
        status: parts.status,
        headers: parts.headers,
        body,
    };
    let entry = Arc::new(Entry::new(
        cached,
        lifetime,
        initial_age,
        started.elapsed(),
        Instant::now(),
    ));
    let finish = if store {
        Finish::Store(entry.clone())
    } else {
        Finish::Share(entry.clone())
    };
    (
        finish,
        Rebuilt::Entry {
            entry,
            status: CacheStatus::Miss,
            extra,
        },
    )
}

/// One `Bytes` from the data frames: no copy when the origin sent one chunk.
fn concat(frames: VecDeque<Frame<Bytes>>, len: usize) -> Bytes {
    let mut chunks = frames.into_iter().filter_map(|f| f.into_data().ok());
    match (chunks.next(), chunks.next()) {
        (None, _) => Bytes::new(),
        (Some(only), None) => only,
        (Some(first), Some(second)) => {
            let mut all = BytesMut::with_capacity(len);
            all.extend_from_slice(&first);
            all.extend_from_slice(&second);
            for chunk in chunks {
                all.extend_from_slice(&chunk);
            }
            all.freeze()
        }
    }
}

/// Removes the headers that describe one connection, not the resource
/// (RFC 9110 §7.6.1), including any the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}
