//! The cost of one `on_put_commit` to the calling thread, with the publishing thread running,
//! against a baseline publisher of the usual design (a mutex-guarded deque and one condition
//! variable notify per call) measured in the same run, for each key shape of
//! `cpp_tests/bench/shapes.tsv` that never allocates (`cargo bench --bench hot_path`).
//!
//! Calls are timed in runs of 1,024 with the queue drained between runs (untimed), so the
//! figures are the steady state of a publisher that keeps up, not of one that drops.

use criterion::{criterion_main, BenchmarkId, Criterion};
use kv_events_testing::bench::{shapes, KeyShape};
use mooncake_kv_events::{Medium, MediumSet, Publisher};
use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const RUN: u64 = 1024;

/// Times `iters` calls of `call`, calling `settle` (untimed) after every run of [`RUN`].
fn timed_runs(iters: u64, mut call: impl FnMut(u64), mut settle: impl FnMut()) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let n = RUN.min(iters - done);
        let start = Instant::now();
        for i in done..done + n {
            call(i);
        }
        total += start.elapsed();
        settle();
        done += n;
    }
    total
}

fn keys(shape: &KeyShape) -> Vec<Vec<u8>> {
    (0..RUN).map(|i| shape.key(i)).collect()
}

/// What the baseline's callers copy into its deque: tenant, key, group, media.
type OwnedCall = (Vec<u8>, Vec<u8>, Vec<u8>, u8);

/// The deque and the shutdown flag behind one mutex, and the condition variable.
type BaselineState = (Mutex<(VecDeque<OwnedCall>, bool)>, Condvar);

/// The baseline: callers lock a deque, push owned strings and notify; a thread pops.
struct MutexCondvarPublisher {
    shared: Arc<BaselineState>,
    worker: Option<JoinHandle<()>>,
}

impl MutexCondvarPublisher {
    fn new() -> Self {
        let shared = Arc::new((Mutex::new((VecDeque::new(), false)), Condvar::new()));
        let state = Arc::clone(&shared);
        let worker = std::thread::spawn(move || {
            let (lock, ready) = &*state;
            let mut guard = lock.lock().unwrap();
            loop {
                while let Some(event) = guard.0.pop_front() {
                    drop(guard);
                    black_box(event);
                    guard = lock.lock().unwrap();
                }
                if guard.1 {
                    return;
                }
                guard = ready.wait(guard).unwrap();
            }
        });
        MutexCondvarPublisher {
            shared,
            worker: Some(worker),
        }
    }

    fn on_put_commit(&self, tenant: &[u8], key: &[u8], group: &[u8], media: u8) {
        let (lock, ready) = &*self.shared;
        lock.lock()
            .unwrap()
            .0
            .push_back((tenant.to_vec(), key.to_vec(), group.to_vec(), media));
        ready.notify_one();
    }

    fn drained(&self) -> bool {
        self.shared.0.lock().unwrap().0.is_empty()
    }
}

impl Drop for MutexCondvarPublisher {
    fn drop(&mut self) {
        self.shared.0.lock().unwrap().1 = true;
        self.shared.1.notify_one();
        let _ = self.worker.take().map(JoinHandle::join);
    }
}

fn hot_path(c: &mut Criterion) {
    let mut group = c.benchmark_group("on_put_commit");
    let publisher = kv_events_testing::bench::publisher("bench");
    let baseline = MutexCondvarPublisher::new();
    let cpu = MediumSet::from([Medium::Cpu]);
    for shape in shapes().iter().filter(|s| !s.allocates()) {
        let keys = keys(shape);
        let (tenant, group_id) = (shape.tenant, shape.group);
        let id = |design| BenchmarkId::new(design, shape.name);
        group.bench_function(id("lock_free_queue"), |b| {
            b.iter_custom(|iters| {
                timed_runs(
                    iters,
                    |i| publisher.on_put_commit(tenant, &keys[(i % RUN) as usize], group_id, cpu),
                    || assert!(publisher.flush(Duration::from_secs(10))),
                )
            })
        });
        group.bench_function(id("baseline_mutex_condvar_deque"), |b| {
            b.iter_custom(|iters| {
                timed_runs(
                    iters,
                    |i| {
                        let key = &keys[(i % RUN) as usize];
                        baseline.on_put_commit(tenant.as_bytes(), key, group_id.as_bytes(), 1)
                    },
                    || {
                        while !baseline.drained() {
                            std::thread::yield_now();
                        }
                    },
                )
            })
        });
    }
    assert_eq!(
        publisher.stats().dropped_events,
        0,
        "the runs must not overflow the queue"
    );

    let disabled = Publisher::disabled();
    let key = shapes()[0].key(0);
    group.bench_function("disabled", |b| {
        b.iter(|| disabled.on_put_commit("tenant-a", black_box(&key), "group-1", cpu))
    });
    group.finish();
}

// criterion_group! writes a `pub fn` without a doc comment; in a private module it is not
// exported, so missing_docs asks nothing of it.
mod group {
    criterion::criterion_group!(benches, super::hot_path);
}
criterion_main!(group::benches);
