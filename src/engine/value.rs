//! What the cache can hold: [`CacheValue`], and its implementations for
//! byte buffers, strings and shared values.

use std::sync::Arc;

use bytes::Bytes;

/// A value the cache can hold: cheap to clone (share data behind `Bytes` or
/// `Arc`) and able to say roughly how many bytes it keeps alive.
///
/// **Shared across the fleet only with `SHARED = true`.** A value type is
/// stored in Redis, and rebuilt once for the whole fleet, only when its
/// implementation sets [`SHARED`](Self::SHARED) to `true` *and* implements
/// [`encode`](Self::encode) and [`decode`](Self::decode). Otherwise (the
/// default, with [`weight`](Self::weight) as the only method written) the
/// value is cached and coalesced in each process, but every instance of the
/// fleet rebuilds it on its own: one rebuild per instance, not one for the
/// fleet. [`Bytes`], [`String`] and `Vec<u8>` are shared; `Arc<T>` is shared
/// when `T` is.
///
/// A value kept in each process:
///
/// ```
/// use stampede_guard::CacheValue;
///
/// #[derive(Clone)]
/// struct Report { rows: std::sync::Arc<Vec<u64>> }
///
/// impl CacheValue for Report {
///     fn weight(&self) -> usize { self.rows.len() * 8 }
/// }
/// ```
///
/// A value shared through Redis:
///
/// ```
/// use bytes::Bytes;
/// use stampede_guard::CacheValue;
///
/// #[derive(Clone)]
/// struct Price { cents: u64 }
///
/// impl CacheValue for Price {
///     fn weight(&self) -> usize { 8 }
///     fn encode(&self) -> Option<Bytes> {
///         Some(Bytes::copy_from_slice(&self.cents.to_be_bytes()))
///     }
///     fn decode(bytes: Bytes) -> Option<Self> {
///         let cents = u64::from_be_bytes(bytes.as_ref().try_into().ok()?);
///         Some(Price { cents })
///     }
///     const SHARED: bool = true; // without it, each instance rebuilds its own
/// }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be held by the cache: it does not implement `CacheValue`",
    label = "not a `CacheValue`",
    note = "`CacheValue` is implemented for `Bytes`, `String`, `Vec<u8>` and `Arc<T>` where `T: CacheValue`; store it encoded as `Bytes` or `String`, or implement `CacheValue` for it (with `encode`, `decode` and `SHARED = true` to share it across the fleet)"
)]
pub trait CacheValue: Clone + Send + Sync + 'static {
    /// Approximate heap bytes this value keeps alive; counted against the L1
    /// byte bound.
    fn weight(&self) -> usize;

    /// The value as bytes for the shared tier, or `None` to keep it local.
    fn encode(&self) -> Option<Bytes> {
        None
    }

    /// The value back from bytes written by [`encode`](Self::encode). `None`
    /// for bytes it does not recognise: they are treated as a miss.
    fn decode(bytes: Bytes) -> Option<Self> {
        let _ = bytes;
        None
    }

    /// Whether [`encode`](Self::encode) and [`decode`](Self::decode) are
    /// implemented (default `false`). Values that say `false` never touch the
    /// shared tier, so each instance builds its own instead of waiting on
    /// another's: set it to `true` with `encode` and `decode` for one
    /// rebuild per key for the fleet.
    const SHARED: bool = false;
}

impl CacheValue for Bytes {
    fn weight(&self) -> usize {
        self.len()
    }

    fn encode(&self) -> Option<Bytes> {
        Some(self.clone())
    }

    fn decode(bytes: Bytes) -> Option<Self> {
        Some(bytes)
    }

    const SHARED: bool = true;
}

impl CacheValue for String {
    fn weight(&self) -> usize {
        self.capacity()
    }

    fn encode(&self) -> Option<Bytes> {
        Some(Bytes::copy_from_slice(self.as_bytes()))
    }

    fn decode(bytes: Bytes) -> Option<Self> {
        String::from_utf8(bytes.to_vec()).ok()
    }

    const SHARED: bool = true;
}

impl CacheValue for Vec<u8> {
    fn weight(&self) -> usize {
        self.capacity()
    }

    fn encode(&self) -> Option<Bytes> {
        Some(Bytes::copy_from_slice(self))
    }

    fn decode(bytes: Bytes) -> Option<Self> {
        Some(bytes.to_vec())
    }

    const SHARED: bool = true;
}

impl<T: CacheValue> CacheValue for Arc<T> {
    fn weight(&self) -> usize {
        T::weight(self)
    }

    fn encode(&self) -> Option<Bytes> {
        T::encode(self)
    }

    fn decode(bytes: Bytes) -> Option<Self> {
        T::decode(bytes).map(Arc::new)
    }

    const SHARED: bool = T::SHARED;
}
