// The checks of Vercel's official SDK (`@vercel/queue`) that run against both the project's
// Vercel Queues fake and Vercel's own emulator: whatever one accepts, the other must too.
//
// The SDK is pointed at a local server with `resolveBaseUrl` (it appends `/api/v3/topic/…`),
// an explicit `token` (so it never asks `@vercel/oidc` for one) and `deploymentId: null`
// (no deployment pinning outside Vercel). Its public surface is what the adapter relies on:
// send (with idempotency key, delay, retention), batch send, pull receive (lease, ack,
// visibility change through `retry`, lease extension while the handler runs, receive by id)
// and the binary-mode push callback, which receives by id and acks.

import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import {
  BadRequestError,
  CLOUD_EVENT_TYPE_V2BETA,
  PollingQueueClient,
  QueueClient,
} from "@vercel/queue";

const REGION = "iad1";
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Registers the suite for one server. `batch`: whether it serves `/batch`; `keyLimit`: whether
 * it refuses idempotency keys over 256 characters, as the SDK documents. Vercel's emulator
 * does neither.
 */
export function vercelQueuesSuite({ name, baseUrl, token, batch, keyLimit }) {
  const options = {
    region: REGION,
    resolveBaseUrl: () => new URL(baseUrl),
    token,
    deploymentId: null,
  };
  const queue = new PollingQueueClient(options);
  const topic = () => `conformance-${randomUUID()}`;
  const group = "workers";

  /** Receives once, collecting what the handler saw; the handler may throw. */
  async function receiveAll(topicName, receiveOptions, handle = () => {}) {
    const seen = [];
    const result = await queue.receive(
      topicName,
      group,
      async (payload, metadata) => {
        seen.push({ payload, metadata });
        await handle(payload, metadata);
      },
      receiveOptions,
    );
    return { result, seen };
  }

  test(`${name}: send, receive with metadata, ack, then the topic is empty`, async () => {
    const topicName = topic();
    const before = Date.now();
    const { messageId } = await queue.send(topicName, { invoice: 42 });
    assert.equal(typeof messageId, "string");
    assert.ok(messageId.length > 0);

    const { result, seen } = await receiveAll(topicName);
    assert.deepEqual(result, { ok: true });
    assert.equal(seen.length, 1);
    const [{ payload, metadata }] = seen;
    assert.deepEqual(payload, { invoice: 42 });
    assert.equal(metadata.messageId, messageId);
    assert.equal(metadata.deliveryCount, 1);
    assert.equal(metadata.topicName, topicName);
    assert.equal(metadata.consumerGroup, group);
    assert.ok(Math.abs(metadata.createdAt.getTime() - before) < 60_000, "createdAt is now");
    assert.ok(metadata.expiresAt > metadata.createdAt, "expiresAt follows createdAt");

    assert.deepEqual(await receiveAll(topicName).then((r) => r.result), {
      ok: false,
      reason: "empty",
    });
    assert.deepEqual(await receiveAll(topicName, { messageId }).then((r) => r.result), {
      ok: false,
      reason: "already_processed",
      messageId,
    });
  });

  test(`${name}: receive with a limit takes several messages in one request`, async () => {
    const topicName = topic();
    for (const n of [1, 2, 3]) await queue.send(topicName, { n });
    const { result, seen } = await receiveAll(topicName, { limit: 10 });
    assert.deepEqual(result, { ok: true });
    assert.deepEqual(seen.map((s) => s.payload.n).sort(), [1, 2, 3]);
  });

  test(`${name}: receive by an unknown id is not_found`, async () => {
    const topicName = topic();
    await queue.send(topicName, { n: 1 });
    const messageId = `msg_${randomUUID().replaceAll("-", "")}`;
    const { result, seen } = await receiveAll(topicName, { messageId });
    assert.deepEqual(result, { ok: false, reason: "not_found", messageId });
    assert.equal(seen.length, 0);
  });

  test(`${name}: a handler failure keeps the lease: not visible, locked by id`, async () => {
    const topicName = topic();
    const { messageId } = await queue.send(topicName, { n: 1 });
    await assert.rejects(
      receiveAll(topicName, { visibilityTimeoutSeconds: 30 }, () => {
        throw new Error("handler failed");
      }),
      /handler failed/,
    );
    assert.equal((await receiveAll(topicName)).result.reason, "empty", "still leased");
    assert.deepEqual((await receiveAll(topicName, { messageId })).result, {
      ok: false,
      reason: "not_available",
      messageId,
    });
  });

  test(`${name}: retry { afterSeconds } changes the visibility; redelivered with count 2`, async () => {
    const topicName = topic();
    const { messageId } = await queue.send(topicName, { n: 1 });
    const first = await receiveAll(
      topicName,
      { retry: () => ({ afterSeconds: 1 }) },
      () => {
        throw new Error("not yet");
      },
    );
    assert.deepEqual(first.result, { ok: true }, "a retry directive settles the delivery");
    assert.equal((await receiveAll(topicName)).result.reason, "empty", "invisible for 1 s");

    await sleep(1300);
    const second = await receiveAll(topicName);
    assert.deepEqual(second.result, { ok: true });
    assert.equal(second.seen[0].metadata.messageId, messageId);
    assert.equal(second.seen[0].metadata.deliveryCount, 2);
    assert.equal((await receiveAll(topicName)).result.reason, "empty", "acked after the retry");
  });

  test(`${name}: retry { acknowledge: true } acks a failed delivery`, async () => {
    const topicName = topic();
    const { messageId } = await queue.send(topicName, { n: 1 });
    await receiveAll(topicName, { retry: () => ({ acknowledge: true }) }, () => {
      throw new Error("poison");
    });
    assert.equal((await receiveAll(topicName, { messageId })).result.reason, "already_processed");
  });

  test(`${name}: the lease is extended while a slow handler runs`, async () => {
    const topicName = topic();
    await queue.send(topicName, { slow: true });
    const calls = [];
    const realFetch = globalThis.fetch;
    globalThis.fetch = async (url, init) => {
      const response = await realFetch(url, init);
      calls.push({ method: init?.method ?? "GET", url: String(url), status: response.status });
      return response;
    };
    try {
      // The SDK renews every max(10 s, visibility / 5): with the minimum visibility (30 s),
      // a handler of 11 s sees one renewal.
      const { result } = await receiveAll(topicName, { visibilityTimeoutSeconds: 30 }, () =>
        sleep(11_000),
      );
      assert.deepEqual(result, { ok: true });
    } finally {
      globalThis.fetch = realFetch;
    }
    const leaseCalls = calls.filter((c) => c.url.includes("/lease/"));
    assert.deepEqual(
      leaseCalls.map((c) => [c.method, c.status]),
      [
        ["PATCH", 200],
        ["DELETE", 204],
      ],
      "one renewal accepted, then the ack",
    );
  });

  test(`${name}: an idempotency key delivers one message for repeated sends`, async () => {
    const topicName = topic();
    const idempotencyKey = `job-${randomUUID()}`;
    const first = await queue.send(topicName, { n: 1 }, { idempotencyKey });
    const again = await queue.send(topicName, { n: 1 }, { idempotencyKey });
    assert.equal(typeof again.messageId, "string", "a repeated send is accepted");
    const { seen } = await receiveAll(topicName, { limit: 10 });
    assert.deepEqual(
      seen.map((s) => s.metadata.messageId),
      [first.messageId],
      "only the first is delivered",
    );
    if (again.messageId !== first.messageId) {
      const byId = await receiveAll(topicName, { messageId: again.messageId });
      assert.equal(byId.result.reason, "not_available", "the duplicate's id is not deliverable");
    }
  });

  test(`${name}: deploymentId pins messages to a deployment; an unpinned consumer sees all`, async () => {
    const deploymentA = new PollingQueueClient({ ...options, deploymentId: "dpl_conformance_a" });
    const deploymentB = new PollingQueueClient({ ...options, deploymentId: "dpl_conformance_b" });
    const topicName = topic();
    const idempotencyKey = `job-${randomUUID()}`;
    const fromA = await deploymentA.send(topicName, { n: 1 }, { idempotencyKey });
    const fromB = await deploymentB.send(topicName, { n: 1 }, { idempotencyKey });

    const seenByB = [];
    await deploymentB.receive(topicName, group, (_, m) => seenByB.push(m.messageId), { limit: 10 });
    assert.deepEqual(seenByB, [fromB.messageId], "B receives its own message only");
    const aById = await deploymentB.receive(topicName, group, () => {}, {
      messageId: fromA.messageId,
    });
    assert.equal(aById.reason, "not_found", "another deployment's message is not found by id");

    const seenByA = [];
    await deploymentA.receive(topicName, group, (_, m) => seenByA.push(m.messageId), { limit: 10 });
    assert.deepEqual(seenByA, [fromA.messageId], "idempotency keys are per deployment");

    const later = await deploymentA.send(topicName, { n: 2 });
    const { seen } = await receiveAll(topicName, { limit: 10 });
    assert.deepEqual(seen.map((s) => s.metadata.messageId), [later.messageId]);
  });

  test(`${name}: delaySeconds hides the message until the delay has passed`, async () => {
    const topicName = topic();
    const { messageId } = await queue.send(topicName, { n: 1 }, { delaySeconds: 1 });
    assert.equal((await receiveAll(topicName)).result.reason, "empty");
    await sleep(1300);
    const { seen } = await receiveAll(topicName);
    assert.equal(seen[0]?.metadata.messageId, messageId);
  });

  test(`${name}: a retention outside 60 s to 7 days is a BadRequestError`, async () => {
    await assert.rejects(queue.send(topic(), {}, { retentionSeconds: 59 }), BadRequestError);
    await assert.rejects(queue.send(topic(), {}, { retentionSeconds: 604_801 }), BadRequestError);
    await assert.rejects(
      queue.send(topic(), {}, { retentionSeconds: 60, delaySeconds: 61 }),
      BadRequestError,
    );
  });

  test(`${name}: a push callback without payload receives by id and acks`, async () => {
    const topicName = topic();
    const { messageId } = await queue.send(topicName, { pushed: true });
    const seen = [];
    const { handleCallback } = new QueueClient(options);
    const route = handleCallback(async (payload, metadata) => {
      seen.push({ payload, metadata });
    });
    // What Vercel sends a consumer function in binary mode when it does not push the payload.
    const callback = () =>
      new Request("http://127.0.0.1/api/queue", {
        method: "POST",
        headers: {
          "ce-type": CLOUD_EVENT_TYPE_V2BETA,
          "ce-vqsqueuename": topicName,
          "ce-vqsconsumergroup": group,
          "ce-vqsmessageid": messageId,
          "ce-vqsregion": REGION,
        },
      });
    const answer = await route(callback());
    assert.equal(answer.status, 200);
    assert.deepEqual(await answer.json(), { status: "success" });
    assert.deepEqual(seen.map((s) => s.payload), [{ pushed: true }]);
    assert.equal(seen[0].metadata.deliveryCount, 1);

    const repeated = await route(callback());
    assert.equal(repeated.status, 200);
    assert.deepEqual(await repeated.json(), {
      status: "skipped",
      reason: "already_processed",
      messageId,
    });
    assert.equal(seen.length, 1, "the handler is not run again");
  });

  if (keyLimit) {
    test(`${name}: an idempotency key over 256 characters is a BadRequestError`, async () => {
      const topicName = topic();
      await assert.rejects(
        queue.send(topicName, {}, { idempotencyKey: "k".repeat(257) }),
        BadRequestError,
      );
      const atLimit = await queue.send(topicName, {}, { idempotencyKey: "k".repeat(256) });
      assert.equal(typeof atLimit.messageId, "string");
    });
  }

  if (batch) {
    test(`${name}: experimental_sendBatch sends every message, results in order`, async () => {
      const topicName = topic();
      const results = await queue.experimental_sendBatch(
        topicName,
        [{ payload: { n: 1 } }, { payload: { n: 2 }, idempotencyKey: `k-${randomUUID()}` }],
      );
      assert.equal(results.length, 2);
      for (const r of results) {
        assert.equal(r.status, "sent");
        assert.equal(typeof r.messageId, "string");
      }
      const { seen } = await receiveAll(topicName, { limit: 10 });
      const byId = Object.fromEntries(seen.map((s) => [s.metadata.messageId, s.payload.n]));
      assert.deepEqual(byId, { [results[0].messageId]: 1, [results[1].messageId]: 2 });
    });
  }
}
