//! What the cache can hold: [`CacheValue`], and its implementations for
//! byte buffers, strings and shared values.

use std::sync::Arc;

use bytes::Bytes;

/// A value the cache can hold: cheap to clone (share data behind `Bytes` or
/// `Arc`) and able to say roughly how many bytes it keeps alive.
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
/// To be shared through Redis a value must also turn into bytes and back.
/// A value that does not (the default) is still cached and coalesced in this
/// process, but each instance of the fleet builds its own.
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
    /// implemented. Values that say `false` never touch the shared tier, so
    /// each instance builds its own instead of waiting on another's.
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
