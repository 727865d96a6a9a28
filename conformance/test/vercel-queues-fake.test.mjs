// Vercel's official SDK (`@vercel/queue`) against the project's Vercel Queues fake
// (testkit/src/fakes/vercel_queues.rs); the same checks run against Vercel's emulator in
// vercel-queues-emulator.test.mjs.

import { requireEnv } from "../lib/env.mjs";
import { vercelQueuesSuite } from "../lib/vercel-queues-suite.mjs";

vercelQueuesSuite({
  name: "fake",
  baseUrl: requireEnv("VERCEL_QUEUES_FAKE_URL"),
  token: requireEnv("VERCEL_QUEUES_FAKE_TOKEN"),
  batch: true,
  keyLimit: true,
});
