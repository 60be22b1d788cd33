// The cluster's schedules: what each starts and when, whether it is paused, the fires waiting for a host,
// and the runs its fires started (newest first, each with the tick that started it). Polled.
"use strict";

const POLL_MS = 5000;

function statusCounts(statuses) {
  const names = Object.keys(statuses).sort();
  if (!names.length) return el("span", {class: "muted"}, "no run yet");
  return names.map((s) => el("span", {class: "count"}, statusBadge(s), " " + statuses[s] + " "));
}

function runsList(s) {
  if (!s.runs.length) return el("span", {class: "muted"}, s.waiting ? "its first fire waits for a host" : "no run yet");
  const more = s.runs_total > s.runs.length ?
    el("a", {class: "all-runs", href: "/?q=" + encodeURIComponent("schedule-" + s.name + "-")},
      "all " + s.runs_total + " runs") : null;
  return el("div", {}, el("ul", {class: "schedule-runs"}, s.runs.map((r) => el("li", {dataset: {run: r.run_id}},
    el("a", {class: "mono", href: runHref(r.run_id)}, r.run_id), " ", statusBadge(r.status),
    el("span", {class: "muted"}, " fire " + r.fire)))), more);
}

function schedulesPanel(d) {
  const rows = d.schedules.map((s) => [
    el("b", {}, s.name),
    el("a", {href: agentHref(s.actor)}, s.actor),
    el("span", {}, s.when, s.paused ? el("div", {class: "stale"}, "paused") : null),
    el("span", {}, s.input + (s.input_cut ? "…" : ""), s.thread ? el("div", {class: "muted"}, "thread " + s.thread) : null),
    el("span", {}, s.catch_up, el("div", {class: "muted"}, "grace " + fmtMs(s.grace_s * 1000))),
    el("span", {class: "mono"}, String(s.waiting)),
    statusCounts(s.statuses),
    runsList(s)]);
  return panel("schedules", "schedules (" + d.schedules.length + ")",
    d.unreadable ? el("p", {class: "stale", id: "schedules-unreadable"}, d.unreadable) :
      table("schedules-table", ["schedule", "agent", "when", "input", "missed fires", "fires waiting", "runs",
        "newest runs"], rows, "no schedule: add one with `sa schedule add` or a bundle's schedules:",
        (i) => ({schedule: d.schedules[i].name})));
}

async function load() {
  const d = await api("/api/schedules");
  append(clear(document.getElementById("page")), [schedulesPanel(d)]);
}

poll(load, POLL_MS);
