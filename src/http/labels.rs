//! The metric labels of a request: the route's name, never its path.
//!
//! A route named with [`StampedeGuard::route_name`](crate::StampedeGuard::route_name)
//! is labelled with that name. Otherwise, with the `axum` feature, the
//! route's matched path as axum's router records it (the template,
//! `/users/{id}`, not the path the client sent); otherwise `unnamed`. A
//! client cannot make new label values: the paths it sends never become
//! one.

use std::sync::OnceLock;

use http::request::Parts;

use super::policy::Policy;
use crate::metrics::Labels;

/// The route label of a route with no name and no matched path.
pub(crate) const UNNAMED: &str = "unnamed";

/// One guarded service's labels, made when the layer wraps it.
#[derive(Debug)]
pub(crate) struct RouteLabels {
    /// The labels when the route has a name, or no matched path is known.
    fixed: Labels,
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    named: bool,
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    namespace: std::sync::Arc<str>,
    /// The first matched path seen and its labels: a guard on one route
    /// only ever sees that one, and reads it without a lock.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    matched: OnceLock<(Box<str>, Labels)>,
}

impl RouteLabels {
    pub(crate) fn new(policy: &Policy) -> Self {
        let name = policy.route_name.as_deref();
        RouteLabels {
            fixed: Labels::of(name.unwrap_or(UNNAMED), &policy.keys.namespace),
            named: name.is_some(),
            namespace: policy.keys.namespace.clone(),
            matched: OnceLock::new(),
        }
    }

    /// The labels of this request.
    pub(crate) fn of(&self, _parts: &Parts) -> Labels {
        #[cfg(feature = "axum")]
        if !self.named
            && let Some(path) = _parts.extensions.get::<axum::extract::MatchedPath>()
        {
            return self.matched(path.as_str());
        }
        self.fixed
    }

    #[cfg(feature = "axum")]
    fn matched(&self, path: &str) -> Labels {
        let (seen, labels) = self
            .matched
            .get_or_init(|| (Box::from(path), Labels::of(path, &self.namespace)));
        if **seen == *path {
            *labels
        } else {
            // A guard around several routes: the process-wide table.
            Labels::of(path, &self.namespace)
        }
    }
}
