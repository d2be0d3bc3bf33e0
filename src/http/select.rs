//! Selecting a URL's variant by a learned `Vary` (vary.rs says how entries
//! are stamped and matched): the lanes a request tries in turn, and the
//! rebuild that stamps what it stores.
//!
//! A request first looks under its key (the URL's own variant, `Primary`).
//! An entry there that does not select it sends it to its variant's slot
//! (`Slot`), and an entry there that does not either to a flight of its own
//! variant whose answer is shared, never stored (`Exact`). Each lane is a
//! key of its own in the engine, so its misses coalesce per key: the
//! requests of one variant share one origin call.

use bytes::Buf;
use http::header::VARY;
use http::{HeaderMap, Request, Response};
use http_body::Body as HttpBody;
use tower_service::Service;

use super::admit::{Admitted, Private};
use super::key::Keyed;
use super::origin::Origin;
use super::policy::Policy;
use super::response::CachedResponse;
use super::vary::{selection, selector, selects, stamp, variant_slot, Covers};
use crate::engine::{Built, Held, Overtaken, Rebuild};
use crate::key::Key;

/// Which of a URL's keys a request looks under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The request's own key: the URL's variant stored last.
    Primary,
    /// The slot of the request's variant.
    Slot,
    /// The variant's own flight, never stored.
    Exact,
}

impl Lane {
    /// The lane after this one, and its key, for a request whose values of
    /// what selects `stored` (its learned `Vary`, its codings) are
    /// `request`'s; `None` after the last, or when nothing can select
    /// `stored`.
    pub(crate) fn next(
        self,
        primary: &Key,
        stored: &HeaderMap,
        request: &HeaderMap,
        covers: Covers<'_>,
    ) -> Option<(Lane, Key)> {
        let selector = selector(stored, covers)?;
        let digest = selection(request, &selector);
        match self {
            Lane::Primary => Some((Lane::Slot, variant_slot(primary, &selector, &digest, false))),
            Lane::Slot => Some((Lane::Exact, variant_slot(primary, &selector, &digest, true))),
            Lane::Exact => None,
        }
    }
}

/// What `policy`'s route keys on, its key made as `keyed` says.
pub(crate) fn covers(policy: &Policy, keyed: Keyed) -> Covers<'_> {
    Covers {
        vary: &policy.keys.vary,
        keyed,
        ignore_vary: policy.store.ignore_vary,
    }
}

/// Whether an entry with `stored` headers may answer a request with
/// `request` headers on `policy`'s route, its key made as `keyed` says (on
/// a route that ignores `Vary`, any the request accepts the coding of).
pub(crate) fn selected(
    policy: &Policy,
    stored: &HeaderMap,
    request: &HeaderMap,
    keyed: Keyed,
) -> bool {
    selects(stored, request, covers(policy, keyed))
}

/// Where an origin the engine did not run is handed back: it gave the
/// request an entry instead, which may be another variant's. Closed without
/// one as soon as the origin starts to run (or the engine drops it).
pub(crate) type Back<S, ReqBody, ResBody> =
    tokio::sync::oneshot::Sender<Origin<S, ReqBody, ResBody>>;

/// An `Origin` that stamps what it stores with its request's nominated
/// values, and stores nothing in the `Exact` lane. Dropped unrun, it hands
/// its origin back.
pub(crate) struct Selecting<S, ReqBody, ResBody: HttpBody> {
    origin: Option<Origin<S, ReqBody, ResBody>>,
    back: Option<Back<S, ReqBody, ResBody>>,
    lane: Lane,
}

impl<S, ReqBody, ResBody: HttpBody> Selecting<S, ReqBody, ResBody> {
    /// `back`, if given, gets the origin if it is dropped unrun.
    pub(crate) fn new(
        origin: Origin<S, ReqBody, ResBody>,
        back: Option<Back<S, ReqBody, ResBody>>,
        lane: Lane,
    ) -> Self {
        Selecting {
            origin: Some(origin),
            back,
            lane,
        }
    }

    /// The origin, unrun.
    pub(crate) fn into_origin(mut self) -> Option<Origin<S, ReqBody, ResBody>> {
        self.origin.take()
    }
}

impl<S, ReqBody, ResBody: HttpBody> Drop for Selecting<S, ReqBody, ResBody> {
    fn drop(&mut self) {
        if let (Some(origin), Some(back)) = (self.origin.take(), self.back.take()) {
            let _ = back.send(origin);
        }
    }
}

impl<S, ReqBody, ResBody> Rebuild for Selecting<S, ReqBody, ResBody>
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
        // It runs: nothing comes back, and whoever waits for it knows now.
        drop(self.back.take());
        let Some(mut origin) = self.origin.take() else {
            return Built::Failed {
                shared: None,
                private: None,
                answer: None,
            };
        };
        // Nothing of this lane is stored: its starter is answered from the
        // entry once the flight has it, whose status says so, rather than
        // from a head streamed before the lane's rule was applied.
        if self.lane == Lane::Exact {
            origin.early = None;
        }
        let request = origin.request.headers().clone();
        let (policy, keyed) = (origin.policy.clone(), origin.keyed);
        let mut built = origin.rebuild(stale, overtaken).await;
        match &mut built {
            Built::Value { value, store, .. } => {
                let selectable = stamp(&mut value.headers, &request, covers(&policy, keyed));
                if !selectable || self.lane == Lane::Exact {
                    *store = false;
                }
            }
            // The origin's answer to a failure stands in for it on the
            // fleet's failure backoff: stamped like an entry, it answers
            // only requests of its variant there, and the others take
            // their variant's own lane. A status-only answer carries the
            // `Vary` of the response it stands for.
            Built::Failed {
                answer: Some(answer),
                private,
                ..
            } => {
                if let Some(Private::Response(response)) = private
                    && !answer.headers.contains_key(VARY)
                {
                    for value in response.headers().get_all(VARY) {
                        answer.headers.append(VARY, value.clone());
                    }
                }
                stamp(&mut answer.headers, &request, covers(&policy, keyed));
            }
            _ => {}
        }
        built
    }
}
