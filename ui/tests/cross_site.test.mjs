// A hostile page in headless Chromium, served from another origin (another port of
// 127.0.0.1), tries what any web page can: simple cross-origin POSTs (text/plain, no CORS
// preflight) to start a benchmark, snooze an alert for a week and generate text, a
// sendBeacon, and a JSON POST that needs a preflight. The requests reach the server (it
// counts them as refused) and nothing happens: no bench job, no snooze, no generation.
//
// Run: npm test (in ui/), after `cargo build --release`. MLXBAR_BIN overrides the binary.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer as createHttpServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { BIN, CHROMIUM, CHROMIUM_ARGS, freePort, metricSum, untilWithLog } from "./helpers.mjs";

let server, base, evil, browser, serverLog = "";

const until = (what, check, ms = 120000) => untilWithLog(() => serverLog)(what, check, ms);

/** The attacker's page: fires every request, then reports how each ended. */
const page = (target) => `<!doctype html><meta charset="utf-8"><title>cute cats</title><script>
const t = ${JSON.stringify(target)};
const post = (path, body, extra = {}) => fetch(t + path, { method: "POST", body, ...extra }).then((r) => "read " + r.status, (e) => "blocked: " + e.message);
window.results = Promise.all([
  post("/api/bench", '{"profile":"standard"}'),
  post("/api/alerts/memory_pressure_warn/snooze", '{"seconds":604800}'),
  post("/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: "Write a long story." }], max_tokens: 200 })),
  post("/api/bench", '{"profile":"quick"}', { mode: "no-cors", headers: { "Content-Type": "text/plain" } }),
  post("/api/engine/reload", "{}", { headers: { "Content-Type": "application/json" } }),
  Promise.resolve(navigator.sendBeacon(t + "/api/bench", '{"profile":"quick"}') ? "beacon queued" : "beacon refused"),
]);
</script>`;

before(async () => {
  const dir = mkdtempSync(join(tmpdir(), "mlxbar-xsite-"));
  writeFileSync(join(dir, "config.toml"), "");
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  server = spawn(BIN, ["serve", "--config", join(dir, "config.toml"), "--port", String(port), "--data-dir", dir], { stdio: ["ignore", "pipe", "pipe"] });
  server.stdout.on("data", (d) => { serverLog += d; });
  server.stderr.on("data", (d) => { serverLog += d; });
  await until("the server to load the model", async () => (await (await fetch(`${base}/health`)).json()).status === "ok");
  const evilPort = await freePort();
  evil = createHttpServer((req, res) => { res.writeHead(200, { "Content-Type": "text/html" }); res.end(page(base)); });
  await new Promise((ok) => evil.listen(evilPort, "127.0.0.1", ok));
  evil.url = `http://127.0.0.1:${evilPort}/`;
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: CHROMIUM_ARGS,
  });
});

after(async () => {
  await browser?.close();
  evil?.close();
  server?.kill("SIGTERM");
});

test("a page from another origin cannot make the server do anything", async () => {
  const metrics = async () => (await fetch(`${base}/metrics`)).text();
  const refused = (m) => metricSum(m, "mlxbar_http_requests_total", (l) => /status="(403|405|415)"/.test(l));
  const before = refused(await metrics());
  const tab = await browser.newPage();
  await tab.goto(evil.url);
  const results = await tab.evaluate(() => window.results);
  // The browser sent them (fetch itself fails: no CORS headers for a foreign origin).
  assert.equal(results.length, 6);
  for (const r of results.slice(0, 3)) assert.match(r, /^blocked/, JSON.stringify(results));
  // The beacon goes out after the page is done with it; all six reach the server as
  // refusals (the preflighted one as its refused OPTIONS).
  await until("the refusals to be counted", async () => refused(await metrics()) - before >= 6, 20000);
  const m = await metrics();
  assert.ok(metricSum(m, "mlxbar_http_requests_total", (l) => /status="403"/.test(l)) >= 5, m);

  const bench = await (await fetch(`${base}/api/bench`)).json();
  assert.equal(bench.active, null, JSON.stringify(bench));
  assert.deepEqual(bench.data, []);
  const alerts = await (await fetch(`${base}/api/alerts`)).json();
  assert.ok(alerts.data.every((a) => a.snoozed === false), JSON.stringify(alerts));
  assert.equal(metricSum(m, "mlxbar_requests_total"), 0, "no generation ran");
  assert.equal(metricSum(m, "mlxbar_generation_tokens_total"), 0);
  assert.equal(metricSum(m, "mlxbar_engine_steps_total"), 0);
  const health = await (await fetch(`${base}/health`)).json();
  assert.equal(health.status, "ok");
  // Not reloaded: a reload loads the model again, which this counter would show.
  assert.equal(metricSum(m, "mlxbar_model_loads_total", (l) => /result="ok"/.test(l)), 1, "the engine was not reloaded");
  assert.equal(metricSum(m, "mlxbar_model_unloads_total"), 0, "nothing was unloaded");
  await tab.close();
});
