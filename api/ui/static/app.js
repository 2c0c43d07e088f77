// The dashboard's entry point: find out who we are (asking for the token if the API wants one),
// then render the page the URL names. Every page is a real URL; links are plain links.

import { api, askToken, forgetToken, token, ApiError, statusText, problemText } from "./api.js";
import { h, mount, setTitle, takeFlash } from "./dom.js";
import { overviewPage } from "./page-overview.js";
import { schedulesPage } from "./page-schedules.js";
import { schedulePage } from "./page-schedule.js";
import { formPage } from "./page-form.js";
import { managersPage } from "./page-managers.js";
import { calendarsPage } from "./page-calendars.js";
import { deadLettersPage } from "./page-dead-letters.js";

// Each page gets `ready`, a promise of the caller's identity: pages fetch their data while the
// token is checked and wait for it only before drawing (write buttons depend on it).
const ROUTES = [
  [/^\/ui\/?$/, "overview", (m, ready) => overviewPage(ready)],
  [/^\/ui\/schedules\/?$/, "schedules", (m, ready) => schedulesPage(ready)],
  [/^\/ui\/schedules\/new$/, "new", (m, ready) => formPage(null, ready)],
  [/^\/ui\/schedules\/(\d+)$/, "schedules", (m, ready) => schedulePage(Number(m[1]), ready)],
  [/^\/ui\/schedules\/(\d+)\/edit$/, "schedules", (m, ready) => formPage(Number(m[1]), ready)],
  [/^\/ui\/managers$/, "managers", (m, ready) => managersPage(ready)],
  [/^\/ui\/calendars$/, "calendars", (m, ready) => calendarsPage(ready)],
  [/^\/ui\/dead-letters$/, "dead-letters", (m, ready) => deadLettersPage(ready)],
];

// Who the caller is: {auth, can_write, scope, key}. Asks for the token while the API answers 401.
async function whoami() {
  for (;;) {
    const answer = await api("GET", "/views/whoami");
    if (answer.status !== 401) {
      if (!answer.ok) throw new ApiError("GET /views/whoami", answer);
      return answer.data;
    }
    await askToken(
      token()
        ? "That token was refused. Enter a valid token."
        : "This API asks for a bearer token. It is kept in this browser tab only.",
    );
  }
}

function showWho(who) {
  document.body.dataset.canWrite = who.can_write ? "true" : "false";
  document.body.dataset.scope = who.scope;
  const line = document.getElementById("who");
  if (!who.auth) {
    line.replaceChildren();
    return who;
  }
  const forget = h("button", {
    type: "button",
    class: "link",
    onclick: () => {
      forgetToken();
      location.reload();
    },
  }, "Forget token");
  const kind = who.can_write ? "read and write" : "read-only";
  const whose = who.key ? `key ${who.key}, ` : "";
  line.replaceChildren(`Token: ${kind} (${whose}scope ${who.scope}) `, forget);
  return who;
}

function markNav(name) {
  for (const link of document.querySelectorAll("[data-nav]")) {
    if (link.dataset.nav === name) link.setAttribute("aria-current", "page");
  }
}

function showError(error) {
  setTitle("Error");
  const answer = error instanceof ApiError ? error.answer : null;
  mount(
    h("h1", {}, answer && answer.status === 404 ? "Not found" : "Something went wrong"),
    h("p", { class: "error", role: "alert" },
      answer ? `${statusText(answer.status)}: ${problemText(answer.data)}` : String(error.message || error)),
    h("p", {}, h("a", { href: "/ui" }, "Back to the overview")),
  );
}

async function main() {
  const path = location.pathname;
  const route = ROUTES.map(([re, nav, render]) => [re.exec(path), nav, render]).find(([m]) => m);
  const ready = whoami().then(showWho);
  takeFlash();
  try {
    if (!route) {
      await ready;
      setTitle("Not found");
      mount(h("h1", {}, "Not found"), h("p", {}, "No page here. ", h("a", { href: "/ui" }, "Go to the overview")));
    } else {
      markNav(route[1]);
      await Promise.all([ready, route[2](route[0], ready)]);
    }
  } catch (error) {
    showError(error);
  }
  document.body.dataset.ready = "1";
  performance.mark("pm-rendered");
}

main();
