// The popover: one page fed by the server's live stream (/api/metrics/stream), served at
// `/` by mlxbar itself and shown by the menu-bar app's webview.
"use strict";

const $ = (id) => document.getElementById(id);
const app = $("app");
const SPARK_SECONDS = 300;

const fmtBytes = (b) => {
  if (b == null) return "–";
  const u = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return `${b.toFixed(b >= 100 || i === 0 ? 0 : 1)} ${u[i]}`;
};
const fmtSecs = (s, count) => {
  if (!count) return "–";
  return s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`;
};
const fmtInt = (n) => Number(n || 0).toLocaleString("en-US");
// milliseconds: one decimal below 10 ms
const fmtMs = (ms) => `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms`;
const text = (id, v) => { const el = $(id); if (el.textContent !== String(v)) el.textContent = v; };

// ---- the throughput sparkline (uPlot) ----
let spark = null;
function sparkline(tp) {
  // a fixed 5-minute axis: seconds before the server started count as idle
  const pad = (a) => Array(Math.max(0, SPARK_SECONDS - a.length)).fill(0).concat(a.slice(-SPARK_SECONDS));
  const tok = pad(tp.tokens_per_second);
  const req = pad(tp.requests_per_second);
  const now = Date.now() / 1000;
  const xs = tok.map((_, i) => now - (SPARK_SECONDS - 1 - i));
  const data = [xs, tok];
  if (!spark) {
    const el = $("spark");
    const css = getComputedStyle(document.documentElement);
    spark = new uPlot({
      width: el.clientWidth || 330, height: 74,
      cursor: { show: false }, legend: { show: false }, select: { show: false },
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(5, max * 1.15)] } },
      axes: [
        { show: false },
        { size: 30, gap: 2, space: 18, ticks: { show: false }, grid: { stroke: css.getPropertyValue("--line") }, stroke: css.getPropertyValue("--sub"), font: "10px sans-serif", values: (u, v) => v.map((x) => x >= 1000 ? `${x / 1000}k` : x) },
      ],
      series: [
        {},
        { label: "tok/s", stroke: css.getPropertyValue("--accent"), width: 1.5, fill: "rgba(10,132,255,.14)", points: { show: false } },
      ],
    }, data, el);
  } else {
    spark.setData(data);
  }
  // the last point is the current, still-filling second: average the five before it
  const recent = tok.slice(-6, -1);
  const tokNow = recent.length ? recent.reduce((a, b) => a + b, 0) / recent.length : 0;
  const reqRecent = req.slice(-61, -1).reduce((a, b) => a + b, 0) / 60;
  text("tok-now", tokNow >= 10 ? Math.round(tokNow) : tokNow.toFixed(1));
  text("rps", `${reqRecent.toFixed(2)} req/s`);
}

// ---- memory ----
/** A bar of `parts` ([css key, label, bytes]) as shares of `whole`, with its legend. */
function stackedBar(bar, legend, parts, whole) {
  bar.replaceChildren(...parts.map(([k, label, v]) => {
    const d = document.createElement("div");
    d.style.width = `${(100 * v / whole).toFixed(2)}%`;
    d.style.background = `var(--${k})`;
    d.title = `${label}: ${fmtBytes(v)}`;
    return d;
  }));
  legend.replaceChildren(...parts.map(([k, label, v]) => {
    const s = document.createElement("span");
    const i = document.createElement("i");
    i.style.background = `var(--${k})`;
    s.dataset.part = k;
    s.append(i, `${label} ${fmtBytes(v)}`);
    return s;
  }));
}

/** What this process's resident memory holds: the loaded models' weights, the KV their
 * running requests use, their prefix caches, MLX's buffer cache (process-wide, given back
 * after a quiet spell), and the rest (runtime, tokenizers, allocator slack). */
function processMemory(s) {
  const loaded = s.models.filter((m) => m.state === "loaded");
  const sum = (f) => loaded.reduce((a, m) => a + (f(m) ?? 0), 0);
  const parts = [
    ["weights", "Weights", sum((m) => m.info?.weight_bytes)],
    ["kv", "KV in use", sum((m) => m.kv_bytes)],
    ["prefix", "Prefix cache", sum((m) => m.prefix_cache_bytes)],
    ["mlxcache", "MLX cache", s.memory.mlx.cache],
  ];
  const rss = s.memory.process.resident_bytes;
  const held = parts.reduce((a, p) => a + p[2], 0);
  // Metal buffers need not count in RSS: the rest is then 0, the bar the parts' sum.
  parts.push(["rest", "Other", Math.max(0, rss - held)]);
  stackedBar($("procbar"), $("proclegend"), parts, Math.max(rss, held) || 1);
  const limit = sum((m) => m.prefix_cache_limit_bytes);
  $("proclegend").querySelector('[data-part="prefix"]').title = `Prefix cache: ${fmtBytes(parts[2][2])} of ${fmtBytes(limit)}`;
  $("proclegend").querySelector('[data-part="mlxcache"]').title = `MLX buffer cache: ${fmtBytes(s.memory.mlx.cache)} of ${fmtBytes(s.memory.mlx.cache_limit)}; given back after a quiet spell (${s.memory.mlx.idle_clears} so far)`;
  text("proc-mem", `process ${fmtBytes(rss)} resident`);
}
const PRESSURE_ANGLE = { normal: 150, warn: 90, critical: 30, unknown: 90 };
function memory(m) {
  const sys = m.system;
  const level = sys ? sys.pressure : "unknown";
  app.dataset.pressure = level;
  text("pressure", level);
  const a = (PRESSURE_ANGLE[level] ?? 90) * Math.PI / 180;
  const needle = $("needle");
  needle.setAttribute("x2", (60 + 42 * Math.cos(a)).toFixed(1));
  needle.setAttribute("y2", (60 - 42 * Math.sin(a)).toFixed(1));
  if (!sys) {
    text("pressure-raw", "memory readings unavailable");
    return;
  }
  const raw = sys.pressure_raw;
  text("pressure-raw", sys.pressure_source === "kernel" ? `kernel level ${raw ?? "?"}`
    : sys.pressure_source === "psi" ? `PSI some ${raw == null ? "?" : raw.toFixed(1)} %` : "no pressure signal on this system");

  // Under a cgroup limit the total is the limit: the machine's breakdown does not fit in
  // it, so the bar shows what the group uses and what is left.
  const cg = sys.cgroup;
  const parts = (cg ? [["app", "In use", sys.used], ["free", "Left", sys.available]] : [
    ["app", "App", sys.app], ["wired", "Wired", sys.wired], ["compressed", "Compressed", sys.compressed],
    ["cached", "Cached files", sys.cached_files], ["free", "Free", sys.free],
  ]).filter((p) => p[2] > 0);
  const known = parts.reduce((s, p) => s + p[2], 0);
  if (!cg && sys.total > known) parts.splice(parts.length - 1, 0, ["other", "Other", sys.total - known]);
  stackedBar($("membar"), $("memlegend"), parts, sys.total);
  text("mem-used", `${fmtBytes(sys.used)} of ${fmtBytes(sys.total)}`);
  const limit = $("mem-limit");
  limit.textContent = cg ? `cgroup v${cg.version}: ${fmtBytes(cg.limit)} (${fmtBytes(cg.working_set)} in use)` : "none";
  limit.title = cg ? `${cg.path}: loads are judged against this limit, not the machine's memory` : "no cgroup memory limit: loads are judged against the machine's memory";
  text("swap", sys.swap_total ? `${fmtBytes(sys.swap_used)} of ${fmtBytes(sys.swap_total)}` : "off");
  text("swap-rate", `${m.swap_in_pages_per_second.toFixed(0)} in · ${m.swap_out_pages_per_second.toFixed(0)} out pages/s`);
  text("mlx-mem", `${fmtBytes(m.mlx.active)} active · ${fmtBytes(m.mlx.cache)} cache`);
}

// ---- alerts ----
async function snooze(id, seconds) {
  const opts = seconds ? { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ seconds }) } : { method: "DELETE" };
  const r = await fetch(`/api/alerts/${encodeURIComponent(id)}/snooze`, opts);
  if (!r.ok) showBanner(`Could not snooze: ${(await r.json()).error?.message ?? r.status}`);
}
// ---- the last requests, newest first, with the API that asked ----
const API_NAMES = {
  chat: "OpenAI chat", completions: "OpenAI completions", responses: "OpenAI Responses",
  messages: "Anthropic", ollama_chat: "Ollama chat", ollama_generate: "Ollama generate",
};
const RECENT_SHOWN = 4;
function recentRequests(list) {
  const ul = $("recent");
  ul.replaceChildren(...list.slice(-RECENT_SHOWN).reverse().map((r) => {
    const li = document.createElement("li");
    li.className = r.result === "error" ? "error" : "";
    li.dataset.endpoint = r.endpoint;
    const api = document.createElement("span");
    api.className = "api";
    api.textContent = API_NAMES[r.endpoint] ?? r.endpoint;
    const result = document.createElement("span");
    result.className = "result";
    result.textContent = r.result;
    const sub = document.createElement("span");
    sub.className = "sub";
    sub.textContent = `${fmtInt(r.completion_tokens)} tok · TTFT ${fmtSecs(r.ttft_seconds, r.ttft_seconds == null ? 0 : 1)}`;
    li.append(api, result, sub);
    return li;
  }));
}

function alerts(list) {
  const firing = list.filter((a) => a.firing);
  text("alert-count", firing.length ? `${firing.length} firing` : "none firing");
  const ul = $("alerts");
  if (!firing.length) {
    const li = document.createElement("li");
    li.className = "empty";
    li.textContent = "All clear";
    ul.replaceChildren(li);
    return;
  }
  ul.replaceChildren(...firing.map((a) => {
    const li = document.createElement("li");
    li.className = `${a.severity}${a.snoozed ? " snoozed" : ""}`;
    li.dataset.alert = a.id;
    const sev = document.createElement("span");
    sev.className = "sev";
    const t = document.createElement("div");
    t.className = "text";
    const title = document.createElement("div");
    title.textContent = a.summary;
    const sub = document.createElement("div");
    sub.className = "sub";
    const until = a.snoozed_until_unix ? new Date(a.snoozed_until_unix * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) : "";
    sub.textContent = `now ${a.value_text ?? "–"}` + (a.snoozed ? ` · snoozed until ${until}` : "");
    t.append(title, sub);
    const b = document.createElement("button");
    b.textContent = a.snoozed ? "Unsnooze" : "Snooze 1 h";
    b.dataset.testid = "snooze";
    b.onclick = () => snooze(a.id, a.snoozed ? 0 : 3600);
    li.append(sev, t, b);
    return li;
  }));
}

// ---- bench runs: start a profile, follow its progress, compare with the previous run ----
let benchActive = null;
const apiError = async (r) => (await r.json().catch(() => ({}))).error?.message ?? `HTTP ${r.status}`;
async function loadProfiles() {
  const r = await fetch("/api/bench/profiles");
  if (!r.ok) return;
  const sel = $("bench-profile");
  const keep = sel.value || "quick";
  sel.replaceChildren(...(await r.json()).data.map((p) => {
    const o = document.createElement("option");
    o.value = p.name;
    o.textContent = `${p.name} · ${p.cells} cell${p.cells === 1 ? "" : "s"}`;
    o.title = p.description;
    return o;
  }));
  sel.value = [...sel.options].some((o) => o.value === keep) ? keep : sel.options[0]?.value;
}
async function startBench() {
  const r = await fetch("/api/bench", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ profile: $("bench-profile").value }) });
  if (!r.ok) return showBanner(`Could not start the bench: ${await apiError(r)}`);
  bench(await r.json());
}
async function cancelBench() {
  if (!benchActive) return;
  const r = await fetch(`/api/bench/${encodeURIComponent(benchActive)}`, { method: "DELETE" });
  if (!r.ok) showBanner(`Could not cancel: ${await apiError(r)}`);
}
/** The running job (or null) from the snapshot or a start. */
function bench(job, paused) {
  const running = job && job.state === "running";
  const wasRunning = benchActive;
  benchActive = running ? job.id : null;
  $("bench-start").disabled = !!running || !!paused;
  $("bench-cancel").hidden = !running;
  $("bench-cancel").disabled = false;
  $("bench-progress").hidden = !running;
  text("bench-status", running ? `running ${job.profile}` : "idle");
  if (running) {
    const p = job.progress;
    $("bench-bar").style.width = `${p.requests_total ? (100 * p.requests_done) / p.requests_total : 0}%`;
    text("bench-cell", p.current
      ? `Cell ${Math.min(p.cells_done + 1, p.cells_total)}/${p.cells_total} · ${p.current.label} · ${p.current.phase} · ${p.requests_done}/${p.requests_total} requests`
      : "Starting…");
  } else {
    text("bench-cell", "");
  }
  if (wasRunning && !running) loadHistory();
}
const ago = (unix) => {
  const s = Date.now() / 1000 - unix;
  return s < 90 ? "just now" : s < 5400 ? `${Math.round(s / 60)} min ago` : s < 129600 ? `${Math.round(s / 3600)} h ago` : `${Math.round(s / 86400)} d ago`;
};
function delta(now, before, higherIsBetter) {
  const span = document.createElement("span");
  if (before == null || !before) return span;
  const pct = ((now - before) / before) * 100;
  if (Math.abs(pct) < 0.5) return span;
  span.className = `delta ${(pct > 0) === higherIsBetter ? "better" : "worse"}`;
  span.textContent = `${pct > 0 ? "+" : "−"}${Math.abs(pct).toFixed(0)}%`;
  return span;
}
/** The last finished run, per cell, against the previous run of the same profile. */
async function loadHistory() {
  const r = await fetch("/api/history?limit=50");
  if (!r.ok) return;
  const runs = (await r.json()).data;
  const last = runs[0];
  const body = $("bench-results");
  if (!last) {
    text("bench-title", "No runs yet: pick a profile and Run.");
    body.replaceChildren();
    return;
  }
  const prev = runs.slice(1).find((x) => x.profile === last.profile);
  text("bench-title", `Last: ${last.profile}, ${ago(last.finished_unix)}` + (prev ? ` · vs previous (${ago(prev.finished_unix)})` : " · first run of this profile"));
  const target = last.targets[0]?.label;
  const key = (c) => `${c.concurrency}×${c.prompt_tokens}→${c.output_tokens}${c.prediction ? " +prediction" : ""}`;
  const head = document.createElement("tr");
  // Tokens per joule only where the run could read power (hidden, not zero, elsewhere).
  const powered = last.cells.some((c) => c.target === target && c.tokens_per_joule != null);
  for (const h of ["streams×prompt→out", "tok/s", "TTFT p50", ...(powered ? ["tok/J"] : [])]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  const rows = last.cells.filter((c) => c.target === target).map((c) => {
    const before = prev?.cells.find((p) => p.target === prev.targets[0]?.label && key(p) === key(c));
    const tr = document.createElement("tr");
    const cell = document.createElement("td");
    cell.textContent = key(c);
    const tok = document.createElement("td");
    tok.append(c.aggregate_tok_s.toFixed(1), delta(c.aggregate_tok_s, before?.aggregate_tok_s, true));
    const ttft = document.createElement("td");
    ttft.append(fmtSecs(c.ttft_p50, 1), delta(c.ttft_p50, before?.ttft_p50, false));
    tr.append(cell, tok, ttft);
    if (powered) {
      const tpj = document.createElement("td");
      if (c.tokens_per_joule != null) tpj.append(c.tokens_per_joule.toFixed(2), delta(c.tokens_per_joule, before?.tokens_per_joule, true));
      else tpj.textContent = "–";
      tr.append(tpj);
    }
    tr.dataset.testid = "bench-row";
    return tr;
  });
  body.replaceChildren(head, ...rows);
}
$("bench-start").onclick = startBench;
$("bench-cancel").onclick = cancelBench;

// ---- models: the loaded ones come with every snapshot; the picker's list from /api/models ----
let library = [];             // every model the server found (ModelView), runnable or not
let libraryGeneration = null; // the snapshot's library_generation the list was fetched at
let loadPending = null;       // the id this page asked to load, until the server answers
// ids may hold "/" (org/name): each segment encoded, the slashes kept (the route takes the rest)
const modelRoute = (id, action) => `/api/models/${id.split("/").map(encodeURIComponent).join("/")}/${action}`;
const fmtIdle = (s) => s == null ? "busy" : s < 60 ? `idle ${Math.round(s)} s` : s < 3600 ? `idle ${Math.round(s / 60)} min` : `idle ${(s / 3600).toFixed(1)} h`;
function showModelError(msg) {
  const el = $("model-error");
  el.hidden = !msg;
  el.textContent = msg || "";
}
async function loadLibrary() {
  const r = await fetch("/api/models");
  if (!r.ok) return;
  library = (await r.json()).models;
  if (lastModels) models(lastModels);
}
async function loadModel() {
  const id = $("model-pick").value;
  if (!id) return;
  showModelError("");
  loadPending = id;
  if (lastModels) models(lastModels);
  try {
    const r = await fetch(modelRoute(id, "load"), { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
    // refused (507 not enough memory, 422 not runnable, 404 gone): the server says why
    if (!r.ok) showModelError(`${id} was not loaded: ${await apiError(r)}`);
  } catch (e) {
    showModelError(`${id} was not loaded: the server did not answer (${e.message})`);
  } finally {
    loadPending = null;
    if (lastModels) models(lastModels);
  }
}
async function unloadModel(id) {
  showModelError("");
  const r = await fetch(modelRoute(id, "unload"), { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
  if (!r.ok) showModelError(`${id} was not unloaded: ${await apiError(r)}`);
}
function modelItem(m) {
  const li = document.createElement("li");
  li.className = m.state;
  li.dataset.model = m.id;
  li.dataset.testid = "model-item";
  const t = document.createElement("div");
  t.className = "text";
  const name = document.createElement("div");
  name.className = "name";
  const idText = document.createElement("span");
  idText.className = "id";
  idText.textContent = m.id;
  idText.title = m.path ?? "";
  name.append(idText);
  for (const [on, label] of [[m.default, "default"], [m.pinned, "pinned"]]) {
    if (!on) continue;
    const tag = document.createElement("span");
    tag.className = `tag ${label}`;
    tag.textContent = label;
    name.append(tag);
  }
  const sub = document.createElement("div");
  sub.className = "sub";
  sub.dataset.testid = "model-detail";
  t.append(name, sub);
  li.append(t);
  if (m.state === "loaded") {
    // three figures, each named: the weights, the KV in use of what the budget granted it
    // (memory_bytes = weights + KV granted), and how long it has been idle
    const weights = m.info?.weight_bytes ?? 0;
    const granted = Math.max(0, (m.memory_bytes ?? 0) - weights);
    sub.textContent = `${fmtBytes(weights)} weights · KV ${fmtBytes(m.kv_bytes ?? 0)} of ${fmtBytes(granted)} · ${fmtIdle(m.idle_seconds)}`;
    sub.title = `Holds ${fmtBytes(m.memory_bytes)} of the memory budget: ${fmtBytes(weights)} of weights and room for ${fmtBytes(granted)} of KV (${fmtBytes(m.kv_bytes ?? 0)} in use now)`;
    if (m.experts) t.append(expertLine(m.experts));
    const b = document.createElement("button");
    b.textContent = "Unload";
    b.dataset.testid = "model-unload";
    b.onclick = () => unloadModel(m.id);
    li.append(b);
  } else if (m.state === "loading") {
    const pct = m.progress == null ? null : Math.round(100 * m.progress);
    sub.textContent = `Loading…${pct == null ? "" : ` ${pct}%`}${m.estimate_bytes ? ` · needs ~${fmtBytes(m.estimate_bytes)}` : ""}`;
    const bar = document.createElement("div");
    bar.className = "progress";
    bar.dataset.testid = "model-progress";
    const fill = document.createElement("div");
    fill.style.width = `${pct ?? 0}%`;
    bar.append(fill);
    t.append(bar);
  } else if (m.state === "unloading") {
    sub.textContent = `Unloading… ${m.requests ? `${m.requests} request${m.requests === 1 ? "" : "s"} finishing` : ""}`.trim();
  } else {
    sub.textContent = `Failed: ${m.error ?? "unknown error"}`;
  }
  return li;
}
// A model served by several ranks: the mode, the ranks serving and the slowest link, then a
// row a rank (its host, what it holds, MLX's memory there, its host's memory, a pass's time
// computing vs waiting on the ring, and the link into it); once a rank is lost, which one,
// in the server's words.
function cluster(c) {
  $("cluster").hidden = !c;
  if (!c) return;
  const slow = c.slowest_link;
  const link = slow ? ` · slowest link ${slow.from}→${slow.to} ${fmtMs(slow.ms_per_message)}` : "";
  // "auto" only while a restarted rank 0 waits for the cluster to form: no mode chosen yet.
  const mode = c.parallel === "auto" ? "forming" : `${c.parallel} parallel`;
  text("cluster-summary", `${mode} · ${c.healthy} of ${c.ranks} ranks serving${link}`);
  $("cluster-summary").title = c.link_ms_per_pass == null ? "" : `The links take ${fmtMs(c.link_ms_per_pass)} a pass, every hop there and back`;
  const lost = $("cluster-lost");
  lost.hidden = !c.broken;
  lost.textContent = c.broken ? `${c.broken[0].toUpperCase()}${c.broken.slice(1)}` : "";
  const rows = c.hosts.map((host, rank) => {
    const li = document.createElement("li");
    li.className = c.broken ? "failed" : "";
    li.dataset.testid = "cluster-rank";
    const t = document.createElement("div");
    t.className = "text";
    const name = document.createElement("div");
    name.className = "name";
    name.textContent = `rank ${rank} · ${host}`;
    const sub = document.createElement("div");
    sub.className = "sub";
    const m = c.members.find((r) => r.rank === rank);
    if (m) {
      const per = (secs) => fmtMs(m.passes ? (1000 * secs) / m.passes : 0);
      const held = c.parallel === "tensor" ? `1/${c.ranks} of ${m.layers} layers` : `${m.layers} layers`;
      const host = m.host_memory_total_bytes
        ? ` · host ${fmtBytes(m.host_memory_available_bytes)} free of ${fmtBytes(m.host_memory_total_bytes)}, pressure ${m.host_memory_pressure}`
        : "";
      const into = m.link_in_messages ? ` · link in ${fmtMs((1000 * m.link_in_seconds) / m.link_in_messages)}` : "";
      sub.textContent = `${held} · ${fmtBytes(m.weight_bytes)} weights · KV ${fmtBytes(m.kv_bytes)} · MLX ${fmtBytes(m.mlx_active_bytes)}${host} · ${per(m.compute_seconds)} computing, ${per(m.link_wait_seconds)} waiting a pass${into}`;
      sub.title = `${fmtInt(m.passes)} passes; ${fmtBytes(m.link_sent_bytes)} sent on the ring; ${fmtInt(m.link_in_messages)} messages in`;
      // A host short of memory: the rank's dot turns amber (red stays for a lost cluster).
      if (!c.broken && ["warn", "critical"].includes(m.host_memory_pressure)) li.className = "pressure";
    } else {
      sub.textContent = c.broken ? "not joined" : "no pass yet";
    }
    t.append(name, sub);
    li.append(t);
    return li;
  });
  $("cluster-ranks").replaceChildren(...rows);
}

// A streamed model's experts: how many are in memory, how often the router found its
// choice there, and how fast the rest come from disk (the server's rate over 10 s).
function expertLine(x) {
  const line = document.createElement("div");
  line.className = "sub experts";
  line.dataset.testid = "model-experts";
  const hit = x.hit_ratio == null ? "no lookups yet" : `${Math.round(100 * x.hit_ratio)}% hits`;
  line.textContent = `experts streamed: ${x.resident_experts} of ${x.total_experts} in memory · ${hit} · ${fmtBytes(x.read_bytes_per_second)}/s from disk`;
  line.title = `Its experts do not all stay in memory: a cache of ${fmtBytes(x.budget_bytes)} holds the ones the router picks most (${fmtBytes(x.resident_bytes)} now), the others are read from the model's files when picked. ${fmtBytes(x.read_bytes)} read so far. Below 50% hits the model spends its time reading: give it more memory (expert_cache_bytes) or run a smaller one.`;
  return line;
}
let lastModels = null;
/** The loaded, loading and failed models (the snapshot's), and the picker of the others. */
function models(live) {
  lastModels = live;
  const ul = $("models");
  const shown = [...live];
  // asked here, not yet in a snapshot: show it as loading rather than nothing
  if (loadPending && !shown.some((m) => m.id === loadPending)) {
    const known = library.find((m) => m.id === loadPending) ?? { id: loadPending };
    shown.push({ ...known, state: "loading", progress: null });
  }
  if (!shown.length) {
    const li = document.createElement("li");
    li.className = "empty";
    li.textContent = "No model loaded";
    ul.replaceChildren(li);
  } else {
    // rebuilt only when what it shows changed, so a click is not lost to a re-render
    const items = shown.map(modelItem);
    const key = items.map((li) => `${li.className}|${li.textContent}`).join("\n");
    if (ul.dataset.key !== key) {
      ul.replaceChildren(...items);
      ul.dataset.key = key;
    }
  }
  if (!shown.length) ul.dataset.key = "";
  const loaded = live.filter((m) => m.state === "loaded");
  text("models-summary", loaded.length ? `${loaded.length} loaded · ${fmtBytes(loaded.reduce((a, m) => a + (m.memory_bytes ?? 0), 0))} granted` : "none loaded");

  const busy = new Set(shown.filter((m) => m.state !== "failed").map((m) => m.id));
  const choices = library.filter((m) => m.runnable && !busy.has(m.id));
  const refused = library.filter((m) => !m.runnable);
  const sel = $("model-pick");
  const key = JSON.stringify([choices.map((m) => m.id), refused.map((m) => m.id)]);
  // rebuilt only when the choices change: a rebuild would close an open dropdown
  if (sel.dataset.key !== key) {
    const keep = sel.value;
    const option = (m) => {
      const o = document.createElement("option");
      o.value = m.id;
      // rounded as the server's refusals give the figure (binary units, MB rounded up)
      const needs = m.estimate_bytes ? ` · needs ~${m.estimate_bytes >= 2 ** 30 ? `${(m.estimate_bytes / 2 ** 30).toFixed(1)} GB` : `${Math.ceil(m.estimate_bytes / 2 ** 20)} MB`}` : "";
      o.textContent = m.runnable ? `${m.id}${needs}` : `${m.id} · ${m.unsupported_reason ?? "not runnable"}`;
      o.title = m.unsupported_reason ?? m.path ?? "";
      o.disabled = !m.runnable;
      return o;
    };
    const opts = choices.map(option);
    if (!choices.length) {
      const o = document.createElement("option");
      o.value = "";
      o.textContent = library.length ? "Every runnable model is loaded" : "No other local models found";
      opts.push(o);
    }
    if (refused.length) {
      const g = document.createElement("optgroup");
      g.label = "Cannot run here";
      g.append(...refused.map(option));
      opts.push(g);
    }
    sel.replaceChildren(...opts);
    sel.dataset.key = key;
    if (choices.some((m) => m.id === keep)) sel.value = keep;
  }
  $("model-load").disabled = !choices.length || loadPending != null || app.classList.contains("stale");
  text("model-load", loadPending ? "Loading…" : "Load");
}
$("model-load").onclick = loadModel;

// ---- the whole snapshot ----
function showBanner(msg, kind) {
  const b = $("banner");
  b.hidden = !msg;
  b.className = `banner ${kind || ""}`;
  b.textContent = msg || "";
}

// ---- stale: the stream is down, so every figure on the page is the last one received ----
let lastSnapshotAt = null;
const hms = (d) => [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
/** Greys out the live figures (CSS on `.stale`) and blocks actions that need the server. */
function markStale() {
  app.classList.add("stale");
  const asOf = $("as-of");
  asOf.hidden = false;
  text("as-of", lastSnapshotAt ? `Not live: figures below as of ${hms(lastSnapshotAt)}` : "Not live: no figures received yet");
  // the headline number reads as "now" even greyed: blank it rather than keep an old rate
  text("tok-now", "–");
  for (const b of app.querySelectorAll("button")) b.disabled = true;
  $("bench-profile").disabled = true;
  $("model-pick").disabled = true;
}
/** Undone by the first snapshot after a reconnect; render() then re-enables the buttons. */
function clearStale() {
  const wasStale = app.classList.contains("stale");
  app.classList.remove("stale");
  $("as-of").hidden = true;
  $("bench-profile").disabled = false;
  $("model-pick").disabled = false;
  // the server may have restarted (another data dir, new profiles, finished runs, models)
  if (wasStale) { loadProfiles().catch(() => {}); loadHistory().catch(() => {}); libraryGeneration = null; }
}

// ---- GPU, power and thermals: a line each, hidden (never 0) where unreadable ----
const fmtWatts = (w) => `${w >= 10 ? w.toFixed(0) : w.toFixed(1)} W`;
function showRow(id, value, title = "") {
  const on = value != null;
  $(`${id}-label`).hidden = !on;
  $(id).hidden = !on;
  if (on) text(id, value);
  $(id).title = title;
}
function power(p) {
  const s = p?.sample, e = p?.energy;
  const busy = s?.gpu_busy_ratio;
  const mhz = s?.gpu_frequency_hertz != null ? ` · ${Math.round(s.gpu_frequency_hertz / 1e6)} MHz` : "";
  showRow("gpu", busy == null ? null : `${Math.round(busy * 100)}% busy${mhz}`);
  // chip watts now · tokens per joule over the generating seconds of the last minute · idle
  let line = null;
  if (s?.chip_watts != null) {
    line = fmtWatts(s.chip_watts);
    const tpj = e?.tokens_per_joule_last_minute;
    if (tpj != null) line += ` · ${tpj >= 10 ? tpj.toFixed(0) : tpj.toFixed(2)} tok/J`;
    if (e?.idle_watts != null) line += ` · idle ${fmtWatts(e.idle_watts)}`;
  }
  const parts = ["cpu", "gpu", "ane", "dram", "system"].filter((c) => s?.watts?.[c] != null).map((c) => `${c.toUpperCase()} ${fmtWatts(s.watts[c])}`);
  showRow("power", line, `${parts.join(" · ")}; tok/J over the last minute's generating seconds`);
  const t = s?.thermal_pressure;
  const temps = (s?.temperatures ?? []).map((x) => `${x.sensor.toUpperCase()} ${Math.round(x.celsius)} °C`).join(" · ");
  const title = { serious: "the Mac is throttling", critical: "the Mac is throttling hard" }[t] ?? "";
  showRow("thermal", t == null || t === "nominal" ? null : `${t}${temps ? ` · ${temps}` : ""}`, title);
  $("thermal").dataset.level = t ?? "";
}

function render(s) {
  clearStale();
  lastSnapshotAt = new Date();
  // the headline: the default model (what requests without a `model` get), else another loaded one
  const head = s.models.find((m) => m.default) ?? s.models.find((m) => m.state === "loaded");
  const model = head?.info;
  const st = s.state.state;
  const mode = s.paused ? "paused" : st === "ready" ? "serving" : st === "loading" ? "loading" : "error";
  app.dataset.state = mode;
  text("model", model ? model.id : st === "loading" ? "Loading model…" : "No model");
  $("model").title = model ? model.path : "";
  text("status", { serving: "Serving", paused: "Paused", loading: "Loading", error: st === "failed" ? "Model failed" : "Stopped" }[mode]);
  text("device", `${s.device.toUpperCase()}${model ? ` · ${model.weight_format} · ${fmtBytes(model.weight_bytes)} weights` : ""}`);
  if (s.cluster?.broken) showBanner(`The cluster stopped serving: ${s.cluster.broken}`);
  else if (s.scheduler.restart_required) showBanner(`Restart required: ${s.scheduler.restart_required}`);
  else if (st === "failed") showBanner(`The model failed to load: ${s.state.detail}`);
  else if (st === "loading") showBanner("Loading the model… requests wait until it is ready.", "info");
  else if (s.paused) showBanner("Serving is paused: new requests get 503 until you resume from the menu.", "info");
  else showBanner("");
  memory(s.memory);
  processMemory(s);
  try {
    sparkline(s.throughput);
  } catch (e) {
    // one broken panel must not blank the rest
    console.error("tokens/s chart:", e);
    text("tok-now", "–");
  }
  const t = s.timings;
  text("ttft-p50", fmtSecs(t.ttft_seconds.p50, t.ttft_seconds.count));
  text("ttft-p90", fmtSecs(t.ttft_seconds.p90, t.ttft_seconds.count));
  text("itl-p50", fmtSecs(t.itl_seconds.p50, t.itl_seconds.count));
  text("itl-p90", fmtSecs(t.itl_seconds.p90, t.itl_seconds.count));
  const c = s.caches;
  text("caches", `KV ${fmtInt(c.kv_tokens)} tok · prefix ${c.prefix_entries} held, ${Math.round(100 * (s.prefix_cache_hit_rate ?? 0))}% hits`
    + (c.admission_blocked ? " · admission held" : ""));
  text("running", s.scheduler.running);
  text("waiting", s.scheduler.waiting);
  text("requests", fmtInt(s.totals.requests));
  text("requests-unit", s.totals.requests === 1 ? "request" : "requests");
  text("tokens", fmtInt(s.totals.completion_tokens));
  text("tokens-unit", s.totals.completion_tokens === 1 ? "token" : "tokens");
  recentRequests(s.requests.recent);
  power(s.power);
  cluster(s.cluster);
  alerts(s.alerts);
  // the library changed (a download finished, a folder appeared): refetch the picker's list
  if (s.library_generation !== libraryGeneration) {
    libraryGeneration = s.library_generation;
    loadLibrary().catch(() => {});
  }
  models(s.models);
  bench(s.bench?.active ?? null, s.paused);
  const g = $("grafana-link");
  g.hidden = !s.links.grafana;
  if (s.links.grafana) g.href = s.links.grafana;
  text("version", `mlxbar ${s.version}`);
  app.dataset.updated = String(lastSnapshotAt.getTime()); // the "as of" time when the stream drops
}

// ---- the live stream; EventSource reconnects by itself ----
function connect() {
  const es = new EventSource("/api/metrics/stream");
  es.addEventListener("snapshot", (e) => render(JSON.parse(e.data)));
  // no onopen handler: the page stays stale until the first snapshot proves the figures new
  es.onerror = () => {
    app.dataset.state = "down";
    text("status", "Server not reachable");
    showBanner("The mlxbar server is not answering. Retrying…");
    markStale();
  };
}
window.addEventListener("resize", () => spark && spark.setSize({ width: $("spark").clientWidth, height: 74 }));
connect();
loadProfiles();
loadHistory();
