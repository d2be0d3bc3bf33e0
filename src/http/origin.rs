//! `Origin`: how the layer rebuilds an entry for the engine (its
//! [`Rebuild`]): the inner service, called with the request that missed made
//! into a plain GET, or with the layer's own conditions when the entry it
//! replaces has a validator.

use std::future::poll_fn;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Buf;
use http::{header, HeaderName, Method, Request, Response, StatusCode};
use http_body::Body as HttpBody;
use tower_service::Service;

use super::admit::{admit, Admitted, Early, Private, ResponseDelay};
use super::body::GuardBody as Body;
use super::cache_status::{CacheStatus, Forward, Forwarded, Fwd};
use super::key::Keyed;
use super::policy::Policy;
use super::respond::tag_with;
use super::response::CachedResponse;
use super::revalidate::{ask_conditionally, renew};
use super::rfc::date::stamp;
use crate::engine::{Held, Overtaken, Rebuild};
use crate::metrics::{self as m, count, Labels};

/// How the layer rebuilds an entry: the inner service, with the request that
/// missed.
pub(super) struct Origin<S, ReqBody, ResBody: HttpBody> {
    pub(super) inner: S,
    pub(super) request: Request<ReqBody>,
    pub(super) policy: Arc<Policy>,
    /// What the key this rebuild stores under was made of.
    pub(super) keyed: Keyed,
    /// The starter's response, as soon as it may be shared.
    pub(super) early: Option<Early<ResBody>>,
    pub(super) labels: Labels,
    /// What this rebuild did, for the request that started it.
    pub(super) forwarded: Arc<Forwarded>,
}

/// Request headers that would let the origin answer with less than the whole
/// entry (a 304 or a 412), which the waiters did not ask for.
pub(super) const CONDITIONAL: [HeaderName; 5] = [
    header::IF_MATCH,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
];

impl<S, ReqBody, ResBody> Origin<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: HttpBody,
{
    /// The origin's answer, given a `Date` when it has no valid one: the
    /// time it arrived (RFC 9110 §6.6.1), before anything reads its age or
    /// its freshness, stores it or forwards it; and the time it took.
    async fn call(mut self) -> Result<Response<ResBody>, S::Error> {
        poll_fn(|cx| self.inner.poll_ready(cx)).await?;
        let asked = Instant::now();
        let mut response = self.inner.call(self.request).await?;
        stamp(response.headers_mut(), SystemTime::now());
        // Its `Age` counts from `asked` (RFC 9111 §4.2.3).
        response
            .extensions_mut()
            .insert(ResponseDelay(asked.elapsed()));
        Ok(response)
    }

    /// This request alone, uncached, streamed.
    pub(super) async fn alone(self) -> Result<Response<Body<ResBody>>, S::Error> {
        let policy = self.policy.clone();
        let mut response = self.call().await?;
        response.extensions_mut().remove::<ResponseDelay>();
        policy.tags.take(response.headers_mut());
        let forward = Forward {
            detail: Some("hit-for-miss"),
            ..Forward::new(Fwd::Bypass)
        };
        Ok(tag_with(
            &policy,
            response.map(|body| Body::stream_hiding(body, policy.tags.hidden())),
            CacheStatus::Bypass,
            forward,
        ))
    }
}

impl<S, ReqBody, ResBody> Rebuild for Origin<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: HttpBody + Send + 'static,
    ResBody::Data: Buf + Send,
    ResBody::Error: Send,
{
    type Value = CachedResponse;
    type Private = Private<ResBody, S::Error>;

    async fn rebuild(
        mut self,
        stale: Option<Held<CachedResponse>>,
        overtaken: Overtaken,
    ) -> Admitted<ResBody, S::Error> {
        // With a copy that may stand in for a failure, the starter waits for
        // the whole answer: a body failing part way is then replaced by that
        // copy, which a response already streaming could not be.
        if stale
            .as_ref()
            .is_some_and(|s| s.entry().usable_on_error(Instant::now()))
        {
            self.early = None;
        }
        // The entry is the GET answer, whatever this request's method and
        // conditions; HEAD is answered from it afterwards.
        *self.request.method_mut() = Method::GET;
        for name in &CONDITIONAL {
            self.request.headers_mut().remove(name);
        }
        // The entry is the whole representation; ranges are cut from it.
        self.request.headers_mut().remove(header::RANGE);
        // The entry being replaced, if it has a validator: ask whether it
        // still holds (only our own conditions reach the origin).
        // A renewed entry keeps the tags it had.
        let kept = stale.as_ref().map(|held| held.entry().stamp().tag_set());
        let had_stale = stale.is_some();
        // Only an entry of this request's own variant: a 304 to validators
        // of another (another coding, other values of a learned `Vary`)
        // would renew that one for this request's variant.
        let covers = super::vary::Covers {
            vary: &self.policy.keys.vary,
            keyed: self.keyed,
            ignore_vary: self.policy.store.ignore_vary,
        };
        let own = stale.as_ref().is_some_and(|held| {
            super::vary::selects(&held.value().headers, self.request.headers(), covers)
        });
        let stored = stale
            .map(|held| held.value().clone())
            .filter(|_| own)
            .filter(|stored| ask_conditionally(stored, self.request.headers_mut()));
        let (policy, keyed, labels) = (self.policy.clone(), self.keyed, self.labels);
        let early = self.early.take();
        let (parts, body) = self.request.into_parts();
        let mut tags = policy.tags.of_request(&parts);
        self.request = Request::from_parts(parts, body);
        let forwarded = self.forwarded.clone();
        forwarded.ran();
        // The starter's own response says `fwd=stale` when it replaces an
        // expired entry.
        let fwd = match had_stale {
            true => Fwd::Stale,
            false => Fwd::UriMiss,
        };
        let mut built = match self.call().await {
            Ok(mut response) => {
                // An invalidation already overtook this rebuild: nothing it
                // builds is stored, so the starter's head, which would leave
                // before the engine decides, waits for it and says so.
                let early = early.filter(|_| !overtaken.happened());
                forwarded.answered(response.status().as_u16());
                match (response.status() == StatusCode::NOT_MODIFIED, stored) {
                    (true, Some(stored)) => {
                        count(m::REVALIDATED, labels);
                        tags.extend(&policy.tags.take(response.headers_mut()));
                        policy.tags.strip(response.headers_mut());
                        tags.extend(&kept.unwrap_or_default());
                        renew(&policy, stored, response, keyed)
                    }
                    _ => {
                        let tags = tags.clone();
                        admit(&policy, response, keyed, early, labels, fwd, tags).await
                    }
                }
            }
            Err(error) => crate::engine::Built::Failed {
                shared: None,
                private: Some(Private::Error(error)),
                answer: None,
            },
        };
        if let crate::engine::Built::Value {
            tags: built_tags, ..
        } = &mut built
        {
            built_tags.extend(&tags);
        }
        built
    }
}
