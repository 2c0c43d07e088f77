// Talking to the API: same origin only, JSON bodies with their content type, the bearer token
// (asked once, kept in sessionStorage: this tab only) on every request.

const TOKEN_KEY = "pm.token";

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

let asking = null;

// Ask for the token in the page's dialog; resolves once one was entered (parallel requests that
// were refused share one question).
export function askToken(reason) {
  if (!asking) asking = ask(reason).finally(() => { asking = null; });
  return asking;
}

function ask(reason) {
  const dialog = document.getElementById("token-dialog");
  const input = document.getElementById("token-input");
  document.getElementById("token-reason").textContent = reason;
  input.value = "";
  return new Promise((resolve) => {
    const form = document.getElementById("token-form");
    form.addEventListener(
      "submit",
      () => {
        sessionStorage.setItem(TOKEN_KEY, input.value.trim());
        resolve();
      },
      { once: true },
    );
    dialog.addEventListener("cancel", (event) => event.preventDefault());  // the page needs it
    dialog.showModal();
    input.focus();
  });
}

// One request. Resolves to {status, ok, headers, data} whatever the status; `data` is the parsed
// JSON body (a problem document for errors) or null. Rejects only when the API cannot be reached.
export async function api(method, path, { body, headers = {} } = {}) {
  const init = { method, headers: { accept: "application/json", ...headers } };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const t = token();
  if (t) init.headers.authorization = `Bearer ${t}`;
  init.credentials = "same-origin";
  init.cache = "no-store";
  const response = await fetch(path, init);
  let data = null;
  const type = response.headers.get("content-type") || "";
  if (type.includes("json")) {
    try {
      data = await response.json();
    } catch {
      data = null;
    }
  }
  return { status: response.status, ok: response.ok, headers: response.headers, data };
}

// GET that must succeed: a 401 asks for the token again and retries; other errors throw an
// ApiError carrying the answer (pages show it).
export async function getJson(path) {
  for (let attempt = 0; attempt < 3; attempt += 1) {
    const answer = await api("GET", path);
    if (answer.status === 401) {
      await askToken(token() ? "The token was refused. Enter a valid token." : "This API asks for a bearer token.");
      continue;
    }
    if (!answer.ok) throw new ApiError(`GET ${path}`, answer);
    return answer;
  }
  throw new ApiError(`GET ${path}`, { status: 401, data: null });
}

export class ApiError extends Error {
  constructor(what, answer) {
    super(`${what}: ${answer.status} ${problemText(answer.data)}`);
    this.answer = answer;
  }
}

// One line for a problem document (RFC 9457), naming each invalid field.
export function problemText(problem) {
  if (!problem || typeof problem !== "object") return "";
  const parts = [problem.detail || problem.title || ""];
  for (const item of problem.errors || []) {
    parts.push(`${item.field ?? item.location}: ${item.reason}`);
  }
  return parts.filter(Boolean).join("; ");
}

// Reason phrases for the statuses the API answers with.
const PHRASES = {
  200: "OK", 201: "Created", 202: "Accepted", 204: "No Content", 304: "Not Modified",
  400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
  409: "Conflict", 412: "Precondition Failed", 413: "Content Too Large",
  415: "Unsupported Media Type", 422: "Unprocessable Content", 500: "Internal Server Error",
  503: "Service Unavailable",
};

export function statusText(status) {
  return `${status} ${PHRASES[status] || ""}`.trim();
}
