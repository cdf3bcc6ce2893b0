//! Reading the stream for people. `tail` and the demo's watcher share this path: a decoded
//! batch becomes JSON lines on stdout for the events that pass a [`Filter`], a note on
//! stderr when its sequence does not follow (whatever the filter), and counts.

use mooncake_kv_events::subscriber::{Batch, Continuity};
use mooncake_kv_events::wire;
use rmpv::Value;
use std::io::{self, Write};
use std::time::Instant;

/// The receive high-water mark of a watching subscriber, in messages: far above what a
/// reader that keeps up ever holds, so its own buffer never loses a message.
pub(crate) const RCVHWM: i32 = 1_000_000;

/// What a reader has seen so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Messages read.
    pub(crate) batches: u64,
    /// Events taken from them that passed the filter; the counts per type below add up to
    /// this.
    pub(crate) events: u64,
    /// Events read that the filter left out.
    pub(crate) filtered_out: u64,
    /// `stored` events.
    pub(crate) stored: u64,
    /// `removed` events.
    pub(crate) removed: u64,
    /// `cleared` events.
    pub(crate) cleared: u64,
    /// Events of no known type.
    pub(crate) other: u64,
    /// Sequence gaps after the first message: each is one or more lost numbers.
    pub(crate) gaps: u64,
    /// Sequence numbers those gaps skipped.
    pub(crate) missed: u64,
    /// Sequence numbers before the first message read: published before the reader joined.
    pub(crate) missed_before_first: u64,
    /// Times the sequence went back: the publisher restarted.
    pub(crate) restarts: u64,
    /// When the last event was taken.
    pub(crate) last_event_at: Option<Instant>,
}

/// Turns batches into printed lines and a [`Tally`].
#[derive(Debug)]
pub(crate) struct View {
    /// What was read so far.
    pub(crate) tally: Tally,
    show: Show,
    filter: Filter,
    /// Events printed so far, per [`EventType`].
    shown: [u64; 4],
    last_sequence: Option<u64>,
}

/// Which of the events it reads a watcher prints; it counts them all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Show {
    /// Every event.
    All,
    /// The first N of each event type.
    FirstOfEachType(u64),
}

/// The `event_type` of an event, as far as a reader knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Stored,
    Removed,
    Cleared,
    /// Anything else: a type this reader does not know, or none.
    Other,
}

impl EventType {
    fn of(event: &Value) -> EventType {
        wire::field(event, "event_type")
            .and_then(Value::as_str)
            .and_then(EventType::named)
            .unwrap_or(EventType::Other)
    }

    /// The type an `event_type` string names, if it is one of the three.
    fn named(name: &str) -> Option<EventType> {
        match name {
            "stored" => Some(EventType::Stored),
            "removed" => Some(EventType::Removed),
            "cleared" => Some(EventType::Cleared),
            _ => None,
        }
    }
}

/// Which events a reader prints and counts. Each list that is not empty must have a value
/// the event matches; empty lists match everything, so the default passes every event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Filter {
    /// `tenant_id` is one of these bytes (`str` and `bin` compare alike).
    pub(crate) tenants: Vec<Vec<u8>>,
    /// `event_type` is one of these.
    pub(crate) types: Vec<EventType>,
    /// `object_key` starts with one of these bytes. An event without a key (`cleared`)
    /// matches none.
    pub(crate) key_prefixes: Vec<Vec<u8>>,
}

impl Filter {
    /// Whether `event` passes.
    pub(crate) fn matches(&self, event: &Value) -> bool {
        let bytes = |key| wire::field(event, key).and_then(raw_bytes);
        (self.types.is_empty() || self.types.contains(&EventType::of(event)))
            && (self.tenants.is_empty()
                || bytes("tenant_id").is_some_and(|t| self.tenants.iter().any(|w| w == t)))
            && (self.key_prefixes.is_empty()
                || bytes("object_key")
                    .is_some_and(|k| self.key_prefixes.iter().any(|p| k.starts_with(p))))
    }

    /// Whether this filter lets every event through.
    pub(crate) fn passes_all(&self) -> bool {
        *self == Filter::default()
    }
}

/// The bytes of a `str` (valid UTF-8 or not) or `bin` value.
fn raw_bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::String(s) => Some(s.as_bytes()),
        Value::Binary(b) => Some(b),
        _ => None,
    }
}

impl View {
    /// A view that prints the events `show` selects and counts every event.
    pub(crate) fn new(show: Show) -> View {
        View::filtered(show, Filter::default())
    }

    /// A view that counts the events `filter` passes and prints those `show` selects.
    pub(crate) fn filtered(show: Show, filter: Filter) -> View {
        View {
            tally: Tally::default(),
            show,
            filter,
            shown: [0; 4],
            last_sequence: None,
        }
    }

    /// The sequence of the last message read, `None` before the first.
    pub(crate) fn last_sequence(&self) -> Option<u64> {
        self.last_sequence
    }

    /// Takes up to `limit` events of `batch` that pass the filter: notes on `err` how its
    /// sequence follows the previous one when it does not simply follow (filtered or not),
    /// prints the events this view shows on `out` (one JSON line each, flushed), and counts
    /// them. Returns how many it took.
    pub(crate) fn take(
        &mut self,
        batch: &Batch,
        limit: u64,
        out: &mut impl Write,
        err: &mut impl Write,
    ) -> io::Result<u64> {
        if let Some(note) = self.follow(batch) {
            writeln!(err, "kv-events: {note}")?;
        }
        let mut taken = 0;
        for event in &batch.events {
            if taken >= limit {
                break;
            }
            if !self.filter.matches(event) {
                self.tally.filtered_out += 1;
                continue;
            }
            let kind = EventType::of(event);
            *match kind {
                EventType::Stored => &mut self.tally.stored,
                EventType::Removed => &mut self.tally.removed,
                EventType::Cleared => &mut self.tally.cleared,
                EventType::Other => &mut self.tally.other,
            } += 1;
            let shown = &mut self.shown[kind as usize];
            let print = match self.show {
                Show::All => true,
                Show::FirstOfEachType(n) => *shown < n,
            };
            if print {
                *shown += 1;
                writeln!(out, "{}", event_line(batch.sequence, event))?;
                out.flush()?;
            }
            taken += 1;
        }
        self.tally.batches += 1;
        self.tally.events += taken;
        if taken > 0 {
            self.tally.last_event_at = Some(Instant::now());
        }
        Ok(taken)
    }

    /// Counts how `batch` follows the previous one; a sentence for people when it does not
    /// simply come next.
    fn follow(&mut self, batch: &Batch) -> Option<String> {
        let sequence = batch.sequence;
        let previous = self.last_sequence.replace(sequence);
        match batch.continuity {
            Continuity::Next => None,
            Continuity::First { missed: 0 } => None,
            Continuity::First { missed } => {
                self.tally.missed_before_first += missed;
                Some(format!(
                    "first message seen has sequence {sequence}: {missed} earlier sequence \
                     number{} went out before this subscriber joined",
                    plural(missed)
                ))
            }
            Continuity::Gap { missed } => {
                self.tally.gaps += 1;
                self.tally.missed += missed;
                Some(format!(
                    "gap of {missed} before sequence {sequence} (events dropped by the \
                     publisher, or messages lost)"
                ))
            }
            Continuity::Restart => {
                self.tally.restarts += 1;
                let after = previous.map_or_else(String::new, |p| format!(" after {p}"));
                Some(format!(
                    "restart: the sequence went back to {sequence}{after}: the publisher \
                     restarted, its subscribers' view of the store may be stale"
                ))
            }
        }
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// One event as a JSON line: its map (bytes that are not UTF-8 as `{"hex": ...}`) and the
/// `sequence` of the batch that carried it.
pub(crate) fn event_line(sequence: u64, event: &Value) -> String {
    let line = match wire::to_json(event) {
        serde_json::Value::Object(mut map) => {
            map.insert("sequence".into(), sequence.into());
            serde_json::Value::Object(map)
        }
        other => serde_json::json!({ "event": other, "sequence": sequence }),
    };
    line.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, key: Value) -> Value {
        Value::Map(vec![
            (Value::from("event_type"), Value::from(kind)),
            (Value::from("object_key"), key),
        ])
    }

    fn batch(sequence: u64, continuity: Continuity, events: Vec<Value>) -> Batch {
        Batch {
            sequence,
            continuity,
            timestamp_ms: 1,
            dp_rank: 0,
            events,
        }
    }

    fn run(view: &mut View, batch: &Batch, limit: u64) -> (u64, String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let taken = view.take(batch, limit, &mut out, &mut err).unwrap();
        let text = |b| String::from_utf8(b).unwrap();
        (taken, text(out), text(err))
    }

    #[test]
    fn each_event_prints_as_one_json_line_with_its_sequence() {
        let mut view = View::new(Show::All);
        let b = batch(
            1,
            Continuity::First { missed: 0 },
            vec![
                event("stored", Value::from("k")),
                event("removed", Value::Binary(vec![0xff, 0x01])),
            ],
        );
        let (taken, out, err) = run(&mut view, &b, u64::MAX);
        assert_eq!((taken, err.as_str()), (2, ""));
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines,
            [
                serde_json::json!({"event_type": "stored", "object_key": "k", "sequence": 1}),
                serde_json::json!({"event_type": "removed", "object_key": {"hex": "ff01"},
                                   "sequence": 1}),
            ]
        );
        assert_eq!((view.tally.stored, view.tally.removed), (1, 1));
    }

    #[test]
    fn a_limit_takes_part_of_a_batch() {
        let mut view = View::new(Show::All);
        let events = vec![event("stored", Value::from("k")); 3];
        let (taken, out, _) = run(&mut view, &batch(1, Continuity::Next, events), 2);
        assert_eq!((taken, out.lines().count()), (2, 2));
        assert_eq!((view.tally.events, view.tally.batches), (2, 1));
    }

    #[test]
    fn showing_the_first_of_each_type_still_counts_them_all() {
        let mut view = View::new(Show::FirstOfEachType(1));
        let events = vec![
            event("stored", Value::from("a")),
            event("stored", Value::from("b")),
            event("cleared", Value::Nil),
        ];
        let (taken, out, _) = run(&mut view, &batch(1, Continuity::Next, events), u64::MAX);
        assert_eq!((taken, out.lines().count()), (3, 2));
        assert_eq!((view.tally.stored, view.tally.cleared), (2, 1));
    }

    #[test]
    fn gaps_late_joins_and_restarts_are_noted_and_counted() {
        let mut view = View::new(Show::FirstOfEachType(0));
        let one = || vec![event("stored", Value::from("k"))];
        let (_, _, err) = run(
            &mut view,
            &batch(5, Continuity::First { missed: 4 }, one()),
            9,
        );
        assert!(err.contains("sequence 5: 4 earlier"), "{err}");
        let (_, _, err) = run(&mut view, &batch(6, Continuity::Next, one()), 9);
        assert_eq!(err, "");
        let (_, _, err) = run(
            &mut view,
            &batch(9, Continuity::Gap { missed: 2 }, one()),
            9,
        );
        assert!(err.contains("gap of 2 before sequence 9"), "{err}");
        let (_, _, err) = run(&mut view, &batch(1, Continuity::Restart, one()), 9);
        assert!(
            err.contains("restart: the sequence went back to 1 after 9"),
            "{err}"
        );
        let t = &view.tally;
        assert_eq!(
            (t.missed_before_first, t.gaps, t.missed, t.restarts),
            (4, 1, 2, 1)
        );
    }

    fn event_of(kind: &str, tenant: Value, key: Option<Value>) -> Value {
        let mut map = vec![
            (Value::from("event_type"), Value::from(kind)),
            (Value::from("tenant_id"), tenant),
        ];
        map.extend(key.map(|k| (Value::from("object_key"), k)));
        Value::Map(map)
    }

    #[test]
    fn filters_match_tenant_type_and_key_prefix_by_bytes() {
        let stored_a = event_of("stored", Value::from("a"), Some(Value::from("p/1")));
        let removed_bin = event_of(
            "removed",
            Value::Binary(b"a".to_vec()),
            Some(Value::Binary(b"p/\xff".to_vec())),
        );
        let cleared_b = event_of("cleared", Value::from("b"), None);
        let filter = |tenants: &[&str], types: &[EventType], prefixes: &[&[u8]]| Filter {
            tenants: tenants.iter().map(|t| t.as_bytes().to_vec()).collect(),
            types: types.to_vec(),
            key_prefixes: prefixes.iter().map(|p| p.to_vec()).collect(),
        };
        let passes = |f: &Filter| -> Vec<bool> {
            [&stored_a, &removed_bin, &cleared_b]
                .iter()
                .map(|e| f.matches(e))
                .collect()
        };
        assert_eq!(passes(&Filter::default()), [true, true, true]);
        assert_eq!(passes(&filter(&["a"], &[], &[])), [true, true, false]);
        assert_eq!(passes(&filter(&["a", "b"], &[], &[])), [true, true, true]);
        assert_eq!(
            passes(&filter(&[], &[EventType::Removed, EventType::Cleared], &[])),
            [false, true, true]
        );
        // A bin key compares by its bytes; cleared has no key.
        assert_eq!(passes(&filter(&[], &[], &[b"p/"])), [true, true, false]);
        assert_eq!(
            passes(&filter(&[], &[], &[b"p/\xff"])),
            [false, true, false]
        );
        assert_eq!(
            passes(&filter(&[], &[], &[b"q", b"p/1"])),
            [true, false, false]
        );
        assert_eq!(
            passes(&filter(&["a"], &[EventType::Stored], &[b"p"])),
            [true, false, false]
        );
    }

    #[test]
    fn filtering_counts_only_matching_events_and_still_notes_gaps() {
        let filter = Filter {
            types: vec![EventType::Cleared],
            ..Filter::default()
        };
        let mut view = View::filtered(Show::All, filter);
        let events = vec![
            event("stored", Value::from("k")),
            event("cleared", Value::Nil),
            event("removed", Value::from("k")),
            event("cleared", Value::Nil),
            event("cleared", Value::Nil),
        ];
        // The limit counts matching events only: the second cleared is the last taken.
        let (taken, out, _) = run(&mut view, &batch(1, Continuity::Next, events), 2);
        assert_eq!((taken, out.lines().count()), (2, 2));
        assert!(out.lines().all(|l| l.contains("\"cleared\"")), "{out}");
        assert_eq!((view.tally.events, view.tally.filtered_out), (2, 2));
        // Nothing in this batch matches, and its gap is still said.
        let stored = vec![event("stored", Value::from("k"))];
        let (taken, out, err) = run(
            &mut view,
            &batch(5, Continuity::Gap { missed: 3 }, stored),
            u64::MAX,
        );
        assert_eq!((taken, out.as_str()), (0, ""));
        assert!(err.contains("gap of 3 before sequence 5"), "{err}");
        assert_eq!((view.tally.gaps, view.last_sequence()), (1, Some(5)));
    }
}
