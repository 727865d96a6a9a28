// The operations console in Debian's Chromium, as an operator uses it: sign in, read the
// counts, filter, open a letter, replay it and see the job back on its queue; markup in a
// letter stays text. Screenshots of the main pages go to $SCREENSHOTS.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { chromium } from 'playwright-core';

function need(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run this suite through \`cargo xtask ci\` (see README.md)`);
  return value;
}

const base = need('CONSOLE_URL').replace(/\/$/, '');
const token = need('CONSOLE_TOKEN');
const shots = need('SCREENSHOTS');
mkdirSync(shots, { recursive: true });

let browser;
let page;

before(async () => {
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: [
      '--no-sandbox',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      '--disable-gpu',
      '--no-first-run',
    ],
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  page = await context.newPage();
});

after(async () => {
  await browser?.close();
});

const readyOf = (queue) =>
  page.textContent(`#queues tr[data-queue="${queue}"] [data-field="ready"]`);

test('an operator signs in, filters, opens a letter, replays it and sees it on its queue', async () => {
  const first = await page.goto(`${base}/`);
  assert.equal(first.status(), 401, 'no session: the sign-in page');
  await page.fill('input[name="token"]', token);
  await Promise.all([page.waitForURL(`${base}/`), page.click('button:has-text("Sign in")')]);

  await page.waitForSelector('#queues tr[data-queue="notify.email"]');
  assert.equal((await readyOf('notify.email')).trim(), '0', 'nothing on the queue yet');
  const overview = await page.content();
  assert.match(overview, /customer \{\} not found<\/td><td class="n">20</, 'one failure, counted once');
  await page.screenshot({ path: `${shots}/overview.png`, fullPage: true });

  await page.goto(`${base}/letters`);
  await page.fill('input[name="queue"]', 'notify.email');
  await Promise.all([page.waitForURL(/queue=notify\.email/), page.click('button:has-text("Filter")')]);
  const queues = await page.$$eval('#letters tr[data-id] td:nth-child(3)', (cells) =>
    cells.map((cell) => cell.textContent),
  );
  assert.ok(queues.length > 0, 'letters listed');
  assert.ok(queues.every((q) => q === 'notify.email'), `only the filtered queue: ${queues}`);
  await page.screenshot({ path: `${shots}/letters.png`, fullPage: true });

  await Promise.all([page.waitForURL(/\/letters\/\d+$/), page.click('#letters tr[data-id] td a')]);
  assert.match(await page.textContent('.status'), /pending_review/);
  assert.match(await page.textContent('#envelope'), /"job_id"/, 'the envelope, pretty');
  await page.screenshot({ path: `${shots}/letter.png`, fullPage: true });
  await Promise.all([page.waitForURL(/\/letters\/\d+$/), page.click('#replay')]);
  await page.waitForSelector('.status-replayed');
  assert.match(await page.textContent('#history'), /pending_review → replayed\s*console \(operator\)/);
  assert.equal(await page.$('#replay'), null, 'no second replay');

  await page.goto(`${base}/`);
  await page.waitForSelector('#queues tr[data-queue="notify.email"]');
  assert.equal((await readyOf('notify.email')).trim(), '1', 'the job is back on its queue');
});

test('markup in a letter renders as text and runs nothing', async () => {
  await page.goto(`${base}/letters?queue=notify.email`);
  const row = page.locator('#letters tr[data-id]', { hasText: '<script>' });
  assert.equal(await row.count(), 1, 'the letter whose error holds a script tag is listed as text');
  await Promise.all([page.waitForURL(/\/letters\/\d+$/), row.locator('td a').click()]);
  assert.notEqual(await page.title(), 'owned', 'the script did not run');
  assert.match(await page.textContent('#error'), /<script>document\.title='owned'<\/script>/);
  assert.match(await page.textContent('#envelope'), /<b>bold<\/b>/);
  assert.equal(await page.$('#envelope b'), null, 'no element made of the payload');
});

test('a bulk discard states its count, runs, and its progress reaches the end', async () => {
  await page.goto(`${base}/letters?queue=billing.invoices&kind=billing.invoice_paid`);
  await Promise.all([page.waitForURL(`${base}/bulk`), page.click('#bulk-discard')]);
  assert.match(await page.textContent('#confirm-count'), /Discard 10 letters waiting for review/);
  await page.screenshot({ path: `${shots}/bulk-confirm.png`, fullPage: true });
  await Promise.all([page.waitForURL(/\/runs\/\d+$/), page.click('#confirm')]);
  await page.waitForSelector('#state:text("finished")', { timeout: 20000 });
  assert.equal((await page.textContent('#done')).trim(), '10');
  await page.screenshot({ path: `${shots}/bulk-run.png`, fullPage: true });
  await page.goto(`${base}/letters?status=pending_review&queue=billing.invoices&kind=billing.invoice_paid`);
  assert.equal(await page.$('#letters'), null, 'no letter of that filter left waiting');
});

test('the cron page shows the tasks and each tenant\'s freshness tier', async () => {
  await page.goto(`${base}/cron`);
  assert.match(await page.textContent('#tasks'), /core\.data_freshness/);
  const tiers = await page.$$eval('#tiers tr', (rows) => rows.slice(1).map((r) => [...r.cells].map((c) => c.textContent)));
  assert.deepEqual(tiers.map((r) => r[1]), ['1h', '6h', 'nightly (default: no data_freshness)']);
  assert.ok(tiers.every((r) => /^\d{4}-\d\d-\d\d \d\d:00:00 UTC$/.test(r[2])), `next recomputes on the hour: ${tiers}`);
  await page.screenshot({ path: `${shots}/cron.png`, fullPage: true });
});

test('repeated wrong tokens are throttled with a 429 page, and the right one then waits too', async () => {
  // Its own context, as if from another client behind the fixture's trusted proxy (loopback),
  // so the throttle holds back this address only, not the other tests' sessions.
  const context = await browser.newContext({ extraHTTPHeaders: { 'x-forwarded-for': '203.0.113.77' } });
  const other = await context.newPage();
  try {
    await other.goto(`${base}/login`);
    const statuses = [];
    for (let i = 0; i < 6; i += 1) {
      await other.fill('input[name="token"]', `wrong-token-${i}-0123456789`);
      const [answer] = await Promise.all([
        other.waitForResponse((r) => r.url() === `${base}/login` && r.request().method() === 'POST'),
        other.click('button:has-text("Sign in")'),
      ]);
      statuses.push(answer.status());
      if (answer.status() === 429) {
        assert.ok(Number(answer.headers()['retry-after']) > 0, 'Retry-After says when');
        break;
      }
    }
    assert.deepEqual(statuses, [401, 401, 401, 401, 401, 429], 'the sixth within a minute');
    assert.match(await other.textContent('#throttled'), /Too many failed sign-ins from this address/);
    await other.screenshot({ path: `${shots}/throttled.png`, fullPage: true });
    const retry = await other.request.post(`${base}/login`, {
      form: { token },
      headers: { origin: base },
      maxRedirects: 0,
    });
    assert.equal(retry.status(), 429, 'a blocked address is refused before its token is read');
  } finally {
    await context.close();
  }
});
