//! The formats of the messages on the namespace's channels, besides the
//! key events (see [`super::notify::Event`]) and the entries commits carry
//! (see [`super::carried`]).
//!
//! - an invalidation: `i:<group>:<instance>:<nonce>`;
//! - a generation of the invalidation table moved:
//!   `g:<field>:<generation>:<instance>:<nonce>`;
//! - an acknowledgement, on the sender's own channel, of one invalidation
//!   or of several: `a:<nonce>[,<nonce>…]:<instance>`;
//! - what an acknowledgement set records: `<instance>:<subject>`, the
//!   subject a group's key, or a table field and its new generation.

use crate::key::Key;
use crate::store::generations::{parse_generation, Field};

/// Whether `name` looks like an instance's signature (16 hex digits).
pub(crate) fn is_instance(name: &str) -> bool {
    name.len() == 16 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// An acknowledgement to send: the invalidator, its nonce, and what the
/// message that was handled invalidated (see [`super::acks`]).
pub(crate) type AckDue = (String, u64, String);

/// What an invalidation of `group` invalidated, as its acknowledgement
/// records it.
pub(crate) fn key_subject(group: &Key) -> String {
    group.to_string()
}

/// What a generation message invalidated, as its acknowledgement records
/// it: the field and its new generation.
pub(crate) fn generation_subject(field: &str, generation: u64) -> String {
    format!("{field}:{generation}")
}

/// The most invalidations one acknowledgement names.
pub(crate) const ACKED_MAX: usize = 1_024;

/// The acknowledgement of the invalidation `nonce`, signed by `instance`.
#[cfg(test)]
pub(crate) fn ack_message(nonce: u64, instance: &str) -> String {
    acks_message(&[nonce], instance)
}

/// The acknowledgement of the invalidations `nonces` (at most
/// [`ACKED_MAX`]), signed by `instance`.
pub(crate) fn acks_message(nonces: &[u64], instance: &str) -> String {
    let mut message = String::with_capacity(nonces.len().saturating_mul(21).saturating_add(20));
    message.push_str("a:");
    for (i, nonce) in nonces.iter().enumerate() {
        if i > 0 {
            message.push(',');
        }
        message.push_str(&nonce.to_string());
    }
    message.push(':');
    message.push_str(instance);
    message
}

pub(crate) fn parse_nonce(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// An acknowledgement (after its `a:`): the nonces it names (one, or at
/// most [`ACKED_MAX`]) and, if signed, the instance that sent it. Nothing
/// if any part is not ours.
pub(crate) fn parse_ack(bytes: &[u8]) -> Option<(Vec<u64>, Option<&str>)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (nonces, by) = match text.split_once(':') {
        Some((nonces, by)) => (nonces, Some(by)),
        None => (text, None),
    };
    let mut parsed = Vec::new();
    for nonce in nonces.split(',') {
        if parsed.len() >= ACKED_MAX {
            return None;
        }
        parsed.push(nonce.parse().ok()?);
    }
    Some((parsed, by))
}

/// How `instance`'s acknowledgement of a message invalidating `subject` is
/// recorded in the invalidation's acknowledgement set.
pub(crate) fn recorded(instance: &str, subject: &str) -> String {
    format!("{instance}:{subject}")
}

/// A generation message, `<field>:<generation>:<instance>:<nonce>` (after
/// its `g:`): the field, its new generation, the sender and its nonce.
pub(super) fn parse_moved(message: &[u8]) -> Option<(Field, u64, &str, u64)> {
    let text = std::str::from_utf8(message).ok()?;
    let mut parts = text.splitn(4, ':');
    let field = Field::parse(parts.next()?.as_bytes())?;
    let generation = parse_generation(parts.next()?.as_bytes())?;
    let sender = parts.next()?;
    let nonce = parts.next()?.parse().ok()?;
    Some((field, generation, sender, nonce))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledgements_parse_signed_or_not() {
        assert_eq!(parse_ack(b"9"), Some((vec![9], None)));
        assert_eq!(
            parse_ack(&ack_message(9, "0123456789abcdef").as_bytes()[2..]),
            Some((vec![9], Some("0123456789abcdef")))
        );
        assert_eq!(
            parse_ack(&acks_message(&[9, 7, u64::MAX], "0123456789abcdef").as_bytes()[2..]),
            Some((vec![9, 7, u64::MAX], Some("0123456789abcdef")))
        );
        let too_many: Vec<u64> = (0..=ACKED_MAX as u64).collect();
        for foreign in [
            &b""[..],
            b"x",
            b"-1",
            b"\xff:1",
            b"99999999999999999999999",
            b"1,",
            b",1:0123456789abcdef",
            b"1,x:0123456789abcdef",
            &acks_message(&too_many, "0123456789abcdef").into_bytes()[2..],
        ] {
            assert_eq!(parse_ack(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn generation_messages_parse_and_foreign_ones_do_not() {
        assert_eq!(
            parse_moved(b"b17:1732270000000001:0123456789abcdef:9"),
            Some((
                Field::Bucket(crate::store::generations::Scope::ROOT, 17),
                1_732_270_000_000_001,
                "0123456789abcdef",
                9
            ))
        );
        assert_eq!(parse_moved(b"all:5:x:1").map(|m| m.0), Some(Field::All));
        for foreign in [
            &b""[..],
            b"b17",
            b"b17:1",
            b"b17:1:s",
            b"b17:-1:s:1",
            b"b99999:1:s:1",
            b"b1:99999999999999999999:s:1",
            b"b1:1:s:nonce",
            b"\xff:1:s:1",
        ] {
            assert_eq!(parse_moved(foreign), None, "{foreign:?}");
        }
    }
}
