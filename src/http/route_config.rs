//! [`RouteConfig`]: a route's policy as data, for a service that keeps its
//! settings in its own configuration file.

use std::time::Duration;

use http::{HeaderName, StatusCode};

use super::flight::WaitTimeout;
use crate::limits;
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
/// tag function and the name of the `x-cache` header are set in code.
///
/// A field accepts the range its method documents, the same in code and in
/// a file. A value read with serde is [validated](Self::validate): a value
/// out of its field's range (a lease of `"0s"`, a duration past 2^31 s, a
/// status outside 100..=599, …) is an error that names the field, the value
/// and what is accepted, never clamped without a word. A value built in
/// code is clamped by the builder methods as they document (a status code
/// out of range panics there); call [`validate`](Self::validate) to refuse
/// it instead.
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
/// config.lease = Some(Duration::ZERO);
/// let e = config.validate().unwrap_err();
/// assert_eq!(e.field(), "lease");
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

impl RouteConfig {
    /// Checks every field set against the range its
    /// [`StampedeGuard`] method gives it meaning in; the first one out of
    /// range is the error. Values read with serde are checked already.
    ///
    /// The ranges are those the builder methods clamp into (a status code
    /// out of range panics there): a knob means the same in code and in a
    /// file.
    ///
    /// | field | accepts |
    /// |---|---|
    /// | `lease`, `rebuild_timeout` | 1ms to 2^31 s |
    /// | `ttl`, `stale_while_revalidate`, `stale_if_error`, `wait_budget`, `hit_for_miss`, `refresh_ahead.floor` | 0s to 2^31 s |
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
            ("ttl", self.ttl, limits::TTL),
            ("lease", self.lease, limits::LEASE),
            (
                "rebuild_timeout",
                self.rebuild_timeout,
                limits::REBUILD_TIMEOUT,
            ),
            (
                "stale_while_revalidate",
                self.stale_while_revalidate,
                limits::STALE_WHILE_REVALIDATE,
            ),
            (
                "stale_if_error",
                self.stale_if_error,
                limits::STALE_IF_ERROR,
            ),
            ("wait_budget", self.wait_budget, limits::WAIT_BUDGET),
            ("hit_for_miss", self.hit_for_miss, limits::HIT_FOR_MISS),
            (
                "refresh_ahead.floor",
                self.refresh_ahead.map(|r| r.floor),
                limits::REFRESH_AHEAD_FLOOR,
            ),
        ];
        for (field, value, span) in durations {
            if let Some(d) = value
                && !span.holds(d)
            {
                return Err(error(field, show(d), span.accepted));
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
                && !limits::ratio_holds(x)
            {
                return Err(error(field, x.to_string(), limits::RATIO_ACCEPTED));
            }
        }
        if let Some(bytes) = self.max_body_bytes
            && !limits::MAX_BODY_BYTES.contains(&bytes)
        {
            return Err(error(
                "max_body_bytes",
                bytes.to_string(),
                limits::MAX_BODY_BYTES_ACCEPTED,
            ));
        }
        for code in self.cacheable_statuses.iter().flatten() {
            if !limits::STORED_STATUS.contains(&code.as_u16()) {
                return Err(error(
                    "cacheable_statuses",
                    code.as_u16().to_string(),
                    limits::STORED_STATUS_ACCEPTED,
                ));
            }
        }
        if let Some(WaitTimeout::Respond(code)) = self.on_wait_timeout
            && !limits::ANSWER_STATUS.contains(&code.as_u16())
        {
            return Err(error(
                "on_wait_timeout",
                code.as_u16().to_string(),
                limits::ANSWER_STATUS_ACCEPTED,
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
    use crate::http::policy::Policy;
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

    /// One table of limits for code and config: for every knob and every
    /// edge value, a value the config accepts is kept as is by the builder,
    /// and one it refuses (naming the knob) is brought into the range the
    /// config accepts.
    #[test]
    fn the_builder_and_the_config_agree_on_every_knob() {
        type SetConfig = fn(&mut RouteConfig, Duration);
        type Read = fn(&Policy) -> Duration;
        let durations: [(&str, SetConfig, Read); 8] = [
            ("ttl", |c, d| c.ttl = Some(d), |p| p.store.lifetime.ttl),
            (
                "stale_while_revalidate",
                |c, d| c.stale_while_revalidate = Some(d),
                |p| p.store.lifetime.stale_while_revalidate,
            ),
            (
                "stale_if_error",
                |c, d| c.stale_if_error = Some(d),
                |p| p.store.lifetime.stale_if_error,
            ),
            (
                "wait_budget",
                |c, d| c.wait_budget = Some(d),
                |p| p.flight.wait_budget,
            ),
            ("lease", |c, d| c.lease = Some(d), |p| p.flight.lease),
            (
                "rebuild_timeout",
                |c, d| c.rebuild_timeout = Some(d),
                |p| p.flight.rebuild_timeout,
            ),
            (
                "hit_for_miss",
                |c, d| c.hit_for_miss = Some(d),
                |p| p.store.hit_for_miss,
            ),
            (
                "refresh_ahead.floor",
                |c, d| c.refresh_ahead = Some(RefreshAheadConfig::new(1.0, d)),
                |p| p.flight.refresh_ahead.map_or(Duration::MAX, |r| r.floor),
            ),
        ];
        let edges = [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(999),
            Duration::from_millis(1),
            Duration::from_secs(30),
            crate::engine::MAX_DELTA,
            crate::engine::MAX_DELTA + Duration::from_nanos(1),
            Duration::from_secs(u64::MAX),
            Duration::MAX,
        ];
        let guard = || StampedeGuard::new(Backend::local());
        for (field, set, read) in durations {
            for d in edges {
                let mut config = RouteConfig::default();
                set(&mut config, d);
                let kept = read(guard().with_config(&config).policy());
                match config.validate() {
                    Ok(()) => assert_eq!(kept, d, "{field} = {d:?}: accepted, so kept"),
                    Err(e) => {
                        assert_eq!(e.field(), field, "{e}");
                        assert_ne!(kept, d, "{field} = {d:?}: refused, so clamped");
                        let mut clamped = RouteConfig::default();
                        set(&mut clamped, kept);
                        assert!(
                            clamped.validate().is_ok(),
                            "{field} = {d:?} clamped to {kept:?}, which the config refuses"
                        );
                    }
                }
            }
        }

        type SetRatio = fn(&mut RouteConfig, f64);
        type ReadRatio = fn(&Policy) -> f64;
        let ratios: [(&str, SetRatio, ReadRatio); 2] = [
            (
                "early_refresh",
                |c, x| c.early_refresh = Some(x),
                |p| p.flight.early_refresh.unwrap_or(0.0),
            ),
            (
                "refresh_ahead.multiple",
                |c, x| c.refresh_ahead = Some(RefreshAheadConfig::new(x, Duration::ZERO)),
                |p| p.flight.refresh_ahead.map_or(f64::NAN, |r| r.multiple),
            ),
        ];
        let edges = [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -1.0,
            -0.0,
            0.0,
            f64::MIN_POSITIVE,
            1.0,
            f64::MAX,
        ];
        for (field, set, read) in ratios {
            for x in edges {
                let mut config = RouteConfig::default();
                set(&mut config, x);
                let kept = read(guard().with_config(&config).policy());
                match config.validate() {
                    Ok(()) => assert_eq!(kept, x, "{field} = {x}: accepted, so kept"),
                    Err(e) => {
                        assert_eq!(e.field(), field, "{e}");
                        assert_eq!(kept, 0.0, "{field} = {x}: refused, so off");
                    }
                }
            }
        }

        for bytes in [0, 1, 4 << 20, usize::MAX] {
            let config = RouteConfig {
                max_body_bytes: Some(bytes),
                ..RouteConfig::default()
            };
            let kept = guard().with_config(&config).policy().store.max_body_bytes;
            assert_eq!(config.validate().is_ok(), kept == bytes, "{bytes}");
            assert!(kept >= 1);
        }

        // Names: the empty one the config refuses is no name in code (the
        // route's label and the cache's name as if never set).
        let named = RouteConfig {
            route_name: Some(String::new()),
            cache_status_name: Some(String::new()),
            ..RouteConfig::default()
        };
        assert!(named.validate().is_err());
        let p = guard().cache_status(false).with_config(&named);
        assert!(p.policy().route_name.is_none());
        let members = p.policy().presentation.cache_status.as_ref();
        assert_eq!(
            format!("{:?}", members.expect("the name turns the member on")),
            format!("{:?}", super::super::cache_status::Rfc9211::default_name()),
        );

        // Status codes: what the config refuses, the builder refuses too
        // (with a panic at construction: a status is a constant in code).
        for code in [100, 101, 199, 200, 503, 599, 600, 999] {
            let code = StatusCode::from_u16(code).unwrap();
            let cases = [
                RouteConfig {
                    cacheable_statuses: Some(vec![code]),
                    ..RouteConfig::default()
                },
                RouteConfig {
                    on_wait_timeout: Some(WaitTimeout::Respond(code)),
                    ..RouteConfig::default()
                },
            ];
            for config in cases {
                let built = std::panic::catch_unwind(|| {
                    let _ = guard().with_config(&config);
                });
                assert_eq!(config.validate().is_ok(), built.is_ok(), "{config:?}");
            }
        }
    }
}
