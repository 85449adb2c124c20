// Screenshots every generated Perses dashboard, drawn by this page against
// a Prometheus, with Debian's Chromium (headless) driven by playwright-core,
// and fails when a panel shows an error, or no data where data is expected.
//
//   node shots.mjs --prometheus http://127.0.0.1:9090 --out DIR
//       [--scrape-interval 15s] [--start 15m] [--timeout 120] [--deadline S]
//       [--expect data|none] [--dashboards node,runtime] [--allow-empty "<panel title>"]...
//
// --scrape-interval is that Prometheus's: Perses takes it as every query's
// smallest step and ends each range on a multiple of the step, so a wrong
// (too long) one hides the newest data.
//
// Expected data: a panel must show data when one of its queries is listed
// in charts/cpuslot/queries.txt as "data" or "budget" (what a node serving
// a pod whose runtime runs invocations produces; --expect none checks only
// for errors; --allow-empty excuses a panel by title, for a setup that does
// not produce what it counts). A query error fails every panel.
//
// Bounded: while a panel shows an error or lacks expected data, the
// dashboard is drawn again (data may be younger than the range's last
// step) until --timeout seconds per dashboard have passed; then each such
// panel is named with its queries as run (variables replaced, range,
// step), or the panels still loading. A watchdog ends the whole run after
// --deadline seconds (default: every dashboard's timeout and screenshot,
// Chromium's start, a minute to spare), naming what it was doing (exit 3).
// Progress goes to stdout as it happens.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { chromium } from 'playwright-core';
import { startServer, dashboardsDir } from './serve.mjs';

const { values: opt } = parseArgs({
  options: {
    prometheus: { type: 'string' },
    out: { type: 'string' },
    'scrape-interval': { type: 'string', default: '15s' },
    start: { type: 'string', default: '15m' },
    timeout: { type: 'string', default: '120' },
    deadline: { type: 'string' },
    expect: { type: 'string', default: 'data' },
    dashboards: { type: 'string', default: 'node,runtime' },
    chromium: { type: 'string', default: '/usr/bin/chromium' },
    'allow-empty': { type: 'string', multiple: true, default: [] },
  },
});
function usage(msg) {
  console.error(`shots: ${msg}`);
  process.exit(2);
}
if (!opt.out) usage('--out DIR is required');
if (!['data', 'none'].includes(opt.expect)) usage(`--expect must be data or none, got ${opt.expect}`);
const timeoutMs = Number(opt.timeout) * 1000;
if (!(timeoutMs > 0)) usage(`--timeout must be a positive number of seconds, got ${opt.timeout}`);
if (!/^\d+[smhdw]$/.test(opt.start)) usage(`--start must be a duration like 15m, got ${opt.start}`);
if (!/^[1-9]\d*(ms|s|m|h)$/.test(opt['scrape-interval'])) {
  usage(`--scrape-interval must be a duration like 15s, got ${opt['scrape-interval']}`);
}
const dashboards = opt.dashboards.split(',');

// A loaded machine draws a page this tall slowly: Playwright's 30 s is too short.
const screenshotMs = 120000;
const launchMs = 60000;
// Pause before drawing a dashboard again.
const retryMs = 5000;

// Progress, with the seconds since the start: the last line says what a
// run that was stopped from outside was doing.
const t0 = Date.now();
let doing = 'starting';
function phase(msg) {
  doing = msg;
  console.log(`[${Math.round((Date.now() - t0) / 1000)} s] ${msg}`);
}
// The whole run's bound.
const watchdogMs =
  opt.deadline === undefined
    ? dashboards.length * (timeoutMs + screenshotMs + retryMs) + launchMs + 60000
    : Number(opt.deadline) * 1000;
if (!(watchdogMs > 0)) usage(`--deadline must be a positive number of seconds, got ${opt.deadline}`);
let profile; // Chromium's, removed at the end
setTimeout(() => {
  console.error(`shots: gave up after ${Math.round(watchdogMs / 1000)} s, while: ${doing}`);
  if (profile) fs.rmSync(profile, { recursive: true, force: true });
  process.exit(3);
}, watchdogMs).unref();

// queries.txt: SOURCE<TAB>EXPECT<TAB>QUERY; SOURCE <uid>:<panel id>:<refId>.
function expectations() {
  const file = path.resolve(dashboardsDir, '../../queries.txt');
  const want = new Map(); // "<uid>:<panel id>" -> true when data is expected
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const [source, expect] = line.split('\t');
    const m = /^([^:]+):(\d+):[A-Z]$/.exec(source);
    if (!m) continue;
    const key = `${m[1]}:${m[2]}`;
    want.set(key, want.get(key) === true || expect === 'data' || expect === 'budget');
  }
  return want;
}

// The panels of a dashboard file: title, queries, whether data is expected.
function panelsOf(file, want) {
  const d = JSON.parse(fs.readFileSync(path.join(dashboardsDir, `${file}.json`), 'utf8'));
  return Object.entries(d.spec.panels).map(([key, p]) => {
    const id = key.replace(/^panel_/, '');
    return {
      title: p.spec.display.name,
      queries: p.spec.queries.map((q) => q.spec.plugin.spec.query),
      wantData:
        opt.expect === 'data' &&
        want.get(`${d.metadata.name}:${id}`) === true &&
        !opt['allow-empty'].includes(p.spec.display.name),
    };
  });
}

// state of every panel: loading (a query pending or not started, or the
// panel still drawing), error, empty (no series with a value), or ok; with
// what its queries returned (window.cpuslotQueries, src/main.jsx).
async function panelStates(page, panels) {
  const { queries, dom } = await page.evaluate(() => {
    const dom = {};
    for (const el of document.querySelectorAll('[data-testid="panel"]')) {
      const title = el.querySelector('header h2, header h6, header [id]')?.textContent?.trim() ?? '';
      dom[title] = {
        drawing: el.querySelector('[aria-label="Loading..."], .MuiSkeleton-root, .MuiCircularProgress-root') !== null,
        error: el.querySelector('[aria-label="panel errors"], .MuiAlert-standardError, [role="alert"]') !== null,
      };
    }
    return { queries: window.cpuslotQueries ?? {}, dom };
  });
  return panels.map((p) => {
    const rs = p.queries.map((q) => queries[q]);
    const d = dom[p.title];
    const errors = rs.filter((r) => r?.state === 'error').map((r) => r.error);
    let state = 'ok';
    if (errors.length > 0 || d?.error) state = 'error';
    else if (!d || d.drawing || rs.some((r) => r === undefined || r.state === 'loading')) state = 'loading';
    else if (rs.every((r) => r.points === 0)) state = 'empty';
    return { ...p, state, errors, results: rs };
  });
}

// A panel that fails the check: an error, or no data where some is expected.
const failing = (s) => s.state === 'error' || (s.state === 'empty' && s.wantData);

// How a panel's queries ran, for a failure message.
function asRun(s) {
  return s.results
    .map((r, i) =>
      r?.executed === undefined
        ? s.queries[i]
        : `${r.executed} [${r.start}..${r.end}, step ${r.step} s: ${r.series} series, ${r.points} points]`,
    )
    .join(' | ');
}

// draw opens the dashboard and waits until no panel is loading or the
// deadline passes; returns the panels' states.
async function draw(page, url, panels, deadline) {
  await page.goto(url, { timeout: Math.max(1000, Math.min(60000, deadline - Date.now())) });
  for (;;) {
    // Grow the window to the whole dashboard: Perses runs the queries of
    // the panels in view only.
    const height = await page.evaluate(() => document.documentElement.scrollHeight);
    if (height > page.viewportSize().height) await page.setViewportSize({ width: 1600, height: height + 100 });
    const states = await panelStates(page, panels);
    if (!states.some((s) => s.state === 'loading') || Date.now() > deadline) return states;
    await page.waitForTimeout(500);
  }
}

function screenshot(page, file) {
  return page.screenshot({ path: path.join(opt.out, `dashboard-${file}.png`), fullPage: true, timeout: screenshotMs });
}

async function shoot(ctx, base, file, want) {
  const panels = panelsOf(file, want);
  const page = await ctx.newPage();
  const problems = [];
  const pageErrors = new Set();
  page.on('pageerror', (e) => pageErrors.add(`page error: ${e.message}`));
  let drawError = '';
  // refresh=0s: nothing runs the queries again while the picture is taken.
  const url = `${base}?dashboard=${file}&start=${opt.start}&refresh=0s&scrapeInterval=${opt['scrape-interval']}`;
  const deadline = Date.now() + timeoutMs;
  let states = [];
  for (let attempt = 1; ; attempt++) {
    phase(`${file}: drawing${attempt > 1 ? ` again (${attempt})` : ''}`);
    const drawStart = Date.now();
    try {
      states = await draw(page, url, panels, deadline);
    } catch (e) {
      // a page that did not load in time: try again while time is left
      states = [];
      drawError = e.message.split('\n')[0];
    }
    const loading = states.filter((s) => s.state === 'loading');
    const bad = states.filter(failing);
    if (states.length > 0 && loading.length === 0 && bad.length === 0) break;
    // Draw again only when a drawing as long as this one still fits: the
    // last one then ends complete, and its failures are the ones reported.
    if (Date.now() + retryMs + (Date.now() - drawStart) > deadline) {
      if (loading.length > 0) {
        problems.push(`${loading.length} panels still loading after ${opt.timeout} s: ${loading.map((s) => s.title).join('; ')}`);
      }
      if (states.length === 0) problems.push(`not drawn in ${opt.timeout} s: ${drawError}`);
      break;
    }
    const why = states.length === 0 ? 'not drawn' : `${bad.length} panels failing (${bad.map((s) => s.title).join('; ')})`;
    phase(`${file}: ${why}; drawing again in ${retryMs / 1000} s`);
    await page.waitForTimeout(retryMs);
  }
  problems.push(...pageErrors);
  if (states.length > 0) {
    // Let the charts finish their (animated) drawing before the picture.
    await page.waitForTimeout(1500);
    phase(`${file}: screenshot`);
    await screenshot(page, file).catch((e) => problems.push(`no screenshot: ${e.message.split('\n')[0]}`));
  }
  for (const s of states) {
    if (s.state === 'error') problems.push(`panel "${s.title}": error: ${s.errors.join('; ') || 'shown in the panel'}`);
    if (s.state === 'empty' && s.wantData) problems.push(`panel "${s.title}": no data, expected some: ${asRun(s)}`);
  }
  const count = (state) => states.filter((s) => s.state === state);
  console.log(
    `${file}: ${states.length} panels, ${count('empty').length} without data (allowed: ${count('empty').filter((s) => !s.wantData).map((s) => s.title).join(', ') || 'none'}), ${count('error').length} with errors, ${count('loading').length} loading -> ${path.join(opt.out, `dashboard-${file}.png`)}`,
  );
  await page.close();
  return problems;
}

fs.mkdirSync(opt.out, { recursive: true });
const want = expectations();
const { url, server } = await startServer({ prometheus: opt.prometheus });
profile = fs.mkdtempSync(path.join(os.tmpdir(), 'cpuslot-shots-'));
let ctx;
let failed = false;
try {
  phase(`starting ${opt.chromium}`);
  ctx = await chromium.launchPersistentContext(profile, {
    executablePath: opt.chromium,
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
    viewport: { width: 1600, height: 1200 },
    timeout: launchMs,
  });
  for (const file of dashboards) {
    const problems = await shoot(ctx, url, file, want);
    for (const p of problems) console.error(`${file}: ${p}`);
    if (problems.length > 0) failed = true;
  }
} finally {
  await ctx?.close();
  server.close();
  fs.rmSync(profile, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
