// A run's page: overview, fork tree, the timeline grouped by turns with parallel tool calls side by side,
// each event expandable; live following over server-sent events; "fork here". In an exported file the
// run comes from the embedded JSON block and nothing talks to a server. Its commands (cancel, approve,
// deny, fork with an edit, fetch a payload) are in run-control.js, loaded before this file.
"use strict";

const state = {
  runId: "", view: null, events: [], byKey: new Map(), open: new Set(), details: new Map(),
  exported: false, source: null, pending: false,
  running: new Map(), ticker: null,  // call id -> the notice of its tool job still running (live)
};

function embedded() {
  const block = document.getElementById("run-data");
  return block ? JSON.parse(block.textContent) : null;
}

// -- overview --------------------------------------------------------------------------------------------

function stat(label, value) {
  return el("div", {class: "stat"}, el("div", {class: "stat-value"}, value), el("div", {class: "stat-label"}, label));
}

function runLink(runId) {
  return state.exported ? el("span", {class: "mono"}, runId) : el("a", {class: "mono", href: runHref(runId)}, runId);
}

function treeNode(node) {
  const label = el("span", {class: node.current ? "tree-current" : ""},
    node.current ? el("span", {class: "mono"}, node.run_id) : runLink(node.run_id),
    node.at !== null && node.at !== undefined ? el("span", {class: "muted"}, " forked at seq " + node.at) : null,
    node.status ? [" ", statusBadge(node.status)] : null);
  return el("li", {}, label, node.children.length ? el("ul", {}, node.children.map(treeNode)) : null);
}

function firstOf(kind) {
  return state.events.find((e) => e.kind === kind);
}

function renderOverview() {
  const view = state.view;
  const s = view.summary;
  const box = clear(document.getElementById("overview"));
  document.title = "run " + state.runId + " · structured-agents";
  document.getElementById("crumb").textContent = "run " + state.runId;
  const started = state.events[0];
  const ending = state.events.find((e) => ["run.completed", "run.failed", "run.cancelled"].includes(e.kind));
  const buttons = [];
  if (!state.exported && !ending) buttons.push(cancelControl());
  if (!state.exported) {
    buttons.push(el("a", {class: "button", id: "export", href: "/api/runs/" + encodeURIComponent(state.runId) +
      "/export", download: "run-" + state.runId + ".html"}, "export HTML"));
  } else {
    buttons.push(el("span", {class: "muted"}, "exported" + (view.exported_at ? " " + fmtTime(view.exported_at) : "") +
      " · a file, not live"));
  }
  append(box, [
    el("div", {class: "title-row"},
      el("h1", {class: "mono"}, state.runId), statusBadge(s.status),
      state.exported ? el("span", {class: "muted"}, view.actor) : el("a", {class: "muted", href: agentHref(view.actor)}, view.actor),
      el("span", {class: "spacer"}), buttons),
    state.exported ? null : runTabs(state.runId, "events"),
    el("div", {class: "stats"},
      stat("events", s.events), stat("turns", s.turns), stat("model calls", s.model_calls),
      stat("tool calls", s.tool_calls), stat("tokens", s.prompt_tokens + " + " + s.completion_tokens),
      stat("model time", fmtMs(s.model_ms)), stat("tool time", fmtMs(s.tool_ms)),
      stat("wall time", fmtMs(s.wall_s * 1000)), stat("started", fmtTime(started ? started.ts : 0))),
  ]);
  const flags = view.flags || [];
  if (flags.length) {  // a run whose status says all is well, and whose events say look again
    box.appendChild(el("div", {class: "flags", id: "flags"}, el("h3", {}, "worth a second look"),
      el("ul", {}, flags.map((f) => el("li", {dataset: {flag: f.name}}, flagChip(f), " ", f.why)))));
  }
  const io = el("div", {class: "io"});
  if (started) io.appendChild(el("div", {}, el("h3", {}, "input"),
    started.ref ? el("p", {class: "muted"}, "in the object store: expand event 0") :
      el("pre", {class: "text", id: "run-input"}, started.data.input || "")));
  if (ending) {
    const value = ending.kind === "run.completed" ? pretty(ending.data.output) :
      ending.kind === "run.failed" ? ending.data.reason + (ending.data.detail ? ": " + ending.data.detail : "") :
        "cancelled" + (ending.data.reason ? ": " + ending.data.reason : "");
    io.appendChild(el("div", {}, el("h3", {}, ending.kind === "run.completed" ? "output" : "ending"),
      el("pre", {class: "text" + (ending.failed ? " failed" : ""), id: "run-output"}, value)));
  }
  box.appendChild(io);
  const tree = view.fork_tree;
  if (tree && (tree.children.length || !tree.current)) {
    const kept = inheritedUpTo();
    box.appendChild(el("div", {class: "forks", id: "fork-tree"}, el("h3", {}, "forks"),
      el("ul", {class: "tree"}, treeNode(tree)),
      kept > 1 ? el("div", {class: "fork-note"}, "events #1 to #" + (kept - 1) + " are the source run's, kept by " +
        "the fork (its recorded replies and tool results are reused, not made again)") : null));
  }
  const thread = view.thread;
  if (thread) {  // a conversation: its runs in order, each continuing the one before
    box.appendChild(el("div", {class: "forks", id: "thread"}, el("h3", {}, "thread " + thread.thread),
      el("ol", {class: "tree"}, thread.runs.map((r) => el("li", {},
        r.run_id === state.runId ? el("span", {class: "mono tree-current"}, r.run_id) : runLink(r.run_id),
        r.status ? [" ", statusBadge(r.status)] : null)))));
  }
  const subs = view.subruns;
  if (subs && (subs.parent || subs.children.length)) {
    box.appendChild(el("div", {class: "forks", id: "subruns"}, el("h3", {}, "sub-runs"),
      subs.parent ? el("div", {}, "sub-run of ", runLink(subs.parent.run_id),
        el("span", {class: "muted"}, " (call " + subs.parent.call_id.split("/").pop() + ")")) : null,
      subs.children.length ? el("ul", {class: "tree"}, subs.children.map((c) => el("li", {},
        el("span", {class: "muted"}, "call " + c.call_id + " " + c.agent + ": "), runLink(c.run_id),
        c.status ? [" ", statusBadge(c.status)] : null))) : null));
  }
}

// -- timeline --------------------------------------------------------------------------------------------

// Groups in order: the run's own events, then one group per turn; inside a turn the events of each tool
// call form a lane, and the lanes of a turn sit side by side where its first call began.
function groups(events) {
  const out = [];
  const turns = new Map();
  for (const e of events) {
    let group;
    if (e.turn === null || e.turn === undefined) {
      group = out.length && out[out.length - 1].turn === null ? out[out.length - 1] : null;
      if (!group) { group = {turn: null, items: [], lanes: null}; out.push(group); }
    } else {
      group = turns.get(e.turn);
      if (!group) { group = {turn: e.turn, items: [], lanes: null}; turns.set(e.turn, group); out.push(group); }
    }
    if (e.lane) {
      if (!group.lanes) { group.lanes = new Map(); group.items.push({lanes: group.lanes}); }
      if (!group.lanes.has(e.lane)) group.lanes.set(e.lane, []);
      group.lanes.get(e.lane).push(e);
    } else {
      group.items.push({event: e});
    }
  }
  return out;
}

function groupHeader(group) {
  const evs = group.items.flatMap((it) => it.event ? [it.event] : [...it.lanes.values()].flat());
  if (group.turn === null) {
    return el("div", {class: "group-head"}, el("span", {class: "group-title"}, "run"));
  }
  const replies = evs.filter((e) => e.kind === "model.responded");
  const tokens = replies.reduce((n, e) => n + (e.data.usage.prompt_tokens || 0) + (e.data.usage.completion_tokens || 0), 0);
  const modelMs = replies.reduce((n, e) => n + (e.data.latency_ms || 0), 0);
  const calls = evs.filter((e) => e.kind === "tool.called").length;
  const failed = evs.filter((e) => e.kind === "tool.failed").length;
  const span = evs.length ? (evs[evs.length - 1].ts - evs[0].ts) * 1000 : 0;
  return el("div", {class: "group-head"},
    el("span", {class: "group-title"}, "turn " + group.turn),
    el("span", {class: "muted"}, [fmtMs(span), "model " + fmtMs(modelMs), tokens + " tokens",
      calls + " tool call(s)" + (failed ? ", " + failed + " failed" : "")].join(" · ")));
}

function laneTitle(lane, evs) {
  const called = evs.find((e) => e.kind === "tool.called" || e.kind === "approval.requested");
  const question = evs.find((e) => e.kind === "question.asked");
  const name = called ? called.data.call.name : question ? "ask_human" :
    (evs.find((e) => e.data.tool) || {data: {}}).data.tool;
  const outcome = evs.find((e) => e.kind === "tool.completed" || e.kind === "tool.failed");
  const asked = evs.some((e) => e.kind === "approval.requested");
  const decided = evs.some((e) => e.kind === "approval.granted" || e.kind === "approval.denied");
  const took = called && outcome ? fmtMs((outcome.ts - called.ts) * 1000) : outcome ? "" :
    asked && !decided ? "waiting for approval" :
    question && !evs.some((e) => e.kind === "question.answered") ? "waiting for an answer" : "running…";
  return el("div", {class: "lane-head"}, el("span", {class: "mono"}, lane.split("/").pop()), " ",
    el("b", {}, name || "call"), " ", el("span", {class: "muted"}, took),
    outcome ? " " : null, outcome ? statusBadge(outcome.kind === "tool.completed" ? "ok" : "failed") : null);
}

function renderTimeline() {
  const box = clear(document.getElementById("timeline"));
  for (const group of groups(state.events)) {
    const section = el("div", {class: "group", dataset: {turn: group.turn === null ? "run" : group.turn}},
      groupHeader(group));
    for (const item of group.items) {
      if (item.event) { section.appendChild(eventNode(item.event)); continue; }
      const lanes = el("div", {class: "lanes"});
      const waiting = pendingApprovals();
      const questions = pendingQuestions();
      for (const [lane, evs] of item.lanes) {
        lanes.appendChild(el("div", {class: "lane", dataset: {call: lane}}, laneTitle(lane, evs), evs.map(eventNode),
          waiting.has(lane) ? approvalBox(waiting.get(lane)) : null,
          questions.has(lane) ? questionBox(questions.get(lane)) : null));
      }
      section.appendChild(lanes);
    }
    box.appendChild(section);
  }
}

// A fork's events below its fork point are the source's, kept as they were: drawn a little apart.
function inheritedUpTo() {
  const first = state.events[0];
  return first && first.kind === "run.forked" ? first.data.source_seq : 0;
}

// A row's `key` is its log entry's seq, or `seq.i` for a script event its call's outcome carries (`virtual`:
// not an entry of its own, it shares the outcome's seq, so it offers no fork and opens the outcome's link).
function canFork(e) {
  if (state.exported || e.virtual) return false;
  const points = state.view.fork_points;
  return !points || points.includes(e.seq);
}

function eventNode(e) {
  const open = state.open.has(e.key);
  const toggle = el("button", {class: "toggle", "aria-expanded": String(open), title: "show everything this event records"},
    open ? "▾" : "▸");
  const head = el("div", {class: "event-row"}, toggle,
    el("span", {class: "seq"}, "#" + e.seq),
    el("span", {class: "offset"}, "+" + fmtMs(e.offset_ms)),
    el("span", {class: "kind"}, e.kind),
    el("span", {class: "desc"}, e.describe),
    e.duration_ms ? el("span", {class: "dur"}, fmtMs(e.duration_ms)) : null,
    e.ref ? el("span", {class: "chip", title: "big fields in the object store"}, fmtBytes(e.ref.size)) : null,
    canFork(e) ? el("button", {class: "fork", title: "start a new run from here: it keeps events 0 to " + (e.seq - 1) +
      " and the host continues from that point", onclick: (ev) => { ev.stopPropagation(); forkAt(e.seq, node); }}, "fork here") : null);
  const kept = inheritedUpTo();
  const inherited = e.seq > 0 && e.seq < kept;
  const node = el("div", {class: "event kind-" + e.kind.replace(".", "-") + (e.failed ? " failed" : "") +
    (inherited ? " inherited" : "") + (e.virtual ? " virtual" : ""), dataset: {seq: e.seq, key: e.key, kind: e.kind},
    title: inherited ? "kept from the source run by the fork" :
      e.virtual ? "recorded inside event #" + e.seq + " (the call's outcome carries its script run)" : null}, head);
  if (open) node.appendChild(detailNode(state.details.get(e.key) || e));
  const flip = () => {
    if (state.open.has(e.key)) state.open.delete(e.key); else state.open.add(e.key);
    node.replaceWith(eventNode(state.byKey.get(e.key)));
  };
  toggle.addEventListener("click", flip);
  head.addEventListener("dblclick", flip);
  return node;
}

function field(label, value, cls) {
  if (value === null || value === undefined || value === "") return null;
  return el("div", {class: "field"}, el("div", {class: "field-label"}, label),
    el("pre", {class: "text " + (cls || "")}, pretty(value)));
}

function errorFields(error) {
  return [field("error", error.kind + (error.detail ? " / " + error.detail : "") +
    (error.line !== null && error.line !== undefined ? " at line " + error.line : ""), "failed"),
  field("message", error.message, "failed")];
}

function callFields(call) {
  return [el("div", {class: "field"}, el("div", {class: "field-label"}, "call"),
    el("div", {}, el("b", {}, call.name), " ", el("span", {class: "mono muted"}, call.id))),
  field("arguments", call.arguments)];
}

function detailNode(e) {
  const d = e.data;
  const parts = [];
  switch (e.kind) {
    case "run.started": case "run.forked":
      if (d.source_run) parts.push(el("div", {class: "field"}, el("div", {class: "field-label"}, "forked from"),
        el("div", {}, runLink(d.source_run), " at seq " + d.source_seq)), field("edit", d.edit));
      parts.push(field("input", d.input), field("deadline", d.timeout_s ? d.timeout_s + " s" : ""),
        field("metadata", Object.keys(d.metadata || {}).length ? d.metadata : ""), field("bundle", d.bundle_digest));
      break;
    case "model.requested":
      parts.push(el("div", {class: "field-label"}, "prompt delta: " + d.messages.length +
        " message(s) added since the previous request; the context starts at message " + d.context_start));
      for (const m of d.messages) {
        parts.push(el("div", {class: "message-box role-" + m.role},
          el("div", {class: "field-label"}, m.role + (m.name ? " · " + m.name : "") + (m.tool_call_id ? " · " + m.tool_call_id : "")),
          el("pre", {class: "text"}, m.content || ""),
          (m.tool_calls || []).map((c) => el("pre", {class: "text"}, c.name + " " + pretty(c.arguments)))));
      }
      parts.push(field("tools offered", (d.tools || []).join(", ")), field("sampling", Object.keys(d.sampling || {}).length ? d.sampling : ""));
      break;
    case "model.responded":
      parts.push(field("reply", d.content), field("raw text", d.text !== d.content ? d.text : ""));
      for (const c of d.calls || []) parts.push(...callFields(c));
      parts.push(field("unparseable", d.parse_error, "failed"),
        field("usage", d.usage.prompt_tokens + " prompt + " + d.usage.completion_tokens + " completion tokens, " +
          fmtMs(d.latency_ms) + (d.finish_reason ? ", finish: " + d.finish_reason : "")));
      break;
    case "model.failed":
      parts.push(field("error", d.error_kind + ": " + d.error, "failed"));
      break;
    case "tool.called": case "approval.requested":
      parts.push(...callFields(d.call));
      break;
    case "tool.completed":
      parts.push(field("output", d.output), field("took", fmtMs(d.duration_ms)));
      break;
    case "question.asked":
      parts.push(field("question", d.question), field("answer schema", d.schema || "any JSON"),
        field("times out", d.due ? fmtTime(d.due) + ", then " + (d.has_default ? JSON.stringify(d.default) : "a timeout error") : "never"));
      break;
    case "question.answered":
      parts.push(field("answer", d.answer), field("by", d.by));
      break;
    case "tool.failed": case "script.failed":
      parts.push(...errorFields(d.error), field("took", d.duration_ms ? fmtMs(d.duration_ms) : ""));
      break;
    case "script.printed":
      parts.push(field("printed", d.text));
      break;
    case "run.completed":
      parts.push(field("output", d.output));
      break;
    case "run.failed":
      parts.push(field("reason", d.reason, "failed"), field("detail", d.detail, "failed"));
      break;
    case "tool.redelivered":
      parts.push(field("earlier deliveries", (d.earlier || []).join("\n")));
      break;
  }
  if (e.ref) {
    const button = el("button", {class: "load"}, "load " + fmtBytes(e.ref.size) + " from the object store");
    button.addEventListener("click", () => loadPayload(e.seq, button));
    parts.unshift(el("div", {class: "field ref"}, "This event's big fields were stored apart (" +
      fmtBytes(e.ref.size) + "). ", state.exported ? null : button));
  }
  parts.push(editor(e));
  parts.push(el("details", {class: "raw"}, el("summary", {}, "raw event"), el("pre", {class: "text"}, JSON.stringify(d, null, 2))));
  return el("div", {class: "detail"}, parts);
}

// -- data and live following --------------------------------------------------------------------------

function setEvents(events) {
  state.events = events.slice().sort((a, b) => a.seq - b.seq);
  state.byKey = new Map(state.events.map((e) => [e.key, e]));
}

function render() {
  state.pending = false;
  renderOverview();
  renderTimeline();
  document.body.dataset.events = String(state.events.length);
  document.body.dataset.status = state.view.summary.status;
}

function schedule() {
  if (state.pending) return;
  state.pending = true;
  requestAnimationFrame(render);
}

// Tool jobs still running: a worker's notice (never stored) shown with its time so far until the call's
// outcome arrives in the log.
function renderRunning() {
  const list = clear(document.getElementById("live-script-list"));
  const now = Date.now() / 1000;
  for (const n of state.running.values()) {
    const secs = Math.max(0, Math.round(now - n.started));
    list.appendChild(el("li", {class: "mono", dataset: {call: n.call_id}}, "script.started " + n.tool + " on " +
      n.worker + (n.attempt > 1 ? " (delivery " + n.attempt + ")" : "") + " (running " + secs + " s…)"));
  }
  document.getElementById("live-scripts").hidden = state.running.size === 0;
  if (state.running.size && !state.ticker) state.ticker = setInterval(renderRunning, 1000);
  if (!state.running.size && state.ticker) { clearInterval(state.ticker); state.ticker = null; }
}

function follow() {
  if (state.exported || state.view.summary.status !== "running") return;
  const last = state.events.length ? state.events[state.events.length - 1].seq : -1;
  const source = new EventSource("/api/runs/" + encodeURIComponent(state.runId) + "/follow?after=" + (last + 1));
  state.source = source;
  document.getElementById("live").hidden = false;
  source.addEventListener("token", (msg) => {  // the model's output as it is generated (not stored)
    const d = JSON.parse(msg.data);
    const box = document.getElementById("live-reply");
    const pre = document.getElementById("live-tokens");
    if (state.liveRequest !== d.request_id) { state.liveRequest = d.request_id; pre.textContent = ""; }
    if (d.text) pre.textContent += d.text;
    if (d.tool_call) pre.textContent += (d.tool_call.name ? "\n" + d.tool_call.name + " " : "") + (d.tool_call.arguments || "");
    box.hidden = false;
  });
  source.addEventListener("script", (msg) => {  // a tool job still running on a worker (not stored)
    const d = JSON.parse(msg.data);
    state.running.set(d.call_id, d);
    renderRunning();
  });
  source.addEventListener("event", (msg) => {
    const data = JSON.parse(msg.data);
    if ((data.event.kind === "tool.completed" || data.event.kind === "tool.failed") && state.running.delete(data.event.data.call_id)) {
      renderRunning();
    }
    if (data.event.kind === "model.responded" || data.event.kind === "model.failed") {
      document.getElementById("live-reply").hidden = true;  // the recorded reply replaces the live one
      state.liveRequest = null;
    }
    if (!state.byKey.has(data.event.key)) {
      state.events.push(data.event);
      state.byKey.set(data.event.key, data.event);
    }
    state.view.summary = data.summary;
    state.view.flags = data.flags;
    schedule();
  });
  source.addEventListener("end", async () => {
    source.close();
    state.source = null;
    document.getElementById("live").hidden = true;
    state.running.clear();
    renderRunning();
    await reload();  // the index entry and fork tree changed too
  });
  source.addEventListener("error", () => {
    if (source.readyState === EventSource.CLOSED) return;
    source.close();
    state.source = null;
    document.getElementById("live").hidden = true;
    showMessage("the live view was interrupted; reconnecting…", "info");
    setTimeout(() => { showMessage(""); follow(); }, 2000);
  });
}

async function reload() {
  // Reloads can overlap (a command's, the live stream's at its end): only the latest one issued is applied,
  // and never one that knows fewer events than the page, so an answer that arrives late cannot roll it back.
  const ticket = state.reloads = (state.reloads || 0) + 1;
  let view;
  try {
    view = await api("/api/runs/" + encodeURIComponent(state.runId));
  } catch (err) {
    showMessage(err.message);
    document.body.dataset.status = "error";
    return false;
  }
  if (ticket !== state.reloads || (state.events && view.events.length < state.events.length)) return true;
  state.view = view;
  setEvents(state.view.events);
  render();
  return true;
}

async function init() {
  const data = embedded();
  if (data) {
    state.exported = true;
    state.runId = data.run_id;
    state.view = data;
    setEvents(data.events);
    document.getElementById("home").removeAttribute("href");
    document.getElementById("site").remove();  // a file: the other pages are the server's
    render();
    return;
  }
  const parts = location.pathname.split("/");
  state.runId = decodeURIComponent(parts[parts.length - 1] || "");
  if (await reload()) {
    openFromHash();
    follow();
  }
}

// `/runs/RUN#seq-N` (the links of the waterfall and the conversation): event N opened and in view.
function openFromHash() {
  const m = /^#seq-(\d+)$/.exec(location.hash);
  if (!m || !state.byKey.has(m[1])) return;
  const key = m[1];
  state.open.add(key);
  render();
  const node = document.querySelector(".event[data-key='" + key + "']");
  if (node) { node.classList.add("target"); node.scrollIntoView({block: "center"}); }
}

window.addEventListener("beforeunload", () => { if (state.source) state.source.close(); });
init();
