// cairn's chat page: lists models (GET /v1/models), streams replies from
// POST /v1/chat/completions (SSE), shows reasoning and tool calls apart from the answer,
// tokens/s and cached prompt tokens, and can stop a reply. Optional demo tools are run
// here in the page so a tool call can be answered and the model can finish its reply.
"use strict";

const $ = (id) => document.getElementById(id);
const el = {
  model: $("model"), messages: $("messages"), empty: $("empty"), form: $("form"),
  prompt: $("prompt"), send: $("send"), stop: $("stop"), apiKey: $("api-key"),
  temperature: $("temperature"), maxTokens: $("max-tokens"), system: $("system-prompt"),
  tools: $("demo-tools"), settings: $("settings"), settingsToggle: $("settings-toggle"),
  newChat: $("new-chat"), tps: $("stat-tps"), ttft: $("stat-ttft"), tokens: $("stat-tokens"),
  cached: $("stat-cached"), status: $("status"),
};

let history = [];       // OpenAI-format messages of this conversation (without the system prompt)
let controller = null;  // AbortController of the request in flight

const DEMO_TOOLS = [
  { type: "function", function: { name: "get_weather", description: "Get the current weather in a city.",
    parameters: { type: "object", properties: { city: { type: "string", description: "The city name" } },
                  required: ["city"] } } },
  { type: "function", function: { name: "get_time", description: "Get the current local time in a city.",
    parameters: { type: "object", properties: { city: { type: "string", description: "The city name" } },
                  required: ["city"] } } },
  { type: "function", function: { name: "calculator", description: "Evaluate an arithmetic expression.",
    parameters: { type: "object", properties: {
      expression: { type: "string", description: "The expression, for example 2 + 2" } },
      required: ["expression"] } } },
];

// ---------------------------------------------------------------- settings, kept in localStorage

const SAVED = ["apiKey", "temperature", "maxTokens", "system"];
for (const k of SAVED) {
  const v = localStorage.getItem("cairn." + k);
  if (v !== null) el[k].value = v;
  el[k].addEventListener("change", () => localStorage.setItem("cairn." + k, el[k].value));
}
el.tools.checked = localStorage.getItem("cairn.tools") === "1";
el.tools.addEventListener("change", () => localStorage.setItem("cairn.tools", el.tools.checked ? "1" : "0"));

el.settingsToggle.addEventListener("click", () => {
  el.settings.hidden = !el.settings.hidden;
  el.settingsToggle.setAttribute("aria-expanded", String(!el.settings.hidden));
});

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = el.apiKey.value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function setStatus(text, isError) {
  el.status.textContent = text || "";
  el.status.classList.toggle("error", !!isError);
}

// ---------------------------------------------------------------- models

async function loadModels() {
  try {
    const r = await fetch("v1/models", { headers: headers() });
    if (!r.ok) throw new Error(await errorText(r));
    const body = await r.json();
    const ids = (body.data || []).map((m) => m.id);
    const keep = el.model.value || localStorage.getItem("cairn.model");
    el.model.replaceChildren(...ids.map((id) => new Option(id, id)));
    if (keep && ids.includes(keep)) el.model.value = keep;
    setStatus(ids.length ? "" : "no models loaded", !ids.length);
  } catch (e) {
    setStatus("could not list models: " + e.message, true);
  }
}
el.model.addEventListener("change", () => localStorage.setItem("cairn.model", el.model.value));
el.apiKey.addEventListener("change", loadModels);

async function errorText(r) {
  const text = await r.text();
  try {
    const j = JSON.parse(text);
    if (j.error) return (j.error.message || JSON.stringify(j.error)) + " (HTTP " + r.status + ")";
  } catch (_) { /* not JSON */ }
  return "HTTP " + r.status + (text ? ": " + text.slice(0, 200) : "");
}

// ---------------------------------------------------------------- rendering

function addMessage(role) {
  el.empty.hidden = true;
  const box = document.createElement("div");
  box.className = "msg " + role;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = role === "user" ? "You" : role === "tool" ? "Tool result" : "Assistant";
  box.append(who);
  const parts = { box };
  if (role === "assistant") {
    parts.reasoning = document.createElement("details");
    parts.reasoning.className = "reasoning";
    parts.reasoning.hidden = true;
    parts.reasoning.open = true;
    const sum = document.createElement("summary");
    sum.textContent = "Reasoning";
    parts.reasoningText = document.createElement("div");
    parts.reasoningText.className = "reasoning-text";
    parts.reasoning.append(sum, parts.reasoningText);
    box.append(parts.reasoning);
  }
  parts.content = document.createElement("div");
  parts.content.className = "content";
  box.append(parts.content);
  if (role === "assistant") {
    parts.calls = document.createElement("div");
    parts.calls.className = "tool-calls";
    box.append(parts.calls);
    parts.meta = document.createElement("div");
    parts.meta.className = "meta";
    box.append(parts.meta);
  }
  el.messages.append(box);
  scrollDown();
  return parts;
}

function scrollDown() {
  el.messages.scrollTop = el.messages.scrollHeight;
}

function renderCalls(parts, calls) {
  parts.calls.replaceChildren(...calls.filter(Boolean).map((c) => {
    const d = document.createElement("div");
    d.className = "tool-call";
    const name = document.createElement("span");
    name.className = "tool-name";
    name.textContent = "tool call: " + (c.function.name || "?");
    const args = document.createElement("code");
    args.textContent = c.function.arguments;
    d.append(name, args);
    return d;
  }));
}

// ---------------------------------------------------------------- streaming

// Splits an SSE byte stream into events and hands each `data:` payload to onData.
async function readSSE(body, onData) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      let line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line.endsWith("\r")) line = line.slice(0, -1);
      if (line === "") {               // end of one event
        if (data.length && onData(data.join("\n")) === false) return;
        data = [];
      } else if (line.startsWith("data:")) {
        data.push(line.slice(line[5] === " " ? 6 : 5));
      }                                // comments (":") and other fields are ignored
    }
  }
  if (data.length) onData(data.join("\n"));
}

function fmt(n, digits) {
  return Number(n).toFixed(digits);
}

async function complete() {
  const model = el.model.value;
  const messages = [];
  const sys = el.system.value.trim();
  if (sys) messages.push({ role: "system", content: sys });
  messages.push(...history);
  const req = {
    model, messages, stream: true, stream_options: { include_usage: true },
    max_tokens: parseInt(el.maxTokens.value, 10) || 512,
  };
  const temp = parseFloat(el.temperature.value);
  if (!Number.isNaN(temp)) req.temperature = temp;
  if (el.tools.checked) req.tools = DEMO_TOOLS;

  const parts = addMessage("assistant");
  parts.box.classList.add("streaming");
  let content = "", reasoning = "", calls = [], usage = null, finish = null, chunks = 0;
  const t0 = performance.now();
  let tFirst = 0;
  controller = new AbortController();
  setBusy(true);
  setStatus("waiting for the model...");
  try {
    const r = await fetch("v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(req), signal: controller.signal,
    });
    if (!r.ok) throw new Error(await errorText(r));
    setStatus("streaming...");
    await readSSE(r.body, (data) => {
      if (data === "[DONE]") return false;
      let ev;
      try { ev = JSON.parse(data); } catch (_) { return true; }
      if (ev.error) throw new Error(ev.error.message || JSON.stringify(ev.error));
      if (ev.usage) usage = ev.usage;
      for (const ch of ev.choices || []) {
        const d = ch.delta || {};
        let got = false;
        if (d.reasoning_content) {
          reasoning += d.reasoning_content;
          parts.reasoning.hidden = false;
          parts.reasoningText.textContent = reasoning;
          got = true;
        }
        if (d.content) {
          content += d.content;
          parts.content.textContent = content;
          got = true;
        }
        if (d.tool_calls) {
          for (const tc of d.tool_calls) {
            const i = tc.index ?? calls.length;
            const c = calls[i] || (calls[i] = { id: "", type: "function", function: { name: "", arguments: "" } });
            if (tc.id) c.id = tc.id;
            if (tc.function && tc.function.name) c.function.name += tc.function.name;
            if (tc.function && tc.function.arguments) c.function.arguments += tc.function.arguments;
          }
          renderCalls(parts, calls);
          got = true;
        }
        if (got) {
          chunks++;
          if (!tFirst) tFirst = performance.now();
          showSpeed(chunks, tFirst, performance.now(), null);
        }
        if (ch.finish_reason) finish = ch.finish_reason;
      }
      scrollDown();
      return true;
    });
    setStatus("");
  } catch (e) {
    if (e.name === "AbortError") {
      finish = "stopped";
      setStatus("stopped");
    } else {
      finish = "error";
      const err = document.createElement("div");
      err.className = "error-box";
      err.textContent = e.message;
      parts.box.append(err);
      setStatus("error", true);
    }
  } finally {
    controller = null;
    setBusy(false);
    parts.box.classList.remove("streaming");
  }
  const tEnd = performance.now();
  if (tFirst) showSpeed(usage ? usage.completion_tokens : chunks, tFirst, tEnd, usage);
  if (tFirst) el.ttft.textContent = "first token " + fmt((tFirst - t0) / 1000, 2) + " s";
  const meta = [];
  if (finish) meta.push(finish);
  if (usage) meta.push(usage.completion_tokens + " tokens");
  if (el.tps.textContent) meta.push(el.tps.textContent);
  parts.meta.textContent = meta.join(" \u00b7 ");

  const msg = { role: "assistant", content };
  calls = calls.filter(Boolean);
  if (calls.length) msg.tool_calls = calls;
  if (content || calls.length) history.push(msg);
  return { finish, calls };
}

function showSpeed(tokens, tFirst, tNow, usage) {
  const secs = (tNow - tFirst) / 1000;
  if (tokens > 1 && secs > 0) el.tps.textContent = fmt((tokens - 1) / secs, 1) + " tok/s";
  else if (usage) el.tps.textContent = tokens + " tok in " + fmt(secs, 2) + " s (tok/s n/a)";
  if (usage) {
    el.tokens.textContent = usage.prompt_tokens + " prompt + " + usage.completion_tokens + " completion tokens";
    const det = usage.prompt_tokens_details;
    const cached = det && det.cached_tokens != null ? det.cached_tokens : null;
    el.cached.textContent = cached == null ? "" : cached + " cached";
  }
}

function setBusy(busy) {
  el.send.hidden = busy;
  el.stop.hidden = !busy;
  el.prompt.disabled = false;
}

// ---------------------------------------------------------------- demo tools, run in the page

// JSON with ", " and ": " separators, as Python's json.dumps writes it (and as the demo
// model saw tool results in training).
function pyJSON(v) {
  if (Array.isArray(v)) return "[" + v.map(pyJSON).join(", ") + "]";
  if (v && typeof v === "object") {
    return "{" + Object.entries(v).map(([k, x]) => JSON.stringify(k) + ": " + pyJSON(x)).join(", ") + "}";
  }
  return JSON.stringify(v);
}

function runTool(call) {
  let args = {};
  try { args = JSON.parse(call.function.arguments || "{}"); } catch (_) {
    return pyJSON({ error: "arguments are not valid JSON" });
  }
  const city = String(args.city || "");
  const seed = [...city].reduce((h, c) => (h * 31 + c.charCodeAt(0)) >>> 0, 7);
  switch (call.function.name) {
    case "get_weather": {
      const conds = ["sunny", "cloudy", "rainy", "windy", "partly cloudy"];
      return pyJSON({ city, temperature_c: (seed % 30) - 2, condition: conds[seed % conds.length] });
    }
    case "get_time": {
      const d = new Date();
      return pyJSON({ city, time: String(d.getHours()).padStart(2, "0") + ":" +
                                        String(d.getMinutes()).padStart(2, "0") });
    }
    case "calculator": {
      const v = calc(String(args.expression || ""));
      return pyJSON(v === null ? { error: "cannot evaluate" } : { result: v });
    }
    default:
      return pyJSON({ error: "unknown tool " + call.function.name });
  }
}

// A small arithmetic evaluator (+ - * / and parentheses), no eval().
function calc(s) {
  const toks = s.match(/\d+(?:\.\d+)?|[-+*/()]/g);
  if (!toks || toks.join("") !== s.replace(/\s+/g, "")) return null;
  let i = 0;
  const peek = () => toks[i];
  function atom() {
    const t = toks[i++];
    if (t === "(") { const v = expr(); if (toks[i++] !== ")") throw 0; return v; }
    if (t === "-") return -atom();
    if (t === undefined || !/^\d/.test(t)) throw 0;
    return parseFloat(t);
  }
  function term() {
    let v = atom();
    while (peek() === "*" || peek() === "/") v = toks[i++] === "*" ? v * atom() : v / atom();
    return v;
  }
  function expr() {
    let v = term();
    while (peek() === "+" || peek() === "-") v = toks[i++] === "+" ? v + term() : v - term();
    return v;
  }
  try {
    const v = expr();
    return i === toks.length && Number.isFinite(v) ? Math.round(v * 1e9) / 1e9 : null;
  } catch (_) {
    return null;
  }
}

// ---------------------------------------------------------------- conversation

async function send(text) {
  if (controller) return;
  if (!el.model.value) await loadModels();
  history.push({ role: "user", content: text });
  addMessage("user").content.textContent = text;
  for (let round = 0; round < 4; round++) {
    const { finish, calls } = await complete();
    if (!el.tools.checked || !calls.length || finish === "stopped" || finish === "error") break;
    for (const c of calls) {
      const result = runTool(c);
      history.push({ role: "tool", tool_call_id: c.id, content: result });
      const p = addMessage("tool");
      p.content.textContent = c.function.name + " \u2192 " + result;
    }
  }
  el.prompt.focus();
}

el.form.addEventListener("submit", (e) => {
  e.preventDefault();
  const text = el.prompt.value.trim();
  if (!text || controller) return;
  el.prompt.value = "";
  send(text);
});
el.prompt.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    el.form.requestSubmit();
  }
});
el.stop.addEventListener("click", () => { if (controller) controller.abort(); });
el.newChat.addEventListener("click", () => {
  if (controller) controller.abort();
  history = [];
  el.messages.replaceChildren(el.empty);
  el.empty.hidden = false;
  for (const s of [el.tps, el.ttft, el.tokens, el.cached]) s.textContent = "";
  setStatus("");
});
for (const b of document.querySelectorAll(".example")) {
  b.addEventListener("click", () => {
    if (b.dataset.tools) { el.tools.checked = true; localStorage.setItem("cairn.tools", "1"); }
    el.prompt.value = b.textContent;
    el.form.requestSubmit();
  });
}

loadModels();
el.prompt.focus();
