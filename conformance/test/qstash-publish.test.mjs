// Upstash's official SDK (`@upstash/qstash`) against the project's QStash fake
// (testkit/src/fakes/qstash.rs): publishing, deduplication, batches, queues and schedules.
//
// `devMode: false` keeps the SDK from looking for (or downloading) Upstash's dev server; the
// SDK's own network retries are off so that an error is the fake's answer, not a timeout.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import { Client, QstashError } from "@upstash/qstash";

import { requireEnv } from "../lib/env.mjs";
import { startDestination } from "../lib/destination.mjs";

const baseUrl = requireEnv("QSTASH_URL");
const token = requireEnv("QSTASH_TOKEN");

const client = new Client({ baseUrl, token, devMode: false, retry: false, enableTelemetry: false });
const MESSAGE_ID = /^msg_/;

let destination;
before(async () => {
  destination = await startDestination();
});
after(() => destination.close());

/** A path of the destination unique to this run. */
const fresh = (name) => `/${name}-${randomUUID()}`;

test("publishJSON answers messageId and url, and delivers with QStash's headers", async () => {
  const path = fresh("publish");
  const url = destination.url(path);
  const answer = await client.publishJSON({
    url,
    body: { hello: "world" },
    headers: { "X-Tenant": "acme" },
  });
  assert.match(answer.messageId, MESSAGE_ID);
  assert.equal(answer.url, url);
  assert.notEqual(answer.deduplicated, true);

  const [delivery] = await destination.waitFor(path);
  assert.equal(delivery.method, "POST");
  assert.deepEqual(JSON.parse(delivery.body), { hello: "world" });
  assert.equal(delivery.headers["content-type"], "application/json");
  assert.equal(delivery.headers["upstash-message-id"], answer.messageId);
  assert.equal(delivery.headers["upstash-retried"], "0");
  assert.equal(delivery.headers["user-agent"], "Upstash-QStash");
  assert.equal(delivery.headers["x-tenant"], "acme", "Upstash-Forward-* reaches the endpoint");
  assert.ok(delivery.headers["upstash-signature"], "every delivery is signed");
});

test("the method option (Upstash-Method) is the delivery's method", async () => {
  const path = fresh("method");
  await client.publish({ url: destination.url(path), body: "x", method: "PUT" });
  const [delivery] = await destination.waitFor(path);
  assert.equal(delivery.method, "PUT");
});

test("a repeated deduplicationId answers the first id with deduplicated: true", async () => {
  const url = destination.url(fresh("dedup-id"));
  const deduplicationId = `job-${randomUUID()}`;
  const first = await client.publishJSON({ url, body: { n: 1 }, deduplicationId });
  const second = await client.publishJSON({ url, body: { n: 2 }, deduplicationId });
  assert.notEqual(first.deduplicated, true);
  assert.equal(second.deduplicated, true);
  assert.equal(second.messageId, first.messageId);
});

test("contentBasedDeduplication recognises the same body and not another", async () => {
  const url = destination.url(fresh("dedup-content"));
  const body = { invoice: randomUUID() };
  const first = await client.publishJSON({ url, body, contentBasedDeduplication: true });
  const same = await client.publishJSON({ url, body, contentBasedDeduplication: true });
  const other = await client.publishJSON({
    url,
    body: { invoice: randomUUID() },
    contentBasedDeduplication: true,
  });
  assert.equal(same.deduplicated, true);
  assert.equal(same.messageId, first.messageId);
  assert.notEqual(other.deduplicated, true);
  assert.notEqual(other.messageId, first.messageId);
});

test("batchJSON answers one publish response per message, in order", async () => {
  const [a, b] = [fresh("batch-a"), fresh("batch-b")];
  const answers = await client.batchJSON([
    { url: destination.url(a), body: { n: 1 } },
    { url: destination.url(b), body: { n: 2 } },
  ]);
  assert.equal(answers.length, 2);
  for (const answer of answers) assert.match(answer.messageId, MESSAGE_ID);
  assert.deepEqual(answers.map((x) => x.url), [destination.url(a), destination.url(b)]);
  const [delivered] = await destination.waitFor(b);
  assert.deepEqual(JSON.parse(delivered.body), { n: 2 });
});

test("queues: upsert, get, list, pause holds messages, resume delivers, delete", async () => {
  const queueName = `conformance-${randomUUID()}`;
  const queue = client.queue({ queueName });
  await queue.upsert({ parallelism: 1 });
  const created = await queue.get();
  assert.equal(created.name, queueName);
  assert.equal(created.parallelism, 1);
  assert.equal(created.paused, false);
  assert.equal(typeof created.lag, "number");
  assert.equal(typeof created.createdAt, "number");
  assert.equal(typeof created.updatedAt, "number");
  assert.ok((await queue.list()).some((q) => q.name === queueName));

  await queue.pause();
  assert.equal((await queue.get()).paused, true);
  const path = fresh("queued");
  const enqueued = await queue.enqueueJSON({ url: destination.url(path), body: { n: 1 } });
  assert.match(enqueued.messageId, MESSAGE_ID);
  assert.equal((await queue.get()).lag, 1, "a paused queue holds the message");

  await queue.resume();
  assert.equal((await queue.get()).paused, false);
  const [delivery] = await destination.waitFor(path);
  assert.equal(delivery.headers["upstash-message-id"], enqueued.messageId);

  await queue.delete();
  await assert.rejects(queue.get(), (error) => error instanceof QstashError && error.status === 404);
});

test("queues: upsert with paused: true creates a paused queue, paused: false resumes it", async () => {
  const queue = client.queue({ queueName: `conformance-${randomUUID()}` });
  await queue.upsert({ parallelism: 2, paused: true });
  const paused = await queue.get();
  assert.equal(paused.paused, true);
  assert.equal(paused.parallelism, 2);
  await queue.upsert({ parallelism: 2, paused: false });
  assert.equal((await queue.get()).paused, false);
  await queue.delete();
});

test("schedules: create, get, list, pause, resume, delete", async () => {
  const scheduleId = `conformance-${randomUUID()}`;
  const destinationUrl = destination.url(fresh("scheduled"));
  const created = await client.schedules.create({
    destination: destinationUrl,
    cron: "*/5 * * * *",
    scheduleId,
    body: JSON.stringify({ report: "daily" }),
    retries: 2,
  });
  assert.equal(created.scheduleId, scheduleId);

  const schedule = await client.schedules.get(scheduleId);
  assert.equal(schedule.scheduleId, scheduleId);
  assert.equal(schedule.cron, "*/5 * * * *");
  assert.equal(schedule.destination, destinationUrl);
  assert.equal(schedule.method, "POST");
  assert.equal(schedule.retries, 2);
  assert.equal(schedule.isPaused, false);
  assert.equal(typeof schedule.createdAt, "number");
  assert.equal(schedule.body, JSON.stringify({ report: "daily" }));
  assert.ok((await client.schedules.list()).some((s) => s.scheduleId === scheduleId));

  await client.schedules.pause({ schedule: scheduleId });
  assert.equal((await client.schedules.get(scheduleId)).isPaused, true);
  await client.schedules.resume({ schedule: scheduleId });
  assert.equal((await client.schedules.get(scheduleId)).isPaused, false);

  await client.schedules.delete(scheduleId);
  await assert.rejects(
    client.schedules.get(scheduleId),
    (error) => error instanceof QstashError && error.status === 404,
  );
});

test("a wrong token is refused with 401", async () => {
  const stranger = new Client({ baseUrl, token: "not-the-token", devMode: false, retry: false });
  await assert.rejects(
    stranger.publishJSON({ url: destination.url("/never"), body: {} }),
    (error) => error instanceof QstashError && error.status === 401,
  );
});
