// Vercel's official SDK (`@vercel/queue`) against Vercel's own offline emulator
// (`python -m vercel.queue.devserver`), the oracle the project's fake is held to: the same
// checks as vercel-queues-fake.test.mjs, less `/batch` and the idempotency-key length limit,
// which the emulator does not have.

import { requireEnv } from "../lib/env.mjs";
import { vercelQueuesSuite } from "../lib/vercel-queues-suite.mjs";

vercelQueuesSuite({
  name: "emulator",
  baseUrl: requireEnv("VERCEL_QUEUES_EMULATOR_URL"),
  // The emulator checks no token; the SDK needs one so that it does not ask for an OIDC token.
  token: "local-emulator-token",
  batch: false,
  keyLimit: false,
});
