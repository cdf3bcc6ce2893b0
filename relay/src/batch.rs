//! The log's messages: batches in the stream's own msgpack format,
//! `[timestamp_ms, [event, ...], dp_rank]`, either the master's events as they came or the
//! `removed` and `stored` events of a difference.

use mooncake_kv_events::subscriber::{Changes, Index};
use mooncake_kv_events::Medium;
use rmpv::Value;
use std::collections::BTreeSet;

/// At most this many events go into one log message: a difference of a million objects is
/// written in parts, each well under JetStream's default 1 MiB message limit.
pub(crate) const MAX_EVENTS: usize = 2048;

/// The payload of one log message.
pub(crate) fn encode(timestamp_ms: u64, events: Vec<Value>, dp_rank: u64) -> Vec<u8> {
    let batch = Value::Array(vec![
        Value::from(timestamp_ms),
        Value::Array(events),
        Value::from(dp_rank),
    ]);
    let mut bytes = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut bytes, &batch);
    bytes
}

/// The events of a log message's payload, or why it is not a batch.
pub(crate) fn decode(payload: &[u8]) -> Result<Vec<Value>, String> {
    let value = rmpv::decode::read_value(&mut &payload[..]).map_err(|e| e.to_string())?;
    match value {
        Value::Array(mut fields) if fields.len() == 3 => match fields.swap_remove(1) {
            Value::Array(events) => Ok(events),
            _ => Err("the batch's second field is not an array of events".into()),
        },
        _ => Err("not a [timestamp, events, dp_rank] batch".into()),
    }
}

/// Bytes as the wire sends them: `str` when they are UTF-8, `bin` when not.
fn wire_bytes(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::from(text),
        Err(_) => Value::Binary(bytes.to_vec()),
    }
}

/// One event of a difference, with the keys a reader of the stream needs (section 5 of the
/// spec); what the relay cannot know (model, block size, event id) is left out.
fn event(kind: &str, backend: &str, tenant: &[u8], key: &[u8], medium: Medium, now: u64) -> Value {
    Value::Map(vec![
        (Value::from("event_type"), Value::from(kind)),
        (Value::from("timestamp"), Value::from(now)),
        (Value::from("tenant_id"), wire_bytes(tenant)),
        (Value::from("backend_id"), Value::from(backend)),
        (Value::from("medium"), Value::from(medium.as_str())),
        (Value::from("group_id"), Value::Nil),
        (Value::from("object_key"), wire_bytes(key)),
    ])
}

/// The events that turn `held` into `truth`, given that they can differ only where `changes`
/// says (everywhere when it says `all`): every `removed` (a medium `held` has and `truth`
/// has not) before every `stored` (the reverse), as the master orders them. Empty when both
/// hold the same. Its cost is that of the objects compared, not of the index.
pub(crate) fn difference(
    held: &Index,
    truth: &Index,
    changes: &Changes,
    backend: &str,
    now: u64,
) -> Vec<Value> {
    let mut removed = Vec::new();
    let mut stored = Vec::new();
    let mut compare = |tenant: &[u8], key: &[u8]| {
        let (before, after) = (held.get(tenant, key), truth.get(tenant, key));
        for medium in before.minus(after).iter() {
            removed.push(event("removed", backend, tenant, key, medium, now));
        }
        for medium in after.minus(before).iter() {
            stored.push(event("stored", backend, tenant, key, medium, now));
        }
    };
    // Tenants compared whole: each object of either side, once.
    let whole: BTreeSet<&[u8]> = if changes.all {
        held.tenants().chain(truth.tenants()).collect()
    } else {
        changes.cleared.iter().map(Vec::as_slice).collect()
    };
    for &tenant in &whole {
        let theirs = truth.tenant(tenant);
        for key in held.tenant(tenant).into_iter().flat_map(|o| o.keys()) {
            compare(tenant, key);
        }
        for key in theirs.into_iter().flat_map(|o| o.keys()) {
            if held.get(tenant, key).is_empty() {
                compare(tenant, key);
            }
        }
    }
    for (tenant, keys) in &changes.objects {
        if !whole.contains(tenant.as_slice()) {
            for key in keys {
                compare(tenant, key);
            }
        }
    }
    removed.append(&mut stored);
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(objects: &[(&str, &str, &[Medium])]) -> Index {
        let mut index = Index::new();
        for (tenant, key, media) in objects {
            for medium in *media {
                index.store(tenant.as_bytes(), key.as_bytes(), *medium);
            }
        }
        index
    }

    #[test]
    fn a_difference_applied_to_what_was_held_gives_the_truth() {
        let held = index(&[
            ("t", "a", &[Medium::Cpu]),
            ("t", "b", &[Medium::Cpu, Medium::Disk]),
            ("u", "gone", &[Medium::Disk]),
        ]);
        let truth = index(&[
            ("t", "a", &[Medium::Cpu]),
            ("t", "b", &[Medium::Disk]),
            ("t", "new", &[Medium::Cpu]),
        ]);
        let events = difference(&held, &truth, &Changes::everything(), "s", 1);
        assert_eq!(events.len(), 3, "{events:?}");
        let kinds: Vec<_> = events
            .iter()
            .map(|e| mooncake_kv_events::wire::field(e, "event_type").cloned())
            .collect();
        assert_eq!(kinds[0], Some(Value::from("removed")));
        assert_eq!(kinds[2], Some(Value::from("stored")));
        let mut result = held.clone();
        for event in &events {
            result.apply(event).expect("an event the index takes");
        }
        assert_eq!(result, truth);
        assert!(difference(&truth, &truth, &Changes::everything(), "s", 1).is_empty());
    }

    /// The events as text, sorted: a difference's order within its removals and within its
    /// stores follows hash maps.
    fn sorted(events: &[Value]) -> Vec<String> {
        let mut text: Vec<String> = events.iter().map(Value::to_string).collect();
        text.sort();
        text
    }

    #[test]
    fn a_difference_compares_the_changed_objects_and_the_cleared_tenants_only() {
        use Medium::{Cpu, Disk};
        let held = index(&[
            ("t", "a", &[Cpu]),
            ("t", "same", &[Cpu]),
            ("u", "x", &[Disk]),
            ("u", "y", &[Cpu]),
        ]);
        let truth = index(&[
            ("t", "a", &[Disk]),
            ("t", "same", &[Cpu]),
            ("t", "new", &[Cpu]),
            ("u", "y", &[Cpu, Disk]),
            ("u", "z", &[Cpu]),
            ("v", "w", &[Cpu]),
        ]);
        let mut changes = Changes::default();
        for (tenant, key) in [("t", "a"), ("t", "new"), ("v", "w"), ("u", "x")] {
            let keys = changes.objects.entry(tenant.into()).or_default();
            keys.insert(key.into());
        }
        changes.objects.remove(b"u".as_slice());
        changes.cleared.insert(b"u".to_vec());
        let events = difference(&held, &truth, &changes, "s", 1);
        let full = difference(&held, &truth, &Changes::everything(), "s", 1);
        assert_eq!(sorted(&events), sorted(&full));
        assert_eq!(events.len(), 7, "{events:?}");
        let mut result = held.clone();
        for event in &events {
            result.apply(event).expect("an event the index takes");
        }
        assert_eq!(result, truth);

        // An object the changes do not name is not compared, however it differs.
        let mut only_a = Changes::default();
        only_a
            .objects
            .entry(b"t".to_vec())
            .or_default()
            .insert(b"a".to_vec());
        let events = difference(&held, &truth, &only_a, "s", 1);
        let kinds: Vec<_> = events
            .iter()
            .map(|e| mooncake_kv_events::wire::field(e, "event_type").cloned())
            .collect();
        assert_eq!(
            kinds,
            [Some(Value::from("removed")), Some(Value::from("stored"))]
        );
    }

    #[test]
    fn a_batch_decodes_to_its_events() {
        let events = vec![Value::from(1), Value::from("x")];
        let payload = encode(5, events.clone(), 0);
        assert_eq!(decode(&payload), Ok(events));
        assert!(decode(b"\x01").is_err());
    }
}
