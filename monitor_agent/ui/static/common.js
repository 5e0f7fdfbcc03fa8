// Shared by the runs page, the run page and the HTML report: API access with the token
// kept in this tab's sessionStorage, formatting, and the tooltip.
"use strict";
const MA = (() => {
  const KEY = "monitor-agent-token";
  const report = window.MONITOR_REPORT || null;
  const token = () => sessionStorage.getItem(KEY) || "";

  class ApiError extends Error {
    constructor(status, detail) { super(detail); this.status = status; }
  }

  async function api(path, opts = {}) {
    if (report) {
      // The report holds one answer per chart; only the quantiles' layer picks among several.
      const [base, query] = path.split("?");
      const layer = new URLSearchParams(query || "").get("layer");
      const hit = report.answers[layer ? base + "?layer=" + layer : base] ?? report.answers[base];
      if (hit === undefined) throw new ApiError(404, "not in this report: " + path);
      return hit;
    }
    const headers = Object.assign({}, opts.headers || {});
    if (token()) headers.Authorization = "Bearer " + token();
    if (opts.body !== undefined) headers["Content-Type"] = "application/json";
    const method = opts.method || "GET";
    let res;
    for (let attempt = 1; ; attempt++) {
      res = await fetch(path, {
        method, headers, body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
      });
      // A busy sidecar sheds large reads with 503 + Retry-After (max_read_streams) rather
      // than queue them; a page that opens several charts at once waits its turn. Only reads
      // are retried: a write the server may have taken is the user's to repeat.
      const after = Number(res.headers.get("Retry-After"));
      if (method !== "GET" || ![429, 503].includes(res.status) || !(after >= 0) || attempt >= 5) break;
      await new Promise((done) => setTimeout(done, Math.min(after, 5) * 1000 + Math.random() * 250));
    }
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = text; }
    if (!res.ok) throw new ApiError(res.status, (data && data.detail) || res.statusText);
    return data;
  }

  function tokenBox(onChange) {
    const input = document.getElementById("token");
    if (!input) return;
    if (report) {
      input.parentElement.style.display = "none";
      document.getElementById("token-save").style.display = "none";
      return;
    }
    input.value = token();
    const save = () => {
      if (input.value) sessionStorage.setItem(KEY, input.value); else sessionStorage.removeItem(KEY);
      onChange && onChange();
    };
    input.addEventListener("change", save);
    document.getElementById("token-save").addEventListener("click", save);
  }

  function fmt(v, digits = 4) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "string") return v;
    if (!isFinite(v)) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(digits - 1);
    return Number(v.toPrecision(digits)).toString();
  }
  // Axis-tick and chip numbers: at most ~6 characters ("45k", "3e-4", "0.125"), so a label
  // never outgrows its axis. SI suffixes from 1e3; below 1e-2 a short exponent form.
  const SI = ["", "k", "M", "G", "T", "P"];
  function compact(v, sig = 3) {
    if (v === null || v === undefined) return "";
    if (!isFinite(v)) return String(v);
    const a = Math.abs(v);
    if (a === 0) return "0";
    if (a >= 1e3 && a < 1e18) {
      const k = Math.min(SI.length - 1, Math.floor(Math.log10(a) / 3));
      return Number((v / 10 ** (3 * k)).toPrecision(sig)) + SI[k];
    }
    if (a < 1e-2 || a >= 1e18) {
      const e = Math.floor(Math.log10(a));
      return Number((v / 10 ** e).toPrecision(Math.max(1, sig - 1))) + "e" + e;
    }
    return String(Number(v.toPrecision(sig)));
  }
  // Tick labels that stay distinct however close the ticks are (the significant digits
  // follow the tick spacing), each as short as compact() makes it.
  function ticks(splits, incr) {
    const top = Math.max(...splits.map(v => Math.abs(v ?? 0)));
    const sig = incr > 0 && top > 0 ? Math.min(8, Math.max(2, Math.ceil(Math.log10(top / incr)) + 1)) : 3;
    return splits.map(v => v == null ? "" : compact(v, sig));
  }

  function bytes(v) { return v == null ? "–" : (v / 2 ** 30).toFixed(2) + " GiB"; }
  function duration(s) {
    if (s == null) return "–";
    if (s < 90) return Math.round(s) + " s";
    if (s < 5400) return Math.round(s / 60) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  function ago(t) { return t == null ? "–" : duration(Date.now() / 1000 - t) + " ago"; }
  function esc(s) {
    return String(s ?? "").replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;",
      '"': "&quot;", "'": "&#39;"}[c]));
  }
  function el(tag, attrs = {}, ...kids) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") n.className = v; else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
      else if (k === "html") n.innerHTML = v; else n.setAttribute(k, v);
    }
    for (const k of kids) n.append(k instanceof Node ? k : document.createTextNode(k ?? ""));
    return n;
  }

  let tipEl = null;
  function tip(html, ev) {
    tipEl = tipEl || document.body.appendChild(el("div", {id: "tip"}));
    if (html === null) { tipEl.style.display = "none"; return; }
    tipEl.innerHTML = html;
    tipEl.style.display = "block";
    const w = tipEl.offsetWidth, h = tipEl.offsetHeight;
    tipEl.style.left = Math.min(ev.clientX + 14, innerWidth - w - 8) + "px";
    tipEl.style.top = (ev.clientY + h + 20 > innerHeight ? ev.clientY - h - 10 : ev.clientY + 14) + "px";
  }

  function notice(text, kind = "") {
    const box = document.getElementById("notice");
    if (!box) return;
    box.className = text ? "notice " + kind : "";
    box.textContent = text || "";
  }

  return {api, ApiError, tokenBox, fmt, compact, ticks, bytes, duration, ago, esc, el, tip, notice, report,
          hasToken: () => !!token()};
})();
