//! The wire format of docs/spec.md section 5, written in this one place.
//!
//! A batch is the msgpack array `[timestamp_ms, [event, ...], dp_rank]`; an event is a map
//! with `str` keys. Integers take their smallest encoding (`rmp::encode::write_uint`); an
//! empty name, a zero block size and an empty group are nil; strings that are not UTF-8 go
//! out as `kv_events_non_utf8` says ([`NonUtf8`]): `bin` or a `str` of the raw bytes, byte
//! for byte, or not at all (the publishing thread and snapshots ask
//! [`Encoder::skips_non_utf8`]). An
//! event with such a string goes in a message of its own ([`needs_own_message`]), so that a
//! reader that decodes whole messages into string types loses that event and not the 63
//! others a batch may hold.

use crate::config::{Config, NonUtf8};
use crate::event::{Event, EventKind};

/// The most events one batch carries.
pub(crate) const MAX_BATCH_EVENTS: usize = 64;

/// The tenant an empty `tenant_id` stands for.
pub(crate) const DEFAULT_TENANT: &[u8] = b"default";

/// Whether `event` must go in a message without the events of other calls: its tenant, key
/// or group is not UTF-8, so it goes out as `bin`, and a reader that decodes a whole message
/// into string types refuses the whole message. Alone (with the other events of its call,
/// which carry the same strings), it costs such a reader that call's events and no other.
/// The publishing thread batches by it; so does anything else that writes messages.
pub(crate) fn needs_own_message(event: &Event<'_>) -> bool {
    [event.tenant, event.key, event.group]
        .into_iter()
        .any(|bytes| std::str::from_utf8(bytes).is_err())
}

/// Writes batches of events, numbering events from 1.
///
/// Everything the config fixes (key names, model, block size, salt, LoRA, backend id, dp
/// rank, the nil and empty-array fields) is encoded once, at creation, into one template per
/// event kind. Encoding an event then copies a few fixed runs of bytes and writes the seven
/// values that vary: event id, timestamp, tenant, medium, group and key.
#[derive(Debug)]
pub(crate) struct Encoder {
    templates: [Vec<Segment>; 3],
    dp_rank: u32,
    non_utf8: NonUtf8,
    next_event_id: u64,
}

/// Fixed bytes, then the value that follows them, if any.
#[derive(Debug)]
struct Segment {
    fixed: Vec<u8>,
    then: Option<Varying>,
}

#[derive(Clone, Copy, Debug)]
enum Varying {
    EventId,
    Timestamp,
    Tenant,
    Medium,
    Group,
    Key,
}

enum Value {
    Fixed(Vec<u8>),
    Varying(Varying),
}

impl Encoder {
    pub(crate) fn new(config: &Config) -> Encoder {
        let template = |kind| Self::template(config, kind);
        Encoder {
            templates: [
                template(EventKind::Stored),
                template(EventKind::Removed),
                template(EventKind::Cleared),
            ],
            dp_rank: config.dp_rank,
            // A config that passed validation names a mode.
            non_utf8: config.non_utf8.parse().unwrap_or_default(),
            next_event_id: 1,
        }
    }

    /// Whether events with a string that is not UTF-8 ([`needs_own_message`]) are left out
    /// of the stream and snapshots (`kv_events_non_utf8` is `skip`).
    pub(crate) fn skips_non_utf8(&self) -> bool {
        self.non_utf8 == NonUtf8::Skip
    }

    /// The id the next encoded event gets.
    #[cfg(test)]
    pub(crate) fn next_event_id(&self) -> u64 {
        self.next_event_id
    }

    /// Replaces `out` with one batch of `count` events, all stamped `timestamp_ms`.
    pub(crate) fn encode_batch<'a>(
        &mut self,
        timestamp_ms: u64,
        count: usize,
        events: impl IntoIterator<Item = Event<'a>>,
        out: &mut Vec<u8>,
    ) {
        // 0 only for a heartbeat.
        debug_assert!(count <= MAX_BATCH_EVENTS);
        out.clear();
        array_len(out, 3);
        uint(out, timestamp_ms);
        array_len(out, count);
        let mut written = 0;
        for event in events {
            self.encode_event(timestamp_ms, &event, out);
            written += 1;
        }
        debug_assert_eq!(written, count, "the batch header promised {count} events");
        uint(out, u64::from(self.dp_rank));
    }

    fn encode_event(&mut self, timestamp_ms: u64, event: &Event<'_>, out: &mut Vec<u8>) {
        let template = match event.kind {
            EventKind::Stored => &self.templates[0],
            EventKind::Removed => &self.templates[1],
            EventKind::Cleared => &self.templates[2],
        };
        for segment in template {
            out.extend_from_slice(&segment.fixed);
            match segment.then {
                None => {}
                Some(Varying::EventId) => uint(out, self.next_event_id),
                Some(Varying::Timestamp) => uint(out, timestamp_ms),
                Some(Varying::Tenant) if event.tenant.is_empty() => {
                    text(out, DEFAULT_TENANT, self.non_utf8)
                }
                Some(Varying::Tenant) => text(out, event.tenant, self.non_utf8),
                Some(Varying::Medium) => match event.medium {
                    Some(medium) => str(out, medium.as_str()),
                    None => nil(out),
                },
                Some(Varying::Group) if event.group.is_empty() => nil(out),
                Some(Varying::Group) => text(out, event.group, self.non_utf8),
                Some(Varying::Key) => text(out, event.key, self.non_utf8),
            }
        }
        self.next_event_id += 1;
    }

    /// The fields of one kind of event in wire order, split into segments at each value
    /// that varies.
    fn template(config: &Config, kind: EventKind) -> Vec<Segment> {
        let legacy = config.emit_legacy_compat;
        let fixed = |write: &dyn Fn(&mut Vec<u8>)| {
            let mut value = Vec::new();
            write(&mut value);
            Value::Fixed(value)
        };
        let optional_str = |s: &str| {
            let s = s.to_owned();
            fixed(&move |out| if s.is_empty() { nil(out) } else { str(out, &s) })
        };
        let empty_array = || fixed(&|out| array_len(out, 0));
        let nil_value = || fixed(&nil);

        let mut fields: Vec<(&str, Value)> = vec![
            ("event_id", Value::Varying(Varying::EventId)),
            ("timestamp", Value::Varying(Varying::Timestamp)),
            ("event_type", fixed(&|out| str(out, kind.as_str()))),
        ];
        if legacy {
            fields.push(("type", fixed(&|out| str(out, kind.legacy_name()))));
        }
        let block_size = config.block_size;
        let dp_rank = config.dp_rank;
        let backend_id = config.backend_id.clone();
        fields.extend([
            ("model_name", optional_str(&config.model_name)),
            (
                "block_size",
                fixed(&|out| match block_size {
                    0 => nil(out),
                    n => uint(out, u64::from(n)),
                }),
            ),
            ("additional_salt", optional_str(&config.additional_salt)),
            ("lora_name", optional_str(&config.lora_name)),
            ("backend_id", fixed(&|out| str(out, &backend_id))),
            ("dp_rank", fixed(&|out| uint(out, u64::from(dp_rank)))),
            ("tenant_id", Value::Varying(Varying::Tenant)),
            ("medium", Value::Varying(Varying::Medium)),
        ]);
        if kind != EventKind::Cleared {
            fields.extend([
                ("group_id", Value::Varying(Varying::Group)),
                ("object_key", Value::Varying(Varying::Key)),
                ("seq_hashes", empty_array()),
            ]);
            if legacy {
                fields.push(("block_hashes", empty_array()));
            }
            fields.push(("base_block_idx", nil_value()));
        }
        if kind == EventKind::Stored {
            fields.extend([("token_ids", nil_value()), ("parent_hash", nil_value())]);
            if legacy {
                fields.push(("parent_block_hash", nil_value()));
            }
        }

        let mut segments = Vec::new();
        let mut run = Vec::new();
        map_len(&mut run, fields.len());
        for (key, value) in fields {
            str(&mut run, key);
            match value {
                Value::Fixed(bytes) => run.extend_from_slice(&bytes),
                Value::Varying(v) => segments.push(Segment {
                    fixed: std::mem::take(&mut run),
                    then: Some(v),
                }),
            }
        }
        segments.push(Segment {
            fixed: run,
            then: None,
        });
        segments
    }
}

// Writing into a Vec<u8> cannot fail (running out of memory aborts), so the io::Result that
// rmp's writers return for any `io::Write` carries nothing and is dropped here, once.

fn uint(out: &mut Vec<u8>, value: u64) {
    let _ = rmp::encode::write_uint(out, value);
}

fn nil(out: &mut Vec<u8>) {
    let _ = rmp::encode::write_nil(out);
}

fn str(out: &mut Vec<u8>, value: &str) {
    let _ = rmp::encode::write_str(out, value);
}

fn array_len(out: &mut Vec<u8>, len: usize) {
    let _ = rmp::encode::write_array_len(out, len as u32);
}

fn map_len(out: &mut Vec<u8>, len: usize) {
    let _ = rmp::encode::write_map_len(out, len as u32);
}

/// `str` when the bytes are UTF-8; otherwise `bin`, or with [`NonUtf8::Str`] a `str` of the
/// raw bytes. Callers keep strings under 4 GiB.
fn text(out: &mut Vec<u8>, value: &[u8], non_utf8: NonUtf8) {
    match std::str::from_utf8(value) {
        Ok(s) => str(out, s),
        Err(_) if non_utf8 == NonUtf8::Str => {
            let _ = rmp::encode::write_str_len(out, value.len() as u32);
            out.extend_from_slice(value);
        }
        Err(_) => {
            let _ = rmp::encode::write_bin(out, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::Medium;
    use proptest::prelude::*;
    use rmpv::Value as V;

    fn config(legacy: bool) -> Config {
        Config {
            enable_kv_events: true,
            bind_endpoint: "inproc://unused".into(),
            backend_id: "store-a".into(),
            model_name: "llama".into(),
            emit_legacy_compat: legacy,
            ..Config::default()
        }
    }

    fn event<'a>(kind: EventKind, tenant: &'a [u8], key: &'a [u8], group: &'a [u8]) -> Event<'a> {
        let medium = (kind != EventKind::Cleared).then_some(Medium::Disk);
        Event {
            kind,
            medium,
            tenant,
            key,
            group,
        }
    }

    /// Decodes with rmpv, a reader that shares nothing with the writer above.
    fn decode(bytes: &[u8]) -> V {
        let mut cursor = bytes;
        let value = rmpv::decode::read_value(&mut cursor).expect("a batch decodes");
        assert!(cursor.is_empty(), "{} bytes after the batch", cursor.len());
        value
    }

    fn field<'v>(event: &'v V, key: &str) -> Option<&'v V> {
        event
            .as_map()
            .unwrap()
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    fn encode_one(legacy: bool, e: Event<'_>) -> V {
        let mut out = Vec::new();
        Encoder::new(&config(legacy)).encode_batch(7, 1, [e], &mut out);
        decode(&out)[1][0].clone()
    }

    #[test]
    fn map_sizes_match_the_spec() {
        for (kind, plain, legacy) in [
            (EventKind::Stored, 17, 20),
            (EventKind::Removed, 15, 17),
            (EventKind::Cleared, 11, 12),
        ] {
            let e = event(kind, b"t", b"k", b"g");
            assert_eq!(
                encode_one(false, e).as_map().unwrap().len(),
                plain,
                "{kind:?}"
            );
            assert_eq!(
                encode_one(true, e).as_map().unwrap().len(),
                legacy,
                "{kind:?} legacy"
            );
        }
    }

    #[test]
    fn empties_become_default_tenant_and_nil_fields() {
        let stored = encode_one(true, event(EventKind::Stored, b"", b"k", b""));
        assert_eq!(field(&stored, "tenant_id"), Some(&V::from("default")));
        for nil_key in [
            "group_id",
            "block_size",
            "additional_salt",
            "lora_name",
            "token_ids",
        ] {
            assert_eq!(field(&stored, nil_key), Some(&V::Nil), "{nil_key}");
        }
        assert_eq!(field(&stored, "model_name"), Some(&V::from("llama")));
        assert_eq!(field(&stored, "type"), Some(&V::from("BlockStored")));
        let cleared = encode_one(false, event(EventKind::Cleared, b"t", b"", b""));
        assert_eq!(field(&cleared, "medium"), Some(&V::Nil));
        assert_eq!(field(&cleared, "object_key"), None);
    }

    #[test]
    fn event_ids_count_from_one_across_batches() {
        let mut encoder = Encoder::new(&config(false));
        let mut out = Vec::new();
        let e = event(EventKind::Removed, b"t", b"k", b"g");
        encoder.encode_batch(1, 2, [e, e], &mut out);
        assert_eq!(decode(&out)[1][1]["event_id"], V::from(2u64));
        encoder.encode_batch(2, 1, [e], &mut out);
        assert_eq!(field(&decode(&out)[1][0], "event_id"), Some(&V::from(3u64)));
        assert_eq!(encoder.next_event_id(), 4);
    }

    #[test]
    fn integers_take_their_smallest_encoding() {
        let mut out = Vec::new();
        let e = event(EventKind::Cleared, b"t", b"", b"");
        Encoder::new(&config(false)).encode_batch(1, 1, [e], &mut out);
        // fixarray(3), positive fixint timestamp 1, fixarray(1), fixmap(11) ...
        assert_eq!(&out[..4], &[0x93, 0x01, 0x91, 0x8b]);
        // ... and the trailer dp_rank 0 as a positive fixint.
        assert_eq!(out.last(), Some(&0x00));
    }

    #[test]
    fn an_event_needs_a_message_of_its_own_when_a_string_is_not_utf8() {
        let utf8 = "caf\u{e9}".as_bytes();
        for (tenant, key, group, alone) in [
            (&b"t"[..], &b"k"[..], &b"g"[..], false),
            (b"", b"k", b"", false),
            (utf8, utf8, utf8, false),
            (b"t\xff", b"k", b"g", true),
            (b"t", b"k\xc3", b"g", true),
            (b"t", b"k", b"\xfe", true),
        ] {
            let cleared = event(EventKind::Cleared, tenant, b"", b"");
            for (e, alone) in [
                (event(EventKind::Stored, tenant, key, group), alone),
                (event(EventKind::Removed, tenant, key, group), alone),
                (cleared, std::str::from_utf8(tenant).is_err()),
            ] {
                assert_eq!(needs_own_message(&e), alone, "{e:?}");
                // Exactly the events that carry a bin value.
                let encoded = encode_one(false, e);
                let map = encoded.as_map().unwrap();
                let bins = map.iter().any(|(_, v)| matches!(v, V::Binary(_)));
                assert_eq!(bins, alone, "{e:?}");
            }
        }
    }

    proptest! {
        #[test]
        fn any_strings_survive_byte_for_byte(
            tenant in proptest::collection::vec(any::<u8>(), 0..40),
            key in proptest::collection::vec(any::<u8>(), 1..300),
            group in proptest::collection::vec(any::<u8>(), 0..40),
            timestamp in any::<u64>(),
            legacy in any::<bool>(),
            removed in any::<bool>(),
        ) {
            let kind = if removed { EventKind::Removed } else { EventKind::Stored };
            let mut out = Vec::new();
            let e = event(kind, &tenant, &key, &group);
            Encoder::new(&config(legacy)).encode_batch(timestamp, 1, [e], &mut out);
            let batch = decode(&out);
            prop_assert_eq!(batch[0].as_u64(), Some(timestamp));
            let got = &batch[1][0];
            prop_assert_eq!(field(got, "timestamp").and_then(V::as_u64), Some(timestamp));
            let raw = |v: &V| match v {
                V::String(s) => s.as_bytes().to_vec(),
                V::Binary(b) => b.clone(),
                other => panic!("not a string: {other:?}"),
            };
            let key_value = field(got, "object_key").unwrap();
            prop_assert_eq!(raw(key_value), key.clone());
            prop_assert_eq!(key_value.is_str(), std::str::from_utf8(&key).is_ok());
            let tenant_out = raw(field(got, "tenant_id").unwrap());
            prop_assert_eq!(tenant_out, if tenant.is_empty() { DEFAULT_TENANT.to_vec() } else { tenant.clone() });
            match field(got, "group_id").unwrap() {
                V::Nil => prop_assert!(group.is_empty()),
                v => prop_assert_eq!(raw(v), group.clone()),
            }
        }
    }
}
