//! The publisher counts its readers: the subscribers connected to the PUB socket now (a
//! connection whose handshake succeeded), and how many connected and disconnected since it
//! started, in `stats()`, `status_json()`, the metrics and the replay socket's `info`. A
//! connection to the replay socket, or one whose handshake is refused, is no subscriber.

use kv_events_testing::{
    config, curve_config, curve_keys, endpoint, eventually, keygen, raw_subscriber, TempDir,
};
use mooncake_kv_events::subscriber::ReplayClient;
use mooncake_kv_events::{Config, Publisher};
use std::time::Duration;

/// `subscribers`, `subscriber_connects`, `subscriber_disconnects`, as `stats()` says now.
fn readers(publisher: &Publisher) -> (u64, u64, u64) {
    let s = publisher.stats();
    (
        s.subscribers,
        s.subscriber_connects,
        s.subscriber_disconnects,
    )
}

#[test]
fn subscribers_are_counted_as_they_connect_and_disconnect() {
    let (bind, replay) = (endpoint(), endpoint());
    let publisher = Publisher::create(&Config {
        replay_endpoint: replay.clone(),
        ..config(&bind)
    })
    .expect("the publisher binds");
    assert_eq!(readers(&publisher), (0, 0, 0));

    let first = raw_subscriber(&bind, None);
    let second = raw_subscriber(&bind, None);
    assert!(
        eventually(|| readers(&publisher) == (2, 2, 0)),
        "{}",
        publisher.status_json()
    );
    // A replay client holds a connection, but reads no stream.
    let mut client = ReplayClient::connect(&replay, None).expect("the replay client connects");
    let info = client.info(Duration::from_secs(30)).expect("info");
    assert_eq!(
        (
            info.subscribers,
            info.subscriber_connects,
            info.subscriber_disconnects
        ),
        (2, 2, 0)
    );
    assert!(eventually(|| publisher.stats().connections == 3));
    assert_eq!(readers(&publisher), (2, 2, 0));

    drop(first);
    assert!(
        eventually(|| readers(&publisher) == (1, 2, 1)),
        "{}",
        publisher.status_json()
    );
    let status: serde_json::Value = serde_json::from_str(&publisher.status_json()).expect("JSON");
    assert_eq!(status["subscribers"], 1);
    assert_eq!(status["subscriber_connects"], 2);
    assert_eq!(status["subscriber_disconnects"], 1);
    let metrics = publisher.metrics_text();
    for line in [
        "\nmooncake_kv_events_subscribers 1\n",
        "\nmooncake_kv_events_subscriber_connects_total 2\n",
        "\nmooncake_kv_events_subscriber_disconnects_total 1\n",
    ] {
        assert!(metrics.contains(line), "{line:?} missing from\n{metrics}");
    }

    drop(second);
    drop(client);
    assert!(
        eventually(|| readers(&publisher) == (0, 2, 2)),
        "{}",
        publisher.status_json()
    );
    // Reconnecting is one more connect.
    let again = raw_subscriber(&bind, None);
    assert!(eventually(|| readers(&publisher) == (1, 3, 2)));
    drop(again);
    assert!(eventually(|| readers(&publisher) == (0, 3, 3)));
}

#[test]
fn a_refused_handshake_is_no_subscriber() {
    let dir = TempDir::new("readers-refused");
    let (server, allowed) = curve_keys(&dir.0, "indexer");
    let bind = endpoint();
    let publisher = Publisher::create(&curve_config(&bind, &dir.0)).expect("the publisher binds");
    // A key not on the allow-list: refused.
    let stranger = keygen(&dir.0, "stranger");
    let refused = raw_subscriber(&bind, Some((&server.public, &stranger)));
    assert!(eventually(|| publisher.stats().refused_handshakes == 1));
    drop(refused);
    assert!(eventually(|| publisher.stats().connections == 0));
    assert_eq!(readers(&publisher), (0, 0, 0));
    // With the allowed key: a subscriber.
    let admitted = raw_subscriber(&bind, Some((&server.public, &allowed)));
    assert!(eventually(|| readers(&publisher) == (1, 1, 0)));
    drop(admitted);
    assert!(eventually(|| readers(&publisher) == (0, 1, 1)));
    assert_eq!(publisher.stats().refused_handshakes, 1);
}
