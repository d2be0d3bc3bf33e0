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
/// [`StampedeGuard`] method of the same name does. The key function, the
/// tag function and the cache-status header's name are set in code.
///
/// A value read with serde is [validated](Self::validate): a value out of
/// its field's range (a ttl of `"0s"`, a duration past 2^31 s, a status
/// outside 100..=599, …) is an error that names the field, the value and
/// what is accepted, never clamped without a word. A value built in code
/// is clamped by the builder methods; call [`validate`](Self::validate)
/// to refuse it instead.
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
    // The derived impls become inherent functions; the trait impls below
    // wrap them so that every value read is validated.
    serde(remote = "Self", default, deny_unknown_fields)
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
    /// See [`StampedeGuard::refresh_ahead`]: `{ "multiple": 2.0, "floor":
    /// "50ms" }`.
    pub refresh_ahead: Option<RefreshAheadConfig>,
    /// See [`StampedeGuard::route_name`].
    pub route_name: Option<String>,
    /// See [`StampedeGuard::cache_status`].
    pub cache_status: Option<bool>,
    /// See [`StampedeGuard::cache_status_name`].
    pub cache_status_name: Option<String>,
    /// See [`StampedeGuard::tag_headers`]: header names.
    #[cfg_attr(feature = "serde", serde(with = "serde_impl::header_names"))]
    pub tag_headers: Option<Vec<HeaderName>>,
    /// See [`StampedeGuard::expose_tag_headers`].
    pub expose_tag_headers: Option<bool>,
}

/// The two settings of [`StampedeGuard::refresh_ahead`], in a
/// [`RouteConfig`].
///
/// ```
/// use std::time::Duration;
/// use stampede_guard::{RefreshAheadConfig, RouteConfig};
///
/// let mut config = RouteConfig::default();
/// config.refresh_ahead = Some(RefreshAheadConfig::new(2.0, Duration::from_millis(50)));
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize, serde::Serialize),
    serde(deny_unknown_fields)
)]
#[non_exhaustive]
pub struct RefreshAheadConfig {
    /// Headroom over the last rebuild time: a finite number, at least 0.
    pub multiple: f64,
    /// The least margin before expiry.
    #[cfg_attr(feature = "serde", serde(with = "humantime_serde", default))]
    pub floor: Duration,
}

impl RefreshAheadConfig {
    /// `multiple` times the last rebuild time, never less than `floor`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let ahead = stampede_guard::RefreshAheadConfig::new(2.0, Duration::from_millis(50));
    /// assert_eq!(ahead.multiple, 2.0);
    /// ```
    #[must_use]
    pub fn new(multiple: f64, floor: Duration) -> Self {
        RefreshAheadConfig { multiple, floor }
    }
}

/// A [`RouteConfig`] value out of its field's range: which field, the
/// value, and what the field accepts.
///
/// ```
/// use std::time::Duration;
/// use stampede_guard::RouteConfig;
///
/// let mut config = RouteConfig::default();
/// config.ttl = Some(Duration::ZERO);
/// let e = config.validate().unwrap_err();
/// assert_eq!(e.field(), "ttl");
/// assert!(e.to_string().contains("0s"), "{e}");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteConfigError {
    field: &'static str,
    value: String,
    accepted: &'static str,
}

impl RouteConfigError {
    /// The field's name, as in the configuration file.
    ///
    /// ```
    /// # use stampede_guard::RouteConfig;
    /// let mut config = RouteConfig::default();
    /// config.max_body_bytes = Some(0);
    /// assert_eq!(config.validate().unwrap_err().field(), "max_body_bytes");
    /// ```
    #[must_use]
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// The value refused, as text.
    ///
    /// ```
    /// # use stampede_guard::RouteConfig;
    /// let mut config = RouteConfig::default();
    /// config.early_refresh = Some(-1.0);
    /// assert_eq!(config.validate().unwrap_err().value(), "-1");
    /// ```
    #[must_use]
    pub fn value(&self) -> &str {
        &self.value
    }

    /// What the field accepts.
    ///
    /// ```
    /// # use stampede_guard::RouteConfig;
    /// let mut config = RouteConfig::default();
    /// config.route_name = Some(String::new());
    /// assert_eq!(config.validate().unwrap_err().accepted(), "a name of at least one character");
    /// ```
    #[must_use]
    pub fn accepted(&self) -> &'static str {
        self.accepted
    }
}

impl std::fmt::Display for RouteConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "route config: `{}` is {}, out of range; it accepts {}",
            self.field, self.value, self.accepted
        )
    }
}

impl std::error::Error for RouteConfigError {}

/// The longest duration a field takes: the longest any lifetime may be
/// (2^31 s, RFC 9111 §1.2.2).
const MAX: Duration = crate::engine::MAX_DELTA;
const POSITIVE: &str = "a duration from 1ms to 2147483648s (2^31 s)";
const ANY: &str = "a duration from 0s (off) to 2147483648s (2^31 s)";

impl RouteConfig {
    /// Checks every field set against the range its
    /// [`StampedeGuard`] method gives it meaning in; the first one out of
    /// range is the error. Values read with serde are checked already.
    ///
    /// | field | accepts |
    /// |---|---|
    /// | `ttl`, `lease`, `rebuild_timeout` | 1ms to 2^31 s |
    /// | `stale_while_revalidate`, `stale_if_error`, `wait_budget`, `hit_for_miss`, `refresh_ahead.floor` | 0s to 2^31 s |
    /// | `early_refresh`, `refresh_ahead.multiple` | a finite number, at least 0 |
    /// | `max_body_bytes` | at least 1 |
    /// | `cacheable_statuses` | codes in 100..=599 |
    /// | `on_wait_timeout` `respond` | a code in 200..=599 (a final answer) |
    /// | `route_name`, `cache_status_name` | at least one character |
    ///
    /// ```
    /// use std::time::Duration;
    /// use stampede_guard::RouteConfig;
    ///
    /// let mut config = RouteConfig::default();
    /// config.lease = Some(Duration::from_secs(u64::MAX));
    /// let e = config.validate().unwrap_err();
    /// assert_eq!(e.field(), "lease");
    /// ```
    ///
    /// # Errors
    ///
    /// The first field out of range, with its value and what it accepts.
    pub fn validate(&self) -> Result<(), RouteConfigError> {
        let error = |field, value: String, accepted| RouteConfigError {
            field,
            value,
            accepted,
        };
        let show = |d: Duration| {
            if d.is_zero() {
                "0s".to_owned()
            } else {
                format!("{d:?}")
            }
        };
        let durations = [
            ("ttl", self.ttl, true),
            ("lease", self.lease, true),
            ("rebuild_timeout", self.rebuild_timeout, true),
            ("stale_while_revalidate", self.stale_while_revalidate, false),
            ("stale_if_error", self.stale_if_error, false),
            ("wait_budget", self.wait_budget, false),
            ("hit_for_miss", self.hit_for_miss, false),
            (
                "refresh_ahead.floor",
                self.refresh_ahead.map(|r| r.floor),
                false,
            ),
        ];
        for (field, value, positive) in durations {
            if let Some(d) = value
                && (d > MAX || (positive && d < Duration::from_millis(1)))
            {
                return Err(error(field, show(d), if positive { POSITIVE } else { ANY }));
            }
        }
        let numbers = [
            ("early_refresh", self.early_refresh),
            (
                "refresh_ahead.multiple",
                self.refresh_ahead.map(|r| r.multiple),
            ),
        ];
        for (field, value) in numbers {
            if let Some(x) = value
                && !(x.is_finite() && x >= 0.0)
            {
                return Err(error(
                    field,
                    x.to_string(),
                    "a finite number, at least 0 (0: off)",
                ));
            }
        }
        if self.max_body_bytes == Some(0) {
            return Err(error("max_body_bytes", "0".to_owned(), "at least 1 byte"));
        }
        for code in self.cacheable_statuses.iter().flatten() {
            if !(100..=599).contains(&code.as_u16()) {
                return Err(error(
                    "cacheable_statuses",
                    code.as_u16().to_string(),
                    "status codes in 100..=599",
                ));
            }
        }
        if let Some(WaitTimeout::Respond(code)) = self.on_wait_timeout
            && !(200..=599).contains(&code.as_u16())
        {
            return Err(error(
                "on_wait_timeout",
                code.as_u16().to_string(),
                "\"fail_open\" or a status code in 200..=599 (a final answer)",
            ));
        }
        for (field, value) in [
            ("route_name", &self.route_name),
            ("cache_status_name", &self.cache_status_name),
        ] {
            if value.as_deref() == Some("") {
                return Err(error(
                    field,
                    "\"\"".to_owned(),
                    "a name of at least one character",
                ));
            }
        }
        Ok(())
    }
}

/// A [`RouteConfig`] as read, before validation.
#[cfg(feature = "serde")]
struct Unchecked(RouteConfig);

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Unchecked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        RouteConfig::deserialize(d).map(Unchecked)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for RouteConfig {
    /// Reads a config and [validates](RouteConfig::validate) it; an error
    /// names the field (its path, `cacheable_statuses[2]`).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let Unchecked(config) = serde_path_to_error::deserialize(d).map_err(|e| {
            let path = e.path().to_string();
            D::Error::custom(format!("route config: `{path}`: {}", e.into_inner()))
        })?;
        config.validate().map_err(D::Error::custom)?;
        Ok(config)
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for RouteConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RouteConfig::serialize(self, s)
    }
}

#[cfg(feature = "serde")]
mod serde_impl {
    use http::{HeaderName, StatusCode};
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::WaitTimeout;

    fn status<E: serde::de::Error>(code: u16) -> Result<StatusCode, E> {
        StatusCode::from_u16(code)
            .map_err(|_| E::custom(format!("{code} is not an HTTP status code (100 to 599)")))
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
        config.refresh_ahead = Some(RefreshAheadConfig::new(2.0, Duration::from_millis(50)));
        config.route_name = Some("report".to_owned());
        config.cache_status = Some(false);
        config.tag_headers = Some(vec![HeaderName::from_static("x-tags")]);
        config.expose_tag_headers = Some(true);
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
        let ahead = p.flight.refresh_ahead.expect("refresh-ahead set");
        assert_eq!(
            (ahead.multiple, ahead.floor),
            (2.0, Duration::from_millis(50))
        );
        assert_eq!(p.route_name.as_deref(), Some("report"));
        assert!(p.presentation.cache_status.is_none(), "cache_status(false)");
        assert_eq!(&*p.tags.headers, &[HeaderName::from_static("x-tags")]);
        assert!(p.tags.expose);
        // And the name turns the member back on.
        let named = guard.with_config(&RouteConfig {
            cache_status_name: Some("edge".to_owned()),
            ..RouteConfig::default()
        });
        assert!(named.policy().presentation.cache_status.is_some());
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
