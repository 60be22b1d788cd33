// The runs index: filters in the URL's query string (so a filtered view can be shared), rows from /api/runs.
"use strict";

const form = document.getElementById("filters");
const FIELDS = ["agent", "status", "tool", "error", "since", "flag", "q"];
const FACETS = {agent: "agents", status: "statuses", tool: "tools", error: "errors"};
const REFRESH_MS = 3000;  // while a listed run is still running, the list refreshes itself
let refreshTimer = null;

function currentFilters() {
  const params = new URLSearchParams();
  for (const name of FIELDS) {
    const value = form.elements[name].value.trim();
    if (value) params.set(name, value);
  }
  return params;
}

function fillSelect(select, values, chosen) {
  const keep = new Set(values);
  if (chosen) keep.add(chosen);
  clear(select);
  select.appendChild(el("option", {value: ""}, "any"));
  for (const value of [...keep].sort()) select.appendChild(el("option", {value: value}, value));
  select.value = chosen || "";
}

function row(run) {
  const took = run.ended && run.started ? fmtMs((run.ended - run.started) * 1000) : "";
  const forked = run.forked_from
    ? el("div", {class: "forked", title: "forked from " + run.forked_from}, "↳ forked from ",
      el("a", {href: runHref(run.forked_from)}, run.forked_from),
      run.forked_at !== null && run.forked_at !== undefined ? " @" + run.forked_at : "")
    : null;
  const errors = (run.errors || []).map((e) => el("span", {class: "chip error-chip"}, e));
  const flags = run.flags || [];
  // long ids, agents and texts are cut short inside their column (the whole text is the cell's title)
  return el("tr", {dataset: {run: run.run_id, flags: flags.map((f) => f.name).join(" ")}},
    el("td", {class: "mono clip"}, el("a", {href: runHref(run.run_id), title: run.run_id}, run.run_id), forked),
    el("td", {class: "clip", title: run.actor}, run.actor),
    el("td", {}, statusBadge(run.status), flags.map(flagChip)),
    el("td", {}, fmtTime(run.started || run.updated)),
    el("td", {class: "num"}, took),
    el("td", {class: "num"}, run.turns === undefined ? "" : run.turns),
    el("td", {class: "num"}, run.tokens === undefined ? "" : run.tokens),
    el("td", {}, (run.tools || []).map((t) => el("span", {class: "chip"}, t)), errors),
    el("td", {class: "snippet", title: run.input || ""}, run.input || ""),
    el("td", {class: "snippet", title: run.output || ""}, run.output || ""));
}

async function load() {
  const params = currentFilters();
  const query = params.toString();
  history.replaceState(null, "", query ? "?" + query : location.pathname);
  const tbody = document.querySelector("#runs tbody");
  let data;
  try {
    data = await api("/api/runs" + (query ? "?" + query : ""));
  } catch (err) {
    showMessage(err.message);
    return;
  }
  showMessage("");
  for (const [field, facet] of Object.entries(FACETS)) {
    fillSelect(form.elements[field], data.facets[facet] || [], params.get(field) || "");
  }
  clear(tbody);
  for (const run of data.runs) tbody.appendChild(row(run));
  if (!data.runs.length) {
    tbody.appendChild(el("tr", {class: "empty"}, el("td", {colspan: 10},
      data.total ? "no run matches these filters" : "no runs yet: send a task with `sa send AGENT \"...\"`")));
  }
  document.getElementById("count").textContent = data.matched + " of " + data.total + " run(s)" +
    (data.truncated ? " (only the newest " + data.scanned + " were searched)" : "");
  document.body.dataset.loaded = String(Date.now());
  clearTimeout(refreshTimer);
  if (data.runs.some((run) => run.status === "running")) {
    refreshTimer = setTimeout(() => { if (!document.hidden) load(); else refreshTimer = null; }, REFRESH_MS);
  }
}

function init() {
  const params = new URLSearchParams(location.search);
  for (const name of FIELDS) {
    const value = params.get(name) || "";
    const field = form.elements[name];
    if (field.tagName === "SELECT" && value && ![...field.options].some((o) => o.value === value)) {
      field.appendChild(el("option", {value: value}, value));
    }
    field.value = value;
  }
  form.addEventListener("submit", (event) => { event.preventDefault(); load(); });
  for (const name of ["agent", "status", "tool", "error", "since", "flag"]) {
    form.elements[name].addEventListener("change", load);
  }
  document.getElementById("reset").addEventListener("click", () => {
    for (const name of FIELDS) form.elements[name].value = "";
    load();
  });
  document.addEventListener("visibilitychange", () => { if (!document.hidden && refreshTimer === null) load(); });
  load();
}

init();
