//! Names in NATS: the subject of a backend's log, the keys of the bucket, and the message ids
//! that make every write idempotent.
//!
//! NATS subjects and keys are dot-separated tokens of a restricted alphabet (a key may hold
//! `A-Z a-z 0-9 - _ = /`, a subject token no `.`, `*`, `>` or white space), while backends,
//! tenants and object keys are arbitrary bytes. [`token`] maps any bytes to one token, one to
//! one: bytes made only of `A-Z a-z 0-9 - _` stay as they are (the common case stays readable),
//! anything else becomes `=` followed by its unpadded URL-safe base64, which never starts
//! with `=`, so the two forms cannot collide.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

/// The one token that stands for `bytes`; see the module's documentation.
pub(crate) fn token(bytes: &[u8]) -> String {
    let plain = !bytes.is_empty()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_');
    if plain {
        // Checked above: ASCII only.
        String::from_utf8_lossy(bytes).into_owned()
    } else {
        format!("={}", URL_SAFE_NO_PAD.encode(bytes))
    }
}

/// The bytes a [`token`] stands for; `None` when it is not one.
#[cfg(test)]
pub(crate) fn untoken(token: &str) -> Option<Vec<u8>> {
    match token.strip_prefix('=') {
        Some(encoded) => URL_SAFE_NO_PAD.decode(encoded).ok(),
        None if !token.is_empty() => Some(token.as_bytes().to_vec()),
        None => None,
    }
}

/// The subject of `backend`'s log in the stream: `<prefix>.<token(backend)>`, the prefix
/// `kv-events` unless `--subject-prefix` says otherwise.
pub(crate) fn subject(prefix: &str, backend: &str) -> String {
    format!("{prefix}.{}", token(backend.as_bytes()))
}

/// The bucket key of one object: `<token(backend)>.<token(tenant)>.<token(key)>`, the
/// tenant as the wire names it (an empty one is `default`).
pub(crate) fn object_key(backend: &str, tenant: &[u8], key: &[u8]) -> String {
    format!(
        "{}.{}.{}",
        token(backend.as_bytes()),
        token(tenant),
        token(key)
    )
}

/// The id of a log message carrying the master's messages `first..=last` of `incarnation`:
/// the same for the same events whoever writes them, so JetStream drops a second copy.
pub(crate) fn events_id(backend: &str, incarnation: u64, first: u64, last: u64) -> String {
    format!(
        "{}.{incarnation:016x}.{first}-{last}",
        token(backend.as_bytes())
    )
}

/// The id of part `part` of a difference that brings the log from what it held after log
/// message `base` (its stream sequence; 0: nothing) to the master's state before its
/// sequence `next` of `incarnation`. Two relays that compute it from the same base compute the same events,
/// so the id may be the same; from different bases, the events differ, and so does the id.
pub(crate) fn diff_id(
    backend: &str,
    incarnation: u64,
    next: u64,
    base: u64,
    part: usize,
) -> String {
    format!(
        "{}.{incarnation:016x}.{next}.diff-{base}.{part}",
        token(backend.as_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_stay_readable_and_others_are_encoded() {
        assert_eq!(token(b"store-a"), "store-a");
        assert_eq!(token(b"obj_1"), "obj_1");
        assert_eq!(token(b""), "=");
        assert_eq!(token(b"a.b"), "=YS5i");
        assert_eq!(token(b"=x"), "=PXg");
        assert_eq!(
            object_key("demo-store", b"default", b"k 1"),
            "demo-store.default.=ayAx"
        );
        assert_eq!(subject("kv-events", "a.b"), "kv-events.=YS5i");
        assert_eq!(subject("prod.kv", "b"), "prod.kv.b");
    }

    #[test]
    fn every_token_fits_the_key_alphabet_and_maps_back() {
        let samples: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"x".to_vec(),
            b"tenant/with.dots*and>".to_vec(),
            vec![0, 255, 128, 46, 61],
            "ключ".as_bytes().to_vec(),
            b"=".to_vec(),
        ];
        for bytes in samples {
            let t = token(&bytes);
            assert!(t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_=".contains(&b)));
            assert_eq!(untoken(&t).as_deref(), Some(bytes.as_slice()), "{t}");
        }
    }

    #[test]
    fn ids_name_the_backend_incarnation_and_sequences() {
        assert_eq!(events_id("s", 255, 3, 7), "s.00000000000000ff.3-7");
        assert_eq!(diff_id("s", 1, 9, 42, 0), "s.0000000000000001.9.diff-42.0");
    }
}
