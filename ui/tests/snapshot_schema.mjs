// Checks every snapshot the popover page receives against the server's published JSON
// Schema (GET /api/metrics/snapshot/schema, draft 2020-12, compiled with Ajv). The page's
// own EventSource is tapped in Chromium, so what is checked is exactly the event data that
// app.js parsed and rendered, not a second subscription that could see other events.
import Ajv2020 from "ajv/dist/2020.js";

/** Fetches the schema from `base` and compiles it (Ajv checks it against the 2020-12
 * meta-schema first). Formats such as schemars' "uint64" are annotations, as 2020-12 has
 * them by default: the bounds they imply are in the schema as minimum/maximum. */
export async function snapshotValidator(base) {
  const r = await fetch(`${base}/api/metrics/snapshot/schema`);
  if (r.status !== 200) throw new Error(`schema route answered ${r.status}`);
  if (!r.headers.get("content-type")?.startsWith("application/schema+json")) throw new Error(`schema content type ${r.headers.get("content-type")}`);
  const schema = await r.json();
  const ajv = new Ajv2020({ allErrors: true, strict: true, allowUnionTypes: true, validateFormats: false });
  return ajv.compile(schema);
}

/** Before the page loads: wraps the page's EventSource so that each `snapshot` event's data
 * also goes to `record(data)` in node (through a Playwright binding). */
export async function tapSnapshots(page, record) {
  await page.exposeBinding("__mlxbarSnapshot", (_source, data) => record(data));
  await page.addInitScript(() => {
    const Native = window.EventSource;
    window.EventSource = class extends Native {
      constructor(...args) {
        super(...args);
        // Added before app.js's own listener: both get the same event, in order.
        this.addEventListener("snapshot", (e) => { window.__mlxbarSnapshot(e.data); });
      }
    };
  });
}

/** A recorder for `tapSnapshots`: every snapshot parsed and validated, failures kept with
 * Ajv's errors (never thrown inside the page). */
export function snapshotLog(validate) {
  const log = { received: [], invalid: [] };
  log.record = (data) => {
    let snap;
    try {
      snap = JSON.parse(data);
    } catch (e) {
      log.invalid.push({ data: String(data).slice(0, 500), errors: [String(e)] });
      return;
    }
    log.received.push(snap);
    if (!validate(snap)) log.invalid.push({ at: snap.at, errors: validate.errors.map((e) => `${e.instancePath} ${e.message}`) });
  };
  return log;
}
