//! The real stream decoded into typed structs with rmp-serde (`watch::Message`, `watch::Event`,
//! or a reader's own struct), on real sockets: every field agrees with what rmpv reads, keys
//! that are not UTF-8 arrive as bytes, and a call with such a key travels alone, so that a
//! reader whose structs want `String` loses exactly those calls' events.

use kv_events_testing as common;

use common::{config, raw_messages, raw_subscriber};
use mooncake_kv_events::subscriber::Continuity;
use mooncake_kv_events::wire::{decode_message, field, Bytes, Event, Message};
use mooncake_kv_events::{Config, EventKind, Medium, MediumSet, Publisher};
use rmpv::Value;
use serde::Deserialize;
use std::time::Duration;

const CPU: MediumSet = MediumSet::EMPTY.with(Medium::Cpu);
const DISK: MediumSet = MediumSet::EMPTY.with(Medium::Disk);
const BOTH: MediumSet = CPU.with(Medium::Disk);

/// A publisher on a fresh endpoint and a raw SUB socket that has joined it.
fn publisher_and_socket(config: Config) -> (Publisher, zmq::Socket) {
    let (publisher, endpoint) = common::publish(config);
    let socket = raw_subscriber(&endpoint, None);
    // ZeroMQ's slow joiner, as in common::subscribe: setup, not an assertion.
    std::thread::sleep(Duration::from_millis(300));
    (publisher, socket)
}

/// Every message sent for what was called so far, frame by frame.
fn messages(publisher: &Publisher, socket: &zmq::Socket) -> Vec<Vec<Vec<u8>>> {
    assert!(publisher.flush(Duration::from_secs(10)), "flush");
    raw_messages(socket, Duration::from_millis(500))
}

/// The bytes of a `str` or `bin` value.
fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::String(s) => Some(s.as_bytes()),
        Value::Binary(b) => Some(b),
        _ => None,
    }
}

/// Asserts that `typed` says what `value` (the same event, read by rmpv) says, field by field.
fn assert_agree(typed: &Event, value: &Value) {
    let uint = |key| field(value, key).and_then(Value::as_u64);
    let text = |key| field(value, key).and_then(Value::as_str);
    let as_bytes = |key| field(value, key).and_then(bytes).map(Bytes::from);
    assert_eq!(Some(typed.event_id), uint("event_id"));
    assert_eq!(Some(typed.timestamp), uint("timestamp"));
    assert_eq!(Some(typed.event_type.as_str()), text("event_type"));
    assert_eq!(typed.legacy_type.as_deref(), text("type"));
    assert_eq!(typed.model_name.as_deref(), text("model_name"));
    assert_eq!(typed.block_size, uint("block_size"));
    assert_eq!(typed.additional_salt.as_deref(), text("additional_salt"));
    assert_eq!(typed.lora_name.as_deref(), text("lora_name"));
    assert_eq!(Some(typed.tenant_id.clone()), as_bytes("tenant_id"));
    assert_eq!(Some(typed.backend_id.as_str()), text("backend_id"));
    assert_eq!(typed.medium.map(Medium::as_str), text("medium"));
    assert_eq!(Some(typed.dp_rank), uint("dp_rank"));
    assert_eq!(typed.group_id, as_bytes("group_id"));
    assert_eq!(typed.object_key, as_bytes("object_key"));
}

#[test]
fn real_messages_decode_into_typed_events_that_agree_with_rmpv() {
    for legacy in [true, false] {
        let (publisher, socket) = publisher_and_socket(Config {
            model_name: "llama-3-8b".into(),
            block_size: 16,
            lora_name: "adapter".into(),
            dp_rank: 3,
            emit_legacy_compat: legacy,
            // The call whose strings are not UTF-8 arrives, as `bin`.
            non_utf8: "bin".into(),
            ..config("")
        });
        publisher.on_put_commit("tenant-a", "prefix/0001", "g-7", BOTH);
        publisher.on_medium_delta("", "prefix/0002", "", CPU, DISK);
        publisher.on_put_commit(b"t\xc3".as_slice(), b"k\0\xff".as_slice(), b"\x80", CPU);
        let scan = publisher.begin_remove_all();
        publisher.on_remove_all(&scan, "tenant-b", 1, 0);
        let frames = messages(&publisher, &socket);

        let mut events = Vec::new();
        for (n, message) in frames.iter().enumerate() {
            let typed = Message::<Event>::decode(message).expect("a typed message");
            let values = decode_message(message).expect("an rmpv message");
            assert_eq!(typed.sequence, n as u64, "the first is 0");
            assert_eq!(
                (typed.timestamp_ms, typed.dp_rank, typed.events.len()),
                (values.timestamp_ms, 3, values.events.len())
            );
            for (typed, value) in typed.events.iter().zip(&values.events) {
                assert_agree(typed, value);
                assert_eq!(typed.timestamp, values.timestamp_ms);
            }
            events.extend(typed.events);
        }
        let summary: Vec<_> = events
            .iter()
            .map(|e| (e.event_id, e.event_type, e.medium, e.object_key.clone()))
            .collect();
        let key = |k: &[u8]| Some(Bytes::from(k));
        assert_eq!(
            summary,
            [
                (1, EventKind::Stored, Some(Medium::Cpu), key(b"prefix/0001")),
                (
                    2,
                    EventKind::Stored,
                    Some(Medium::Disk),
                    key(b"prefix/0001")
                ),
                (
                    3,
                    EventKind::Removed,
                    Some(Medium::Cpu),
                    key(b"prefix/0002")
                ),
                (
                    4,
                    EventKind::Stored,
                    Some(Medium::Disk),
                    key(b"prefix/0002")
                ),
                (5, EventKind::Stored, Some(Medium::Cpu), key(b"k\0\xff")),
                (6, EventKind::Cleared, None, None),
            ],
            "legacy={legacy}"
        );
        let first = &events[0];
        assert_eq!(first.tenant_id, "tenant-a");
        assert_eq!(first.group_id.as_deref(), Some(&b"g-7"[..]));
        assert_eq!(first.backend_id, "store-a");
        assert_eq!(
            (
                first.model_name.as_deref(),
                first.block_size,
                first.lora_name.as_deref()
            ),
            (Some("llama-3-8b"), Some(16), Some("adapter"))
        );
        assert_eq!(first.additional_salt, None);
        assert_eq!(
            first.legacy_type.as_deref(),
            legacy.then_some("BlockStored")
        );
        assert_eq!(events[2].tenant_id, "default", "the empty tenant");
        assert_eq!(events[2].group_id, None, "the empty group is nil");
        assert_eq!(events[4].tenant_id.as_bytes(), b"t\xc3");
        assert_eq!(events[4].group_id.as_deref(), Some(&b"\x80"[..]));
        assert_eq!(events[5].tenant_id, "tenant-b");
    }
}

#[test]
fn a_subscriber_receives_typed_batches_in_sequence() {
    let (publisher, mut subscriber) = common::connected(config(""));
    for i in 0..200 {
        publisher.on_put_commit("t", format!("key-{i}"), "g", CPU);
    }
    assert!(publisher.flush(Duration::from_secs(10)));
    let mut ids = Vec::new();
    // The sequence the next batch has: the first is 0.
    let mut next = 0;
    while ids.len() < 200 {
        let batch = subscriber
            .recv_as::<Event>(Duration::from_secs(10))
            .expect("a typed message")
            .unwrap_or_else(|| panic!("only {} of 200 events arrived", ids.len()));
        let expected = if next == 0 {
            Continuity::First { missed: 0 }
        } else {
            Continuity::Next
        };
        assert_eq!(batch.sequence, next);
        assert_eq!(batch.continuity, expected);
        next = batch.sequence + 1;
        ids.extend(batch.events.iter().map(|e| e.event_id));
        assert!(batch.events.iter().all(|e| e.tenant_id == "t"));
    }
    assert_eq!(ids, (1..=200).collect::<Vec<u64>>());
    common::assert_silent(&mut subscriber);
}

/// A reader that wants text, as many do: a message with a `bin` where it wants a `String`
/// does not decode.
#[derive(Debug, Deserialize)]
#[allow(dead_code)] // read by serde, to be refused
struct TextEvent {
    event_type: String,
    tenant_id: String,
    object_key: Option<String>,
    group_id: Option<String>,
}

/// Whether a value of the event is a `bin`.
fn has_bin(event: &Value) -> bool {
    event
        .as_map()
        .expect("a map")
        .iter()
        .any(|(_, v)| matches!(v, Value::Binary(_)))
}

#[test]
fn a_call_whose_strings_are_not_utf8_goes_alone_and_a_text_reader_loses_only_it() {
    // As `bin`: the strings a text reader refuses.
    let (publisher, socket) = publisher_and_socket(Config {
        non_utf8: "bin".into(),
        ..config("")
    });
    // The calls go in as fast as they come, so that the publishing thread batches them; the
    // calls whose tenant, key or group is not UTF-8 are the odd ones out.
    let mut calls = 0;
    let mut odd_calls = 0;
    let mut odd_events = 0;
    let mut all_events = 0;
    for i in 0..300u32 {
        let mut key = format!("key-{i}").into_bytes();
        let mut tenant = b"tenant-a".to_vec();
        let mut group = b"g".to_vec();
        let media = if i == 150 { BOTH } else { CPU };
        match i {
            _ if i % 37 == 5 => key.push(0xff),
            _ if i % 53 == 7 => tenant.push(0xc3),
            150 | 250 => group.push(0x80),
            _ => {}
        }
        let odd = [&tenant, &key, &group]
            .iter()
            .any(|s| std::str::from_utf8(s).is_err());
        publisher.on_put_commit(&tenant, &key, &group, media);
        calls += 1;
        all_events += media.len();
        if odd {
            odd_calls += 1;
            odd_events += media.len();
        }
    }
    // A RemoveAll of a tenant that is not UTF-8: its `cleared` goes alone too.
    let scan = publisher.begin_remove_all();
    publisher.on_remove_all(&scan, b"t\xfe".as_slice(), 1, 0);
    let (odd_calls, odd_events, all_events) = (odd_calls + 1, odd_events + 1, all_events + 1);
    assert_eq!((calls, odd_calls, odd_events), (300, 17, 18));

    let frames = messages(&publisher, &socket);
    let (mut refused_messages, mut refused_events, mut read_events) = (0, 0, 0);
    let mut ids = Vec::new();
    for (n, message) in frames.iter().enumerate() {
        let values = decode_message(message).expect("a message of the wire format");
        assert_eq!(values.sequence, n as u64, "from 0, no gap, no reordering");
        ids.extend(
            values
                .events
                .iter()
                .map(|e| field(e, "event_id").and_then(Value::as_u64).unwrap()),
        );
        let bins = values.events.iter().filter(|e| has_bin(e)).count();
        // Every event decodes as bytes, whatever the keys.
        let typed = Message::<Event>::decode(message).expect("Event takes str and bin");
        assert_eq!(typed.events.len(), values.events.len());
        match Message::<TextEvent>::decode(message) {
            Ok(text) => {
                assert_eq!(bins, 0, "message {}", values.sequence);
                read_events += text.events.len();
            }
            Err(e) => {
                assert!(
                    e.to_string().contains("does not decode into"),
                    "message {}: {e}",
                    values.sequence
                );
                // Alone: one call's events (two for the call that stored both media), every
                // one of them with a bin, all about the same object.
                assert_eq!(bins, values.events.len(), "message {}", values.sequence);
                assert!(bins <= 2, "message {}: {bins} events", values.sequence);
                let keys: Vec<_> = typed.events.iter().map(|e| &e.object_key).collect();
                assert!(keys.windows(2).all(|w| w[0] == w[1]), "{keys:?}");
                refused_messages += 1;
                refused_events += bins;
            }
        }
    }
    assert_eq!(ids, (1..=all_events as u64).collect::<Vec<_>>(), "in order");
    assert_eq!((refused_messages, refused_events), (odd_calls, odd_events));
    assert_eq!(read_events, all_events - odd_events);
    eprintln!(
        "{} events in {} messages; a String-typed reader refused {refused_messages} messages \
         holding {refused_events} events, read the other {read_events}",
        all_events,
        frames.len()
    );
}
