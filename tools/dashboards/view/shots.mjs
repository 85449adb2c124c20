// Screenshots every generated Perses dashboard, drawn by this page against
// a Prometheus, with Debian's Chromium (headless) driven by playwright-core,
// and fails when a panel shows an error, or no data where data is expected.
//
//   node shots.mjs --prometheus http://127.0.0.1:9090 --out DIR
//       [--start 15m] [--timeout 120] [--expect data|none] [--dashboards node,runtime]
//       [--allow-empty "<panel title>"]...
//
// Expected data: a panel must show data when one of its queries is listed
// in charts/cpuslot/queries.txt as "data" or "budget" (what a node serving
// a pod whose runtime runs invocations produces; --expect none checks only
// for errors; --allow-empty excuses a panel by title, for a setup that does
// not produce what it counts). A query error fails every panel. Waits at most --timeout
// seconds per dashboard for its panels to load; on timeout prints the
// panels still loading.
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
    start: { type: 'string', default: '15m' },
    timeout: { type: 'string', default: '120' },
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
// panel still drawing), error, empty (no series with a value), or ok.
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
    return { ...p, state, errors };
  });
}

// A loaded machine draws a page this tall slowly: Playwright's 30 s is too short.
function screenshot(page, file) {
  return page.screenshot({ path: path.join(opt.out, `dashboard-${file}.png`), fullPage: true, timeout: 120000 });
}

async function shoot(ctx, base, file, want) {
  const panels = panelsOf(file, want);
  const page = await ctx.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  await page.goto(`${base}?dashboard=${file}&start=${opt.start}`);
  const deadline = Date.now() + timeoutMs;
  let states;
  for (;;) {
    // Grow the window to the whole dashboard: Perses runs the queries of
    // the panels in view only.
    const height = await page.evaluate(() => document.documentElement.scrollHeight);
    if (height > page.viewportSize().height) await page.setViewportSize({ width: 1600, height: height + 100 });
    states = await panelStates(page, panels);
    const loading = states.filter((s) => s.state === 'loading');
    if (loading.length === 0) break;
    if (Date.now() > deadline) {
      problems.push(`${loading.length} panels still loading after ${opt.timeout} s: ${loading.map((s) => s.title).join('; ')}`);
      await screenshot(page, file).catch((e) => problems.push(`no screenshot: ${e.message}`));
      return problems;
    }
    await page.waitForTimeout(500);
  }
  // Let the charts finish their (animated) drawing before the picture.
  await page.waitForTimeout(1500);
  await screenshot(page, file);
  for (const s of states) {
    if (s.state === 'error') problems.push(`panel "${s.title}": error: ${s.errors.join('; ') || 'shown in the panel'}`);
    if (s.state === 'empty' && s.wantData) problems.push(`panel "${s.title}": no data, expected some (${s.queries.join(' | ')})`);
  }
  const empty = states.filter((s) => s.state === 'empty').length;
  console.log(`${file}: ${states.length} panels, ${empty} without data (allowed: ${states.filter((s) => s.state === 'empty' && !s.wantData).map((s) => s.title).join(', ') || 'none'}) -> ${path.join(opt.out, `dashboard-${file}.png`)}`);
  await page.close();
  return problems;
}

fs.mkdirSync(opt.out, { recursive: true });
const want = expectations();
const { url, server } = await startServer({ prometheus: opt.prometheus });
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'cpuslot-shots-'));
let ctx;
let failed = false;
try {
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
    timeout: 60000,
  });
  for (const file of opt.dashboards.split(',')) {
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
