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
    const stats = el('dl', 'stats');
    const values = {};
    for (const [key, label, cls] of STATS) {
      const d = el('div');
      const dd = el('dd', cls, '0');
      d.append(el('dt', '', label), dd);
      stats.append(d);
      values[key] = dd;
    }
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
    const caps = o.caps;
    $('#caps').textContent = caps ? 'Resource cap: ' + caps.resources + ' of ' + caps.maxResources +
      ' names taken (annotated functions and names rules name are not counted)' +
      (caps.resourcesOverflowed ? ' · cap reached: ' + caps.resourcesOverflowed + ' new names share ' +
        caps.overflowResource + ' (still checked; names rules name keep their own)' : '') : '';
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
      renderHeader();
      renderResources();
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
    if (tab === 'breakers' && state.overview) renderBreakers();
    if (tab === 'resources' && state.overview) renderResources();
    if (location.hash !== '#' + tab) history.replaceState(null, '', '#' + tab);
  }

  function init() {
    for (const b of document.querySelectorAll('.tabs button')) b.addEventListener('click', () => showTab(b.dataset.tab));
    for (const b of document.querySelectorAll('[data-close]')) b.addEventListener('click', () => b.closest('dialog').close());
    $('#filter').addEventListener('input', () => { if (state.overview) renderResources(); });
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
    window.addEventListener('resize', () => { if (state.overview) renderResources(); });
    const start = (location.hash || '#resources').slice(1);
    KINDS.forEach(ruleCard);
    showTab(['resources', 'rules', 'breakers'].includes(start) ? start : 'resources');
    tick();
  }

  init();
})();
