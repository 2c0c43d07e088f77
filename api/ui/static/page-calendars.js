// Calendars: the exclusion calendars a schedule's options.exclude names (dates, or a country's
// public holidays), who names each, and a form to create or replace one; delete asks first and
// shows the API's answer (a calendar still named is refused, with the schedules that name it).

import { api, getJson, problemText, statusText } from "./api.js";
import { badge, canAdmin, confirmDialog, count, h, mount, setTitle, table, utc } from "./dom.js";

const SHOWN_DATES = 12;

function content(c) {
  if (c.kind === null) return h("span", { class: "error" }, badge("unreadable", "bad"), " ", c.error || "");
  const days = c.dates.slice(0, SHOWN_DATES).join(", ") + (c.dates.length > SHOWN_DATES ? ", …" : "");
  if (c.kind === "holidays") {
    const where = c.holidays.subdiv ? `${c.holidays.country}-${c.holidays.subdiv}` : c.holidays.country;
    return h("div", {}, h("div", {}, `public holidays of ${where}`),
      h("div", { class: "sub" }, `this year and next: ${days || "none"}`));
  }
  return h("div", {}, `${count(c.dates.length)} date${c.dates.length === 1 ? "" : "s"}`,
    c.dates.length ? h("div", { class: "sub" }, days) : null);
}

function form(answerLine, reload) {
  const name = h("input", { id: "cal-name", name: "name", required: true, maxlength: "64",
    pattern: "[A-Za-z0-9][A-Za-z0-9_.\\-]{0,63}", placeholder: "holidays-de-by" });
  const kind = h("select", { id: "cal-kind", name: "kind" },
    h("option", { value: "dates" }, "dates"), h("option", { value: "holidays" }, "public holidays"));
  const dates = h("textarea", { id: "cal-dates", name: "dates", rows: "3", placeholder: "2026-12-24 2026-12-31" });
  const country = h("input", { id: "cal-country", name: "country", maxlength: "3", placeholder: "DE" });
  const subdiv = h("input", { id: "cal-subdiv", name: "subdiv", maxlength: "10", placeholder: "BY (optional)" });
  const datesPart = h("div", { class: "field" }, h("label", { for: "cal-dates" }, "Dates (YYYY-MM-DD, separated by spaces, commas or lines)"), dates);
  const holidaysPart = h("div", { class: "field", hidden: true },
    h("label", { for: "cal-country" }, "Country (ISO 3166)"), country,
    h("label", { for: "cal-subdiv" }, "Subdivision"), subdiv);
  kind.addEventListener("change", () => {
    datesPart.hidden = kind.value !== "dates";
    holidaysPart.hidden = kind.value === "dates";
  });
  const submit = async (event) => {
    event.preventDefault();
    const body = kind.value === "dates"
      ? { dates: dates.value.split(/[\s,]+/).filter(Boolean) }
      : { holidays: subdiv.value.trim() ? { country: country.value.trim(), subdiv: subdiv.value.trim() } : { country: country.value.trim() } };
    const path = `/calendars/${encodeURIComponent(name.value.trim())}`;
    let answer;
    try {
      answer = await api("PUT", path, { body });
    } catch (error) {
      answerLine.className = "answer bad";
      answerLine.textContent = `PUT ${path} → the API could not be reached (${error.message})`;
      return;
    }
    answerLine.className = `answer ${answer.ok ? "ok" : "bad"}`;
    answerLine.textContent = `PUT ${path} → ${statusText(answer.status)}${answer.ok ? "" : `: ${problemText(answer.data)}`}`;
    if (answer.ok) await reload(answerLine);
  };
  return h("form", { id: "calendar-form", class: "write", "aria-label": "Create or replace a calendar", onsubmit: submit },
    h("h2", {}, "Create or replace a calendar"),
    h("div", { class: "field" }, h("label", { for: "cal-name" }, "Name"), name),
    h("div", { class: "field" }, h("label", { for: "cal-kind" }, "Kind"), kind),
    datesPart, holidaysPart,
    h("div", { class: "buttons" }, h("button", { type: "submit", id: "cal-save" }, "Save")));
}

function rows(items, answerLine, reload) {
  return items.map((c) => {
    const remove = h("button", { type: "button", class: "danger", "data-calendar": c.name, onclick: async () => {
      const sure = await confirmDialog(`Delete calendar ${c.name}?`, "Schedules may not name it any more. This cannot be undone.");
      if (!sure) return;
      const path = `/calendars/${encodeURIComponent(c.name)}`;
      const answer = await api("DELETE", path);
      answerLine.className = `answer ${answer.ok ? "ok" : "bad"}`;
      answerLine.textContent = `DELETE ${path} → ${statusText(answer.status)}${answer.ok ? "" : `: ${problemText(answer.data)}`}`;
      if (answer.ok) await reload(answerLine);
    } }, "Delete…");
    return [h("code", {}, c.name), content(c), utc(c.updated_at), canAdmin() ? remove : ""];
  });
}

export async function calendarsPage(ready, keep = null) {
  setTitle("Calendars");
  const calendars = await getJson("/calendars");
  await ready;
  const answerLine = keep || h("p", { id: "answer", class: "answer", role: "status", "aria-live": "polite" });
  const reload = (line) => calendarsPage(Promise.resolve(), line);
  const items = calendars.data.items;
  mount(
    h("h1", {}, "Calendars"),
    h("p", {}, "A schedule sends no slot whose local date is in a calendar its ",
      h("code", {}, "options.exclude"), " names; the manager records such a slot as skipped."),
    table("Exclusion calendars, by name", ["Name", "Dates", "Updated", ""], rows(items, answerLine, reload),
      { empty: "No calendar yet.", id: "calendars" }),
    answerLine,
    canAdmin() ? form(answerLine, reload)
      : h("p", { class: "sub", id: "calendars-read-only" }, "Calendars are shared by every schedule: only an admin key or token changes them."),
  );
}
