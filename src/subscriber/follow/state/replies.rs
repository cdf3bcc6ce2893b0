//! What the replay socket's answers mean: `info`, a replay, a snapshot, an error; and what the
//! state asks next.

use super::{Action, Ask, FollowerState, Purpose};
use crate::subscriber::follow::notice::NoticeKind;
use crate::subscriber::index::{json_bytes, Index};
use crate::wire::replay::verb;
use crate::wire::{Checked, Info, Replayed, Request, SnapshotEnd};
use std::ops::Deref;
use std::time::{Duration, Instant};

impl<M: Deref<Target = [u8]>> FollowerState<M> {
    fn malformed_reply(&mut self, why: String) {
        self.counters.malformed += 1;
        self.notice(NoticeKind::Malformed(why));
    }

    /// A reply from the replay socket, its frames as a DEALER reads them (the empty
    /// delimiter first).
    pub(in crate::subscriber::follow) fn on_reply(
        &mut self,
        frames: &[Vec<u8>],
        now: Instant,
    ) -> Vec<Action> {
        self.last_heard = Some(now);
        self.asked_at = now;
        let endpoint = self.replay_endpoint.clone().unwrap_or_default();
        let shape = |frames: &[Vec<u8>]| {
            format!(
                "{endpoint} sent a reply of {} frames that is not the protocol's",
                frames.len()
            )
        };
        let rest = match frames.split_first() {
            Some((delimiter, rest)) if delimiter.is_empty() => rest,
            _ => {
                self.malformed_reply(shape(frames));
                return self.actions();
            }
        };
        let Some(ask) = self.asking.take() else {
            self.malformed_reply(format!("{endpoint} sent a reply nobody asked for"));
            return self.actions();
        };
        match (ask, rest) {
            (ask, [head, text]) if head.as_slice() == verb::ERROR => {
                if matches!(ask, Ask::Snapshot { .. }) {
                    self.snapshot_due = true;
                }
                let what = ask.what();
                let text = String::from_utf8_lossy(text);
                self.fail(format!("{what} from {endpoint}: {text}"), now);
            }
            (Ask::Info(purpose), [head, body]) if head.as_slice() == verb::INFO => {
                match Info::decode(body) {
                    Ok(info) => {
                        self.failing = None;
                        self.on_info(&info, purpose, now);
                    }
                    Err(e) => {
                        self.counters.malformed += 1;
                        self.fail(e.to_string(), now);
                    }
                }
            }
            (
                Ask::Replay {
                    from,
                    until,
                    started,
                },
                rest,
            ) if Replayed::read(rest).is_some() => {
                self.failing = None;
                match Replayed::read(rest) {
                    Some(Replayed::Message { sequence, payload }) => {
                        self.asking = Some(Ask::Replay {
                            from,
                            until,
                            started,
                        });
                        self.on_replayed(sequence, payload, until);
                    }
                    _ => self.end_replay(from, until, now.duration_since(started)),
                }
            }
            (
                Ask::Snapshot {
                    mut staged,
                    mut events,
                    started,
                    mut bad,
                },
                [head, payload],
            ) if head.as_slice() == verb::SNAPSHOT => {
                self.failing = None;
                match Checked::new(vec![&[][..], &[0u8; 8][..], payload.as_slice()]) {
                    Ok(page) => {
                        for event in page.changes() {
                            events += 1;
                            if let Err(why) = staged.apply_change(&event) {
                                bad.get_or_insert(format!("a snapshot event: {why}"));
                            }
                        }
                    }
                    Err(e) => {
                        bad.get_or_insert(format!("a snapshot page: {e}"));
                    }
                }
                self.asking = Some(Ask::Snapshot {
                    staged,
                    events,
                    started,
                    bad,
                });
            }
            (
                Ask::Snapshot {
                    staged,
                    events,
                    started,
                    bad,
                },
                [head, body],
            ) if head.as_slice() == verb::SNAPSHOT_END => {
                self.end_snapshot(staged, events, started, bad, body, now);
            }
            (ask, rest) => {
                self.asking = Some(ask);
                self.malformed_reply(shape(rest));
            }
        }
        self.actions()
    }

    fn on_info(&mut self, info: &Info, purpose: Purpose, now: Instant) {
        if let Some(old) = self.incarnation.filter(|old| *old != info.incarnation) {
            self.counters.incarnations += 1;
            self.notice(NoticeKind::NewIncarnation {
                old,
                new: info.incarnation,
            });
            self.incarnation = Some(info.incarnation);
            self.restart(now);
            // What the stream delivers from now on is the new life's.
            self.stream_last = None;
            return;
        }
        let Some(next) = self.next_sequence else {
            return;
        };
        let (from, until) = match purpose {
            Purpose::Gap { from, until } => (from, until),
            Purpose::Quiet => {
                let seen = self.stream_last.map_or(0, |last| last + 1).max(next);
                let promised = self.promised.take();
                if info.next_sequence <= seen || !self.held.is_empty() {
                    return;
                }
                // A reply ahead of the stream may be ahead of this reader only: after a
                // stall, the messages still wait in its socket. The end of a burst was lost
                // when the next check finds the stream short of what this one was told.
                if promised.is_none_or(|promised| seen >= promised) {
                    self.promised = Some(info.next_sequence);
                    return;
                }
                // No later message would show the loss.
                self.counters.gaps += 1;
                self.gap_counted = Some(next);
                self.incident.get_or_insert(now);
                (next, info.next_sequence)
            }
        };
        // An empty buffer says its oldest is the next sequence, beyond any gap.
        if info.oldest_sequence <= from {
            let replay = Ask::Replay {
                from,
                until,
                started: now,
            };
            self.send(Request::Replay { from }, replay, now);
        } else {
            self.notice(NoticeKind::NotHeld {
                from,
                through: until - 1,
                oldest: info.oldest_sequence,
            });
            self.snapshot_due = true;
        }
    }

    /// One replayed message: applied if it follows the index and is within what was asked.
    fn on_replayed(&mut self, sequence: &[u8], payload: &[u8], until: u64) {
        let Some(next) = self.next_sequence else {
            return;
        };
        let number = u64::from_be_bytes(sequence.try_into().unwrap_or_default());
        if number != next || number >= until {
            // Already held, beyond the gap (the stream brings it), or after a hole: the
            // end of the replay finds the hole.
            return;
        }
        match Checked::new(vec![&[][..], sequence, payload]) {
            Ok(message) => {
                self.apply(&message);
                self.counters.replayed_messages += 1;
            }
            Err(e) => self.malformed_reply(format!("a replayed message: {e}")),
        }
    }

    fn end_replay(&mut self, from: u64, until: u64, took: Duration) {
        let next = self.next_sequence.unwrap_or(0);
        if next >= until {
            self.counters.replays += 1;
            self.notice(NoticeKind::Replayed {
                from,
                through: until - 1,
                took,
            });
            self.drain();
        } else {
            self.notice(NoticeKind::ReplayShort {
                from,
                through: until - 1,
                next,
            });
            self.snapshot_due = true;
        }
    }

    /// The end of a snapshot: checked against what arrived, then the index.
    fn end_snapshot(
        &mut self,
        staged: Index,
        events: u64,
        started: Instant,
        bad: Option<String>,
        body: &[u8],
        now: Instant,
    ) {
        let end = SnapshotEnd::decode(body)
            .map_err(|e| e.to_string())
            .and_then(|end| match bad {
                Some(why) => Err(why),
                None if end.tenant.is_some() => Err(format!(
                    "a snapshot of tenant {} when every tenant was asked for",
                    json_bytes(end.tenant.as_deref().unwrap_or_default())
                )),
                None if end.events != events || end.objects != staged.objects() as u64 => {
                    Err(format!(
                        "a snapshot announced {} events and {} objects; {events} events and {} \
                     objects arrived",
                        end.events,
                        end.objects,
                        staged.objects()
                    ))
                }
                None => Ok(end),
            });
        let end = match end {
            Ok(end) => end,
            Err(why) => {
                self.counters.malformed += 1;
                self.snapshot_due = true;
                let endpoint = self.replay_endpoint.clone().unwrap_or_default();
                self.fail(format!("a snapshot from {endpoint}: {why}"), now);
                return;
            }
        };
        if let Some(old) = self.incarnation.filter(|old| *old != end.incarnation) {
            if !self.restart_counted {
                self.counters.incarnations += 1;
            }
            self.notice(NoticeKind::NewIncarnation {
                old,
                new: end.incarnation,
            });
        }
        self.restart_counted = false;
        self.incarnation = Some(end.incarnation);
        self.next_sequence = Some(end.next_sequence);
        self.replace_index(staged);
        self.snapshot_due = false;
        self.gap_counted = None;
        self.counters.snapshots += 1;
        self.notice(NoticeKind::Snapshot {
            objects: self.index.objects(),
            events,
            next_sequence: end.next_sequence,
            incarnation: end.incarnation,
            took: now.duration_since(started),
        });
        // The stream delivered N or an earlier message: whatever it then lacks was lost on
        // the way (not sent before this reader subscribed).
        let delivered_n = self
            .held
            .keys()
            .next()
            .is_some_and(|&first| first <= end.next_sequence);
        self.drain();
        // What the stream holds next does not follow the index: replay what came between.
        let from = self.next_sequence.unwrap_or(end.next_sequence);
        if let Some(&head) = self.held.keys().next() {
            if delivered_n {
                self.counters.gaps += 1;
                self.gap_counted = Some(from);
                self.incident.get_or_insert(now);
            }
            let replay = Ask::Replay {
                from,
                until: head,
                started: now,
            };
            self.send(Request::Replay { from }, replay, now);
        }
    }
}
