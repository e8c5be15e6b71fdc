// The console's charts: ECharts (fetched by `make console-assets`, served from
// /ui/static/vendor) drawing the numbers the server put in the page as JSON. Nothing
// here computes a number the tables do not show; the cumulative curve is the running
// sum of the same bins.
"use strict";

const PALETTE = ["#1f6feb", "#f79009", "#12b76a", "#7a5af8", "#f04438", "#0ba5ec", "#ee46bc", "#667085"];

function pageData(id) {
  const el = document.getElementById(id);
  return el ? JSON.parse(el.textContent) : null;
}

function chart(id) {
  const el = document.getElementById(id);
  if (!el || !window.echarts) return null;
  const c = echarts.init(el, null, { renderer: "canvas" });
  window.addEventListener("resize", () => c.resize());
  return c;
}

const fmt = n => n.toLocaleString("en");  // 3,000 hosts, as the tables write counts

const toolbox = { feature: { saveAsImage: { title: "PNG", pixelRatio: 2 } } };

// A legend that shows every entry (no pages, nothing cut): ECharts wraps a plain legend
// onto more lines; the plot starts below as many lines as the entries take at this width.
function legendTop(names, width) {
  let rows = 1, x = 0;
  names.forEach(n => {
    const w = 25 + 10 + 7 * n.length;
    if (x + w > width - 20 && x > 0) { rows += 1; x = 0; }
    x += w;
  });
  return { legend: { type: "plain", top: 24, left: 0, right: 0, itemGap: 10 }, top: 24 + rows * 22 + 34 };
}

function binLabels(d) {
  return d.bins.map(b => `${Math.round(b.lo * 100)}-${Math.round(b.hi * 100)}%`);
}

function drawFleet() {
  const data = pageData("fleet-data");
  if (!data) return;
  const u = data.u, labels = binLabels(u.day);
  const groups = data.groups;  // both days' groups (the server's list): one only the compare day has too
  const label = g => (data.labels && data.labels[g]) || g;  // a policy by its name
  const days = [["day", u.day]].concat(u.compare ? [["compare", u.compare]] : []);
  const hist = chart("hist");
  if (hist) {
    // rack, state, policy split the hosts: their bars stack to the hosts in a bin. Each
    // class (IO service, VMs, other) is a distribution of every host of its own: its bars
    // stand side by side, never stacked (a stack would count each host three times).
    // With a compare day, the classes' side-by-side bars would be six to a bin, a few
    // pixels each: the compare day is drawn as stepped dashed lines over the day's bars.
    const stacked = u.group !== "class";
    const series = [];
    days.forEach(([key, d]) => groups.forEach((g, i) => {
      const color = PALETTE[i % PALETTE.length], data_ = d.bins.map(b => b.counts[g] || 0);
      if (key === "compare" && !stacked) {
        series.push({ name: `${label(g)} ${d.day}`, type: "line", step: "middle", symbol: "none", data: data_,
                      lineStyle: { color, type: "dashed", width: 2 }, itemStyle: { color } });
        return;
      }
      series.push({
        name: `${label(g)} ${d.day}`, type: "bar", stack: stacked ? key : undefined, barGap: "10%",
        itemStyle: { color, opacity: key === "day" ? 1 : 0.4,
                     decal: key === "day" ? null : { symbol: "rect", dashArrayX: [1, 0], dashArrayY: [2, 3],
                                                     rotation: -Math.PI / 4 } },
        data: data_,
      });
    }));
    const lg = legendTop(series.map(x => x.name), document.getElementById("hist").clientWidth);
    hist.setOption({
      aria: { enabled: true, decal: { show: true } }, toolbox, tooltip: { trigger: "axis" },
      legend: lg.legend, grid: { left: 48, right: 16, top: lg.top, bottom: 48 },
      xAxis: { type: "category", data: labels, name: "CPU in use", nameLocation: "middle", nameGap: 30 },
      yAxis: { type: "value", name: "hosts", minInterval: 1 },
      title: { text: days.map(([, d]) => `${d.day}: ${fmt(d.hosts_included)} hosts, ${fmt(d.hosts_missing)} missing`).join("  ·  ")
                     + `  ·  ${u.window === "peak" ? "peak window" : "hours " + u.window}`,
               left: 0, top: 0, textStyle: { fontSize: 12, fontWeight: "normal" } },
      series,
    });
    hist.on("click", p => {
      const a = document.querySelector(`tr[data-bin="${p.dataIndex}"] a`);
      if (a) a.click();
    });
  }
  const cdf = chart("cdf");
  if (cdf) {
    const series = [];
    days.forEach(([key, d]) => groups.forEach((g, i) => {
      const total = d.groups[g] ? d.groups[g].hosts : 0;
      let run = 0;
      series.push({ name: `${label(g)} ${d.day}`, type: "line", step: "end", symbol: "none",
                    lineStyle: { color: PALETTE[i % PALETTE.length], type: key === "day" ? "solid" : "dashed" },
                    itemStyle: { color: PALETTE[i % PALETTE.length] },
                    data: d.bins.map(b => { run += b.counts[g] || 0; return total ? +(run / total).toFixed(4) : 0; }) });
    }));
    const lg = legendTop(series.map(x => x.name), document.getElementById("cdf").clientWidth);
    cdf.setOption({ toolbox, tooltip: { trigger: "axis" }, legend: lg.legend,
                    grid: { left: 48, right: 16, top: lg.top, bottom: 48 },
                    xAxis: { type: "category", data: labels, name: "CPU in use", nameLocation: "middle", nameGap: 30 },
                    yAxis: { type: "value", min: 0, max: 1, name: "share of hosts" }, series });
  }
  const heat = chart("heat");
  if (heat && data.heat.length) {
    const cells = [];
    let top = 1;
    // a day no host sent is left blank (and says so), not painted as zero hosts in every bin
    data.heat.forEach((row, y) => {
      if (row.hosts) row.counts.forEach((n, x) => { cells.push([x, y, n]); top = Math.max(top, n); });
    });
    heat.setOption({
      toolbox, tooltip: { formatter: p => `${data.heat[p.value[1]].day}, ${labels[p.value[0]]}: ${fmt(p.value[2])} hosts` },
      grid: { left: 130, right: 16, top: 10, bottom: 70 },
      xAxis: { type: "category", data: labels, splitArea: { show: true } },
      yAxis: { type: "category", data: data.heat.map(r => r.day),
               axisLabel: { formatter: (v, i) => (data.heat[i].hosts ? v : `${v} (no data)`) } },
      visualMap: { min: 0, max: top, calculable: true, orient: "horizontal", left: "center", bottom: 0 },
      series: [{ type: "heatmap", data: cells }],
    });
  }
}

function drawHealth() {
  const data = pageData("health-data");
  const c = data && data.items && data.items.length ? chart("health") : null;
  if (!c) return;
  const t = data.items.map(i => new Date(i.start * 1000).toISOString().slice(11, 16));
  const pick = k => data.items.map(i => (i[k] === undefined ? null : i[k]));
  c.setOption({ toolbox, tooltip: { trigger: "axis" }, legend: { top: 0 }, grid: { left: 48, right: 48, top: 40, bottom: 30 },
                xAxis: { type: "category", data: t },
                yAxis: [{ type: "value", name: "ms" }, { type: "value", name: "%" }],
                series: [{ name: "probe p99 max (ms)", type: "line", data: pick("probe_p99_ms_max") },
                         { name: "PSI some avg10 max (%)", type: "line", yAxisIndex: 1, data: pick("psi_some_avg10_max") }] });
}

// What the pages once did inline (the Content-Security-Policy allows no inline script):
// a button with data-confirm asks first; a link with data-back goes back when there is
// somewhere to go back to (else it is a plain link to the console's start).
function wireActions() {
  document.querySelectorAll("button[data-confirm]").forEach(b => b.addEventListener("click", e => {
    if (!window.confirm(b.dataset.confirm)) e.preventDefault();
  }));
  document.querySelectorAll("a[data-back]").forEach(a => a.addEventListener("click", e => {
    if (window.history.length > 1) { e.preventDefault(); window.history.back(); }
  }));
}

// htmx leaves a failed request's answer unswapped; a target marked data-show-errors shows
// it (the error fragment naming what went wrong) instead of nothing.
document.addEventListener("htmx:beforeSwap", e => {
  if (e.detail.xhr.status >= 400 && e.detail.target && e.detail.target.hasAttribute("data-show-errors")) {
    e.detail.shouldSwap = true;
    e.detail.isError = false;
  }
});

document.addEventListener("DOMContentLoaded", () => { wireActions(); drawFleet(); drawHealth(); });

// Live parts (data-live: the host's state and hold, the drain, the fleet's counts, the
// hosts list) poll their fragment every few seconds (hx-trigger "every 3s"). A hidden tab
// asks nothing (the poll's request is cancelled); shown again, each part refreshes at once.
document.addEventListener("htmx:beforeRequest", e => {
  if (document.hidden && e.detail.elt && e.detail.elt.hasAttribute("data-live")) e.preventDefault();
});
document.addEventListener("visibilitychange", () => {
  if (document.hidden || !window.htmx) return;
  document.querySelectorAll("[data-live]").forEach(el => htmx.trigger(el, "refresh"));
});
