// The chat page's script (chat.html), served by sil-openai at /chat.js.
"use strict";
const $ = (s) => document.querySelector(s);
const convo = []; // the conversation sent with each request: {role, content, reasoning_content}
let key = sessionStorage.getItem("siliceo-api-key") || "";
let running = null; // {ctl: AbortController, stopped}
let chatNo = 0; // a new chat forgets what an answer still streaming would add

function status(text, isError) {
  $("#status").textContent = text;
  $("#status").className = isError ? "error" : "";
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

// The message of an OpenAI error body, or the status line.
async function errorText(r) {
  try {
    const j = await r.json();
    if (j && j.error && j.error.message) return j.error.message + " (" + r.status + ")";
  } catch (e) { /* not JSON */ }
  return "HTTP " + r.status + " " + r.statusText;
}

async function loadModels() {
  let r;
  try {
    r = await fetch("v1/models", { headers: headers() });
  } catch (e) {
    status("cannot reach the server: " + e.message, true);
    return;
  }
  if (r.status === 401) {
    $("#keybox").hidden = false;
    status(key ? "the server refused this API key" : "the server wants an API key", true);
    $("#key").focus();
    return;
  }
  if (!r.ok) {
    status(await errorText(r), true);
    return;
  }
  const j = await r.json();
  const sel = $("#model");
  const keep = sel.value || sessionStorage.getItem("siliceo-model");
  sel.replaceChildren();
  for (const m of j.data || []) {
    const o = document.createElement("option");
    o.value = o.textContent = m.id;
    sel.append(o);
  }
  if (keep && [...sel.options].some((o) => o.value === keep)) sel.value = keep;
  document.title = sel.value ? sel.value + " - siliceo" : "siliceo";
  status(sel.options.length ? "" : "the server lists no model", !sel.options.length);
  $("#input").focus();
}

function add(cls) {
  const d = document.createElement("div");
  d.className = "msg " + cls;
  $("#log").append(d);
  return d;
}

function nearBottom() {
  const l = $("#log");
  return l.scrollHeight - l.scrollTop - l.clientHeight < 40;
}

function scrollDown(was) {
  if (was) $("#log").scrollTop = $("#log").scrollHeight;
}

// An assistant message: folded reasoning, the answer, a line of figures.
function assistantView() {
  const d = add("assistant");
  d.dataset.state = "streaming";
  const r = document.createElement("details");
  r.className = "reasoning";
  r.hidden = true;
  const s = document.createElement("summary");
  s.textContent = "Thinking...";
  const rt = document.createElement("div");
  rt.className = "text";
  r.append(s, rt);
  const a = document.createElement("div");
  a.className = "answer";
  const m = document.createElement("div");
  m.className = "meta";
  d.append(r, a, m);
  return { d, r, s, rt, a, m, text: "", reasoning: "" };
}

function setRunning(on) {
  $("#send").disabled = on;
  $("#stop").disabled = !on;
}

function request() {
  const msgs = [];
  const sys = $("#system").value.trim();
  if (sys) msgs.push({ role: "system", content: sys });
  const body = { model: $("#model").value, messages: msgs.concat(convo), stream: true,
    stream_options: { include_usage: true }, think: $("#think").checked };
  const t = $("#temperature").value, n = $("#maxtokens").value;
  if (t !== "") body.temperature = Number(t);
  if (n !== "") body.max_tokens = Number(n);
  return body;
}

// One SSE event of the answer; returns false once the stream is over.
function onEvent(v, data, st) {
  if (data === "[DONE]") return false;
  const j = JSON.parse(data);
  if (j.error) throw new Error(j.error.message || "the server failed");
  if (j.usage) st.usage = j.usage;
  const c = j.choices && j.choices[0];
  if (!c) return true;
  const was = nearBottom();
  const dl = c.delta || {};
  if (dl.reasoning_content) {
    if (!st.t_first) st.t_first = performance.now();
    v.reasoning += dl.reasoning_content;
    v.rt.textContent = v.reasoning;
    v.r.hidden = false;
  }
  if (dl.content) {
    if (!st.t_first) st.t_first = performance.now();
    if (v.reasoning && !v.text) v.s.textContent = "Reasoning";
    v.text += dl.content;
    v.a.textContent = v.text;
  }
  if (c.finish_reason) st.finish = c.finish_reason;
  scrollDown(was);
  return true;
}

async function send(question) {
  const no = chatNo;
  convo.push({ role: "user", content: question });
  add("user").textContent = question;
  const v = assistantView();
  const ctl = new AbortController();
  const run = (running = { ctl, stopped: false });
  setRunning(true);
  status("");
  scrollDown(true);
  const st = { t0: performance.now(), t_first: 0, usage: null, finish: null };
  let error = null;
  try {
    const r = await fetch("v1/chat/completions", { method: "POST", headers: headers(),
      body: JSON.stringify(request()), signal: ctl.signal });
    if (!r.ok) throw new Error(await errorText(r));
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "", more = true;
    while (more) {
      const { done, value } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let i;
      while (more && (i = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = ev.split("\n").filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(l[5] === " " ? 6 : 5)).join("\n");
        if (data) more = onEvent(v, data, st);
      }
    }
    if (more) throw new Error("the answer ended early (the connection closed)");
  } catch (e) {
    if (!run.stopped) error = e;
  }
  if (v.reasoning) v.s.textContent = v.text ? "Reasoning" : "Reasoning (no answer yet)";
  if (error) {
    v.d.dataset.state = "error";
    v.m.className = "meta error";
    v.m.textContent = error.message;
    if (no === chatNo) convo.pop(); // not answered: not part of the conversation
  } else {
    v.d.dataset.state = run.stopped ? "stopped" : "done";
    if (no === chatNo) convo.push({ role: "assistant", content: v.text, reasoning_content: v.reasoning });
    const parts = [];
    if (run.stopped) parts.push("stopped");
    else if (st.finish === "length") parts.push("cut at the token limit");
    if (st.usage) {
      parts.push(st.usage.completion_tokens + " tokens");
      const s = (performance.now() - (st.t_first || st.t0)) / 1000;
      if (s > 0 && st.usage.completion_tokens > 1)
        parts.push((st.usage.completion_tokens / s).toFixed(1) + " tokens/s");
    }
    v.m.textContent = parts.join(", ");
  }
  running = null;
  setRunning(false);
  $("#input").focus();
}

function stop() {
  if (!running) return;
  running.stopped = true;
  running.ctl.abort(); // the bridge sees the connection close and the daemon cancels the request
}

$("#compose").addEventListener("submit", (e) => {
  e.preventDefault();
  const q = $("#input").value;
  if (running || !q.trim()) return;
  if (!$("#model").value) {
    status("no model to ask: is the server reachable?", true);
    return;
  }
  $("#input").value = "";
  send(q);
});
$("#input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $("#compose").requestSubmit();
  }
});
document.addEventListener("keydown", (e) => { if (e.key === "Escape") stop(); });
$("#stop").addEventListener("click", stop);
$("#new").addEventListener("click", () => {
  stop();
  chatNo++;
  convo.length = 0;
  $("#log").replaceChildren();
  $("#input").focus();
});
$("#model").addEventListener("change", () => {
  sessionStorage.setItem("siliceo-model", $("#model").value);
  document.title = $("#model").value + " - siliceo";
});
function useKey() {
  key = $("#key").value.trim();
  if (key) sessionStorage.setItem("siliceo-api-key", key);
  else sessionStorage.removeItem("siliceo-api-key");
  $("#key").value = "";
  loadModels();
}
$("#keyset").addEventListener("click", useKey);
$("#key").addEventListener("keydown", (e) => {
  if (e.key === "Enter") useKey();
});
loadModels();
