// The admin dashboard end to end (run by web_admin.sh): starts `cairn serve --api-key` over two
// synthetic models, drives /admin in headless Chromium and checks, against what the server itself
// reports through the admin API:
//   login: a wrong key is refused (the app stays hidden), the right one opens the status page;
//   status: the decode tok/s and running numbers move while a stream runs, and fall back after;
//   models: unload and load a model from the table, its state follows (and the API agrees);
//   settings: a change is saved (the API's settings show it), a bad value is refused naming the
//     field, and after a page reload the form shows the kept value;
//   benchmark: a run adds result rows (cold + partial prefix hit, per length), which survive a
//     reload (localStorage);
//   cache, logs: the tier tables (device, hot, SSD), the SSD folder and its disk, clearing a
//     tier, and the log lines (the load of a model is there) with a level filter;
//   restart: the server goes away (banner), comes back on the same port (banner says so, data
//     flows again);
//   links to the chat page and back; no console errors or page errors on any page (outside the
//   steps that provoke a refused request); a screenshot of every page at 1280 and 390 px.
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";

const opt = {};
for (let i = 2; i < process.argv.length; i += 2) opt[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
const require = createRequire(path.join(opt.src, ".deps/npm/node_modules/"));
const { chromium } = require("playwright-core");
const KEY = "k-admin-test";

function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => res(p)); });
  });
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let failures = 0, passes = 0;
function check(name, ok, detail) {
  if (ok) { passes++; console.log("ok   " + name); } else { failures++; console.log("FAIL " + name + (detail ? ": " + detail : "")); }
}

const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const log = [];
let server = null;
function startServer() {
  server = spawn(opt.bin, ["serve", "--model-dir", opt.models, "--host", "127.0.0.1", "--port", String(port), "--api-key", KEY,
    "--settings", opt.settings, "--kv-cache-size", "2M", "--threads", "1", "--hot-cache-max-size", "4M",
    "--ssd-cache-dir", opt.ssd], { stdio: ["ignore", "pipe", "pipe"] });
  server.stdout.on("data", (d) => log.push(String(d)));
  server.stderr.on("data", (d) => log.push(String(d)));
}
async function stopServer() {
  const s = server;
  s.kill("SIGTERM");
  await Promise.race([new Promise((r) => s.once("exit", r)), sleep(15000).then(() => s.kill("SIGKILL"))]);
  check("server exits cleanly (0: no ASan finding)", s.exitCode === 0, "exit " + s.exitCode + " " + s.signalCode);
}
async function waitHealth(ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (server.exitCode !== null) throw new Error("cairn exited with " + server.exitCode);
    try { if ((await fetch(base + "/health")).ok) return; } catch (_) { /* not up yet */ }
    await sleep(100);
  }
  throw new Error("cairn did not answer /health in " + ms + " ms");
}
const adminApi = async (method, p, body) => {
  const r = await fetch(base + "/admin/api/" + p, { method, headers: { Authorization: "Bearer " + KEY, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body) });
  return { status: r.status, body: await r.json().catch(() => null) };
};
// A streamed completion of n tokens on model m; resolves with its HTTP status when it ends or
// when the signal cuts it (the server then cancels it).
async function stream(m, n, signal) {
  const r = await fetch(base + "/v1/completions", { method: "POST", signal, headers: { Authorization: "Bearer " + KEY, "Content-Type": "application/json" },
    body: JSON.stringify({ model: m, prompt: "hello there", max_tokens: n, ignore_eos: true, temperature: 0, stream: true }) });
  await r.text().catch(() => {});
  return r.status;
}

startServer();
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "cairn-web-admin-"));
let context = null;
const consoleErrors = [];
let provoking = false; // a step that makes the server refuse on purpose (the browser logs those)
try {
  await waitHealth(60000);
  context = await chromium.launchPersistentContext(profile, {
    executablePath: opt.chromium, headless: true, viewport: { width: 1280, height: 900 },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run"],
  });
  const page = context.pages()[0] || await context.newPage();
  page.on("pageerror", (e) => consoleErrors.push("pageerror: " + String(e)));
  page.on("console", (m) => {
    if (m.type() !== "error") return;
    if (provoking && /Failed to load resource|ERR_CONNECTION_REFUSED|net::ERR/.test(m.text())) return;
    consoleErrors.push(m.text() + " @ " + JSON.stringify(m.location()));
  });
  const shot = async (name) => {
    for (const w of [1280, 390]) {
      await page.setViewportSize({ width: w, height: w === 1280 ? 900 : 844 });
      await sleep(150);
      await page.screenshot({ path: path.join(opt.shots, `${name}-${w}.png`), fullPage: true });
    }
    await page.setViewportSize({ width: 1280, height: 900 });
  };
  const gotoPage = async (p) => {
    await page.click(`#tabs a[data-page=${p}]`);
    await page.waitForSelector(`#page-${p}:not([hidden])`, { timeout: 5000 });
  };
  const modelState = (id) => page.$eval(`#models-table tr[data-model="${id}"] td[data-state]`, (e) => e.dataset.state).catch(() => null);

  // ---- login ----
  await page.goto(base + "/admin");
  check("page title", (await page.title()).includes("cairn admin"));
  await page.waitForSelector("#login:not([hidden])", { timeout: 5000 });
  await shot("login");
  provoking = true;
  await page.fill("#login-key", "wrong-key");
  await page.click("#login-submit");
  await page.waitForFunction(() => document.querySelector("#login-error").textContent.length > 0, null, { timeout: 5000 });
  check("wrong key refused", /refused/.test(await page.textContent("#login-error")) && await page.isHidden("#app"),
        await page.textContent("#login-error"));
  await sleep(300);
  provoking = false;
  await page.fill("#login-key", KEY);
  await page.click("#login-submit");
  await page.waitForSelector("#app:not([hidden])", { timeout: 5000 });
  check("right key opens the status page", await page.isVisible("#page-status"));

  // ---- status numbers move while a stream runs ----
  const cut = new AbortController();
  const st = stream("a", 4000, cut.signal);
  let sawDecode = 0, sawRunning = 0;
  for (let i = 0; i < 120 && !(sawDecode > 0 && sawRunning > 0); i++) {
    const d = parseFloat(await page.textContent("#st-decode"));
    const r = parseInt(await page.textContent("#st-running"), 10);
    if (d > 0) sawDecode = d;
    if (r > 0) sawRunning = r;
    await sleep(250);
  }
  check("decode tok/s moves while a stream runs", sawDecode > 0, String(sawDecode));
  check("running shows the stream", sawRunning === 1, String(sawRunning));
  await page.waitForFunction(() => document.querySelectorAll("#st-memory tr").length > 1, null, { timeout: 5000 }).catch(() => {});
  const memText = await page.textContent("#st-memory");
  check("memory by model: model a holds memory", /model a/.test(memText), memText.slice(0, 200));
  await sleep(1500); // a little history for the charts
  cut.abort();
  check("the stream ran (200)", (await st) === 200);
  let settled = false;
  for (let i = 0; i < 40 && !settled; i++) { await sleep(250); settled = (await page.textContent("#st-running")) === "0" && parseFloat(await page.textContent("#st-decode")) === 0; }
  check("numbers fall back when it ends", settled);
  await shot("status"); // the charts hold the stream's rise and fall now
  const ttft = await page.textContent("#st-ttft");
  check("TTFT shown (the stream's first token came)", /^\d+$/.test(ttft.trim()), ttft);

  // ---- models: unload, load ----
  await gotoPage("models");
  await page.waitForSelector('#models-table tr[data-model="a"]', { timeout: 5000 });
  check("model a loaded in the table", (await modelState("a")) === "loaded", await modelState("a"));
  await page.click('#models-table tr[data-model="a"] button[data-action=unload]');
  await page.waitForFunction(() => document.querySelector('#models-table tr[data-model="a"] td[data-state]')?.dataset.state === "unloaded", null, { timeout: 15000 }).catch(() => {});
  check("unload: the state follows", (await modelState("a")) === "unloaded", await modelState("a"));
  check("unload: the API agrees", (await adminApi("GET", "models/a")).body.state === "unloaded");
  await page.click('#models-table tr[data-model="a"] button[data-action=load]');
  await page.waitForFunction(() => document.querySelector('#models-table tr[data-model="a"] td[data-state]')?.dataset.state === "loaded", null, { timeout: 30000 }).catch(() => {});
  check("load: the state follows", (await modelState("a")) === "loaded", await modelState("a"));
  check("load: the API agrees", (await adminApi("GET", "models/a")).body.state === "loaded");

  // ---- settings: save, refuse a bad value, keep across a reload ----
  await page.click('#models-table tr[data-model="b"] button:text("Settings")');
  await page.waitForSelector("#settings-card:not([hidden]) #set-temperature", { timeout: 5000 });
  await page.fill("#set-temperature", "0.35");
  await page.fill("#set-ttl", "120");
  await page.selectOption("#set-kv_dtype", "f32");
  await page.click("#settings-save");
  await page.waitForFunction(() => /Saved|Not saved/.test(document.querySelector("#settings-msg").textContent), null, { timeout: 5000 });
  const savedMsg = await page.textContent("#settings-msg");
  check("settings saved, kv_dtype marked for the next load", /Saved/.test(savedMsg) && /kv_dtype/.test(savedMsg), savedMsg);
  const sb = (await adminApi("GET", "settings")).body.settings.models.b;
  check("the server has the settings", sb && sb.temperature === 0.35 && sb.ttl === 120 && sb.kv_dtype === "f32", JSON.stringify(sb));
  check("the settings file has them", JSON.parse(fs.readFileSync(opt.settings, "utf8")).models.b.temperature === 0.35);
  provoking = true;
  await page.fill("#set-top_p", "5");
  await page.click("#settings-save");
  await page.waitForFunction(() => /Not saved/.test(document.querySelector("#settings-msg").textContent), null, { timeout: 5000 }).catch(() => {});
  const badMsg = await page.textContent("#settings-msg");
  check("a bad value is refused, naming the field", /Not saved/.test(badMsg) && /top_p/.test(badMsg), badMsg);
  check("the bad value is not kept", (await adminApi("GET", "settings")).body.settings.models.b.top_p === undefined);
  await sleep(300);
  provoking = false;
  await shot("models");
  await page.reload();
  await page.waitForSelector("#app:not([hidden])", { timeout: 5000 });
  check("a reload keeps the session (sessionStorage)", await page.isVisible("#page-models"));
  await page.waitForSelector('#models-table tr[data-model="b"]', { timeout: 5000 });
  await page.click('#models-table tr[data-model="b"] button:text("Settings")');
  await page.waitForSelector("#settings-card:not([hidden]) #set-temperature", { timeout: 5000 });
  check("after a reload the form shows the kept value", (await page.inputValue("#set-temperature")) === "0.35",
        await page.inputValue("#set-temperature"));

  // ---- benchmark ----
  await gotoPage("bench");
  await page.waitForFunction(() => document.querySelector("#bench-model").options.length >= 2, null, { timeout: 5000 });
  await page.selectOption("#bench-model", "a");
  await page.fill("#bench-lengths", "40,120");
  await page.fill("#bench-output", "6");
  await page.click("#bench-run");
  await page.waitForFunction(() => document.querySelectorAll("#bench-table tr.bench-row").length >= 4, null, { timeout: 30000 }).catch(() => {});
  const rows = await page.$$eval("#bench-table tr.bench-row", (t) => t.map((r) => [...r.cells].map((c) => c.textContent)));
  check("benchmark adds a cold and a prefix-hit row per length", rows.length === 4, JSON.stringify(rows));
  const api = (await adminApi("GET", "bench")).body;
  check("benchmark rows have speeds", api.results.length === 4 && api.results.every((x) => !x.error && x.prefill_tok_s > 0 && x.decode_tok_s > 0),
        JSON.stringify(api.results));
  const pre = api.results.find((x) => x.kind === "prefix" && x.prompt_tokens === 120);
  check("the prefix run hits the cache in part", pre && pre.cached_tokens > 0 && pre.cached_tokens < 120, JSON.stringify(pre));
  check("the table shows the server's numbers", rows.length === 4 && rows[0][3] === String(api.results[0].prompt_tokens), JSON.stringify(rows[0]));
  provoking = true;
  const busy = await Promise.all([adminApi("POST", "bench", { model: "a", prompt_tokens: [40], output_tokens: 200 }),
                                  adminApi("POST", "bench", { model: "a", prompt_tokens: [40], output_tokens: 200 })]);
  check("a second run while one runs gets 409", busy.map((x) => x.status).sort().join(",") === "202,409", busy.map((x) => x.status).join(","));
  await sleep(300);
  provoking = false;
  for (let i = 0; i < 100 && (await adminApi("GET", "bench")).body.state === "running"; i++) await sleep(100);
  await page.reload();
  await page.waitForSelector("#app:not([hidden])", { timeout: 5000 });
  await page.waitForFunction(() => document.querySelectorAll("#bench-table tr.bench-row").length >= 4, null, { timeout: 5000 }).catch(() => {});
  check("benchmark rows survive a reload", (await page.$$("#bench-table tr.bench-row")).length >= 4);
  await shot("bench");

  // ---- cache, logs ----
  await gotoPage("cache");
  await page.waitForFunction(() => document.querySelectorAll("#cache-table tr").length > 1 && !/No model/.test(document.querySelector("#cache-table").textContent), null, { timeout: 5000 }).catch(() => {});
  const cacheRows = await page.$$eval("#cache-table tr", (t) => t.slice(1).map((r) => [...r.cells].map((c) => c.textContent)));
  check("cache table lists model a's device tier", cacheRows.some((r) => r[0] === "a" && r[1] === "device"), JSON.stringify(cacheRows));
  await page.click("button.clear[data-tier=device]");
  await page.waitForFunction(() => /Cleared/.test(document.querySelector("#cache-msg").textContent), null, { timeout: 5000 }).catch(() => {});
  check("clear the device tier", /Cleared the device tier/.test(await page.textContent("#cache-msg")), await page.textContent("#cache-msg"));
  check("cache table has the hot and SSD tiers", cacheRows.some((r) => r[0] === "a" && r[1] === "hot") && cacheRows.some((r) => r[0] === "a" && r[1] === "ssd"),
        JSON.stringify(cacheRows));
  await page.waitForFunction((d) => document.querySelector("#cache-ssd").textContent.includes(d), opt.ssd, { timeout: 5000 }).catch(() => {});
  const ssdText = await page.textContent("#cache-ssd");
  check("the SSD folder and its disk are shown", ssdText.includes(opt.ssd) && /Disk: .* used of /.test(ssdText), ssdText);
  await shot("cache");
  await gotoPage("logs");
  await page.waitForFunction(() => /loaded a in/.test(document.querySelector("#log-lines").textContent), null, { timeout: 5000 }).catch(() => {});
  check("logs show the load of model a", /loaded a in/.test(await page.textContent("#log-lines")));
  await page.selectOption("#log-level", "warn");
  await sleep(1200);
  const warnText = await page.textContent("#log-lines");
  check("level filter warn hides info lines", !/ info  /.test(warnText), warnText.slice(0, 300));
  await page.selectOption("#log-level", "info");
  await page.waitForFunction(() => / info  /.test(document.querySelector("#log-lines").textContent), null, { timeout: 5000 }).catch(() => {});
  await shot("logs");

  // ---- links ----
  check("link to the chat page", (await page.getAttribute("#chat-link", "href")) === "/");
  const chat = await context.newPage();
  chat.on("pageerror", (e) => consoleErrors.push("chat pageerror: " + String(e)));
  await chat.goto(base + "/");
  check("the chat page links back", (await chat.getAttribute("#admin-link", "href")) === "/admin");
  await chat.close();

  // ---- a restart under the page ----
  await gotoPage("status");
  provoking = true;
  await stopServer();
  await page.waitForSelector("#banner:not([hidden])", { timeout: 10000 }).catch(() => {});
  check("banner when the server is gone", /reconnecting/.test(await page.textContent("#banner")), await page.textContent("#banner"));
  startServer();
  await waitHealth(60000);
  await page.waitForFunction(() => /Reconnected/.test(document.querySelector("#banner").textContent), null, { timeout: 10000 }).catch(() => {});
  check("banner says reconnected", /Reconnected/.test(await page.textContent("#banner")), await page.textContent("#banner"));
  await sleep(300);
  provoking = false;
  await sleep(1500);
  check("data flows again after the restart", (await page.textContent("#st-running")) === "0" && await page.isVisible("#app"));
  check("no console errors on any page", consoleErrors.length === 0, consoleErrors.join(" | "));
} catch (e) {
  check("run", false, e.stack || String(e));
} finally {
  if (context) await context.close().catch(() => {});
  if (server && server.exitCode === null) await stopServer();
  fs.rmSync(profile, { recursive: true, force: true });
}
if (failures) console.log(log.join("").slice(-4000));
console.log(`${passes} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
