// DOM and formatting helpers. Every value from the API is untrusted: it only ever becomes text
// nodes or attribute values, never HTML.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else if (key === "dataset") {
      Object.assign(el.dataset, value);
    } else if (value === true) {
      el.setAttribute(key, "");
    } else {
      el.setAttribute(key, String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

// SVG elements (the overview's chart).
export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  append(el, children);
  return el;
}

export function mount(...children) {
  const main = document.getElementById("main");
  main.replaceChildren(...children.flat().filter(Boolean));
  return main;
}

export function setTitle(text) {
  document.title = `${text} · periodic_manager`;
}

// "2026-03-01T12:00:30.123456Z" -> "2026-03-01 12:00:30 UTC"
export function utc(iso) {
  if (!iso) return "—";
  const m = /^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})/.exec(iso);
  return m ? `${m[1]} ${m[2]} UTC` : iso;
}

// "2026-03-29T03:30:00+02:00" (+ "CEST") -> "2026-03-29 03:30:00 CEST (+02:00)"
export function local(iso, abbreviation) {
  if (!iso) return "—";
  const m = /^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})(?:\.\d+)?(Z|[+-]\d{2}:\d{2})?/.exec(iso);
  if (!m) return iso;
  const offset = m[3] === "Z" || !m[3] ? "+00:00" : m[3];
  if (offset === "+00:00" && abbreviation === "UTC") return `${m[1]} ${m[2]} UTC`;
  const abbr = abbreviation && !/^[+-]\d/.test(abbreviation) ? `${abbreviation} ` : "";
  return `${m[1]} ${m[2]} ${abbr}(UTC${offset})`;
}

// Seconds between two ISO instants, as "in 4 min" / "3 h ago".
export function relative(iso, nowIso) {
  if (!iso || !nowIso) return "";
  const seconds = (Date.parse(iso) - Date.parse(nowIso)) / 1000;
  const text = duration(Math.abs(seconds));
  return seconds >= 0 ? `in ${text}` : `${text} ago`;
}

export function duration(seconds) {
  if (seconds < 1) return "now";
  if (seconds < 60) return `${Math.round(seconds)} s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min`;
  if (seconds < 86400 * 2) return `${Math.round(seconds / 3600)} h`;
  return `${Math.round(seconds / 86400)} d`;
}

export function ms(value) {
  if (value === null || value === undefined) return "—";
  if (Math.abs(value) < 1000) return `${value} ms`;
  return `${(value / 1000).toFixed(value < 10000 ? 2 : 1)} s`;
}

export function count(n) {
  return Number(n).toLocaleString("en-US");
}

export function badge(text, kind = "", title = null) {
  return h("span", { class: `badge ${kind}`.trim(), title }, text);
}

// A schedule's state: enabled, paused, or neither (a stored `enabled` that is neither true nor
// false, written with SQL: a row error, not a paused schedule).
export function stateBadge(enabled) {
  if (enabled === true) return badge("enabled", "ok");
  if (enabled === false) return badge("paused", "muted");
  return badge("enabled: invalid", "bad", "the stored enabled is neither true nor false");
}

// A schedule past options.end_at: no slot is left (the API's status "ended").
export function endedBadge(item) {
  return item.status === "ended"
    ? badge("ended", "muted", "no slot is left before options.end_at")
    : null;
}

export function statusBadge(status) {
  const kinds = { enqueued: "ok", triggered: "info", backfilled: "info", duplicate: "muted", skipped: "warn", held: "info", failed: "bad" };
  return badge(status, kinds[status] || "");
}

export function json(value) {
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

// A table whose cells carry their column's label (phones show rows as cards).
export function table(caption, columns, rows, { empty = "Nothing here.", id = null, cards = true } = {}) {
  const head = h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col" }, c))));
  const body = h(
    "tbody",
    {},
    rows.length
      ? rows.map((cells) =>
          h("tr", {}, cells.map((cell, i) => h("td", { "data-label": columns[i] }, cell))),
        )
      : h("tr", {}, h("td", { colspan: columns.length, class: "empty" }, empty)),
  );
  return h(
    "div",
    { class: "table-wrap" },
    h("table", { class: cards ? "cards" : "compact", id }, h("caption", {}, caption), head, body),
  );
}

// Previous / next links for an offset-paginated list kept in the URL's query.
export function pager(label, { total, limit, offset }, param = "page") {
  const page = Math.floor(offset / limit) + 1;
  const pages = Math.max(1, Math.ceil(total / limit));
  const link = (target, text, rel) => {
    const url = new URL(location.href);
    url.searchParams.set(param, String(target));
    return h("a", { href: url.pathname + url.search, rel, class: "button" }, text);
  };
  const first = total ? offset + 1 : 0;
  const last = Math.min(total, offset + limit);
  return h(
    "nav",
    { class: "pager", "aria-label": label },
    page > 1 ? link(page - 1, "← Previous", "prev") : h("span", { class: "button disabled", "aria-disabled": "true" }, "← Previous"),
    h("span", { class: "range" }, `${count(first)}–${count(last)} of ${count(total)} (page ${page} of ${count(pages)})`),
    page < pages ? link(page + 1, "Next →", "next") : h("span", { class: "button disabled", "aria-disabled": "true" }, "Next →"),
  );
}

export function pageParam(name = "page") {
  const value = Number.parseInt(new URLSearchParams(location.search).get(name) || "1", 10);
  return Number.isFinite(value) && value >= 1 ? value : 1;
}

// Messages that survive one navigation (e.g. "Deleted x" shown on the list).
export function flashNext(text) {
  sessionStorage.setItem("pm.flash", text);
}

export function showFlash(text, kind = "ok") {
  const box = document.getElementById("flash");
  box.replaceChildren(text ? h("p", { class: `flash ${kind}` }, text) : "");
}

export function takeFlash() {
  const text = sessionStorage.getItem("pm.flash");
  sessionStorage.removeItem("pm.flash");
  if (text) showFlash(text);
}

// The modal confirmation; resolves true only for the confirming button.
export function confirmDialog(title, text, action = "Delete") {
  const dialog = document.getElementById("confirm-dialog");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  document.getElementById("confirm-ok").textContent = action;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
  });
}

export function canWrite() {
  return document.body.dataset.canWrite === "true";
}

// The caller's scope (GET /views/whoami): trigger allows pause, resume, trigger and backfill;
// admin also calendars. An API without tokens answers admin.
const SCOPES = ["read", "trigger", "write", "admin"];

function scopeAtLeast(needed) {
  return SCOPES.indexOf(document.body.dataset.scope || "read") >= SCOPES.indexOf(needed);
}

export function canTrigger() {
  return scopeAtLeast("trigger");
}

export function canAdmin() {
  return scopeAtLeast("admin");
}
