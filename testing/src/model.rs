//! A master in miniature for the follower's tests: the objects it holds (the truth), every
//! change announced to a publisher under the lock that guards them, and an object source
//! that copies them under the same lock, as a real master's shards do.

use mooncake_kv_events::subscriber::Index;
use mooncake_kv_events::subscriber::{Follower, Notice};
use mooncake_kv_events::{Config, MediumSet, Publisher, Snapshot};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Object = (Vec<u8>, Vec<u8>);

/// The master's objects; clones share them (a master whose publisher is replaced keeps its
/// metadata).
#[derive(Clone, Default)]
pub struct Model {
    objects: Arc<Mutex<BTreeMap<Object, MediumSet>>>,
}

impl Model {
    /// A master holding no object.
    pub fn new() -> Model {
        Model::default()
    }

    /// Registers this model as `publisher`'s object source.
    pub fn serve(&self, publisher: &Publisher) {
        let objects = Arc::clone(&self.objects);
        publisher.set_object_source(move |tenant: Option<&[u8]>, out: &mut Snapshot| {
            let copied: Vec<(Object, MediumSet)> = objects
                .lock()
                .unwrap()
                .iter()
                .filter(|((t, _), _)| tenant.is_none_or(|want| want == t.as_slice()))
                .map(|(o, m)| (o.clone(), *m))
                .collect();
            for ((tenant, key), media) in copied {
                out.add(&tenant, &key, b"group", media)
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        });
    }

    /// Sets the media of (`tenant`, `key`) and announces the change; empty media remove it.
    pub fn set(&self, publisher: &Publisher, tenant: &[u8], key: &[u8], media: MediumSet) {
        let mut objects = self.objects.lock().unwrap();
        let object = (tenant.to_vec(), key.to_vec());
        let before = objects.get(&object).copied().unwrap_or(MediumSet::EMPTY);
        publisher.on_medium_delta(tenant, key, b"group", before, media);
        if media.is_empty() {
            objects.remove(&object);
        } else {
            objects.insert(object, media);
        }
    }

    /// A RemoveAll of `tenant`, as the master makes it: a `removed` per object, then the
    /// `cleared`.
    pub fn remove_all(&self, publisher: &Publisher, tenant: &[u8]) {
        let scan = publisher.begin_remove_all();
        let keys: Vec<Vec<u8>> = self
            .objects
            .lock()
            .unwrap()
            .keys()
            .filter(|(t, _)| t == tenant)
            .map(|(_, k)| k.clone())
            .collect();
        for key in &keys {
            self.set(publisher, tenant, key, MediumSet::EMPTY);
        }
        publisher.on_remove_all(&scan, tenant, keys.len() as u64, 0);
    }

    /// `changes` random changes over a few tenants and `keys` keys, from `seed`.
    pub fn churn(&self, publisher: &Publisher, seed: u64, changes: usize, keys: u64) {
        let mut rng = Rng::new(seed);
        for _ in 0..changes {
            let tenant = format!("tenant-{}", rng.below(3));
            let key = format!("key-{}", rng.below(keys));
            let media = MediumSet::from_bits(rng.below(4) as u8);
            self.set(publisher, tenant.as_bytes(), key.as_bytes(), media);
        }
    }

    /// What the master holds, as an index.
    pub fn truth(&self) -> Index {
        let objects = self.objects.lock().unwrap();
        objects
            .iter()
            .map(|((t, k), m)| (t.as_slice(), k.as_slice(), *m))
            .collect()
    }
}

/// A small seeded generator (xorshift64*), so that a failing seed can be run again.
pub struct Rng(u64);

impl Rng {
    /// The generator of `seed` (any value: it is spread and made odd, never zero).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next number, in `0..n` (`n` must not be 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// An enabled config with a replay socket.
pub fn config(endpoint: &str, replay_endpoint: &str) -> Config {
    Config {
        enable_kv_events: true,
        bind_endpoint: endpoint.to_owned(),
        replay_endpoint: replay_endpoint.to_owned(),
        backend_id: "store-a".into(),
        ..Config::default()
    }
}

/// Polls `follower` until publisher `upstream`'s index is in sync and equal to `model`'s
/// truth, and stays so for a moment; panics, with what happened, if it does not within
/// `within`. Returns the notices seen and how long it took.
pub fn converge(
    follower: &mut Follower,
    upstream: usize,
    model: &Model,
    within: Duration,
) -> (Vec<Notice>, Duration) {
    let started = Instant::now();
    let mut notices = Vec::new();
    let deadline = started + within;
    loop {
        notices.extend(follower.poll(Duration::from_millis(20)));
        if follower.status(upstream).in_sync && *follower.index(upstream) == model.truth() {
            let took = started.elapsed();
            // Still so once whatever was in flight arrived.
            let settle = Instant::now() + Duration::from_millis(300);
            while Instant::now() < settle {
                notices.extend(follower.poll(Duration::from_millis(20)));
            }
            if *follower.index(upstream) == model.truth() {
                return (notices, took);
            }
        }
        if Instant::now() >= deadline {
            let truth = model.truth();
            let index = follower.index(upstream);
            let missing: Vec<_> = truth
                .iter()
                .filter(|(t, k, m)| index.get(t, k) != *m)
                .take(5)
                .map(|(t, k, m)| {
                    format!(
                        "{}/{}: {m:?} held as {:?}",
                        String::from_utf8_lossy(t),
                        String::from_utf8_lossy(k),
                        index.get(t, k)
                    )
                })
                .collect();
            let extra: Vec<_> = index
                .iter()
                .filter(|(t, k, _)| truth.get(t, k).is_empty())
                .take(5)
                .map(|(t, k, m)| {
                    format!(
                        "{}/{}: {m:?}",
                        String::from_utf8_lossy(t),
                        String::from_utf8_lossy(k)
                    )
                })
                .collect();
            panic!(
                "publisher {upstream} did not converge within {within:?}: {} objects held, {} \
                 true; wrong: {missing:?}; extra: {extra:?}\nstatus: {:?}\ncounters: {:?}\n\
                 notices: {:#?}",
                index.objects(),
                truth.objects(),
                follower.status(upstream),
                follower.upstream_counters(upstream),
                notices.iter().rev().take(30).collect::<Vec<_>>()
            );
        }
    }
}
