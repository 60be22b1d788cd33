// Regressions: the saved sets (which runs) and the reports kept in the fleet (how each regression went),
// newest first, each linked to its page. Polled.
"use strict";

const POLL_MS = 10000;

function pct(x) {
  return Math.round(x * 100) + "%";
}

function reportHref(id) {
  return "/regressions/" + encodeURIComponent(id);
}

function reportsPanel(d) {
  const rows = d.reports.map((r) => [
    el("a", {class: "mono", href: reportHref(r.id)}, r.id),
    el("span", {}, fmtTime(r.made_at)),
    el("span", {}, r.set || el("span", {class: "muted"}, "no set")),
    el("a", {href: agentHref(r.agent)}, r.agent),
    el("span", {class: "mono"}, r.candidate),
    el("span", {class: "mono"}, String(r.runs)),
    el("span", {}, pct(r.pass_rate.source) + " → " + pct(r.pass_rate.candidate)),
    el("span", {class: r.regressions.length ? "stale" : ""}, String(r.regressions.length)),
    el("span", {}, String(r.fixes.length)),
    el("span", {class: "mono"}, r.model_calls + " (" + r.cached + " cached)")]);
  return panel("reports", "reports (" + d.reports.length + ")",
    table("reports-table", ["report", "made", "set", "agent", "candidate", "runs", "pass rate", "regressions",
      "fixes", "model calls"], rows, "no regression yet: run one with `sa regress`",
      (i) => ({report: d.reports[i].id})));
}

function setsPanel(d) {
  const rows = d.sets.map((s) => [el("b", {}, s.name), el("a", {href: agentHref(s.agent)}, s.agent),
    el("span", {class: "mono"}, String(s.runs)), el("span", {}, fmtTime(s.created))]);
  return panel("sets", "saved sets (" + d.sets.length + ")",
    table("sets-table", ["set", "agent", "runs", "saved"], rows,
      "no saved set: save one with `sa regress ... --save NAME`", (i) => ({set: d.sets[i].name})));
}

async function load() {
  const d = await api("/api/regressions");
  append(clear(document.getElementById("page")), [reportsPanel(d), setsPanel(d)]);
}

poll(load, POLL_MS);
