// Create and edit. Spec, zone and anchor are checked through /cron/next while typing (next 5
// slots and the description update); payload and options are checked as JSON. The server's
// problem details are shown beside the field they name. Edits are PATCHes of the changed fields
// with If-Match; a 412 shows what someone else changed and lets the user choose.

import { api, getJson, problemText, statusText } from "./api.js";
import { canWrite, flashNext, h, local, mount, setTitle, utc } from "./dom.js";

const FIELDS = ["name", "spec", "timezone", "anchor", "task_type", "queue", "payload", "options", "enabled", "description"];
const LABELS = {
  name: "Name", spec: "Spec", timezone: "Zone", anchor: "Anchor (optional)", task_type: "Task type",
  queue: "Queue", payload: "Payload (JSON)", options: "Other options (JSON object)", enabled: "Enabled",
  description: "Description",
};
const HINTS = {
  name: "Unique; ASCII letters, digits and _ . : / @ - (starting with a letter or digit)",
  spec: "Five-field cron, a macro (@daily) or @every 90s",
  timezone: "IANA zone the spec is read in, e.g. Europe/Berlin",
  anchor: "ISO 8601 instant with offset; phases an @every interval",
  task_type: "The task's name as your workers know it",
  queue: "Empty: default",
  payload: "Any JSON value handed to the task; empty: null",
  options: "max_retry, timeout, unique_ttl, target, misfire, catchup_window, overlap, overlap_timeout, extra, start_at, end_at, jitter, max_runs, pause_after_failures, exclude, metrics",
};
const DEBOUNCE_MS = 200;

// -- the form's values <-> a schedule body --------------------------------------------------

function fromSchedule(s) {
  const options = s.options && typeof s.options === "object" && !Array.isArray(s.options) ? { ...s.options } : {};
  const queue = typeof options.queue === "string" ? options.queue : "";
  delete options.queue;
  return {
    name: s.name, spec: s.spec, timezone: s.timezone, anchor: s.anchor || "", task_type: s.task_type,
    queue, payload: s.payload === null || s.payload === undefined ? "" : JSON.stringify(s.payload, null, 2),
    options: Object.keys(options).length ? JSON.stringify(options, null, 2) : "{}",
    enabled: Boolean(s.enabled), description: s.description || "",
  };
}

const EMPTY = {
  name: "", spec: "", timezone: "UTC", anchor: "", task_type: "", queue: "", payload: "", options: "{}",
  enabled: true, description: "",
};

// The body fields of the form's values; throws {field, reason} for JSON the browser can tell is bad.
function toBody(values) {
  const parseJson = (field, text, fallback) => {
    if (!text.trim()) return fallback;
    try {
      return JSON.parse(text);
    } catch (error) {
      throw { field, reason: `not valid JSON (${error.message})` };
    }
  };
  const options = parseJson("options", values.options, {});
  if (!options || typeof options !== "object" || Array.isArray(options)) {
    throw { field: "options", reason: "must be a JSON object" };
  }
  if ("queue" in options) throw { field: "options", reason: "set the queue in its own field" };
  if (values.queue.trim()) options.queue = values.queue.trim();
  return {
    name: values.name, spec: values.spec, timezone: values.timezone, task_type: values.task_type,
    payload: parseJson("payload", values.payload, null), options, enabled: values.enabled,
    description: values.description.trim() ? values.description : null,
    anchor: values.anchor.trim() ? values.anchor.trim() : null,
  };
}

// The API field an error names -> the form field it is shown beside.
function formField(apiField) {
  if (!apiField) return null;
  if (apiField === "tz") return "timezone";
  if (apiField === "options.queue") return "queue";
  const head = String(apiField).split(".")[0];
  return FIELDS.includes(head) ? head : null;
}

// -- building the form ------------------------------------------------------------------------

function control(name, value) {
  const common = { id: `f-${name}`, name, "aria-describedby": `h-${name} e-${name}` };
  if (name === "enabled") return h("input", { ...common, type: "checkbox", checked: value });
  if (["payload", "options", "description"].includes(name)) {
    return h("textarea", { ...common, rows: name === "description" ? 2 : 4, spellcheck: "false" }, value);
  }
  const attrs = { ...common, type: "text", value, autocomplete: "off", spellcheck: "false" };
  if (["name", "spec", "task_type"].includes(name)) attrs.required = true;
  if (name === "timezone") attrs.list = "zones";
  return h("input", attrs);
}

function fieldBlock(name, value) {
  return h("div", { class: `field f-${name}`, id: `fb-${name}` },
    h("label", { for: `f-${name}` }, LABELS[name]),
    control(name, value),
    h("p", { class: "hint", id: `h-${name}` }, HINTS[name] || ""),
    h("p", { class: "field-error", id: `e-${name}`, "aria-live": "polite" }));
}

function readValues(form) {
  const values = {};
  for (const name of FIELDS) {
    const el = form.elements[name];
    values[name] = name === "enabled" ? el.checked : el.value;
  }
  return values;
}

function setError(form, name, text, source) {
  const box = form.querySelector(`#e-${name}`);
  const input = form.elements[name];
  if (!box) return;
  // Each source (live preview, local JSON check, server) clears only its own messages.
  if (!text && box.dataset.source && box.dataset.source !== source) return;
  box.textContent = text || "";
  box.dataset.source = text ? source : "";
  if (text) input.setAttribute("aria-invalid", "true");
  else input.removeAttribute("aria-invalid");
}

function clearErrors(form, source) {
  for (const name of FIELDS) setError(form, name, "", source);
  const top = form.querySelector("#form-error");
  top.textContent = "";
}

function showProblem(form, answer) {
  const problem = answer.data || {};
  const loose = [];
  for (const item of problem.errors || []) {
    const name = formField(item.field);
    if (name) setError(form, name, item.reason, "server");
    else loose.push(`${item.field ?? item.location}: ${item.reason}`);
  }
  const top = form.querySelector("#form-error");
  const summary = `${statusText(answer.status)}: ${problem.detail || problem.title || ""}`;
  top.textContent = [summary, ...loose].join(" — ");
  const first = form.querySelector("[aria-invalid=true]");
  if (first) first.focus();
}

// -- live preview -------------------------------------------------------------------------------

function previewer(form, box) {
  let timer = null;
  let asked = 0;
  const draw = (data) => {
    let previous = null;
    box.replaceChildren(
      h("p", { class: "description" }, data.description || "(no plain-English description for this spec)"),
      h("ol", { class: "preview-slots", id: "preview-slots" }, data.next.map((slot) => {
        const offset = slot.local.slice(-6);
        const changed = previous !== null && offset !== previous;
        previous = offset;
        return h("li", {}, local(slot.local, data.timezone === "UTC" ? "UTC" : null),
          data.timezone === "UTC" ? "" : ` ${data.timezone}`,
          data.timezone === "UTC" ? null : h("span", { class: "sub" }, ` · ${utc(slot.at)}`),
          changed ? h("span", { class: "badge dst" }, "DST: offset change") : null);
      })),
    );
  };
  const check = async () => {
    const values = readValues(form);
    if (!values.spec.trim()) {
      box.replaceChildren(h("p", { class: "sub" }, "Type a spec to see its next slots."));
      return;
    }
    const query = new URLSearchParams({ spec: values.spec, tz: values.timezone || "UTC", n: "5" });
    if (values.anchor.trim()) query.set("anchor", values.anchor.trim());
    const mine = ++asked;
    let answer;
    try {
      answer = await api("GET", `/cron/next?${query}`);
    } catch {
      return;
    }
    if (mine !== asked) return;  // an older answer arriving late
    for (const name of ["spec", "timezone", "anchor"]) setError(form, name, "", "live");
    if (answer.ok) {
      draw(answer.data);
      return;
    }
    box.replaceChildren(h("p", { class: "sub" }, "No preview: see the error beside the field."));
    for (const item of (answer.data && answer.data.errors) || []) {
      const name = formField(item.field);
      if (name) setError(form, name, item.reason, "live");
    }
  };
  return () => {
    clearTimeout(timer);
    timer = setTimeout(check, DEBOUNCE_MS);
  };
}

function jsonChecker(form) {
  return () => {
    const values = readValues(form);
    for (const name of ["payload", "options"]) setError(form, name, "", "local");
    try {
      toBody(values);
    } catch (error) {
      if (error && error.field) setError(form, error.field, error.reason, "local");
    }
  };
}

// -- the 412 conflict ---------------------------------------------------------------------------

function conflictPanel(base, current, edited, onTheirs, onMine) {
  const opened = fromSchedule(base);
  const theirs = fromSchedule(current);
  const changed = FIELDS.filter((f) => JSON.stringify(opened[f]) !== JSON.stringify(theirs[f]));
  const cell = (value) => h("td", {}, h("code", {}, String(value)));
  return h("div", { class: "alert", role: "alert", id: "conflict" },
    h("h2", {}, "Someone else changed this schedule"),
    h("p", {}, `It was updated at ${utc(current.updated_at)}, after you opened it. Nothing was saved (412 Precondition Failed). What changed:`),
    h("div", { class: "table-wrap" }, h("table", { class: "diff" },
      h("thead", {}, h("tr", {}, ["Field", "When you opened it", "Now", "Your edit"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, (changed.length ? changed : []).map((f) => h("tr", {},
        h("th", { scope: "row" }, LABELS[f]), cell(opened[f]), cell(theirs[f]), cell(edited[f])))))),
    changed.length ? null : h("p", {}, "Only its version changed (e.g. paused and resumed)."),
    h("div", { class: "buttons" },
      h("button", { type: "button", id: "take-theirs", onclick: onTheirs }, "Load their version (drop my edits)"),
      h("button", { type: "button", id: "keep-mine", class: "secondary", onclick: onMine }, "Keep my edits on top of theirs")));
}

// Their version with only the fields I changed (from what I opened) replaced by mine.
function merged(base, current, edited) {
  const opened = fromSchedule(base);
  const out = fromSchedule(current);
  for (const f of FIELDS) {
    if (JSON.stringify(edited[f]) !== JSON.stringify(opened[f])) out[f] = edited[f];
  }
  return out;
}

// -- the page -----------------------------------------------------------------------------------

export async function formPage(id, ready) {
  const editing = id !== null;
  setTitle(editing ? "Edit schedule" : "New schedule");
  const loading = editing ? getJson(`/schedules/${id}`) : null;
  const zoneList = getJson("/views/zones").then((a) => a.data).catch(() => []);
  if (loading) loading.catch(() => {});  // observed below, unless the token is read-only
  await ready;
  if (!canWrite()) {
    mount(h("h1", {}, editing ? "Edit schedule" : "New schedule"),
      h("p", { class: "error", role: "alert", id: "read-only" }, "This token is read-only: schedules cannot be created or changed."));
    return;
  }
  let base = null;
  let etag = null;
  if (editing) {
    const answer = await loading;
    base = answer.data;
    etag = answer.headers.get("etag");
  }
  render(id, base, etag, await zoneList, null);
}

function render(id, base, etag, zones, carried) {
  const editing = id !== null;
  const values = carried || (base ? fromSchedule(base) : EMPTY);
  const preview = h("div", { class: "preview", id: "preview", "aria-live": "polite" });
  const conflictBox = h("div", { id: "conflict-box" });
  const form = h("form", { class: "schedule-form", novalidate: true, id: "schedule-form" },
    h("p", { class: "error", id: "form-error", role: "alert" }),
    h("div", { class: "grid" },
      h("div", {}, ["name", "spec", "timezone", "anchor"].map((f) => fieldBlock(f, values[f])),
        h("section", { class: "preview-box", "aria-labelledby": "preview-title" },
          h("h2", { id: "preview-title" }, "Next 5 slots"), preview)),
      h("div", {}, ["task_type", "queue", "payload", "options", "enabled", "description"].map((f) => fieldBlock(f, values[f])))),
    h("datalist", { id: "zones" }, zones.map((z) => h("option", { value: z }))),
    h("div", { class: "buttons" },
      h("button", { type: "submit", id: "save" }, editing ? "Save changes" : "Create schedule"),
      h("a", { class: "button secondary", href: editing ? `/ui/schedules/${id}` : "/ui/schedules" }, "Cancel")));
  const live = previewer(form, preview);
  const checkJson = jsonChecker(form);
  for (const name of ["spec", "timezone", "anchor"]) form.elements[name].addEventListener("input", live);
  for (const name of ["payload", "options"]) form.elements[name].addEventListener("input", checkJson);
  for (const name of FIELDS) {
    form.elements[name].addEventListener("input", () => setError(form, name, "", "server"));
  }
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    await submit(form, id, base, etag, conflictBox, zones);
  });
  mount(
    editing ? h("p", { class: "crumbs" }, h("a", { href: "/ui/schedules" }, "Schedules"), " / ",
      h("a", { href: `/ui/schedules/${id}` }, base.name), " / edit") : null,
    h("h1", {}, editing ? `Edit ${base.name}` : "New schedule"),
    conflictBox,
    form,
  );
  live();
}

async function submit(form, id, base, etag, conflictBox, zones) {
  clearErrors(form, "server");
  const values = readValues(form);
  let body;
  try {
    body = toBody(values);
  } catch (error) {
    setError(form, error.field, error.reason, "local");
    form.elements[error.field].focus();
    return;
  }
  const save = form.querySelector("#save");
  save.disabled = true;
  try {
    let answer;
    if (id === null) {
      answer = await api("POST", "/schedules", { body });
    } else {
      const before = toBody(fromSchedule(base));
      const patch = {};
      for (const [key, value] of Object.entries(body)) {
        if (JSON.stringify(value) !== JSON.stringify(before[key])) patch[key] = value;
      }
      answer = await api("PATCH", `/schedules/${id}`, { body: patch, headers: { "if-match": etag } });
    }
    if (answer.ok) {
      const saved = answer.data;
      flashNext(`${id === null ? "Created" : "Saved"} ${saved.name} (${id === null ? "POST /schedules" : `PATCH /schedules/${id}`} → ${statusText(answer.status)}).`);
      location.assign(`/ui/schedules/${saved.id}`);
      return;
    }
    if (answer.status === 412) {
      const current = await getJson(`/schedules/${id}`);
      const fresh = current.headers.get("etag");
      conflictBox.replaceChildren(conflictPanel(base, current.data, values,
        () => render(id, current.data, fresh, zones, null),
        // Their version becomes the base and my edits stay in the form: saving again sends
        // what differs from theirs, with their tag.
        () => render(id, current.data, fresh, zones, merged(base, current.data, values))));
      conflictBox.querySelector("#take-theirs").focus();
      form.querySelector("#form-error").textContent = `${statusText(412)}: ${problemText(answer.data)}`;
      return;
    }
    showProblem(form, answer);
  } catch (error) {
    form.querySelector("#form-error").textContent = `The API could not be reached: ${error.message}`;
  } finally {
    save.disabled = false;
  }
}
