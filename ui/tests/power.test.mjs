// The popover's power figures where the kernel offers them. This machine has no RAPL, so
// the server reads a sysfs tree of the test's (`MLXBAR_SYSFS_ROOT`, as node_exporter's
// `--path.sysfs`) whose package counter the test advances at a steady 24 W, as the kernel
// advances its own. The power line shows those watts, and a bench run's table gains a tok/J
// column holding what the run recorded.
//
// Run: npm test (in ui/), after `cargo build --release`. MLXBAR_BIN overrides the binary.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, renameSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";
import { BIN, CHROMIUM, CHROMIUM_ARGS, ROOT, freePort, untilWithLog } from "./helpers.mjs";

const ARTIFACTS = join(ROOT, "test-artifacts");
const WATTS = 24;

let server, base, browser, page, ticker, serverLog = "";
const until = untilWithLog(() => serverLog);
const testid = (id) => page.locator(`[data-testid="${id}"]`);

/** A RAPL package domain under `root` whose counter (µJ) grows at `WATTS` from now on;
 * each value is written whole (a rename), as a reader of the real file never sees half. */
function raplCounter(root) {
  const domain = join(root, "class/powercap/intel-rapl:0");
  mkdirSync(domain, { recursive: true });
  writeFileSync(join(domain, "name"), "package-0\n");
  writeFileSync(join(domain, "max_energy_range_uj"), "262143328850\n");
  const start = Date.now();
  const write = () => {
    const tmp = join(domain, ".energy_uj");
    writeFileSync(tmp, `${Math.round((Date.now() - start) * 1000 * WATTS)}\n`);
    renameSync(tmp, join(domain, "energy_uj"));
  };
  write();
  return setInterval(write, 50);
}

before(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  const dir = mkdtempSync(join(tmpdir(), "mlxbar-ui-power-"));
  ticker = raplCounter(join(dir, "sys"));
  mkdirSync(join(dir, "metrics/bench/plans"), { recursive: true });
  writeFileSync(join(dir, "metrics/bench/plans/ui-power.toml"),
    'description = "UI power test"\nconcurrency = [1]\nprompt_tokens = [48]\noutput_tokens = [32]\nwarmup = 1\nrepetitions = 2\n');
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  server = spawn(BIN, ["serve", "--port", String(port), "--data-dir", dir], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, MLXBAR_SYSFS_ROOT: join(dir, "sys") },
  });
  server.stdout.on("data", (d) => { serverLog += d; });
  server.stderr.on("data", (d) => { serverLog += d; });
  await until("the server to load the model", async () => (await (await fetch(`${base}/health`)).json()).status === "ok", 120000);
  browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS });
  page = await browser.newPage({ viewport: { width: 380, height: 700 }, deviceScaleFactor: 2 });
  page.on("pageerror", (e) => { throw e; });
  await page.goto(`${base}/`);
});

after(async () => {
  clearInterval(ticker);
  await browser?.close();
  server?.kill("SIGTERM");
});

test("the power line shows the package watts, and a bench run's table its tokens per joule", async () => {
  // 24 W read back over the sampler's interval (the counter's steps are 50 ms apart).
  const line = await until("the power line", async () => {
    if (await testid("power").isHidden()) return null;
    return (await testid("power").textContent()).match(/^([\d.]+) W/);
  });
  assert.ok(Math.abs(Number(line[1]) - WATTS) <= 3, `shown ${line[0]}`);
  await testid("bench-profile").selectOption("ui-power");
  await testid("bench-start").click();
  await until("the results", async () => (await page.locator('[data-testid="bench-row"]').count()) === 1, 120000);
  const run = (await (await fetch(`${base}/api/history?limit=1`)).json()).data[0];
  const tpj = run.cells[0].tokens_per_joule;
  assert.ok(tpj > 0, `the run recorded ${tpj} tok/J`);
  const headers = await page.locator('[data-testid="bench-results"] th').allTextContents();
  assert.deepEqual(headers, ["streams×prompt→out", "tok/s", "TTFT p50", "tok/J"]);
  const shown = await page.locator('[data-testid="bench-row"] td').nth(3).textContent();
  assert.equal(shown, tpj.toFixed(2));
  await page.screenshot({ path: join(ARTIFACTS, "popover-bench-power.png"), fullPage: true });
});
