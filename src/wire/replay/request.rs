//! The requests a replay socket serves: written by subscribers, read by the publisher.

use super::verb;

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
    pub fn parse(frames: &[Vec<u8>]) -> Result<Request, String> {
        let [delimiter, verb, rest @ ..] = frames else {
            return Err(format!(
                "{} frames after the routing id; a request is [\"\", verb, ...]",
                frames.len()
            ));
        };
        if !delimiter.is_empty() {
            return Err("the first frame of a request must be empty".into());
        }
        match (verb.as_slice(), rest) {
            // "snapshot" is 8 bytes too; as a start sequence it would be 8.3e18.
            (verb::SNAPSHOT, []) => Ok(Request::Snapshot { tenant: None }),
            (verb::SNAPSHOT, [tenant]) if tenant.is_empty() => Err(
                "an empty tenant_id: the stream names the master's empty tenant \"default\"".into(),
            ),
            (verb::SNAPSHOT, [tenant]) => Ok(Request::Snapshot {
                tenant: Some(tenant.clone()),
            }),
            (verb::INFO, []) => Ok(Request::Info),
            (seq, []) if seq.len() == 8 => Ok(Request::Replay {
                from: u64::from_be_bytes(seq.try_into().unwrap_or_default()),
            }),
            _ => Err(format!(
                "unknown request ({} frames, verb of {} bytes): expected [\"\", start_seq as 8 \
                 bytes big-endian], [\"\", \"info\"] or [\"\", \"snapshot\"(, tenant)]",
                frames.len(),
                verb.len()
            )),
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
        for bad in [
            frames(&[]),
            frames(&[b""]),
            frames(&[b"x", b"info"]),
            frames(&[b"", b"inf0"]),
            frames(&[b"", b"info", b"extra"]),
            frames(&[b"", &[0u8; 7]]),
            frames(&[b"", b"snapshot", b""]),
            frames(&[b"", b"snapshot", b"a", b"b"]),
        ] {
            assert!(Request::parse(&bad).is_err(), "{bad:?}");
        }
    }
}
