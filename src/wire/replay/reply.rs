//! The replies to a replay request, as the replay socket writes them and subscribers read
//! them (the frames after a DEALER's empty delimiter). Two forms exist in the field:
//!
//! - with the topic frame (vLLM 0.26 and after, llm-d): each message `[topic, seq, payload]`,
//!   exactly the frames of the live one, and the end `["", -1, ""]`;
//! - without (earlier vLLM, SGLang): each message `[seq, payload]`, the end `[-1, ""]`.
//!
//! `seq` is 8 bytes big-endian; the end's is -1 as a signed 64-bit big-endian integer, and its
//! payload is empty (no message's is).

/// The sequence frame that ends a replay: -1 as a signed 64-bit big-endian integer.
pub const END_OF_REPLAY: [u8; 8] = (-1i64).to_be_bytes();

/// Which form replies take (`kv_events_replay_topic_frame`).
#[cfg(feature = "publisher")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ReplyForm {
    /// `[topic, seq, payload]`, the end `["", -1, ""]`.
    TopicFrame(Vec<u8>),
    /// `[seq, payload]`, the end `[-1, ""]`.
    Plain,
}

#[cfg(feature = "publisher")]
impl ReplyForm {
    /// The frames before the payload of message `sequence`'s reply, after the delimiter.
    pub(crate) fn head<'a>(&'a self, sequence: &'a [u8; 8]) -> Vec<&'a [u8]> {
        match self {
            ReplyForm::TopicFrame(topic) => vec![topic, sequence],
            ReplyForm::Plain => vec![sequence],
        }
    }

    /// The frames before the (empty) payload of the end of a replay, after the delimiter.
    pub(crate) fn end_head(&self) -> &'static [&'static [u8]] {
        match self {
            ReplyForm::TopicFrame(_) => &[b"", &END_OF_REPLAY],
            ReplyForm::Plain => &[&END_OF_REPLAY],
        }
    }
}

/// A reply to a replay request, in either form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replayed<'a> {
    /// A message sent again: its sequence frame and its payload.
    Message {
        /// The 8-byte big-endian sequence.
        sequence: &'a [u8],
        /// The payload, as on the stream.
        payload: &'a [u8],
    },
    /// The end of the replay.
    End,
}

impl<'a> Replayed<'a> {
    /// Reads the frames after the delimiter as a reply to a replay request, in either form;
    /// None when they are neither (an `["error", text]` reply, or something else).
    pub fn read<F: AsRef<[u8]>>(frames: &'a [F]) -> Option<Replayed<'a>> {
        let (sequence, payload) = match frames {
            [_topic, sequence, payload] => (sequence.as_ref(), payload.as_ref()),
            [sequence, payload] => (sequence.as_ref(), payload.as_ref()),
            _ => return None,
        };
        match (sequence, payload.is_empty()) {
            (s, true) if s == END_OF_REPLAY => Some(Replayed::End),
            (s, _) if s.len() == 8 && s != END_OF_REPLAY => {
                Some(Replayed::Message { sequence, payload })
            }
            _ => None,
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
    fn both_forms_read_and_write_alike() {
        let seq = 7u64.to_be_bytes();
        let with = ReplyForm::TopicFrame(b"kv@pod@model".to_vec());
        assert_eq!(with.head(&seq), [&b"kv@pod@model"[..], &seq]);
        assert_eq!(with.end_head(), [&b""[..], &END_OF_REPLAY]);
        assert_eq!(ReplyForm::Plain.head(&seq), [&seq[..]]);
        assert_eq!(ReplyForm::Plain.end_head(), [&END_OF_REPLAY[..]]);
        let message = Replayed::Message {
            sequence: &seq,
            payload: b"p",
        };
        for (parts, read) in [
            (frames(&[b"kv@pod@model", &seq, b"p"]), Some(message)),
            (frames(&[b"", &seq, b"p"]), Some(message)),
            (frames(&[&seq, b"p"]), Some(message)),
            (frames(&[b"", &END_OF_REPLAY, b""]), Some(Replayed::End)),
            (frames(&[b"t", &END_OF_REPLAY, b""]), Some(Replayed::End)),
            (frames(&[&END_OF_REPLAY, b""]), Some(Replayed::End)),
            (frames(&[&END_OF_REPLAY, b"p"]), None),
            (frames(&[b"error", b"busy"]), None),
            (frames(&[&seq]), None),
            (frames(&[b"a", b"b", &seq, b"p"]), None),
        ] {
            assert_eq!(Replayed::read(&parts), read, "{parts:?}");
        }
    }
}
