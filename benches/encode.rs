//! Encoding alone: full batches of stored, removed and cleared events, legacy fields on and
//! off. Criterion reports the throughput in events per second on one core.

use criterion::{criterion_main, Criterion, Throughput};
use mooncake_kv_events::bench::EncodeBatches;
use mooncake_kv_events::EventKind;

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode");
    group.throughput(Throughput::Elements(EncodeBatches::EVENTS as u64));
    for kind in [EventKind::Stored, EventKind::Removed, EventKind::Cleared] {
        for legacy in [false, true] {
            let mut batches = EncodeBatches::new(kind, legacy);
            let name = format!(
                "{}/{}",
                kind.as_str(),
                if legacy { "legacy" } else { "plain" }
            );
            group.bench_function(name, |b| b.iter(|| batches.encode()));
        }
    }
    group.finish();
}

// criterion_group! writes a `pub fn` without a doc comment; in a private module it is not
// exported, so missing_docs asks nothing of it.
mod group {
    criterion::criterion_group!(benches, super::encode);
}
criterion_main!(group::benches);
