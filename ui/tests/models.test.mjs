// The popover's model card in headless Chromium (Playwright) against real mlxbar servers
// whose library holds two models: the default GGUF and a second path to it (a hard link
// under a `models_dirs` folder; the library counts a symlink to the same file once). The
// picker lists the runnable ones, loads the second and the card shows it loaded beside the
// default (memory, idle time), its Unload button unloads it; a server whose memory budget
// holds one model (the default, pinned) refuses the load and the card says why, in the
// server's own words. Screenshots go to test-artifacts/.
//
// Run: node --test tests/models.test.mjs (in ui/), after `cargo build --release`.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { copyFileSync, existsSync, linkSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { BIN, CHROMIUM, CHROMIUM_ARGS, ROOT, freePort, untilWithLog } from "./helpers.mjs";

const ARTIFACTS = join(ROOT, "test-artifacts");
const DEFAULT_GGUF = join(process.env.MLXBAR_CACHE_DIR ?? join(homedir(), ".cache/mlxbar"), "models/SmolLM2-135M-Instruct.Q4_1.gguf");
const SECOND = "smollm2-second";

const servers = [];
let browser, page, serverLog = "";
let needs = null; // from the first server: the default's id and what the second needs
const until = untilWithLog(() => serverLog);
const testid = (id) => page.locator(`[data-testid="${id}"]`);
const shot = (name) => page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });

/** A server whose library has a second model; `extra` is more config (TOML); it waits for
 * /health to say `ready` ("ok", or "failed" for a server whose default cannot load). */
async function startServer(extra = "", ready = "ok") {
  const dir = mkdtempSync(join(tmpdir(), "mlxbar-ui-models-"));
  mkdirSync(join(dir, "models"));
  const second = join(dir, "models", `${SECOND}.gguf`);
  try { linkSync(DEFAULT_GGUF, second); } catch { copyFileSync(DEFAULT_GGUF, second); } // another file system: a copy
  const config = join(dir, "config.toml");
  writeFileSync(config, `models_dirs = [${JSON.stringify(join(dir, "models"))}]\n${extra}`);
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  // HOME in the temp dir: only the two models here, none from the user's hub cache
  const env = { ...process.env, HOME: dir, MLXBAR_CACHE_DIR: join(DEFAULT_GGUF, "../..") };
  const proc = spawn(BIN, ["serve", "--config", config, "--port", String(port), "--data-dir", dir], { stdio: ["ignore", "pipe", "pipe"], env });
  proc.stdout.on("data", (d) => { serverLog += d; });
  proc.stderr.on("data", (d) => { serverLog += d; });
  servers.push(proc);
  await until(`the server's health to say ${ready}`, async () => (await (await fetch(`${base}/health`)).json()).status === ready, 120000);
  return base;
}
const modelsOf = async (base) => (await (await fetch(`${base}/api/models`)).json()).models;

before(async () => {
  assert.ok(existsSync(DEFAULT_GGUF), `the default model (${DEFAULT_GGUF}): run mlxbar fetch-model`);
  mkdirSync(ARTIFACTS, { recursive: true });
  browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS });
  page = await browser.newPage({ viewport: { width: 380, height: 700 }, deviceScaleFactor: 2 });
  page.on("pageerror", (e) => { throw e; });
});

after(async () => {
  await browser?.close();
  for (const s of servers) s.kill("SIGTERM");
});

test("the picker loads a second model and the card shows both loaded; Unload unloads it", async () => {
  const base = await startServer();
  const library = await modelsOf(base);
  const def = library.find((m) => m.default);
  assert.ok(def && def.state === "loaded", "the default model is loaded at start");
  assert.ok(library.some((m) => m.id === SECOND && m.runnable), `${SECOND} in the library: ${library.map((m) => m.id)}`);
  await page.goto(`${base}/`);

  // the default model is listed as loaded, with its memory
  const item = (id) => page.locator(`[data-testid="model-item"][data-model="${id}"]`);
  await until("the default model in the card", async () => (await item(def.id).getAttribute("class")) === "loaded");
  const size = String.raw`\d+(\.\d)? (B|KB|MB|GB)`;
  assert.match(await item(def.id).locator('[data-testid="model-detail"]').textContent(), new RegExp(`^${size} weights · KV ${size} of ${size} · (idle \\d+(\\.\\d)? (s|min|h)|busy)$`));
  assert.match(await item(def.id).textContent(), /default/);
  // the picker offers what is runnable and not loaded: the second model, not the default
  await until("the picker's list", async () => (await testid("model-pick").locator("option").allTextContents()).some((t) => t.startsWith(SECOND)));
  const offered = await testid("model-pick").locator("option:not([disabled])").evaluateAll((os) => os.map((o) => o.value));
  assert.ok(!offered.includes(def.id), `the loaded default is not offered: ${offered}`);

  await testid("model-pick").selectOption(SECOND);
  await testid("model-load").click();
  await until("the second model loaded in the card", async () => (await item(SECOND).getAttribute("class")) === "loaded", 60000);
  const second = (await modelsOf(base)).find((m) => m.id === SECOND);
  assert.equal(second.state, "loaded");
  needs = { default: def.id, estimate: second.estimate_bytes };
  // the card's figures are the server's, each named: weights, KV in use of KV granted
  const [weightsText, kvText] = (await item(SECOND).locator('[data-testid="model-detail"]').textContent()).split(" · ");
  const fmt = (b) => page.evaluate((x) => fmtBytes(x), b);
  assert.equal(weightsText, `${await fmt(second.info.weight_bytes)} weights`);
  assert.equal(kvText, `KV ${await fmt(second.kv_bytes)} of ${await fmt(second.memory_bytes - second.info.weight_bytes)}`);
  assert.equal(await testid("model-error").isVisible(), false);
  assert.match(await testid("models-summary").textContent(), /^2 loaded · /);
  // both serve: a request naming the second model is answered by it
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model: SECOND, messages: [{ role: "user", content: "Hi" }], max_tokens: 3 }),
  });
  assert.equal(r.status, 200);
  assert.equal((await r.json()).model, SECOND);
  await shot("popover-models-two-loaded");

  await item(SECOND).locator('[data-testid="model-unload"]').click();
  await until("the second model gone from the card", async () => (await item(SECOND).count()) === 0);
  assert.equal((await modelsOf(base)).find((m) => m.id === SECOND).state, "unloaded");
  await until("the picker to offer it again", async () =>
    (await testid("model-pick").locator("option:not([disabled])").evaluateAll((os) => os.map((o) => o.value))).includes(SECOND));
});

test("a server with a small memory budget refuses the load, and the card says why", async () => {
  // A budget of one and a half models: the default (pinned, so it is not unloaded to make
  // room) loads at start, the second cannot fit beside it.
  assert.ok(needs?.estimate > 0, "the first test measured what a model needs");
  const budget = Math.floor(needs.estimate * 1.5);
  const base = await startServer(`memory_budget_bytes = ${budget}\npinned = [${JSON.stringify(needs.default)}]\n`);
  // the server's own refusal, to compare the card's text with
  const api = await fetch(`${base}/api/models/${SECOND}/load`, { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
  assert.equal(api.status, 507);
  const why = (await api.json()).error;
  assert.equal(why.code, "insufficient_memory");

  await page.goto(`${base}/`);
  await until("the picker's list", async () => (await testid("model-pick").locator("option").allTextContents()).some((t) => t.startsWith(SECOND)));
  await testid("model-pick").selectOption(SECOND);
  await testid("model-load").click();
  await testid("model-error").waitFor({ state: "visible", timeout: 30000 });
  const shown = await testid("model-error").textContent();
  assert.equal(shown, `${SECOND} was not loaded: ${why.message}`);
  assert.match(shown, /needs ~[\d.]+ [KMG]B/, "the reason gives the figure it needs");
  assert.equal((await modelsOf(base)).find((m) => m.id === SECOND).state, "unloaded", "nothing loaded after a refusal");
  assert.equal(await page.locator(`[data-testid="model-item"][data-model="${SECOND}"]`).count(), 0);
  assert.equal(await testid("model-load").isDisabled(), false, "another try is possible");
  await shot("popover-models-refused");
});

test("a load that outlives load_timeout_seconds: the popover says a restart is required, and why", async () => {
  // No test hook in this binary: a real load of the default model takes longer than 1 ms,
  // so it is given up on and its thread left behind, as a stuck one would be.
  const base = await startServer("load_timeout_seconds = 0.001\n", "failed");
  const health = await (await fetch(`${base}/health`)).json();
  assert.match(health.restart_required ?? "", /did not finish within 0\.001 s \(load_timeout_seconds\)/);
  await page.goto(`${base}/`);
  await testid("banner").waitFor({ state: "visible", timeout: 20000 });
  assert.equal(await testid("banner").textContent(), `Restart required: ${health.restart_required}`);
  assert.equal(await testid("status").textContent(), "Model failed");
  await shot("popover-restart-required");
});

test("a model whose experts stream from disk: the card shows how many are in memory, the hits and the read rate", async () => {
  // The tiny 4-bit mixtral fixture (2 sparse layers × 8 experts of 4,608 B in memory) with a
  // cache of four experts: a quarter of them.
  const model = join(ROOT, "tests/data/tiny/mixtral-4bit");
  const base = await startServer(`model = ${JSON.stringify(model)}\nexpert_cache_bytes = ${4 * 4608}\n`);
  await page.goto(`${base}/`);
  const item = page.locator('[data-testid="model-item"][data-model="mixtral-4bit"]');
  await until("the streamed model in the card", async () => (await item.getAttribute("class")) === "loaded");
  await until("its experts line", async () => /no lookups yet/.test(await item.locator('[data-testid="model-experts"]').textContent()));
  for (const content of ["Tell me about the lighthouse keeper.", "And the stairs?"]) {
    const r = await fetch(`${base}/v1/chat/completions`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: "mixtral-4bit", messages: [{ role: "user", content }], max_tokens: 24 }),
    });
    assert.equal(r.status, 200);
  }
  const experts = (await modelsOf(base)).find((m) => m.id === "mixtral-4bit").experts;
  const hits = `${Math.round(100 * experts.hit_ratio)}% hits`;
  const line = item.locator('[data-testid="model-experts"]');
  await until("the hits and the read rate", async () => new RegExp(`^experts streamed: \\d of 16 in memory · ${hits} · \\d+(\\.\\d)? (B|KB|MB)/s from disk$`).test(await line.textContent()));
  assert.ok(experts.resident_experts <= 4 && experts.hits + experts.misses > 0, JSON.stringify(experts));
  assert.match(await line.getAttribute("title"), /expert_cache_bytes/);
  await shot("popover-models-experts-streamed");
});
