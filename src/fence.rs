//! Fencing tokens: how a protected resource tells a current lease holder
//! from one whose lease ran out.

/// A number issued with every lease or lock acquisition, larger than every
/// earlier one for the same key or lock.
///
/// A lease can run out under a holder that is still alive (a long pause, a
/// partition) while another instance takes over. The stale holder does not
/// know; the resource it changes can: it remembers the largest token it has
/// seen and refuses smaller ones.
///
/// A read-modify-write must check the token on the **read** too. If only
/// writes were checked, a stalled holder that read before the takeover could
/// still write (the new holder has read, but not yet written, so no larger
/// token is on record), and the new holder would then overwrite it: one of
/// the two updates is lost. A read that records its token closes that gap,
/// as does a write that is conditional on the value read.
///
/// ```
/// use stampede_guard::FencingToken;
///
/// /// A store that serves only the newest lock holder it has seen.
/// struct Stock { units: u32, last_fence: Option<FencingToken> }
///
/// impl Stock {
///     /// Records `fence` as seen: every older holder is refused from now on.
///     fn admit(&mut self, fence: FencingToken) -> Result<(), &'static str> {
///         if self.last_fence.is_some_and(|last| fence < last) {
///             return Err("stale lock holder");
///         }
///         self.last_fence = Some(fence);
///         Ok(())
///     }
///
///     fn read(&mut self, fence: FencingToken) -> Result<u32, &'static str> {
///         self.admit(fence)?;
///         Ok(self.units)
///     }
///
///     fn write(&mut self, units: u32, fence: FencingToken) -> Result<(), &'static str> {
///         self.admit(fence)?;
///         self.units = units;
///         Ok(())
///     }
/// }
///
/// let mut stock = Stock { units: 10, last_fence: None };
/// let (stalled, current) = (FencingToken(6), FencingToken(7));
/// let seen_by_stalled = stock.read(stalled).unwrap(); // then its lease runs out
/// let seen = stock.read(current).unwrap();            // the new holder reads
/// // The stalled holder wakes up and writes: refused, though the new holder
/// // has not written yet, because its read was recorded.
/// assert!(stock.write(seen_by_stalled - 1, stalled).is_err());
/// assert!(stock.write(seen - 1, current).is_ok());
/// assert_eq!(stock.units, 9);
/// ```
///
/// The crate's own cache commits are fenced this way inside Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);
