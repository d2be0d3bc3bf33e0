//! [`StampedeGuard`]'s opt-ins (what a route may store beyond the safe
//! defaults) and its fleet knobs (lease, rebuild timeout, early refresh,
//! namespace).

use std::sync::Arc;
use std::time::Duration;

use super::layer::StampedeGuard;
use crate::engine::MAX_DELTA;

impl StampedeGuard {
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
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).respect_cache_control(true);
    /// ```
    #[must_use]
    pub fn respect_cache_control(self, on: bool) -> Self {
        self.with(|p| p.store.respect_cache_control = on)
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

    /// Opt in to storing responses whose `Vary` is `*` or names headers the
    /// route does not key on.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).ignore_vary(true);
    /// ```
    #[must_use]
    pub fn ignore_vary(self, on: bool) -> Self {
        self.with(|p| p.store.ignore_vary = on)
    }

    /// How long a key whose answer could not be shared skips coalescing
    /// (default 5 s), so its requests run side by side, not one after another.
    /// The window does not block the key: the first shareable answer one of
    /// those requests gets is stored, and the key is coalesced and hit again.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).hit_for_miss(Duration::from_secs(1));
    /// ```
    #[must_use]
    pub fn hit_for_miss(self, window: Duration) -> Self {
        self.with(|p| p.store.hit_for_miss = window.min(MAX_DELTA))
    }

    /// How long the fleet-wide rebuild lease lasts before it must be renewed
    /// (default 5 s). While the handler runs, a watchdog renews it every third
    /// of this; if the instance dies, another may rebuild after at most this
    /// long. Only used with a Redis backend.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).lease(Duration::from_secs(2));
    /// ```
    #[must_use]
    pub fn lease(self, lease: Duration) -> Self {
        self.with(|p| p.flight.lease = lease.min(MAX_DELTA))
    }

    /// The longest a rebuild may run (default 30 s). A rebuild runs on its
    /// own task and finishes even if every request waiting for it has gone;
    /// past this it is abandoned, and its waiters get stale-if-error or
    /// `504 Gateway Timeout`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stampede_guard::{Backend, StampedeGuard};
    ///
    /// let guard = StampedeGuard::new(Backend::local()).rebuild_timeout(Duration::from_secs(5));
    /// ```
    #[must_use]
    pub fn rebuild_timeout(self, timeout: Duration) -> Self {
        self.with(|p| p.flight.rebuild_timeout = timeout.min(MAX_DELTA))
    }

    /// Probabilistic early refresh (XFetch): a fresh entry is refreshed in
    /// the background, by one request in the fleet, with a chance that grows
    /// as its expiry nears and with how long it took to build. `beta` scales
    /// how early (1.0 is the usual choice; larger refreshes earlier). A hot key
    /// then rarely expires at all.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).early_refresh(1.0);
    /// ```
    #[must_use]
    pub fn early_refresh(self, beta: f64) -> Self {
        let beta = (beta.is_finite() && beta > 0.0).then_some(beta);
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
    /// a `floor` of 50 ms is a good start. A `multiple` that is not a finite
    /// number of at least 0 counts as 0 (the floor alone). The margin is
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
        let multiple = if multiple.is_finite() && multiple > 0.0 {
            multiple
        } else {
            0.0
        };
        let ahead = crate::engine::RefreshAhead { multiple, floor };
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
    /// backend.
    ///
    /// ```
    /// # use std::time::Duration; use stampede_guard::{Backend, StampedeGuard};
    /// let guard = StampedeGuard::new(Backend::local()).namespace("catalog-v2");
    /// ```
    #[must_use]
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        let namespace: Arc<str> = Arc::from(namespace.into());
        self.with(|p| p.keys.namespace = namespace)
    }
}
