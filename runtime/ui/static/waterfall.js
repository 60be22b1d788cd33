// A run's waterfall: the spans its traces export (run, turns, model calls, tool calls, sandbox runs) and its
// approval waits as bars on one time axis, parallel calls side by side; where the time went above it. Hover
// a bar for its duration, tokens, model, worker and error. A running run is polled until it ends.
"use strict";

const POLL_MS = 1500;
const KIND_LABEL = {run: "run", turn: "turn", model: "model call", tool: "tool call", script: "sandbox run",
  approval: "waiting for approval"};
const wf = {runId: "", view: null, timer: null};

function share(ms, wall) {
  return wall > 0 ? " (" + Math.round((100 * ms) / wall) + "%)" : "";
}

function renderHead() {
  const v = wf.view;
  const b = v.breakdown;
  const box = clear(document.getElementById("head"));
  document.title = "waterfall " + wf.runId + " · structured-agents";
  document.getElementById("crumb").textContent = "run " + wf.runId + " / waterfall";
  const parts = [["model", b.model_ms, "model calls"], ["tool", b.tool_ms, "tool calls"],
    ["approval", b.approval_ms, "waiting for a person"], ["other", b.other_ms, "other: the host, queues, a worker picking the job up"]];
  const bar = el("div", {class: "where-bar", id: "where-bar"});
  for (const [kind, ms, label] of parts) {
    if (!ms || !b.wall_ms) continue;
    bar.appendChild(place(el("div", {class: "where-part kind-" + kind, title: label + ": " + fmtMs(ms) + share(ms, b.wall_ms)}),
      {width: (100 * ms / b.wall_ms).toFixed(2) + "%"}));
  }
  append(box, [
    el("div", {class: "title-row"}, el("h1", {class: "mono"}, wf.runId), statusBadge(v.status),
      el("a", {class: "muted", href: agentHref(v.actor)}, v.actor), el("span", {class: "spacer"}),
      (v.flags || []).map(flagChip)),
    runTabs(wf.runId, "waterfall"),
    el("h3", {}, "where the time went"),
    bar,
    el("div", {class: "stats", id: "breakdown"},
      stat2("wall time", fmtMs(b.wall_ms), "wall"),
      parts.map(([kind, ms, label]) => stat2(label, ms ? fmtMs(ms) + share(ms, b.wall_ms) : "none", kind)),
      stat2("of it in the sandbox", fmtMs(b.script_ms), "script")),
    v.forked_at ? el("p", {class: "muted"}, "a fork: events before #" + v.forked_at + " are its source's, " +
      "and so are their spans (see the source run's waterfall)") : null,
  ]);
}

function stat2(label, value, kind) {
  return el("div", {class: "stat", dataset: {part: kind}}, el("div", {class: "stat-value"}, value),
    el("div", {class: "stat-label"}, label));
}

// ticks at a round step, about six across
function ticks(total) {
  const steps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 30000, 60000, 120000, 300000,
    600000, 1800000, 3600000];
  const step = steps.find((s) => total / s <= 6) || total / 6;
  const out = [];
  for (let t = 0; t <= total + 1e-9; t += step) out.push(t);
  return out;
}

function tipLines(s) {
  const a = s.attributes || {};
  const lines = [[s.name, ""], ["kind", KIND_LABEL[s.kind] || s.kind],
    ["starts", "+" + fmtMs(s.start_ms)], ["lasts", fmtMs(s.duration_ms) + (s.open ? " so far (still open)" : "")]];
  if (s.tokens) lines.push(["tokens", s.tokens.input + " in + " + s.tokens.output + " out"]);
  const model = a["gen_ai.response.model"] || a["gen_ai.request.model"];
  if (model) lines.push(["model", model]);
  if (a["sa.latency_ms"] !== undefined) lines.push(["model latency", fmtMs(a["sa.latency_ms"])]);
  if (a["gen_ai.tool.name"]) lines.push(["tool", a["gen_ai.tool.name"] + " (call " + String(a["gen_ai.tool.call.id"] || "").split("/").pop() + ")"]);
  if (a["sa.worker"]) lines.push(["worker", a["sa.worker"]]);
  if (a["sa.sandbox_ms"] !== undefined) lines.push(["in the sandbox", fmtMs(a["sa.sandbox_ms"])]);
  if (a["sa.role"]) lines.push(["approver role", a["sa.role"]]);
  if (a["sa.verdict"]) lines.push(["verdict", a["sa.verdict"]]);
  if (a["sa.attempt"]) lines.push(["attempt", String(a["sa.attempt"])]);
  for (const m of s.marks || []) lines.push([m.name, "+" + fmtMs(m.at_ms) + (m.attributes["sa.worker"] ? " on " + m.attributes["sa.worker"] : "")]);
  if (s.error) lines.push(["error", (a["error.type"] ? a["error.type"] + ": " : "") + s.error]);
  lines.push(["events", "#" + s.start_seq + (s.end_seq !== null ? " → #" + s.end_seq : " → (open)") + " (click: open them)"]);
  return lines;
}

function showTip(s, event) {
  const tip = document.getElementById("tip");
  clear(tip);
  for (const [label, value] of tipLines(s)) {
    tip.appendChild(value === "" ? el("div", {class: "tip-title"}, label) :
      el("div", {class: "tip-row"}, el("span", {class: "tip-label"}, label), el("span", {}, value)));
  }
  tip.hidden = false;
  moveTip(event);
}

function moveTip(event) {
  const tip = document.getElementById("tip");
  const x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
  const y = event.clientY + 16 + tip.offsetHeight > window.innerHeight ? event.clientY - tip.offsetHeight - 10 : event.clientY + 16;
  place(tip, {left: Math.max(4, x) + "px", top: Math.max(4, y) + "px"});
}

function hideTip() {
  document.getElementById("tip").hidden = true;
}

function renderWaterfall() {
  const v = wf.view;
  const total = Math.max(v.end_ms, 1);
  const box = clear(document.getElementById("waterfall"));
  const axis = el("div", {class: "wf-axis"});
  for (const t of ticks(total)) {
    axis.appendChild(place(el("span", {class: "wf-tick"}, t ? fmtMs(t) : "0"), {left: (100 * t / total).toFixed(3) + "%"}));
  }
  box.appendChild(el("div", {class: "wf-row wf-head"}, el("div", {class: "wf-label muted"}, "span"), axis));
  for (const s of v.spans) {
    // placed by its start and end (each rounded from the run's start, as the axis's end is: its rounded
    // duration could reach 0.1 ms past a run that ends with it); a bar too short to see is drawn at the
    // least width, kept inside the axis
    const width = Math.max(0.15, 100 * (s.end_ms - s.start_ms) / total);
    const left = Math.max(0, Math.min(100 * s.start_ms / total, 100 - width));
    const bar = place(el("div", {class: "wf-bar kind-" + s.kind + (s.open ? " open" : "") + (s.error ? " error" : ""),
      dataset: {span: s.id}, tabindex: "0", "aria-label": s.name + " " + fmtMs(s.duration_ms)}),
    {left: left.toFixed(3) + "%", width: width.toFixed(3) + "%"});
    const label = fmtMs(s.duration_ms) + (s.tokens ? " · " + (s.tokens.input + s.tokens.output) + " tok" : "");
    // the label after the bar; inside a wide one; before one that ends near the right edge
    const where = s.duration_ms / total > 0.3 ? " inside" : s.end_ms / total > 0.85 ? " before" : "";
    bar.appendChild(el("span", {class: "wf-bar-text" + where}, label));
    bar.addEventListener("mouseenter", (e) => showTip(s, e));
    bar.addEventListener("mousemove", moveTip);
    bar.addEventListener("mouseleave", hideTip);
    bar.addEventListener("click", () => { location.href = runHref(wf.runId) + "#seq-" + s.start_seq; });  // its first event
    bar.addEventListener("focus", () => { const r = bar.getBoundingClientRect(); showTip(s, {clientX: r.left, clientY: r.bottom}); });
    bar.addEventListener("blur", hideTip);
    const name = place(el("div", {class: "wf-label", title: s.name}, el("span", {class: "wf-kind kind-" + s.kind}), s.name),
      {paddingLeft: (8 + 14 * s.depth) + "px"});
    box.appendChild(el("div", {class: "wf-row", dataset: {kind: s.kind, depth: s.depth, open: s.open ? "1" : "0"}}, name,
      el("div", {class: "wf-track"}, bar)));
  }
  if (!v.spans.length) box.appendChild(el("p", {class: "muted"}, "no span yet: the run has not asked the model anything"));
}

async function load() {
  let view;
  try {
    view = await api("/api/runs/" + encodeURIComponent(wf.runId) + "/waterfall");
  } catch (err) {
    showMessage(err.message);
    document.body.dataset.status = "error";
    return;
  }
  wf.view = view;
  renderHead();
  renderWaterfall();
  document.body.dataset.status = view.status || "";
  document.body.dataset.spans = String(view.spans.length);
  document.getElementById("live").hidden = view.ended;
  if (!view.ended) wf.timer = setTimeout(load, POLL_MS);
}

wf.runId = decodeURIComponent(location.pathname.split("/")[2] || "");
load();
