//! The two maps of the replay protocol: `info`'s and `snapshot-end`'s, encoded by the
//! publisher and decoded by subscribers. Each decoder ignores keys it does not know, so that a
//! publisher may add some.

use rmpv::Value;
use std::fmt;

/// Why an `info` or `snapshot-end` map does not decode. Concerns that reply alone: the
/// publisher broke the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BadReply {
    /// The reply is not msgpack, or not a map.
    NotAMap {
        /// `"an info reply"` or `"a snapshot-end"`.
        reply: &'static str,
        /// What the decoder said, when it said something.
        why: Option<String>,
    },
    /// An `info` map's value does not fit [`Info`]'s type for it; rmp-serde's reason.
    Info(String),
    /// A `snapshot-end` value is not of its key's type.
    WrongType {
        /// The key, as received.
        key: String,
        /// The value, as received.
        value: String,
    },
    /// A `snapshot-end` lacks `next_sequence` or `incarnation`.
    Incomplete,
}

impl fmt::Display for BadReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadReply::NotAMap { reply, why: None } => write!(f, "{reply} is not a map"),
            BadReply::NotAMap {
                reply,
                why: Some(why),
            } => write!(f, "{reply} is not msgpack: {why}"),
            BadReply::Info(why) => write!(f, "an info reply does not decode: {why}"),
            BadReply::WrongType { key, value } => {
                write!(f, "a snapshot-end whose {key} is {value}")
            }
            BadReply::Incomplete => {
                f.write_str("a snapshot-end without its next_sequence or incarnation")
            }
        }
    }
}

impl std::error::Error for BadReply {}

/// Where the stream stands: the `info` reply's map. Keys the decoder does not know are
/// ignored, and a key that is missing keeps its default.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct Info {
    /// The random id of the publisher's life: a new one after a restart or a takeover.
    pub incarnation: u64,
    /// The publisher's `backend_id`.
    pub backend_id: String,
    /// The publisher's `dp_rank`.
    pub dp_rank: u64,
    /// The sequence its next message takes: every number below it was taken, by a message or
    /// by events it dropped (their gap); 0 before any.
    pub next_sequence: u64,
    /// The oldest sequence a replay can send now; `next_sequence` when it holds none.
    pub oldest_sequence: u64,
    /// Whether it serves snapshots (the master registered an object source).
    pub snapshots: bool,
    /// Subscribers connected to its PUB socket now (handshake done); 0 from a publisher
    /// that does not say.
    pub subscribers: u64,
    /// Subscribers that connected since it started.
    pub subscriber_connects: u64,
    /// Subscribers that disconnected since it started.
    pub subscriber_disconnects: u64,
}

impl Info {
    /// The map as the publisher sends it.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        let numbers: [(&str, u64); 7] = [
            ("incarnation", self.incarnation),
            ("dp_rank", self.dp_rank),
            ("next_sequence", self.next_sequence),
            ("oldest_sequence", self.oldest_sequence),
            ("subscribers", self.subscribers),
            ("subscriber_connects", self.subscriber_connects),
            ("subscriber_disconnects", self.subscriber_disconnects),
        ];
        // Writing to a Vec cannot fail.
        let _ = rmp::encode::write_map_len(&mut out, numbers.len() as u32 + 2);
        for (key, value) in numbers {
            let _ = rmp::encode::write_str(&mut out, key);
            let _ = rmp::encode::write_uint(&mut out, value);
        }
        let _ = rmp::encode::write_str(&mut out, "backend_id");
        let _ = rmp::encode::write_str(&mut out, &self.backend_id);
        let _ = rmp::encode::write_str(&mut out, "snapshots");
        let _ = rmp::encode::write_bool(&mut out, self.snapshots);
        out
    }

    /// Decodes the map with `rmp-serde`; a value of the wrong type is an error, which says
    /// what was wrong.
    pub fn decode(body: &[u8]) -> Result<Info, BadReply> {
        use rmp::Marker;
        // rmp-serde also reads a struct from an array, by position; the protocol's is a map.
        match body.first().map(|&byte| Marker::from_u8(byte)) {
            Some(Marker::FixMap(_) | Marker::Map16 | Marker::Map32) => {}
            _ => {
                return Err(BadReply::NotAMap {
                    reply: "an info reply",
                    why: None,
                })
            }
        }
        rmp_serde::from_slice(body).map_err(|e| BadReply::Info(e.to_string()))
    }
}

/// What a snapshot's last reply says: the `snapshot-end` map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotEnd {
    /// The first stream sequence the snapshot does not hold: the messages numbered from it
    /// on apply on top.
    pub next_sequence: u64,
    /// The objects it held.
    pub objects: u64,
    /// The events it held (an object's media are one event each).
    pub events: u64,
    /// The publisher's incarnation when it was taken.
    pub incarnation: u64,
    /// The tenant it was of (as on the wire), or None for every tenant.
    pub tenant: Option<Vec<u8>>,
}

impl SnapshotEnd {
    /// The map as the publisher sends it; a tenant that is UTF-8 as a string, else as binary.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96);
        // Writing to a Vec cannot fail.
        let _ = rmp::encode::write_map_len(&mut out, 5);
        for (key, value) in [
            ("next_sequence", self.next_sequence),
            ("objects", self.objects),
            ("events", self.events),
            ("incarnation", self.incarnation),
        ] {
            let _ = rmp::encode::write_str(&mut out, key);
            let _ = rmp::encode::write_uint(&mut out, value);
        }
        let _ = rmp::encode::write_str(&mut out, "tenant");
        match self.tenant.as_deref().map(std::str::from_utf8) {
            None => {
                let _ = rmp::encode::write_nil(&mut out);
            }
            Some(Ok(text)) => {
                let _ = rmp::encode::write_str(&mut out, text);
            }
            Some(Err(_)) => {
                let _ = rmp::encode::write_bin(&mut out, self.tenant.as_deref().unwrap_or(&[]));
            }
        }
        out
    }

    /// Decodes the map; `next_sequence` and `incarnation` must be there.
    pub fn decode(body: &[u8]) -> Result<SnapshotEnd, BadReply> {
        let not_a_map = |why| BadReply::NotAMap {
            reply: "a snapshot-end",
            why,
        };
        let value =
            rmpv::decode::read_value(&mut &body[..]).map_err(|e| not_a_map(Some(e.to_string())))?;
        let Value::Map(entries) = value else {
            return Err(not_a_map(None));
        };
        let wrong = |key: &Value, value: &Value| BadReply::WrongType {
            key: key.as_str().map_or_else(|| key.to_string(), str::to_owned),
            value: value.to_string(),
        };
        let mut end = SnapshotEnd::default();
        let (mut sequence, mut incarnation) = (false, false);
        for (key, value) in &entries {
            let number = || value.as_u64().ok_or_else(|| wrong(key, value));
            match key.as_str() {
                Some("next_sequence") => (end.next_sequence, sequence) = (number()?, true),
                Some("incarnation") => (end.incarnation, incarnation) = (number()?, true),
                Some("objects") => end.objects = number()?,
                Some("events") => end.events = number()?,
                Some("tenant") => {
                    end.tenant = match value {
                        Value::Nil => None,
                        Value::String(s) => Some(s.as_bytes().to_vec()),
                        Value::Binary(b) => Some(b.clone()),
                        other => return Err(wrong(key, other)),
                    }
                }
                _ => {}
            }
        }
        if !(sequence && incarnation) {
            return Err(BadReply::Incomplete);
        }
        Ok(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, value).unwrap();
        out
    }

    /// The map's keys and values as `rmpv` reads them: a decoder that is not ours.
    fn read(body: &[u8]) -> Vec<(String, Value)> {
        let Value::Map(entries) = rmpv::decode::read_value(&mut &body[..]).unwrap() else {
            panic!("not a map");
        };
        entries
            .into_iter()
            .map(|(k, v)| (k.as_str().unwrap().to_owned(), v))
            .collect()
    }

    #[test]
    fn the_info_map_has_the_protocols_keys_and_types_and_decodes_back() {
        let info = Info {
            incarnation: u64::MAX,
            backend_id: "store-a".into(),
            dp_rank: 2,
            next_sequence: 40,
            oldest_sequence: 3,
            snapshots: true,
            subscribers: 4,
            subscriber_connects: 6,
            subscriber_disconnects: 2,
        };
        let body = info.encode();
        let keys: Vec<String> = read(&body).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "incarnation",
                "dp_rank",
                "next_sequence",
                "oldest_sequence",
                "subscribers",
                "subscriber_connects",
                "subscriber_disconnects",
                "backend_id",
                "snapshots"
            ]
        );
        for (key, value) in read(&body) {
            match key.as_str() {
                "backend_id" => assert_eq!(value, Value::from("store-a")),
                "snapshots" => assert_eq!(value, Value::Boolean(true)),
                _ => assert!(value.is_u64(), "{key}: {value}"),
            }
        }
        assert_eq!(Info::decode(&body), Ok(info));
    }

    #[test]
    fn an_info_reply_decodes_its_keys_and_ignores_others() {
        let map = Value::Map(vec![
            (Value::from("next_sequence"), Value::from(40u64)),
            (Value::from("added_later"), Value::Array(vec![Value::Nil])),
        ]);
        let info = Info::decode(&encoded(&map)).unwrap();
        assert_eq!(
            info,
            Info {
                next_sequence: 40,
                ..Info::default()
            }
        );
    }

    #[test]
    fn an_info_reply_that_is_not_the_protocols_says_why() {
        let wrong = Value::Map(vec![(Value::from("next_sequence"), Value::from("many"))]);
        for (body, why) in [
            (encoded(&wrong), "does not decode: "),
            (
                encoded(&Value::Array(vec![Value::from(1u64)])),
                "is not a map",
            ),
            (vec![], "is not a map"),
            (vec![0x81, 0xa1], "does not decode: "),
        ] {
            let err = Info::decode(&body).unwrap_err().to_string();
            assert!(err.contains(why), "{err}\nwanted: {why}");
        }
    }

    #[test]
    fn the_snapshot_end_map_has_the_protocols_keys_and_decodes_back() {
        for (tenant, written) in [
            (None, Value::Nil),
            (Some(b"t".to_vec()), Value::from("t")),
            (Some(vec![0xff]), Value::Binary(vec![0xff])),
        ] {
            let end = SnapshotEnd {
                next_sequence: 9,
                objects: 3,
                events: 5,
                incarnation: u64::MAX,
                tenant,
            };
            let body = end.encode();
            let map = read(&body);
            let keys: Vec<&str> = map.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(
                keys,
                [
                    "next_sequence",
                    "objects",
                    "events",
                    "incarnation",
                    "tenant"
                ]
            );
            assert_eq!(map[4].1, written);
            assert!(map[..4].iter().all(|(_, v)| v.is_u64()));
            assert_eq!(SnapshotEnd::decode(&body), Ok(end));
        }
        let partial = Value::Map(vec![(Value::from("next_sequence"), Value::from(1u64))]);
        assert_eq!(
            SnapshotEnd::decode(&encoded(&partial)),
            Err(BadReply::Incomplete)
        );
        let negative = Value::Map(vec![
            (Value::from("next_sequence"), Value::from(-1)),
            (Value::from("incarnation"), Value::from(1u64)),
        ]);
        let err = SnapshotEnd::decode(&encoded(&negative)).unwrap_err();
        assert_eq!(
            err,
            BadReply::WrongType {
                key: "next_sequence".into(),
                value: "-1".into()
            }
        );
        assert_eq!(err.to_string(), "a snapshot-end whose next_sequence is -1");
    }
}
