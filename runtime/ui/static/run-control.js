// A run's page, its commands: cancel, approve and deny a waiting call, answer a question, "what if" forks with an edit, a big
// payload fetched when asked for. Loaded before run.js, whose `state` these read when they are called.
"use strict";

// -- run control: cancel, approve, deny (the same checks as `sa cancel` / `sa approve` / `sa deny`) ---------

async function command(path, body) {
  return api("/api/runs/" + encodeURIComponent(state.runId) + "/" + path, {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
  });
}

function cancelControl() {
  const reason = el("input", {type: "text", class: "cancel-reason", placeholder: "why (recorded in the log)"});
  const confirm = el("button", {class: "cancel-confirm danger"}, "cancel the run");
  const form = el("span", {class: "cancel-form", hidden: true}, reason, confirm);
  const open = el("button", {class: "cancel-open"}, "cancel run…");
  open.addEventListener("click", () => { form.hidden = !form.hidden; if (!form.hidden) reason.focus(); });
  confirm.addEventListener("click", async () => {
    confirm.disabled = true;
    showMessage("cancelling…", "info");
    try {
      const done = await command("cancel", {reason: reason.value});
      showMessage("the run ended: " + done.event.describe, "info");
      await reload();
    } catch (err) {
      confirm.disabled = false;
      showMessage("cancel failed: " + err.message);
    }
  });
  return el("span", {class: "cancel"}, open, form);
}

// Calls that wait for a person: requested, with no verdict and no outcome, in a run that has not ended.
function pendingApprovals() {
  const waiting = new Map();
  if (state.exported) return waiting;
  for (const e of state.events) {
    if (e.kind === "approval.requested") waiting.set(e.data.call.id, e);
    else if (["approval.granted", "approval.denied", "tool.completed", "tool.failed"].includes(e.kind)) waiting.delete(e.data.call_id);
    else if (["run.completed", "run.failed", "run.cancelled"].includes(e.kind)) return new Map();
  }
  return waiting;
}

function approvalBox(requested) {
  const d = requested.data;
  const call = d.call.id.split("/").pop();
  const args = el("textarea", {class: "edit-text approval-args", rows: Math.min(10, JSON.stringify(d.call.arguments, null, 2).split("\n").length + 1), spellcheck: "false"});
  args.value = JSON.stringify(d.call.arguments, null, 2);
  const note = el("input", {type: "text", class: "approval-note", placeholder: "note (optional)"});
  const reason = el("input", {type: "text", class: "deny-reason", placeholder: "reason (the model reads it)"});
  const problem = el("div", {class: "edit-problem", hidden: true});
  const approve = el("button", {class: "approve"}, "approve");
  const deny = el("button", {class: "deny danger"}, "deny");
  const fail = (message) => { problem.textContent = message; problem.hidden = false; approve.disabled = deny.disabled = false; };
  approve.addEventListener("click", async () => {
    let edited;
    try { edited = JSON.parse(args.value); } catch (err) { fail("the arguments are not JSON: " + err.message + ". Nothing was sent."); return; }
    const changed = JSON.stringify(edited) !== JSON.stringify(d.call.arguments);
    approve.disabled = deny.disabled = true;
    try {
      await command("approve", changed ? {call_id: call, arguments: edited, note: note.value} : {call_id: call, note: note.value});
      await reload();
    } catch (err) { fail("approve failed: " + err.message); }
  });
  deny.addEventListener("click", async () => {
    approve.disabled = deny.disabled = true;
    try {
      await command("deny", {call_id: call, reason: reason.value});
      await reload();
    } catch (err) { fail("deny failed: " + err.message); }
  });
  const why = [d.condition ? "because " + d.condition : "", d.role ? "role " + d.role : "",
    d.timeout_s ? "after " + d.timeout_s + " s: " + (d.on_timeout || "deny") : ""].filter(Boolean).join(" · ");
  return el("div", {class: "approval", dataset: {call: d.call.id}},
    el("div", {class: "approval-head"}, "waits for approval", why ? el("span", {class: "muted"}, " · " + why) : null),
    el("div", {class: "field-label"}, "arguments (edit them to approve something else; checked against the tool's schema)"),
    args, el("div", {class: "approval-row"}, note, approve), el("div", {class: "approval-row"}, reason, deny), problem);
}

// Questions the run asks a person (ask_human): asked, with no answer and no outcome, in a run that has not ended.
function pendingQuestions() {
  const waiting = new Map();
  if (state.exported) return waiting;
  for (const e of state.events) {
    if (e.kind === "question.asked") waiting.set(e.data.call_id, e);
    else if (["question.answered", "tool.completed", "tool.failed"].includes(e.kind)) waiting.delete(e.data.call_id);
    else if (["run.completed", "run.failed", "run.cancelled"].includes(e.kind)) return new Map();
  }
  return waiting;
}

// The answer as `sa answer` sends it: a button per allowed value of an enum, else text for a string schema,
// else JSON (checked here for syntax only: the server checks it against the schema and says what does not fit).
function questionBox(asked) {
  const d = asked.data;
  const call = d.call_id.split("/").pop();
  const schema = d.schema || {};
  const problem = el("div", {class: "edit-problem", hidden: true});
  const buttons = [];
  const send = async (value) => {
    buttons.forEach((b) => { b.disabled = true; });
    try {
      await command("answer", {call_id: call, answer: value});
      await reload();
    } catch (err) {
      problem.textContent = "answer failed: " + err.message; problem.hidden = false;
      buttons.forEach((b) => { b.disabled = false; });
    }
  };
  let form;
  if (Array.isArray(schema.enum)) {
    for (const v of schema.enum) {
      buttons.push(el("button", {class: "answer-choice", onclick: () => send(v)}, typeof v === "string" ? v : JSON.stringify(v)));
    }
    form = el("div", {class: "approval-row"}, buttons);
  } else {
    const text = schema.type === "string";
    const input = el("textarea", {class: "edit-text answer-value", rows: 2, spellcheck: "false",
      placeholder: text ? "the answer" : "the answer as JSON"});
    const answer = el("button", {class: "answer", onclick: () => {
      if (text) return send(input.value);
      let value;
      try { value = JSON.parse(input.value); } catch (err) {
        problem.textContent = "the answer is not JSON: " + err.message + ". Nothing was sent."; problem.hidden = false; return;
      }
      send(value);
    }}, "answer");
    buttons.push(answer);
    form = el("div", {}, input, el("div", {class: "approval-row"}, answer));
  }
  const timeout = d.due ? "at " + fmtTime(d.due) + ": " + (d.has_default ? JSON.stringify(d.default) : "a timeout error") : "";
  return el("div", {class: "approval question", dataset: {call: d.call_id}},
    el("div", {class: "approval-head"}, "waits for an answer", timeout ? el("span", {class: "muted"}, " · " + timeout) : null),
    el("div", {class: "question-text"}, d.question),
    el("div", {class: "field-label"}, "answer " + (d.schema ? "(must fit " + JSON.stringify(d.schema) + ")" : "(any JSON)")),
    form, problem);
}

// -- "what if": fork with an edit --------------------------------------------------------------------------

// Where a fork may record another output for `e`'s call: the last valid point after the reply that made
// the call and no later than its outcome (the kept prefix then has the call but not its result).
function outputForkPoint(e) {
  const made = state.events.find((x) => x.kind === "model.responded" && (x.data.calls || []).some((c) => c.id === e.lane));
  const points = state.view.fork_points || [];
  const valid = points.filter((p) => made && p > made.seq && p <= e.seq);
  return valid.length ? valid[valid.length - 1] : null;
}

// The edit a page offers for an event: another output for a tool's outcome, another reply for a model's
// answer. Returns [label, at_seq, initial JSON text, text -> edit object] or null.
function editFor(e) {
  if (state.exported || !state.view.fork_points) return null;
  const d = e.data;
  if ((e.kind === "tool.completed" || e.kind === "tool.failed") && e.lane) {
    const at = outputForkPoint(e);
    if (at === null) return null;
    const call = e.lane.split("/").pop();
    return ["fork with another output for call " + call, at, JSON.stringify(e.kind === "tool.completed" ? d.output : null, null, 2),
      (value) => ({kind: "output", call_id: call, output: value})];
  }
  if (e.kind === "model.responded" && state.view.fork_points.includes(e.seq)) {
    const reply = {content: d.content || "", calls: (d.calls || []).map((c) => ({name: c.name, arguments: c.arguments}))};
    return ["fork with another reply", e.seq, JSON.stringify(reply, null, 2), (value) => ({kind: "reply", ...value})];
  }
  return null;
}

function editor(e) {
  const spec = editFor(e);
  if (!spec) return null;
  const [label, at, initial, toEdit] = spec;
  const area = el("textarea", {class: "edit-text", rows: Math.min(14, initial.split("\n").length + 1), spellcheck: "false"});
  area.value = initial;
  const problem = el("div", {class: "edit-problem", hidden: true});
  const go = el("button", {class: "edit-fork"}, "fork");
  const panel = el("div", {class: "edit-panel", hidden: true},
    el("div", {class: "field-label"}, "JSON for the fork at seq " + at + " (events before it are kept; the host goes on from there)"),
    area, problem, go);
  const open = el("button", {class: "edit-open"}, label + "…");
  open.addEventListener("click", () => { panel.hidden = !panel.hidden; if (!panel.hidden) area.focus(); });
  area.addEventListener("input", () => { problem.hidden = true; });
  go.addEventListener("click", async () => {
    let value;
    try {
      value = JSON.parse(area.value);
    } catch (err) {
      problem.textContent = "not JSON: " + err.message + ". Nothing was forked.";
      problem.hidden = false;
      return;
    }
    problem.hidden = true;
    const message = await forkAt(at, null, toEdit(value));
    if (message) { problem.textContent = message; problem.hidden = false; }
  });
  return el("div", {class: "edit"}, open, panel);
}

async function loadPayload(seq, button) {
  button.disabled = true;
  button.textContent = "loading…";
  try {
    const whole = await api("/api/runs/" + encodeURIComponent(state.runId) + "/events/" + seq);
    state.details.set(String(seq), whole);  // a log entry's key is its seq
    const node = document.querySelector('.event[data-key="' + seq + '"]');
    if (node) node.replaceWith(eventNode(state.byKey.get(String(seq))));
  } catch (err) {
    button.disabled = false;
    button.textContent = "retry";
    showMessage("could not load event " + seq + ": " + err.message);
  }
}

// Fork at `seq` (with `edit`, if any) and open the new run; on refusal show why and return the message.
async function forkAt(seq, node, edit) {
  showMessage("forking at seq " + seq + "…", "info");
  const body = edit ? {at_seq: seq, edit: edit} : {at_seq: seq};
  try {
    const forked = await api("/api/runs/" + encodeURIComponent(state.runId) + "/fork", {
      method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
    });
    location.href = runHref(forked.run_id);
    return null;
  } catch (err) {
    const message = "fork at seq " + seq + " failed: " + err.message;
    showMessage(message);
    if (node) node.classList.add("fork-error");
    return message;
  }
}
