//! [`RouteConfig`]: a route's policy as data, for a service that keeps its
//! settings in its own configuration file.

use std::time::Duration;

use http::{HeaderName, StatusCode};

use super::flight::WaitTimeout;
#[cfg(doc)]
use crate::StampedeGuard;

/// The data knobs of a route's policy, in one value a service can load from
/// its own configuration (with the `serde` feature: any serde format,
/// durations in human form such as `"30s"` or `"1m 30s"`, unknown fields
/// rejected). Apply it with [`StampedeGuard::with_config`].
///
/// Every field is optional: a field left out keeps the guard's setting, so a
/// file states only what it changes. Each field does what the
/// [`StampedeGuard`] method of the same name does, with the same bounds. The
/// key function and the cache-status header are set in code.
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use std::time::Duration;
/// use stampede_guard::{Backend, RouteConfig, StampedeGuard, WaitTimeout};
///
/// let config: RouteConfig = serde_json::from_str(r#"{
///     "ttl": "30s",
///     "stale_while_revalidate": "1m",
///     "wait_budget": "2s",
///     "on_wait_timeout": { "respond": 503 },
///     "vary": ["accept-language"]
/// }"#).unwrap();
/// assert_eq!(config.ttl, Some(Duration::from_secs(30)));
/// assert_eq!(config.on_wait_timeout, Some(WaitTimeout::Respond(http::StatusCode::SERVICE_UNAVAILABLE)));
/// let guard = StampedeGuard::new(Backend::local()).with_config(&config);
/// # let _ = guard;
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize, serde::Serialize),
    serde(default, deny_unknown_fields)
)]
#[non_exhaustive]
pub struct RouteConfig {
    /// See [`StampedeGuard::ttl`].
    #[cfg_attr(feature = "serde", serde(with = "serde_impl::duration"))]
    pub ttl: Option<Duration>,
    /// See [`StampedeGuard::stale_while_revalidate`].
    #[cfg_attr(feature = "serde", serde(with = "serde_impl::duration"))]
    pub stale_while_revalidate: Option<Duration>,
    /// See [`StampedeGuard::stale_if_error`].
    #[cfg_attr(feature = "serde", serde(with = "serde_impl::duration"))]
    pub stale_if_error: Option<Duration>,
    /// See [`StampedeGuard::wait_budget`].
    #[cfg_attr(feature = "serde", serde(with = "serde_impl::duration"))]
    pub wait_budget: Option<Duration>,
    /// See [`StampedeGuard::on_wait_timeout`]: `"fail_open"` or
    /// `{ "respond": 503 }`.
    pub on_wait_timeout: Option<WaitTimeout>,
    /// See [`StampedeGuard::lease`].
    #[cfg_attr(feature = "serde", serde(with = "serde_impl::duration"))]
    pub lease: Option<Duration>,
    /// See [`StampedeGuard::rebuild_timeout`].
    #[cfg_attr(feature = "serde", serde(with = "serde_impl::duration"))]
    pub rebuild_timeout: Option<Duration>,
    /// See [`StampedeGuard::hit_for_miss`].
    #[cfg_attr(feature = "serde", serde(with = "serde_impl::duration"))]
    pub hit_for_miss: Option<Duration>,
    /// See [`StampedeGuard::early_refresh`] (a `beta`; `0` turns it off).
    pub early_refresh: Option<f64>,
    /// See [`StampedeGuard::max_body_bytes`].
    pub max_body_bytes: Option<usize>,
    /// See [`StampedeGuard::cacheable_statuses`]: status codes as numbers.
    #[cfg_attr(feature = "serde", serde(with = "serde_impl::statuses"))]
    pub cacheable_statuses: Option<Vec<StatusCode>>,
    /// See [`StampedeGuard::vary`]: header names.
    #[cfg_attr(feature = "serde", serde(with = "serde_impl::header_names"))]
    pub vary: Option<Vec<HeaderName>>,
    /// See [`StampedeGuard::forwarded_headers`]: header names.
    #[cfg_attr(feature = "serde", serde(with = "serde_impl::header_names"))]
    pub forwarded_headers: Option<Vec<HeaderName>>,
    /// See [`StampedeGuard::namespace`].
    pub namespace: Option<String>,
    /// See [`StampedeGuard::respect_cache_control`].
    pub respect_cache_control: Option<bool>,
    /// See [`StampedeGuard::cache_control_targets`]: targeted field names
    /// (RFC 9213), in order of precedence; `[]` reads `Cache-Control`
    /// alone. On load each must be a valid header name, none may be
    /// `cache-control` itself, and none may be listed twice.
    #[cfg_attr(feature = "serde", serde(with = "serde_impl::targets"))]
    pub cache_control_targets: Option<Vec<HeaderName>>,
    /// See [`StampedeGuard::allow_credentials`].
    pub allow_credentials: Option<bool>,
    /// See [`StampedeGuard::respect_request_cache_control`].
    pub respect_request_cache_control: Option<bool>,
    /// See [`StampedeGuard::strip_set_cookie`].
    pub strip_set_cookie: Option<bool>,
    /// See [`StampedeGuard::cache_private`].
    pub cache_private: Option<bool>,
    /// See [`StampedeGuard::ignore_vary`].
    pub ignore_vary: Option<bool>,
    /// See [`StampedeGuard::invalidate_on_unsafe`].
    pub invalidate_on_unsafe: Option<bool>,
}

#[cfg(feature = "serde")]
mod serde_impl {
    use http::{HeaderName, StatusCode};
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::WaitTimeout;

    fn status<E: serde::de::Error>(code: u16) -> Result<StatusCode, E> {
        StatusCode::from_u16(code)
            .map_err(|_| E::custom(format!("{code} is not an HTTP status code (100 to 999)")))
    }

    /// `"fail_open"` or `{ "respond": 503 }`.
    #[derive(Deserialize, Serialize)]
    #[serde(rename_all = "snake_case", deny_unknown_fields)]
    enum WaitTimeoutRepr {
        FailOpen,
        Respond(u16),
    }

    impl<'de> Deserialize<'de> for WaitTimeout {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            match WaitTimeoutRepr::deserialize(d)? {
                WaitTimeoutRepr::FailOpen => Ok(WaitTimeout::FailOpen),
                WaitTimeoutRepr::Respond(code) => status(code).map(WaitTimeout::Respond),
            }
        }
    }

    impl Serialize for WaitTimeout {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            match self {
                WaitTimeout::FailOpen => WaitTimeoutRepr::FailOpen,
                WaitTimeout::Respond(code) => WaitTimeoutRepr::Respond(code.as_u16()),
            }
            .serialize(s)
        }
    }

    /// Durations in human form (`"30s"`, `"1m 30s"`, `"250ms"`), with the
    /// reason a value is not one.
    pub(super) mod duration {
        use std::time::Duration;

        use humantime_serde::re::humantime;

        use super::*;

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|text| {
                    humantime::parse_duration(&text).map_err(|e| {
                        D::Error::custom(format!(
                            "{text:?} is not a duration ({e}); write one like \"30s\", \"1m 30s\" or \"250ms\""
                        ))
                    })
                })
                .transpose()
        }

        pub fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
            v.map(|d| humantime::format_duration(d).to_string())
                .serialize(s)
        }
    }

    pub(super) mod statuses {
        use super::*;

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Vec<StatusCode>>, D::Error> {
            Option::<Vec<u16>>::deserialize(d)?
                .map(|codes| codes.into_iter().map(status).collect())
                .transpose()
        }

        pub fn serialize<S: Serializer>(
            v: &Option<Vec<StatusCode>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            v.as_ref()
                .map(|codes| codes.iter().map(StatusCode::as_u16).collect::<Vec<_>>())
                .serialize(s)
        }
    }

    pub(super) mod header_names {
        use super::*;

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Vec<HeaderName>>, D::Error> {
            Option::<Vec<String>>::deserialize(d)?
                .map(|names| {
                    names
                        .into_iter()
                        .map(|name| {
                            HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                                D::Error::custom(format!("{name:?} is not a valid header name"))
                            })
                        })
                        .collect()
                })
                .transpose()
        }

        pub fn serialize<S: Serializer>(
            v: &Option<Vec<HeaderName>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            v.as_ref()
                .map(|names| names.iter().map(HeaderName::as_str).collect::<Vec<_>>())
                .serialize(s)
        }
    }

    /// Targeted cache-control field names: valid names, each once, and
    /// never `cache-control` itself (which is not a targeted field: read
    /// as one, its directives would be taken for the deployment's own).
    pub(super) mod targets {
        use super::*;

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Vec<HeaderName>>, D::Error> {
            let Some(names) = header_names::deserialize(d)? else {
                return Ok(None);
            };
            for (i, name) in names.iter().enumerate() {
                if name == http::header::CACHE_CONTROL {
                    return Err(D::Error::custom(
                        "\"cache-control\" is not a targeted cache-control field (RFC 9213); name the deployment's own, such as \"cdn-cache-control\"",
                    ));
                }
                if names[..i].contains(name) {
                    return Err(D::Error::custom(format!(
                        "{:?} is listed twice in cache_control_targets",
                        name.as_str()
                    )));
                }
            }
            Ok(Some(names))
        }

        pub fn serialize<S: Serializer>(
            v: &Option<Vec<HeaderName>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            header_names::serialize(v, s)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, StampedeGuard};

    #[test]
    fn every_field_reaches_the_policy_and_absent_fields_keep_the_guards() {
        let base = StampedeGuard::new(Backend::local())
            .ttl(Duration::from_secs(7))
            .namespace("kept");
        let mut config = RouteConfig::default();
        let unchanged = base.clone().with_config(&config);
        assert_eq!(
            format!("{:?}", unchanged.policy()),
            format!("{:?}", base.policy())
        );

        config.stale_while_revalidate = Some(Duration::from_secs(60));
        config.stale_if_error = Some(Duration::from_secs(120));
        config.wait_budget = Some(Duration::from_secs(2));
        config.on_wait_timeout = Some(WaitTimeout::Respond(StatusCode::GATEWAY_TIMEOUT));
        config.lease = Some(Duration::from_secs(3));
        config.rebuild_timeout = Some(Duration::from_secs(9));
        config.hit_for_miss = Some(Duration::from_secs(1));
        config.early_refresh = Some(2.0);
        config.max_body_bytes = Some(1024);
        config.cacheable_statuses = Some(vec![StatusCode::OK]);
        config.vary = Some(vec![http::header::ACCEPT_LANGUAGE]);
        config.forwarded_headers = Some(vec![]);
        config.respect_cache_control = Some(true);
        config.cache_control_targets = Some(vec![HeaderName::from_static("acme-cache-control")]);
        config.allow_credentials = Some(true);
        config.respect_request_cache_control = Some(true);
        config.strip_set_cookie = Some(true);
        config.cache_private = Some(true);
        config.ignore_vary = Some(true);
        config.invalidate_on_unsafe = Some(false);
        let guard = base.with_config(&config);
        let p = guard.policy();
        assert_eq!(
            p.store.lifetime.ttl,
            Duration::from_secs(7),
            "ttl left out: kept"
        );
        assert_eq!(&*p.keys.namespace, "kept");
        assert_eq!(
            p.store.lifetime.stale_while_revalidate,
            Duration::from_secs(60)
        );
        assert_eq!(p.store.lifetime.stale_if_error, Duration::from_secs(120));
        assert_eq!(p.flight.wait_budget, Duration::from_secs(2));
        assert_eq!(
            p.flight.on_wait_timeout,
            WaitTimeout::Respond(StatusCode::GATEWAY_TIMEOUT)
        );
        assert_eq!(p.flight.lease, Duration::from_secs(3));
        assert_eq!(p.flight.rebuild_timeout, Duration::from_secs(9));
        assert_eq!(p.store.hit_for_miss, Duration::from_secs(1));
        assert_eq!(p.flight.early_refresh, Some(2.0));
        assert_eq!(p.store.max_body_bytes, 1024);
        assert_eq!(&*p.store.statuses, &[StatusCode::OK]);
        assert_eq!(&*p.keys.vary, &[http::header::ACCEPT_LANGUAGE]);
        assert!(p.keys.forwarded.is_empty());
        assert!(
            p.store.respect_cache_control && p.store.allow_credentials && p.store.strip_set_cookie
        );
        assert!(p.store.cache_private && p.store.ignore_vary && !p.store.invalidate_on_unsafe);
        assert!(p.store.respect_request_cache_control);
        assert_eq!(
            &*p.store.cache_control_targets,
            &[HeaderName::from_static("acme-cache-control")]
        );
    }

    #[test]
    fn the_builders_bounds_apply_to_configured_values() {
        let config = RouteConfig {
            lease: Some(Duration::MAX),
            early_refresh: Some(f64::NAN),
            ..RouteConfig::default()
        };
        let guard = StampedeGuard::new(Backend::local())
            .early_refresh(1.0)
            .with_config(&config);
        assert_eq!(guard.policy().flight.lease, crate::engine::MAX_DELTA);
        assert_eq!(guard.policy().flight.early_refresh, None);
    }
}
