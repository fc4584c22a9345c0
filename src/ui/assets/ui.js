// tandem ui: sends a prompt to POST /api/generate, reads the server-sent events it answers with
// (start, token..., done | error) and draws them. A page that loses its stream (a reload, a dropped
// connection) picks the turn up again from /api/turns/ID/events?after=N.
"use strict";

const $ = (id) => document.getElementById(id);
const el = {
  form: $("ask"), prompt: $("prompt"), send: $("send"), stop: $("stop"), cont: $("continue"), chat: $("chat"),
  mode: $("mode"), policy: $("policy"), routeBy: $("route-by"), level: $("level"),
  levelLabel: $("level-label"), levelValue: $("level-value"), levelHelp: $("level-help"),
  nPredict: $("n-predict"), temp: $("temp"), formError: $("form-error"), turns: $("turns"),
  notice: $("notice"), tip: $("tip"), pair: $("pair"), link: $("link"), chart: $("chart"),
  statsTurn: $("stats-turn"),
};

const state = {
  info: null,
  running: false,
  turns: new Map(), // id -> view (see newTurnView)
  current: null, // the view whose stats and chart are shown
  entropyMax: 16,
};

// ---- controls ----

// Per policy: what the slider means and its range. Entropy scores are nats, a trained router's
// are logits, the others 0..1.
function sliderSpec() {
  const policy = el.policy.value;
  const byTarget = policy === "random" ||
    el.routeBy.querySelector("input:checked").value === "target";
  if (policy === "always" || policy === "never") {
    return { kind: "none", min: 0, max: 1, step: 0.01 };
  }
  if (byTarget) return { kind: "target", min: 0, max: 1, step: 0.01 };
  if (policy === "entropy") return { kind: "threshold", min: 0, max: 8, step: 0.05 };
  if (policy === "router") return { kind: "threshold", min: -10, max: 10, step: 0.05 };
  return { kind: "threshold", min: 0, max: 1, step: 0.01 };
}

// A policy's starting threshold; the trained router's is its file's calibration for a 7% share.
function defaultThreshold(policy) {
  if (policy === "router") return state.info && state.info.defaults.policy === "router" ? state.info.defaults.threshold : 0;
  return policy === "entropy" ? 2 : policy === "margin" ? 0.8 : 0.5;
}

function showLevel() {
  const spec = sliderSpec();
  const v = Number(el.level.value);
  el.levelValue.textContent = spec.kind === "target" ? `${Math.round(v * 100)} %` : v.toFixed(2);
}

function configureSlider(keepValue) {
  const spec = sliderSpec();
  const old = Number(el.level.value);
  el.level.min = spec.min;
  el.level.max = spec.max;
  el.level.step = spec.step;
  const random = el.policy.value === "random";
  for (const r of el.routeBy.querySelectorAll("input")) r.disabled = random || spec.kind === "none";
  el.level.disabled = spec.kind === "none";
  if (spec.kind === "target") {
    el.levelLabel.textContent = "Target cloud share";
    el.levelHelp.textContent = random
      ? "Each token goes to the cloud with this probability."
      : "The threshold follows the scores so that about this share of tokens goes to the cloud.";
    if (!keepValue) el.level.value = 0.2;
  } else if (spec.kind === "threshold") {
    el.levelLabel.textContent = "Threshold";
    el.levelHelp.textContent = "Tokens whose router score is above the threshold go to the cloud.";
    if (!keepValue) el.level.value = defaultThreshold(el.policy.value);
  } else {
    el.levelLabel.textContent = "Threshold";
    el.levelHelp.textContent = el.policy.value === "always"
      ? "Every token goes to the cloud." : "No token goes to the cloud.";
  }
  if (keepValue) el.level.value = Math.min(spec.max, Math.max(spec.min, old));
  showLevel();
}

function requestBody() {
  const spec = sliderSpec();
  const body = {
    prompt: el.prompt.value,
    mode: el.mode.value,
    policy: el.policy.value,
    n_predict: Number(el.nPredict.value),
    temp: Number(el.temp.value),
    continue: el.cont.checked,
    chat: el.chat.checked,
  };
  if (spec.kind === "target") body.target_rate = Number(el.level.value);
  if (spec.kind === "threshold") body.threshold = Number(el.level.value);
  return body;
}

function setRunning(running) {
  state.running = running;
  document.body.dataset.state = running ? "running" : "idle";
  el.send.disabled = running;
  el.stop.disabled = !running;
}

// ---- formatting ----

function fmtBytes(n) {
  if (n == null) return "–";
  if (n < 10 * 1024) return `${n} B`;
  if (n < 10 * 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1048576).toFixed(1)} MiB`;
}
const fmtMs = (v) => (v == null || !isFinite(v) ? "–" : `${v.toFixed(v < 10 ? 1 : 0)} ms`);
const fmtPct = (v) => (v == null || !isFinite(v) ? "–" : `${(v * 100).toFixed(1)} %`);
const visible = (s) => JSON.stringify(s).slice(1, -1); // shows spaces and newlines in a tip

// ---- turns ----

function newTurnView(id) {
  const li = document.createElement("li");
  li.className = "turn";
  li.id = `turn-${id}`;
  const head = document.createElement("p");
  head.className = "turn-head";
  const answer = document.createElement("p");
  answer.className = "answer";
  const foot = document.createElement("p");
  foot.className = "turn-foot";
  li.append(head, answer, foot);
  el.turns.append(li);
  const view = {
    id, li, head, answer, foot, events: 0, tokens: [], start: null, done: null,
    startedAt: performance.now(), live: { tokens: 0, cloud: 0, fallbacks: 0, localMs: 0, cloudMs: 0 },
  };
  state.turns.set(id, view);
  return view;
}

function applyEvent(view, type, data) {
  view.events += 1;
  if (type === "start") {
    view.start = data;
    const how = data.mode === "route"
      ? `${data.policy}, ${data.target_rate != null ? `target ${Math.round(data.target_rate * 100)} %` : `threshold ${Number(data.threshold).toFixed(2)}`}`
      : data.mode;
    view.head.textContent = `#${data.turn} · ${how}${data.continue ? " · continued" : ""}${data.chat ? " · chat" : ""} · ${data.context_tokens} context tokens`;
    const prompt = document.createElement("span");
    prompt.className = "prompt-text";
    prompt.textContent = data.prompt;
    view.answer.append(prompt);
    if (data.cloud && /unavailable|no cloud/.test(data.cloud)) showNotice(`Cloud unavailable, decoding locally: ${data.cloud}`);
  } else if (type === "token") {
    addToken(view, data);
  } else if (type === "text") {
    view.answer.append(document.createTextNode(data.text));
  } else if (type === "done") {
    view.done = data;
    const s = data.stats;
    view.foot.textContent = `${s.tokens} tokens, ${fmtPct(s.cloud_share)} from the cloud in ${s.route_events} route events, ` +
      `${s.tok_s.toFixed(1)} tok/s — stopped: ${data.stop}`;
    // The answer streams silently (a live region per token would be noise); its end is said once.
    if (view === state.current) $("announce").textContent = `Answer done: ${view.foot.textContent}`;
    if (data.cloud_unavailable) {
      showNotice(`Cloud unavailable, decoding locally: ${s.fallbacks} fallback${s.fallbacks === 1 ? "" : "s"}` +
        (s.last_cloud_error ? ` (${s.last_cloud_error})` : ""));
    } else if (view.start && view.start.mode !== "local") {
      hideNotice();
    }
  } else if (type === "error") {
    view.done = { error: data.message };
    view.foot.textContent = `error: ${data.message}`;
    if (view === state.current) $("announce").textContent = `Answer failed: ${data.message}`;
  }
  if (state.current === view) drawStats(view);
}

function addToken(view, t) {
  const span = document.createElement("span");
  span.className = `tok ${t.source}${t.fallback ? " fallback" : ""}`;
  span.textContent = t.text;
  span.tabIndex = view.tokens.length === 0 ? 0 : -1; // one tab stop per answer; arrows move
  span.dataset.i = t.i;
  span.dataset.source = t.source;
  view.answer.append(span);
  view.tokens.push(t);
  const live = view.live;
  live.tokens += 1;
  live.cloud = t.cloud_tokens;
  live.fallbacks = t.fallbacks;
  live.localMs = t.local_ms;
  live.cloudMs = t.cloud_ms;
  if (t.fallback) showNotice(`Cloud unavailable, decoding locally: ${t.fallbacks} fallback${t.fallbacks === 1 ? "" : "s"} so far`);
}

function tipText(view, t) {
  const lines = [`token ${t.i}: "${visible(t.text)}" from the ${t.source === "cloud" ? "cloud model" : "small model"}`];
  if (t.score != null) {
    lines.push(`router score ${t.score.toFixed(3)}` + (t.threshold != null ? ` (threshold ${t.threshold.toFixed(3)})` : ""));
  }
  if (t.edge_top1) {
    lines.push(t.edge_top1.id === t.id ? "the small model would have said the same"
      : `the small model would have said "${visible(t.edge_top1.text)}"`);
  }
  if (t.fallback) lines.push("the cloud failed here: decoded locally");
  lines.push(`${t.ms.toFixed(1)} ms`);
  return lines.join("\n");
}

function tokenAt(target) {
  const span = target.closest && target.closest(".tok[data-i]");
  if (!span) return null;
  const view = state.turns.get(Number(span.closest(".turn").id.slice(5)));
  return view ? { span, view, t: view.tokens[Number(span.dataset.i)] } : null;
}

function showTip(hit) {
  el.tip.textContent = tipText(hit.view, hit.t);
  el.tip.hidden = false;
  const r = hit.span.getBoundingClientRect();
  const w = el.tip.offsetWidth, h = el.tip.offsetHeight;
  const left = Math.max(4, Math.min(window.innerWidth - w - 4, r.left));
  const top = r.bottom + 6 + h < window.innerHeight ? r.bottom + 6 : Math.max(4, r.top - h - 6);
  el.tip.style.left = `${left}px`;
  el.tip.style.top = `${top}px`;
  hit.span.setAttribute("aria-describedby", "tip");
}
function hideTip(span) {
  el.tip.hidden = true;
  if (span) span.removeAttribute("aria-describedby");
}

el.turns.addEventListener("mouseover", (e) => { const hit = tokenAt(e.target); if (hit) showTip(hit); });
el.turns.addEventListener("mouseout", (e) => { const hit = tokenAt(e.target); if (hit) hideTip(hit.span); });
el.turns.addEventListener("focusin", (e) => {
  const hit = tokenAt(e.target);
  if (!hit) return;
  showTip(hit);
  if (state.current !== hit.view) { state.current = hit.view; drawStats(hit.view); }
});
el.turns.addEventListener("focusout", (e) => { const hit = tokenAt(e.target); if (hit) hideTip(hit.span); });
el.turns.addEventListener("keydown", (e) => {
  const hit = tokenAt(e.target);
  if (!hit) return;
  const spans = [...hit.view.answer.querySelectorAll(".tok[data-i]")];
  let i = spans.indexOf(hit.span);
  if (e.key === "ArrowRight") i = Math.min(spans.length - 1, i + 1);
  else if (e.key === "ArrowLeft") i = Math.max(0, i - 1);
  else if (e.key === "Home") i = 0;
  else if (e.key === "End") i = spans.length - 1;
  else return;
  e.preventDefault();
  hit.span.tabIndex = -1;
  spans[i].tabIndex = 0;
  spans[i].focus();
});

function showNotice(text) { el.notice.textContent = text; el.notice.hidden = false; }
function hideNotice() { el.notice.hidden = true; el.notice.textContent = ""; }

// ---- stats and chart ----

function setStat(id, text) { $(id).textContent = text; }

function drawStats(view) {
  el.statsTurn.textContent = view.start ? `(turn #${view.start.turn}${view.done ? "" : ", running"})` : "";
  const live = view.live;
  const s = view.done && view.done.stats;
  const nLocal = live.tokens - live.cloud;
  setStat("stat-tokens", String(s ? s.tokens : live.tokens));
  setStat("stat-cloud-share", fmtPct(s ? s.cloud_share : live.tokens ? live.cloud / live.tokens : null));
  setStat("stat-route-events", s ? String(s.route_events) : "…");
  setStat("stat-fallbacks", String(s ? s.fallbacks : live.fallbacks));
  setStat("stat-local-ms", fmtMs(nLocal ? live.localMs / nLocal : null));
  setStat("stat-cloud-ms", fmtMs(live.cloud ? live.cloudMs / live.cloud : null));
  setStat("stat-ttft", s ? fmtMs(s.ttft_ms) : "…");
  const secs = (performance.now() - view.startedAt) / 1000;
  setStat("stat-tok-s", s ? s.tok_s.toFixed(1) : secs > 0 ? (live.tokens / secs).toFixed(1) : "–");
  setStat("stat-bytes-up", s ? fmtBytes(s.bytes_up) : "…");
  setStat("stat-bytes-down", s ? fmtBytes(s.bytes_down) : "…");
  drawChart(view);
}

const SVG = "http://www.w3.org/2000/svg";
function svg(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  parent.append(node);
  return node;
}

function drawChart(view) {
  const box = el.chart;
  const W = Math.max(100, Math.round(box.clientWidth)), H = Math.max(60, Math.round(box.clientHeight));
  box.setAttribute("viewBox", `0 0 ${W} ${H}`);
  box.replaceChildren();
  const pts = view.tokens.filter((t) => t.score != null);
  if (!pts.length) {
    svg("text", { x: 8, y: H / 2 }, box).textContent =
      view.start && view.start.mode !== "route" ? "router scores exist in route mode" : "no tokens yet";
    return;
  }
  const pad = { l: 28, r: 6, t: 6, b: 14 };
  let ymax = 1;
  for (const t of pts) ymax = Math.max(ymax, t.score, t.threshold ?? 0);
  const n = Math.max(pts.length, 2);
  const x = (i) => pad.l + (i * (W - pad.l - pad.r)) / (n - 1);
  const y = (v) => pad.t + (1 - Math.min(v, ymax) / ymax) * (H - pad.t - pad.b);
  for (const v of [0, ymax / 2, ymax]) {
    svg("text", { x: 2, y: y(v) + 3 }, box).textContent = v.toFixed(ymax > 2 ? 1 : 2);
  }
  svg("text", { x: pad.l, y: H - 2 }, box).textContent = "token →";
  svg("polyline", { class: "score-line", points: pts.map((t, k) => `${x(k)},${y(t.score)}`).join(" ") }, box);
  // The threshold as a step line (it moves when the router follows a target share).
  const steps = [];
  pts.forEach((t, k) => {
    if (t.threshold == null) return;
    steps.push(`${x(Math.max(0, k - 0.5))},${y(t.threshold)}`, `${x(Math.min(n - 1, k + 0.5))},${y(t.threshold)}`);
  });
  if (steps.length) svg("polyline", { class: "threshold", points: steps.join(" ") }, box);
  const r = pts.length > 120 ? 1.8 : 3;
  pts.forEach((t, k) => svg("circle", { class: `${t.source}${t.fallback ? " fallback" : ""}`, cx: x(k), cy: y(t.score), r }, box));
}
window.addEventListener("resize", () => { if (state.current) drawChart(state.current); });

// ---- streaming ----

// Reads server-sent events from a fetch response; calls onEvent(type, data) for each.
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let type = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) type = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) onEvent(type, JSON.parse(data));
    }
  }
}

// Feeds one stream into a turn view (made from the first event when `holder.view` is null);
// resolves whether the turn finished (done or error). holder.view is set even if the stream
// breaks, so the caller can re-attach.
async function follow(response, holder) {
  let finished = false;
  await readEvents(response, (type, data) => {
    if (!holder.view) {
      holder.view = newTurnView(data.turn);
      state.current = holder.view;
    }
    const view = holder.view;
    applyEvent(view, type, data);
    if (type === "done" || type === "error") finished = true;
    if (type === "token" && state.current === view && view.tokens.length === 1) view.li.scrollIntoView({ block: "nearest" });
  });
  return finished;
}

async function generate() {
  el.formError.textContent = "";
  if (!el.prompt.value.trim()) { el.formError.textContent = "Write a prompt first."; el.prompt.focus(); return; }
  setRunning(true);
  const holder = { view: null };
  try {
    const response = await fetch("/api/generate", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(requestBody()),
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      const e = body.error || {};
      el.formError.textContent = response.status === 409
        ? "A generation is already running (one at a time): stop it or wait."
        : `${e.field ? e.field + ": " : ""}${e.message || response.statusText}`;
      setRunning(false);
      return;
    }
    const finished = await follow(response, holder);
    if (!finished && holder.view) await reconnect(holder.view);
  } catch (err) {
    // A stream that broke mid-answer is picked up again; a request that never got an answer
    // is reported (the server may be gone: nothing to re-attach to).
    if (holder.view) await reconnect(holder.view);
    else el.formError.textContent = `the UI server did not answer: ${err.message}`;
  }
  setRunning(false);
}

// The stream broke before the turn finished: attach to it again, with backoff, until it ends.
async function reconnect(view) {
  for (let attempt = 0; attempt < 60; attempt++) {
    if (view.done) return; // its last event arrived after all
    el.link.textContent = "reconnecting…";
    try {
      const r = await fetch(`/api/turns/${view.id}/events?after=${view.events}`);
      if (r.status === 404) {
        el.link.textContent = "connected; that answer is gone (the UI server restarted)";
        return;
      }
      if (r.ok) {
        el.link.textContent = "connected";
        if (await follow(r, { view })) return;
      }
    } catch (_) { /* the server is away: try again */ }
    await new Promise((res) => setTimeout(res, Math.min(4000, 250 * 2 ** attempt)));
  }
  el.link.textContent = "lost the UI server";
}

async function stop() {
  el.stop.disabled = true;
  try {
    await fetch("/api/stop", { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
  } catch (_) { /* nothing to stop */ }
}

// ---- settings survive a reload (per tab: sessionStorage) ----

const SETTINGS_KEY = "tandem-ui-settings";
function saveSettings() {
  const routeBy = el.routeBy.querySelector("input:checked").value;
  const settings = {
    prompt: el.prompt.value, mode: el.mode.value, policy: el.policy.value, routeBy,
    level: el.level.value, nPredict: el.nPredict.value, temp: el.temp.value, cont: el.cont.checked,
    chat: el.chat.checked,
  };
  try { sessionStorage.setItem(SETTINGS_KEY, JSON.stringify(settings)); } catch (_) { /* private mode */ }
}
function restoreSettings() {
  let s = null;
  try { s = JSON.parse(sessionStorage.getItem(SETTINGS_KEY)); } catch (_) { /* none */ }
  if (!s) return;
  el.prompt.value = s.prompt;
  el.mode.value = s.mode;
  el.policy.value = s.policy;
  const radio = el.routeBy.querySelector(`input[value="${s.routeBy === "target" ? "target" : "threshold"}"]`);
  radio.checked = true;
  configureSlider(false);
  el.level.value = s.level;
  configureSlider(true);
  el.nPredict.value = s.nPredict;
  el.temp.value = s.temp;
  el.cont.checked = !!s.cont;
  if (s.chat != null) el.chat.checked = !!s.chat;
}
el.form.addEventListener("input", saveSettings);
el.form.addEventListener("change", saveSettings);

// ---- start-up: defaults, and every kept turn (a reloaded page shows the conversation again) ----

async function load() {
  try {
    const info = await (await fetch("/api/info")).json();
    state.info = info;
    el.pair.textContent = `edge ${info.model} · cloud ${info.cloud ? `${info.cloud} (${info.cloud_api})` : "none"}`;
    const d = info.defaults;
    const routerOption = el.policy.querySelector('option[value="router"]');
    if (info.router) routerOption.textContent = `trained router (${info.router})`;
    else routerOption.remove();
    el.mode.value = d.mode;
    el.policy.value = d.policy;
    el.nPredict.value = d.n_predict;
    el.nPredict.max = info.limits.max_predict;
    el.temp.value = Number(d.temp.toFixed(2)); // a float from C++: 0.8, not 0.800000011920929
    el.chat.checked = !!d.chat;
    if (d.target_rate != null) el.routeBy.querySelector('input[value="target"]').checked = true;
    configureSlider(false);
    el.level.value = d.target_rate != null ? d.target_rate : d.threshold;
    configureSlider(true);
    restoreSettings(); // what this tab had before a reload, over the command line's defaults
    el.link.textContent = "connected";

    const kept = await (await fetch("/api/turns")).json();
    let unfinished = null;
    for (const turn of kept.turns) {
      const view = newTurnView(turn.id);
      for (const e of turn.events) applyEvent(view, e.type, e);
      state.current = view;
      if (!turn.finished) unfinished = view;
    }
    if (state.current) drawStats(state.current);
    if (unfinished) {
      setRunning(true);
      await reconnect(unfinished);
    }
    setRunning(false);
  } catch (err) {
    el.link.textContent = `cannot reach the UI server: ${err.message}`;
    setRunning(false);
  }
}

el.form.addEventListener("submit", (e) => { e.preventDefault(); if (!state.running) generate(); });
el.stop.addEventListener("click", stop);
el.prompt.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey || !e.shiftKey)) {
    e.preventDefault();
    if (!state.running) generate();
  }
});
document.addEventListener("keydown", (e) => { if (e.key === "Escape" && state.running) { e.preventDefault(); stop(); } });
el.policy.addEventListener("change", () => configureSlider(false));
el.routeBy.addEventListener("change", () => configureSlider(false));
el.level.addEventListener("input", showLevel);
setInterval(() => { if (state.running && state.current) drawStats(state.current); }, 500);
load();
