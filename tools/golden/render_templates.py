#!/usr/bin/env python3
"""Renders every chat template with every context using jinja2 configured the way transformers configures it, and
writes the results as fixtures for tests/chat (the C++ interpreter must reproduce them byte for byte).

transformers is not imported (it is not needed and not always installed): its environment is replicated here from its
documented behaviour: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension and an AssistantTracker extension for {% generation %}, a tojson filter that is json.dumps with
ensure_ascii=False, and the globals raise_exception and strftime_now. Templates are rendered with messages, tools
and documents (None when the context has none: transformers always passes both), add_generation_prompt and every
other key of the context as extra keyword arguments.

Usage: tools/golden/render_templates.py [--templates DIR] [--out tests/fixtures/chat]
"""
import argparse
import datetime
import json
import pathlib
import shutil

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# strftime_now is pinned so that the fixtures do not depend on the day they were made; the C++ test injects the
# same instant through ChatTemplate's clock.
FIXED_NOW = datetime.datetime(2024, 7, 26, 12, 34, 56)


class AssistantTracker(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: renders its body (transformers also records where it landed, which
    does not change the rendered text)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return FIXED_NOW.strftime(format)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, context, add_generation_prompt):
    kwargs = dict(context)
    messages = kwargs.pop("messages", [])
    tools = kwargs.pop("tools", None)
    documents = kwargs.pop("documents", None)
    kwargs.pop("add_generation_prompt", None)
    template = env.from_string(source)
    return template.render(messages=messages, tools=tools, documents=documents,
                           add_generation_prompt=add_generation_prompt, **kwargs)


# Feature probes: small templates covering the language, rendered with the same environment. The C++ unit tests
# replay them (tests/fixtures/chat/snippets.json) so that each feature is checked against jinja2 itself.
SNIPPET_VARS = {
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <b>"},
                 {"role": "assistant", "content": "Hello", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {"b": 2, "a": [1, 2.5, None, True]}}}]}],
    "d": {"zeta": 1, "alpha": "x", "Mid": [1, 2], "items": "shadowed"},
    "s": "  Hello, Wörld! ",
    "n": 7, "f": 2.5, "t": True, "nothing": None, "empty": [], "l": [3, 1, 2], "u": "héllo wörld",
    "words": ["b", "A", "c", "a"], "nested": {"a": {"b": {"c": "deep"}}},
    "people": [{"name": "Ann", "age": 31, "admin": True}, {"name": "bob", "age": 25, "admin": False},
               {"name": "Cy", "age": 31}],
}

SNIPPETS = [
    # output and printing
    "{{ 1 }} {{ 1.0 }} {{ -0.5 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 10**15 * 1.0 }} {{ 10**16 * 1.0 }} {{ 1/3 }}",
    "{{ true }} {{ none }} {{ [1, 'a', none, [true]] }} {{ {'k': \"it's\", 'n': {'x': 1.0}} }} {{ (1,) }} {{ () }}",
    "{{ d }}|{{ l }}|{{ words }}|{{ nothing }}|{{ empty }}",
    "{{ 'a\\tb\\n' }}|{{ ['a\\nb', \"q'\", 'q\"', 'b\\\\'] }}",
    "{{ undefined_thing }}|{{ d.missing }}|{{ d['missing'] }}|{{ l[10] }}|{{ none.x }}",
    "{{ 'x' if false }}|{{ 'y' if true else 'z' }}|{{ 'a' if nothing is none else 'b' }}",
    # whitespace control
    "A\n  {% if t %}\n    B\n  {% endif %}\nC\n",
    "A  {%- if t -%}  B  {%- endif -%}  C",
    "{{ 'x' }}  {% if t %}y{% endif %}\n  {# comment #}\n  {%+ if t %}z{% endif %}",
    "a {{- ' b ' -}} c\n{{ 'd' }}\n\n",
    "{% raw %}{{ not evaluated }}{% endraw %}|{%- raw %} x {% endraw -%} |",
    "{% for m in messages %}\n  {{ m.role }}\n{% endfor %}\n",
    "line1\r\nline2{% if t %}\r\nX{% endif %}\r\n",
    # arithmetic and operators
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 3 - 5 }} {{ 1 + true }}",
    "{{ 'ab' ~ 1 ~ none ~ 2.0 }} {{ 'ab' + 'cd' }} {{ [1] + [2] }} {{ 'ab' * 3 }} {{ [0] * 2 }} {{ 1 == 1.0 }} {{ true == 1 }}",
    "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 'el' in 'hello' }} {{ 2 in l }} {{ 'zeta' in d }} {{ 5 not in l }}",
    "{{ not t }} {{ t and 'yes' }} {{ nothing or 'fallback' }} {{ 0 or '' }} {{ -n }} {{ +f }} {{ -f|abs }}",
    "{{ 1 + 'a' }}",
    "{{ undefined_thing + 1 }}",
    "{{ 'a' < 1 }}",
    "{{ 1 / 0 }}",
    # attribute, subscript, slices
    "{{ nested.a.b.c }} {{ nested['a']['b'].c }} {{ messages[0].content }} {{ messages[-1]['role'] }} {{ l.1 }}",
    "{{ l[::-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::2] }} {{ u[1:4] }} {{ u[-3:] }} {{ u[::-1] }} {{ 'abc'[5:] }} {{ l[-10:10] }}",
    "{{ d.items is defined }}|{{ d['items'] }}|{{ d.items()|length }}",
    "{{ undefined_thing.attr }}",
    "{{ undefined_thing['k'] }}",
    "{{ messages[2].tool_calls[0].function.arguments.a }}",
    # statements
    "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for x in l %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('a', 'b') }};{% endfor %}",
    "{% for x in l if x > 1 %}{{ x }}/{{ loop.length }};{% else %}none{% endfor %}|{% for x in empty %}x{% else %}empty{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'héllo' %}{{ c }}.{% endfor %}",
    "{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}|{% for (a, b) in [[1, 2]] %}{{ a }}{{ b }}{% endfor %}",
    "{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in [1, 2] %}{% for y in [3, 4] %}{{ loop.index }}{{ x }}{{ y }} {% endfor %}{{ loop.index }}|{% endfor %}",
    "{% set y = 1 %}{% for x in l %}{% set y = y + x %}{{ y }}{% endfor %}|{{ y }}",
    "{% for x in l %}{% if loop.first %}{% set z = 5 %}{% endif %}[{{ z }}]{% endfor %}[{{ z }}]",
    "{% set ns = namespace(total=0, items=[]) %}{% for x in l %}{% set ns.total = ns.total + x %}{% set ns.items = ns.items + [x] %}{% endfor %}{{ ns.total }} {{ ns.items }} {{ ns.missing }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = (3, 4) %}{{ c }}{% set t2 = 1, %}{{ t2 }}",
    "{% set block_var %}  inner {{ n }}  {% endset %}[{{ block_var }}]{% set trimmed | trim | upper %}  x y  {% endset %}[{{ trimmed }}]",
    "{% if n > 10 %}big{% elif n > 5 %}mid{% elif n > 1 %}small{% else %}tiny{% endif %}",
    "{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', punct='?') }} {{ greet('Cy', 'Hi') }} {{ greet() }}",
    "{% macro outer() %}[{{ caller() }}]{% endmacro %}{% call outer() %}inside {{ n }}{% endcall %}",
    "{% macro list_items(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(item) list_items(l) %}<{{ item }}>{% endcall %}",
    "{% macro rec(k) %}{{ k }}{% if k > 0 %}{{ rec(k - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}",
    "{% set v = 'outer' %}{% macro m() %}{{ v }}{% endmacro %}{% set v = 'changed' %}{{ m() }}",
    "{% filter upper %}hello {{ n }}{% endfilter %}|{% filter trim %}  pad  {% endfilter %}|",
    "{% generation %}gen {{ n }}{% endgeneration %}",
    "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}",
    "{{ raise_exception('custom failure') }}",
    "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}",
    "{{ strftime_now('%Y-%m-%d %H:%M:%S %d %b %Y %A %j') }}",
    "{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }}",
    "{{ namespace(a=1).a }} {{ dict(x=1, y='z') }}",
    # filters
    "{{ messages|tojson }}",
    "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ l|tojson(separators=(',', ':')) }}|{{ u|tojson }}|{{ u|tojson(ensure_ascii=true) }}",
    "{{ messages[2].tool_calls[0].function.arguments|tojson(indent=4) }}|{{ {'a': [], 'b': {}}|tojson(indent=2) }}|{{ 'a\\u0001\"\\\\'|tojson }}",
    "{{ undefined_thing|tojson }}",
    "{{ l|length }} {{ u|length }} {{ d|count }} {{ undefined_thing|length }} {{ s|trim }}| {{ s|trim('! ') }}|",
    "{{ s|lower }} {{ s|upper }} {{ 'hello world-foo(bar'|title }} {{ 'hELLO'|capitalize }} {{ u|wordcount }}",
    "{{ words|join(', ') }} {{ l|join }} {{ people|join(',', attribute='name') }} {{ undefined_thing|join(',') }}",
    "{{ undefined_thing|default('dflt') }} {{ nothing|default('dflt') }} {{ ''|default('dflt', true) }} {{ 0|d('z', boolean=true) }}",
    "{{ people|selectattr('admin')|map(attribute='name')|list }} {{ people|rejectattr('admin')|map(attribute='name')|list }}",
    "{{ people|selectattr('age', 'equalto', 31)|map(attribute='name')|join(',') }} {{ people|selectattr('admin', 'defined')|list|length }}",
    "{{ l|select('odd')|list }} {{ l|reject('odd')|list }} {{ l|select|list }} {{ [0, 1, '', 'a']|select|list }}",
    "{{ words|map('upper')|list }} {{ people|map(attribute='missing', default='?')|list }} {{ nothing|map('upper')|list }}",
    "{{ l|map(attribute='x')|list }}",
    "{{ tools|map(attribute='function')|tojson }}",
    "{{ words|sort }} {{ words|sort(case_sensitive=true) }} {{ words|sort(reverse=true) }} {{ people|sort(attribute='age')|map(attribute='name')|join }}",
    "{{ d|dictsort }} {{ d|dictsort(true) }} {{ {'b': 2, 'a': 3}|dictsort(by='value') }}",
    "{{ words|unique|list }} {{ words|unique(case_sensitive=true)|list }} {{ [1, 1, 2]|unique|list }}",
    "{{ l|first }} {{ l|last }} {{ empty|first }} {{ u|first }} {{ u|last }}",
    "{{ l|reverse|list }} {{ u|reverse }} {{ l|list }} {{ u|list }} {{ d|list }}",
    "{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ 3.9|int }} {{ '2.5'|float }} {{ 'x'|float }} {{ true|int }}",
    "{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 1.25|round(1, 'floor') }} {{ 1.21|round(1, 'ceil') }} {{ -3|abs }} {{ 7|round }}",
    "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb\\n'|indent(2, blank=true) }}|{{ 'x'|indent('> ', first=true) }}",
    "{{ s|replace('l', 'L') }} {{ s|replace('l', 'L', 1) }} {{ 'abc'|replace('', '-') }}",
    "{{ d|items|list }} {{ undefined_thing|items|list }}",
    "{{ l|items|list }}",
    "{{ l|batch(2)|list }} {{ l|batch(2, 0)|list }} {{ l|sum }} {{ people|sum(attribute='age') }} {{ l|min }} {{ words|max }}",
    "{{ 'ab'|center(6) }}|{{ 'abc'|center(6) }}|{{ messages[1].content|e }}|{{ messages[1].content|safe }}",
    "{{ 'x: ' | safe + messages[1].content }}|{{ messages[1].content + 'y'|safe }}|{{ ('<'|safe) ~ '<' }}",
    "{{ n|string + '!' }} {{ l|string }} {{ nothing|string }} {{ '%s-%d'|format('a', 3) }} {{ 3|pprint }}",
    "{{ d|attr('zeta') }}|{{ nested|attr('a') }}",
    "{{ x|nosuchfilter }}",
    # tests
    "{{ n is defined }} {{ zz is defined }} {{ zz is undefined }} {{ nothing is none }} {{ n is not none }} {{ s is string }} {{ n is string }}",
    "{{ d is mapping }} {{ l is mapping }} {{ l is iterable }} {{ n is iterable }} {{ s is sequence }} {{ n is number }} {{ f is float }} {{ n is integer }} {{ t is boolean }}",
    "{{ t is true }} {{ t is false }} {{ 1 is true }} {{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }}",
    "{{ n is eq 7 }} {{ n is equalto(7) }} {{ n is ne 7 }} {{ n is lt 8 }} {{ n is gt 8 }} {{ n is le 7 }} {{ n is ge 8 }} {{ 2 is in l }} {{ 'a' is lower }} {{ 'A' is upper }}",
    "{{ range is callable }} {{ n is callable }} {{ nothing is sameas none }} {{ t is sameas true }} {{ 'x'|safe is escaped }}",
    "{{ n is nosuchtest }}",
    # methods
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}",
    "{{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'a\\nb\\r\\nc'.splitlines() }}",
    "{{ s.startswith('  He') }} {{ s.endswith(('x', ' ')) }} {{ s.upper() }} {{ s.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }}",
    "{{ s.replace('l', '_') }} {{ s.find('o') }} {{ u.find('w') }} {{ s.count('l') }} {{ '-'.join(words) }} {{ 'x'.join(['a', 'b']) }}",
    "{{ '{} and {}'.format('a', 1) }} {{ '{0}{0}'.format('z') }} {{ '{name}!'.format(name='n') }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }}",
    "{{ d.get('zeta') }} {{ d.get('nope') }} {{ d.get('nope', 'dv') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }}",
    "{{ l.index(2) }} {{ l.count(3) }} {{ 'a-b'.partition('-') }} {{ 'ab'.ljust(4, '.') }}|{{ 'ab'.rjust(4) }}|{{ '5'.zfill(3) }}",
    "{{ l.append(4) }}",
    "{{ d.update({'a': 1}) }}",
    "{{ d.pop }}|{{ l.append is defined }}",
    # syntax errors
    "{% if t %}unclosed",
    "{% for x in l %}{% endif %}",
    "{{ 1 + }}",
    "{% endfor %}",
    "{{ 'unterminated }}",
    "{% set %}",
    "{% include 'other.jinja' %}",
    "{{ (1, 2 }}",
    "{# unclosed comment",
    "{{ n",
]


def render_snippets(env, out):
    cases = []
    for src in SNIPPETS:
        case = {"template": src}
        try:
            case["expected"] = env.from_string(src).render(**SNIPPET_VARS, tools=[{"function": {"name": "f"}}])
        except Exception as e:
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
    doc = {"vars": SNIPPET_VARS, "tools": [{"function": {"name": "f"}}], "cases": cases}
    (out / "snippets.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(cases)} snippets: {sum('error' in c for c in cases)} raise")


def main():
    repo = pathlib.Path(__file__).resolve().parents[2]
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", default=str(repo.parent / "shared" / "templates"))
    ap.add_argument("--out", default=str(repo / "tests" / "fixtures" / "chat"))
    args = ap.parse_args()
    src_dir, out = pathlib.Path(args.templates), pathlib.Path(args.out)

    for sub in ("templates", "contexts", "expected"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for old in (out / "expected").iterdir():
        old.unlink()

    env = make_env()
    cases = []
    n_ok = n_err = 0
    templates = sorted(src_dir.glob("*.jinja"))
    contexts = sorted((src_dir / "contexts").glob("*.json"))
    for t in templates:
        shutil.copyfile(t, out / "templates" / t.name)
    for c in contexts:
        shutil.copyfile(c, out / "contexts" / c.name)
    for t in templates:
        source = t.read_text(encoding="utf-8")
        for c in contexts:
            context = json.loads(c.read_text(encoding="utf-8"))
            for agp in (False, True):
                name = f"{t.stem}.{c.stem}.{'gen' if agp else 'nogen'}"
                case = {"template": t.name, "context": c.name, "add_generation_prompt": agp}
                try:
                    text = render(env, source, context, agp)
                    (out / "expected" / f"{name}.txt").write_bytes(text.encode("utf-8"))
                    case["expected"] = f"expected/{name}.txt"
                    n_ok += 1
                except Exception as e:  # any jinja2 failure: the C++ side must fail too
                    case["error"] = f"{type(e).__name__}: {e}"
                    case["raised"] = isinstance(e, jinja2.exceptions.TemplateError) and \
                        type(e) is jinja2.exceptions.TemplateError
                    n_err += 1
                cases.append(case)
    render_snippets(env, out)
    manifest = {"jinja2_version": jinja2.__version__, "fixed_now": FIXED_NOW.isoformat(), "cases": cases}
    (out / "cases.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(cases)} cases: {n_ok} rendered, {n_err} raised")


if __name__ == "__main__":
    main()
