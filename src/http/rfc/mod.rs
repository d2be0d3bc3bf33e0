//! Parsers for what the RFCs say about HTTP messages, as leaves: they know
//! nothing of a route's settings, and nothing else in `http` is below them.
//!
//! - `cache_control`: `Cache-Control`, `Expires` and `Age` (RFC 9111).
//! - `date`: HTTP dates (RFC 9110 §5.6.7) and the `Date` a forwarded or
//!   stored response carries (§6.6.1).
//! - `structured`: whether a field is an RFC 8941 list (for upstream
//!   `Cache-Status` lines).
//! - `reference`: URI references resolved against a base (RFC 3986 §5.2).
//! - `headers`: `Accept-Encoding` and `Forwarded` in the form the key uses.

pub(crate) mod cache_control;
pub(crate) mod date;
pub(crate) mod headers;
pub(crate) mod reference;
pub(crate) mod structured;
