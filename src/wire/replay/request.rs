//! The requests a replay socket serves: written by subscribers, read by the publisher.

use super::verb;
use std::fmt;

/// A request to the replay socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// The retained messages from sequence `from` on.
    Replay {
        /// The first sequence wanted.
        from: u64,
    },
    /// Where the stream stands.
    Info,
    /// Every object readable now: of one tenant (as on the wire), or of every one.
    Snapshot {
        /// The tenant, or None for every tenant.
        tenant: Option<Vec<u8>>,
    },
}

/// Why frames are not a request of the replay protocol. Its text is what the publisher
/// answers in its `error` reply.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BadRequest {
    /// Fewer than 2 frames after the routing id.
    TooFewFrames {
        /// The frames there are.
        count: usize,
    },
    /// The first frame is not the empty delimiter.
    NoDelimiter,
    /// A snapshot of a tenant whose name is empty: the stream calls that tenant `default`.
    EmptyTenant,
    /// No verb the protocol knows, or one with the wrong number of frames.
    Unknown {
        /// The frames after the routing id.
        frames: usize,
        /// The length of the second frame, the verb or a start sequence.
        verb_bytes: usize,
    },
}

impl fmt::Display for BadRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadRequest::TooFewFrames { count } => write!(
                f,
                "{count} frames after the routing id; a request is [\"\", verb, ...]"
            ),
            BadRequest::NoDelimiter => f.write_str("the first frame of a request must be empty"),
            BadRequest::EmptyTenant => f.write_str(
                "an empty tenant_id: the stream names the master's empty tenant \"default\"",
            ),
            BadRequest::Unknown { frames, verb_bytes } => write!(
                f,
                "unknown request ({frames} frames, verb of {verb_bytes} bytes): expected [\"\", \
                 start_seq as 8 bytes big-endian], [\"\", \"info\"] or [\"\", \"snapshot\"(, \
                 tenant)]"
            ),
        }
    }
}

impl std::error::Error for BadRequest {}

impl Request {
    /// The frames a DEALER sends for this request, the empty delimiter first.
    pub fn frames(&self) -> Vec<Vec<u8>> {
        let mut frames = vec![Vec::new()];
        match self {
            Request::Replay { from } => frames.push(from.to_be_bytes().to_vec()),
            Request::Info => frames.push(verb::INFO.to_vec()),
            Request::Snapshot { tenant } => {
                frames.push(verb::SNAPSHOT.to_vec());
                frames.extend(tenant.clone());
            }
        }
        frames
    }

    /// Reads the frames after a ROUTER's routing id; what is not a request says why.
    pub fn parse(frames: &[Vec<u8>]) -> Result<Request, BadRequest> {
        let [delimiter, verb, rest @ ..] = frames else {
            return Err(BadRequest::TooFewFrames {
                count: frames.len(),
            });
        };
        if !delimiter.is_empty() {
            return Err(BadRequest::NoDelimiter);
        }
        match (verb.as_slice(), rest) {
            // "snapshot" is 8 bytes too; as a start sequence it would be 8.3e18.
            (verb::SNAPSHOT, []) => Ok(Request::Snapshot { tenant: None }),
            (verb::SNAPSHOT, [tenant]) if tenant.is_empty() => Err(BadRequest::EmptyTenant),
            (verb::SNAPSHOT, [tenant]) => Ok(Request::Snapshot {
                tenant: Some(tenant.clone()),
            }),
            (verb::INFO, []) => Ok(Request::Info),
            (seq, []) if seq.len() == 8 => Ok(Request::Replay {
                from: u64::from_be_bytes(seq.try_into().unwrap_or_default()),
            }),
            _ => Err(BadRequest::Unknown {
                frames: frames.len(),
                verb_bytes: verb.len(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(parts: &[&[u8]]) -> Vec<Vec<u8>> {
        parts.iter().map(|p| p.to_vec()).collect()
    }

    #[test]
    fn requests_parse_as_the_protocol_says_and_read_back_as_written() {
        for (parts, request) in [
            (
                frames(&[b"", &7u64.to_be_bytes()]),
                Request::Replay { from: 7 },
            ),
            (frames(&[b"", b"info"]), Request::Info),
            (
                frames(&[b"", b"snapshot"]),
                Request::Snapshot { tenant: None },
            ),
            (
                frames(&[b"", b"snapshot", b"tenant"]),
                Request::Snapshot {
                    tenant: Some(b"tenant".to_vec()),
                },
            ),
        ] {
            assert_eq!(Request::parse(&parts), Ok(request.clone()));
            assert_eq!(request.frames(), parts);
        }
        let unknown = |frames, verb_bytes| BadRequest::Unknown { frames, verb_bytes };
        for (bad, why) in [
            (frames(&[]), BadRequest::TooFewFrames { count: 0 }),
            (frames(&[b""]), BadRequest::TooFewFrames { count: 1 }),
            (frames(&[b"x", b"info"]), BadRequest::NoDelimiter),
            (frames(&[b"", b"inf0"]), unknown(2, 4)),
            (frames(&[b"", b"info", b"extra"]), unknown(3, 4)),
            (frames(&[b"", &[0u8; 7]]), unknown(2, 7)),
            (frames(&[b"", b"snapshot", b""]), BadRequest::EmptyTenant),
            (frames(&[b"", b"snapshot", b"a", b"b"]), unknown(4, 8)),
        ] {
            assert_eq!(Request::parse(&bad), Err(why), "{bad:?}");
        }
    }
}
