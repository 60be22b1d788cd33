// Everything waiting, on one page: what is stuck and why, calls waiting for a person (decided here), questions
// runs ask (answered here), tool jobs in flight, runs not finished (a sleeping run with when it wakes). Polled;
// the approval and answer forms are kept while someone types in them. Every text is set as textContent (`el`),
// never as HTML.
"use strict";

const POLL_MS = 3000;
const pending = {approvals: "", questions: "", data: null};

function runCell(runId, extra) {
  if (!runId) return el("span", {class: "muted"}, "(not a job)");
  return el("span", {}, el("a", {class: "mono", href: runHref(runId)}, runId), extra || null);
}

function stuckPanel(items) {
  const list = items.length ? el("ul", {class: "stuck-list"}, items.map((s) => el("li", {dataset: {kind: s.kind}},
    el("span", {class: "stuck-kind"}, s.kind),
    s.run_id ? [el("a", {class: "mono", href: runHref(s.run_id)}, s.run_id), " "] : null,
    s.agent ? [el("a", {href: agentHref(s.agent)}, s.agent), " "] : null,
    el("span", {class: "why"}, s.why)))) : el("p", {class: "muted empty"}, "nothing stuck");
  return panel("stuck", "stuck, and why (" + items.length + ")", list);
}

async function decide(a, path, body, box) {
  const problem = box.querySelector(".edit-problem");
  try {
    await api("/api/runs/" + encodeURIComponent(a.run_id) + "/" + path, {
      method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
    await load(true);  // redraw: the call is decided
  } catch (err) {
    problem.textContent = err.message;
    problem.hidden = false;
  }
}

function approvalForm(a) {
  const args = el("textarea", {class: "args approval-args", rows: 3}, JSON.stringify(a.arguments, null, 2));
  const note = el("input", {class: "approval-note", placeholder: "note (optional)"});
  const reason = el("input", {class: "deny-reason", placeholder: "why not (the model reads it)"});
  const problem = el("div", {class: "edit-problem", hidden: true});
  const box = el("div", {class: "approval-form"}, args,
    el("div", {class: "form-row"}, note, el("button", {class: "approve", onclick: () => {
      let edited;
      try { edited = JSON.parse(args.value); } catch (err) {
        problem.textContent = "the arguments are not JSON: " + err.message; problem.hidden = false; return;
      }
      const same = JSON.stringify(edited) === JSON.stringify(a.arguments);
      decide(a, "approve", {call_id: a.call_id, note: note.value, arguments: same ? null : edited}, box);
    }}, "approve")),
    el("div", {class: "form-row"}, reason, el("button", {class: "deny danger", onclick: () =>
      decide(a, "deny", {call_id: a.call_id, reason: reason.value}, box)}, "deny")),
    problem);
  return box;
}

function approvalsPanel(approvals) {
  const rows = approvals.map((a) => [
    runCell(a.run_id), el("a", {href: agentHref(a.agent)}, a.agent),
    el("span", {}, el("b", {}, a.tool), el("span", {class: "mono muted"}, " " + a.call_id.split("/").pop())),
    el("span", {}, a.condition || "always", a.role ? el("div", {class: "muted"}, "role " + a.role) : null),
    fmtAge(a.age_s), a.times_out_at ? a.on_timeout + " at " + fmtTime(a.times_out_at) : "never", approvalForm(a)]);
  return panel("approvals", "waiting for a person (" + approvals.length + ")",
    table("approvals-table", ["run", "agent", "call", "why it waits", "waiting", "times out", "decide"], rows,
      "no call waits for a person", (i) => ({run: approvals[i].run_id, call: approvals[i].call_id})));
}

// The answer as the question's schema wants it: a choice among its enum, else text for a string schema, else
// JSON (checked here for syntax only; the server checks it against the schema and says what does not fit)
function answerForm(q) {
  const problem = el("div", {class: "edit-problem", hidden: true});
  const box = el("div", {class: "answer-form"});
  const send = (value) => decide(q, "answer", {call_id: q.call_id, answer: value}, box);
  const schema = q.schema || {};
  if (Array.isArray(schema.enum)) {
    append(box, [el("div", {class: "form-row"}, schema.enum.map((v) =>
      el("button", {class: "answer-choice", onclick: () => send(v)}, typeof v === "string" ? v : JSON.stringify(v))))]);
  } else {
    const text = schema.type === "string";
    const input = el("textarea", {class: "args answer-value", rows: 2,
      placeholder: text ? "the answer" : "the answer as JSON, e.g. " + (schema.type === "object" ? "{\"ok\": true}" : "42")});
    append(box, [input, el("div", {class: "form-row"}, el("button", {class: "answer", onclick: () => {
      if (text) return send(input.value);
      let value;
      try { value = JSON.parse(input.value); } catch (err) {
        problem.textContent = "the answer is not JSON: " + err.message; problem.hidden = false; return;
      }
      send(value);
    }}, "answer"))]);
  }
  append(box, [problem]);
  return box;
}

function questionsPanel(questions) {
  const rows = questions.map((q) => [
    runCell(q.run_id), el("a", {href: agentHref(q.agent)}, q.agent),
    el("span", {class: "mono muted"}, q.call_id.split("/").pop()),
    el("span", {}, el("div", {class: "question-text"}, q.question),
      el("div", {class: "mono muted"}, q.schema ? JSON.stringify(q.schema) : "any JSON")),
    fmtAge(q.age_s),
    q.times_out_at ? (q.has_default ? JSON.stringify(q.default) : "an error") + " at " + fmtTime(q.times_out_at) : "never",
    answerForm(q)]);
  return panel("questions", "questions waiting for an answer (" + questions.length + ")",
    table("questions-table", ["run", "agent", "call", "question", "waiting", "times out", "answer"], rows,
      "no question waits for an answer", (i) => ({run: questions[i].run_id, call: questions[i].call_id})));
}

function workersCell(ws, fleet) {
  if (!ws.length && !fleet) return el("span", {class: "stale"}, "no worker is running");
  if (!ws.length) return el("span", {class: "stale"}, "no worker serves this tool: the first to take it answers " +
    "\"unknown tool\"");
  return ws.map((w) => el("div", {}, el("span", {class: "mono"}, w.name), el("span", {class: "muted"},
    " beat " + fmtAge(w.beat_age_s) + ", holds " + w.running)));
}

function jobsPanel(d) {
  const rows = d.tool_jobs.map((j) => [
    el("span", {class: "mono"}, "#" + j.seq), el("b", {}, j.tool), runCell(j.run_id), j.call || "",
    statusBadge(j.state), fmtMs((j.age_s || 0) * 1000), String(j.deliveries),
    j.last_failure ? el("span", {class: "why"}, j.last_failure) : el("span", {class: "muted"}, "none recorded"),
    workersCell(j.workers, d.workers.length)]);
  return panel("jobs", "tool jobs in flight (" + d.tool_jobs.length + (d.tool_jobs_truncated ? "+" : "") + ")",
    el("p", {class: "muted"}, "held: delivered to a worker (a job's worker is named only when it ends); a dead " +
      "worker's job is delivered again " + (d.ack_wait ? fmtMs(d.ack_wait * 1000) + " " : "") + "after its last heartbeat"),
    d.tool_jobs_unreadable ? el("p", {class: "stale", id: "jobs-unreadable"}, d.tool_jobs_unreadable) :
      table("jobs-table", ["job", "tool", "run", "call", "state", "in the queue", "delivery", "last failure",
        "workers serving the tool"], rows, "no tool job in flight", (i) => ({job: d.tool_jobs[i].seq})));
}

function waitChip(w, now) {
  const label = {model: "the model", tool: "tool", approval: "a person", question: "a person",
    timer: "a timer"}[w.what] || w.what;
  const left = w.what === "timer" ? (w.until > now ? "wakes in " + fmtMs((w.until - now) * 1000) :
    "due " + fmtMs((now - w.until) * 1000) + " ago") : fmtMs((now - w.since) * 1000);
  return el("span", {class: "chip", dataset: {what: w.what}, title: "since event #" + w.seq},
    label + ": " + w.detail + " · " + left);
}

function runsPanel(d) {
  const rows = d.runs.map((r) => [
    runCell(r.run_id, el("div", {class: "muted"}, el("a", {href: runHref(r.run_id) + "/waterfall"}, "waterfall"), " · ",
      el("a", {href: runHref(r.run_id) + "/conversation"}, "conversation"))),
    el("a", {href: agentHref(r.actor)}, r.actor), el("span", {}, statusBadge(r.status), (r.flags || []).map(flagChip)),
    fmtTime(r.started),
    r.waiting_on.length ? r.waiting_on.map((w) => waitChip(w, d.now)) : el("span", {class: "muted"}, "its host"),
    r.idle_s === null ? "" : fmtMs(r.idle_s * 1000) + " ago"]);
  return panel("runs", "runs not finished (" + d.runs_total + ")",
    table("runs-table", ["run", "agent", "status", "started", "waiting for", "last event"], rows,
      "every run has finished", (i) => ({run: d.runs[i].run_id})));
}

// the page's parts, each redrawn in place: the approvals only when the calls waiting changed (and nobody is
// typing in their forms), so a poll never takes a half-written reason away
function slot(name) {
  let node = document.getElementById("slot-" + name);
  if (!node) node = document.getElementById("page").appendChild(el("div", {id: "slot-" + name}));
  return node;
}

function fill(name, ...children) {
  append(clear(slot(name)), children);
}

async function load(redraw) {
  const d = await api("/api/pending");
  pending.data = d;
  fill("stats", el("div", {class: "stats"}, [["stuck", d.stuck.length],
    ["waiting for a person", d.approvals.length + d.questions.length], ["sleeping", d.sleeping],
    ["tool jobs in flight", d.tool_jobs.length], ["runs not finished", d.runs_total],
    ["dead letters", d.dead_letters]].map(([label, n]) => el("div", {class: "stat"},
    el("div", {class: "stat-value"}, String(n)), el("div", {class: "stat-label"}, label)))));
  fill("stuck", stuckPanel(d.stuck));
  const key = JSON.stringify(d.approvals.map((a) => [a.run_id, a.call_id]));
  const focused = document.activeElement;
  const typing = slot("approvals").contains(focused) && ["INPUT", "TEXTAREA"].includes(focused.tagName);
  if (redraw === true || (key !== pending.approvals && !typing)) {
    fill("approvals", approvalsPanel(d.approvals));
    pending.approvals = key;
  }
  const asked = JSON.stringify(d.questions.map((q) => [q.run_id, q.call_id]));
  const answering = slot("questions").contains(focused) && ["INPUT", "TEXTAREA"].includes(focused.tagName);
  if (redraw === true || (asked !== pending.questions && !answering)) {
    fill("questions", questionsPanel(d.questions));
    pending.questions = asked;
  }
  fill("jobs", jobsPanel(d));
  fill("runs", runsPanel(d));
  fill("letters", d.dead_letters ? el("p", {}, el("a", {href: "/fleet#dead-letters"}, d.dead_letters + " dead letter(s)"),
    " wait for an operator on the fleet page") : null);
  document.body.dataset.stuck = String(d.stuck.length);
}

poll(load, POLL_MS);
