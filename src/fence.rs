//! Fencing tokens: how a protected resource tells a current lease holder
//! from one whose lease ran out.

/// A number issued with every lease or lock acquisition, larger than every
/// earlier one for the same key or lock.
///
/// A lease can run out under a holder that is still alive (a long pause, a
/// partition) while another instance takes over. The stale holder does not
/// know; the resource it writes to can: it remembers the largest token it has
/// seen and refuses smaller ones.
///
/// ```
/// use stampede_guard::FencingToken;
///
/// /// A store that refuses writes from holders older than the last writer.
/// struct Stock { units: u32, last_fence: Option<FencingToken> }
///
/// impl Stock {
///     fn set(&mut self, units: u32, fence: FencingToken) -> Result<(), &'static str> {
///         if self.last_fence.is_some_and(|last| fence < last) {
///             return Err("stale lock holder");
///         }
///         self.last_fence = Some(fence);
///         self.units = units;
///         Ok(())
///     }
/// }
///
/// let mut stock = Stock { units: 10, last_fence: None };
/// assert!(stock.set(9, FencingToken(7)).is_ok());
/// assert!(stock.set(8, FencingToken(6)).is_err()); // a holder whose lease ran out
/// ```
///
/// The crate's own cache commits are fenced this way inside Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);
