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
    let (backend, transport, _) = memory_grouped().await;
    (backend, transport)
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

/// A fresh memory store and queue on one manual clock, with the queue itself for the grouped
/// model (the memory queue settles inside the memory store's transactions).
async fn memory_grouped() -> (Backend<MemoryStore>, Transport, Arc<MemoryQueue>) {
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
            depth: Arc::new(queue.clone()),
            inject: Arc::new(move |name, bytes| {
                inject.publish_bytes(name, bytes, &PublishOptions::default());
            }),
            clock,
        },
        Arc::new(queue),
    )
}

/// The invariants with the worker grouped on the memory queue and store: groups with failures,
/// deferrals and dead letters inside them, crashes after a group settled and before its
/// commit, and a store that refuses its transactions; each must have been drawn, and the
/// grouped mutants (a failed job's writes or claim kept) must be caught.
#[test]
fn the_grouped_runtime_keeps_every_invariant_on_the_memory_store() {
    let stats = model::check_grouped_invariants(model::cases(64), memory_grouped);
    let (groups, released, undone, crashed, refused) = stats.counts();
    println!(
        "grouped model: {groups} groups, {released} released in a group, {undone} undone, \
         {crashed} crashed before commit, {refused} refused"
    );
    assert!(
        groups > 0 && released > 0 && undone > 0 && crashed > 0 && refused > 0,
        "the model exercised too little: {stats:?}"
    );
    for (mutant, reason) in model::check_grouped_mutants_are_caught(memory_grouped) {
        println!("mutant {mutant:?} caught: {reason}");
    }
}

/// The grouped invariants with the model's handler declared `RERUNNABLE`: checkpoints only as
/// often as jobs failed lately, a failure going back to the last one or rolling its group
/// back for another pass.
#[test]
fn the_grouped_runtime_keeps_every_invariant_with_rerunnable_handlers_on_the_memory_store() {
    let stats = model::check_grouped_rerunnable_invariants(model::cases(64), memory_grouped);
    let (groups, released, _, crashed, _) = stats.counts();
    assert!(
        groups > 0 && released > 0 && crashed > 0,
        "the model exercised too little: {stats:?}"
    );
}
