// cairn's admin dashboard (web/admin.html). Vanilla JS, no dependencies: talks to /admin/api/
// with the key the login screen keeps in sessionStorage, polls once a second, draws its charts on
// canvas, keeps benchmark results in localStorage. When the server goes away a banner says so and
// the page reconnects by itself; a 401 sends it back to the login screen.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY = "cairn.admin.key", ADMIN_KEY = "cairn.admin.adminKey", BENCH = "cairn.admin.bench";
const HISTORY = 120; // chart samples (one a second)
const PAGES = ["status", "models", "cache", "bench", "logs"];
const CATS = ["weights", "kv", "state", "hot", "scratch", "other", "mapped", "request"];
const CAT_COLORS = ["#2f6fde", "#e08a1e", "#8e5bd8", "#2e9d5b", "#c93c3c", "#888888", "#5fb3c9", "#d6b12c"];

const state = {
  page: "status", offline: false, stats: null, memory: null, cache: null, models: null,
  samples: [], lastSample: null, logsSeq: 0, logs: [], benchRun: 0, benchPolling: false,
  settingsModel: null, settings: null, timer: null,
};

// ---- formatting ----
function fmtBytes(n) {
  if (n == null || isNaN(n)) return "-";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(n < 10 ? 2 : 1) : String(Math.round(n))) + " " + u[i];
}
const fmtNum = (x, d = 1) => (x == null || !isFinite(x) ? "-" : Number(x).toFixed(d));
const pct = (x) => (x == null || !isFinite(x) ? "-" : (100 * x).toFixed(1) + " %");
function ago(unix) {
  if (!unix) return "never";
  const s = Math.max(0, Date.now() / 1000 - unix);
  if (s < 60) return Math.round(s) + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  return Math.round(s / 3600) + " h ago";
}
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat()) if (k != null) e.append(k instanceof Node ? k : String(k));
  return e;
}
function setMsg(el, text, kind) { el.textContent = text || ""; el.className = "msg" + (kind ? " " + kind : ""); }

// ---- the API ----
function headers() {
  const hd = { "Content-Type": "application/json" };
  const k = sessionStorage.getItem(KEY), ak = sessionStorage.getItem(ADMIN_KEY);
  if (k) hd["Authorization"] = "Bearer " + k;
  if (ak) hd["x-admin-key"] = ak;
  return hd;
}
class AuthError extends Error {}
class OfflineError extends Error {}
// Returns {status, body}; throws AuthError on 401, OfflineError when the server can't be reached.
async function api(method, path, body) {
  let r;
  try {
    r = await fetch("/admin/api/" + path, { method, headers: headers(), body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new OfflineError(String(e));
  }
  let j = null;
  try { j = await r.json(); } catch (_) { /* not JSON */ }
  if (r.status === 401) throw new AuthError(j && j.error ? j.error.message : "unauthorized");
  return { status: r.status, body: j };
}
const errText = (res) => (res.body && res.body.error ? res.body.error.message + (res.body.error.param ? " (" + res.body.error.param + ")" : "") : "HTTP " + res.status);

function onApiError(e) {
  if (e instanceof AuthError) { showLogin("The key was refused: " + e.message); return; }
  if (e instanceof OfflineError) { goOffline(); return; }
  console.warn(e);
}

// ---- connection banner ----
function goOffline() {
  if (state.offline) return;
  state.offline = true;
  const b = $("banner");
  b.textContent = "Lost the connection to the server: reconnecting...";
  b.className = "banner";
  b.hidden = false;
}
async function checkBack() {
  try {
    const r = await fetch("/health", { cache: "no-store" });
    if (!r.ok) return;
  } catch (_) { return; }
  state.offline = false;
  state.lastSample = null; // counters restarted with the server
  const b = $("banner");
  b.textContent = "Reconnected.";
  b.className = "banner ok";
  setTimeout(() => { if (!state.offline) b.hidden = true; }, 3000);
  refreshPage(true);
}

// ---- login ----
function showLogin(msg) {
  stopTimer();
  $("app").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = msg || "";
  $("login-key").focus();
}
async function tryLogin(key, adminKey) {
  sessionStorage.setItem(KEY, key);
  sessionStorage.setItem(ADMIN_KEY, adminKey);
  try {
    const r = await api("GET", "stats");
    if (r.status !== 200) throw new Error(errText(r));
    state.stats = r.body;
    return true;
  } catch (e) {
    sessionStorage.removeItem(KEY);
    sessionStorage.removeItem(ADMIN_KEY);
    $("login-error").textContent = e instanceof OfflineError ? "The server does not answer." : "The key was refused: " + e.message;
    return false;
  }
}
$("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("login-submit").disabled = true;
  const ok = await tryLogin($("login-key").value, $("login-admin-key").value);
  $("login-submit").disabled = false;
  if (ok) enterApp();
});
$("logout").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  sessionStorage.removeItem(ADMIN_KEY);
  showLogin("");
});

function enterApp() {
  $("login").hidden = true;
  $("app").hidden = false;
  $("login-key").value = $("login-admin-key").value = "";
  route();
  startTimer();
}

// ---- pages ----
function route() {
  const p = (location.hash || "#status").slice(1);
  state.page = PAGES.includes(p) ? p : "status";
  for (const q of PAGES) $("page-" + q).hidden = q !== state.page;
  for (const a of document.querySelectorAll("#tabs a[data-page]")) a.classList.toggle("active", a.dataset.page === state.page);
  refreshPage(true);
}
window.addEventListener("hashchange", route);
window.addEventListener("resize", () => { drawStatusCharts(); drawBenchChart(); });

function startTimer() { stopTimer(); state.timer = setInterval(tick, 1000); }
function stopTimer() { if (state.timer) clearInterval(state.timer); state.timer = null; }
async function tick() {
  if (state.offline) { await checkBack(); return; }
  await refreshPage(false);
}
let refreshing = false;
async function refreshPage(first) {
  if (refreshing) return;
  refreshing = true;
  try {
    await sampleStats(); // the charts keep their history on every page
    if (state.page === "status") renderStatus();
    else if (state.page === "models") await refreshModels(first);
    else if (state.page === "cache") await refreshCache();
    else if (state.page === "bench") await refreshBench(first);
    else if (state.page === "logs") await refreshLogs(first);
  } catch (e) {
    onApiError(e);
  } finally {
    refreshing = false;
  }
}

// ---- status ----
function sumModels(st, f) { return (st.models || []).reduce((a, m) => a + (f(m) || 0), 0); }
async function sampleStats() {
  const r = await api("GET", "stats");
  if (r.status !== 200) return;
  const st = r.body;
  state.stats = st;
  state.memory = st.memory_guard || null;
  const now = performance.now() / 1000;
  const cur = {
    t: now,
    gen: sumModels(st, (m) => m.generated_tokens),
    prefill: sumModels(st, (m) => m.prompt_tokens - m.cached_tokens_served),
    lat: st.latency || {},
    running: sumModels(st, (m) => m.running),
    waiting: sumModels(st, (m) => m.waiting) + ((st.memory_guard && st.memory_guard.waiting_for_memory) || 0),
  };
  const prev = state.lastSample;
  state.lastSample = cur;
  if (!prev || cur.gen < prev.gen) return; // first sample, or the server restarted
  const dt = Math.max(1e-3, cur.t - prev.t);
  const mg = st.memory_guard, dev = mg && mg.device;
  let lookups = 0, hits = 0, thits = 0, tlook = 0;
  for (const m of st.models || []) {
    if (!m.loaded) continue;
    lookups++; hits += m.prefix_hit_rate || 0;
    for (const t of ["hot", "ssd"]) {
      const x = m.tiers && m.tiers[t];
      if (x && x.enabled) { thits += x.hits || 0; tlook += (x.hits || 0) + (x.misses || 0); }
    }
  }
  state.samples.push({
    prefill: Math.max(0, (cur.prefill - prev.prefill) / dt),
    decode: Math.max(0, (cur.gen - prev.gen) / dt),
    running: cur.running, waiting: cur.waiting,
    host: mg && mg.limit ? mg.reserved / mg.limit : 0,
    device: dev && dev.limit ? dev.reserved / dev.limit : 0,
    hit: lookups ? hits / lookups : 0, tierHit: tlook ? thits / tlook : 0,
    lat: cur.lat,
  });
  if (state.samples.length > HISTORY) state.samples.shift();
}
function windowMean(countKey, totalKey) {
  const s = state.samples;
  if (s.length < 2) return null;
  const a = s[Math.max(0, s.length - 11)].lat, b = s[s.length - 1].lat;
  const n = (b[countKey] || 0) - (a[countKey] || 0);
  if (n > 0) return ((b[totalKey] - a[totalKey]) / n) * 1000;
  return b[countKey] ? (b[totalKey] / b[countKey]) * 1000 : null; // nothing recent: since start
}
function renderStatus() {
  const s = state.samples, last = s[s.length - 1];
  const st = state.stats || {};
  $("st-prefill").textContent = last ? fmtNum(last.prefill, 0) : "-";
  $("st-decode").textContent = last ? fmtNum(last.decode, 1) : "-";
  const ttft = windowMean("ttft_count", "ttft_s_total"), itl = windowMean("inter_token_count", "inter_token_s_total");
  $("st-ttft").textContent = ttft == null ? "-" : fmtNum(ttft, 0);
  $("st-itl").textContent = itl == null ? "-" : fmtNum(itl, 1);
  $("st-running").textContent = String(sumModels(st, (m) => m.running));
  $("st-waiting").textContent = String(sumModels(st, (m) => m.waiting) + ((st.memory_guard && st.memory_guard.waiting_for_memory) || 0));
  drawStatusCharts();
  renderMemory($("st-memory"), state.memory);
  renderTiers($("st-tiers"), st);
}
function drawStatusCharts() {
  if (state.page !== "status") return;
  const s = state.samples;
  lineChart($("chart-tps"), [s.map((x) => x.prefill), s.map((x) => x.decode)], {});
  lineChart($("chart-req"), [s.map((x) => x.running), s.map((x) => x.waiting)], { integer: true });
  const dev = state.memory && state.memory.device;
  $("legend-device").hidden = !dev;
  lineChart($("chart-mem"), dev ? [s.map((x) => x.host), s.map((x) => x.device)] : [s.map((x) => x.host)], { max: 1, percent: true });
  lineChart($("chart-hit"), [s.map((x) => x.hit), s.map((x) => x.tierHit)], { max: 1, percent: true });
}
function budgetBlock(title, b) {
  const wrap = h("div", { class: "memrow" });
  if (!b) return wrap;
  wrap.append(h("div", {}, h("b", {}, title), h("span", { class: "muted" },
    fmtBytes(b.reserved) + " reserved of " + fmtBytes(b.limit) + " (" + pct(b.limit ? b.reserved / b.limit : 0) + "), " + fmtBytes(b.available) + " free")));
  const bar = h("div", { class: "membar", title: title });
  const cats = b.by_category || {};
  CATS.forEach((c, i) => {
    if (!cats[c] || !b.limit) return;
    bar.append(h("i", { style: `width:${(100 * cats[c]) / b.limit}%;background:${CAT_COLORS[i]}`, title: c + " " + fmtBytes(cats[c]) }));
  });
  wrap.append(bar);
  const rows = (b.holders || []).map((x) => h("tr", {}, h("td", {}, x.owner), ...CATS.map((c) => h("td", {}, x[c] ? fmtBytes(x[c]) : "")), h("td", {}, fmtBytes(x.total))));
  if (rows.length) {
    wrap.append(h("div", { class: "scroll" }, h("table", { class: "table" },
      h("tr", {}, h("th", {}, "holder"), ...CATS.map((c) => h("th", {}, c)), h("th", {}, "total")), rows)));
  } else {
    wrap.append(h("p", { class: "muted small" }, "Nothing is reserved."));
  }
  return wrap;
}
function renderMemory(el, mg) {
  el.replaceChildren();
  if (!mg) { el.append(h("p", { class: "muted" }, "No memory guard on this server.")); return; }
  el.append(h("div", { class: "keys" }, CATS.map((c, i) => h("span", {}, h("i", { style: "background:" + CAT_COLORS[i] }), c))));
  el.append(budgetBlock("Host memory", mg));
  if (mg.device) el.append(budgetBlock("Device memory", mg.device));
}
function renderTiers(el, st) {
  const rows = [];
  for (const m of st.models || []) {
    if (!m.loaded) continue;
    const kb = m.kv_blocks || {};
    rows.push(h("tr", {}, h("td", {}, m.id), h("td", {}, "device"), h("td", {}, "-"),
      h("td", {}, `${kb.used || 0} used, ${kb.cached || 0} cached / ${kb.total || 0}`), h("td", {}, pct(m.prefix_hit_rate))));
    for (const t of ["hot", "ssd"]) {
      const x = m.tiers && m.tiers[t];
      if (!x || !x.enabled) continue;
      const look = (x.hits || 0) + (x.misses || 0);
      rows.push(h("tr", {}, h("td", {}, m.id), h("td", {}, t), h("td", {}, fmtBytes(x.bytes) + " / " + fmtBytes(x.max_bytes)),
        h("td", {}, String(x.blocks)), h("td", {}, look ? pct(x.hits / look) : "-")));
    }
  }
  el.replaceChildren(h("tr", {}, ["model", "tier", "bytes", "blocks", "hit rate"].map((t) => h("th", {}, t))));
  if (rows.length) el.append(...rows);
  else el.append(h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No model is loaded.")));
}

// ---- charts (canvas) ----
function css(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }
function prepCanvas(cv) {
  const w = cv.clientWidth || 300, hgt = cv.clientHeight || 160, dpr = window.devicePixelRatio || 1;
  if (cv.width !== Math.round(w * dpr) || cv.height !== Math.round(hgt * dpr)) { cv.width = Math.round(w * dpr); cv.height = Math.round(hgt * dpr); }
  const g = cv.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, hgt);
  g.font = "11px system-ui, sans-serif";
  return { g, w, h: hgt };
}
function axisLabel(v, o) {
  if (o.percent) return Math.round(v * 100) + "%";
  if (v >= 1000) return (v / 1000).toFixed(1) + "k";
  return o.integer ? String(Math.round(v)) : v < 10 ? v.toFixed(1) : String(Math.round(v));
}
function lineChart(cv, series, o) {
  const { g, w, h: H } = prepCanvas(cv);
  const L = 40, R = 8, T = 8, B = 16;
  let max = o.max || 0;
  if (!o.max) for (const s of series) for (const v of s) max = Math.max(max, v);
  if (!o.max) max = o.integer ? Math.max(2, 2 * Math.ceil(max / 2)) : max <= 0 ? 1 : max * 1.1;
  g.strokeStyle = css("--line"); g.fillStyle = css("--muted"); g.lineWidth = 1;
  for (let i = 0; i <= 2; i++) {
    const y = T + ((H - T - B) * i) / 2;
    g.beginPath(); g.moveTo(L, y); g.lineTo(w - R, y); g.stroke();
    g.fillText(axisLabel(max * (1 - i / 2), o), 2, y + 4);
  }
  g.fillText(HISTORY + " s", L, H - 3);
  g.fillText("now", w - R - 22, H - 3);
  const colors = [css("--c1"), css("--c2")];
  series.forEach((s, k) => {
    if (!s.length) return;
    g.strokeStyle = colors[k % 2]; g.lineWidth = 2; g.beginPath();
    s.forEach((v, i) => {
      const x = L + ((w - L - R) * (HISTORY - s.length + i)) / (HISTORY - 1);
      const y = T + (H - T - B) * (1 - Math.min(v, max) / max);
      if (i) g.lineTo(x, y); else g.moveTo(x, y);
    });
    g.stroke();
  });
}
function barChart(cv, groups, color) { // groups: [{label, sub, v}]
  const { g, w, h: H } = prepCanvas(cv);
  const L = 40, R = 8, T = 8, B = 30;
  let max = 0;
  for (const x of groups) max = Math.max(max, x.v || 0);
  max = max <= 0 ? 1 : max * 1.1;
  g.strokeStyle = css("--line"); g.fillStyle = css("--muted"); g.lineWidth = 1;
  for (let i = 0; i <= 2; i++) {
    const y = T + ((H - T - B) * i) / 2;
    g.beginPath(); g.moveTo(L, y); g.lineTo(w - R, y); g.stroke();
    g.fillText(axisLabel(max * (1 - i / 2), {}), 2, y + 4);
  }
  if (!groups.length) { g.fillText("No results yet.", L + 8, T + 20); return; }
  const gw = (w - L - R) / groups.length, bw = Math.max(2, Math.min(36, gw / 1.6));
  groups.forEach((x, i) => {
    const cx = L + gw * i + gw / 2;
    const bh = ((H - T - B) * (x.v || 0)) / max;
    g.fillStyle = color;
    g.fillRect(cx - bw / 2, H - B - bh, bw, bh);
    g.fillStyle = css("--muted");
    const label = x.label.length > 14 ? x.label.slice(0, 13) + "…" : x.label;
    if (gw > 34 || i % Math.ceil(34 / gw) === 0) g.fillText(label, cx - g.measureText(label).width / 2, H - B + 12);
    if (x.sub && gw > 34) g.fillText(x.sub, cx - g.measureText(x.sub).width / 2, H - B + 24);
  });
}

// ---- models ----
async function refreshModels(first) {
  const r = await api("GET", "models");
  if (r.status !== 200) { setMsg($("models-msg"), errText(r), "error"); return; }
  state.models = r.body.data || [];
  renderModels();
  if (first && state.settingsModel) await openSettings(state.settingsModel);
}
function memTotal(m) {
  const a = (m.memory && m.memory.total) || 0, d = (m.device_memory && m.device_memory.total) || 0;
  return a + d;
}
function renderModels() {
  const t = $("models-table");
  const opt = { pinned: 1, ttl: 1, alias: 1, "last used": 1, requests: 1 }; // hidden on a phone
  t.replaceChildren(h("tr", {}, ["model", "state", "memory", "pinned", "ttl", "alias", "last used", "requests", ""].map((x) => h("th", { class: opt[x] ? "opt" : null }, x))));
  for (const m of state.models) {
    const st = h("span", { class: "state " + m.state }, m.state);
    const cell = h("td", { "data-state": m.state }, st);
    if (m.state === "loading" && m.progress) {
      const p = m.progress.percent || 0;
      cell.append(h("span", { class: "progress", title: m.progress.phase }, h("i", { style: `width:${p}%` })),
        h("span", { class: "muted small" }, " " + Math.round(p) + "% " + m.progress.phase));
    }
    if (m.last_error && m.state === "unloaded") cell.append(h("div", { class: "error small" }, m.last_error));
    const busy = (m.running_requests || 0) + (m.queued_requests || 0);
    const act = (label, action, cls) => h("button", { type: "button", class: "small " + (cls || "ghost"), "data-action": action,
      onclick: () => modelAction(m.id, action) }, label);
    const actions = h("td", { class: "actions-cell" }, h("div", { class: "actions" },
      m.state === "unloaded" ? act("Load", "load") : null,
      m.state === "loaded" ? act("Unload", "unload") : null,
      m.pinned ? act("Unpin", "unpin") : act("Pin", "pin"),
      h("button", { type: "button", class: "small ghost", onclick: () => openSettings(m.id) }, "Settings")));
    t.append(h("tr", { "data-model": m.id }, h("td", {}, m.id), cell,
      h("td", {}, memTotal(m) ? fmtBytes(memTotal(m)) : m.memory_estimate ? "~" + fmtBytes(m.memory_estimate.total + ((m.device_memory_estimate && m.device_memory_estimate.total) || 0)) : "-"),
      h("td", { class: "opt" }, m.pinned ? "yes" : "no"), h("td", { class: "opt" }, m.ttl ? m.ttl + " s" : "-"), h("td", { class: "opt" }, m.alias || "-"),
      h("td", { class: "opt" }, ago(m.last_used)), h("td", { class: "opt" }, String(busy)), actions));
  }
}
async function modelAction(id, action) {
  try {
    const r = await api("POST", "models/" + id + "/" + action);
    if (r.status >= 300) setMsg($("models-msg"), action + " " + id + ": " + errText(r), "error");
    else setMsg($("models-msg"), action + " " + id + ": ok", "ok");
    await refreshModels(false);
  } catch (e) { onApiError(e); }
}
$("rescan").addEventListener("click", async () => {
  try {
    const r = await api("POST", "models/rescan");
    if (r.status !== 200) { setMsg($("models-msg"), errText(r), "error"); return; }
    setMsg($("models-msg"), `Rescanned: ${r.body.added} new, ${r.body.removed} gone.`, "ok");
    await refreshModels(false);
  } catch (e) { onApiError(e); }
});

// The per-model settings (api/settings.c's keys; reload: takes effect on the next load).
const SETTINGS = [
  { k: "temperature", type: "number", step: "0.05" }, { k: "top_p", type: "number", step: "0.05" },
  { k: "top_k", type: "int" }, { k: "min_p", type: "number", step: "0.01" },
  { k: "repetition_penalty", type: "number", step: "0.05" }, { k: "ttl", type: "number", step: "1", label: "ttl (s)" },
  { k: "alias", type: "text" }, { k: "pinned", type: "bool" },
  { k: "context_length", type: "int", reload: true }, { k: "kv_dtype", type: "select", options: ["", "bf16", "f32"], reload: true },
  { k: "tiers", type: "bool", reload: true }, { k: "special_tokens_in_content", type: "bool" },
  { k: "chat_template_kwargs", type: "json", wide: true, label: "chat_template_kwargs (JSON)" },
];
async function openSettings(id) {
  const r = await api("GET", "settings");
  if (r.status !== 200) { setMsg($("models-msg"), errText(r), "error"); return; }
  state.settingsModel = id;
  state.settings = r.body.settings || {};
  const cur = (state.settings.models && state.settings.models[id]) || {};
  const glob = state.settings.global || {};
  $("settings-card").hidden = false;
  $("settings-model").textContent = id;
  const f = $("settings-form");
  f.replaceChildren();
  for (const s of SETTINGS) {
    const v = cur[s.k];
    const ph = glob[s.k] !== undefined ? "global: " + JSON.stringify(glob[s.k]) : "default";
    let input;
    if (s.type === "bool") {
      input = h("select", { id: "set-" + s.k }, h("option", { value: "" }, "(" + ph + ")"), h("option", { value: "true" }, "true"), h("option", { value: "false" }, "false"));
      input.value = v === true ? "true" : v === false ? "false" : "";
    } else if (s.type === "select") {
      input = h("select", { id: "set-" + s.k }, s.options.map((o) => h("option", { value: o }, o || "(" + ph + ")")));
      input.value = v || "";
    } else if (s.type === "json") {
      input = h("textarea", { id: "set-" + s.k, rows: 2, placeholder: ph });
      input.value = v === undefined ? "" : JSON.stringify(v);
    } else {
      input = h("input", { id: "set-" + s.k, type: s.type === "text" ? "text" : "number", step: s.step || "1", placeholder: ph });
      input.value = v === undefined || v === null ? "" : String(v);
    }
    f.append(h("label", { class: "field" + (s.wide ? " wide" : ""), title: s.reload ? "takes effect on the next load" : "applies at once" },
      h("span", { class: s.reload ? "reload" : null }, s.label || s.k), input));
  }
  f.append(h("div", { class: "buttons wide" }, h("button", { type: "submit", class: "primary", id: "settings-save" }, "Save"),
    h("button", { type: "button", class: "ghost", onclick: () => { $("settings-card").hidden = true; state.settingsModel = null; } }, "Close")));
  setMsg($("settings-msg"), "");
}
$("settings-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const id = state.settingsModel;
  const cur = (state.settings.models && state.settings.models[id]) || {};
  const patch = {};
  for (const s of SETTINGS) {
    const raw = $("set-" + s.k).value.trim();
    let v;
    if (raw === "") v = null; // removes the model's own value: the global one applies again
    else if (s.type === "bool") v = raw === "true";
    else if (s.type === "int") v = Number.isInteger(Number(raw)) ? Number(raw) : raw;
    else if (s.type === "number") v = isNaN(Number(raw)) ? raw : Number(raw);
    else if (s.type === "json") {
      try { v = JSON.parse(raw); } catch (_) { setMsg($("settings-msg"), s.k + ": not valid JSON", "error"); return; }
    } else v = raw;
    if (v === null && cur[s.k] === undefined) continue;
    if (JSON.stringify(v) !== JSON.stringify(cur[s.k])) patch[s.k] = v;
  }
  if (!Object.keys(patch).length) { setMsg($("settings-msg"), "Nothing changed."); return; }
  try {
    const r = await api("PUT", "settings", { models: { [id]: patch } });
    if (r.status !== 200) { setMsg($("settings-msg"), "Not saved: " + errText(r), "error"); return; }
    const later = r.body.on_next_load || [];
    setMsg($("settings-msg"), "Saved." + (later.length ? " On the next load: " + later.map((x) => x.split(".").pop()).join(", ") + "." : " Applied at once."), "ok");
    state.settings = r.body.settings || state.settings;
    await refreshModels(false);
  } catch (e) { onApiError(e); }
});

// ---- cache ----
async function refreshCache() {
  const r = await api("GET", "cache");
  if (r.status !== 200) { setMsg($("cache-msg"), errText(r), "error"); return; }
  const t = $("cache-table");
  t.replaceChildren(h("tr", {}, ["model", "tier", "bytes", "blocks", "hits", "misses", "hit rate", "evictions"].map((x) => h("th", {}, x))));
  for (const m of r.body.models || []) {
    const d = m.device || {};
    t.append(h("tr", {}, h("td", {}, m.id), h("td", {}, "device"), h("td", {}, "-"),
      h("td", {}, `${d.blocks_used || 0} used, ${d.blocks_cached || 0} cached, ${d.blocks_free || 0} free / ${d.blocks_total || 0}`),
      h("td", {}, "-"), h("td", {}, "-"), h("td", {}, pct(d.prefix_hit_rate)), h("td", {}, String(d.evictions || 0))));
    for (const k of ["hot", "ssd"]) {
      const x = m[k];
      if (!x) continue;
      const look = x.hits + x.misses;
      t.append(h("tr", {}, h("td", {}, m.id), h("td", {}, k + (x.enabled ? "" : " (off)")), h("td", {}, fmtBytes(x.bytes) + (x.max_bytes ? " / " + fmtBytes(x.max_bytes) : "")),
        h("td", {}, String(x.blocks)), h("td", {}, String(x.hits)), h("td", {}, String(x.misses)), h("td", {}, look ? pct(x.hits / look) : "-"), h("td", {}, "-")));
    }
  }
  if (!(r.body.models || []).length) t.append(h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No model is loaded.")));
  const ct = state.memory && state.memory.cache_tiers;
  const el = $("cache-ssd");
  el.replaceChildren();
  if (!ct || !ct.ssd_dir) { el.append(h("p", { class: "muted" }, "No SSD tier (start cairn with --ssd-cache-dir DIR).")); return; }
  let used = 0;
  for (const m of r.body.models || []) if (m.ssd) used += m.ssd.bytes || 0;
  el.append(h("p", {}, h("b", {}, "Folder: "), h("code", {}, ct.ssd_dir)),
    h("p", {}, `Held by loaded models: ${fmtBytes(used)}; budget per model: ${ct.ssd_max_bytes ? fmtBytes(ct.ssd_max_bytes) : "default"}`));
  if (ct.ssd_disk_bytes) {
    const usedDisk = ct.ssd_disk_bytes - ct.ssd_disk_free_bytes;
    el.append(h("p", {}, `Disk: ${fmtBytes(usedDisk)} used of ${fmtBytes(ct.ssd_disk_bytes)} (${pct(usedDisk / ct.ssd_disk_bytes)})`),
      h("div", { class: "membar" }, h("i", { style: `width:${(100 * usedDisk) / ct.ssd_disk_bytes}%;background:var(--c1)` })));
  }
}
for (const b of document.querySelectorAll("button.clear")) {
  b.addEventListener("click", async () => {
    try {
      const r = await api("POST", "cache/clear", { tier: b.dataset.tier });
      setMsg($("cache-msg"), r.status === 200 ? "Cleared the " + b.dataset.tier + " tier." : errText(r), r.status === 200 ? "ok" : "error");
      await refreshCache();
    } catch (e) { onApiError(e); }
  });
}

// ---- benchmark ----
function benchHistory() {
  try { return JSON.parse(localStorage.getItem(BENCH) || "[]"); } catch (_) { return []; }
}
async function refreshBench(first) {
  if (first) {
    const r = await api("GET", "models");
    if (r.status === 200) {
      const sel = $("bench-model"), keep = sel.value;
      sel.replaceChildren(...(r.body.data || []).map((m) => h("option", { value: m.id }, m.id)));
      if (keep) sel.value = keep;
    }
    renderBench();
  }
  if (!state.benchPolling) return;
  const r = await api("GET", "bench");
  if (r.status !== 200) return;
  const b = r.body;
  setMsg($("bench-msg"), b.state === "running" ? `Running: ${b.results.length} of ${b.requests_planned} requests done...` : "");
  if (b.state === "running") return;
  state.benchPolling = false;
  $("bench-run").disabled = false;
  if (b.state === "error") { setMsg($("bench-msg"), "The benchmark failed: " + b.error, "error"); return; }
  const hist = benchHistory();
  hist.push({ at: Date.now(), model: b.model, output_tokens: b.output_tokens, results: b.results });
  while (hist.length > 50) hist.shift();
  localStorage.setItem(BENCH, JSON.stringify(hist));
  const failed = b.results.filter((x) => x.error);
  setMsg($("bench-msg"), failed.length ? `Done, ${failed.length} requests failed: ${failed[0].error}` : "Done.", failed.length ? "error" : "ok");
  renderBench();
}
function renderBench() {
  const hist = benchHistory();
  const t = $("bench-table");
  t.replaceChildren(h("tr", {}, ["run", "model", "kind", "prompt", "cached", "output", "TTFT ms", "prefill tok/s", "decode tok/s", "ITL ms"].map((x) => h("th", {}, x))));
  const groups = [];
  hist.forEach((run, i) => {
    for (const x of run.results) {
      t.append(h("tr", { class: "bench-row" }, h("td", {}, "#" + (i + 1) + " " + new Date(run.at).toLocaleTimeString()), h("td", {}, run.model),
        h("td", {}, x.kind), h("td", {}, String(x.prompt_tokens)), h("td", {}, String(x.cached_tokens)), h("td", {}, String(x.output_tokens)),
        x.error ? h("td", { colspan: 4, class: "error" }, x.error) : h("td", {}, fmtNum(x.ttft_ms, 1)),
        x.error ? null : h("td", {}, fmtNum(x.prefill_tok_s, 0)), x.error ? null : h("td", {}, fmtNum(x.decode_tok_s, 1)),
        x.error ? null : h("td", {}, fmtNum(x.itl_ms, 2))));
      if (!x.error) groups.push({ label: `#${i + 1} ${x.prompt_tokens}`, sub: x.kind, prefill: x.prefill_tok_s, decode: x.decode_tok_s });
    }
  });
  if (!hist.length) t.append(h("tr", {}, h("td", { colspan: 10, class: "muted" }, "No runs yet.")));
  state.benchGroups = groups.slice(-24);
  drawBenchChart();
}
function drawBenchChart() {
  if (state.page !== "bench") return;
  const g = state.benchGroups || [];
  barChart($("chart-bench-prefill"), g.map((x) => ({ label: x.label, sub: x.sub, v: x.prefill })), css("--c1"));
  barChart($("chart-bench-decode"), g.map((x) => ({ label: x.label, sub: x.sub, v: x.decode })), css("--c2"));
}
$("bench-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const lengths = $("bench-lengths").value.split(/[\s,]+/).filter(Boolean).map(Number);
  const body = { model: $("bench-model").value, prompt_tokens: lengths, output_tokens: Number($("bench-output").value), prefix_hit: $("bench-prefix").checked };
  try {
    const r = await api("POST", "bench", body);
    if (r.status !== 202) { setMsg($("bench-msg"), "Not started: " + errText(r), "error"); return; }
    state.benchPolling = true;
    $("bench-run").disabled = true;
    setMsg($("bench-msg"), "Running...");
  } catch (e) { onApiError(e); }
});
$("bench-clear").addEventListener("click", () => { localStorage.removeItem(BENCH); renderBench(); });

// ---- logs ----
async function refreshLogs(first) {
  const lvl = $("log-level").value;
  if (first) { state.logsSeq = 0; state.logs = []; }
  const r = await api("GET", "logs/" + state.logsSeq + "/" + lvl);
  if (r.status !== 200) return;
  if (r.body.last_seq < state.logsSeq) { state.logsSeq = 0; state.logs = []; return; } // the server restarted
  for (const l of r.body.lines) state.logs.push(l);
  if (state.logs.length > 2000) state.logs.splice(0, state.logs.length - 2000);
  state.logsSeq = r.body.last_seq; // the server filtered by level: everything up to here is seen
  if (!first && !r.body.lines.length) return;
  const pre = $("log-lines");
  pre.replaceChildren(...state.logs.map((l) => h("div", { class: l.level }, l.text)));
  if ($("log-follow").checked) pre.scrollTop = pre.scrollHeight;
}
$("log-level").addEventListener("change", () => refreshLogs(true).catch(onApiError));

// ---- start ----
(async () => {
  if (sessionStorage.getItem(KEY) !== null) {
    try {
      const r = await api("GET", "stats");
      if (r.status === 200) { enterApp(); return; }
    } catch (e) {
      if (e instanceof OfflineError) { enterApp(); goOffline(); return; }
    }
  }
  // no key in this tab yet: ask (a server without --api-key takes an empty one)
  showLogin("");
})();
