// Upstash's official SDK (`@upstash/qstash`) against the project's QStash fake
// (testkit/src/fakes/qstash.rs): signed deliveries checked with the SDK's `Receiver`, the
// endpoint's answers (489, retry delay) and the DLQ.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import { Client, Receiver, SignatureError } from "@upstash/qstash";

import { requireEnv } from "../lib/env.mjs";
import { eventually, startDestination } from "../lib/destination.mjs";

const baseUrl = requireEnv("QSTASH_URL");
const token = requireEnv("QSTASH_TOKEN");
const currentSigningKey = requireEnv("QSTASH_CURRENT_SIGNING_KEY");
const nextSigningKey = requireEnv("QSTASH_NEXT_SIGNING_KEY");
const nextKeySignerUrl = requireEnv("QSTASH_NEXT_KEY_SIGNER_URL");

const options = { token, devMode: false, retry: false, enableTelemetry: false };
const client = new Client({ baseUrl, ...options });
const receiver = new Receiver({ currentSigningKey, nextSigningKey, devMode: false });

/** How the endpoint answers, by the path's first segment. */
function answer(path, n) {
  if (path.startsWith("/non-retryable")) {
    return {
      status: 489,
      headers: { "Upstash-NonRetryable-Error": "true", "content-type": "text/plain" },
      body: "invoice 42 does not exist",
    };
  }
  if (path.startsWith("/flaky")) return n === 0 ? { status: 500, body: "try again" } : { status: 200 };
  if (path.startsWith("/down")) return { status: 503, body: "down" };
  return { status: 200 };
}

let destination;
before(async () => {
  destination = await startDestination(answer);
});
after(() => destination.close());

const fresh = (name) => `/${name}-${randomUUID()}`;

/** Publishes a JSON body to `path` and returns the answer and the first delivery. */
async function deliverOnce(path, body = { id: randomUUID() }, through = client) {
  const answered = await through.publishJSON({ url: destination.url(path), body });
  const [delivery] = await destination.waitFor(path);
  return { answered, delivery };
}

test("Receiver.verify accepts a delivery the fake signed with the current key", async () => {
  const path = fresh("signed");
  const { delivery } = await deliverOnce(path);
  const signature = delivery.headers["upstash-signature"];
  assert.equal(
    await receiver.verify({ signature, body: delivery.body, url: destination.url(path) }),
    true,
  );
  const currentOnly = new Receiver({ currentSigningKey, nextSigningKey: "sig_wrong", devMode: false });
  assert.equal(await currentOnly.verify({ signature, body: delivery.body }), true);
});

test("Receiver.verify rejects a tampered body, a tampered signature and another URL", async () => {
  const path = fresh("tampered");
  const { delivery } = await deliverOnce(path, { amount: 10 });
  const signature = delivery.headers["upstash-signature"];
  await assert.rejects(
    receiver.verify({ signature, body: delivery.body.replace("10", "1000") }),
    SignatureError,
  );
  const [head, claims, mac] = signature.split(".");
  const flipped = `${mac.slice(0, -2)}${mac.at(-2) === "A" ? "B" : "A"}${mac.at(-1)}`;
  await assert.rejects(
    receiver.verify({ signature: `${head}.${claims}.${flipped}`, body: delivery.body }),
    SignatureError,
  );
  await assert.rejects(
    receiver.verify({ signature, body: delivery.body, url: destination.url("/elsewhere") }),
    SignatureError,
  );
});

test("a delivery signed with the next key (after a rotation) is accepted", async () => {
  const rotated = new Client({ baseUrl: nextKeySignerUrl, ...options });
  const path = fresh("rotated");
  const { delivery } = await deliverOnce(path, { rotated: true }, rotated);
  const signature = delivery.headers["upstash-signature"];
  assert.equal(
    await receiver.verify({ signature, body: delivery.body, url: destination.url(path) }),
    true,
  );
  const currentOnly = new Receiver({ currentSigningKey, nextSigningKey: "sig_wrong", devMode: false });
  await assert.rejects(
    currentOnly.verify({ signature, body: delivery.body }),
    SignatureError,
    "it was signed with the next key, not the current one",
  );
});

/** The DLQ entry of `messageId`, once it is there. */
async function dlqEntry(messageId, filter) {
  return eventually(async () => {
    const { messages } = await client.dlq.listMessages({ filter });
    return messages.find((m) => m.messageId === messageId);
  }, `message ${messageId} in the DLQ`);
}

test("489 with Upstash-NonRetryable-Error sends the message to the DLQ without retries", async () => {
  const path = fresh("non-retryable");
  const url = destination.url(path);
  const answered = await client.publishJSON({ url, body: { invoice: 42 }, retries: 3 });
  const entry = await dlqEntry(answered.messageId, { url });
  assert.equal(destination.to(path).length, 1, "delivered once: no retry after a 489");

  assert.equal(typeof entry.dlqId, "string");
  assert.equal(entry.url, url);
  assert.equal(entry.method, "POST");
  assert.deepEqual(entry.header["Content-Type"], ["application/json"]);
  assert.deepEqual(JSON.parse(entry.body), { invoice: 42 });
  assert.equal(entry.maxRetries, 3);
  assert.equal(typeof entry.createdAt, "number");
  assert.ok(Math.abs(entry.createdAt - Date.now()) < 60_000, "createdAt is in milliseconds");
  assert.equal(entry.responseStatus, 489);
  const responseHeaders = Object.fromEntries(
    Object.entries(entry.responseHeader).map(([name, values]) => [name.toLowerCase(), values]),
  );
  assert.deepEqual(responseHeaders["upstash-nonretryable-error"], ["true"]);
  assert.equal(entry.responseBody, "invoice 42 does not exist");
});

test("a queue message that exhausts its retries is in the DLQ with its queueName", async () => {
  const queueName = `conformance-${randomUUID()}`;
  const queue = client.queue({ queueName });
  await queue.upsert({ parallelism: 1 });
  const path = fresh("down");
  const enqueued = await queue.enqueueJSON({ url: destination.url(path), body: {}, retries: 0 });
  const entry = await dlqEntry(enqueued.messageId, { queueName });
  assert.equal(entry.queueName, queueName);
  assert.equal(entry.responseStatus, 503);
  assert.equal(entry.responseBody, "down");
  assert.equal(destination.to(path).length, 1, "retries: 0 is one delivery");
  await queue.delete();
});

test("the Upstash-Retry-Delay expression sets the wait before a retry", async () => {
  const path = fresh("flaky");
  const answered = await client.publishJSON({
    url: destination.url(path),
    body: {},
    retries: 1,
    retryDelay: "300 * (1 + retried)",
  });
  const [first, second] = await destination.waitFor(path, 2);
  assert.equal(first.headers["upstash-retried"], "0");
  assert.equal(second.headers["upstash-retried"], "1");
  assert.equal(second.headers["upstash-message-id"], answered.messageId);
  const waited = second.at - first.at;
  // The expression gives 300 ms for the first retry; QStash's default would be 12 s.
  assert.ok(waited >= 250 && waited < 5000, `retried after ${waited} ms`);
});

test("dlq.retry and dlq.delete, one id and several", async () => {
  const url = destination.url(fresh("non-retryable-many"));
  const published = [];
  for (let n = 0; n < 5; n += 1) {
    published.push(await client.publishJSON({ url, body: { n } }));
  }
  const entries = [];
  for (const { messageId } of published) entries.push(await dlqEntry(messageId, { url }));
  const [one, two, three, four, five] = entries.map((e) => e.dlqId);

  const single = await client.dlq.retry(one);
  assert.equal(single.responses.length, 1);
  assert.match(single.responses[0].messageId, /^msg_/);
  const bulk = await client.dlq.retry([two, three]);
  assert.equal(bulk.responses.length, 2);
  for (const response of bulk.responses) assert.match(response.messageId, /^msg_/);

  assert.deepEqual(await client.dlq.delete(four), { deleted: 1 });
  // The retried ones answered 489 again; delete one of those with the untouched one.
  const retriedEntry = await dlqEntry(single.responses[0].messageId, { url });
  const deleted = await client.dlq.delete([five, retriedEntry.dlqId]);
  assert.equal(deleted.deleted, 2);

  const left = (await client.dlq.listMessages({ filter: { url } })).messages.map((m) => m.dlqId);
  for (const gone of [one, two, three, four, five, retriedEntry.dlqId]) {
    assert.ok(!left.includes(gone), `${gone} left the DLQ`);
  }
  const listed = await client.dlq.listMessages({ dlqIds: [five] }).catch((e) => e);
  assert.ok(!(listed instanceof Error) && listed.messages.length === 0, "a deleted id lists nothing");
});
