// What the model saw: a run's conversation at a turn, folded from the log by the kernel. Each message says
// where it came from (its event, or the earlier run of its thread) and whether the history window sent it;
// long texts are cut and a big payload is fetched from the object store only when asked for.
"use strict";

const conv = {runId: "", turn: "", view: null};

function turnParam() {
  return new URLSearchParams(location.search).get("turn") || "";
}

function turnHref(turn) {
  return runHref(conv.runId) + "/conversation" + (turn === "" ? "" : "?turn=" + encodeURIComponent(turn));
}

function systemNote(s) {
  if (!s) return null;
  const text = {
    recorded: "system prompt as " + (s.run_id === conv.runId ? "this run" : "run " + s.run_id + ", the thread's first,") +
      " recorded it (its first request, event #" + s.seq + ")",
    fork: "system prompt given by the fork (run.forked)",
    bundle: "system prompt from the bundle at " + s.path + " (the same version the run used)",
    "bundle-changed": "system prompt from the bundle at " + s.path + ", which changed since the run (its digest " +
      s.digest + ", the run's " + (s.run_digest || "unknown") + "): the run may have had another one",
    unknown: "system prompt unknown: this run's log does not record it, and " + (s.problem || "its bundle cannot be read"),
  }[s.source] || s.source;
  return el("p", {class: "muted", id: "system-source", dataset: {source: s.source}}, text);
}

function renderHead() {
  const v = conv.view;
  const box = clear(document.getElementById("head"));
  document.title = "conversation " + conv.runId + " · structured-agents";
  document.getElementById("crumb").textContent = "run " + conv.runId + " / conversation";
  const picker = el("div", {class: "turns", id: "turns"}, el("span", {class: "muted"}, "turn "),
    v.turns.map((t) => el("a", {class: "chip turn-chip" + (v.turn === t.turn ? " chip-active" : ""), href: turnHref(t.turn),
      dataset: {turn: t.turn}, title: t.messages + " message(s) then" + (t.attempt ? ", attempt " + (t.attempt + 1) : "")},
    String(t.turn))),
    el("a", {class: "chip turn-chip" + (v.turn === null ? " chip-active" : ""), href: turnHref("all"), dataset: {turn: "all"}},
      "whole conversation"));
  append(box, [
    el("div", {class: "title-row"}, el("h1", {class: "mono"}, conv.runId), statusBadge(v.status),
      el("a", {class: "muted", href: agentHref(v.actor)}, v.actor)),
    runTabs(conv.runId, "conversation"),
    picker,
    systemNote(v.system),
    v.thread.length ? el("p", {class: "muted", id: "thread-note"}, "a thread: this run continues ",
      v.thread.map((r, i) => [i ? ", " : "", el("a", {class: "mono", href: runHref(r) + "/conversation?turn=all"}, r)]),
      "; their messages come first, each naming its run") : null,
    v.mismatches.length ? el("p", {class: "message error", id: "mismatch"}, "the log records the prompt of event(s) #" +
      v.mismatches.join(", #") + " differently from this fold: the system prompt shown may not be the run's") : null,
  ]);
}

function origin(m) {
  const o = m.origin;
  const parts = [];
  if (o.run_id !== conv.runId) parts.push("from run ", el("a", {class: "mono", href: runHref(o.run_id)}, o.run_id), " ");
  if (o.seq !== null && o.seq !== undefined) {
    parts.push(el("a", {class: "event-link", href: runHref(o.run_id) + "#seq-" + o.seq}, "event #" + o.seq));
  }
  if (o.note) parts.push(parts.length ? " · " + o.note : o.note);
  return el("span", {class: "muted origin"}, parts);
}

async function fetchWhole(m, node) {
  const button = node.querySelector(".whole");
  if (button) { button.disabled = true; button.textContent = "fetching…"; }
  try {
    const whole = await api("/api/runs/" + encodeURIComponent(conv.runId) + "/conversation/messages/" + m.index);
    node.replaceWith(messageNode({...whole, sent: m.sent}));
  } catch (err) {
    showMessage(err.message);
    if (button) { button.disabled = false; button.textContent = "try again"; }
  }
}

function messageNode(m) {
  const node = el("div", {class: "msg role-" + m.role + (m.sent ? "" : " left-out"), dataset: {index: m.index, role: m.role}});
  const head = el("div", {class: "msg-head"}, el("b", {}, m.role),
    m.name ? el("span", {class: "mono"}, " " + m.name) : null,
    m.call ? el("span", {class: "mono muted"}, " answers call " + m.call) : null,
    el("span", {class: "muted mono"}, " #" + m.index), el("span", {class: "spacer"}),
    m.sent ? null : el("span", {class: "chip"}, "not sent: outside the history window"), origin(m));
  node.appendChild(head);
  if (m.origin.stub !== null && m.origin.stub !== undefined) {
    node.appendChild(el("p", {class: "ref"}, "stored apart (" + fmtBytes(m.origin.stub) + " in the object store) ",
      el("button", {class: "whole", onclick: () => fetchWhole(m, node)}, "fetch it")));
    return node;
  }
  if (m.content) node.appendChild(el("pre", {class: "text msg-text"}, m.content));
  for (const c of m.tool_calls) {
    node.appendChild(el("div", {class: "msg-call"}, el("span", {class: "muted"}, "calls "), el("b", {}, c.name),
      el("span", {class: "mono muted"}, " (" + c.short + ")"), el("pre", {class: "text"}, c.arguments)));
  }
  if (!m.content && !m.tool_calls.length) node.appendChild(el("p", {class: "muted"}, "(empty)"));
  if (m.cut) {
    node.appendChild(el("p", {class: "muted"}, "cut at " + m.content.length + " of " + m.length + " characters ",
      el("button", {class: "whole", onclick: () => fetchWhole(m, node)}, "show it whole")));
  }
  return node;
}

function renderPrompt() {
  const v = conv.view;
  const box = clear(document.getElementById("prompt"));
  const title = v.turn === null ? "the whole conversation so far (" + v.messages.length + " messages)" :
    "what the model received at turn " + v.turn + (v.request.attempt ? " (attempt " + (v.request.attempt + 1) + ")" : "");
  const sent = v.messages.filter((m) => m.sent).length;
  box.appendChild(el("div", {class: "conv-head"}, el("h2", {}, title),
    v.request ? el("span", {class: "muted"}, sent + " message(s) sent" +
      (v.left_out ? ", " + v.left_out + " left out by the history window" : "") +
      " · request event #" + v.request.seq + " · " + fmtTime(v.request.ts) +
      (v.request.tools.length ? " · tools offered: " + v.request.tools.join(", ") : "")) : null));
  if (v.kept_from) {  // a fork's kept turn: the source run made this request
    box.appendChild(el("p", {class: "message info", id: "kept-from"}, "this request was made by run ",
      el("a", {class: "mono", href: runHref(v.kept_from.run_id) + "/conversation?turn=" + v.turn}, v.kept_from.run_id),
      ", whose events before #" + v.kept_from.seq + " this fork kept: the model saw that run's prompt (with its " +
      "system prompt, where the fork changed it)"));
  }
  if (!v.messages.length) box.appendChild(el("p", {class: "muted"}, "no message yet"));
  for (const m of v.messages) box.appendChild(messageNode(m));
  const answer = clear(document.getElementById("answer"));
  answer.hidden = !v.request;
  if (!v.request) return;
  const a = v.answer;
  answer.appendChild(el("h2", {}, "what it answered"));
  if (!a) { answer.appendChild(el("p", {class: "muted", id: "no-answer"}, "no answer recorded yet (the request is in flight)")); return; }
  if (a.kind === "model.failed") {
    answer.appendChild(el("pre", {class: "text failed", id: "answer-error"}, a.error_kind + ": " + a.error));
    return;
  }
  answer.appendChild(el("p", {class: "muted", id: "answer-usage"}, fmtMs(a.latency_ms) + " · " + a.prompt_tokens + " prompt + " +
    a.completion_tokens + " completion tokens" + (a.finish_reason ? " · finish: " + a.finish_reason : "") +
    (a.model ? " · " + a.model : "") + " · event #" + a.seq));
  if (v.reply) answer.appendChild(messageNode(v.reply));
}

async function load() {
  conv.runId = decodeURIComponent(location.pathname.split("/")[2] || "");
  conv.turn = turnParam();
  let view;
  try {
    view = await api("/api/runs/" + encodeURIComponent(conv.runId) + "/conversation" +
      (conv.turn ? "?turn=" + encodeURIComponent(conv.turn) : ""));
  } catch (err) {
    showMessage(err.message);
    document.body.dataset.status = "error";
    return;
  }
  conv.view = view;
  renderHead();
  renderPrompt();
  document.body.dataset.turn = view.turn === null ? "all" : String(view.turn);
  document.body.dataset.status = view.status;
}

load();
