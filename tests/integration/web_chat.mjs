// Chat page end to end (run by web_chat.sh): starts `cairn serve` on a free port with the demo
// model, drives web/index.html in headless Chromium, asks "What is the capital of Japan?", and asserts that
// the streamed reply names Tokyo and that the tokens/s stat is shown.
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

const deadline = (ms, what) => new Promise((_, rej) => setTimeout(() => rej(new Error("timeout: " + what)), ms));

function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => { const p = s.address().port; s.close(() => res(p)); });
  });
}

async function waitHealth(base, server, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (server.exitCode !== null) throw new Error("cairn exited with " + server.exitCode);
    try {
      const r = await fetch(base + "/health");
      if (r.ok) return;
    } catch (_) { /* not up yet */ }
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error("cairn did not answer /health in " + ms + " ms");
}

let failures = 0, passes = 0;
function check(name, ok, detail) {
  if (ok) { passes++; console.log("ok   " + name); } else { failures++; console.log("FAIL " + name + (detail ? ": " + detail : "")); }
}

const port = await freePort();
const base = `http://127.0.0.1:${port}`;
const log = [];
const server = spawn(opt.bin, ["serve", "--model", opt.model, "--host", "127.0.0.1", "--port", String(port)],
                     { stdio: ["ignore", "pipe", "pipe"] });
server.stdout.on("data", (d) => log.push(String(d)));
server.stderr.on("data", (d) => log.push(String(d)));
const profile = fs.mkdtempSync(path.join(os.tmpdir(), "cairn-web-chat-"));
let context = null;
try {
  await waitHealth(base, server, 60000);
  context = await chromium.launchPersistentContext(profile, {
    executablePath: opt.chromium, headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run"],
  });
  const page = context.pages()[0] || await context.newPage();
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  await page.goto(base + "/");
  check("page title", (await page.title()).includes("cairn"));

  // the model list comes from GET /v1/models
  await page.waitForFunction(() => document.querySelector("#model").options.length > 0, null, { timeout: 15000 });
  const models = await page.$$eval("#model option", (o) => o.map((x) => x.value));
  check("model list has demo", models.includes("demo"), JSON.stringify(models));
  if (models.includes("demo")) await page.selectOption("#model", "demo");

  await page.fill("#prompt", "What is the capital of Japan?");
  await page.click("#send");
  const reply = page.locator(".msg.assistant .content").last();
  let text = "";
  try {
    await page.waitForFunction(() => {
      const m = [...document.querySelectorAll(".msg.assistant")].pop();
      return m && !m.classList.contains("streaming") && m.querySelector(".content").textContent.length > 0;
    }, null, { timeout: 60000 });
  } catch (e) { /* reported below */ }
  text = await reply.textContent().catch(() => "");
  check("streamed reply names Tokyo", text.includes("Tokyo"), JSON.stringify(text));
  const tps = await page.textContent("#stat-tps");
  check("tok/s stat shown", /\d+(\.\d+)?\s*tok\/s/.test(tps || ""), JSON.stringify(tps));
  const tokens = await page.textContent("#stat-tokens");
  check("usage shown", /\d+ prompt \+ \d+ completion tokens/.test(tokens || ""), JSON.stringify(tokens));
  const stopHidden = await page.isHidden("#stop");
  check("stop button hidden after the reply", stopHidden);
  check("no page errors", pageErrors.length === 0, pageErrors.join("; "));
  await page.screenshot({ path: path.join(profile, "..", `cairn-web-chat-${port}.png`) }).catch(() => {});
} catch (e) {
  check("run", false, e.stack || String(e));
} finally {
  if (context) await context.close().catch(() => {});
  server.kill("SIGTERM");
  await Promise.race([new Promise((r) => server.once("exit", r)), deadline(10000, "cairn exit").catch(() => server.kill("SIGKILL"))]);
  fs.rmSync(profile, { recursive: true, force: true });
}
if (failures) console.log(log.join("").slice(-4000));
console.log(`${passes} passed, ${failures} failed`);
process.exit(failures ? 1 : 0);
