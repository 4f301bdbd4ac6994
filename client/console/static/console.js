// Tidelog console: live updates and charts, on top of pages that work without JavaScript.
// Every refresh interval the page is fetched again and each element with data-live is
// replaced by its new version (forms are outside those regions, so typing is never lost);
// charts (uPlot, vendored under /static/uplot/) re-read their JSON.
"use strict";
(function () {
  const refreshMs = Number(document.body.dataset.refreshMs) || 5000;
  let live = true;
  const toggle = document.getElementById("live-toggle");
  if (toggle) {
    toggle.hidden = false;
    toggle.addEventListener("click", () => {
      live = !live;
      toggle.setAttribute("aria-pressed", String(live));
      toggle.textContent = "Live updates: " + (live ? "on" : "off");
    });
  }

  async function refreshRegions() {
    const regions = document.querySelectorAll("[data-live]");
    if (!regions.length) return;
    const answer = await fetch(window.location.href, { headers: { "X-Console-Live": "1" }, credentials: "same-origin" });
    if (!answer.ok || answer.redirected) return;
    const page = new DOMParser().parseFromString(await answer.text(), "text/html");
    regions.forEach((region) => {
      const fresh = page.querySelector('[data-live="' + region.dataset.live + '"]');
      if (fresh && fresh.innerHTML !== region.innerHTML) region.innerHTML = fresh.innerHTML;
    });
    document.body.dataset.refreshed = String(Date.now());
  }

  const charts = [];
  function chartData(json) {
    const times = new Set();
    json.series.forEach((s) => s.points.forEach((p) => times.add(p[0])));
    const xs = Array.from(times).sort((a, b) => a - b);
    const columns = json.series.map((s) => {
      const byTime = new Map(s.points.map((p) => [p[0], p[1]]));
      return xs.map((x) => (byTime.has(x) ? byTime.get(x) : null));
    });
    return [xs, ...columns];
  }
  const colours = ["#0b5cad", "#b4410b", "#2c7a3f"];
  async function drawChart(element) {
    const answer = await fetch(element.dataset.chart, { credentials: "same-origin" });
    if (!answer.ok) return;
    const json = await answer.json();
    const data = chartData(json);
    let entry = charts.find((c) => c.element === element);
    if (!entry) {
      if (typeof uPlot === "undefined") return;
      element.textContent = "";
      const options = {
        width: Math.max(280, element.clientWidth),
        height: 220,
        series: [{}].concat(json.series.map((s, i) => ({
          label: s.name, stroke: colours[i % colours.length], width: 2, spanGaps: false,
        }))),
        axes: [{}, { label: element.dataset.unit || "" }],
      };
      entry = { element, plot: new uPlot(options, data, element) };
      charts.push(entry);
    } else {
      entry.plot.setData(data);
    }
    element.dataset.points = String(data[0].length);
  }
  function drawCharts() {
    document.querySelectorAll("[data-chart]").forEach((el) => drawChart(el).catch(() => {}));
  }
  window.addEventListener("resize", () => {
    charts.forEach((c) => c.plot.setSize({ width: Math.max(280, c.element.clientWidth), height: 220 }));
  });

  async function tick() {
    if (live && !document.hidden) {
      try { await refreshRegions(); } catch (e) { /* the next tick tries again */ }
      drawCharts();
    }
    window.setTimeout(tick, refreshMs);
  }
  drawCharts();
  window.setTimeout(tick, refreshMs);
})();
