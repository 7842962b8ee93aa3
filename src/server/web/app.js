// The chat page of exl3 serve: conversations kept in this browser (localStorage), replies streamed from
// /v1/chat/completions, reasoning (reasoning_content deltas) shown folded, Markdown rendered by markdown.js.
'use strict';

const $ = (id) => document.getElementById(id);
const DEFAULTS = {
  model: '', apiKey: '', system: '', temperature: 0.7, top_p: 1, top_k: 0, min_p: 0, repetition_penalty: 1,
  max_tokens: 512, seed: '', extra: '',
};
// Settings fields: setting name -> element id.
const FIELDS = {
  model: 'model', apiKey: 'api-key', system: 'system', temperature: 'temperature', top_p: 'top_p', top_k: 'top_k',
  min_p: 'min_p', repetition_penalty: 'repetition_penalty', max_tokens: 'max_tokens', seed: 'seed', extra: 'extra',
};
const NUMERIC = new Set(['temperature', 'top_p', 'top_k', 'min_p', 'repetition_penalty', 'max_tokens']);

const store = {
  load(key, fallback) {
    try {
      const v = JSON.parse(localStorage.getItem(key));
      return v === null || v === undefined ? fallback : v;
    } catch {
      return fallback;
    }
  },
  save(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
    } catch (e) {
      setStatus(`could not save the conversation: ${e.message}`, true);
    }
  },
};

let settings = Object.assign({}, DEFAULTS, store.load('exl3.settings', {}));
let chats = store.load('exl3.chats', []);  // [{id, title, messages: [{role, content, reasoning, meta, error}]}]
let current = store.load('exl3.current', null);
let controller = null;  // the AbortController of the reply streaming now

function setStatus(text, error = false) {
  $('status').textContent = text;
  $('status').classList.toggle('error', error);
}

function headers() {
  const h = { 'Content-Type': 'application/json' };
  if (settings.apiKey) h.Authorization = `Bearer ${settings.apiKey}`;
  return h;
}

function activeChat() {
  return chats.find((c) => c.id === current);
}

function saveChats() {
  store.save('exl3.chats', chats);
  store.save('exl3.current', current);
}

function newChat() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6), title: 'New chat', messages: [] };
  chats.unshift(c);
  current = c.id;
  saveChats();
  renderAll();
  return c;
}

// --- rendering -----------------------------------------------------------------------------------------------------

function renderChats() {
  const ul = $('chats');
  ul.replaceChildren();
  for (const c of chats) {
    const li = document.createElement('li');
    li.classList.toggle('active', c.id === current);
    const name = document.createElement('span');
    name.textContent = c.title;
    name.title = c.title;
    name.addEventListener('click', () => {
      if (controller) return;
      current = c.id;
      saveChats();
      renderAll();
    });
    const del = document.createElement('button');
    del.type = 'button';
    del.textContent = '×';
    del.title = 'Delete this conversation';
    del.addEventListener('click', () => {
      if (controller) return;
      chats = chats.filter((x) => x.id !== c.id);
      if (current === c.id) current = chats.length ? chats[0].id : null;
      saveChats();
      renderAll();
    });
    li.append(name, del);
    ul.append(li);
  }
}

function fillMessage(el, m) {
  const body = el.querySelector('.body');
  if (m.role === 'user') {
    body.textContent = m.content;
  } else {
    const wasOpen = body.querySelector('details.reasoning')?.open ?? false;
    let html = '';
    if (m.reasoning) {
      const words = m.reasoning.trim().split(/\s+/).length;
      const label = el.dataset.state === 'streaming' && !m.content ? 'Thinking' : 'Reasoning';
      html += `<details class="reasoning"${wasOpen ? ' open' : ''}><summary>${label} (${words} words)</summary>` +
        `<div class="thought">${escapeHtml(m.reasoning)}</div></details>`;
    }
    html += renderMarkdown(m.content || '');
    if (m.error) html += `<p class="error">${escapeHtml(m.error)}</p>`;
    body.innerHTML = html;
  }
  el.querySelector('.meta').textContent = m.meta || '';
}

function messageElement(m) {
  const el = document.createElement('div');
  el.className = `msg ${m.role}`;
  el.dataset.state = m.error ? 'error' : 'done';
  const role = document.createElement('div');
  role.className = 'role';
  role.textContent = m.role === 'user' ? 'You' : 'Assistant';
  const body = document.createElement('div');
  body.className = 'body';
  const meta = document.createElement('div');
  meta.className = 'meta';
  el.append(role, body, meta);
  fillMessage(el, m);
  return el;
}

function renderMessages() {
  const box = $('messages');
  box.replaceChildren(...(activeChat()?.messages ?? []).map(messageElement));
  box.scrollTop = box.scrollHeight;
}

function renderAll() {
  renderChats();
  renderMessages();
  $('title').textContent = activeChat()?.title ?? 'exl3 chat';
}

// --- settings and models -------------------------------------------------------------------------------------------

function showSettings() {
  for (const [key, id] of Object.entries(FIELDS)) if (key !== 'model') $(id).value = settings[key];
}

function bindSettings() {
  for (const [key, id] of Object.entries(FIELDS)) {
    $(id).addEventListener('change', () => {
      const raw = $(id).value;
      settings[key] = NUMERIC.has(key) ? (raw === '' ? DEFAULTS[key] : Number(raw)) : raw;
      store.save('exl3.settings', settings);
      if (key === 'apiKey') loadModels();
    });
  }
  $('reset-settings').addEventListener('click', () => {
    settings = Object.assign({}, DEFAULTS, { apiKey: settings.apiKey, model: settings.model });
    store.save('exl3.settings', settings);
    showSettings();
  });
}

async function loadModels() {
  try {
    const r = await fetch('/v1/models', { headers: headers() });
    const j = await r.json();
    if (!r.ok) throw new Error(j?.error?.message ?? `HTTP ${r.status}`);
    const ids = j.data.map((m) => m.id);
    const select = $('model');
    select.replaceChildren(...ids.map((id) => Object.assign(document.createElement('option'), { value: id, textContent: id })));
    if (!ids.includes(settings.model)) settings.model = ids[0] ?? '';
    select.value = settings.model;
    setStatus(settings.model ? `model: ${settings.model}` : 'no model is loaded');
  } catch (e) {
    setStatus(`${e.message}${/key/i.test(e.message) ? ' (Settings: API key)' : ''}`, true);
  }
}

// --- sending -------------------------------------------------------------------------------------------------------

function requestBody(c) {
  const messages = [];
  if (settings.system.trim()) messages.push({ role: 'system', content: settings.system });
  for (const m of c.messages.slice(0, -1)) {
    if (m.role === 'assistant' && !m.content) continue;  // a reply that failed or was stopped at once
    messages.push({ role: m.role, content: m.content });
  }
  const body = {
    messages, stream: true, stream_options: { include_usage: true },
    temperature: settings.temperature, top_p: settings.top_p, top_k: settings.top_k, min_p: settings.min_p,
    repetition_penalty: settings.repetition_penalty, max_tokens: settings.max_tokens,
  };
  if (settings.model) body.model = settings.model;
  if (settings.seed !== '' && settings.seed !== null) body.seed = Number(settings.seed);
  // Any other request field the server takes (ignore_eos, DRY, logit_bias...), as a JSON object.
  if (settings.extra.trim()) {
    let extra = null;
    try {
      extra = JSON.parse(settings.extra);
    } catch (e) {
      throw new Error(`More fields (JSON): ${e.message}`);
    }
    if (typeof extra !== 'object' || extra === null || Array.isArray(extra)) {
      throw new Error('More fields (JSON): not a JSON object');
    }
    Object.assign(body, extra);
  }
  return body;
}

function setBusy(busy) {
  $('send').hidden = busy;
  $('stop').hidden = !busy;
  $('prompt').disabled = busy;
}

// Reads the server-sent events of one reply into `reply`; calls `update` as text comes.
async function readStream(response, reply, update) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  const out = { usage: null, finish: null };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end + 2);
      for (const line of event.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return out;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        if (j.usage) out.usage = j.usage;
        const choice = j.choices?.[0];
        if (!choice) continue;
        const d = choice.delta ?? {};
        if (d.reasoning_content) reply.reasoning += d.reasoning_content;
        else if (d.reasoning) reply.reasoning += d.reasoning;
        if (d.content) reply.content += d.content;
        if (choice.finish_reason) out.finish = choice.finish_reason;
        update();
      }
    }
  }
  return out;
}

async function send(text) {
  const c = activeChat() ?? newChat();
  c.messages.push({ role: 'user', content: text });
  if (c.title === 'New chat') c.title = text.replace(/\s+/g, ' ').slice(0, 48);
  const reply = { role: 'assistant', content: '', reasoning: '' };
  c.messages.push(reply);
  saveChats();
  renderAll();
  const el = $('messages').lastElementChild;
  el.dataset.state = 'streaming';
  const box = $('messages');
  let pending = false;
  const update = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
      fillMessage(el, reply);
      if (atBottom) box.scrollTop = box.scrollHeight;
    });
  };
  controller = new AbortController();
  setBusy(true);
  const t0 = performance.now();
  let state = 'done';
  try {
    const r = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(), body: JSON.stringify(requestBody(c)), signal: controller.signal,
    });
    if (!r.ok) {
      const j = await r.json().catch(() => null);
      throw new Error(j?.error?.message ?? `HTTP ${r.status}`);
    }
    const { usage, finish } = await readStream(r, reply, update);
    const seconds = (performance.now() - t0) / 1000;
    const tokens = usage?.completion_tokens;
    reply.meta = tokens ? `${tokens} tokens, ${(tokens / seconds).toFixed(1)} tok/s` : '';
    if (finish && finish !== 'stop') reply.meta += `${reply.meta ? ', ' : ''}${finish}`;
  } catch (e) {
    if (e.name === 'AbortError') {
      state = 'stopped';
      reply.meta = 'stopped';
    } else {
      state = 'error';
      reply.error = e.message;
    }
  }
  controller = null;
  setBusy(false);
  el.dataset.state = state;
  fillMessage(el, reply);
  saveChats();
  $('prompt').focus();
}

// --- wiring --------------------------------------------------------------------------------------------------------

function start() {
  showSettings();
  bindSettings();
  $('model').addEventListener('change', () => {
    settings.model = $('model').value;
    store.save('exl3.settings', settings);
    setStatus(`model: ${settings.model}`);
  });
  $('new-chat').addEventListener('click', () => {
    if (!controller) newChat();
  });
  $('composer').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const text = $('prompt').value.trim();
    if (!text || controller) return;
    $('prompt').value = '';
    send(text);
  });
  $('prompt').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('stop').addEventListener('click', () => controller?.abort());
  $('messages').addEventListener('click', (ev) => {
    const button = ev.target.closest('button.copy');
    if (!button) return;
    const code = button.closest('.code').querySelector('code').textContent;
    navigator.clipboard?.writeText(code).then(() => {
      button.textContent = 'Copied';
      setTimeout(() => { button.textContent = 'Copy'; }, 1200);
    }, () => {});
  });
  if (current && !activeChat()) current = null;
  renderAll();
  loadModels();
  $('prompt').focus();
}

start();
