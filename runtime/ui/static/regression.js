// One regression report: the totals, then each source run beside its regression run (verdict, where they
// first differ, turns, tokens, tool calls, pass/fail of both), each run linked to its own timeline page.
// A saved report does not change, so it is read once.
"use strict";

function pct(x) {
  return Math.round(x * 100) + "%";
}

function pair(row, field) {
  return String(row.source[field]) + " → " + (row.candidate ? String(row.candidate[field]) : "-");
}

function runLink(runId) {
  return runId ? el("a", {class: "mono", href: runHref(runId)}, runId) : el("span", {class: "muted"}, "-");
}

function totals(r) {
  const counts = Object.keys(r.counts).filter((k) => r.counts[k]).map((k) => r.counts[k] + " " + k).join(", ");
  const rows = [
    ["runs", r.runs + " of " + r.agent + ": " + counts],
    ["pass rate", "source " + pct(r.pass_rate.source) + " → candidate " + pct(r.pass_rate.candidate)],
    ["regressions", r.regressions.length ? r.regressions.join(" ") : "none"],
    ["fixes", r.fixes.length ? r.fixes.join(" ") : "none"],
    ["tokens", r.tokens.source + " → " + r.tokens.candidate],
    ["model calls", r.model_calls + " to the model, " + r.cached + " from the cache"],
    ["candidate", r.candidate], ["set", r.set || "-"]];
  return panel("totals", "report " + r.id, table("totals-table", ["", ""],
    rows.map(([k, v]) => [el("b", {}, k), el("span", {}, v)]), ""),
    r.grader_errors.length ? el("ul", {class: "stale", id: "grader-errors"}, r.grader_errors.map((e) => el("li", {}, e))) : null);
}

function runsPanel(r) {
  const rows = r.rows.map((row) => [
    runLink(row.source_run), runLink(row.run_id),
    el("span", {class: "verdict verdict-" + row.verdict}, row.verdict,
      row.detail ? el("div", {class: "muted"}, row.detail) : null),
    el("span", {class: "mono"}, row.diverged_at === null ? "" : String(row.diverged_at)),
    el("span", {class: "mono"}, pair(row, "status")),
    el("span", {class: "mono"}, pair(row, "turns")), el("span", {class: "mono"}, pair(row, "tokens")),
    el("span", {class: "mono"}, pair(row, "tool_calls")),
    el("span", {}, (row.source_pass ? "yes" : "no") + " → " + (row.candidate_pass ? "yes" : "no"),
      row.reasons.length ? el("div", {class: "muted"}, row.reasons.join("; ")) : null),
    el("b", {class: row.change === "regression" ? "stale" : ""}, row.change)]);
  return panel("runs", "runs side by side (" + r.rows.length + ")",
    table("runs-table", ["source run", "regression run", "verdict", "at seq", "status", "turns", "tokens",
      "tool calls", "pass", "change"], rows, "no run", (i) => ({source: r.rows[i].source_run,
      run: r.rows[i].run_id || "", verdict: r.rows[i].verdict})));
}

async function load() {
  const id = decodeURIComponent(location.pathname.split("/").pop());
  document.getElementById("crumb").textContent = "regression " + id;
  try {
    const r = await api("/api/regressions/" + encodeURIComponent(id));
    append(clear(document.getElementById("page")), [totals(r), runsPanel(r)]);
  } catch (err) {
    showMessage(err.message);
  }
  document.body.dataset.loaded = String(Date.now());
}

load();
