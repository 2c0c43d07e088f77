// Managers: the live ones (leader first) with heartbeat age, last sync and its error, whether
// one stands down because its targets do not answer (target_down), the partitions each holds
// (PM_COORDINATION=partitions) and how many entries, and the entries they hold (rejected rows
// first), paginated.

import { getJson } from "./api.js";
import { badge, count, duration, h, mount, pageParam, pager, setTitle, table, utc } from "./dom.js";

const LIMIT = 50;
const CLOCK_BOUND_S = 2; // an offset from the database's clock beyond this is shown (docs/operations.md#clocks)

function heartbeat(m) {
  const age = m.heartbeat_age_s < 1 ? "just now" : `${duration(m.heartbeat_age_s)} ago`;
  const off = m.clock_offset_s;
  if (typeof off !== "number" || Math.abs(off) <= CLOCK_BOUND_S) return age;
  const text = `clock ${Math.abs(off).toFixed(1)} s ${off > 0 ? "ahead of" : "behind"} the database's`;
  return h("span", {}, age, " ", badge(text, "warn"));
}

function managerRows(items) {
  return items.map((m) => [
    h("span", {}, h("code", {}, m.manager_id), m.is_leader ? [" ", badge("leader", "info")] : "",
      m.target_down ? [" ", badge("holds no work", "bad"), h("div", { class: "error" }, m.target_down)] : ""),
    `${m.hostname} (pid ${m.pid})`,
    m.version,
    utc(m.started_at),
    heartbeat(m),
    h("div", {}, utc(m.last_sync_at), m.last_sync_error ? h("div", { class: "error" }, m.last_sync_error) : null),
    m.partitions.length
      ? h("span", { title: `${m.partitions.length} partition${m.partitions.length === 1 ? "" : "s"}` }, m.partition_ranges)
      : "—",
    h("span", {}, m.entry_count === null ? "" : `${count(m.entry_count)} held, `, `${count(m.entries_active)} active`,
      m.entries_error ? [", ", badge(`${m.entries_error} rejected`, "bad")] : ""),
  ]);
}

function entryRows(items) {
  return items.map((e) => [
    e.schedule_id ? h("a", { href: `/ui/schedules/${e.schedule_id}` }, e.name || e.schedule_key) : e.name || e.schedule_key,
    h("span", {}, e.status === "error" ? badge("error", "bad") : badge(e.status, "ok"),
      e.last_good_since ? [" ", badge(`last good version runs since ${utc(e.last_good_since)}`, "warn")] : ""),
    e.spec ? h("code", { class: "spec", title: e.spec }, e.spec) : "—",
    e.timezone || "—",
    h("code", { title: e.hash }, e.hash.slice(0, 12)),
    h("code", {}, e.manager_id),
    utc(e.registered_at),
    e.last_error || "",
  ]);
}

export async function managersPage(ready) {
  setTitle("Managers");
  const params = new URLSearchParams(location.search);
  const status = ["active", "error"].includes(params.get("status")) ? params.get("status") : "";
  const page = pageParam();
  const query = new URLSearchParams({ limit: LIMIT, offset: (page - 1) * LIMIT });
  if (status) query.set("status", status);
  const [managers, entries] = await Promise.all([getJson("/views/managers"), getJson(`/views/entries?${query}`)]);
  await ready;
  const items = managers.data.items;
  const leader = items.find((m) => m.is_leader);
  mount(
    h("h1", {}, "Managers"),
    h("p", {}, items.length
      ? [`${items.length} live manager${items.length === 1 ? "" : "s"}; `, leader ? ["leader ", h("code", {}, leader.manager_id)] : "none leads right now", "."]
      : "No live manager: schedules are not being enqueued."),
    table("Live managers, leader first", ["Manager", "Host", "Version", "Started", "Heartbeat", "Last sync", "Partitions", "Entries"],
      managerRows(items), { empty: "No live manager.", id: "managers" }),
    h("section", { "aria-labelledby": "entries-title" },
      h("h2", { id: "entries-title" }, "Entries"),
      h("form", { method: "get", class: "inline", "aria-label": "Filter the entries" },
        h("label", { for: "status" }, "Status "),
        h("select", { id: "status", name: "status" },
          [["", "any"], ["active", "active"], ["error", "rejected"]].map(([v, t]) => h("option", { value: v, selected: v === status }, t))),
        " ", h("button", { type: "submit" }, "Show")),
      table(`Entries of live managers, rejected first (${count(entries.data.total)})`,
        ["Schedule", "Status", "Spec", "Zone", "Registered hash", "Manager", "Registered", "Error"],
        entryRows(entries.data.items), { empty: "No entry.", id: "entry-table" }),
      pager("Entry pages", entries.data)),
  );
}
