// One schedule: its config, the next 10 slots (daylight-saving changes marked), its lateness and
// outcomes over the last hour and day (GET /schedules/{id}/stats), what the managers hold for it,
// its run history and its change history (two tabs), and the write buttons, each
// showing the API's answer.

import { api, getJson, problemText, statusText } from "./api.js";
import {
  badge, canTrigger, canWrite, confirmDialog, flashNext, h, json, local, mount, ms, pageParam, pager, setTitle,
  endedBadge, stateBadge, statusBadge, table, utc,
} from "./dom.js";

const RUNS_LIMIT = 20;
const CHANGES_LIMIT = 20;
const TABS = ["runs", "changes"];
const RUN_STATUSES = ["", "enqueued", "triggered", "backfilled", "skipped", "held", "failed", "duplicate", "resent"];

// A payload or options the API shows as null or {} because they cannot be used as they are
// (not JSON, not an object, ...): the stored text, when the API sends it, is what to repair.
function column(s, field, value) {
  const bad = (s.errors || []).find((e) => e.field === field && typeof e.stored === "string");
  if (!bad) return json(value);
  return h("div", {}, h("pre", { class: "json stored", id: `stored-${field}` }, bad.stored),
    h("div", { class: "sub" }, `as stored; unusable: ${bad.reason}`));
}

// Who paused it, when and why (POST /schedules/{id}/pause with a note; "sql": a plain SQL UPDATE).
function pausedInfo(s) {
  const p = s.enabled === false ? s.paused : null;
  if (!p || (!p.at && !p.by && !p.note)) return null;
  return h("span", { class: "sub", id: "paused-info" },
    " ", p.at ? `since ${utc(p.at)}` : "", p.by ? ` by ${p.by}` : "",
    p.note ? [": ", h("q", { id: "paused-note" }, p.note)] : "");
}

function config(s) {
  const options = s.options && typeof s.options === "object" && !Array.isArray(s.options) ? s.options : null;
  const rows = [
    ["Name", s.name],
    ["Spec", h("code", {}, s.spec)],
    ["Zone", s.timezone],
    ["Anchor", s.anchor ? utc(s.anchor) : "—"],
    ["Task type", s.task_type],
    ["Queue", options && (s.errors || []).every((e) => e.field !== "options") ? options.queue || "default" : "—"],
    ["Payload", column(s, "payload", s.payload)],
    ["Options", column(s, "options", s.options)],
    ["State", h("span", {}, stateBadge(s.enabled), pausedInfo(s))],
    // options.max_runs: the runs the database records as left (null: no limit).
    ...(s.runs_left === null || s.runs_left === undefined ? []
      : [["Runs left", h("span", { id: "runs-left" }, String(s.runs_left))]]),
    ["Description", s.description || "—"],
    ["Created", utc(s.created_at)],
    ["Updated", utc(s.updated_at)],
  ];
  return h("section", { "aria-labelledby": "config-title" },
    h("h2", { id: "config-title" }, "Configuration"),
    h("dl", { class: "config" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));
}

// What runs while the row is bad, as the live managers report it (never assumed: a row that
// never was good, or one whose good version no manager holds, runs nowhere).
function lastGoodNote(items) {
  const reports = items.filter((e) => e.source === "manager");
  const kept = reports.filter((e) => e.last_good_since);
  if (kept.length) {
    const since = kept.map((e) => e.last_good_since).sort()[0];
    return h("p", { id: "last-good" },
      `Its last good version keeps running (kept since ${utc(since)}, by ${kept.map((e) => e.manager_id).join(", ")}) `
      + "until the row is fixed, paused or deleted.");
  }
  if (reports.length) {
    return h("p", { id: "last-good" }, "No good version of it runs: it fires again once the row is fixed.");
  }
  return null;
}

function rowErrors(s) {
  const items = s.errors || [];
  if (!items.length) return null;
  return h("div", { class: "alert", role: "alert" },
    h("h2", {}, "Rejected by the manager"),
    h("ul", {}, items.map((e) => h("li", {}, e.field ? `${e.field}: ${e.reason}` : e.message || e.reason || JSON.stringify(e)))),
    lastGoodNote(items));
}

function state(s) {
  const st = s.state;
  if (!st) return null;
  const c = st.counts || {};
  return h("p", { class: "sub" },
    `Last slot ${utc(st.last_slot_at)}, last status ${st.last_status || "—"}; `
    + `enqueued ${c.enqueued ?? 0}, skipped ${c.skipped ?? 0}, failed ${c.failed ?? 0}, duplicate ${c.duplicate ?? 0}`
    + (c.held ? `, held ${c.held}.` : "."));
}

// GET /schedules/{id}/stats: p50/p99 lateness of the sent slots and runs by reason, for the last
// hour and the last day, and the newest run late beyond grace ("when and why" in one look).
function seconds(value) {
  return value === null || value === undefined ? "—" : ms(Math.round(value * 1000));
}

function reasons(window) {
  const found = Object.entries(window.by_reason).filter(([, n]) => n > 0);
  if (!found.length) return "—";
  return h("span", { class: "reasons" }, found.map(([reason, n], i) => [i ? ", " : "", badge(`${reason} ${n}`, "warn")]));
}

function statsSection(stats) {
  const heading = h("h2", { id: "stats-title" }, "Lateness and reasons");
  if (!stats) return h("section", { "aria-labelledby": "stats-title" }, heading, h("p", { class: "error" }, "The stats could not be read."));
  const windows = [["Last hour", stats.last_hour], ["Last day", stats.last_day]];
  const rows = windows.map(([label, w]) => [
    label, String(w.runs), String(w.sent), seconds(w.lateness_p50_s), seconds(w.lateness_p99_s), reasons(w),
  ]);
  const late = stats.last_late;
  return h("section", { "aria-labelledby": "stats-title", id: "stats" },
    heading,
    table("Runs of the history by window: lateness of the sent slots (nearest rank) and reasons",
      ["Window", "Runs", "Sent", "p50", "p99", "Reasons"], rows, { id: "stats-table", cards: false }),
    h("p", { class: "sub", id: "last-late" }, late
      ? [`Last late beyond grace: slot ${utc(late.slot_at)}, ${late.status || "—"} `, badge(late.reason || "—", "warn"),
        `, ${seconds(late.lateness_s)} late, handled ${utc(late.at)}`, late.error ? ` (${late.error})` : ""]
      : "No run late beyond grace in the history."));
}

function slotsSection(slots) {
  const heading = h("h2", { id: "slots-title" }, `Next ${slots.slots.length} slots`);
  if (slots.error) {
    return h("section", { "aria-labelledby": "slots-title" }, heading, h("p", { class: "error" }, slots.error));
  }
  const rows = slots.slots.map((slot, i) => [
    String(i + 1),
    h("div", {}, local(slot.local, slot.abbreviation),
      slot.marks.length
        ? h("div", { class: "dst-notes" },
            slot.marks.map((m) => (m === "excluded" ? badge("excluded: not sent", "warn") : badge(`DST: ${m}`, "dst"))),
            h("div", { class: "sub" }, slot.notes.join("; ")))
        : null),
    utc(slot.at),
  ]);
  return h("section", { "aria-labelledby": "slots-title" },
    heading,
    slots.description ? h("p", {}, slots.description, ` (${slots.timezone})`) : null,
    slots.enabled ? null : h("p", { class: "sub" }, "Paused: these slots fire only once it is resumed."),
    table(`Next slots in ${slots.timezone}; daylight-saving changes marked`, ["#", `Local (${slots.timezone})`, "UTC"], rows,
      { id: "slots", cards: false }));
}

function entriesSection(entries) {
  const rows = entries.map((e) => [
    h("span", {}, e.manager_id, e.manager_is_leader ? [" ", badge("leader", "info")] : ""),
    h("span", {}, e.status === "error" ? badge("error", "bad") : badge(e.status, "ok"),
      // options.overlap: a slot held while the previous task runs, and that task's state.
      e.held_slot ? [" ", badge(`held ${utc(e.held_slot)}`, "warn")] : "",
      // A rejected row whose last good version this manager keeps running.
      e.last_good_since ? [" ", badge(`last good version runs since ${utc(e.last_good_since)}`, "warn")] : "",
      e.previous_task ? [" ", badge(`previous task ${e.previous_task.state}`, "muted")] : ""),
    h("code", { title: e.hash }, e.hash.slice(0, 12)),
    utc(e.previous_slot),
    utc(e.next_slot),
    utc(e.registered_at),
    e.last_error || "",
  ]);
  return h("section", { "aria-labelledby": "entries-title" },
    h("h2", { id: "entries-title" }, "What the managers hold"),
    table("Entries of live managers", ["Holder", "Status", "Registered hash", "Previous slot", "Next slot", "Registered", "Error"], rows,
      { empty: "No live manager holds an entry for it (paused, or no manager running).", id: "entries" }));
}

function runsSection(id, runs, statusFilter) {
  const rows = runs.items.map((r) => [
    utc(r.slot_at),
    statusBadge(r.status),
    utc(r.at),
    ms(r.lateness_ms),
    r.message_id ? h("code", {}, r.message_id) : "—",
    r.error || "",
  ]);
  const filter = h("form", { method: "get", class: "inline", "aria-label": "Filter the history" },
    h("label", { for: "runs_status" }, "Outcome "),
    h("select", { id: "runs_status", name: "runs_status" },
      RUN_STATUSES.map((v) => h("option", { value: v, selected: v === statusFilter }, v || "any"))),
    " ",
    h("button", { type: "submit" }, "Show"));
  return h("section", { "aria-labelledby": "runs-title" },
    h("h2", { id: "runs-title" }, "Run history"),
    filter,
    table(`Runs, newest slot first (${runs.total})`, ["Slot", "Outcome", "Handled", "Lateness", "Message id", "Error"], rows,
      { empty: "No run recorded yet.", id: "runs" }),
    pager("History pages", runs, "runs_page"));
}

// A changed value as text: strings as they are, anything else as JSON; null (NULL, absent,
// unreadable) as a dash. Untrusted like every column: shown as text, never as markup.
function changed(value) {
  if (value === null || value === undefined) return "—";
  return typeof value === "string" ? value : JSON.stringify(value);
}

function changesSection(changes) {
  const rows = changes.items.map((c) => [
    utc(c.at),
    badge(c.action),
    c.source,
    c.actor || "—",
    c.changes === null
      ? h("span", { class: "sub" }, "unreadable entry")
      : h("ul", { class: "changes" }, Object.entries(c.changes).map(([field, d]) =>
        h("li", {}, h("code", {}, field), ": ", h("span", { class: "before" }, changed(d.before)), " → ",
          h("span", { class: "after" }, changed(d.after)), d.truncated ? h("span", { class: "sub" }, " (cut to 2000 characters)") : ""))),
  ]);
  return h("section", { "aria-labelledby": "changes-title" },
    h("h2", { id: "changes-title" }, "Changes"),
    table(`Changes, newest first (${changes.total})`, ["When", "Change", "Source", "Actor", "Fields (before → after)"], rows,
      { empty: "No change recorded (or all pruned).", id: "changes" }),
    pager("Change pages", changes, "changes_page"));
}

// Run history and change history as two tabs; the open one is kept in the URL (?tab=).
function historyTabs(selected, panels) {
  const labels = { runs: "Run history", changes: "Changes" };
  const buttons = {};
  const select = (name) => {
    for (const tab of TABS) {
      buttons[tab].setAttribute("aria-selected", String(tab === name));
      buttons[tab].tabIndex = tab === name ? 0 : -1;
      panels[tab].hidden = tab !== name;
    }
    const url = new URL(location.href);
    url.searchParams.set("tab", name);
    history.replaceState(null, "", url.pathname + url.search);
  };
  for (const tab of TABS) {
    buttons[tab] = h("button", { type: "button", role: "tab", id: `tab-${tab}`, "aria-controls": `panel-${tab}`,
      onclick: () => select(tab) }, labels[tab]);
  }
  const list = h("div", { role: "tablist", class: "tabs", "aria-label": "History" }, TABS.map((t) => buttons[t]));
  list.addEventListener("keydown", (e) => {
    if (e.key !== "ArrowRight" && e.key !== "ArrowLeft") return;
    const next = TABS[(TABS.indexOf(TABS.find((t) => !panels[t].hidden)) + 1) % TABS.length];
    select(next);
    buttons[next].focus();
  });
  const wrapped = TABS.map((t) => h("div", { role: "tabpanel", id: `panel-${t}`, "aria-labelledby": `tab-${t}` }, panels[t]));
  for (const [i, t] of TABS.entries()) panels[t] = wrapped[i];
  for (const tab of TABS) {
    buttons[tab].setAttribute("aria-selected", String(tab === selected));
    buttons[tab].tabIndex = tab === selected ? 0 : -1;
    panels[tab].hidden = tab !== selected;
  }
  return h("div", { class: "history" }, list, wrapped);
}

// The action buttons; each shows the API's answer in the status line.
function actions(s, etag, reload) {
  const answerLine = h("p", { id: "answer", class: "answer", role: "status", "aria-live": "polite" });
  const show = (what, answer, detail) => {
    const ok = answer.ok;
    answerLine.className = `answer ${ok ? "ok" : "bad"}`;
    answerLine.textContent = `${what} → ${statusText(answer.status)}${detail ? `: ${detail}` : ""}`;
  };
  const run = async (what, method, path, options, describe) => {
    let answer;
    try {
      answer = await api(method, path, options);
    } catch (error) {
      answerLine.className = "answer bad";
      answerLine.textContent = `${what} → the API could not be reached (${error.message})`;
      return null;
    }
    show(what, answer, answer.ok ? describe(answer) : problemText(answer.data));
    return answer;
  };
  // An optional note goes with a pause (the API keeps it, with when and by whom, until resumed).
  const note = h("input", { type: "text", id: "pause-note", maxlength: "500", placeholder: "Pause note (optional)",
    "aria-label": "Pause note (optional)" });
  const toggle = s.enabled
    ? h("span", {}, note, " ", h("button", { type: "button", id: "pause", onclick: async () => {
        const body = note.value.trim() ? { body: { note: note.value.trim() } } : {};
        const a = await run(`POST /schedules/${s.id}/pause`, "POST", `/schedules/${s.id}/pause`, body, (x) => `enabled = ${x.data.enabled}`);
        if (a && a.ok) await reload(answerLine);
      } }, "Pause"))
    : h("button", { type: "button", id: "resume", onclick: async () => {
        const a = await run(`POST /schedules/${s.id}/resume`, "POST", `/schedules/${s.id}/resume`, {}, (x) => `enabled = ${x.data.enabled}`);
        if (a && a.ok) await reload(answerLine);
      } }, "Resume");
  const trigger = h("button", { type: "button", id: "trigger", onclick: async () => {
    const a = await run(`POST /schedules/${s.id}/trigger`, "POST", `/schedules/${s.id}/trigger`, {},
      (x) => `${x.data.status} to queue ${x.data.queue}, key ${x.data.idempotency_key}, message ${x.data.message_id ?? "—"}`);
    if (a) await reload(answerLine);
  } }, "Trigger now");
  // Backfill: every slot in [from, to) never sent, sent once (paced); a dry run only counts.
  const from = h("input", { type: "text", id: "backfill-from", placeholder: "from (2026-03-01T00:00:00Z)", "aria-label": "Backfill from (ISO 8601 with offset)" });
  const to = h("input", { type: "text", id: "backfill-to", placeholder: "to (excluded, not after now)", "aria-label": "Backfill to (ISO 8601 with offset, excluded)" });
  const dry = h("input", { type: "checkbox", id: "backfill-dry-run" });
  const backfill = h("span", { class: "backfill" }, from, " ", to, " ", h("label", {}, dry, " dry run"), " ",
    h("button", { type: "button", id: "backfill", onclick: async () => {
      const body = { body: { from: from.value.trim(), to: to.value.trim(), dry_run: dry.checked } };
      const a = await run(`POST /schedules/${s.id}/backfill`, "POST", `/schedules/${s.id}/backfill`, body,
        (x) => `${x.data.dry_run ? "dry run: would send" : "sent"} ${x.data.dry_run ? x.data.to_send : x.data.sent} of ${x.data.slots} slot(s); already sent ${x.data.already_sent}, skipped ${x.data.skipped}, failed ${x.data.failed}${x.data.unchecked ? `; ${x.data.unchecked} older than what is remembered, not sent (force it with the API or the CLI's --force)` : ""}`);
      if (a && a.ok && !dry.checked) await reload(answerLine);
    } }, "Backfill"));
  const remove = h("button", { type: "button", id: "delete", class: "danger", onclick: async () => {
    const sure = await confirmDialog(`Delete ${s.name}?`, "The schedule, its runtime state and its run history are deleted. This cannot be undone.");
    if (!sure) return;
    const a = await run(`DELETE /schedules/${s.id}`, "DELETE", `/schedules/${s.id}`, { headers: { "if-match": etag } }, () => "deleted");
    if (a && a.ok) {
      flashNext(`Deleted ${s.name} (DELETE /schedules/${s.id} → ${statusText(a.status)}).`);
      location.assign("/ui/schedules");
    } else if (a && a.status === 412) {
      answerLine.textContent += " — it changed since this page was loaded; look again before deleting.";
      await reload(answerLine);
    }
  } }, "Delete…");
  if (!canTrigger()) return h("div", { class: "actions" }, h("p", { class: "sub" }, "Read-only token: no changes can be made."));
  // A trigger key may pause, resume, trigger and backfill; editing and deleting need write.
  const writes = canWrite();
  return h("div", { class: "actions", role: "group", "aria-label": "Actions" },
    writes ? h("a", { class: "button", href: `/ui/schedules/${s.id}/edit`, id: "edit" }, "Edit") : null,
    toggle, trigger, backfill, writes ? remove : null, answerLine);
}

export async function schedulePage(id, ready = null, keep = null) {
  const params = new URLSearchParams(location.search);
  const runsPage = pageParam("runs_page");
  const statusFilter = RUN_STATUSES.includes(params.get("runs_status")) ? params.get("runs_status") : "";
  const runsQuery = new URLSearchParams({ limit: RUNS_LIMIT, offset: (runsPage - 1) * RUNS_LIMIT });
  if (statusFilter) runsQuery.set("status", statusFilter);
  const changesPage = pageParam("changes_page");
  const changesQuery = new URLSearchParams({ limit: CHANGES_LIMIT, offset: (changesPage - 1) * CHANGES_LIMIT });
  const tab = TABS.includes(params.get("tab")) ? params.get("tab") : "runs";
  const [detail, slots, entries, runs, changes, stats] = await Promise.all([
    getJson(`/schedules/${id}`),
    getJson(`/views/schedules/${id}/slots?n=10`),
    getJson(`/entries?schedule_id=${id}`),
    getJson(`/schedules/${id}/runs?${runsQuery}`),
    getJson(`/schedules/${id}/changes?${changesQuery}`),
    getJson(`/schedules/${id}/stats`).catch(() => null),
  ]);
  await ready;
  const s = detail.data;
  setTitle(s.name);
  const reload = (answerLine) => schedulePage(id, null, answerLine);
  const bar = actions(s, detail.headers.get("etag"), reload);
  if (keep) {
    // Keep the last answer visible after the page is drawn again with fresh data.
    const line = bar.querySelector("#answer");
    if (line) {
      line.className = keep.className;
      line.textContent = keep.textContent;
    }
  }
  mount(
    h("p", { class: "crumbs" }, h("a", { href: "/ui/schedules" }, "Schedules"), " / ", s.name),
    h("div", { class: "heading" }, h("h1", {}, s.name), stateBadge(s.enabled), endedBadge(s),
      (s.errors || []).length ? badge("error", "bad") : null),
    bar,
    rowErrors(s),
    h("div", { class: "columns" }, config(s), slotsSection(slots.data)),
    state(s),
    statsSection(stats && stats.data),
    entriesSection(entries.data.items),
    historyTabs(tab, { runs: runsSection(id, runs.data, statusFilter), changes: changesSection(changes.data) }),
  );
}
