// The Sentinel console: reads the command center every second and draws what it says. No framework, no
// request anywhere but this server.
'use strict';

(function () {
  const $ = (sel, el) => (el || document).querySelector(sel);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };

  const state = {
    token: sessionStorage.getItem('sentinel-token') || '',
    length: 300,         // seconds per chart
    end: 0,              // end (ms, exclusive) of the last second held in `series`
    series: new Map(),   // resource -> {pass, block, success, exception, rt}: arrays of `length`
    cards: new Map(),    // resource -> card elements
    adaptive: null,      // the last `console/adaptive` answer, its series merged with the ones held
    adaptiveSeries: new Map(), // resource NUL partition -> {limit, inflight}: arrays of the history's length
    adaptiveLast: null,  // start (ms) of the last second held (the one in progress when asked)
    adaptiveCards: new Map(), // adaptive resource -> card elements
    gateway: null,       // whether the application is a gateway (null: no gateway commands)
    overview: null,
    tab: 'resources',
    failures: 0,
  };

  // ---------------------------------------------------------------------------------------------------
  // Talking to the server

  async function call(command, params, write) {
    const headers = {};
    if (state.token) headers['Authorization'] = 'Bearer ' + state.token;
    const options = { headers, cache: 'no-store' };
    let url = command;
    if (write) {
      options.method = 'POST';
      options.body = new URLSearchParams(params || {});
    } else if (params) {
      url += '?' + new URLSearchParams(params);
    }
    const r = await fetch(url, options);
    const text = await r.text();
    if (r.status === 401) askForToken();
    return { ok: r.ok, status: r.status, text, writeError: r.headers.get('X-Sentinel-Write-Error') };
  }

  async function json(command, params) {
    const r = await call(command, params, false);
    if (!r.ok) throw new Error(r.status + ': ' + r.text);
    return JSON.parse(r.text);
  }

  function askForToken() {
    const d = $('#token-dialog');
    if (!d.open) {
      $('#token-input').value = '';
      d.showModal();
    }
  }

  function toast(text) {
    const t = $('#toast');
    t.textContent = text;
    t.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { t.hidden = true; }, 4000);
  }

  // ---------------------------------------------------------------------------------------------------
  // Formatting

  const fmt = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
  const num = (v) => fmt.format(v || 0);
  const time = (ms) => {
    const d = new Date(ms);
    const p = (n) => String(n).padStart(2, '0');
    return p(d.getHours()) + ':' + p(d.getMinutes()) + ':' + p(d.getSeconds());
  };
  const stateLabel = { CLOSED: 'closed', OPEN: 'open', HALF_OPEN: 'half-open' };

  // ---------------------------------------------------------------------------------------------------
  // Series

  function zeros() { return new Array(state.length).fill(0); }

  function mergeHistory(h) {
    const newEnd = h.start + h.count * 1000;
    if (state.end === 0 || h.start !== state.end) {
      // First load (or a gap): start over with what the server holds.
      state.series = new Map();
      for (const s of h.series) {
        const entry = {};
        for (const k of ['pass', 'block', 'success', 'exception', 'rt']) {
          const a = zeros();
          const v = s[k];
          for (let i = 0; i < v.length && i < state.length; i++) a[state.length - v.length + i] = v[i];
          entry[k] = a;
        }
        state.series.set(s.name, entry);
      }
      state.end = newEnd;
      return;
    }
    if (h.count === 0) return;
    const seen = new Set();
    for (const s of h.series) {
      seen.add(s.name);
      let entry = state.series.get(s.name);
      if (!entry) {
        entry = { pass: zeros(), block: zeros(), success: zeros(), exception: zeros(), rt: zeros() };
        state.series.set(s.name, entry);
      }
      for (const k of ['pass', 'block', 'success', 'exception', 'rt']) {
        const a = entry[k];
        a.push(...s[k]);
        a.splice(0, a.length - state.length);
      }
    }
    for (const [name, entry] of state.series) {
      if (seen.has(name)) continue;
      for (const k of Object.keys(entry)) {
        const a = entry[k];
        for (let i = 0; i < h.count; i++) a.push(0);
        a.splice(0, a.length - state.length);
      }
    }
    state.end = newEnd;
  }

  // ---------------------------------------------------------------------------------------------------
  // Charts

  function niceMax(v) {
    if (v <= 4) return 4;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  const palette = () => {
    const cs = getComputedStyle(document.documentElement);
    return {
      pass: cs.getPropertyValue('--pass').trim(),
      block: cs.getPropertyValue('--block').trim(),
      exception: cs.getPropertyValue('--exception').trim(),
      grid: cs.getPropertyValue('--faint').trim(),
      muted: cs.getPropertyValue('--muted').trim(),
    };
  };
  let colors = null;

  function drawChart(canvas, s) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth;
    const h = canvas.clientHeight;
    if (w === 0 || h === 0) return;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    colors = colors || palette();
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const n = state.length;
    let top = 0;
    if (s) for (let i = 0; i < n; i++) top = Math.max(top, s.pass[i], s.block[i], s.exception[i]);
    const max = niceMax(top);
    const padTop = 12;
    const y = (v) => h - 1 - (v / max) * (h - padTop - 2);
    const x = (i) => (i / (n - 1)) * w;

    ctx.strokeStyle = colors.grid;
    ctx.lineWidth = 1;
    for (const f of [0.5, 1]) {
      const gy = Math.round(y(max * f)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(0, gy);
      ctx.lineTo(w, gy);
      ctx.stroke();
    }
    ctx.beginPath();
    ctx.moveTo(0, h - 0.5);
    ctx.lineTo(w, h - 0.5);
    ctx.stroke();

    ctx.fillStyle = colors.muted;
    ctx.font = '10px system-ui, sans-serif';
    ctx.textBaseline = 'top';
    ctx.fillText(num(max) + '/s', 2, 0);
    if (!s) return;

    const line = (values, color, fill) => {
      ctx.beginPath();
      ctx.moveTo(x(0), y(values[0]));
      for (let i = 1; i < n; i++) {
        // Block and exception lines are drawn only where they are not zero (no red line along the axis).
        if (!fill && values[i] === 0 && values[i - 1] === 0) ctx.moveTo(x(i), y(0));
        else ctx.lineTo(x(i), y(values[i]));
      }
      if (fill) {
        ctx.lineTo(x(n - 1), h);
        ctx.lineTo(x(0), h);
        ctx.closePath();
        ctx.globalAlpha = 0.12;
        ctx.fillStyle = color;
        ctx.fill();
        ctx.globalAlpha = 1;
        ctx.beginPath();
        ctx.moveTo(x(0), y(values[0]));
        for (let i = 1; i < n; i++) ctx.lineTo(x(i), y(values[i]));
      }
      ctx.strokeStyle = color;
      ctx.lineWidth = 1.5;
      ctx.lineJoin = 'round';
      ctx.stroke();
    };
    line(s.pass, colors.pass, true);
    if (s.exception.some((v) => v > 0)) line(s.exception, colors.exception, false);
    if (s.block.some((v) => v > 0)) line(s.block, colors.block, false);
  }

  // ---------------------------------------------------------------------------------------------------
  // Resources

  const STATS = [
    ['pass', 'Pass', 'pass'],
    ['block', 'Block', 'block'],
    ['success', 'Success', ''],
    ['exception', 'Exception', 'exception'],
    ['rt', 'RT ms', ''],
    ['concurrency', 'Threads', ''],
  ];

  // A card's row of figures: `[key, label, class]` each; the `dd` of each by key.
  function figures(spec) {
    const stats = el('dl', 'stats');
    const values = {};
    for (const [key, label, cls] of spec) {
      const d = el('div');
      const dd = el('dd', cls, '0');
      d.append(el('dt', '', label), dd);
      stats.append(d);
      values[key] = dd;
    }
    return { stats, values };
  }

  function card(name) {
    let c = state.cards.get(name);
    if (c) return c;
    const root = el('article', 'card resource');
    root.dataset.resource = name;
    const head = el('header', 'card-head');
    const title = el('h3', '', name);
    title.title = name;
    const badge = el('span', 'badge none', '');
    badge.hidden = true;
    const spacer = el('span', 'spacer');
    const diagnose = el('button', 'small ghost diagnose', 'Diagnose');
    diagnose.type = 'button';
    diagnose.addEventListener('click', () => showDiagnosis(name));
    head.append(title, badge, spacer, diagnose);
    const { stats, values } = figures(STATS);
    const canvas = el('canvas', 'chart');
    canvas.setAttribute('aria-label', 'pass, block and exception per second over the last 5 minutes for ' + name);
    canvas.setAttribute('role', 'img');
    const axis = el('div', 'axis');
    axis.append(el('span', '', '−5 min'), el('span', '', '−2.5 min'), el('span', '', 'now'));
    root.append(head, stats, canvas, axis);
    c = { root, badge, values, canvas };
    state.cards.set(name, c);
    return c;
  }

  function breakerBadge(badge, breakers) {
    let worst = null;
    for (const b of breakers) {
      if (b.state === 'OPEN') worst = 'OPEN';
      else if (b.state === 'HALF_OPEN' && worst !== 'OPEN') worst = 'HALF_OPEN';
      else if (!worst) worst = 'CLOSED';
    }
    const cls = worst ? worst.toLowerCase() : 'none';
    const text = worst ? 'breaker ' + stateLabel[worst] : '';
    if (badge.className !== 'badge ' + cls) badge.className = 'badge ' + cls;
    if (badge.textContent !== text) badge.textContent = text;
    badge.hidden = !worst;
  }

  function renderResources() {
    const o = state.overview;
    const grid = $('#resources');
    const filter = $('#filter').value.trim().toLowerCase();
    let sums = { pass: 0, block: 0, exception: 0, open: 0 };
    const wanted = [];
    for (const r of o.resources) {
      sums.pass += r.pass;
      sums.block += r.block;
      sums.exception += r.exception;
      sums.open += r.breakers.filter((b) => b.state !== 'CLOSED').length;
      if (filter && !r.name.toLowerCase().includes(filter)) continue;
      const c = card(r.name);
      wanted.push(c.root);
      for (const [key] of STATS) {
        const dd = c.values[key];
        const text = num(r[key]);
        if (dd.textContent !== text) dd.textContent = text;
        dd.classList.toggle('zero', !r[key]);
      }
      breakerBadge(c.badge, r.breakers);
    }
    // Keep the cards in the overview's order, moving only what moved.
    wanted.forEach((node, i) => {
      if (grid.children[i] !== node) grid.insertBefore(node, grid.children[i] || null);
    });
    while (grid.children.length > wanted.length) grid.lastChild.remove();
    for (const node of wanted) {
      const c = state.cards.get(node.dataset.resource);
      drawChart(c.canvas, state.series.get(node.dataset.resource));
      c.canvas.dataset.end = String(state.end);
    }
    $('#no-resources').hidden = o.resources.length > 0;
    $('#sum-resources').textContent = num(o.resources.length);
    $('#sum-pass').textContent = num(sums.pass);
    $('#sum-block').textContent = num(sums.block);
    $('#sum-exception').textContent = num(sums.exception);
    $('#sum-open').textContent = num(sums.open);
  }

  // ---------------------------------------------------------------------------------------------------
  // Adaptive limits: per adaptive resource, its limit against the calls in flight over 5 minutes (SVG)

  const SVG = 'http://www.w3.org/2000/svg';
  const svg = (tag, attrs) => {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    return e;
  };
  const millis = (v) => (v > 0 ? (v < 10 ? v.toFixed(2) : v < 100 ? v.toFixed(1) : num(v)) + ' ms' : '—');
  // A figure with its unit set smaller: `20.0 ms` as `20.0` and a small `ms`.
  function setFigure(dd, text) {
    const [value, unit] = text.split(' ');
    if (!dd.unit) {
      dd.textContent = '';
      dd.value = document.createTextNode('');
      dd.unit = el('span', 'unit', '');
      dd.append(dd.value, dd.unit);
    }
    const shown = unit ? value + ' ' : value;
    if (dd.value.data !== shown) dd.value.data = shown;
    if (dd.unit.textContent !== (unit || '')) dd.unit.textContent = unit || '';
  }

  const ADAPTIVE_STATS = [
    ['limit', 'Limit', 'limit'],
    ['inflight', 'In flight', 'inflight'],
    ['waiting', 'Waiting', ''],
    ['minRtt', 'Min RTT', ''],
    ['sampleRtt', 'Sample RTT', ''],
    ['gradient', 'Gradient', ''],
  ];

  function adaptiveCard(name) {
    let c = state.adaptiveCards.get(name);
    if (c) return c;
    const root = el('article', 'card adaptive');
    root.dataset.adaptive = name;
    const head = el('header', 'card-head');
    const title = el('h3', '', name);
    title.title = name;
    const algorithm = el('span', 'badge algo', '');
    const probing = el('span', 'badge probing', 'probing min RTT');
    probing.title = 'The limit is pinned low for a moment to measure the no-load round-trip time';
    probing.hidden = true;
    head.append(title, algorithm, probing, el('span', 'spacer'));
    const { stats, values } = figures(ADAPTIVE_STATS);
    const chart = svg('svg', { class: 'adaptive-chart', role: 'img' });
    chart.setAttribute('aria-label', 'limit and calls in flight per second over the last 5 minutes for ' + name);
    const grid = svg('g', { class: 'grid-lines' });
    const area = svg('path', { class: 'inflight-area' });
    const inflight = svg('path', { class: 'inflight' });
    const limit = svg('path', { class: 'limit' });
    const label = svg('text', { class: 'scale', x: 2, y: 10 });
    chart.append(grid, area, inflight, limit, label);
    const axis = el('div', 'axis');
    axis.append(el('span', '', '−5 min'), el('span', '', '−2.5 min'), el('span', '', 'now'));
    const bounds = el('p', 'bounds muted', '');
    const parts = el('table', 'table partitions');
    parts.hidden = true;
    const thead = el('thead');
    const htr = el('tr');
    for (const [h, cls] of [['Partition', ''], ['Share', 'r'], ['Guaranteed', 'r'], ['In flight', 'r'], ['Last 5 min', '']]) htr.append(el('th', cls, h));
    thead.append(htr);
    parts.append(thead, el('tbody'));
    const partsWrap = el('div', 'table-wrap');
    partsWrap.append(parts);
    root.append(head, stats, chart, axis, bounds, partsWrap);
    c = { root, title, algorithm, probing, values, chart, grid, area, inflight, limit, label, bounds, parts };
    state.adaptiveCards.set(name, c);
    return c;
  }

  // The path through the non-null points of `values` (a gap starts a new segment), how many points it has,
  // and the area under it down to `base`.
  function polyline(values, x, y, base) {
    let d = '';
    let area = '';
    let points = 0;
    let first = null;
    let last = null;
    const close = () => {
      if (first !== null) area += 'L' + last + ' ' + base + 'L' + first + ' ' + base + 'Z';
      first = null;
    };
    for (let i = 0; i < values.length; i++) {
      const v = values[i];
      if (v == null) { close(); continue; }
      const px = x(i).toFixed(1);
      const p = px + ' ' + y(v).toFixed(1);
      d += (first === null ? 'M' : 'L') + p;
      area += (first === null ? 'M' : 'L') + p;
      if (first === null) first = px;
      last = px;
      points++;
    }
    close();
    return { d, area, points };
  }

  // A partition's 5 minutes in a table cell: its guarantee against its calls in flight, on one scale.
  function sparkline(series, origin) {
    const w = 120;
    const h = 22;
    const n = series.limit.length;
    let top = 1;
    for (let i = 0; i < n; i++) top = Math.max(top, series.limit[i] || 0, series.inflight[i] || 0);
    const y = (v) => h - 1 - (v / top) * (h - 3);
    const x = (i) => (n > 1 ? (i / (n - 1)) * w : w);
    const s = svg('svg', { class: 'sparkline', viewBox: '0 0 ' + w + ' ' + h, preserveAspectRatio: 'none', role: 'img' });
    s.setAttribute('aria-label', 'guaranteed and in flight over the last 5 minutes for partition ' + origin);
    const inf = polyline(series.inflight, x, y, h - 1);
    s.append(svg('path', { class: 'inflight-area', d: inf.area }), svg('path', { class: 'inflight', d: inf.d }),
      svg('path', { class: 'limit', d: polyline(series.limit, x, y, h - 1).d }));
    return s;
  }

  function drawAdaptive(c, r, count) {
    const w = c.chart.clientWidth;
    const h = c.chart.clientHeight;
    if (w === 0 || h === 0) return;
    c.chart.setAttribute('viewBox', '0 0 ' + w + ' ' + h);
    const limits = r.series.limit;
    const inflights = r.series.inflight;
    let top = r.limit;
    for (let i = 0; i < limits.length; i++) top = Math.max(top, limits[i] || 0, inflights[i] || 0);
    const max = niceMax(top);
    const padTop = 14;
    const y = (v) => h - 1 - (v / max) * (h - padTop - 2);
    const x = (i) => (count > 1 ? (i / (count - 1)) * w : w);
    const lines = [];
    for (const f of [0.5, 1]) {
      const gy = Math.round(y(max * f)) + 0.5;
      lines.push(svg('line', { x1: 0, x2: w, y1: gy, y2: gy }));
    }
    lines.push(svg('line', { x1: 0, x2: w, y1: h - 0.5, y2: h - 0.5 }));
    c.grid.replaceChildren(...lines);
    c.label.textContent = num(max) + ' calls';
    const lim = polyline(limits, x, y, h - 1);
    const inf = polyline(inflights, x, y, h - 1);
    c.limit.setAttribute('d', lim.d);
    c.limit.dataset.points = String(lim.points);
    c.limit.dataset.values = limits.filter((v) => v != null).join(',');
    c.inflight.setAttribute('d', inf.d);
    c.inflight.dataset.points = String(inf.points);
    c.inflight.dataset.values = inflights.filter((v) => v != null).join(',');
    c.area.setAttribute('d', inf.area);
    c.chart.dataset.end = String(state.adaptiveLast || 0);
  }

  // Merges a `console/adaptive` answer into the series held, one per resource and partition: after the first
  // answer only the seconds from the last one held are asked for (it was in progress, so it comes again).
  function mergeAdaptive(a) {
    const incremental = state.adaptiveLast !== null && a.start === state.adaptiveLast;
    const held = state.adaptiveSeries;
    const next = new Map();
    const fit = (prefix, values) => {
      const out = prefix.concat(values);
      return out.slice(Math.max(0, out.length - a.seconds));
    };
    const merge = (key, s) => {
      const old = incremental ? held.get(key) : null;
      const pad = new Array(Math.max(0, a.seconds - s.limit.length)).fill(null);
      const merged = {
        limit: fit(old ? old.limit.slice(0, -1) : pad, s.limit),
        inflight: fit(old ? old.inflight.slice(0, -1) : pad, s.inflight),
      };
      next.set(key, merged);
      return merged;
    };
    for (const r of a.resources) {
      r.series = merge(r.resource + '\u0000', r.series);
      for (const p of r.partitions) p.series = merge(r.resource + '\u0000' + p.origin, p.series);
    }
    state.adaptiveSeries = next;
    // A full answer is asked for again when this one did not continue the series held (the clock moved back).
    const asked = state.adaptiveLast !== null;
    state.adaptiveLast = asked && !incremental ? null : a.count > 0 ? a.start + (a.count - 1) * 1000 : state.adaptiveLast;
    state.adaptive = a;
  }

  function setText(node, text) {
    if (node.textContent !== text) node.textContent = text;
  }

  function renderAdaptive() {
    const a = state.adaptive;
    const band = $('#adaptive');
    if (!a) return;
    const filter = $('#filter').value.trim().toLowerCase();
    const list = a.resources.filter((r) => !filter || r.resource.toLowerCase().includes(filter));
    const waitingAll = a.waiting || [];
    band.hidden = a.resources.length === 0 && waitingAll.length === 0;
    // Rules in force whose limiter starts at the first call of a resource they govern: no card until then.
    const waiting = waitingAll.filter((w) => !filter || w.resource.toLowerCase().includes(filter));
    const note = $('#adaptive-waiting');
    note.hidden = waiting.length === 0;
    setText(note, waiting.length === 0 ? '' : 'Starting at the first call: ' + waiting.map((w) =>
      (w.regex ? 'pattern ' : '') + w.resource + ' (' + (w.algorithm || 'algorithm by the call\'s direction') +
      ', limit ' + num(w.initialLimit) + ' between ' + num(w.minLimit) + ' and ' + num(w.maxLimit) + ')').join(' · '));
    const cards = $('#adaptive-cards');
    const wanted = list.map((r) => {
      const c = adaptiveCard(r.resource);
      setText(c.algorithm, r.algorithm);
      c.probing.hidden = !r.probing;
      setText(c.values.limit, num(r.limit));
      setText(c.values.inflight, num(r.inflight));
      setText(c.values.waiting, num(r.waiting));
      setFigure(c.values.minRtt, millis(r.minRttMs));
      setFigure(c.values.sampleRtt, millis(r.sampleRttMs));
      setText(c.values.gradient, r.algorithm === 'gradient2' ? r.gradient.toFixed(2) : '—');
      c.values.waiting.classList.toggle('zero', !r.waiting);
      c.values.inflight.classList.toggle('full', r.inflight >= r.limit);
      setText(c.bounds, 'Limit between ' + num(r.minLimit) + ' and ' + num(r.maxLimit) +
        (r.baselineRttMs > 0 ? ' · baseline RTT ' + millis(r.baselineRttMs) : ''));
      const rows = r.partitions.map((p) => {
        const tr = el('tr');
        const spark = el('td', 'spark');
        spark.append(sparkline(p.series, p.origin));
        tr.append(el('td', 'mono', p.origin), el('td', 'r', Math.round(p.share * 100) + ' %'),
          el('td', 'r', num(p.guarantee)), el('td', 'r', num(p.inflight)), spark);
        return tr;
      });
      c.parts.tBodies[0].replaceChildren(...rows);
      c.parts.hidden = rows.length === 0;
      return { c, r };
    });
    wanted.forEach(({ c }, i) => {
      if (cards.children[i] !== c.root) cards.insertBefore(c.root, cards.children[i] || null);
    });
    while (cards.children.length > wanted.length) cards.lastChild.remove();
    for (const { c, r } of wanted) drawAdaptive(c, r, a.seconds);
  }

  async function showDiagnosis(name) {
    const r = await call('diagnose', { resource: name }, false);
    $('#diagnosis-title').textContent = 'Diagnosis of ' + name;
    $('#diagnosis-text').textContent = r.text;
    const d = $('#diagnosis');
    if (!d.open) d.showModal();
  }

  // ---------------------------------------------------------------------------------------------------
  // Breakers

  function renderBreakers() {
    const o = state.overview;
    const body = $('#breakers-table tbody');
    const rows = [];
    for (const r of o.resources) {
      for (const b of r.breakers) {
        const tr = el('tr');
        tr.append(
          el('td', 'mono', r.name),
          el('td', '', b.grade + ' > ' + b.count + (b.isDefault ? ' (default rule)' : '')),
        );
        const st = el('td');
        st.append(el('span', 'badge ' + b.state.toLowerCase(), stateLabel[b.state]));
        tr.append(st, el('td', 'r', num(b.intervalTotal)), el('td', 'r', num(b.intervalBad)),
          el('td', 'num', b.retryAt ? time(b.retryAt) : '—'),
          el('td', '', b.last ? time(b.last.at) + '  ' + stateLabel[b.last.from] + ' → ' + stateLabel[b.last.to] : '—'));
        rows.push(tr);
      }
    }
    body.replaceChildren(...rows);
    $('#no-breakers').hidden = rows.length > 0;
    const list = $('#transitions');
    const items = o.transitions.map((t) => {
      const li = el('li');
      li.append(el('time', 'num', time(t.at)), el('span', 'mono', t.resource),
        el('span', 'badge ' + t.to.toLowerCase(), stateLabel[t.from] + ' → ' + stateLabel[t.to]),
        el('span', 'muted', t.grade + (t.snapshot != null ? ' · tripped at ' + Math.round(t.snapshot * 1000) / 1000 : '')));
      return li;
    });
    list.replaceChildren(...items);
    $('#no-transitions').hidden = items.length > 0;
  }

  // ---------------------------------------------------------------------------------------------------
  // Rules

  const flowGrade = { 0: 'threads', 1: 'QPS' };
  const flowStrategy = { 0: 'direct', 1: 'relate', 2: 'chain' };
  const behavior = { 0: 'reject', 1: 'warm up', 2: 'rate limiter', 3: 'warm up + rate limiter' };
  const degradeGrade = { 0: 'slow ratio', 1: 'error ratio', 2: 'error count' };
  const unset = (v) => (v == null || v < 0 ? '—' : num(v));

  const KINDS = [
    {
      kind: 'flow', title: 'Flow rules', get: ['getRules', { type: 'flow' }], set: ['setRules', { type: 'flow' }],
      columns: ['Resource', 'Limit app', 'Grade', 'Count', 'Strategy', 'Behavior'],
      row: (r) => [r.resource, r.limitApp || 'default', flowGrade[r.grade] || r.grade, r.count,
        flowStrategy[r.strategy] + (r.refResource ? ' ' + r.refResource : ''), behavior[r.controlBehavior]],
      example: [{ resource: 'resourceName', limitApp: 'default', grade: 1, count: 10, strategy: 0, controlBehavior: 0 }],
    },
    {
      kind: 'degrade', title: 'Circuit breaker rules', get: ['getRules', { type: 'degrade' }], set: ['setRules', { type: 'degrade' }],
      columns: ['Resource', 'Grade', 'Count', 'Open for', 'Min calls', 'Interval'],
      row: (r) => [r.resource, degradeGrade[r.grade], r.grade === 0 ? r.count + ' ms, ratio ' + r.slowRatioThreshold : r.count,
        r.timeWindow + ' s', r.minRequestAmount, r.statIntervalMs + ' ms'],
      example: [{ resource: 'resourceName', grade: 1, count: 0.5, timeWindow: 10, minRequestAmount: 5, statIntervalMs: 1000 }],
    },
    {
      kind: 'system', title: 'System rules', get: ['getRules', { type: 'system' }], set: ['setRules', { type: 'system' }],
      columns: ['Load', 'CPU', 'Inbound QPS', 'Avg RT', 'Threads'],
      row: (r) => [unset(r.highestSystemLoad), r.highestCpuUsage >= 0 ? r.highestCpuUsage : '—', unset(r.qps), unset(r.avgRt), unset(r.maxThread)],
      example: [{ highestSystemLoad: -1, highestCpuUsage: -1, qps: 1000, avgRt: -1, maxThread: -1 }],
    },
    {
      kind: 'authority', title: 'Authority rules', get: ['getRules', { type: 'authority' }], set: ['setRules', { type: 'authority' }],
      columns: ['Resource', 'List', 'Origins'],
      row: (r) => [r.resource, r.strategy === 1 ? 'black list' : 'white list', r.limitApp],
      example: [{ resource: 'resourceName', limitApp: 'appA,appB', strategy: 0 }],
    },
    {
      kind: 'param', title: 'Hot-parameter rules', get: ['getParamFlowRules', null], set: ['setParamFlowRules', {}],
      columns: ['Resource', 'Argument', 'Grade', 'Count', 'Per', 'Items'],
      row: (r) => [r.resource, '#' + r.paramIdx, flowGrade[r.grade], r.count, r.durationInSec + ' s', (r.paramFlowItemList || []).length],
      example: [{ resource: 'resourceName', paramIdx: 0, grade: 1, count: 5, durationInSec: 1, paramFlowItemList: [] }],
    },
  ];

  function ruleCard(k) {
    let root = document.getElementById('rules-' + k.kind);
    if (root) return root;
    root = el('article', 'card rulekind');
    root.id = 'rules-' + k.kind;
    root.dataset.kind = k.kind;
    const head = el('header', 'card-head');
    const edit = el('button', 'small edit', 'Edit');
    edit.type = 'button';
    head.append(el('h3', '', k.title), el('span', 'count', ''), el('span', 'spacer'), edit);
    const table = el('table', 'table');
    const tr = el('tr');
    for (const c of k.columns) tr.append(el('th', '', c));
    const thead = el('thead');
    thead.append(tr);
    table.append(thead, el('tbody'));
    const none = el('p', 'empty', 'No rule.');
    const editor = el('div', 'editor');
    editor.hidden = true;
    const area = el('textarea');
    area.spellcheck = false;
    area.setAttribute('aria-label', k.title + ' as JSON');
    const actions = el('div', 'actions');
    const apply = el('button', 'primary apply', 'Apply');
    apply.type = 'button';
    const cancel = el('button', 'ghost cancel', 'Cancel');
    cancel.type = 'button';
    const result = el('span', 'result');
    actions.append(apply, cancel, result);
    const error = el('p', 'error');
    error.setAttribute('role', 'alert');
    error.hidden = true;
    editor.append(area, actions, error);
    root.append(head, table, none, editor);
    edit.addEventListener('click', () => {
      const rules = root.rules && root.rules.length ? root.rules : k.example;
      area.value = JSON.stringify(rules, null, 2);
      error.hidden = true;
      result.textContent = '';
      editor.hidden = false;
      area.focus();
    });
    cancel.addEventListener('click', () => { editor.hidden = true; error.hidden = true; });
    apply.addEventListener('click', async () => {
      result.textContent = '';
      error.hidden = true;
      const params = Object.assign({}, k.set[1], { data: area.value });
      const r = await call(k.set[0], params, true);
      if (r.ok && r.text.trim() === 'success') {
        result.className = 'result ok';
        result.textContent = 'Applied';
        editor.hidden = true;
      } else if (r.ok) {
        result.className = 'result warn';
        result.textContent = 'In force, but not saved: ' + (r.writeError || r.text);
      } else {
        error.textContent = r.text;
        error.hidden = false;
      }
      await loadRules(k);
      root.querySelector('.count').dataset.flash = '1';
    });
    $('#rules').append(root);
    return root;
  }

  async function loadRules(k) {
    const root = ruleCard(k);
    let rules;
    try {
      rules = await json(k.get[0], k.get[1]);
    } catch (e) {
      root.querySelector('.count').textContent = 'could not read';
      return;
    }
    root.rules = rules;
    root.querySelector('.count').textContent = rules.length === 1 ? '1 rule' : rules.length + ' rules';
    const rows = rules.map((r) => {
      const tr = el('tr');
      k.row(r).forEach((v, i) => tr.append(el('td', i === 0 && k.kind !== 'system' ? 'mono' : '', String(v))));
      return tr;
    });
    root.querySelector('tbody').replaceChildren(...rows);
    root.querySelector('.empty').hidden = rows.length > 0;
    root.querySelector('table').hidden = rows.length === 0;
  }

  function loadAllRules() {
    return Promise.all(KINDS.map(loadRules));
  }

  // ---------------------------------------------------------------------------------------------------
  // Gateway: API groups and gateway flow rules, edited in forms and saved through `gateway/update*`

  const URL_MATCH = [['0', 'exact'], ['1', 'prefix (Ant)'], ['2', 'regex']];
  const PARSE = [['', 'whole resource'], ['0', 'client IP'], ['1', 'host'], ['2', 'header'], ['3', 'URL parameter'], ['4', 'cookie']];
  const PARAM_MATCH = [['0', 'exact'], ['1', 'prefix'], ['2', 'regex'], ['3', 'contains']];
  const label = (options, v) => (options.find(([k]) => k === String(v)) || [null, String(v)])[1];

  // A number typed in a field, as JSON: a number when it is one, else the text as typed (the server says
  // what is wrong with it, at that field); left out when blank (the server's default).
  function numberField(v) {
    const t = v.trim();
    if (t === '') return undefined;
    const n = Number(t);
    return Number.isFinite(n) ? n : t;
  }

  function select(name, options, value) {
    const s = el('select');
    s.name = name;
    for (const [v, text] of options) {
      const o = el('option', '', text);
      o.value = v;
      s.append(o);
    }
    s.value = value == null ? options[0][0] : String(value);
    return s;
  }

  // A labelled field whose server errors are shown under it (`data-field` is the JSON path of the value).
  function field(labelText, input, path, hint) {
    const f = el('label', 'field');
    f.dataset.field = path;
    f.append(el('span', 'label', labelText), input);
    if (hint) f.append(el('span', 'hint', hint));
    return f;
  }

  function textInput(name, value, placeholder) {
    const i = el('input');
    i.type = 'text';
    i.name = name;
    i.value = value == null ? '' : String(value);
    if (placeholder) i.placeholder = placeholder;
    i.autocomplete = 'off';
    i.spellcheck = false;
    return i;
  }

  // Where the server's error points: the entry (its index in the pushed list), the field (as the JSON names
  // it) and, in a list of items, which one. JSON errors name a path (`[0].paramItem.parseStrategy`), rule
  // errors the field in Rust's words (`#0 (...): `param_item.field_name``).
  function errorPlace(text) {
    let m = /at `\[(\d+)\]((?:\.\w+|\[\d+\])*)`/.exec(text);
    if (m) {
      const item = /\[(\d+)\]/.exec(m[2]);
      return { index: Number(m[1]), field: m[2].replace(/\[\d+\]/g, '').replace(/^\./, ''), item: item ? Number(item[1]) : null };
    }
    m = /#(\d+) \(.*?\): `([a-z_.]+)`/.exec(text);
    if (m) return { index: Number(m[1]), field: m[2].replace(/_([a-z])/g, (_, c) => c.toUpperCase()), item: null };
    return null;
  }

  function clearErrors(form) {
    for (const e of form.querySelectorAll('.field-error')) e.remove();
    for (const e of form.querySelectorAll('[aria-invalid]')) e.removeAttribute('aria-invalid');
    const fe = form.querySelector('.form-error');
    fe.hidden = true;
    fe.textContent = '';
  }

  // Shows the server's answer next to the field it names, or under the form when it names none of it.
  function showError(form, text, index) {
    const place = errorPlace(text);
    let target = null;
    if (place && place.index === index && place.field) {
      const candidates = [...form.querySelectorAll('[data-field="' + place.field + '"]')];
      if (place.item != null) target = candidates.find((c) => c.closest('[data-item="' + place.item + '"]'));
      // A rule error names no item: the one whose value the message quotes, else a blank one, else the first.
      const input = (c) => c.querySelector('input');
      if (!target) target = candidates.find((c) => input(c) && input(c).value && text.includes('`' + input(c).value + '`'));
      if (!target && /blank/.test(text)) target = candidates.find((c) => input(c) && !input(c).value.trim());
      if (!target) target = candidates[0] || null;
      if (!target && place.field.includes('.')) target = form.querySelector('[data-field="' + place.field.split('.')[0] + '"]');
    }
    if (!target) {
      const fe = form.querySelector('.form-error');
      fe.textContent = text;
      fe.hidden = false;
      return;
    }
    const msg = el('p', 'field-error', text);
    msg.setAttribute('role', 'alert');
    target.append(msg);
    const input = target.querySelector('input, select') || target;
    input.setAttribute('aria-invalid', 'true');
    if (input.focus) input.focus();
  }

  function predicateRow(item, k) {
    const row = el('div', 'predicate');
    row.dataset.item = String(k);
    const remove = el('button', 'ghost small remove', 'Remove');
    remove.type = 'button';
    remove.title = 'Remove this path';
    remove.addEventListener('click', () => {
      const list = row.parentElement;
      row.remove();
      [...list.children].forEach((r, i) => { r.dataset.item = String(i); });
    });
    row.append(
      field('Path pattern', textInput('pattern', item.pattern, '/product/**'), 'predicateItems.pattern'),
      field('Match', select('matchStrategy', URL_MATCH, item.matchStrategy), 'predicateItems.matchStrategy'),
      remove);
    return row;
  }

  const GATEWAY = {
    apis: {
      get: 'gateway/getApiDefinitions',
      set: 'gateway/updateApiDefinitions',
      noun: ['API group', 'API groups'],
      blank: { apiName: '', predicateItems: [{ pattern: '', matchStrategy: 1 }] },
      form(entry) {
        const body = el('div', 'form-grid');
        body.append(field('Name', textInput('apiName', entry.apiName, 'products'), 'apiName',
          'The resource requests that match enter'));
        const paths = el('div', 'predicates');
        paths.dataset.field = 'predicateItems';
        (entry.predicateItems || []).forEach((p, k) => paths.append(predicateRow(p, k)));
        const add = el('button', 'ghost small add-path', '+ Path');
        add.type = 'button';
        add.addEventListener('click', () => {
          paths.append(predicateRow({ pattern: '', matchStrategy: 1 }, paths.children.length));
          paths.lastChild.querySelector('input').focus();
        });
        const group = el('div', 'paths');
        group.append(el('span', 'label', 'Paths'), paths, add);
        return [body, group];
      },
      read(form) {
        return {
          apiName: form.querySelector('[name=apiName]').value.trim(),
          predicateItems: [...form.querySelectorAll('.predicate')].map((row) => ({
            pattern: row.querySelector('[name=pattern]').value.trim(),
            matchStrategy: Number(row.querySelector('[name=matchStrategy]').value),
          })),
        };
      },
      row(a) {
        const paths = el('td', 'chips');
        for (const p of a.predicateItems) {
          const chip = el('span', 'chip');
          chip.append(el('span', 'mono', p.pattern), el('span', 'kind', label(URL_MATCH, p.matchStrategy)));
          paths.append(chip);
        }
        return [el('td', 'mono', a.apiName), paths];
      },
      key: (a) => a.apiName,
    },
    rules: {
      get: 'gateway/getRules',
      set: 'gateway/updateRules',
      noun: ['gateway rule', 'gateway rules'],
      blank: { resource: '', resourceMode: 0, grade: 1, count: 10, intervalSec: 1, controlBehavior: 0, burst: 0, maxQueueingTimeoutMs: 500 },
      form(entry) {
        const p = entry.paramItem || {};
        const main = el('div', 'form-grid');
        const resource = textInput('resource', entry.resource, 'route id or API group');
        resource.setAttribute('list', 'gw-api-names');
        main.append(
          field('Resource', resource, 'resource'),
          field('Resource is', select('resourceMode', [['0', 'a route id'], ['1', 'an API group']], entry.resourceMode), 'resourceMode'),
          field('Grade', select('grade', [['1', 'QPS'], ['0', 'threads']], entry.grade), 'grade'),
          field('Count', textInput('count', entry.count), 'count'),
          field('Interval (s)', textInput('intervalSec', entry.intervalSec), 'intervalSec'),
          field('Behavior', select('controlBehavior', [['0', 'reject'], ['2', 'rate limiter (queue)']], entry.controlBehavior), 'controlBehavior'),
          field('Burst', textInput('burst', entry.burst), 'burst'),
          field('Max queueing (ms)', textInput('maxQueueingTimeoutMs', entry.maxQueueingTimeoutMs), 'maxQueueingTimeoutMs'));
        const param = el('div', 'form-grid param');
        param.dataset.field = 'paramItem';
        const strategy = select('parseStrategy', PARSE, p.parseStrategy);
        param.append(
          field('Per parameter', strategy, 'paramItem.parseStrategy'),
          field('Name', textInput('fieldName', p.fieldName, 'X-Tenant'), 'paramItem.fieldName', 'header, URL parameter or cookie'),
          field('Value pattern', textInput('pattern', p.pattern, 'any value'), 'paramItem.pattern'),
          field('Match', select('matchStrategy', PARAM_MATCH, p.matchStrategy), 'paramItem.matchStrategy'));
        const sync = () => {
          const none = strategy.value === '';
          const named = ['2', '3', '4'].includes(strategy.value);
          for (const n of ['pattern', 'matchStrategy']) param.querySelector('[name=' + n + ']').disabled = none;
          param.querySelector('[name=fieldName]').disabled = !named;
        };
        strategy.addEventListener('change', sync);
        sync();
        return [main, param];
      },
      read(form) {
        const v = (n) => form.querySelector('[name=' + n + ']').value;
        const rule = {
          resource: v('resource').trim(),
          resourceMode: Number(v('resourceMode')),
          grade: Number(v('grade')),
          count: numberField(v('count')),
          intervalSec: numberField(v('intervalSec')),
          controlBehavior: Number(v('controlBehavior')),
          burst: numberField(v('burst')),
          maxQueueingTimeoutMs: numberField(v('maxQueueingTimeoutMs')),
        };
        if (v('parseStrategy') !== '') {
          const item = { parseStrategy: Number(v('parseStrategy')), matchStrategy: Number(v('matchStrategy')) };
          if (['2', '3', '4'].includes(v('parseStrategy')) && v('fieldName').trim()) item.fieldName = v('fieldName').trim();
          if (v('pattern').trim()) item.pattern = v('pattern').trim();
          rule.paramItem = item;
        }
        return rule;
      },
      row(r) {
        let param = '—';
        const p = r.paramItem;
        if (p) {
          param = label(PARSE, p.parseStrategy) + (p.fieldName ? ' ' + p.fieldName : '') +
            (p.pattern ? ', ' + label(PARAM_MATCH, p.matchStrategy) + ' ' + p.pattern : '');
        }
        const queued = r.controlBehavior === 2;
        const td = (cls, text, col) => { const t = el('td', cls, text); t.dataset.col = col; return t; };
        return [
          td('mono', r.resource, 'resource'),
          td('', r.resourceMode === 1 ? 'API group' : 'route id', 'resourceMode'),
          td('', r.grade === 0 ? 'threads' : 'QPS', 'grade'),
          td('r num', String(r.count), 'count'),
          td('r num', r.intervalSec + ' s', 'intervalSec'),
          td('', queued ? 'rate limiter' : 'reject', 'controlBehavior'),
          td('r num', num(r.burst), 'burst'),
          td('r num' + (queued ? '' : ' muted'), num(r.maxQueueingTimeoutMs) + ' ms', 'maxQueueingTimeoutMs'),
          td(p ? 'mono' : 'muted', param, 'paramItem'),
        ];
      },
      key: (r) => r.resource,
    },
  };

  function gatewayCard(kind) {
    return document.getElementById('gw-' + kind);
  }

  // Pushes `list` (the entries in force with one added, changed or removed): the server's answer.
  async function pushGateway(kind, list) {
    try {
      return await call(GATEWAY[kind].set, { data: JSON.stringify(list) }, true);
    } catch (e) {
      return { ok: false, status: 0, text: 'Could not reach the command center: ' + e.message };
    }
  }

  function openGatewayForm(kind, index) {
    const k = GATEWAY[kind];
    const card = gatewayCard(kind);
    const entries = card.entries || [];
    const entry = index >= 0 ? entries[index] : k.blank;
    const form = el('form', 'gw-form');
    form.noValidate = true;
    form.dataset.index = String(index);
    form.append(el('h4', '', index >= 0 ? 'Edit ' + k.noun[0] + ' ' + k.key(entry) : 'New ' + k.noun[0]));
    form.append(...k.form(entry));
    const actions = el('div', 'actions');
    const save = el('button', 'primary save', index >= 0 ? 'Save' : 'Add');
    save.type = 'submit';
    const cancel = el('button', 'ghost cancel', 'Cancel');
    cancel.type = 'button';
    const close = () => {
      form.remove();
      for (const tr of card.querySelectorAll('tbody tr.editing')) tr.classList.remove('editing');
    };
    cancel.addEventListener('click', close);
    actions.append(save, cancel);
    const formError = el('p', 'error form-error');
    formError.setAttribute('role', 'alert');
    formError.hidden = true;
    form.append(actions, formError);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      clearErrors(form);
      const list = entries.slice();
      const at = index >= 0 ? index : list.length;
      list[at] = k.read(form);
      save.disabled = true;
      const r = await pushGateway(kind, list);
      save.disabled = false;
      if (!r.ok) {
        showError(form, r.text, at);
        return;
      }
      form.remove();
      await loadGateway(kind);
      noteSaved(kind, r);
    });
    form.addEventListener('keydown', (e) => { if (e.key === 'Escape') close(); });
    const slot = card.querySelector('.gw-form-slot');
    slot.replaceChildren(form);
    for (const tr of card.querySelectorAll('tbody tr')) tr.classList.toggle('editing', tr.rowIndex - 1 === index);
    form.scrollIntoView({ block: 'nearest' });
    const first = form.querySelector('input');
    if (first) first.focus();
  }

  function noteSaved(kind, r) {
    const card = gatewayCard(kind);
    const err = card.querySelector('.list-error');
    if (r.text.trim() === 'success') {
      err.hidden = true;
      toast('Saved: in force now');
    } else {
      err.textContent = 'In force, but not saved to the data source: ' + (r.writeError || r.text);
      err.hidden = false;
    }
  }

  async function deleteGateway(kind, index, button) {
    if (button.dataset.confirm !== '1') {
      button.dataset.confirm = '1';
      button.textContent = 'Confirm';
      button.classList.add('danger');
      setTimeout(() => { button.dataset.confirm = ''; button.textContent = 'Delete'; button.classList.remove('danger'); }, 4000);
      return;
    }
    const card = gatewayCard(kind);
    const list = (card.entries || []).filter((_, i) => i !== index);
    const r = await pushGateway(kind, list);
    const err = card.querySelector('.list-error');
    if (!r.ok) {
      err.textContent = r.text;
      err.hidden = false;
      return;
    }
    await loadGateway(kind);
    noteSaved(kind, r);
  }

  async function loadGateway(kind) {
    const k = GATEWAY[kind];
    const card = gatewayCard(kind);
    // Busy while a read is under way (assistive technology, and whoever waits for the rows to settle).
    card.loads = (card.loads || 0) + 1;
    card.setAttribute('aria-busy', 'true');
    let entries;
    try {
      entries = await json(k.get);
    } catch (e) {
      card.querySelector('.count').textContent = 'could not read';
      return;
    } finally {
      card.loads -= 1;
      if (card.loads === 0) card.removeAttribute('aria-busy');
    }
    card.entries = entries;
    card.querySelector('.count').textContent = entries.length + ' ' + k.noun[entries.length === 1 ? 0 : 1];
    const rows = entries.map((entry, i) => {
      const tr = el('tr');
      tr.dataset.key = k.key(entry);
      tr.append(...k.row(entry));
      const actions = el('td', 'actions-col');
      const edit = el('button', 'small ghost edit', 'Edit');
      edit.type = 'button';
      edit.addEventListener('click', () => openGatewayForm(kind, i));
      const del = el('button', 'small ghost delete', 'Delete');
      del.type = 'button';
      del.addEventListener('click', () => deleteGateway(kind, i, del));
      actions.append(edit, del);
      tr.append(actions);
      return tr;
    });
    card.querySelector('tbody').replaceChildren(...rows);
    card.querySelector('.empty').hidden = rows.length > 0;
    card.querySelector('.table-wrap').hidden = rows.length === 0;
    if (kind === 'apis') {
      $('#gw-api-names').replaceChildren(...entries.map((a) => { const o = el('option'); o.value = a.apiName; return o; }));
    }
  }

  function loadAllGateway() {
    return Promise.all(Object.keys(GATEWAY).map(loadGateway));
  }

  // ---------------------------------------------------------------------------------------------------
  // The loop

  function renderHeader() {
    const o = state.overview;
    $('#app').textContent = o.app;
    $('#app').title = 'application ' + o.app + ' · ' + o.version;
    $('#clock').textContent = time(o.second - 1000);
    const sw = $('#switch');
    if (document.activeElement !== sw) sw.checked = o.enabled;
    $('#switch-text').textContent = o.enabled ? 'Protection on' : 'Protection off';
    document.title = o.app + ' · Sentinel console';
    // The gateway tab exists when the server has the gateway commands; its empty state says when the
    // application is not a gateway yet.
    $('.tabs [data-tab=gateway]').hidden = o.gateway == null;
    $('#gateway-empty').hidden = o.gateway !== false;
    const caps = o.caps;
    $('#caps').textContent = caps ? 'Resource cap: ' + caps.resources + ' of ' + caps.maxResources +
      ' names taken (annotated functions and names rules name are not counted)' +
      (caps.resourcesOverflowed ? ' · cap reached: ' + caps.resourcesOverflowed + ' new names share ' +
        caps.overflowResource + ' (still checked; names rules name keep their own)' : '') +
      (caps.matchedResources ? ' · names only regex rules match: ' + caps.matchedResources + ' of ' +
        caps.maxResources + (caps.sharedByPatterns ? ', then ' + caps.sharedByPatterns + ' of ' + caps.maxResources +
          ' resources shared by names matching the same patterns, then ' + caps.patternsOverflowResource +
          ' (every regex rule checks it)' : '') : '') : '';
    const ds = o.dataSource;
    if (ds) $('#rules-note').textContent =
      'Rules take effect as soon as they are applied and are written back to ' + ds.kind + ' ' + ds.target +
      (ds.connected ? '' : ' (not connected)') +
      (ds.lastLoad ? ', last loaded ' + time(ds.lastLoad) : '') +
      (ds.lastError ? '. Last error: ' + ds.lastError : '') +
      '. Invalid rules are refused with the reason, and the rules in force stay.';
  }

  function setLive(on, text) {
    const live = $('#live');
    live.className = 'live ' + (on ? 'on' : 'off');
    $('#live-text').textContent = text;
  }

  async function tick() {
    try {
      const history = await json('console/history', state.end ? { after: state.end - 1000 } : null);
      mergeHistory(history);
      state.overview = await json('console/overview');
      if (state.tab === 'resources') {
        mergeAdaptive(await json('console/adaptive', state.adaptiveLast !== null ? { after: state.adaptiveLast - 1 } : null));
      }
      renderHeader();
      renderResources();
      if (state.tab === 'resources') renderAdaptive();
      if (state.tab === 'breakers') renderBreakers();
      state.failures = 0;
      setLive(true, 'live');
    } catch (e) {
      state.failures++;
      setLive(false, state.failures > 2 ? 'disconnected' : 'retrying');
    }
    setTimeout(tick, 1000);
  }

  function showTab(tab) {
    state.tab = tab;
    for (const b of document.querySelectorAll('.tabs button')) {
      const on = b.dataset.tab === tab;
      b.classList.toggle('active', on);
      if (on) b.setAttribute('aria-current', 'page'); else b.removeAttribute('aria-current');
    }
    for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== 'tab-' + tab;
    if (tab === 'rules') loadAllRules();
    if (tab === 'gateway') loadAllGateway();
    if (tab === 'breakers' && state.overview) renderBreakers();
    if (tab === 'resources' && state.overview) renderResources();
    if (tab === 'resources') renderAdaptive();
    if (location.hash !== '#' + tab) history.replaceState(null, '', '#' + tab);
  }

  function init() {
    for (const b of document.querySelectorAll('.tabs button')) b.addEventListener('click', () => showTab(b.dataset.tab));
    for (const b of document.querySelectorAll('[data-close]')) b.addEventListener('click', () => b.closest('dialog').close());
    $('#filter').addEventListener('input', () => {
      if (state.overview) renderResources();
      renderAdaptive();
    });
    $('#switch').addEventListener('change', async (e) => {
      const on = e.target.checked;
      const r = await call('setSwitch', { value: String(on) }, true);
      if (!r.ok) {
        e.target.checked = !on;
        toast(r.text);
      }
      e.target.blur();
    });
    $('#token-form').addEventListener('submit', () => {
      state.token = $('#token-input').value.trim();
      sessionStorage.setItem('sentinel-token', state.token);
    });
    window.addEventListener('resize', () => {
      if (state.overview) renderResources();
      renderAdaptive();
    });
    const start = (location.hash || '#resources').slice(1);
    KINDS.forEach(ruleCard);
    for (const kind of Object.keys(GATEWAY)) gatewayCard(kind).querySelector('.add').addEventListener('click', () => openGatewayForm(kind, -1));
    showTab(['resources', 'rules', 'breakers', 'gateway'].includes(start) ? start : 'resources');
    tick();
  }

  init();
})();
