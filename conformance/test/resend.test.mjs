// Resend's official Node SDK (`resend`) against the project's Resend fake
// (testkit/src/fakes/resend.rs): the batch endpoint, the only one the adapter uses.
//
// The SDK never throws for an API error: every call resolves to `{data, error, headers}`,
// `error` being Resend's error body `{statusCode, message, name}` and `headers` the answer's.

import { test } from "node:test";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";

import { Resend } from "resend";

import { requireEnv } from "../lib/env.mjs";

const baseUrl = requireEnv("RESEND_BASE_URL");
const rateLimitedUrl = requireEnv("RESEND_RATE_LIMITED_BASE_URL");
const apiKey = requireEnv("RESEND_API_KEY");

const resend = new Resend(apiKey, { baseUrl });

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** An email Resend accepts, unique to this run so replays are recognised. */
function email(n) {
  return {
    from: "Acme <billing@acme.test>",
    to: [`customer-${n}@example.test`],
    subject: `Invoice ${n}`,
    text: `Your invoice ${n} (${randomUUID()})`,
  };
}

/** The fake's control endpoint (not Resend's): the next batch requests fail as asked. */
async function failNext(body, url = baseUrl) {
  const answer = await fetch(`${url}/_fake/fail-next`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  assert.equal(answer.status, 200, await answer.text());
}

/** How many emails the fake has accepted so far (its control endpoint). */
async function sentCount() {
  const answer = await fetch(`${baseUrl}/_fake/sent`);
  assert.equal(answer.status, 200);
  return (await answer.json()).data.length;
}

function assertRateHeaders(headers) {
  for (const name of ["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"]) {
    assert.match(headers[name] ?? "", /^\d+$/, `${name} is a whole number of requests/seconds`);
  }
}

test("batch.send answers one id per email, in order, with the rate-limit headers", async () => {
  const { data, error, headers } = await resend.batch.send([email(1), email(2), email(3)]);
  assert.equal(error, null);
  assert.equal(data.data.length, 3);
  for (const { id } of data.data) assert.match(id, UUID);
  assert.equal(new Set(data.data.map(({ id }) => id)).size, 3, "the ids are distinct");
  assertRateHeaders(headers);
});

test("strict validation refuses the whole batch naming the bad `to`", async () => {
  const before = await sentCount();
  const bad = { ...email(2), to: ["not-an-address"] };
  const { data, error } = await resend.batch.send([email(1), bad]);
  assert.equal(data, null);
  assert.equal(error.statusCode, 422);
  assert.equal(error.name, "validation_error");
  assert.match(error.message, /`to/);
  assert.equal(await sentCount(), before, "strict mode sends none of the batch");
});

test("strict validation refuses a malformed `from` as a validation error naming it", async () => {
  const { data, error } = await resend.batch.send([{ ...email(1), from: "Acme billing" }]);
  assert.equal(data, null);
  assert.equal(error.statusCode, 422);
  assert.equal(error.name, "validation_error");
  assert.match(error.message, /`from`/);
});

test("a missing required field is missing_required_field", async () => {
  const { subject: _, ...withoutSubject } = email(1);
  const { error } = await resend.batch.send([withoutSubject]);
  assert.equal(error.statusCode, 422);
  assert.equal(error.name, "missing_required_field");
  assert.match(error.message, /subject/);
});

test("permissive validation (batchValidation option) sends the valid emails and lists the others", async () => {
  const before = await sentCount();
  const { data, error } = await resend.batch.send(
    [email(1), { ...email(2), to: "nobody" }, email(3)],
    { batchValidation: "permissive" },
  );
  assert.equal(error, null);
  assert.equal(data.data.length, 2, "`data` holds the emails sent");
  assert.equal(data.errors.length, 1);
  assert.equal(data.errors[0].index, 1, "`index` is the email's place in the request");
  assert.match(data.errors[0].message, /`to`/);
  assert.equal(await sentCount(), before + 2);
});

test("attachments are refused by the batch endpoint", async () => {
  const withAttachment = {
    ...email(1),
    attachments: [{ filename: "invoice.txt", content: Buffer.from("total: 3") }],
  };
  const { data, error } = await resend.batch.send([withAttachment]);
  assert.equal(data, null);
  assert.equal(error.statusCode, 422);
  assert.equal(error.name, "validation_error");
  assert.match(error.message, /attachments/);
});

test("an idempotency key replays the first answer and refuses another payload", async () => {
  const idempotencyKey = `blast-${randomUUID()}`;
  const batch = [email(1), email(2)];
  const first = await resend.batch.send(batch, { idempotencyKey });
  assert.equal(first.error, null);
  const sentAfterFirst = await sentCount();

  const replay = await resend.batch.send(batch, { idempotencyKey });
  assert.equal(replay.error, null);
  assert.deepEqual(replay.data.data, first.data.data, "same key and body: the same ids");
  assert.equal(await sentCount(), sentAfterFirst, "a replay sends nothing again");

  const other = await resend.batch.send([email(3)], { idempotencyKey });
  assert.equal(other.data, null);
  assert.equal(other.error.statusCode, 409);
  assert.equal(other.error.name, "invalid_idempotent_request");
});

test("an idempotency key longer than 256 characters is invalid_idempotency_key", async () => {
  const { error } = await resend.batch.send([email(1)], { idempotencyKey: "k".repeat(257) });
  assert.equal(error.statusCode, 400);
  assert.equal(error.name, "invalid_idempotency_key");
});

test("a wrong API key is invalid_api_key", async () => {
  const stranger = new Resend("re_not_the_key", { baseUrl });
  const { error } = await stranger.batch.send([email(1)]);
  assert.equal(error.statusCode, 403);
  assert.equal(error.name, "invalid_api_key");
});

test("a 429 carries rate_limit_exceeded, retry-after and the ratelimit headers", async () => {
  await failNext({ status: 429, count: 1, retry_after: 2 });
  const limited = await resend.batch.send([email(1)]);
  assert.equal(limited.data, null);
  assert.equal(limited.error.statusCode, 429);
  assert.equal(limited.error.name, "rate_limit_exceeded");
  assert.equal(limited.headers["retry-after"], "2");
  assertRateHeaders(limited.headers);
  assert.equal(limited.headers["ratelimit-remaining"], "0");

  const next = await resend.batch.send([email(2)]);
  assert.equal(next.error, null, "the fault covered one request only");
});

test("a 5xx surfaces as a server error of Resend's error shape", async () => {
  await failNext({ status: 503, count: 1 });
  const { data, error } = await resend.batch.send([email(1)]);
  assert.equal(data, null);
  assert.equal(error.statusCode, 503);
  assert.ok(
    ["internal_server_error", "application_error"].includes(error.name),
    `a server error name, got ${error.name}`,
  );
  assert.equal(typeof error.message, "string");
});

test("bursting past the served limit is answered 429 with retry-after, then admitted again", async () => {
  const limitedClient = new Resend(apiKey, { baseUrl: rateLimitedUrl });
  const probe = await limitedClient.batch.send([email(0)]);
  assert.equal(probe.error, null);
  const limit = Number(probe.headers["ratelimit-limit"]);
  assert.ok(limit >= 1, "the limit is advertised");

  const burst = await Promise.all(
    Array.from({ length: 2 * limit }, (_, n) => limitedClient.batch.send([email(n + 1)])),
  );
  const refused = burst.filter(({ error }) => error !== null);
  assert.ok(refused.length >= limit, `at most ${limit} of ${2 * limit} admitted in a second`);
  let wait = 0;
  for (const { error, headers } of refused) {
    assert.equal(error.statusCode, 429);
    assert.equal(error.name, "rate_limit_exceeded");
    assert.match(headers["retry-after"], /^\d+$/);
    assert.equal(headers["ratelimit-remaining"], "0");
    wait = Math.max(wait, Number(headers["retry-after"]));
  }
  assert.ok(wait >= 1 && wait <= 60, `retry-after is a few seconds, got ${wait}`);

  await new Promise((resolve) => setTimeout(resolve, wait * 1000));
  const after = await limitedClient.batch.send([email(99)]);
  assert.equal(after.error, null, "admitted once retry-after has passed");
});
