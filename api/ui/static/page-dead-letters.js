// Dead letters: deliveries of the http target that got a permanent answer or spent their
// attempts or age. Each shows its slot, key, last status and answer; a replay sends it again with
// the same Idempotency-Key (the API's answer is shown).

import { api, getJson, problemText, statusText } from "./api.js";
import { badge, canWrite, count, h, mount, setTitle, table, utc } from "./dom.js";

async function replay(path, body, answerLine, reload) {
  const answer = await api("POST", path, body === null ? {} : { body });
  answerLine.className = `answer ${answer.ok ? "ok" : "bad"}`;
  answerLine.textContent = `POST ${path} → ${statusText(answer.status)}${
    answer.ok ? `: ${count(answer.data.count)} replayed` : `: ${problemText(answer.data)}`}`;
  if (answer.ok) await reload(answerLine);
}

function rows(items, answerLine, reload) {
  return items.map((d) => {
    const again = h("button", { type: "button", "data-letter": String(d.id),
      onclick: () => replay(`/dead-letters/${d.id}/replay`, null, answerLine, reload) }, "Replay");
    const status = d.last_status === null ? badge("no answer", "bad") : badge(String(d.last_status), "bad");
    return [
      h("code", {}, d.schedule), utc(d.slot),
      h("div", {}, h("code", {}, d.idempotency_key), h("div", { class: "sub" }, d.url)),
      h("div", {}, status, " ", d.last_error || "",
        d.body_excerpt ? h("div", { class: "sub" }, d.body_excerpt.slice(0, 200)) : null),
      String(d.attempts), utc(d.dead_at), canWrite() ? again : "",
    ];
  });
}

export async function deadLettersPage(ready, keep = null) {
  setTitle("Dead letters");
  const letters = await getJson("/dead-letters?limit=500");
  await ready;
  const answerLine = keep || h("p", { id: "answer", class: "answer", role: "status", "aria-live": "polite" });
  const reload = (line) => deadLettersPage(Promise.resolve(), line);
  const items = letters.data.items;
  const all = h("button", { type: "button", id: "replay-all",
    onclick: () => replay("/dead-letters/replay", { all: true }, answerLine, reload) }, "Replay all");
  mount(
    h("h1", {}, "Dead letters"),
    h("p", {}, "Deliveries of the http target that got a permanent answer or spent their ",
      h("code", {}, "options.retry"), ". A replay sends again with the same Idempotency-Key."),
    table("Dead letters, oldest first", ["Schedule", "Slot", "Key", "Last answer", "Attempts", "Dead at", ""],
      rows(items, answerLine, reload), { empty: "No dead letter.", id: "dead-letters" }),
    answerLine,
    canWrite() && items.length ? h("div", { class: "buttons" }, all) : null,
  );
}
