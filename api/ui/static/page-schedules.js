// Schedules: the filtered, paginated table, sorted by next slot unless asked otherwise. The
// filters are a plain GET form, so every filtered page is a URL of its own.

import { getJson } from "./api.js";
import { badge, count, endedBadge, h, local, ms, mount, pageParam, pager, relative, setTitle, stateBadge, statusBadge, table, utc } from "./dom.js";

const LIMIT = 50;
const FILTERS = ["name_prefix", "task_type", "queue", "enabled", "in_error", "sort"];

function field(id, labelText, control, hint = null) {
  return h("div", { class: "field" }, h("label", { for: id }, labelText), control, hint);
}

function select(id, value, options) {
  return h(
    "select",
    { id, name: id },
    options.map(([v, text]) => h("option", { value: v, selected: v === value }, text)),
  );
}

function filterForm(params) {
  const input = (id, placeholder) =>
    h("input", { id, name: id, type: "search", value: params.get(id) || "", placeholder, autocomplete: "off" });
  return h(
    "form",
    { class: "filters", method: "get", action: "/ui/schedules", role: "search", "aria-label": "Filter schedules" },
    field("name_prefix", "Name starts with", input("name_prefix", "reports.")),
    field("task_type", "Task type", input("task_type", "any")),
    field("queue", "Queue", input("queue", "any")),
    field("enabled", "State", select("enabled", params.get("enabled") || "", [["", "any"], ["true", "enabled"], ["false", "paused"]])),
    field("in_error", "Errors", select("in_error", params.get("in_error") || "", [["", "any"], ["true", "in error"], ["false", "no error"]])),
    field("sort", "Sort by", select("sort", params.get("sort") || "next", [["next", "next slot"], ["name", "name"], ["id", "id"]])),
    h("div", { class: "field buttons" },
      h("button", { type: "submit" }, "Filter"),
      h("a", { class: "button secondary", href: "/ui/schedules" }, "Clear")),
  );
}

function row(item, now) {
  const next = item.next
    ? h("div", {},
        h("div", {}, local(item.next.local, item.next.abbreviation)),
        h("div", { class: "sub" }, item.timezone === "UTC"
          ? relative(item.next.at, now) : `${utc(item.next.at)} · ${relative(item.next.at, now)}`))
    : endedBadge(item) || h("span", { class: "sub" }, item.enabled === false ? "paused" : "—");
  const last = item.last_run
    ? h("div", {}, statusBadge(item.last_run.status), " ", h("span", { class: "sub" }, `late ${ms(item.last_run.lateness_ms)}`))
    : h("span", { class: "sub" }, "no run yet");
  return [
    h("a", { href: `/ui/schedules/${item.id}`, class: "name" }, item.name),
    h("div", {}, h("code", { class: "spec", title: item.spec }, item.spec), item.description ? h("div", { class: "sub" }, item.description) : null),
    item.timezone,
    next,
    last,
    stateBadge(item.enabled),
    item.error ? badge("error", "bad", item.error) : "",
  ];
}

export async function schedulesPage(ready) {
  setTitle("Schedules");
  const params = new URLSearchParams(location.search);
  const query = new URLSearchParams();
  for (const key of FILTERS) {
    const value = params.get(key);
    if (value) query.set(key, value);
  }
  const page = pageParam();
  query.set("limit", String(LIMIT));
  query.set("offset", String((page - 1) * LIMIT));
  const { data } = await getJson(`/views/schedules?${query}`);
  await ready;
  const errors = data.items.filter((i) => i.error);
  mount(
    h("div", { class: "heading" },
      h("h1", {}, "Schedules"),
      h("a", { class: "button write", href: "/ui/schedules/new" }, "New schedule")),
    filterForm(params),
    table(
      `${count(data.total)} schedule${data.total === 1 ? "" : "s"}, by ${data.sort === "next" ? "next slot" : data.sort}`,
      ["Name", "Spec", "Zone", "Next slot", "Last run", "State", "Error"],
      data.items.map((item) => row(item, data.now)),
      { empty: "No schedule matches.", id: "schedules" },
    ),
    errors.length
      ? h("div", { class: "notes" }, h("h2", {}, "Errors on this page"),
          h("ul", {}, errors.map((i) => h("li", {}, h("a", { href: `/ui/schedules/${i.id}` }, i.name), `: ${i.error}`))))
      : null,
    pager("Schedule pages", data),
  );
}
