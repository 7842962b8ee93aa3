// A small Markdown renderer for the chat page: fenced code blocks (with a language label and a copy button),
// headings, lists (nested by indentation), block quotes, tables, rules, paragraphs; inline code, bold, italics,
// strike-through and http(s)/mailto links. Everything the text holds is escaped first: the only tags in the output
// are the renderer's own. An unclosed code fence (a reply still streaming) runs to the end.
'use strict';

(function () {
  const ENTITIES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
  const escapeHtml = (s) => String(s).replace(/[&<>"']/g, (c) => ENTITIES[c]);
  const unescapeHtml = (s) => s.replace(/&(amp|lt|gt|quot|#39);/g,
    (m, e) => ({ amp: '&', lt: '<', gt: '>', quot: '"', '#39': "'" })[e]);
  const leading = (line) => line.match(/^\s*/)[0].length;

  function inline(text) {
    const codes = [];
    let s = text.replace(/\u0000/g, '').replace(/`([^`\n]+)`/g, (m, code) => {
      codes.push(code);
      return `\u0000${codes.length - 1}\u0000`;
    });
    s = escapeHtml(s);
    s = s.replace(/\[([^\]\n]+)\]\(([^)\s]+)\)/g, (m, label, url) => {
      const href = unescapeHtml(url);
      if (!/^(https?:\/\/|mailto:)/i.test(href)) return m;
      return `<a href="${escapeHtml(href)}" target="_blank" rel="noopener noreferrer">${label}</a>`;
    });
    s = s.replace(/\*\*([^*\n]+)\*\*/g, '<strong>$1</strong>').replace(/__([^_\n]+)__/g, '<strong>$1</strong>');
    s = s.replace(/(^|[^*\w])\*([^*\s][^*\n]*)\*(?![\w*])/g, '$1<em>$2</em>');
    s = s.replace(/(^|[^_\w])_([^_\s][^_\n]*)_(?![\w_])/g, '$1<em>$2</em>');
    s = s.replace(/~~([^~\n]+)~~/g, '<del>$1</del>');
    return s.replace(/\u0000(\d+)\u0000/g, (m, i) => `<code>${escapeHtml(codes[Number(i)])}</code>`);
  }

  function codeBlock(code, lang) {
    const cls = lang ? ` class="language-${escapeHtml(lang)}"` : '';
    return `<div class="code"><div class="code-head"><span>${escapeHtml(lang || 'text')}</span>` +
      `<button type="button" class="copy">Copy</button></div><pre><code${cls}>${escapeHtml(code)}</code></pre></div>`;
  }

  const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const TABLE_RULE = /^\s*\|?\s*:?-{1,}:?\s*(\|\s*:?-{1,}:?\s*)*\|?\s*$/;
  const cells = (line) => line.trim().replace(/^\|/, '').replace(/\|$/, '').split('|').map((c) => c.trim());

  function list(lines, i, out) {
    const first = lines[i].match(ITEM);
    const indent = first[1].length;
    const ordered = /\d/.test(first[2]);
    const items = [];
    while (i < lines.length) {
      const line = lines[i];
      const m = line.match(ITEM);
      if (m && m[1].length === indent && /\d/.test(m[2]) === ordered) {
        items.push([m[3]]);
        i++;
      } else if (items.length && line.trim() !== '' && leading(line) > indent) {
        items[items.length - 1].push(line.slice(Math.min(leading(line), indent + 2)));
        i++;
      } else if (items.length && line.trim() === '' && i + 1 < lines.length && leading(lines[i + 1]) > indent &&
                 lines[i + 1].trim() !== '') {
        items[items.length - 1].push('');
        i++;
      } else {
        break;
      }
    }
    const tag = ordered ? 'ol' : 'ul';
    const start = ordered && parseInt(first[2], 10) !== 1 ? ` start="${parseInt(first[2], 10)}"` : '';
    const body = items.map((item) => {
      let html = render(item.join('\n'));
      const only = html.match(/^<p>([\s\S]*?)<\/p>/);
      if (only) html = only[1] + html.slice(only[0].length);  // a tight item: no paragraph around its first line
      return `<li>${html}</li>`;
    }).join('');
    out.push(`<${tag}${start}>${body}</${tag}>`);
    return i;
  }

  function table(lines, i, out) {
    const head = cells(lines[i]);
    i += 2;
    const rows = [];
    while (i < lines.length && lines[i].includes('|') && lines[i].trim() !== '') rows.push(cells(lines[i++]));
    const tr = (cs, tag) => `<tr>${cs.map((c) => `<${tag}>${inline(c)}</${tag}>`).join('')}</tr>`;
    out.push(`<table><thead>${tr(head, 'th')}</thead><tbody>${rows.map((r) => tr(r, 'td')).join('')}</tbody></table>`);
    return i;
  }

  function render(src) {
    const lines = String(src).replace(/\r\n?/g, '\n').split('\n');
    const out = [];
    let para = [];
    const flush = () => {
      if (para.length) out.push(`<p>${inline(para.join('\n')).replace(/\n/g, '<br>')}</p>`);
      para = [];
    };
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if ((m = line.match(/^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/))) {
        flush();
        const fence = m[1];
        const code = [];
        for (i++; i < lines.length && !lines[i].trim().startsWith(fence); i++) code.push(lines[i]);
        i++;
        out.push(codeBlock(code.join('\n'), m[2]));
      } else if (line.trim() === '') {
        flush();
        i++;
      } else if ((m = line.match(/^(#{1,6})\s+(.*?)\s*#*\s*$/))) {
        flush();
        out.push(`<h${m[1].length}>${inline(m[2])}</h${m[1].length}>`);
        i++;
      } else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line) && !para.length) {
        out.push('<hr>');
        i++;
      } else if (/^\s*>/.test(line)) {
        flush();
        const quote = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) quote.push(lines[i++].replace(/^\s*>\s?/, ''));
        out.push(`<blockquote>${render(quote.join('\n'))}</blockquote>`);
      } else if (ITEM.test(line)) {
        flush();
        i = list(lines, i, out);
      } else if (line.includes('|') && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1]) &&
                 lines[i + 1].includes('-')) {
        flush();
        i = table(lines, i, out);
      } else {
        para.push(line);
        i++;
      }
    }
    flush();
    return out.join('');
  }

  globalThis.renderMarkdown = render;
  globalThis.escapeHtml = escapeHtml;
})();
