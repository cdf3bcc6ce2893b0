//! `kv_events_reannounce_remaining` (docs/spec.md section 3): off, `on_medium_delta`
//! publishes `removed` for what went and `stored` for what came; on, a call that removes a
//! medium stores every medium of `after`, after its `removed`, in the same message, from any
//! number of threads. A reannounced `stored` counts as adding a medium for RemoveAll's
//! `cleared`, and a per-medium follower still ends exact. Read on a real SUB socket, decoded
//! with rmpv.

use kv_events_testing as common;
use kv_events_testing::model;

use common::{assert_silent, connected, read_events};
use model::{converge, Model};
use mooncake_kv_events::subscriber::{Batch, FollowOptions, Follower, Upstream};
use mooncake_kv_events::wire::field;
use mooncake_kv_events::{Config, Medium, MediumSet, Publisher};
use rmpv::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const NONE: MediumSet = MediumSet::EMPTY;
const CPU: MediumSet = MediumSet::EMPTY.with(Medium::Cpu);
const DISK: MediumSet = MediumSet::EMPTY.with(Medium::Disk);
const BOTH: MediumSet = CPU.with(Medium::Disk);

fn config(reannounce_remaining: bool) -> Config {
    Config {
        reannounce_remaining,
        ..common::config("")
    }
}

fn text<'v>(event: &'v Value, name: &str) -> &'v str {
    field(event, name)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{name} is not a str in {event}"))
}

/// "removed cpu k": an event as one line.
fn summary(event: &Value) -> String {
    match text(event, "event_type") {
        "cleared" => format!("cleared {}", text(event, "tenant_id")),
        kind => format!(
            "{kind} {} {}",
            text(event, "medium"),
            text(event, "object_key")
        ),
    }
}

/// Each message's sequence and events, as lines.
fn messages(batches: &[Batch]) -> Vec<(u64, Vec<String>)> {
    batches
        .iter()
        .map(|b| (b.sequence, b.events.iter().map(summary).collect()))
        .collect()
}

/// Makes each delta of `calls` on key "k", flushed alone so that each call is a message of
/// its own, and returns the messages that came.
fn each_alone(reannounce: bool, calls: &[(MediumSet, MediumSet)]) -> Vec<(u64, Vec<String>)> {
    let (publisher, mut sub) = connected(config(reannounce));
    let mut events = 0;
    for (before, after) in calls {
        publisher.on_medium_delta("t", "k", "g", *before, *after);
        assert!(publisher.flush(Duration::from_secs(10)), "flush");
        events += expected(reannounce, *before, *after).len();
    }
    let got = messages(&read_events(&publisher, &mut sub, events));
    assert_silent(&mut sub);
    got
}

/// What the rule says one delta of key "k" publishes, as lines: `removed` of what went,
/// then `stored` of what came, or with reannounce and something removed, of all that is left.
fn expected(reannounce: bool, before: MediumSet, after: MediumSet) -> Vec<String> {
    let removed = before.minus(after);
    let stored = if reannounce && !removed.is_empty() {
        after
    } else {
        after.minus(before)
    };
    let lines = |kind: &str, set: MediumSet| -> Vec<String> {
        set.iter()
            .map(|m| format!("{kind} {} k", m.as_str()))
            .collect()
    };
    [lines("removed", removed), lines("stored", stored)].concat()
}

fn lines(lines: &[&str]) -> Vec<String> {
    lines.iter().map(|l| (*l).to_owned()).collect()
}

#[test]
fn without_reannounce_a_removal_publishes_only_the_medium_that_went() {
    assert_eq!(
        each_alone(false, &[(BOTH, DISK)]),
        [(0, lines(&["removed cpu k"]))]
    );
}

#[test]
fn with_reannounce_a_removal_is_followed_by_a_stored_of_each_medium_left_in_one_message() {
    assert_eq!(
        each_alone(true, &[(BOTH, DISK), (BOTH, CPU), (DISK, CPU)]),
        [
            (0, lines(&["removed cpu k", "stored disk k"])),
            (1, lines(&["removed disk k", "stored cpu k"])),
            (2, lines(&["removed disk k", "stored cpu k"])),
        ]
    );
}

#[test]
fn with_reannounce_a_removal_of_the_last_medium_or_an_addition_reannounces_nothing() {
    assert_eq!(
        each_alone(
            true,
            &[(CPU, NONE), (CPU, BOTH), (BOTH, NONE), (BOTH, BOTH)]
        ),
        [
            (0, lines(&["removed cpu k"])),
            (1, lines(&["stored disk k"])),
            (2, lines(&["removed cpu k", "removed disk k"])),
        ]
    );
    // A commit announces every medium, reannounce or not.
    let (publisher, mut sub) = connected(config(true));
    publisher.on_put_commit("t", "k", "g", BOTH);
    let got = messages(&read_events(&publisher, &mut sub, 2));
    assert_eq!(got, [(0, lines(&["stored cpu k", "stored disk k"]))]);
}

#[test]
fn every_delta_publishes_what_the_rule_says_with_reannounce_and_without() {
    let sets = [NONE, CPU, DISK, BOTH];
    for reannounce in [false, true] {
        let calls: Vec<(MediumSet, MediumSet)> = sets
            .iter()
            .flat_map(|b| sets.iter().map(move |a| (*b, *a)))
            .collect();
        let got = each_alone(reannounce, &calls);
        let want: Vec<Vec<String>> = calls
            .iter()
            .map(|(b, a)| expected(reannounce, *b, *a))
            .filter(|events| !events.is_empty())
            .collect();
        let sequences: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
        assert_eq!(sequences, (0..want.len() as u64).collect::<Vec<_>>());
        let got: Vec<Vec<String>> = got.into_iter().map(|(_, events)| events).collect();
        assert_eq!(got, want, "reannounce={reannounce}");
    }
}

#[test]
fn with_reannounce_each_calls_events_stay_together_from_four_threads() {
    const THREADS: usize = 4;
    const CALLS: usize = 2000;
    // Deltas that remove a medium and keep one, and others, in turn.
    const DELTAS: [(MediumSet, MediumSet); 6] = [
        (BOTH, DISK),
        (BOTH, CPU),
        (DISK, CPU),
        (CPU, NONE),
        (CPU, BOTH),
        (BOTH, NONE),
    ];
    let (publisher, mut sub) = connected(config(true));
    let publisher = Arc::new(publisher);
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let publisher = Arc::clone(&publisher);
            std::thread::spawn(move || {
                for i in 0..CALLS {
                    let (before, after) = DELTAS[(i + t) % DELTAS.len()];
                    publisher.on_medium_delta("t", format!("{t}-{i}"), "g", before, after);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let total: usize = (0..THREADS)
        .flat_map(|t| (0..CALLS).map(move |i| DELTAS[(i + t) % DELTAS.len()]))
        .map(|(before, after)| expected(true, before, after).len())
        .sum();
    let batches = read_events(&publisher, &mut sub, total);
    assert_silent(&mut sub);

    // Every event in stream order, with the message it came in; by key (one call each), the
    // positions of its events.
    let mut stream = Vec::new();
    for (n, batch) in batches.iter().enumerate() {
        assert_eq!(batch.sequence, n as u64, "no gap");
        for event in &batch.events {
            stream.push((n, event));
        }
    }
    let mut calls: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut event_ids = Vec::new();
    for (at, (_, event)) in stream.iter().enumerate() {
        calls
            .entry(text(event, "object_key").to_owned())
            .or_default()
            .push(at);
        event_ids.push(field(event, "event_id").and_then(Value::as_u64).unwrap());
    }
    assert_eq!(event_ids, (1..=total as u64).collect::<Vec<_>>());
    assert_eq!(calls.len(), THREADS * CALLS);
    let mut last_of_thread = [None; THREADS];
    for t in 0..THREADS {
        for i in 0..CALLS {
            let key = format!("{t}-{i}");
            let (before, after) = DELTAS[(i + t) % DELTAS.len()];
            let at = &calls[&key];
            let got: Vec<String> = at
                .iter()
                .map(|&p| summary(stream[p].1).replace(&key, "k"))
                .collect();
            assert_eq!(got, expected(true, before, after), "call {key}");
            // Contiguous, in one message, after the thread's call before it.
            assert!(
                at.windows(2).all(|w| w[1] == w[0] + 1),
                "call {key}: {at:?}"
            );
            assert!(
                at.iter().all(|&p| stream[p].0 == stream[at[0]].0),
                "call {key} is in two messages"
            );
            assert!(last_of_thread[t] < Some(at[0]), "call {key} out of order");
            last_of_thread[t] = Some(at[0]);
        }
    }
    let stats = publisher.stats();
    assert_eq!(stats.published_events, total as u64);
    assert_eq!(stats.dropped_events, 0);
    eprintln!(
        "{THREADS} threads x {CALLS} calls: {total} events in {} messages",
        batches.len()
    );
}

#[test]
fn a_reannounced_stored_during_a_remove_all_suppresses_the_tenants_cleared() {
    for reannounce in [false, true] {
        let (publisher, mut sub) = connected(config(reannounce));
        publisher.on_put_commit("t", "k", "g", BOTH);
        publisher.on_put_commit("t", "j", "g", CPU);
        let scan = publisher.begin_remove_all();
        // During the scan, a removal that leaves the object on disk: with reannounce, its
        // `stored disk` is taken for an addition, which no `cleared` may follow.
        publisher.on_medium_delta("t", "k", "g", BOTH, DISK);
        publisher.on_medium_delta("t", "j", "g", CPU, NONE);
        publisher.on_remove_all(&scan, "t", 1, 0);
        let mut want = vec![
            "stored cpu k",
            "stored disk k",
            "stored cpu j",
            "removed cpu k",
        ];
        if reannounce {
            want.push("stored disk k");
        }
        want.push("removed cpu j");
        if !reannounce {
            // A removal alone adds nothing: the clean scan clears the tenant.
            want.push("cleared t");
        }
        let batches = read_events(&publisher, &mut sub, want.len());
        let got: Vec<String> = batches
            .iter()
            .flat_map(|b| b.events.iter().map(summary))
            .collect();
        assert_eq!(got, lines(&want), "reannounce={reannounce}");
        assert_silent(&mut sub);
        assert_eq!(
            publisher.stats().cleared_suppressed,
            u64::from(reannounce),
            "reannounce={reannounce}"
        );
    }
}

#[test]
fn with_reannounce_a_follower_keeps_exactly_the_masters_media() {
    let model = Model::new();
    let (pub_endpoint, replay_endpoint) = (common::endpoint(), common::endpoint());
    let publisher = Publisher::create(&Config {
        reannounce_remaining: true,
        ..model::config(&pub_endpoint, &replay_endpoint)
    })
    .expect("the publisher binds");
    model.serve(&publisher);
    model.churn(&publisher, 1, 3000, 500);
    assert!(publisher.flush(Duration::from_secs(10)));
    let options = FollowOptions {
        request_timeout: Duration::from_secs(2),
        retry_after: Duration::from_millis(200),
        quiet_check: Duration::from_millis(300),
        ..FollowOptions::default()
    };
    let mut follower =
        Follower::new(vec![Upstream::new(pub_endpoint, replay_endpoint)], options).unwrap();
    converge(&mut follower, 0, &model, Duration::from_secs(30));
    model.churn(&publisher, 2, 3000, 500);
    model.remove_all(&publisher, b"tenant-1");
    assert!(publisher.flush(Duration::from_secs(10)));
    converge(&mut follower, 0, &model, Duration::from_secs(30));
    let counters = follower.counters();
    assert_eq!(counters.malformed, 0, "{counters:?}");
    assert_eq!(counters.snapshots, 1, "{counters:?}");
}
