// Shared helpers of the inspector's pages. Every piece of data reaches the page through `el` / `text`,
// which set textContent and attributes only: nothing from a run is ever parsed as HTML.
"use strict";

// el("div", {class: "x", onclick: f}, child, "text", ...) -> an element; strings become text nodes.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

function showMessage(text, kind) {
  const box = document.getElementById("message");
  if (!box) return;
  box.textContent = text || "";
  box.className = "message " + (kind || "error");
  box.hidden = !text;
}

async function api(path, options) {
  let response;
  try {
    response = await fetch(path, options);
  } catch (err) {
    throw new Error("the inspector did not answer (is `sa ui` still running?): " + err.message);
  }
  let body = null;
  try { body = await response.json(); } catch (err) { body = null; }
  if (!response.ok) {
    throw new Error((body && body.error) || ("HTTP " + response.status + " from " + path));
  }
  return body;
}

function fmtTime(ts) {
  if (!ts) return "";
  const d = new Date(ts * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
    pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1) return ms.toFixed(2) + " ms";
  if (ms < 1000) return Math.round(ms) + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
  return Math.floor(ms / 60000) + " min " + Math.round((ms % 60000) / 1000) + " s";
}

function fmtBytes(n) {
  if (n < 1024) return n + " B";
  if (n < 1048576) return (n / 1024).toFixed(1) + " KiB";
  return (n / 1048576).toFixed(1) + " MiB";
}

// JSON for reading: strings as they are, anything else pretty-printed.
function pretty(value) {
  if (typeof value === "string") return value;
  return JSON.stringify(value, null, 2);
}

function statusBadge(status) {
  return el("span", {class: "badge status-" + (status || "unknown").replace(/[^a-z0-9]+/gi, "-")}, status || "unknown");
}

// A run's flag (`views.flags`): why it deserves a second look, the reason in full as the chip's title.
function flagChip(flag) {
  return el("span", {class: "chip flag-chip", title: flag.why, dataset: {flag: flag.name}}, "⚑ " + flag.name);
}

function runHref(runId) {
  return "/runs/" + encodeURIComponent(runId);
}

// The pages of one run, as tabs under its title: its events, its time, its conversation.
function runTabs(runId, active) {
  const base = runHref(runId);
  const tab = (name, href, label) => el("a", {class: "tab" + (name === active ? " tab-active" : ""), href: href,
    dataset: {tab: name}}, label);
  return el("nav", {class: "tabs", id: "run-tabs"}, tab("events", base, "events"),
    tab("waterfall", base + "/waterfall", "waterfall"), tab("conversation", base + "/conversation", "conversation"));
}

// A bar's or a box's geometry: set through the CSSOM (the CSP allows no style attribute).
function place(node, styles) {
  for (const [key, value] of Object.entries(styles)) node.style[key] = value;
  return node;
}

function agentHref(agent) {
  return "/agents/" + encodeURIComponent(agent.split(":")[0]);
}

function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "";
  return seconds < 1 ? "under 1 s ago" : fmtMs(seconds * 1000) + " ago";
}

// A panel with a title, for the team's pages.
function panel(id, title, ...children) {
  return el("section", {class: "panel", id: id}, el("h2", {}, title), children);
}

// A table of `rows` (arrays of cells: text or nodes) under `headers`; `empty` when there are none.
function table(id, headers, rows, empty, rowData) {
  if (!rows.length) return el("p", {class: "muted empty", id: id}, empty);
  return el("div", {class: "table-wrap"}, el("table", {class: "grid", id: id},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map((cells, i) => el("tr", {dataset: rowData ? rowData(i) : {}},
      cells.map((c) => el("td", {}, c)))))));
}

// Poll `load` every `ms` while the page is open; a failed poll shows its error and keeps polling.
function poll(load, ms) {
  const live = document.getElementById("live");
  const tick = async () => {
    try {
      await load();
      showMessage("");
      if (live) live.hidden = false;
    } catch (err) {
      showMessage(err.message);
      if (live) live.hidden = true;
    }
    document.body.dataset.loaded = String(Date.now());
    setTimeout(tick, ms);
  };
  tick();
}

function ranges(ps) {
  const spans = [];
  for (const p of [...ps].sort((a, b) => a - b)) {
    if (spans.length && spans[spans.length - 1][1] === p - 1) spans[spans.length - 1][1] = p;
    else spans.push([p, p]);
  }
  return spans.map(([a, b]) => (a === b ? String(a) : a + "-" + b)).join(", ") || "-";
}
