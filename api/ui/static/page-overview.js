// Overview: counts, the last hour of slots per minute as an inline SVG chart (with its numbers in
// a table for screen readers and keyboards), lateness percentiles and who leads.

import { getJson } from "./api.js";
import { count, h, mount, ms, setTitle, svg, table, utc } from "./dom.js";

const SERIES = [
  ["enqueued", "Enqueued", "c-ok"],
  ["skipped", "Skipped (too late)", "c-warn"],
  ["held", "Held (previous still running)", "c-hold"],
  ["failed", "Failed", "c-bad"],
];
const W = 600;
const H = 160;
const PAD_LEFT = 36;
const PAD_BOTTOM = 20;

function card(label, value, href) {
  return h("a", { class: "card", href }, h("span", { class: "value" }, count(value)), h("span", { class: "label" }, label));
}

function chart(data) {
  const points = data.series;
  const totals = points.map((p) => SERIES.reduce((sum, [key]) => sum + p[key], 0));
  const top = Math.max(1, ...totals);
  const plotW = W - PAD_LEFT;
  const plotH = H - PAD_BOTTOM;
  const barW = plotW / points.length;
  const bars = [];
  points.forEach((p, i) => {
    let y = plotH;
    for (const [key, label, cls] of SERIES) {
      if (!p[key]) continue;
      const height = (p[key] / top) * (plotH - 4);
      y -= height;
      bars.push(svg("rect", { x: PAD_LEFT + i * barW + 0.5, y, width: Math.max(1, barW - 1), height, class: cls },
        svg("title", {}, `${utc(p.start_at)}: ${p[key]} ${label.toLowerCase()}`)));
    }
  });
  const axis = [
    svg("line", { x1: PAD_LEFT, y1: plotH, x2: W, y2: plotH, class: "axis" }),
    svg("text", { x: PAD_LEFT - 4, y: 10, class: "tick", "text-anchor": "end" }, count(top)),
    svg("text", { x: PAD_LEFT - 4, y: plotH, class: "tick", "text-anchor": "end" }, "0"),
    svg("text", { x: PAD_LEFT, y: H - 4, class: "tick" }, utc(points[0].start_at).slice(11, 16) + " UTC"),
    svg("text", { x: W, y: H - 4, class: "tick", "text-anchor": "end" }, "now"),
  ];
  const sums = SERIES.map(([key]) => points.reduce((sum, p) => sum + p[key], 0));
  const summary = SERIES.map(([, label], i) => `${count(sums[i])} ${label.toLowerCase()}`).join(", ");
  return h("figure", { class: "chart" },
    svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-labelledby": "chart-title chart-desc", id: "chart" },
      svg("title", { id: "chart-title" }, "Slots per minute, last hour"),
      svg("desc", { id: "chart-desc" }, summary),
      ...axis, ...bars),
    h("figcaption", {},
      h("ul", { class: "legend" }, SERIES.map(([, label, cls], i) =>
        h("li", {}, h("span", { class: `swatch ${cls}`, "aria-hidden": "true" }), `${label}: ${count(sums[i])}`))),
      h("details", {}, h("summary", {}, "The numbers per minute"),
        table("Slots per minute (UTC)", ["Minute", "Enqueued", "Skipped", "Held", "Failed", "Duplicate", "Triggered", "Backfilled"],
          points.filter((p, i) => totals[i] || p.duplicate || p.triggered || p.backfilled).map((p) =>
            [utc(p.start_at).slice(0, 16), p.enqueued, p.skipped, p.held, p.failed, p.duplicate, p.triggered, p.backfilled]),
          { empty: "Nothing happened in the last hour." }))));
}

export async function overviewPage(ready) {
  setTitle("Overview");
  const { data } = await getJson("/views/overview");
  await ready;
  const c = data.counts;
  const l = data.lateness;
  const m = data.managers;
  mount(
    h("h1", {}, "Overview"),
    h("p", { class: "sub" }, `As of ${utc(data.now)}.`),
    h("div", { class: "cards-row", id: "counts" },
      card("schedules", c.schedules, "/ui/schedules"),
      card("enabled", c.enabled, "/ui/schedules?enabled=true"),
      card("paused", c.paused, "/ui/schedules?enabled=false"),
      card("in error", c.in_error, "/ui/schedules?in_error=true")),
    h("section", { "aria-labelledby": "hour-title" },
      h("h2", { id: "hour-title" }, "Last hour"),
      chart(data)),
    h("section", { "aria-labelledby": "lateness-title" },
      h("h2", { id: "lateness-title" }, "Lateness of enqueued slots, last hour"),
      table(`${count(l.count)} enqueued slots (nearest-rank percentiles)`, ["p50", "p90", "p99", "max"],
        [[ms(l.p50_ms), ms(l.p90_ms), ms(l.p99_ms), ms(l.max_ms)]], { id: "lateness" })),
    h("section", { "aria-labelledby": "managers-title" },
      h("h2", { id: "managers-title" }, "Managers"),
      h("p", {}, `${m.live} live manager${m.live === 1 ? "" : "s"}; `,
        m.leader ? ["leader ", h("code", {}, m.leader)] : "no leader",
        ". ", h("a", { href: "/ui/managers" }, "Details"))),
  );
}
