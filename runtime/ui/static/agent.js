// An agent: its bundle (prompt, tools with input and output schemas, limits, model, constraint), the hosts
// serving it, its runs, and its failure kinds over time.
"use strict";

const agent = {name: ""};

function kv(pairs) {
  return el("dl", {class: "kv"}, pairs.filter(([, v]) => v !== null && v !== undefined && v !== "").map(([k, v]) =>
    [el("dt", {}, k), el("dd", {}, typeof v === "string" ? v : JSON.stringify(v))]));
}

function hostsPanel(d) {
  const rows = d.hosts.map((h) => [el("span", {class: "mono"}, h.id), ranges(h.partitions), fmtAge(h.beat_age_s),
    h.runs + " / " + (h.max_runs || "∞")]);
  return panel("hosts", "served by", table("hosts-table", ["host", "partitions owned", "last lease renewal", "runs in flight"],
    rows, "no live host serves " + d.name + (d.unserved ? ": " + d.unserved + " task(s) wait for one" : ""),
    (i) => ({host: d.hosts[i].id})));
}

function toolCard(t) {
  return el("div", {class: "card tool-card", dataset: {tool: t.name}},
    el("h3", {}, t.name, " ", el("span", {class: "chip"}, t.kind), t.terminal ? el("span", {class: "chip"}, "terminal") : null,
      t.approval.length ? el("span", {class: "chip flag-chip"}, "approval") : null),
    el("p", {}, t.description),
    t.approval.map((r) => el("p", {class: "muted"}, "waits for a person when " + r.when + (r.role ? ", role " + r.role : "") +
      (r.timeout_s ? ", " + r.on_timeout + " after " + fmtMs(r.timeout_s * 1000) : ""))),
    t.limits ? kv(Object.entries(t.limits)) : null,
    el("h3", {}, "input schema"), el("pre", {class: "text input-schema"}, pretty(t.input_schema)),
    el("h3", {}, "output schema"), t.output_schema ? el("pre", {class: "text output-schema"}, pretty(t.output_schema)) :
      el("p", {class: "muted"}, "none: any JSON value"));
}

function bundlePanel(d) {
  if (!d.bundle) {
    return panel("bundle", "bundle", el("p", {class: "stale", id: "bundle-problem"}, d.bundle_problem ||
      "the runs index names no bundle file for this agent"));
  }
  const b = d.bundle;
  return panel("bundle", "bundle", kv([["file", b.path], ["digest", b.digest], ["description", b.description]]),
    el("h3", {}, "system prompt"), el("pre", {class: "text", id: "system-prompt"}, b.system_prompt || "(none)"),
    el("div", {class: "cards"},
      el("div", {class: "card", id: "model"}, el("h3", {}, "model"), kv([["name", b.model.name], ["adapter", b.model.adapter],
        ["server", b.model.base_url], ["provider", b.model.provider], ["sampling", b.model.sampling], ["timeout", b.model.timeout]])),
      el("div", {class: "card", id: "constraint"}, el("h3", {}, "constraint"), kv(Object.entries(b.constraint))),
      el("div", {class: "card", id: "termination"}, el("h3", {}, "termination and limits"), kv([
        ...Object.entries(b.termination), ["max concurrent tools", b.max_concurrent_tools], ["history window", b.history_window],
        ["workspace", b.workspace], ["data provider", b.data_provider], ["policies", b.policies.join(", ")],
        ["sandbox limits", b.limits]])),
      el("div", {class: "card", id: "waits"}, el("h3", {}, "timers, questions and budgets"), kv([
        ["timers", b.timers.length ? b.timers.join(", ") : "none"],
        ["questions (ask_human)", b.questions || "not offered"],
        ["tokens per run", b.budgets.run_tokens ?? "no limit"],
        ["tokens per agent per day", b.budgets.agent_tokens_per_day ?? "no limit"],
        ["when the day's budget is spent", b.budgets.on_exceeded]]))),
    el("h3", {}, "tools (" + b.tools.length + ")"), el("div", {class: "cards", id: "tools"}, b.tools.map(toolCard)));
}

const KIND_COLOURS = 6;  // failure kinds past the sixth most frequent share the last colour

// stacked columns, one per bucket: `parts(bucket)` gives [[class, count, label]...]
function chart(id, buckets, parts, most) {
  return el("div", {class: "chart", id: id}, buckets.map((b) => {
    const shown = parts(b).filter(([, n]) => n);
    const col = el("div", {class: "chart-col", dataset: {n: shown.reduce((t, [, n]) => t + n, 0)},
      title: fmtTime(b.start) + (shown.length ? ": " + shown.map(([, n, label]) => n + " " + label).join(", ") : ": none")});
    for (const [cls, n] of shown) col.appendChild(place(el("div", {class: "chart-part " + cls}), {height: (100 * n / most) + "%"}));
    return col;
  }));
}

function failuresPanel(d) {
  const f = d.failures;
  if (!f.buckets.length) return panel("failures", "runs over time", el("p", {class: "muted"}, "no run yet"));
  const errors = Object.entries(f.errors).sort((a, b) => b[1] - a[1]);
  const colour = new Map(errors.map(([k], i) => [k, "k" + Math.min(i, KIND_COLOURS - 1)]));
  const outcome = (s) => ["completed", "failed", "cancelled"].includes(s) ? s : "other";
  const byOutcome = (b) => Object.entries(b.statuses).map(([s, n]) => ["s-" + outcome(s), n, s]);
  const byKind = (b) => Object.entries(b.errors).map(([k, n]) => [colour.get(k), n, k]);
  const mostRuns = Math.max(1, ...f.buckets.map((b) => b.runs));
  const mostErrors = Math.max(1, ...f.buckets.map((b) => Object.values(b.errors).reduce((t, n) => t + n, 0)));
  const axis = () => el("div", {class: "chart-axis"}, el("span", {}, fmtTime(f.buckets[0].start)), el("span", {}, "now"));
  return panel("failures", "runs over time (" + fmtMs(f.width_s * 1000) + " per bar) and their failure kinds",
    el("h3", {}, "runs, by how they ended"), chart("chart", f.buckets, byOutcome, mostRuns), axis(),
    el("p", {}, Object.entries(f.statuses).map(([s, n]) => [statusBadge(s), " " + n + "  "])),
    el("h3", {}, "failure kinds their events recorded"),
    errors.length ? [chart("kinds-chart", f.buckets, byKind, mostErrors), axis()] : null,
    table("errors-table", ["failure kind", "runs"], errors.map(([k, n]) => [
      el("span", {}, el("span", {class: "swatch " + colour.get(k)}), el("span", {class: "chip error-chip"}, k)), String(n)]),
    "no failure recorded", (i) => ({error: errors[i][0]})));
}

function runsPanel(d) {
  const rows = d.runs.slice(0, 50).map((r) => [el("a", {class: "mono", href: runHref(r.run_id)}, r.run_id),
    r.actor, el("span", {}, statusBadge(r.status), (r.flags || []).map(flagChip)), fmtTime(r.started),
    r.ended && r.started ? fmtMs((r.ended - r.started) * 1000) : "", (r.errors || []).map((e) => el("span", {class: "chip error-chip"}, e)),
    el("span", {class: "snippet"}, r.input || "")]);
  return panel("runs", "runs (" + d.runs_total + ")", el("p", {}, el("a", {href: "/?agent=" + encodeURIComponent(d.name)},
    "all of them in the runs index"), " · ", el("a", {href: "/?agent=" + encodeURIComponent(d.name) + "&flag=suspicious"}, "suspicious ones")),
  table("agent-runs", ["run", "agent", "status", "started", "took", "errors", "input"], rows, "no run yet",
    (i) => ({run: d.runs[i].run_id})));
}

async function load() {
  const d = await api("/api/agents/" + encodeURIComponent(agent.name));
  document.title = "agent " + d.name + " · structured-agents";
  document.getElementById("crumb").textContent = "agent " + d.name;
  const root = clear(document.getElementById("page"));
  append(root, [
    el("div", {class: "title-row"}, el("h1", {}, d.name),
      d.instances.length > 1 ? el("span", {class: "muted"}, "instances: " + d.instances.join(", ")) : null),
    hostsPanel(d), bundlePanel(d), failuresPanel(d), runsPanel(d)]);
  document.body.dataset.agent = d.name;
}

agent.name = decodeURIComponent(location.pathname.split("/")[2] || "");
load().catch((err) => { showMessage(err.message); document.body.dataset.agent = "error"; });
