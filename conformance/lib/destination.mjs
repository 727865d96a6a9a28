// A local HTTP endpoint for QStash to deliver to: records every request and answers as each
// path is told to, so a test sees exactly what the fake delivered and how it reacted.

import { createServer } from "node:http";

/**
 * Starts an endpoint on 127.0.0.1 (a free port). `answer(path, n)` returns the reply to the
 * `n`th request (from 0) to `path`: `{status, headers, body}`, by default 200 with no body.
 */
export async function startDestination(answer = () => ({ status: 200 })) {
  const deliveries = [];
  const waiters = [];
  const server = createServer((request, response) => {
    const chunks = [];
    request.on("data", (chunk) => chunks.push(chunk));
    request.on("end", () => {
      const path = request.url;
      const n = deliveries.filter((d) => d.path === path).length;
      const delivery = {
        path,
        method: request.method,
        headers: request.headers,
        body: Buffer.concat(chunks).toString("utf8"),
        at: Date.now(),
      };
      deliveries.push(delivery);
      const reply = answer(path, n) ?? { status: 200 };
      response.writeHead(reply.status ?? 200, reply.headers ?? {});
      response.end(reply.body ?? "");
      for (const waiter of waiters.splice(0)) waiter();
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  const base = `http://127.0.0.1:${port}`;
  return {
    /** The URL of `path` on this endpoint. */
    url: (path) => `${base}${path}`,
    /** Every request to `path` so far. */
    to: (path) => deliveries.filter((d) => d.path === path),
    /**
     * Waits until `path` has had at least `count` requests, at most `timeoutMs`; returns them,
     * or throws saying how many came.
     */
    async waitFor(path, count = 1, timeoutMs = 5000) {
      const deadline = Date.now() + timeoutMs;
      while (deliveries.filter((d) => d.path === path).length < count) {
        const left = deadline - Date.now();
        if (left <= 0) {
          const got = deliveries.filter((d) => d.path === path).length;
          throw new Error(`expected ${count} deliveries to ${path} within ${timeoutMs} ms, got ${got}`);
        }
        await new Promise((resolve) => {
          waiters.push(resolve);
          setTimeout(resolve, Math.min(left, 100));
        });
      }
      return deliveries.filter((d) => d.path === path);
    },
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections?.();
        server.close(resolve);
      }),
  };
}

/** Polls `probe` every 50 ms until it returns a truthy value, at most `timeoutMs`. */
export async function eventually(probe, what, timeoutMs = 5000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}
