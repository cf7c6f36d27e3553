// The popover's cluster card in headless Chromium (Playwright) against two real `mlxbar serve`
// ranks serving the default model together over MLX's ring on 127.0.0.1 (pipeline parallel:
// its 9 heads do not split over 2): the card shows the mode, the ranks serving, the links'
// time a pass and a row a rank (its host, layers, weights, KV, MLX memory, a pass's time);
// when rank 1 is killed the card turns red and names it, in the server's words. With
// --on-rank-lost rejoin, rank 0 restarts itself and the card says what it waits for, then
// shows the cluster serving again once rank 1 is back. Screenshots go to test-artifacts/.
//
// Run: node --test tests/cluster.test.mjs (in ui/), after `cargo build --release`.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { BIN, CHROMIUM, CHROMIUM_ARGS, ROOT, freePort, untilWithLog } from "./helpers.mjs";

const ARTIFACTS = join(ROOT, "test-artifacts");
const DEFAULT_GGUF = join(process.env.MLXBAR_CACHE_DIR ?? join(homedir(), ".cache/mlxbar"), "models/SmolLM2-135M-Instruct.Q4_1.gguf");
// Two ring ports, below Linux's ephemeral range, apart from tests/cluster.rs's blocks.
const RING_PORT = 20000 + (process.pid % 250) * 40 + 32;

const ranks = [];
let browser, page, log = "";
const until = untilWithLog(() => log);
const testid = (id) => page.locator(`[data-testid="${id}"]`);
const shot = (name) => page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });

/** `mlxbar serve --hostfile --rank` with its own data dir and an empty config. */
function rank(n, hosts, dir, extra = [], ringPort = RING_PORT) {
  const data = join(dir, `rank${n}`);
  mkdirSync(data, { recursive: true });
  writeFileSync(join(data, "config.toml"), "");
  const args = ["serve", "--hostfile", hosts, "--rank", String(n), "--ring-port", String(ringPort), "--model", DEFAULT_GGUF];
  args.push("--config", join(data, "config.toml"), "--data-dir", data, ...extra);
  const env = { ...process.env };
  delete env.MLXBAR_API_KEY;
  const proc = spawn(BIN, args, { stdio: ["ignore", "pipe", "pipe"], env });
  proc.stdout.on("data", (d) => { log += `[rank ${n}] ${d}`; });
  proc.stderr.on("data", (d) => { log += `[rank ${n}] ${d}`; });
  ranks.push(proc);
  return proc;
}

before(async () => {
  assert.ok(existsSync(DEFAULT_GGUF), `the default model (${DEFAULT_GGUF}): run mlxbar fetch-model`);
  mkdirSync(ARTIFACTS, { recursive: true });
  browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS });
  page = await browser.newPage({ viewport: { width: 380, height: 900 }, deviceScaleFactor: 2 });
  page.on("pageerror", (e) => { throw e; });
});

after(async () => {
  await browser?.close();
  for (const r of ranks) r.kill("SIGTERM");
});

test("two ranks: the cluster card shows each rank's share, then names the rank lost", async () => {
  const dir = mkdtempSync(join(tmpdir(), "mlxbar-ui-cluster-"));
  const hosts = join(dir, "hosts.json");
  writeFileSync(hosts, JSON.stringify([{ ssh: "localhost", ips: ["127.0.0.1"] }, { ssh: "localhost", ips: ["127.0.0.1"] }]));
  const follower = rank(1, hosts, dir);
  const port = await freePort();
  rank(0, hosts, dir, ["--port", String(port)]);
  const base = `http://127.0.0.1:${port}`;
  await until("rank 0 serving", async () => (await (await fetch(`${base}/health`)).json()).status === "ok", 120000);
  // One answer, so every rank has reported a pass.
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: "What is 2+2?" }], temperature: 0, max_tokens: 16 }),
  });
  assert.equal(r.status, 200);

  await page.goto(`${base}/`);
  await until("the cluster card", async () => await testid("cluster").isVisible());
  await until("its summary", async () => /^pipeline parallel · 2 of 2 ranks serving · slowest link (0→1|1→0) \d+(\.\d)? ms$/.test(await testid("cluster-summary").textContent()));
  assert.match(await testid("cluster-summary").getAttribute("title"), /^The links take \d+(\.\d)? ms a pass, every hop there and back$/);
  const rows = testid("cluster-rank");
  assert.equal(await rows.count(), 2);
  const size = String.raw`\d+(\.\d)? (B|KB|MB|GB)`;
  const ms = String.raw`\d+(\.\d)? ms`;
  for (const [n, layers] of [[0, 15], [1, 15]]) {
    const row = rows.nth(n);
    assert.equal(await row.locator(".name").textContent(), `rank ${n} · localhost`);
    // Each rank's host (both this machine here) and the link into it: rank 1's from rank 0,
    // rank 0's from the last rank.
    const host = String.raw`host ${size} free of ${size}, pressure (normal|warn|critical|unknown)`;
    assert.match(await row.locator(".sub").textContent(), new RegExp(`^${layers} layers · ${size} weights · KV ${size} · MLX ${size} · ${host} · ${ms} computing, ${ms} waiting a pass · link in ${ms}$`));
  }
  assert.ok(await testid("cluster-lost").isHidden());
  await shot("cluster");

  follower.kill("SIGKILL");
  await until("the card naming the rank lost", async () => /The cluster lost rank 1 \(localhost\)/.test(await testid("cluster-lost").textContent()), 20000);
  assert.match(await testid("cluster-summary").textContent(), /^pipeline parallel · 0 of 2 ranks serving/);
  assert.equal(await rows.nth(1).getAttribute("class"), "failed");
  await shot("cluster-lost");
});

test("with --on-rank-lost rejoin: the card says what rank 0 waits for, then serves again", async () => {
  const dir = mkdtempSync(join(tmpdir(), "mlxbar-ui-rejoin-"));
  const hosts = join(dir, "hosts.json");
  writeFileSync(hosts, JSON.stringify({ backend: "ring", hosts: [{ ssh: "localhost", ips: ["127.0.0.1"] }, { ssh: "localhost", ips: ["127.0.0.1"] }] }));
  const ring = RING_PORT + 4;
  const rejoin = ["--on-rank-lost", "rejoin"];
  const follower = rank(1, hosts, dir, rejoin, ring);
  const port = await freePort();
  rank(0, hosts, dir, ["--port", String(port), ...rejoin], ring);
  const base = `http://127.0.0.1:${port}`;
  const serving = async () => (await (await fetch(`${base}/health`).catch(() => null))?.json())?.status === "ok";
  await until("rank 0 serving", serving, 120000);

  await page.goto(`${base}/`);
  await until("both ranks serving", async () => /^pipeline parallel · 2 of 2 ranks serving/.test(await testid("cluster-summary").textContent()));
  follower.kill("SIGKILL");
  // Rank 0 restarts in place on the same port; the page reconnects to the new process.
  await until("the card saying what it waits for", async () => /^forming · 0 of 2 ranks serving$/.test(await testid("cluster-summary").textContent()), 30000);
  assert.match(await testid("cluster-lost").textContent(), /^Waiting for every rank to join the cluster again after: the cluster lost rank 1 \(localhost\): its link closed$/);
  const rows = testid("cluster-rank");
  assert.equal(await rows.count(), 2);
  for (const n of [0, 1]) {
    assert.equal(await rows.nth(n).locator(".sub").textContent(), "not joined");
    assert.equal(await rows.nth(n).getAttribute("class"), "failed");
  }
  await shot("cluster-rejoining");

  rank(1, hosts, dir, rejoin, ring);
  await until("the cluster serving again", serving, 60000);
  await until("the card back", async () => /^pipeline parallel · 2 of 2 ranks serving/.test(await testid("cluster-summary").textContent()), 20000);
  assert.ok(await testid("cluster-lost").isHidden());
});
