//! Random numbers, of two kinds: unguessable ones from the operating
//! system for owner tokens, lease secrets and nonces, and cheap ones for
//! jitter and early-refresh draws, which must only be spread out.

/// 64 bits from the operating system's generator.
///
/// # Panics
/// When the operating system has no random source to give (as a thread's
/// random generator does): a token must never be guessable.
pub(crate) fn unguessable_u64() -> u64 {
    getrandom::u64().expect("the operating system's random source failed")
}

/// 128 bits from the operating system's generator; see [`unguessable_u64`].
pub(crate) fn unguessable_u128() -> u128 {
    (u128::from(unguessable_u64()) << 64) | u128::from(unguessable_u64())
}

/// A draw in [0, 1), from a fast per-thread generator: for spreading
/// deadlines and refreshes, never for anything that must not be guessed.
pub(crate) fn unit() -> f64 {
    fastrand::f64()
}
