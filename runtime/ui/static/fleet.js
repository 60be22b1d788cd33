// The fleet, live: hosts (partitions and bundles each serves, runs in flight, last lease renewal), workers
// (tools, jobs held), queues, partitions, and the dead letters with their reasons, each replayable.
"use strict";

const POLL_MS = 2000;

function num(n) {
  return el("span", {class: "mono"}, String(n));
}

function hostsPanel(d) {
  const rows = d.hosts.map((h) => [
    el("span", {class: "mono"}, h.id),
    h.agents.length ? h.agents.map((a) => el("div", {}, el("a", {href: agentHref(a)}, a),
      el("span", {class: "muted"}, " partitions " + ranges(h.leases[a] || [])))) : el("span", {class: "muted"}, "none"),
    num(h.runs + " / " + (h.max_runs || "∞")), num(h.queued),
    el("span", {class: h.stale ? "stale" : ""}, fmtAge(h.beat_age_s) + (h.stale ? " (older than its lease TTL)" : "")),
    fmtMs(h.lease_ttl * 1000), fmtMs(h.up_s * 1000)]);
  return panel("hosts", "hosts (" + d.hosts.length + ")", table("hosts-table",
    ["host", "bundles served (partitions owned)", "runs in flight / bound", "queued", "last lease renewal",
      "lease TTL", "up"], rows, "no host is running: tasks wait in TASKS until one starts",
    (i) => ({host: d.hosts[i].id})));
}

function workersPanel(d) {
  const rows = d.workers.map((w) => [el("span", {class: "mono"}, w.name), w.tools.join(", "),
    num(w.running + " / " + w.concurrency), num(w.completed), num(w.failed), fmtAge(w.beat_age_s), fmtMs(w.up_s * 1000)]);
  return panel("workers", "workers (" + d.workers.length + ")", table("workers-table",
    ["worker", "tools served", "jobs held / concurrency", "completed", "failed", "last heartbeat", "up"], rows,
    "no worker is running: tool jobs wait in TOOLS until one starts", (i) => ({worker: d.workers[i].name})));
}

function queuesPanel(d) {
  const q = d.queues;
  const rows = [["tasks (TASKS)", q.tasks_pending, q.tasks_held], ["tool jobs (TOOLS)", q.tool_jobs_pending, q.tool_jobs_held],
    ["tool results (RESULTS)", q.results_pending, q.results_held], ["dead letters (DLQ)", q.dlq, ""]]
    .map(([name, waiting, held]) => [name, num(waiting), held === "" ? "" : num(held)]);
  const unserved = Object.entries(d.unserved_agents || {});
  return panel("queues", "queues", table("queues-table", ["queue", "waiting", "held by a process"], rows, ""),
    unserved.length ? el("p", {class: "stale", id: "unserved-agents"}, "tasks waiting for an agent no live host serves: ",
      unserved.map(([a, n], i) => [i ? ", " : "", el("a", {href: agentHref(a)}, a), " (" + n + ")"])) : null);
}

function partitionsPanel(d) {
  const rows = d.partitions.map((p) => [num(p.partition),
    Object.keys(p.hosts).length ? Object.entries(p.hosts).map(([b, h]) => el("div", {}, el("a", {href: agentHref(b)}, b), ": ",
      h ? el("span", {class: "mono"}, h) : el("span", {class: "stale"}, "unserved"))) : el("span", {class: "muted"}, "-"),
    num(p.runs_in_flight), num(p.tasks_pending + " / " + p.tasks_held), num(p.results_pending + " / " + p.results_held)]);
  return panel("partitions", "partitions (" + d.partitions_total + ", R" + d.replicas + ")", table("partitions-table",
    ["partition", "owner per bundle", "runs in flight", "tasks waiting / held", "results waiting / held"], rows, ""));
}

async function replay(letter, button) {
  button.disabled = true;
  try {
    await api("/api/dead-letters/" + letter.seq + "/replay", {method: "POST", headers: {"Content-Type": "application/json"}, body: "{}"});
    showMessage("dead letter " + letter.seq + " (" + (letter.tool || letter.subject) + ") sent back to the workers", "info");
    await load();
  } catch (err) {
    showMessage(err.message);
    button.disabled = false;
  }
}

function lettersPanel(d) {
  const rows = d.dead_letters.map((l) => {
    const button = el("button", {class: "replay"}, "replay");
    button.addEventListener("click", () => replay(l, button));
    return [num(l.seq), l.tool ? el("b", {}, l.tool) : l.subject,
      l.run_id ? el("span", {}, el("a", {class: "mono", href: runHref(l.run_id)}, l.run_id),
        el("span", {class: "muted mono"}, " call " + l.call)) : el("span", {class: "muted"}, "(not a job)"),
      num(l.deliveries), el("span", {class: "why"}, l.reason), fmtAge(l.age_s),
      el("pre", {class: "text"}, l.arguments || ""), button];
  });
  return panel("dead-letters", "dead letters (" + d.dead_letters.length + ")",
    d.dead_letters.length ? el("p", {class: "muted"}, "replay sends a job back to its tool's workers: its run already " +
      "went on with the failure, so the re-run's outcome is dropped; replay for its side effects, or to check it now runs") : null,
    table("letters-table", ["seq", "tool", "run", "deliveries", "why it died", "dead since", "arguments", ""], rows,
      "no dead letter", (i) => ({seq: d.dead_letters[i].seq})));
}

async function load() {
  const d = await api("/api/fleet");
  const unserved = d.unserved_partitions.length;
  const root = clear(document.getElementById("page"));
  append(root, [
    el("div", {class: "stats"}, [["hosts", d.hosts.length], ["workers", d.workers.length],
      ["runs in flight", d.runs_in_flight], ["unserved partitions", unserved ? ranges(d.unserved_partitions) : "none"],
      ["dead letters", d.dead_letters.length]].map(([label, n]) => el("div", {class: "stat"},
      el("div", {class: "stat-value"}, String(n)), el("div", {class: "stat-label"}, label)))),
    d.agents.length ? el("p", {id: "agents"}, "agents: ", d.agents.map((a, i) => [i ? ", " : "",
      el("a", {href: agentHref(a)}, a)])) : null,
    hostsPanel(d), workersPanel(d), queuesPanel(d), lettersPanel(d), partitionsPanel(d),
  ]);
}

poll(load, POLL_MS);
