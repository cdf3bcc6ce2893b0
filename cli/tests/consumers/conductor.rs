//! Mooncake Conductor, the KV-aware indexer of Mooncake itself, as its code is at
//! <https://github.com/kvcache-ai/Mooncake>, branch `dev/conductor`, commit
//! `19ffa6e4af67f73722561732e1e5ab0c5c8ae085` (2026-08-07, "[feat] conductor: low-level SHA-256
//! backend for the vLLM v1 hash chain (#3297)"), against the real `kv-events demo`.
//!
//! Transcribed, function by function (each Rust function names the C++ one it stands for):
//!
//! - `mooncake-conductor/src/zmq/zmq_client.cpp` and `include/conductor/zmq/zmq_client.h`:
//!   the receive loop (`ZMQClient::Loop`, `Consume`, `ProcessMessage`, `HandleReconnect`,
//!   `Connect`, `RequestReplay`). One SUB socket, subscribed to everything; each message must
//!   have exactly three frames and an 8-byte sequence frame, or the loop drops the socket and
//!   reconnects after 1 s (asking the replay endpoint, if one is configured, for the messages
//!   after the last sequence, and applying none of the reply). A sequence above the last one
//!   plus one is logged as a gap and nothing else; a sequence that goes back (a publisher
//!   restart) is not even logged. A payload that fails the envelope rules is logged and dropped
//!   whole; the connection stays.
//! - `mooncake-conductor/src/zmq/msg_decoder.cpp`, `include/conductor/zmq/msg_decoder.h`,
//!   `include/conductor/zmq/event_type.h`: `DecodeMooncakeEventBatch` and the parsers under it,
//!   with msgpack-c's object types read off `rmpv` values ([`object_type`]). The envelope is
//!   checked as a whole; then each event map is decoded on its own, and a bad one is skipped
//!   while its siblings are applied in order. The vLLM decoder of the same file is left out:
//!   a service registered as `Mooncake` never calls it.
//! - `mooncake-conductor/src/kvevent/event_handler.cpp` and
//!   `include/conductor/kvevent/event_manager.h`: `KVEventHandler::HandleBatch` for a
//!   `Mooncake` service, `HandleMooncakeStored`, `HandleMooncakeRemoved`,
//!   `HandleMooncakeCleared`, `ClearMooncakeBindings`; with the part of
//!   `src/prefixindex/prefix_indexer.cpp` they call (`ValidateProfileBinding`, `StoreShared`,
//!   `RemoveShared`, `Register` for the vLLM contexts) and the Mooncake half of
//!   `EventManager::SubscribeToService` (`src/kvevent/event_manager.cpp`).
//!
//! Conductor's index of a Mooncake source is `pool_bindings_`: one record per (source endpoint,
//! `backend_id`, `tenant_id`, `object_key`, tier `cpu` or `disk`), each also entered into the
//! shared prefix table under the 64-bit value of the object's `connector_block_hash`. A
//! `stored` adds the record, a `removed` follows the record (an unknown one is a no-op), a
//! `cleared` removes every record of that backend and tenant. [`ZmqClient::index`] reads it as
//! the demo's `tenant -> key -> media`.
//!
//! Left out, as they cannot change what a test sees: the glog lines (recorded as [`Line`]s),
//! `HandleBatch`'s lifecycle checks (`BeginDispatch`, `IsStopped`, the publisher kind), the
//! instance and rank bookkeeping of the prefix table, the queries. Added, as test
//! instrumentation only: a monitor on the SUB socket (to know when it is connected, and when
//! a publisher that went away has been read to the end) and a copy of each message taken.
//!
//! What the tests find:
//!
//! - Conductor's decoder takes every event of this library when a non-UTF-8 tenant, key or
//!   group goes out as `str` (msgpack-c does not check UTF-8; the bytes become the key) or not
//!   at all (`skip`); with `bin` it refuses exactly the events holding one ("invalid
//!   object_key: expected string, got binary"), each alone, the rest of the batch applied.
//!   Heartbeats pass; a reannounced medium is an identical repeat to it.
//! - Its handler, as written, indexes none of this library's objects: a `stored` needs a
//!   `connector_block_hash` (which only Mooncake's own publisher sends, parsed out of vLLM
//!   connector keys; this library never parses keys) and a `group_id` that is nil, empty or
//!   the decimal `"0"` (the demo's groups are `group-0`, `group-1` and none). The tests
//!   assert that, and assert the demo's expected index against a what-if Conductor with
//!   exactly those two gates lifted ([`Waivers`]): everything else is its code as written.
//! - It does nothing about a restart (the sequence going back, here to 0, is not even a gap)
//!   nor about a gap (logged), and its replay request is not one this library's replay socket
//!   understands (one frame, no empty delimiter); it reads one frame of the reply and applies
//!   nothing.

use super::demo::{within, Index, Scenario};
use rmpv::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The repository and commit transcribed.
const REPOSITORY: &str = "https://github.com/kvcache-ai/Mooncake";
const COMMIT: &str = "19ffa6e4af67f73722561732e1e5ab0c5c8ae085";

// ============================================================================================
// mooncake-conductor/src/zmq/msg_decoder.cpp
// ============================================================================================

/// msgpack-c's `msgpack::type::object_type`, for the value `msgpack::unpack` would give where
/// rmpv gave `value`. Both normalize a non-negative integer to POSITIVE_INTEGER whatever its
/// encoding (int8..int64 included), and neither checks that a `str` is UTF-8.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ObjectType {
    Nil,
    Boolean,
    PositiveInteger,
    NegativeInteger,
    Float,
    Str,
    Bin,
    Array,
    Map,
    Ext,
}

fn object_type(value: &Value) -> ObjectType {
    match value {
        Value::Nil => ObjectType::Nil,
        Value::Boolean(_) => ObjectType::Boolean,
        Value::Integer(n) if n.as_u64().is_some() => ObjectType::PositiveInteger,
        Value::Integer(_) => ObjectType::NegativeInteger,
        Value::F32(_) | Value::F64(_) => ObjectType::Float,
        Value::String(_) => ObjectType::Str,
        Value::Binary(_) => ObjectType::Bin,
        Value::Array(_) => ObjectType::Array,
        Value::Map(_) => ObjectType::Map,
        Value::Ext(..) => ObjectType::Ext,
    }
}

/// `TypeName`.
fn type_name(value: &Value) -> &'static str {
    match object_type(value) {
        ObjectType::Nil => "nil",
        ObjectType::Boolean => "boolean",
        ObjectType::PositiveInteger => "positive integer",
        ObjectType::NegativeInteger => "negative integer",
        ObjectType::Float => "float",
        ObjectType::Str => "string",
        ObjectType::Bin => "binary",
        ObjectType::Array => "array",
        ObjectType::Map => "map",
        ObjectType::Ext => "extension",
    }
}

/// The bytes of a `str` (C++: `std::string(ptr, size)`: bytes, UTF-8 or not).
fn str_bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::String(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// `MapReader`: the recognized fields of an event map. Any key that is not a `str` is an
/// error; unknown keys are skipped; a recognized key twice is an error.
struct MapReader<'a> {
    fields: BTreeMap<&'a [u8], &'a Value>,
    error: String,
}

impl<'a> MapReader<'a> {
    fn new(value: &'a Value, recognized_fields: &[&str]) -> MapReader<'a> {
        let mut reader = MapReader {
            fields: BTreeMap::new(),
            error: String::new(),
        };
        let Value::Map(items) = value else {
            reader.error = format!("expected event map, got {}", type_name(value));
            return reader;
        };
        for (index, (key, val)) in items.iter().enumerate() {
            let Some(key) = str_bytes(key) else {
                reader.error = format!("event map key at index {index} must be a string");
                return reader;
            };
            if !recognized_fields.iter().any(|f| f.as_bytes() == key) {
                continue;
            }
            if reader.fields.contains_key(key) {
                reader.error =
                    format!("duplicate recognized key: {}", String::from_utf8_lossy(key));
                return reader;
            }
            reader.fields.insert(key, val);
        }
        reader
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        self.fields.get(name.as_bytes()).copied()
    }
}

/// `ValueResult<T>`: the value, or the error text.
type ValueResult<T> = Result<T, String>;

/// `ParseString`.
fn parse_string(value: &Value) -> ValueResult<Vec<u8>> {
    str_bytes(value)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| format!("expected string, got {}", type_name(value)))
}

/// `ParseNullableString`.
fn parse_nullable_string(value: &Value) -> ValueResult<Option<Vec<u8>>> {
    if object_type(value) == ObjectType::Nil {
        return Ok(None);
    }
    parse_string(value).map(Some)
}

/// `ParseUint64`.
fn parse_uint64(value: &Value) -> ValueResult<u64> {
    match value {
        Value::Integer(n) if object_type(value) == ObjectType::PositiveInteger => {
            Ok(n.as_u64().expect("positive"))
        }
        _ => Err(format!(
            "expected unsigned integer, got {}",
            type_name(value)
        )),
    }
}

/// `ParseInt64`: a negative integer, or a positive one up to `i64::MAX`.
fn parse_int64(value: &Value) -> ValueResult<i64> {
    if let Value::Integer(n) = value {
        if let Some(n) = n.as_i64() {
            return Ok(n);
        }
    }
    Err(format!(
        "expected signed 64-bit integer, got {}",
        type_name(value)
    ))
}

/// `ParseNullableInt64`.
fn parse_nullable_int64(value: &Value) -> ValueResult<Option<i64>> {
    if object_type(value) == ObjectType::Nil {
        return Ok(None);
    }
    parse_int64(value).map(Some)
}

/// `ParseNullableUint64`.
fn parse_nullable_uint64(value: &Value) -> ValueResult<Option<u64>> {
    if object_type(value) == ObjectType::Nil {
        return Ok(None);
    }
    parse_uint64(value).map(Some)
}

/// `ParseArray`.
fn parse_array<T>(value: &Value, parser: impl Fn(&Value) -> ValueResult<T>) -> ValueResult<Vec<T>> {
    let Value::Array(items) = value else {
        return Err(format!("expected array, got {}", type_name(value)));
    };
    let mut result = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        result.push(parser(item).map_err(|e| format!("element {index}: {e}"))?);
    }
    Ok(result)
}

/// `ParseUint64Array`.
fn parse_uint64_array(value: &Value) -> ValueResult<Vec<u64>> {
    parse_array(value, parse_uint64)
}

/// `ParseInt32Array`.
fn parse_int32_array(value: &Value) -> ValueResult<Vec<i32>> {
    parse_array(value, |item| {
        let n = parse_int64(item)?;
        i32::try_from(n).map_err(|_| "integer is outside int32 range".to_owned())
    })
}

/// `ParseNullableInt32Array`.
fn parse_nullable_int32_array(value: &Value) -> ValueResult<Option<Vec<i32>>> {
    if object_type(value) == ObjectType::Nil {
        return Ok(None);
    }
    parse_int32_array(value).map(Some)
}

/// `ParseRequired`: absent is "missing required key", a bad value "invalid <field>: ...".
fn parse_required<T>(
    reader: &MapReader<'_>,
    field: &str,
    parser: impl Fn(&Value) -> ValueResult<T>,
) -> ValueResult<T> {
    let value = reader
        .get(field)
        .ok_or_else(|| format!("missing required key: {field}"))?;
    parser(value).map_err(|e| format!("invalid {field}: {e}"))
}

/// `ParseOptional`: absent is `None`; present, the parser decides (nil included: an optional
/// `ParseString` field refuses nil).
fn parse_optional<T>(
    reader: &MapReader<'_>,
    field: &str,
    parser: impl Fn(&Value) -> ValueResult<T>,
) -> ValueResult<Option<T>> {
    match reader.get(field) {
        None => Ok(None),
        Some(value) => parser(value)
            .map(Some)
            .map_err(|e| format!("invalid {field}: {e}")),
    }
}

/// `ParseOptionalNullable`: absent or nil is `None`.
fn parse_optional_nullable<T>(
    reader: &MapReader<'_>,
    field: &str,
    parser: impl Fn(&Value) -> ValueResult<Option<T>>,
) -> ValueResult<Option<T>> {
    parse_optional(reader, field, parser).map(Option::flatten)
}

/// `kMooncakeFields`: the recognized keys of a Mooncake event map.
const MOONCAKE_FIELDS: &[&str] = &[
    "event_id",
    "timestamp",
    "event_type",
    "type",
    "model_name",
    "block_size",
    "additional_salt",
    "lora_name",
    "tenant_id",
    "backend_id",
    "medium",
    "dp_rank",
    "group_id",
    "object_key",
    "connector_block_hash",
    "cache_prefix",
    "tp_rank",
    "head_or_tp_rank",
    "pcp_rank",
    "dcp_rank",
    "pp_rank",
    "layer_id",
    "seq_hashes",
    "block_hashes",
    "base_block_idx",
    "parent_hash",
    "token_ids",
    "parent_block_hash",
];

/// `MooncakeEventFields` (`event_type.h`). Strings are C++ `std::string`: bytes.
#[derive(Clone, Debug, PartialEq)]
#[allow(dead_code)] // Decoded as Conductor decodes them; its handler reads only some.
struct MooncakeEventFields {
    event_id: u64,
    timestamp_milliseconds: i64,
    model_name: Option<Vec<u8>>,
    block_size: Option<i64>,
    additional_salt: Option<Vec<u8>>,
    lora_name: Option<Vec<u8>>,
    tenant_id: Vec<u8>,
    backend_id: Vec<u8>,
    medium: Option<Vec<u8>>,
    data_parallel_rank: i64,
}

/// `MooncakeObjectFields`.
#[derive(Clone, Debug, PartialEq, Default)]
#[allow(dead_code)] // Decoded as Conductor decodes them; its handler reads only some.
struct MooncakeObjectFields {
    group_id: Option<Vec<u8>>,
    object_key: Option<Vec<u8>>,
    connector_block_hash: Option<Vec<u8>>,
    cache_prefix: Option<Vec<u8>>,
    tp_rank: Option<i64>,
    head_or_tp_rank: Option<i64>,
    pcp_rank: Option<i64>,
    dcp_rank: Option<i64>,
    pp_rank: Option<i64>,
    layer_id: Option<i64>,
    seq_hashes: Vec<u64>,
    legacy_block_hashes: Option<Vec<u64>>,
    base_block_idx: Option<i64>,
}

/// `MooncakeEvent`: `MooncakeStoredEvent`, `MooncakeRemovedEvent`, `MooncakeClearedEvent`.
#[derive(Clone, Debug, PartialEq)]
#[allow(dead_code)] // parent_hash and token_ids are decoded and checked, never used.
enum MooncakeEvent {
    Stored {
        fields: MooncakeEventFields,
        object: MooncakeObjectFields,
        parent_hash: Option<u64>,
        token_ids: Option<Vec<i32>>,
    },
    Removed {
        fields: MooncakeEventFields,
        object: MooncakeObjectFields,
    },
    Cleared {
        fields: MooncakeEventFields,
    },
}

/// `MooncakeEventBatch`: each event decoded, or the error that refused it
/// (`DecodedEvent<MooncakeEvent>`).
#[derive(Debug)]
#[allow(dead_code)] // Conductor only logs the batch's timestamp and dp_rank.
struct MooncakeEventBatch {
    timestamp_milliseconds: i64,
    events: Vec<ValueResult<MooncakeEvent>>,
    data_parallel_rank: Option<i64>,
}

/// `ParseMooncakeCommon`: the keys every event has, in this order; then the event's timestamp
/// must equal the batch's, its `dp_rank` must not be negative, and a legacy `type` must name
/// the same event as `event_type`.
fn parse_mooncake_common(
    reader: &MapReader<'_>,
    batch_timestamp: i64,
    event_type: &[u8],
) -> ValueResult<MooncakeEventFields> {
    let fields = MooncakeEventFields {
        event_id: parse_required(reader, "event_id", parse_uint64)?,
        timestamp_milliseconds: parse_required(reader, "timestamp", parse_int64)?,
        model_name: parse_required(reader, "model_name", parse_nullable_string)?,
        block_size: parse_required(reader, "block_size", parse_nullable_int64)?,
        additional_salt: parse_required(reader, "additional_salt", parse_nullable_string)?,
        lora_name: parse_required(reader, "lora_name", parse_nullable_string)?,
        tenant_id: parse_required(reader, "tenant_id", parse_string)?,
        backend_id: parse_required(reader, "backend_id", parse_string)?,
        medium: parse_required(reader, "medium", parse_nullable_string)?,
        data_parallel_rank: parse_required(reader, "dp_rank", parse_int64)?,
    };
    if fields.timestamp_milliseconds != batch_timestamp {
        return Err("event timestamp conflicts with batch timestamp".into());
    }
    if fields.data_parallel_rank < 0 {
        return Err("event dp_rank must be non-negative".into());
    }
    if let Some(legacy_type) = reader.get("type") {
        let parsed = parse_string(legacy_type).map_err(|e| format!("invalid type: {e}"))?;
        let expected: &[u8] = match event_type {
            b"stored" => b"BlockStored",
            b"removed" => b"BlockRemoved",
            _ => b"AllBlocksCleared",
        };
        if parsed != expected {
            return Err("legacy type conflicts with event_type".into());
        }
    }
    Ok(fields)
}

/// `ParseMooncakeObject`: `group_id`, `seq_hashes` and `base_block_idx` required (in this
/// order), the connector fields optional, a legacy `block_hashes` equal to `seq_hashes`.
fn parse_mooncake_object(reader: &MapReader<'_>) -> ValueResult<MooncakeObjectFields> {
    let object = MooncakeObjectFields {
        group_id: parse_required(reader, "group_id", parse_nullable_string)?,
        seq_hashes: parse_required(reader, "seq_hashes", parse_uint64_array)?,
        base_block_idx: parse_required(reader, "base_block_idx", parse_nullable_int64)?,
        object_key: parse_optional(reader, "object_key", parse_string)?,
        connector_block_hash: parse_optional(reader, "connector_block_hash", parse_string)?,
        cache_prefix: parse_optional(reader, "cache_prefix", parse_string)?,
        tp_rank: parse_optional_nullable(reader, "tp_rank", parse_nullable_int64)?,
        head_or_tp_rank: parse_optional_nullable(reader, "head_or_tp_rank", parse_nullable_int64)?,
        pcp_rank: parse_optional_nullable(reader, "pcp_rank", parse_nullable_int64)?,
        dcp_rank: parse_optional_nullable(reader, "dcp_rank", parse_nullable_int64)?,
        pp_rank: parse_optional_nullable(reader, "pp_rank", parse_nullable_int64)?,
        layer_id: parse_optional_nullable(reader, "layer_id", parse_nullable_int64)?,
        legacy_block_hashes: parse_optional(reader, "block_hashes", parse_uint64_array)?,
    };
    if let Some(legacy) = &object.legacy_block_hashes {
        if *legacy != object.seq_hashes {
            return Err("legacy block_hashes conflicts with seq_hashes".into());
        }
    }
    Ok(object)
}

/// The keys a `cleared` must not have (`kObjectOnlyFields` in `ParseMooncakeEvent`).
const OBJECT_ONLY_FIELDS: &[&str] = &[
    "group_id",
    "object_key",
    "connector_block_hash",
    "cache_prefix",
    "tp_rank",
    "head_or_tp_rank",
    "pcp_rank",
    "dcp_rank",
    "pp_rank",
    "layer_id",
    "seq_hashes",
    "block_hashes",
    "base_block_idx",
    "parent_hash",
    "token_ids",
    "parent_block_hash",
];

/// `ParseMooncakeEvent`.
fn parse_mooncake_event(raw: &Value, batch_timestamp: i64) -> ValueResult<MooncakeEvent> {
    let reader = MapReader::new(raw, MOONCAKE_FIELDS);
    if !reader.error.is_empty() {
        return Err(reader.error);
    }
    let event_type = parse_required(&reader, "event_type", parse_string)?;
    if !matches!(&event_type[..], b"stored" | b"removed" | b"cleared") {
        return Err(format!(
            "unknown Mooncake event tag: {}",
            String::from_utf8_lossy(&event_type)
        ));
    }
    let fields = parse_mooncake_common(&reader, batch_timestamp, &event_type)?;
    if event_type == b"cleared" {
        for field in OBJECT_ONLY_FIELDS {
            if reader.get(field).is_some() {
                return Err(format!(
                    "cleared event contains recognized object key: {field}"
                ));
            }
        }
        return Ok(MooncakeEvent::Cleared { fields });
    }
    let object = parse_mooncake_object(&reader)?;
    if event_type == b"removed" {
        if reader.get("parent_hash").is_some()
            || reader.get("token_ids").is_some()
            || reader.get("parent_block_hash").is_some()
        {
            return Err("removed event contains recognized stored-only key".into());
        }
        return Ok(MooncakeEvent::Removed { fields, object });
    }
    let parent_hash = parse_required(&reader, "parent_hash", parse_nullable_uint64)?;
    let token_ids = parse_required(&reader, "token_ids", parse_nullable_int32_array)?;
    if let Some(legacy_parent) = reader.get("parent_block_hash") {
        let parsed = parse_nullable_uint64(legacy_parent)
            .map_err(|e| format!("invalid parent_block_hash: {e}"))?;
        if parsed != parent_hash {
            return Err("parent_block_hash conflicts with parent_hash".into());
        }
    }
    Ok(MooncakeEvent::Stored {
        fields,
        object,
        parent_hash,
        token_ids,
    })
}

/// `UnpackOne`: one msgpack value, and nothing after it.
fn unpack_one(data: &[u8]) -> ValueResult<Value> {
    if data.is_empty() {
        return Err("empty payload".into());
    }
    let mut rest = data;
    let value = rmpv::decode::read_value(&mut rest).map_err(|e| e.to_string())?;
    if !rest.is_empty() {
        return Err("trailing bytes after MessagePack value".into());
    }
    Ok(value)
}

/// `ValidateEnvelopeShape`: an array of three, whose second item is an array.
fn validate_envelope_shape(root: &Value) -> ValueResult<(&Value, &[Value], &Value)> {
    let Value::Array(items) = root else {
        return Err(format!(
            "expected three-element array envelope, got {}",
            type_name(root)
        ));
    };
    if items.len() != 3 {
        return Err(format!(
            "expected three-element array envelope, got {} elements",
            items.len()
        ));
    }
    let Value::Array(events) = &items[1] else {
        return Err(format!(
            "events must be an array, got {}",
            type_name(&items[1])
        ));
    };
    Ok((&items[0], events, &items[2]))
}

/// `ParseBatchDpRank`: nil, or an integer that is not negative.
fn parse_batch_dp_rank(value: &Value) -> ValueResult<Option<i64>> {
    let parsed = parse_nullable_int64(value)?;
    if parsed.is_some_and(|rank| rank < 0) {
        return Err("data_parallel_rank must be non-negative or nil".into());
    }
    Ok(parsed)
}

/// `DecodeMooncakeEventBatch`: `Err` refuses the whole message (the "envelope"); otherwise
/// each event is decoded on its own.
fn decode_mooncake_event_batch(data: &[u8]) -> ValueResult<MooncakeEventBatch> {
    let root = unpack_one(data).map_err(|e| format!("failed to decode Mooncake envelope: {e}"))?;
    let (timestamp, events, dp_rank) = validate_envelope_shape(&root)?;
    let timestamp = match parse_int64(timestamp) {
        Ok(timestamp) if timestamp >= 0 => timestamp,
        _ => return Err("Mooncake timestamp must be a non-negative integer".into()),
    };
    let data_parallel_rank = parse_batch_dp_rank(dp_rank)
        .map_err(|e| format!("invalid Mooncake data_parallel_rank: {e}"))?;
    let events = events
        .iter()
        .enumerate()
        .map(|(index, event)| {
            parse_mooncake_event(event, timestamp).map_err(|e| format!("event {index}: {e}"))
        })
        .collect();
    Ok(MooncakeEventBatch {
        timestamp_milliseconds: timestamp,
        events,
        data_parallel_rank,
    })
}

// ============================================================================================
// include/conductor/common/types.h, include/conductor/prefixindex/types.h,
// src/prefixindex/prefix_indexer.cpp (the part a Mooncake source reaches)
// ============================================================================================

/// `ContextKey`: what decides whether shared CPU/disk blocks serve an engine.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct ContextKey {
    tenant_id: Vec<u8>,
    model_name: Vec<u8>,
    lora_name: Vec<u8>,
    block_size: i64,
}

/// `StorageTier`, less `kGpu` (vLLM's alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum StorageTier {
    Cpu,
    Disk,
}

/// `SharedObjectOwner`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SharedObjectOwner {
    source_stream: String,
    backend_id: Vec<u8>,
    object_id: Vec<u8>,
}

/// `SharedMutation`.
struct SharedMutation {
    context: ContextKey,
    prefixes: Vec<u64>,
    tier: StorageTier,
    owner: SharedObjectOwner,
    effective_block_size: i64,
    cache_group: Option<i64>,
}

/// `BlockPresence`, less the GPU owners.
#[derive(Default, Debug)]
struct BlockPresence {
    cpu_owners: BTreeSet<SharedObjectOwner>,
    disk_owners: BTreeSet<SharedObjectOwner>,
}

/// `ContextState`. The hash profile is the resolved one (`ResolvedHashProfile`), compared as a
/// whole; here its text.
#[derive(Debug)]
struct ContextState {
    profile: String,
    blocks: HashMap<u64, BlockPresence>,
}

/// `PrefixCacheTable`: in Conductor, one per `EventManager`, shared by every subscription.
#[derive(Default, Debug)]
struct PrefixCacheTable {
    contexts: HashMap<ContextKey, ContextState>,
}

/// `ValidateContext`.
fn validate_context(context: &ContextKey) -> String {
    if context.tenant_id.is_empty() {
        return "tenant_id is required".into();
    }
    if context.model_name.is_empty() {
        return "model_name is required".into();
    }
    if context.block_size <= 0 {
        return "block_size must be positive".into();
    }
    String::new()
}

/// `ValidateSharedMutation` (`ValidateLayout`, the tier, `ValidateSharedOwner`).
fn validate_shared_mutation(m: &SharedMutation) -> String {
    let error = validate_context(&m.context);
    if !error.is_empty() {
        return error;
    }
    if m.effective_block_size <= 0 {
        return "effective_block_size must be positive".into();
    }
    if m.effective_block_size != m.context.block_size {
        return "effective_block_size must equal ContextKey block_size".into();
    }
    if m.cache_group.is_some_and(|g| g != 0) {
        return "only cache group 0 is supported".into();
    }
    // The tier is CPU or DISK by construction (`IsSharedTier`).
    if m.owner.source_stream.is_empty() {
        return "shared owner source_stream is required".into();
    }
    if m.owner.backend_id.is_empty() {
        return "shared owner backend_id is required".into();
    }
    if m.owner.object_id.is_empty() {
        return "shared owner object_id is required".into();
    }
    String::new()
}

impl PrefixCacheTable {
    /// `Register`, for a vLLM engine's context: the first registration of a context fixes its
    /// hash profile; another profile for it is refused. (Instance and rank bookkeeping, which
    /// only queries read, is left out.)
    fn register(&mut self, context: ContextKey, profile: &str) -> String {
        let error = validate_context(&context);
        if !error.is_empty() {
            return error;
        }
        let state = self
            .contexts
            .entry(context)
            .or_insert_with(|| ContextState {
                profile: profile.to_owned(),
                blocks: HashMap::new(),
            });
        if state.profile != profile {
            return "registration conflicts with the ContextKey hash profile".into();
        }
        String::new()
    }

    /// `ValidateProfileBinding` (`ValidateHashProfile` left out: the profile was resolved and
    /// checked when the service was registered).
    fn validate_profile_binding(&self, context: &ContextKey, profile: &str) -> String {
        let error = validate_context(context);
        if !error.is_empty() {
            return error;
        }
        match self.contexts.get(context) {
            None => "ContextKey is not registered".into(),
            Some(state) if state.profile != profile => {
                "hash profile conflicts with the registered ContextKey profile".into()
            }
            Some(_) => String::new(),
        }
    }

    /// `StoreShared`.
    fn store_shared(&mut self, m: &SharedMutation) -> String {
        let error = validate_shared_mutation(m);
        if !error.is_empty() {
            return error;
        }
        let Some(state) = self.contexts.get_mut(&m.context) else {
            return "ContextKey is not registered".into();
        };
        for prefix in &m.prefixes {
            let presence = state.blocks.entry(*prefix).or_default();
            shared_owners(presence, m.tier).insert(m.owner.clone());
        }
        String::new()
    }

    /// `RemoveShared`, then `EraseEmptyBlocks`.
    fn remove_shared(&mut self, m: &SharedMutation) -> String {
        let error = validate_shared_mutation(m);
        if !error.is_empty() {
            return error;
        }
        let Some(state) = self.contexts.get_mut(&m.context) else {
            return String::new();
        };
        for prefix in &m.prefixes {
            if let Some(presence) = state.blocks.get_mut(prefix) {
                shared_owners(presence, m.tier).remove(&m.owner);
            }
        }
        state
            .blocks
            .retain(|_, p| !(p.cpu_owners.is_empty() && p.disk_owners.is_empty()));
        String::new()
    }
}

/// `SharedOwners`.
fn shared_owners(
    presence: &mut BlockPresence,
    tier: StorageTier,
) -> &mut BTreeSet<SharedObjectOwner> {
    match tier {
        StorageTier::Cpu => &mut presence.cpu_owners,
        StorageTier::Disk => &mut presence.disk_owners,
    }
}

// ============================================================================================
// src/kvevent/event_handler.cpp (KVEventHandler, Mooncake half)
// ============================================================================================

/// `common::ServiceConfig` of a service registered with `type: "Mooncake"`, less its
/// `instance_id` (a name for `/services` and unregister, nothing more for a Mooncake source).
#[derive(Clone, Debug)]
struct ServiceConfig {
    endpoint: String,
    replay_endpoint: String,
    model_name: String,
    lora_name: String,
    tenant_id: String,
    block_size: i64,
    dp_rank: i64,
    cache_group: Option<i64>,
    hash_profile: String,
}

/// `KVEventHandler::PoolObjectKey`: one record per endpoint, backend, tenant, key and tier.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PoolObjectKey {
    source_endpoint: String,
    backend_id: Vec<u8>,
    tenant_id: Vec<u8>,
    object_key: Vec<u8>,
    tier: StorageTier,
}

/// `KVEventHandler::PoolObjectBinding`.
#[derive(Clone, Debug, PartialEq)]
struct PoolObjectBinding {
    context: ContextKey,
    prefix: u64,
    connector_block_hash: String,
    owner: SharedObjectOwner,
    tenant_id: Vec<u8>,
}

/// `ConnectorHash`.
struct ConnectorHash {
    prefix: u64,
    normalized_hex: String,
}

/// The two gates of `HandleMooncakeStored` / `HandleMooncakeRemoved` that no event of this
/// library can pass; lifted only for the what-if runs, never in [`AS_WRITTEN`].
#[derive(Clone, Copy, Debug)]
struct Waivers {
    /// Skip `ValidateMooncakeGroup` ("group_id must be a decimal integer or nil"; the demo's
    /// groups are `group-0` and `group-1`).
    group_id: bool,
    /// Take a missing `connector_block_hash` ("connector_block_hash is required") as the
    /// object's `seq_hashes[0]` (0 when empty, as this library always sends it).
    connector_block_hash: bool,
}

/// Conductor as written.
const AS_WRITTEN: Waivers = Waivers {
    group_id: false,
    connector_block_hash: false,
};
/// Conductor with the two gates this library cannot pass lifted.
const WHAT_IF: Waivers = Waivers {
    group_id: true,
    connector_block_hash: true,
};

/// `LowerAscii`.
fn lower_ascii(value: &[u8]) -> Vec<u8> {
    value.to_ascii_lowercase()
}

/// `SharedTier`: `cpu` or `disk`, in any case; anything else is no tier.
fn shared_tier(medium: &Option<Vec<u8>>) -> Option<StorageTier> {
    match &lower_ascii(medium.as_deref().unwrap_or_default())[..] {
        b"cpu" => Some(StorageTier::Cpu),
        b"disk" => Some(StorageTier::Disk),
        _ => None,
    }
}

/// `ValidateMooncakeGroup`: nil, empty, or `std::from_chars` reading a whole decimal `int64`
/// (an optional `-`, no `+`, no space) equal to 0.
fn validate_mooncake_group(encoded_group: &Option<Vec<u8>>) -> String {
    let Some(group) = encoded_group.as_deref().filter(|g| !g.is_empty()) else {
        return String::new();
    };
    let parsed = std::str::from_utf8(group)
        .ok()
        .filter(|text| !text.starts_with('+'))
        .and_then(|text| text.parse::<i64>().ok());
    match parsed {
        None => "group_id must be a decimal integer or nil".into(),
        Some(0) => String::new(),
        Some(_) => "only cache group zero is supported".into(),
    }
}

/// `DecodeConnectorHash`: an optional `0x`, then an even number (at least 16) of hex digits;
/// the lookup value is the last 16, big-endian.
fn decode_connector_hash(encoded: &[u8]) -> ValueResult<ConnectorHash> {
    let encoded = encoded
        .strip_prefix(b"0x")
        .or_else(|| encoded.strip_prefix(b"0X"))
        .unwrap_or(encoded);
    if encoded.len() < 16 || encoded.len() % 2 != 0 {
        return Err(
            "connector_block_hash must be even-length hex with at least eight bytes".into(),
        );
    }
    if !encoded.iter().all(u8::is_ascii_hexdigit) {
        return Err("connector_block_hash contains a non-hex character".into());
    }
    let normalized = String::from_utf8(encoded.to_ascii_lowercase()).expect("hex is ASCII");
    let prefix = u64::from_str_radix(&normalized[normalized.len() - 16..], 16).expect("hex");
    Ok(ConnectorHash {
        prefix,
        normalized_hex: normalized,
    })
}

/// `ValidateSeqHashes`: empty, or exactly the connector hash's lookup value.
fn validate_seq_hashes(seq_hashes: &[u64], prefix: u64) -> String {
    if seq_hashes.is_empty() || seq_hashes == [prefix] {
        return String::new();
    }
    "seq_hashes conflicts with connector_block_hash low64".into()
}

/// `ValidateMooncakeContext` (`MooncakeContext`): the event's tenant, model, LoRA and block
/// size.
fn validate_mooncake_context(fields: &MooncakeEventFields) -> ValueResult<ContextKey> {
    let context = ContextKey {
        tenant_id: fields.tenant_id.clone(),
        model_name: fields.model_name.clone().unwrap_or_default(),
        lora_name: fields.lora_name.clone().unwrap_or_default(),
        block_size: fields.block_size.unwrap_or(0),
    };
    let error = validate_context(&context);
    if error.is_empty() {
        Ok(context)
    } else {
        Err(error)
    }
}

/// `MessageMetadata`.
struct MessageMetadata {
    endpoint: String,
    sequence: i64,
}

/// `KVEventHandler` of one `Mooncake` service, with the prefix table it writes to.
#[derive(Debug)]
struct KvEventHandler {
    service: ServiceConfig,
    indexer: PrefixCacheTable,
    pool_bindings: BTreeMap<PoolObjectKey, PoolObjectBinding>,
    waivers: Waivers,
}

impl KvEventHandler {
    /// `HandleBatch` then `HandleMooncakeBatch`: no check of the batch's `dp_rank` for a
    /// Mooncake source; each event refused by the decoder is logged and skipped, each other
    /// one applied in order, and one the handler refuses is logged and skipped too. The batch
    /// itself always succeeds.
    fn handle_batch(
        &mut self,
        batch: &MooncakeEventBatch,
        metadata: &MessageMetadata,
        log: &mut Vec<Line>,
    ) -> String {
        if metadata.endpoint != self.service.endpoint {
            return "message endpoint conflicts with trusted registration".into();
        }
        for (index, decoded) in batch.events.iter().enumerate() {
            let event = match decoded {
                Ok(event) => event,
                Err(error) => {
                    log.push(Line::RejectedEvent {
                        sequence: metadata.sequence,
                        index,
                        stage: Stage::Decoder,
                        error: error.clone(),
                    });
                    continue;
                }
            };
            let error = match event {
                MooncakeEvent::Stored { fields, object, .. } => {
                    self.handle_mooncake_stored(fields, object, metadata, index, log)
                }
                MooncakeEvent::Removed { fields, object } => {
                    self.handle_mooncake_removed(fields, object, metadata, index, log)
                }
                MooncakeEvent::Cleared { fields } => self.handle_mooncake_cleared(fields),
            };
            if !error.is_empty() {
                log.push(Line::RejectedEvent {
                    sequence: metadata.sequence,
                    index,
                    stage: Stage::Handler,
                    error,
                });
            }
        }
        String::new()
    }

    /// `HandleMooncakeStored`.
    fn handle_mooncake_stored(
        &mut self,
        fields: &MooncakeEventFields,
        object: &MooncakeObjectFields,
        metadata: &MessageMetadata,
        index: usize,
        log: &mut Vec<Line>,
    ) -> String {
        let Some(tier) = shared_tier(&fields.medium) else {
            log.push(Line::IgnoredMedium {
                sequence: metadata.sequence,
                index,
            });
            return String::new();
        };
        if !self.waivers.group_id {
            let error = validate_mooncake_group(&object.group_id);
            if !error.is_empty() {
                return error;
            }
        }
        if fields.backend_id.is_empty() {
            return "backend_id is required".into();
        }
        let Some(object_key) = object.object_key.as_ref().filter(|k| !k.is_empty()) else {
            return "object_key is required".into();
        };
        if object.connector_block_hash.is_none() && !self.waivers.connector_block_hash {
            return "connector_block_hash is required".into();
        }
        let context = match validate_mooncake_context(fields) {
            Ok(context) => context,
            Err(error) => return error,
        };
        let error = self
            .indexer
            .validate_profile_binding(&context, &self.service.hash_profile);
        if !error.is_empty() {
            return format!("Mooncake profile binding rejected: {error}");
        }
        let hash = match &object.connector_block_hash {
            Some(encoded) => match decode_connector_hash(encoded) {
                Ok(hash) => hash,
                Err(error) => return error,
            },
            // Only under `Waivers::connector_block_hash`.
            None => ConnectorHash {
                prefix: object.seq_hashes.first().copied().unwrap_or(0),
                normalized_hex: String::new(),
            },
        };
        let error = validate_seq_hashes(&object.seq_hashes, hash.prefix);
        if !error.is_empty() {
            return error;
        }
        let owner = SharedObjectOwner {
            source_stream: self.service.endpoint.clone(),
            backend_id: fields.backend_id.clone(),
            object_id: object_key.clone(),
        };
        let key = PoolObjectKey {
            source_endpoint: self.service.endpoint.clone(),
            backend_id: fields.backend_id.clone(),
            tenant_id: fields.tenant_id.clone(),
            object_key: object_key.clone(),
            tier,
        };
        let binding = PoolObjectBinding {
            context: context.clone(),
            prefix: hash.prefix,
            connector_block_hash: hash.normalized_hex,
            owner: owner.clone(),
            tenant_id: fields.tenant_id.clone(),
        };
        let existing = self.pool_bindings.get(&key);
        if existing.is_some_and(|existing| *existing != binding) {
            return "conflicting active binding for Mooncake object/tier".into();
        }
        let mutation = SharedMutation {
            effective_block_size: context.block_size,
            context,
            prefixes: vec![hash.prefix],
            tier,
            owner,
            cache_group: None,
        };
        let error = self.indexer.store_shared(&mutation);
        if !error.is_empty() {
            return error;
        }
        self.pool_bindings.entry(key).or_insert(binding);
        String::new()
    }

    /// `HandleMooncakeRemoved`: follows the record `stored` made; an unknown one is a no-op.
    fn handle_mooncake_removed(
        &mut self,
        fields: &MooncakeEventFields,
        object: &MooncakeObjectFields,
        metadata: &MessageMetadata,
        index: usize,
        log: &mut Vec<Line>,
    ) -> String {
        let Some(tier) = shared_tier(&fields.medium) else {
            log.push(Line::IgnoredMedium {
                sequence: metadata.sequence,
                index,
            });
            return String::new();
        };
        if !self.waivers.group_id {
            let error = validate_mooncake_group(&object.group_id);
            if !error.is_empty() {
                return error;
            }
        }
        if fields.backend_id.is_empty() {
            return "backend_id is required".into();
        }
        let Some(object_key) = object.object_key.as_ref().filter(|k| !k.is_empty()) else {
            return "object_key is required".into();
        };
        let key = PoolObjectKey {
            source_endpoint: self.service.endpoint.clone(),
            backend_id: fields.backend_id.clone(),
            tenant_id: fields.tenant_id.clone(),
            object_key: object_key.clone(),
            tier,
        };
        let Some(binding) = self.pool_bindings.get(&key) else {
            return String::new();
        };
        if fields.tenant_id != binding.tenant_id {
            return "tenant_id conflicts with stored object binding".into();
        }
        if fields
            .model_name
            .as_ref()
            .is_some_and(|m| *m != binding.context.model_name)
        {
            return "model_name conflicts with stored object binding".into();
        }
        if *fields.lora_name.as_deref().unwrap_or_default() != binding.context.lora_name[..] {
            return "lora_name conflicts with stored object binding".into();
        }
        if fields
            .block_size
            .is_some_and(|b| b != binding.context.block_size)
        {
            return "block_size conflicts with stored object binding".into();
        }
        if let Some(encoded) = &object.connector_block_hash {
            let asserted = match decode_connector_hash(encoded) {
                Ok(hash) => hash,
                Err(error) => return error,
            };
            if asserted.normalized_hex != binding.connector_block_hash
                || asserted.prefix != binding.prefix
            {
                return "connector_block_hash conflicts with stored object binding".into();
            }
        }
        if !object.seq_hashes.is_empty() && object.seq_hashes != [binding.prefix] {
            return "seq_hashes conflicts with stored object binding".into();
        }
        let mutation = SharedMutation {
            context: binding.context.clone(),
            prefixes: vec![binding.prefix],
            tier,
            owner: binding.owner.clone(),
            effective_block_size: binding.context.block_size,
            cache_group: None,
        };
        let error = self.indexer.remove_shared(&mutation);
        if !error.is_empty() {
            return error;
        }
        self.pool_bindings.remove(&key);
        String::new()
    }

    /// `HandleMooncakeCleared`.
    fn handle_mooncake_cleared(&mut self, fields: &MooncakeEventFields) -> String {
        if fields.backend_id.is_empty() {
            return "backend_id is required".into();
        }
        if fields.tenant_id.is_empty() {
            return "tenant_id is required".into();
        }
        self.clear_mooncake_bindings(Some(&fields.backend_id), Some(&fields.tenant_id))
    }

    /// `ClearMooncakeBindings`: every record of that backend and tenant, both tiers; stops at
    /// the first error.
    fn clear_mooncake_bindings(
        &mut self,
        backend_id: Option<&[u8]>,
        tenant_id: Option<&[u8]>,
    ) -> String {
        let keys: Vec<PoolObjectKey> = self.pool_bindings.keys().cloned().collect();
        for key in keys {
            let binding = &self.pool_bindings[&key];
            if backend_id.is_some_and(|b| key.backend_id != b)
                || tenant_id.is_some_and(|t| binding.tenant_id != t)
            {
                continue;
            }
            let mutation = SharedMutation {
                context: binding.context.clone(),
                prefixes: vec![binding.prefix],
                tier: key.tier,
                owner: binding.owner.clone(),
                effective_block_size: binding.context.block_size,
                cache_group: None,
            };
            let error = self.indexer.remove_shared(&mutation);
            if !error.is_empty() {
                return error;
            }
            self.pool_bindings.remove(&key);
        }
        String::new()
    }
}

// ============================================================================================
// src/kvevent/event_manager.cpp: SubscribeToService, for a Mooncake service
// ============================================================================================

/// `ValidateServiceConfig` for a Mooncake service, then the profile binding
/// `SubscribeToService` checks (a context not registered yet is accepted).
fn subscribe_to_service(service: &ServiceConfig, indexer: &PrefixCacheTable) -> String {
    if service.endpoint.is_empty() {
        return "endpoint is required".into();
    }
    if service.model_name.is_empty() {
        return "modelname is required".into();
    }
    if service.tenant_id.is_empty() {
        return "tenant_id must not be empty after normalization".into();
    }
    if service.block_size <= 0 {
        return "block_size must be greater than zero".into();
    }
    if service.dp_rank < 0 {
        return "dp_rank must be non-negative".into();
    }
    if service.cache_group.is_some_and(|g| g != 0) {
        return "only cache group zero is supported".into();
    }
    let context = ContextKey {
        tenant_id: service.tenant_id.clone().into_bytes(),
        model_name: service.model_name.clone().into_bytes(),
        lora_name: service.lora_name.clone().into_bytes(),
        block_size: service.block_size,
    };
    let error = indexer.validate_profile_binding(&context, &service.hash_profile);
    if !error.is_empty() && error != "ContextKey is not registered" {
        return format!("failed to bind shared-cache profile: {error}");
    }
    String::new()
}

// ============================================================================================
// src/zmq/zmq_client.cpp
// ============================================================================================

/// What Conductor logs (glog), as the tests read it.
#[derive(Clone, Debug, PartialEq)]
enum Line {
    /// "Event gap detected ... missed=".
    Gap {
        missed: i64,
        last: i64,
        current: i64,
    },
    /// "Rejected KV event envelope": the whole message dropped.
    RejectedEnvelope { sequence: i64, error: String },
    /// "Rejected Mooncake event": one event skipped, by the decoder or the handler.
    RejectedEvent {
        sequence: i64,
        index: usize,
        stage: Stage,
        error: String,
    },
    /// "Ignoring Mooncake unsupported-medium event".
    IgnoredMedium { sequence: i64, index: usize },
    /// "Handler error".
    HandlerError { sequence: i64, error: String },
    /// "Consumption error": the loop drops its sockets and reconnects.
    ConsumptionError(String),
    /// "Reconnect failed".
    ReconnectFailed(String),
    /// "Replay requested ... resp_len=".
    ReplayRequested { from: i64, response_len: usize },
    /// "Failed to request replay after reconnect".
    ReplayFailed(String),
}

/// Where an event was refused: both log "Rejected Mooncake event".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    Decoder,
    Handler,
}

/// A message `ProcessMessage` took (three frames, an 8-byte sequence): test instrumentation,
/// so that the tests can tell which events the stream carried.
#[derive(Clone, Debug)]
struct Received {
    sequence: i64,
    payload: Vec<u8>,
}

/// What the loop thread shares with the test: Conductor's log, the messages it took, and the
/// SUB socket's monitor events (instrumentation: Conductor has no monitor).
#[derive(Default, Debug)]
struct Observed {
    log: Vec<Line>,
    messages: Vec<Received>,
    handshakes: usize,
    disconnects: usize,
    /// The disconnects after which the SUB socket was found empty: everything the publisher
    /// sent before it went away has been processed.
    drained: usize,
    /// `Connect` calls that made sockets: 1 unless the loop reconnected.
    connects: usize,
}

type Shared = Arc<Mutex<Observed>>;

fn lock(shared: &Shared) -> MutexGuard<'_, Observed> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `ZMQClientConfig`, with the values `SubscribeToService` gives it.
#[derive(Clone, Debug)]
struct ZmqClientConfig {
    endpoint: String,
    replay_endpoint: String,
    poll_timeout: Duration,
    replay_timeout: Duration,
    reconnect_delay: Duration,
}

/// `ZMQClient`, with its `KVEventHandler`.
struct ZmqClient {
    config: ZmqClientConfig,
    handler: KvEventHandler,
    context: zmq::Context,
    sub_socket: Option<zmq::Socket>,
    replay_socket: Option<zmq::Socket>,
    connected: bool,
    last_seq: i64,
    shared: Shared,
    /// Instrumentation: the PAIR end of the SUB socket's monitor.
    monitor: Option<zmq::Socket>,
}

/// Distinct inproc names for the monitors of every client of the test binary.
static MONITORS: AtomicUsize = AtomicUsize::new(0);

fn big_endian_to_u64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0, |v, b| (v << 8) | u64::from(*b))
}

impl ZmqClient {
    fn new(config: ZmqClientConfig, handler: KvEventHandler, shared: Shared) -> ZmqClient {
        ZmqClient {
            config,
            handler,
            context: zmq::Context::new(),
            sub_socket: None,
            replay_socket: None,
            connected: false,
            last_seq: -1,
            shared,
            monitor: None,
        }
    }

    /// `Start` then `Loop`, until `stop`.
    fn run(&mut self, stop: &AtomicBool) {
        if let Err(error) = self.connect() {
            panic!("initial connection failed: {error}");
        }
        while !stop.load(Ordering::SeqCst) {
            if !self.connected {
                self.handle_reconnect(stop);
                continue;
            }
            if let Err(error) = self.consume() {
                lock(&self.shared).log.push(Line::ConsumptionError(error));
                self.connected = false; // MarkDisconnected
            }
        }
        self.cleanup_sockets();
    }

    /// `HandleReconnect`: after `reconnect_delay`, new sockets; with a replay endpoint and a
    /// known sequence, one request for what followed it.
    fn handle_reconnect(&mut self, stop: &AtomicBool) {
        let deadline = Instant::now() + self.config.reconnect_delay;
        while Instant::now() < deadline {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        if let Err(error) = self.connect() {
            lock(&self.shared).log.push(Line::ReconnectFailed(error));
            return;
        }
        if self.last_seq >= 0 && !self.config.replay_endpoint.is_empty() {
            if let Err(error) = self.request_replay(self.last_seq.wrapping_add(1)) {
                lock(&self.shared).log.push(Line::ReplayFailed(error));
            }
        }
    }

    /// `Connect`: a SUB socket subscribed to every topic, and a DEALER to the replay endpoint
    /// when there is one.
    fn connect(&mut self) -> Result<(), String> {
        if self.connected {
            return Ok(());
        }
        self.cleanup_sockets();
        let endpoint = self.config.endpoint.clone();
        let fail = |e: zmq::Error| format!("failed to connect to {endpoint}: {e}");
        let sock = self.context.socket(zmq::SUB).map_err(fail)?;
        self.attach_monitor(&sock);
        sock.set_ipv6(true).map_err(fail)?;
        sock.connect(&endpoint).map_err(fail)?;
        sock.set_subscribe(b"").map_err(fail)?;
        self.sub_socket = Some(sock);
        if !self.config.replay_endpoint.is_empty() {
            let replay = self.context.socket(zmq::DEALER).map_err(fail)?;
            replay.set_ipv6(true).map_err(fail)?;
            replay.connect(&self.config.replay_endpoint).map_err(fail)?;
            self.replay_socket = Some(replay);
        }
        self.connected = true;
        lock(&self.shared).connects += 1;
        Ok(())
    }

    /// `Consume`: waits up to `poll_timeout` for a message, and processes it.
    fn consume(&mut self) -> Result<(), String> {
        self.read_monitor();
        let disconnects = lock(&self.shared).disconnects;
        let socket = self.sub_socket.as_ref().ok_or("socket is nil")?;
        let mut items = [socket.as_poll_item(zmq::POLLIN)];
        let timeout = self.config.poll_timeout.as_millis() as i64;
        let rc = zmq::poll(&mut items, timeout).map_err(|e| format!("poll error: {e}"))?;
        if rc == 0 || !items[0].is_readable() {
            lock(&self.shared).drained = disconnects;
            return Ok(());
        }
        self.process_message()
            .map_err(|e| format!("failed to process message: {e}"))
    }

    /// `ProcessMessage`.
    fn process_message(&mut self) -> Result<(), String> {
        let socket = self.sub_socket.as_ref().ok_or("socket is nil")?;
        let frames = socket
            .recv_multipart(0)
            .map_err(|e| format!("recv error: {e}"))?;
        if frames.len() != 3 {
            return Err(format!(
                "invalid multipart frame count: expected 3, got {}",
                frames.len()
            ));
        }
        if frames[1].len() != 8 {
            return Err("invalid sequence length".into());
        }
        let seq = big_endian_to_u64(&frames[1]) as i64;
        let mut log = Vec::new();
        let last_seq = self.last_seq;
        if last_seq != -1 && seq > last_seq.wrapping_add(1) {
            log.push(Line::Gap {
                missed: seq - last_seq - 1,
                last: last_seq,
                current: seq,
            });
        }
        self.last_seq = seq;
        let metadata = MessageMetadata {
            endpoint: self.config.endpoint.clone(),
            sequence: seq,
        };
        match decode_mooncake_event_batch(&frames[2]) {
            Err(error) => log.push(Line::RejectedEnvelope {
                sequence: seq,
                error,
            }),
            Ok(batch) => {
                let error = self.handler.handle_batch(&batch, &metadata, &mut log);
                if !error.is_empty() {
                    log.push(Line::HandlerError {
                        sequence: seq,
                        error,
                    });
                }
            }
        }
        let mut shared = lock(&self.shared);
        shared.log.append(&mut log);
        shared.messages.push(Received {
            sequence: seq,
            payload: frames[2].clone(),
        });
        Ok(())
    }

    /// `RequestReplay`: one 8-byte frame to the DEALER, one frame read back, and nothing
    /// applied: the replayed messages, if any, are left unread on the DEALER socket.
    fn request_replay(&mut self, from_seq: i64) -> Result<(), String> {
        let socket = self.replay_socket.as_ref().ok_or("replay socket is nil")?;
        socket
            .send(&(from_seq as u64).to_be_bytes()[..], 0)
            .map_err(|e| format!("failed to send replay request: {e}"))?;
        socket
            .set_rcvtimeo(self.config.replay_timeout.as_millis() as i32)
            .map_err(|e| format!("failed to send replay request: {e}"))?;
        let response = socket.recv_bytes(0).map_err(|_| {
            "failed to receive replay response: resource temporarily unavailable".to_owned()
        })?;
        lock(&self.shared).log.push(Line::ReplayRequested {
            from: from_seq,
            response_len: response.len(),
        });
        Ok(())
    }

    /// `CleanupSocketsLocked`.
    fn cleanup_sockets(&mut self) {
        self.sub_socket = None;
        self.replay_socket = None;
        self.monitor = None;
        self.connected = false;
    }

    /// Instrumentation: monitors `sock`'s connections.
    fn attach_monitor(&mut self, sock: &zmq::Socket) {
        let name = format!(
            "inproc://conductor-monitor-{}",
            MONITORS.fetch_add(1, Ordering::SeqCst)
        );
        let events =
            zmq::SocketEvent::HANDSHAKE_SUCCEEDED as i32 | zmq::SocketEvent::DISCONNECTED as i32;
        sock.monitor(&name, events).expect("monitor");
        let pair = self.context.socket(zmq::PAIR).expect("PAIR");
        pair.connect(&name).expect("monitor connects");
        self.monitor = Some(pair);
    }

    /// Instrumentation: counts the monitor's events so far.
    fn read_monitor(&mut self) {
        let Some(monitor) = &self.monitor else { return };
        while let Ok(frames) = monitor.recv_multipart(zmq::DONTWAIT) {
            let event =
                zmq::SocketEvent::from_raw(u16::from_le_bytes([frames[0][0], frames[0][1]]));
            let mut shared = lock(&self.shared);
            match event {
                zmq::SocketEvent::HANDSHAKE_SUCCEEDED => shared.handshakes += 1,
                zmq::SocketEvent::DISCONNECTED => shared.disconnects += 1,
                _ => {}
            }
        }
    }

    /// Conductor's records of this source as the demo's index: tenant -> key -> media.
    fn index(&self) -> Index {
        let mut index = Index::new();
        for key in self.handler.pool_bindings.keys() {
            assert_eq!(key.backend_id, b"demo-store", "the demo's one backend");
            let medium = match key.tier {
                StorageTier::Cpu => "cpu",
                StorageTier::Disk => "disk",
            };
            index
                .entry(key.tenant_id.clone())
                .or_default()
                .entry(key.object_key.clone())
                .or_default()
                .push(medium.to_owned());
        }
        index
    }
}

// ============================================================================================
// Running it against the demo
// ============================================================================================

/// The demo's model, block size and tenants (`cli/src/demo.rs`, `cli/src/master.rs`).
const MODEL: &str = "demo-model";
const BLOCK_SIZE: i64 = 16;
const TENANTS: [&str; 3] = ["default", "tenant-a", "tenant-b"];
/// The resolved hash profile every registration shares (its text stands for it).
const PROFILE: &str = "vllm_v1/sha256_cbor/python_hash_seed=0/low64_be";

/// How long a Conductor may take to see the publisher, or to read what it sent.
const AWAIT: Duration = Duration::from_secs(20);

/// A `ZMQClient` for the demo's stream as `SubscribeToService` makes it, with its handler,
/// after the vLLM engines of the demo's contexts were registered.
fn subscribed(
    endpoint: &str,
    replay_endpoint: &str,
    waivers: Waivers,
    shared: &Shared,
) -> ZmqClient {
    let service = ServiceConfig {
        endpoint: endpoint.into(),
        replay_endpoint: replay_endpoint.into(),
        model_name: MODEL.into(),
        lora_name: String::new(),
        tenant_id: "default".into(),
        block_size: BLOCK_SIZE,
        dp_rank: 0,
        cache_group: None,
        hash_profile: PROFILE.into(),
    };
    let mut indexer = PrefixCacheTable::default();
    for tenant in TENANTS {
        let context = ContextKey {
            tenant_id: tenant.into(),
            model_name: MODEL.into(),
            lora_name: Vec::new(),
            block_size: BLOCK_SIZE,
        };
        assert_eq!(indexer.register(context, PROFILE), "");
    }
    assert_eq!(subscribe_to_service(&service, &indexer), "");
    let config = ZmqClientConfig {
        endpoint: service.endpoint.clone(),
        replay_endpoint: service.replay_endpoint.clone(),
        poll_timeout: Duration::from_millis(100),
        replay_timeout: Duration::from_secs(5),
        reconnect_delay: Duration::from_secs(1),
    };
    let handler = KvEventHandler {
        service,
        indexer,
        pool_bindings: BTreeMap::new(),
        waivers,
    };
    ZmqClient::new(config, handler, Arc::clone(shared))
}

/// A Conductor subscribed to a scenario's stream, its loop on a thread of its own. The
/// deployment is the one Mooncake's subscriber guide sets up (`docs/source/design/kv-event/
/// subscriber-guide.md`, "Check Mooncake-to-Conductor setup"): a vLLM engine registered for
/// each tenant's context with the same hash profile, then the Mooncake master as a `Mooncake`
/// service with no replay endpoint.
struct Conductor {
    shared: Shared,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<ZmqClient>>,
}

impl Conductor {
    fn start(scenario: &Scenario, waivers: Waivers) -> Conductor {
        let shared = Shared::default();
        let stop = Arc::new(AtomicBool::new(false));
        let mut client = subscribed(&scenario.stream, "", waivers, &shared);
        let thread = {
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                client.run(&stop);
                client
            })
        };
        Conductor {
            shared,
            stop,
            thread: Some(thread),
        }
    }

    /// Waits until the SUB socket has completed `n` handshakes: it is connected to the `n`-th
    /// publisher, before the demo's `--wait` ends and its workload starts.
    fn await_handshakes(&self, n: usize) {
        assert!(
            within(AWAIT, || lock(&self.shared).handshakes >= n),
            "Conductor did not reach publisher {n}"
        );
    }

    /// Waits until the `n`-th publisher has gone and Conductor has processed all it sent.
    fn await_drained(&self, n: usize) {
        assert!(
            within(AWAIT, || lock(&self.shared).drained >= n),
            "Conductor did not read to the end of publisher {n}: {:?}",
            lock(&self.shared).log.last()
        );
    }

    /// Stops the loop; returns the client, its handler and what it logged.
    fn stop(mut self) -> (ZmqClient, Observed) {
        self.stop.store(true, Ordering::SeqCst);
        let client = self
            .thread
            .take()
            .expect("running")
            .join()
            .expect("the loop did not panic");
        let observed = std::mem::take(&mut *lock(&self.shared));
        (client, observed)
    }
}

impl Drop for Conductor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One event of the stream as it went on the wire, read with rmpv alone (whatever Conductor
/// made of it).
#[derive(Debug)]
struct WireEvent {
    sequence: i64,
    index: usize,
    event_id: u64,
    event_type: String,
    /// `tenant_id`, `group_id`, `object_key`: the raw values.
    tenant: Value,
    group: Option<Value>,
    key: Option<Value>,
    medium: Option<String>,
}

fn wire_events(messages: &[Received]) -> Vec<WireEvent> {
    let mut out = Vec::new();
    for message in messages {
        let root = unpack_one(&message.payload).expect("msgpack");
        let Value::Array(events) = &root[1] else {
            panic!("events array")
        };
        for (index, event) in events.iter().enumerate() {
            let get = |name: &str| {
                event
                    .as_map()
                    .expect("map")
                    .iter()
                    .find(|(k, _)| k.as_str() == Some(name))
                    .map(|(_, v)| v.clone())
            };
            out.push(WireEvent {
                sequence: message.sequence,
                index,
                event_id: get("event_id").and_then(|v| v.as_u64()).expect("event_id"),
                event_type: get("event_type")
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .expect("event_type"),
                tenant: get("tenant_id").expect("tenant_id"),
                group: get("group_id"),
                key: get("object_key"),
                medium: get("medium").and_then(|v| v.as_str().map(str::to_owned)),
            });
        }
    }
    out
}

/// A `bin` (not rmpv's `Value::is_bin`, which is true of a `str` too).
fn is_bin(value: &Value) -> bool {
    object_type(value) == ObjectType::Bin
}

/// A `str` whose bytes are not UTF-8.
fn raw_str(value: &Value) -> bool {
    matches!(value, Value::String(s) if s.as_str().is_none())
}

/// Conductor's refusals, by (sequence, event index), and the stage that refused.
fn rejections(observed: &Observed) -> BTreeMap<(i64, usize), (Stage, String)> {
    let mut out = BTreeMap::new();
    for line in &observed.log {
        if let Line::RejectedEvent {
            sequence,
            index,
            stage,
            error,
        } = line
        {
            assert!(
                out.insert((*sequence, *index), (*stage, error.clone()))
                    .is_none(),
                "refused twice"
            );
        }
    }
    out
}

/// The log lines that say something went wrong with the stream itself.
fn stream_trouble(observed: &Observed) -> Vec<&Line> {
    observed
        .log
        .iter()
        .filter(|line| {
            !matches!(
                line,
                Line::RejectedEvent { .. } | Line::IgnoredMedium { .. }
            )
        })
        .collect()
}

/// Asserts that Conductor read one publisher's stream whole, from its first message: no
/// message refused, no gap, no reconnect, sequences `first, first + 1, ...`, event ids
/// `1, 2, ...`. Returns its events.
fn read_whole(observed: &Observed, messages: &[Received], first_sequence: i64) -> Vec<WireEvent> {
    assert_eq!(stream_trouble(observed), Vec::<&Line>::new());
    assert_eq!(observed.connects, 1, "Conductor never reconnected");
    let sequences: Vec<i64> = messages.iter().map(|m| m.sequence).collect();
    let expected: Vec<i64> = (first_sequence..).take(sequences.len()).collect();
    assert_eq!(sequences, expected, "every message, from the first");
    let events = wire_events(messages);
    let ids: Vec<u64> = events.iter().map(|e| e.event_id).collect();
    assert_eq!(
        ids,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "every event"
    );
    events
}

/// What Conductor as written makes of the events of this library that its decoder takes:
/// each `stored` refused (a group that is not nil or "0", else the missing connector hash),
/// each `removed` of such a group refused; a `removed` of no group finds no record (no-op).
fn refused_as_written(
    events: &[WireEvent],
    skip: &BTreeSet<(i64, usize)>,
) -> BTreeMap<(i64, usize), (Stage, String)> {
    let group_error = "group_id must be a decimal integer or nil";
    let mut out = BTreeMap::new();
    for e in events {
        let at = (e.sequence, e.index);
        if skip.contains(&at) {
            continue;
        }
        let grouped = e
            .group
            .as_ref()
            .is_some_and(|g| !g.is_nil() && g.as_str() != Some("0"));
        let error = match (e.event_type.as_str(), grouped) {
            ("stored", true) | ("removed", true) => group_error,
            ("stored", false) => "connector_block_hash is required",
            _ => continue,
        };
        out.insert(at, (Stage::Handler, error.to_owned()));
    }
    out
}

/// Runs one demo with `args` under both Conductors, as written and what-if; returns what
/// each ended with and saw, and the demo's expected index.
fn one_demo(name: &str, args: &[&str]) -> (Index, [(ZmqClient, Observed); 2]) {
    let mut scenario = Scenario::new(name);
    let as_written = Conductor::start(&scenario, AS_WRITTEN);
    let what_if = Conductor::start(&scenario, WHAT_IF);
    let mut all = vec!["--objects", "200", "--wait", "2"];
    all.extend_from_slice(args);
    let demo = scenario.demo(&all);
    as_written.await_handshakes(1);
    what_if.await_handshakes(1);
    let expected = demo.finish();
    as_written.await_drained(1);
    what_if.await_drained(1);
    (expected, [as_written.stop(), what_if.stop()])
}

/// `--non-utf8 str` and `skip` (with `extra` arguments): the decoder takes every event; as
/// written, Conductor refuses every `stored` and indexes nothing; with the two gates lifted it
/// ends with the demo's index.
fn str_or_skip(name: &str, mode: &str, extra: &[&str]) -> Vec<WireEvent> {
    let args = [&["--non-utf8", mode][..], extra].concat();
    let (expected, [(conductor, seen), (what_if, what_if_seen)]) = one_demo(name, &args);
    let events = read_whole(&seen, &seen.messages, 0);
    read_whole(&what_if_seen, &what_if_seen.messages, 0);

    // As written: no event refused by the decoder; every stored refused by the handler.
    let refused = rejections(&seen);
    assert_eq!(refused, refused_as_written(&events, &BTreeSet::new()));
    let stored = events.iter().filter(|e| e.event_type == "stored").count();
    assert!(stored > 0 && refused.len() >= stored);
    assert_eq!(
        conductor.index(),
        Index::new(),
        "Conductor as written indexes nothing"
    );
    assert!(!expected.is_empty());

    // What if: nothing refused, and the demo's index.
    assert_eq!(rejections(&what_if_seen), BTreeMap::new());
    assert_eq!(what_if.index(), expected);
    println!(
        "{REPOSITORY}@{COMMIT} --non-utf8 {mode} {extra:?}: {} messages, {} events ({stored} stored), \
         {} refused by the handler as written, {} objects expected",
        seen.messages.len(),
        events.len(),
        refused.len(),
        expected.values().map(BTreeMap::len).sum::<usize>()
    );
    events
}

#[test]
fn non_utf8_str_is_decoded_whole_but_not_indexed() {
    let events = str_or_skip("conductor-str", "str", &[]);
    // The non-UTF-8 keys went out as str, and the decoder took them as their bytes.
    let raw = events
        .iter()
        .filter(|e| e.key.as_ref().is_some_and(raw_str))
        .count();
    assert!(
        raw > 0,
        "the demo's non-UTF-8 keys are on the stream as str"
    );
}

#[test]
fn non_utf8_skip_is_decoded_whole_but_not_indexed() {
    let events = str_or_skip("conductor-skip", "skip", &[]);
    for e in &events {
        let strings = [Some(&e.tenant), e.group.as_ref(), e.key.as_ref()];
        for value in strings.into_iter().flatten() {
            assert!(
                !raw_str(value) && !is_bin(value),
                "nothing that is not UTF-8 goes out: {e:?}"
            );
        }
    }
}

/// `--reannounce-remaining` adds a `stored` of each medium an object keeps after a
/// `removed`: to Conductor's per-tier records an identical repeat, which changes nothing.
#[test]
fn reannounced_media_change_nothing() {
    let events = str_or_skip("conductor-reannounce", "skip", &["--reannounce-remaining"]);
    // A stored of a medium the object already holds, as the stream tells: a reannouncement
    // (the workload commits no object twice without erasing it first).
    let mut held = BTreeSet::new();
    let mut reannounced = 0;
    for e in &events {
        let at = (
            format!("{:?}", e.tenant),
            format!("{:?}", e.key),
            e.medium.clone(),
        );
        match e.event_type.as_str() {
            "stored" => reannounced += usize::from(!held.insert(at)),
            "removed" => {
                held.remove(&at);
            }
            _ => held.retain(|(tenant, _, _)| *tenant != at.0),
        }
    }
    assert!(reannounced > 0, "the demo reannounced a medium");
}

#[test]
fn non_utf8_bin_events_are_refused_one_by_one() {
    let (expected, [(conductor, seen), (what_if, what_if_seen)]) =
        one_demo("conductor-bin", &["--non-utf8", "bin"]);
    let events = read_whole(&seen, &seen.messages, 0);

    // The decoder refuses exactly the events with a bin among tenant, group and key (in the
    // order it reads them), each alone; it takes every other event of their messages.
    let mut by_decoder = BTreeMap::new();
    for e in &events {
        let fields = [
            ("tenant_id", Some(&e.tenant)),
            ("group_id", e.group.as_ref()),
            ("object_key", e.key.as_ref()),
        ];
        if let Some((name, _)) = fields.iter().find(|(_, v)| v.is_some_and(is_bin)) {
            let error = format!(
                "event {}: invalid {name}: expected string, got binary",
                e.index
            );
            by_decoder.insert((e.sequence, e.index), (Stage::Decoder, error));
        }
    }
    assert!(
        !by_decoder.is_empty(),
        "the demo's non-UTF-8 keys are on the stream as bin"
    );
    let decoder_refused: BTreeMap<_, _> = rejections(&seen)
        .into_iter()
        .filter(|(_, (stage, _))| *stage == Stage::Decoder)
        .collect();
    assert_eq!(decoder_refused, by_decoder);
    let skip: BTreeSet<_> = by_decoder.keys().copied().collect();
    let mut all_refused = refused_as_written(&events, &skip);
    all_refused.extend(by_decoder.clone());
    assert_eq!(rejections(&seen), all_refused);
    assert_eq!(conductor.index(), Index::new());

    // What if: the bin-key events alone refused, by the decoder, and the demo's index less
    // their objects.
    let what_if_events = read_whole(&what_if_seen, &what_if_seen.messages, 0);
    let bin_events: BTreeSet<(i64, usize)> = what_if_events
        .iter()
        .filter(|e| e.key.as_ref().is_some_and(is_bin))
        .map(|e| (e.sequence, e.index))
        .collect();
    let refused = rejections(&what_if_seen);
    assert_eq!(refused.keys().copied().collect::<BTreeSet<_>>(), bin_events);
    assert!(refused.values().all(|(stage, _)| *stage == Stage::Decoder));
    let mut readable = expected.clone();
    let mut lost = 0;
    for keys in readable.values_mut() {
        let before = keys.len();
        keys.retain(|key, _| std::str::from_utf8(key).is_ok());
        lost += before - keys.len();
    }
    readable.retain(|_, keys| !keys.is_empty());
    assert!(lost > 0, "the expected index holds a non-UTF-8 key");
    assert_eq!(what_if.index(), readable);
    println!(
        "{REPOSITORY}@{COMMIT} --non-utf8 bin: {} events, {} refused by the decoder \
         (bin keys), {lost} expected objects Conductor cannot hold",
        events.len(),
        by_decoder.len()
    );
}

/// A publisher restart: the sequence goes back to 0 and Conductor does nothing about it. No
/// gap is logged (a lower sequence is never one), its socket is not remade (libzmq
/// reconnects underneath), no replay is asked, nothing is cleared: what the first life left
/// stays. Shown with the what-if Conductor (as written it holds nothing to keep): the second
/// life makes the first half of the same workload, so it ends with the first life's index,
/// not the second's.
#[test]
fn a_publisher_restart_goes_unnoticed() {
    let mut scenario = Scenario::new("conductor-restart");
    let conductor = Conductor::start(&scenario, WHAT_IF);
    let first = scenario.demo(&["--objects", "200", "--wait", "2", "--non-utf8", "str"]);
    conductor.await_handshakes(1);
    let first = first.finish();
    conductor.await_drained(1);
    let second = scenario.demo(&["--objects", "100", "--wait", "2", "--non-utf8", "str"]);
    conductor.await_handshakes(2);
    let second = second.finish();
    conductor.await_drained(2);
    let (client, seen) = conductor.stop();

    let restart = seen
        .messages
        .windows(2)
        .position(|w| w[1].sequence <= w[0].sequence)
        .expect("the sequence went back")
        + 1;
    read_whole(&seen, &seen.messages[..restart], 0);
    let second_life = wire_events(&seen.messages[restart..]);
    assert_eq!(seen.messages[restart].sequence, 0);
    assert_eq!(second_life[0].event_id, 1);
    assert_eq!(
        stream_trouble(&seen),
        Vec::<&Line>::new(),
        "no gap, no reconnect"
    );
    assert_eq!(
        client.last_seq,
        seen.messages.last().expect("messages").sequence
    );
    assert_eq!(rejections(&seen), BTreeMap::new());

    assert_ne!(first, second);
    assert_eq!(client.index(), first, "the first life's objects stay");
}

/// Conductor asks for a replay only after it reconnected, which only a malformed message
/// makes it do, and only with a replay endpoint (Mooncake's guide says to register a Mooncake
/// source without one). Its request is one 8-byte frame, with no empty delimiter: this
/// library's replay socket answers `["", "error", text]`. Conductor reads one frame, the
/// empty one, logs "Replay requested ... resp_len=0", and leaves the rest unread on its
/// DEALER; it would apply no replayed message anyway.
#[test]
fn its_replay_request_is_refused_unnoticed() {
    let mut scenario = Scenario::new("conductor-replay");
    let demo = scenario.demo(&["--objects", "20", "--wait", "2"]);
    let shared = Shared::default();
    let mut client = subscribed(&scenario.stream, &scenario.replay, AS_WRITTEN, &shared);
    client.connect().expect("connects");
    assert_eq!(client.request_replay(0), Ok(()));
    assert_eq!(
        lock(&shared).log,
        vec![Line::ReplayRequested {
            from: 0,
            response_len: 0
        }]
    );
    let dealer = client.replay_socket.as_ref().expect("replay socket");
    let rest = dealer.recv_multipart(0).expect("the rest of the reply");
    assert_eq!(rest[0], b"error", "{rest:?}");
    println!(
        "Conductor's replay request: [\"\", \"error\", {:?}] back",
        String::from_utf8_lossy(&rest[1])
    );
    demo.finish();
}

/// Heartbeats (`[timestamp_ms, [], dp_rank]`) pass the envelope rules and change nothing:
/// docs/subscribers.md left Conductor unchecked.
#[test]
fn heartbeats_are_taken() {
    let mut scenario = Scenario::new("conductor-heartbeats");
    let conductor = Conductor::start(&scenario, AS_WRITTEN);
    let demo = scenario.demo(&[
        "--objects",
        "20",
        "--wait",
        "2",
        "--linger",
        "1",
        "--heartbeat-ms",
        "20",
    ]);
    conductor.await_handshakes(1);
    demo.finish();
    conductor.await_drained(1);
    let (_, seen) = conductor.stop();
    // No envelope refused, no gap, no reconnect.
    assert_eq!(stream_trouble(&seen), Vec::<&Line>::new());
    let heartbeats = seen
        .messages
        .iter()
        .filter(|m| {
            let root = unpack_one(&m.payload).expect("msgpack");
            root[1].as_array().is_some_and(Vec::is_empty)
        })
        .count();
    assert!(heartbeats > 0, "heartbeats came: {}", seen.messages.len());
}

// ============================================================================================
// The transcription against Conductor's own tests (mooncake-conductor/tests/msg_decoder_test.cpp)
// and the cases of this library
// ============================================================================================

/// msgpack with `str` values written as their bytes whatever they are (rmpv would write a
/// non-UTF-8 `Utf8String` as `bin`).
fn pack(value: &Value, out: &mut Vec<u8>) {
    fn header(
        out: &mut Vec<u8>,
        len: usize,
        fix: u8,
        fix_max: usize,
        m8: Option<u8>,
        m16: u8,
        m32: u8,
    ) {
        if len <= fix_max {
            out.push(fix | len as u8);
        } else if let (Some(m8), true) = (m8, len < 256) {
            out.extend([m8, len as u8]);
        } else if len < 65536 {
            out.push(m16);
            out.extend((len as u16).to_be_bytes());
        } else {
            out.push(m32);
            out.extend((len as u32).to_be_bytes());
        }
    }
    match value {
        Value::String(s) => {
            header(out, s.as_bytes().len(), 0xa0, 31, Some(0xd9), 0xda, 0xdb);
            out.extend_from_slice(s.as_bytes());
        }
        Value::Array(items) => {
            header(out, items.len(), 0x90, 15, None, 0xdc, 0xdd);
            items.iter().for_each(|item| pack(item, out));
        }
        Value::Map(items) => {
            header(out, items.len(), 0x80, 15, None, 0xde, 0xdf);
            for (k, v) in items {
                pack(k, out);
                pack(v, out);
            }
        }
        other => rmpv::encode::write_value(out, other).expect("encode"),
    }
}

fn packed(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    pack(value, &mut out);
    out
}

/// A `str` holding `bytes`.
fn str_of(bytes: &[u8]) -> Value {
    let encoded = [&[0xd9, bytes.len() as u8][..], bytes].concat();
    unpack_one(&encoded).expect("str")
}

/// An event map's entries, in order.
type Fields = Vec<(&'static str, Value)>;
/// A change to an event map.
type Edit = Box<dyn Fn(&mut Fields)>;

const TS: i64 = 1_700_000_000_123;
const PROJECTED: u64 = 0x18191a1b1c1d1e1f;

fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(
        entries
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
    )
}

/// `PackMooncakeCommon`.
fn common(event_id: u64, event_type: &str, legacy: &str, medium: Option<&str>) -> Fields {
    vec![
        ("event_id", Value::from(event_id)),
        ("timestamp", Value::from(TS)),
        ("event_type", Value::from(event_type)),
        ("type", Value::from(legacy)),
        ("model_name", Value::from("model-a")),
        ("block_size", Value::from(16)),
        ("additional_salt", Value::Nil),
        ("lora_name", Value::Nil),
        ("tenant_id", Value::from("tenant-a")),
        ("backend_id", Value::from("backend-a")),
        ("medium", medium.map_or(Value::Nil, Value::from)),
        ("dp_rank", Value::from(2)),
    ]
}

/// `PackMooncakeObject`.
fn object(key: Value) -> Fields {
    vec![
        ("group_id", Value::from("0")),
        ("object_key", key),
        (
            "connector_block_hash",
            Value::from("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"),
        ),
        ("cache_prefix", Value::from("prefix-a")),
        ("tp_rank", Value::from(1)),
        ("head_or_tp_rank", Value::from(1)),
        ("pcp_rank", Value::from(0)),
        ("dcp_rank", Value::from(0)),
        ("pp_rank", Value::from(3)),
        ("layer_id", Value::from(31)),
        ("seq_hashes", Value::Array(vec![Value::from(PROJECTED)])),
        ("block_hashes", Value::Array(vec![Value::from(PROJECTED)])),
    ]
}

/// `PackMooncakeStored`.
fn stored(key: Value) -> Value {
    let mut entries = common(7, "stored", "BlockStored", Some("cpu"));
    entries.extend(object(key));
    entries.extend([
        ("base_block_idx", Value::Nil),
        ("parent_hash", Value::Nil),
        ("token_ids", Value::Nil),
        ("parent_block_hash", Value::Nil),
    ]);
    map(entries)
}

/// `PackMooncakeRemoved`.
fn removed(key: Value) -> Value {
    let mut entries = common(8, "removed", "BlockRemoved", Some("disk"));
    entries.extend(object(key));
    entries.push(("base_block_idx", Value::Nil));
    map(entries)
}

/// `PackMooncakeCleared`.
fn cleared() -> Value {
    map(common(9, "cleared", "AllBlocksCleared", None))
}

/// `PackMooncakeBatch`.
fn batch(events: Vec<Value>) -> Vec<u8> {
    packed(&Value::Array(vec![
        Value::from(TS),
        Value::Array(events),
        Value::from(2),
    ]))
}

fn errors(batch: &MooncakeEventBatch) -> Vec<Option<String>> {
    batch
        .events
        .iter()
        .map(|e| e.as_ref().err().cloned())
        .collect()
}

#[test]
fn decoder_takes_conductors_fixture() {
    // DecodeMooncakeEventBatch.DecodesDeterministicPublisherMapFixture
    let decoded = decode_mooncake_event_batch(&batch(vec![
        stored(Value::from("object-a")),
        removed(Value::from("object-a")),
        cleared(),
    ]))
    .expect("envelope");
    assert_eq!(decoded.timestamp_milliseconds, TS);
    assert_eq!(decoded.data_parallel_rank, Some(2));
    assert_eq!(errors(&decoded), vec![None, None, None]);
    let Ok(MooncakeEvent::Stored { fields, object, .. }) = &decoded.events[0] else {
        panic!("stored")
    };
    assert_eq!(
        (fields.event_id, &fields.medium),
        (7, &Some(b"cpu".to_vec()))
    );
    assert_eq!(object.seq_hashes, vec![PROJECTED]);
    assert!(matches!(
        decoded.events[2],
        Ok(MooncakeEvent::Cleared { .. })
    ));
}

#[test]
fn decoder_refuses_envelopes_as_conductor_does() {
    // DecodeMooncakeEventBatch.RejectsMalformedEnvelopeMetadata and
    // MessagePackEnvelope.RejectsEmptyGarbageAndTrailingBytes
    let array = |items: Vec<Value>| packed(&Value::Array(items));
    let events = || Value::Array(vec![]);
    let cases = [
        (
            packed(&Value::from("not-an-envelope")),
            "three-element array envelope",
        ),
        (array(vec![Value::from(TS), events()]), "three-element"),
        (
            array(vec![Value::from(TS), events(), Value::Nil, Value::Nil]),
            "three-element",
        ),
        (
            array(vec![Value::F64(1.25), events(), Value::Nil]),
            "timestamp must be a non-negative integer",
        ),
        (
            array(vec![Value::from(-1), events(), Value::Nil]),
            "timestamp must be a non-negative integer",
        ),
        (
            array(vec![Value::from(TS), Value::Map(vec![]), Value::Nil]),
            "events must be an array",
        ),
        (
            array(vec![Value::from(TS), events(), Value::from(-1)]),
            "non-negative or nil",
        ),
        (
            array(vec![Value::from(TS), events(), Value::Boolean(false)]),
            "data_parallel_rank",
        ),
        (Vec::new(), "empty payload"),
        (
            b"\xc1not-msgpack".to_vec(),
            "failed to decode Mooncake envelope",
        ),
        (
            [array(vec![Value::from(TS), events(), Value::Nil]), vec![0]].concat(),
            "trailing bytes",
        ),
    ];
    for (payload, error) in cases {
        let refused = decode_mooncake_event_batch(&payload).expect_err(error);
        assert!(refused.contains(error), "{refused:?} lacks {error:?}");
    }
    // A heartbeat, and a nil dp_rank, are envelopes like any other.
    let heartbeat =
        decode_mooncake_event_batch(&array(vec![Value::from(TS), events(), Value::Nil]));
    assert!(heartbeat.expect("heartbeat").events.is_empty());
}

#[test]
fn decoder_refuses_events_alone_as_conductor_does() {
    // DecodeMooncakeEventBatch.RejectsPositionalDuplicateMissingWrongTypeAndUnknownTagLocally
    let dup = Value::Map(vec![
        (Value::from("event_type"), Value::from("stored")),
        (Value::from("event_type"), Value::from("stored")),
    ]);
    let decoded = decode_mooncake_event_batch(&batch(vec![
        Value::Array(vec![Value::from("BlockStoreEvent")]),
        dup,
        map(vec![("unrecognized_event_type", Value::from("stored"))]),
        map(vec![("event_type", Value::from(7))]),
        map(vec![("event_type", Value::from("updated"))]),
        cleared(),
    ]))
    .expect("envelope");
    let expected = [
        "event 0: expected event map",
        "event 1: duplicate recognized key: event_type",
        "event 2: missing required key: event_type",
        "event 3: invalid event_type: expected string",
        "event 4: unknown Mooncake event tag",
    ];
    for (got, want) in errors(&decoded).iter().zip(expected) {
        assert!(
            got.as_ref().is_some_and(|e| e.starts_with(want)),
            "{got:?} vs {want}"
        );
    }
    assert!(matches!(
        decoded.events[5],
        Ok(MooncakeEvent::Cleared { .. })
    ));

    // DecodeMooncakeEventBatch.RejectsWrongRecognizedFieldTypeLocally
    let mut wrong_medium = common(9, "cleared", "AllBlocksCleared", None);
    wrong_medium[10].1 = Value::from(7);
    let decoded =
        decode_mooncake_event_batch(&batch(vec![map(wrong_medium), cleared()])).expect("envelope");
    assert_eq!(
        errors(&decoded),
        vec![
            Some("event 0: invalid medium: expected string, got positive integer".into()),
            None
        ]
    );
}

#[test]
fn decoder_rules_for_this_librarys_fields() {
    let event = |edit: &dyn Fn(&mut Fields)| {
        let Value::Map(items) = stored(Value::from("k")) else {
            unreachable!()
        };
        let mut entries: Fields = items
            .into_iter()
            .map(|(k, v)| {
                (
                    MOONCAKE_FIELDS
                        .iter()
                        .find(|f| Some(**f) == k.as_str())
                        .copied()
                        .expect("known"),
                    v,
                )
            })
            .collect();
        edit(&mut entries);
        let decoded =
            decode_mooncake_event_batch(&batch(vec![map(entries), cleared()])).expect("envelope");
        assert!(decoded.events[1].is_ok(), "the sibling is taken");
        decoded.events[0].as_ref().err().cloned()
    };
    let set = |name: &'static str, value: Value| {
        move |entries: &mut Fields| {
            entries.iter_mut().find(|(k, _)| *k == name).expect(name).1 = value.clone();
        }
    };
    let drop_key =
        |name: &'static str| move |entries: &mut Fields| entries.retain(|(k, _)| *k != name);
    let cases: Vec<(Edit, Option<&str>)> = vec![
        (Box::new(|_: &mut Vec<_>| {}), None),
        // The key may be any bytes in a str; as bin it is refused.
        (Box::new(set("object_key", str_of(b"obj-\xff\xfe"))), None),
        (
            Box::new(set("object_key", Value::Binary(b"obj-\xff\xfe".to_vec()))),
            Some("invalid object_key: expected string, got binary"),
        ),
        (
            Box::new(set("tenant_id", Value::Binary(b"t\xff".to_vec()))),
            Some("invalid tenant_id: expected string, got binary"),
        ),
        (
            Box::new(set("group_id", Value::Binary(b"g\xff".to_vec()))),
            Some("invalid group_id: expected string, got binary"),
        ),
        (
            Box::new(set("object_key", Value::Nil)),
            Some("invalid object_key: expected string, got nil"),
        ),
        (Box::new(drop_key("object_key")), None),
        (
            Box::new(set("timestamp", Value::F64(1.0))),
            Some("invalid timestamp: expected signed 64-bit integer, got float"),
        ),
        (
            Box::new(set("timestamp", Value::from(TS + 1))),
            Some("event timestamp conflicts with batch timestamp"),
        ),
        (
            Box::new(drop_key("event_id")),
            Some("missing required key: event_id"),
        ),
        (
            Box::new(set("event_id", Value::from(-1))),
            Some("invalid event_id: expected unsigned integer, got negative integer"),
        ),
        (
            Box::new(set("dp_rank", Value::Nil)),
            Some("invalid dp_rank: expected signed 64-bit integer, got nil"),
        ),
        (
            Box::new(set("dp_rank", Value::from(-1))),
            Some("event dp_rank must be non-negative"),
        ),
        (
            Box::new(drop_key("group_id")),
            Some("missing required key: group_id"),
        ),
        (
            Box::new(drop_key("base_block_idx")),
            Some("missing required key: base_block_idx"),
        ),
        (
            Box::new(drop_key("parent_hash")),
            Some("missing required key: parent_hash"),
        ),
        (
            Box::new(drop_key("token_ids")),
            Some("missing required key: token_ids"),
        ),
        (
            Box::new(set("type", Value::from("BlockRemoved"))),
            Some("legacy type conflicts with event_type"),
        ),
        (
            Box::new(set("block_hashes", Value::Array(vec![]))),
            Some("legacy block_hashes conflicts with seq_hashes"),
        ),
        (
            Box::new(set("parent_block_hash", Value::from(1))),
            Some("parent_block_hash conflicts with parent_hash"),
        ),
        (
            Box::new(set(
                "token_ids",
                Value::Array(vec![Value::from(1u64 << 31)]),
            )),
            Some("invalid token_ids: element 0: integer is outside int32 range"),
        ),
        (
            Box::new(|e: &mut Vec<_>| e.push(("tenant_id", Value::from("again")))),
            Some("duplicate recognized key: tenant_id"),
        ),
    ];
    for (n, (edit, want)) in cases.iter().enumerate() {
        let got = event(edit.as_ref());
        assert_eq!(got, want.map(|w| format!("event 0: {w}")), "case {n}");
    }
    // A removed must not carry the stored-only keys; a cleared no object key.
    let Value::Map(mut items) = removed(Value::from("k")) else {
        unreachable!()
    };
    items.push((Value::from("token_ids"), Value::Nil));
    let decoded = decode_mooncake_event_batch(&batch(vec![Value::Map(items)])).expect("envelope");
    assert_eq!(
        errors(&decoded),
        vec![Some(
            "event 0: removed event contains recognized stored-only key".into()
        )]
    );
    let Value::Map(mut items) = cleared() else {
        unreachable!()
    };
    items.push((Value::from("group_id"), Value::Nil));
    let decoded = decode_mooncake_event_batch(&batch(vec![Value::Map(items)])).expect("envelope");
    assert_eq!(
        errors(&decoded),
        vec![Some(
            "event 0: cleared event contains recognized object key: group_id".into()
        )]
    );
}

#[test]
fn handler_indexes_events_shaped_for_it_and_refuses_this_librarys() {
    let handler = |waivers| {
        let mut indexer = PrefixCacheTable::default();
        let context = ContextKey {
            tenant_id: b"tenant-a".to_vec(),
            model_name: b"model-a".to_vec(),
            lora_name: Vec::new(),
            block_size: 16,
        };
        assert_eq!(indexer.register(context, PROFILE), "");
        KvEventHandler {
            service: ServiceConfig {
                endpoint: "ipc://x".into(),
                replay_endpoint: String::new(),
                model_name: "model-a".into(),
                lora_name: String::new(),
                tenant_id: "tenant-a".into(),
                block_size: 16,
                dp_rank: 0,
                cache_group: None,
                hash_profile: PROFILE.into(),
            },
            indexer,
            pool_bindings: BTreeMap::new(),
            waivers,
        }
    };
    let metadata = MessageMetadata {
        endpoint: "ipc://x".into(),
        sequence: 0,
    };
    let apply = |handler: &mut KvEventHandler, events: Vec<Value>| {
        let decoded = decode_mooncake_event_batch(&batch(events)).expect("envelope");
        let mut log = Vec::new();
        assert_eq!(handler.handle_batch(&decoded, &metadata, &mut log), "");
        log
    };
    // Mooncake's own publisher's shape (group "0", a connector hash): a record per tier.
    let mut conductor = handler(AS_WRITTEN);
    let mut disk = stored(Value::from("object-a"));
    if let Value::Map(items) = &mut disk {
        items
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some("medium"))
            .expect("medium")
            .1 = Value::from("DISK");
    }
    assert_eq!(
        apply(&mut conductor, vec![stored(Value::from("object-a")), disk]),
        vec![]
    );
    assert_eq!(conductor.pool_bindings.len(), 2);
    assert_eq!(
        apply(&mut conductor, vec![removed(Value::from("object-a"))]),
        vec![]
    );
    assert_eq!(conductor.pool_bindings.len(), 1);
    assert_eq!(apply(&mut conductor, vec![cleared()]), vec![]);
    assert!(conductor.pool_bindings.is_empty());
    assert!(conductor
        .indexer
        .contexts
        .values()
        .all(|c| c.blocks.is_empty()));

    // This library's shape: no connector hash, empty seq_hashes, a group of its own.
    let ours = |group: Value| {
        let Value::Map(items) = stored(Value::from("object-b")) else {
            unreachable!()
        };
        let items = items
            .into_iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    Some(
                        "connector_block_hash"
                            | "cache_prefix"
                            | "tp_rank"
                            | "head_or_tp_rank"
                            | "pcp_rank"
                            | "dcp_rank"
                            | "pp_rank"
                            | "layer_id"
                    )
                )
            })
            .map(|(k, v)| match k.as_str() {
                Some("seq_hashes" | "block_hashes") => (k, Value::Array(vec![])),
                Some("group_id") => (k, group.clone()),
                _ => (k, v),
            })
            .collect();
        Value::Map(items)
    };
    let refused = |log: Vec<Line>| -> Vec<String> {
        log.into_iter()
            .map(|line| match line {
                Line::RejectedEvent { error, .. } => error,
                other => panic!("{other:?}"),
            })
            .collect()
    };
    let log = apply(
        &mut conductor,
        vec![
            ours(Value::from("group-0")),
            ours(Value::Nil),
            ours(Value::from("0")),
        ],
    );
    assert_eq!(
        refused(log),
        vec![
            "group_id must be a decimal integer or nil",
            "connector_block_hash is required",
            "connector_block_hash is required"
        ]
    );
    assert!(conductor.pool_bindings.is_empty());
    let mut what_if = handler(WHAT_IF);
    assert_eq!(
        apply(&mut what_if, vec![ours(Value::from("group-0"))]),
        vec![]
    );
    assert_eq!(what_if.pool_bindings.len(), 1);
    // group_id's decimal rule is std::from_chars's.
    for (group, error) in [
        ("0", ""),
        ("-0", ""),
        ("00", ""),
        ("+0", "group_id must be a decimal integer or nil"),
        (" 0", "group_id must be a decimal integer or nil"),
        ("7", "only cache group zero is supported"),
    ] {
        assert_eq!(
            validate_mooncake_group(&Some(group.as_bytes().to_vec())),
            error,
            "{group:?}"
        );
    }
}
