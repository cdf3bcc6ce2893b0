//! What an operator reads and tries: a name NATS would refuse is refused before anything is
//! made, a stream of the same name with other subjects is named with its subjects, two
//! deployments on one account do not collide (`--stream`, `--subject-prefix`), and a NATS
//! outage says that NATS, at which URL, is unreachable, once, and that it answers again;
//! the bucket's delete markers are purged once old.
//! Each test has its own server, ports and files.

mod common;

use common::{assert_exact, said, truth, wait_for, Master, Nats, TempDir};
use std::time::Duration;

/// The streams of the NATS server at `url`, with their subjects and message counts.
fn streams(url: &str) -> Vec<(String, Vec<String>, u64)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        use futures::StreamExt;
        let client = async_nats::connect(url).await.expect("NATS");
        let context = async_nats::jetstream::new(client);
        let mut out = Vec::new();
        let mut infos = context.streams();
        while let Some(info) = infos.next().await {
            let info = info.expect("a stream's info");
            out.push((info.config.name, info.config.subjects, info.state.messages));
        }
        out.sort();
        out
    })
}

#[test]
fn a_name_nats_would_refuse_is_refused_before_anything_is_made() {
    let dir = TempDir::new("relay-long-name");
    let nats = Nats::start(&dir.0);
    let master = Master::new();
    let log = dir.path("relay.log");
    let long = "b".repeat(300);
    let relay = master.relay_with(&nats, &log, &["--bucket", &long]);
    let status = { relay }.0.wait().unwrap();
    assert_eq!(status.code(), Some(2), "a usage error\n{}", said(&log));
    assert!(
        said(&log).contains("--bucket: 300 characters"),
        "{}",
        said(&log)
    );
    assert!(streams(&nats.url()).is_empty(), "nothing was made");
}

#[test]
fn a_stream_of_that_name_with_other_subjects_is_named_with_its_subjects() {
    let dir = TempDir::new("relay-other-stream");
    let nats = Nats::start(&dir.0);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let client = async_nats::connect(nats.url()).await.expect("NATS");
        async_nats::jetstream::new(client)
            .create_stream(async_nats::jetstream::stream::Config {
                name: "KV_EVENTS".into(),
                subjects: vec!["orders.>".into()],
                ..Default::default()
            })
            .await
            .expect("another application's stream");
    });
    let master = Master::new();
    let expected = dir.path("truth.json");
    let demo = master.demo(100, 1000, 8.0, &expected);
    let log = dir.path("relay.log");
    let relay = master.relay_with(&nats, &log, &[]);
    let status = { relay }.0.wait().unwrap();
    let text = said(&log);
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(
        text.contains(r#"the stream KV_EVENTS exists with the subjects ["orders.>"]"#)
            && text.contains("--subject-prefix"),
        "{text}"
    );
    assert!(!text.contains("consumer"), "{text}");
    drop(demo);
}

#[test]
fn two_deployments_on_one_account_do_not_collide() {
    let dir = TempDir::new("relay-two-deployments");
    let nats = Nats::start(&dir.0);
    // Two masters with the same backend id (both demos say `demo-store`).
    let (one, two) = (Master::new(), Master::new());
    let (expected, other) = (dir.path("truth.json"), dir.path("other.json"));
    let demos = [
        one.demo(3000, 3000, 4.0, &expected),
        two.demo(2000, 3000, 4.0, &other),
    ];
    let (log, other_log) = (dir.path("one.log"), dir.path("two.log"));
    let first = one.relay_with(&nats, &log, &[]);
    let second = two.relay_with(
        &nats,
        &other_log,
        &[
            "--stream",
            "KV_EVENTS_B",
            "--subject-prefix",
            "b.kv-events",
            "--snapshots",
            "kv-events-snapshots-b",
        ],
    );
    for demo in demos {
        assert_eq!({ demo }.0.wait().unwrap().code(), Some(0));
    }
    // The first deployment's log is its master's alone.
    assert_exact(&nats, &truth(&expected), &[&log, &other_log]);
    assert!(
        wait_for(Duration::from_secs(30), || said(&other_log)
            .contains("b.kv-events.demo-store")),
        "{}",
        said(&other_log)
    );
    let streams = streams(&nats.url());
    let subjects: Vec<(&str, &[String])> = streams
        .iter()
        .map(|(name, subjects, _)| (name.as_str(), subjects.as_slice()))
        .collect();
    assert!(
        subjects.contains(&("KV_EVENTS", &["kv-events.>".to_owned()][..]))
            && subjects.contains(&("KV_EVENTS_B", &["b.kv-events.>".to_owned()][..])),
        "{streams:?}"
    );
    assert!(
        streams
            .iter()
            .any(|(name, _, messages)| name == "KV_EVENTS_B" && *messages > 0),
        "{streams:?}"
    );
    drop((first, second));
}

#[test]
fn a_nats_outage_says_which_nats_is_unreachable_once_and_when_it_is_back() {
    let dir = TempDir::new("relay-outage");
    let mut nats = Nats::start(&dir.0);
    let master = Master::new();
    let expected = dir.path("truth.json");
    let demo = master.demo(4000, 1000, 6.0, &expected);
    let log = dir.path("relay.log");
    let relay = master.relay_with(&nats, &log, &[]);
    std::thread::sleep(Duration::from_millis(1500));
    // Down for 6 s: several retries, one message.
    nats.restart(Duration::from_secs(6));
    assert_eq!({ demo }.0.wait().unwrap().code(), Some(0));
    assert_exact(&nats, &truth(&expected), &[&log]);
    let text = said(&log);
    let url = nats.url();
    assert!(
        text.contains(&format!("NATS at {url}: connection lost")),
        "{text}"
    );
    let failing = text.matches(&format!("NATS at {url} failing")).count()
        + text
            .matches(&format!("NATS at {url} still failing"))
            .count();
    assert!((1..=3).contains(&failing), "said {failing} times\n{text}");
    assert!(
        text.contains(&format!("NATS at {url} answers again")),
        "{text}"
    );
    assert!(text.contains("races lost 0, takeovers 0"), "{text}");
    drop(relay);
}

#[test]
fn the_buckets_delete_markers_are_purged_once_old() {
    let dir = TempDir::new("relay-markers");
    let nats = Nats::start(&dir.0);
    let master = Master::new();
    let expected = dir.path("truth.json");
    let demo = master.demo(4000, 2000, 5.0, &expected);
    let log = dir.path("relay.log");
    let relay = master.relay_with(
        &nats,
        &log,
        &["--bucket", "kv-events", "--bucket-marker-age", "1"],
    );
    assert_eq!({ demo }.0.wait().unwrap().code(), Some(0));
    let truth = truth(&expected);
    assert_exact(&nats, &truth, &[&log]);
    // Only values are left: one message per object present, no marker (with the default
    // of 600 s, 3,999 messages for 960 objects).
    let bucket = |streams: &[(String, Vec<String>, u64)]| {
        streams
            .iter()
            .find(|(name, _, _)| name == "KV_kv-events")
            .map(|s| s.2)
    };
    let streams = streams(&nats.url());
    eprintln!(
        "bucket stream messages {:?}, objects {}",
        bucket(&streams),
        truth.len()
    );
    assert_eq!(bucket(&streams), Some(truth.len() as u64), "{streams:?}");
    drop(relay);
}
