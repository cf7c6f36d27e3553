// What the browser tests share: the paths they use, a free port, polling with a deadline
// (the server's log on failure), Prometheus text sums, Chromium's launch flags.
import { createServer } from "node:net";
import { join, resolve } from "node:path";

export const ROOT = resolve(import.meta.dirname, "../..");
export const BIN = process.env.MLXBAR_BIN ?? join(ROOT, "target/release/mlxbar");
export const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
// Without the background-networking flags Chromium's calls to the closed network pile up.
export const CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"];

export const freePort = () => new Promise((ok) => {
  const s = createServer().listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => ok(p)); });
});

/** `until(what, check, ms)`: polls `check` until it gives a truthy value; on timeout the
 * error carries the tail of `log()`. */
export const untilWithLog = (log) => async (what, check, ms = 20000) => {
  const end = Date.now() + ms;
  for (;;) {
    const v = await check().catch(() => undefined);
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}\n--- server log ---\n${log().slice(-3000)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
};

/** Sum of a metric's samples in Prometheus text, optionally filtered by a label test. */
export function metricSum(text, name, keep = () => true) {
  let sum = 0;
  for (const line of text.split("\n")) {
    // Label values may hold braces (route="/api/alerts/{id}/snooze"): match quoted strings whole.
    const m = line.match(/^([a-z_]+)(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})? ([^ ]+)$/);
    if (m && m[1] === name && keep(m[2] ?? "")) sum += Number(m[3]);
  }
  return sum;
}
