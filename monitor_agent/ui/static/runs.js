// The runs page: one line per run, sortable by any column, filtered by project/status.
"use strict";
(() => {
  const {api, el, fmt, ago, duration, notice} = MA;
  let runs = [], sortKey = "last_seen", sortDir = -1;
  const picked = new Set();  // runs ticked for the compare page (kept across re-renders)
  const body = document.querySelector("#runs tbody");

  function options(select, values) {
    const keep = select.value;
    select.replaceChildren(el("option", {value: ""}, "all"),
      ...[...new Set(values)].filter(v => v).sort().map(v => el("option", {value: v}, v)));
    select.value = keep;
  }

  function render() {
    const project = document.getElementById("f-project").value;
    const status = document.getElementById("f-status").value;
    const text = document.getElementById("f-text").value.toLowerCase();
    const shown = runs.filter(r => (!project || r.project === project) &&
      (!status || r.status === status) && r.run_id.toLowerCase().includes(text));
    shown.sort((a, b) => {
      const x = a[sortKey], y = b[sortKey];
      if (x === y) return 0;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * sortDir;
    });
    body.replaceChildren(...shown.map(row));
    document.getElementById("none").style.display = runs.length ? "none" : "block";
    document.getElementById("count").textContent = `${shown.length} of ${runs.length} runs`;
    document.querySelectorAll("#runs th[data-key]").forEach(th => {
      th.textContent = th.textContent.replace(/ [▲▼]$/, "") +
        (th.dataset.key === sortKey ? (sortDir > 0 ? " ▲" : " ▼") : "");
    });
  }

  function row(r) {
    const link = el("a", {href: "/runs/" + encodeURIComponent(r.run_id)}, r.run_id);
    const progress = r.progress == null ? el("span", {class: "muted"}, "–") :
      el("span", {}, el("span", {class: "bar"}, el("i", {style: `width:${Math.round(r.progress * 100)}%`})),
         ` ${Math.round(r.progress * 100)}%` + (r.eta_seconds != null ? ` · ${duration(r.eta_seconds)} left` : ""));
    const findings = el("span", {}, String(r.findings), " ",
      r.worst_finding ? el("span", {class: "sev sev-" + r.worst_finding}, r.worst_finding) : "");
    const pick = el("input", {type: "checkbox", class: "pick", "aria-label": "compare " + r.run_id});
    pick.checked = picked.has(r.run_id);
    pick.addEventListener("change", () => {
      if (pick.checked) picked.add(r.run_id); else picked.delete(r.run_id);
      compareButton();
    });
    return el("tr", {"data-run": r.run_id},
      el("td", {}, pick), el("td", {}, link), el("td", {}, r.project || "–"),
      el("td", {class: "status status-" + r.status}, r.status + (r.active ? "" : " (stored)"),
        r.verdict ? el("div", {class: "verdict verdict-" + r.verdict.state, title: r.verdict.words},
                       r.verdict.words) : ""),
      el("td", {}, r.last_step == null || r.last_step < 0 ? el("span", {class: "muted"}, "no steps yet") : String(r.last_step)),
      el("td", {}, progress),
      // Productive time / wall-clock (runs/goodput.py); blank before any time is measured.
      el("td", {class: "goodput" + (r.goodput == null ? "" : r.goodput < 0.7 ? " poor" : r.goodput < 0.9 ? " fair" : ""),
                "data-value": r.goodput == null ? "" : String(r.goodput)},
         r.goodput == null ? "" : (r.goodput * 100).toFixed(1) + "%"),
      el("td", {}, findings),
      el("td", {class: r.firing_alerts ? "state-firing" : ""}, String(r.firing_alerts)),
      el("td", {}, ago(r.last_seen)));
  }

  async function load() {
    try {
      runs = (await api("/v1/ui/runs")).runs;
      notice("");
    } catch (e) {
      notice(e.status === 401 ? "This sidecar requires the token for reads: enter it above."
        : "Cannot load runs: " + e.message, "error");
    }
    options(document.getElementById("f-project"), runs.map(r => r.project));
    options(document.getElementById("f-status"), runs.map(r => r.status));
    render();
  }

  function compareButton() {
    const button = document.getElementById("compare");
    button.disabled = picked.size < 2;
    button.textContent = picked.size ? `compare selected (${picked.size})` : "compare selected";
  }
  document.getElementById("compare").addEventListener("click", () => {
    location.href = "/compare?" + new URLSearchParams([...picked].map(r => ["run", r]));
  });
  document.querySelectorAll("#runs th[data-key]").forEach(th => th.addEventListener("click", () => {
    sortDir = sortKey === th.dataset.key ? -sortDir : 1;
    sortKey = th.dataset.key;
    render();
  }));
  for (const id of ["f-project", "f-status", "f-text"])
    document.getElementById(id).addEventListener("input", render);
  MA.tokenBox(load);
  load();
  setInterval(load, 3000);
})();
