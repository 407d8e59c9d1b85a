// Drives `phaseprof serve` in headless Chromium: open a profile, click the `propose` phase and
// see the graph and tables change to it, then open the diff page and read a verdict.
// Then group the page by thread (the thread table, graphs split per thread), and open a
// `diff -o diff.html` page to measure its graph's width.
// usage: node ui.mjs BASE_URL ARTIFACT_DIR DIFF_HTML   (prints one JSON line of what it saw)
import { chromium } from 'playwright-core';

const [base, out, diffHtml] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu'],
});
const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
const seen = {};
const fail = (msg) => { console.error(msg); process.exitCode = 1; };

await page.goto(`${base}/profile/0`);
seen.before_filter = (await page.textContent('#phase-filter')).trim();
seen.before_graph = await page.getAttribute('#graph-cpu', 'data');
seen.before_top = (await page.textContent('#top-cpu tr:nth-child(2) td.name')).trim();
await page.screenshot({ path: `${out}/profile.png`, fullPage: true });

await Promise.all([page.waitForNavigation(), page.click('a[data-phase="propose"]')]);
seen.after_filter = (await page.textContent('#phase-filter')).trim();
seen.after_graph = await page.getAttribute('#graph-cpu', 'data');
seen.after_top = (await page.textContent('#top-cpu tr:nth-child(2) td.name')).trim();
seen.selected_row = (await page.textContent('#phases tr.selected td:first-child')).trim();
// The graph itself loads and is an inferno flamegraph of the phase.
const svg = await page.evaluate(async (url) => (await fetch(url)).text(), seen.after_graph);
seen.graph_title = (svg.match(/<text id="title"[^>]*>([^<]*)</) || [])[1] || '';
await page.screenshot({ path: `${out}/profile-propose.png`, fullPage: true });

await page.click('.tabs button[data-tab="syscall"]');
seen.syscall_tab_visible = await page.isVisible('#syscalls');

// Group by thread: the thread table replaces the phase table, the phase filter stays, and the
// graph splits per thread under root frames naming them.
await Promise.all([page.waitForNavigation(), page.click('#group-by a[data-by="thread"]')]);
seen.threads = await page.$$eval('#threads tr', (trs) => trs.slice(1).map((tr) =>
  Array.from(tr.querySelectorAll('td')).map((td) => td.textContent.trim())));
seen.phases_table_shown = await page.isVisible('#phases');
seen.thread_graph = await page.getAttribute('#graph-cpu', 'data');
const threadSvg = await page.evaluate(async (url) => (await fetch(url)).text(), seen.thread_graph);
seen.thread_graph_roots = [...threadSvg.matchAll(/<title>(tid \d+ \([^)]*\) of pid \d+)/g)].map((m) => m[1]);
await page.screenshot({ path: `${out}/profile-threads.png`, fullPage: true });

await page.goto(`${base}/diff`);
await page.selectOption('select[name="a"]', ['0']);
await page.selectOption('select[name="b"]', ['1']);
await page.selectOption('select[name="event"]', 'syscall');
await Promise.all([page.waitForNavigation(), page.click('#diff-form button[type="submit"]')]);
const rows = await page.$$eval('#verdicts tr', (trs) => trs.map((tr) =>
  Array.from(tr.querySelectorAll('td')).map((td) => td.textContent.trim())));
const flush = rows.find((r) => r[0] === 'finalize' && r[1] === 'flush_syscalls');
seen.diff_flush = flush || null;
seen.diff_wall = rows.find((r) => r[0] === 'finalize' && r[1] === 'wall_ns') || null;
seen.diff_graph = await page.getAttribute('#diff-graph', 'data');
await page.screenshot({ path: `${out}/diff.png`, fullPage: true });

// `diff -o diff.html`: the graph spans the page, not a 300 px default box.
await page.goto(`file://${diffHtml}`);
seen.diff_html_width = await page.evaluate(() => document.querySelector('#graph svg').getBoundingClientRect().width);
seen.viewport_width = page.viewportSize().width;
await page.screenshot({ path: `${out}/diff-html.png`, fullPage: false });
await browser.close();

if (!seen.after_filter.includes('propose')) fail('phase filter did not change');
if (!seen.after_graph.includes('phase=propose')) fail('graph did not change to the phase');
if (!seen.graph_title.includes('phase propose')) fail('graph title lacks the phase');
if (!flush) fail('no verdict row for finalize flush_syscalls');
console.log(JSON.stringify(seen));
