//! The model-based property tests of `jobs_testkit::model` on the memory queue and store.

use std::sync::Arc;

use jobs_adapter_memory::{MemoryQueue, MemoryStore, MemoryWorkTx};
use jobs_core::{ManualClock, PublishOptions, StoreError};
use jobs_testkit::model::{self, Backend, BoxFuture, Transport};

fn write_effect(tx: &mut MemoryWorkTx, key: String) -> BoxFuture<'_, Result<(), StoreError>> {
    tx.record_effect(key);
    Box::pin(async { Ok(()) })
}

async fn memory() -> (Backend<MemoryStore>, Transport) {
    let clock = ManualClock::default();
    let queue = MemoryQueue::new(Arc::new(clock.clone()));
    let store = MemoryStore::default();
    let effects = store.clone();
    let inject = queue.clone();
    (
        Backend {
            store,
            write_effect,
            effects: Arc::new(move || {
                let effects = effects.effects();
                Box::pin(async move { effects })
            }),
        },
        Transport {
            publisher: Arc::new(queue.clone()),
            consumer: Arc::new(queue.clone()),
            depth: Arc::new(queue),
            inject: Arc::new(move |name, bytes| {
                inject.publish_bytes(name, bytes, &PublishOptions::default());
            }),
            clock,
        },
    )
}

#[test]
fn the_runtime_keeps_every_invariant_on_the_memory_store() {
    model::check_invariants(model::cases(64), memory);
}

#[test]
fn mutants_are_caught() {
    for (mutant, reason) in model::check_mutants_are_caught(memory) {
        println!("mutant {mutant:?} caught: {reason}");
    }
}
