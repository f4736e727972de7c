#!/usr/bin/env python3
"""Generates tests/data/tmpl/lang_cases.json: small template -> expected output cases for the
tmpl room, rendered by jinja2 configured exactly as transformers' apply_chat_template does
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, raise_exception,
strftime_now, json.dumps-based tojson). Run by hand when adding cases (needs jinja2); the tests
only read the JSON. A case whose render raises is stored with "error": true."""
import copy, json, sys
import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

CTX = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi <b>there</b>"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!", "tool_calls": [
            {"type": "function", "function": {"name": "get", "arguments": {"city": "Paris", "n": 2}}}]},
        {"role": "tool", "content": "{\"t\": 21}", "name": "get"},
        {"role": "user", "content": "Thanks é 😀"},
    ],
    "tools": [{"type": "function", "function": {"name": "get", "description": "Get it",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "d": {"b": 1, "a": [1, 2, {"x": None}], "c": "str", "e": True, "f": 1.5},
    "nums": [3, 1, 2, 10, -4],
    "words": ["banana", "Apple", "cherry", "apple"],
    "s": "  Hello, World!  ",
    "n": 7, "f": 2.5, "t": True, "z": None, "empty": [], "emptys": "",
    "people": [{"name": "Ann", "age": 31, "admin": True}, {"name": "bob", "age": 25, "admin": False},
               {"name": "Cy", "age": 40}],
    "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>",
}

CASES = [
    # text, whitespace control, trim/lstrip
    "plain text", "a\n", "a\n\n", "{# c #}x", "a {#- c -#} b", "a\n{# c #}\nb",
    "{% if t %}\nyes\n{% endif %}\nend", "  {% if t %}\n  yes\n  {% endif %}\nend",
    "x  {%- if t %} y {% endif -%}  z", "{{- ' a ' -}}", " x {{- 1 }} {{ 2 -}} y ",
    "a\n  {%+ if t %}b{% endif %}", "{% if t +%}\nb{% endif %}", "{% raw %}{{ x }}{% endraw %}",
    "{% raw -%}  {{ y }}  {%- endraw %}", "  {% raw %}\n{% if %}\n  {% endraw %}\nz",
    "line1\r\nline2\rline3", "{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n",
    "  {# comment #}\nnext", "{{ 'x' }}\n{{ 'y' }}", "a{%- if t -%}\n\n  b  \n{%- endif -%}c",
    # literals and printing
    "{{ 1 }}{{ -2 }}{{ 1.0 }}{{ 1.5e3 }}{{ 0.1 + 0.2 }}{{ 1e20 }}{{ 1e-5 }}{{ 10/4 }}{{ 3/3 }}",
    "{{ true }}{{ false }}{{ none }}{{ True }}{{ None }}", "{{ 'it\\'s' }}|{{ \"q\\\"q\" }}|{{ 'a\\nb\\tc\\\\' }}",
    "{{ [1, 'a', none, true, 1.5] }}", "{{ {'a': 1, 'b': [1, 2], 'c': {'d': 'e'}} }}", "{{ (1, 2) }}{{ (1,) }}{{ () }}",
    "{{ ['it\\'s', 'a\"b', 'both\\'\"', '\\n\\x01\\u00e9\\u200b'] }}", "{{ 'a' 'b' \"c\" }}", "{{ 1_000 }}{{ 0x1f }}",
    "{{ d }}", "{{ messages[0] }}", "{{ z }}|{{ undefined_var }}|", "{{ '\\u00e9\\U0001F600' }}",
    # arithmetic and operators
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}",
    "{{ 1 + 2 * 3 - 4 / 2 }}", "{{ 'ab' * 3 }}{{ 2 * 'x' }}{{ [1] * 3 }}", "{{ 'a' ~ 1 ~ none ~ true ~ [1] }}",
    "{{ 'a' + 'b' }}{{ [1] + [2] }}", "{{ 'a' + 1 }}", "{{ 1 / 0 }}", "{{ n + f }}{{ n - true }}",
    "{{ -n }}{{ +n }}{{ not n }}{{ not empty }}", "{{ 1 < 2 < 3 }}{{ 1 < 3 < 2 }}{{ 'a' < 'b' }}{{ [1,2] < [1,3] }}",
    "{{ 1 == 1.0 }}{{ 'a' == 'a' }}{{ [1] == [1] }}{{ (1,) == [1] }}{{ none == none }}{{ 1 != 2 }}",
    "{{ 1 < 'a' }}", "{{ 'b' in 'abc' }}{{ 2 in [1,2] }}{{ 'a' in {'a':1} }}{{ 'z' not in 'abc' }}{{ 3 not in nums }}",
    "{{ 1 and 2 }}|{{ 0 and 2 }}|{{ 0 or 'x' }}|{{ '' or none }}|{{ t and 'y' or 'n' }}",
    "{{ 'a' if t else 'b' }}{{ 'a' if z else 'b' }}{{ 'c' if z }}|", "{{ (1 if t else 2) + 3 }}",
    "{{ nums[0] }}{{ nums[-1] }}{{ nums[1:3] }}{{ nums[::-1] }}{{ nums[::2] }}{{ nums[-2:] }}{{ nums[:-3] }}{{ nums[10:] }}",
    "{{ 'héllo'[1] }}{{ 'héllo'[1:3] }}{{ 'héllo'[::-1] }}{{ 'héllo'|length }}{{ 'héllo'[-1] }}",
    "{{ nums[9] }}|{{ d.nokey }}|{{ d['nokey'] }}|", "{{ d.a[2].x }}{{ d['a'][0] }}{{ d.a.1 }}",
    "{{ undefined_var.x }}", "{{ d.nokey.x }}", "{{ messages[9].role }}",
    # statements
    "{% if n > 5 %}big{% elif n > 2 %}mid{% else %}small{% endif %}",
    "{% if z %}a{% elif emptys %}b{% else %}c{% endif %}",
    "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for x in nums %}{{ loop.previtem }}-{{ loop.nextitem }},{% endfor %}",
    "{% for x in nums %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}",
    "{% for x in empty %}x{% else %}none{% endfor %}", "{% for x in nums if x > 1 %}{{ x }}/{{ loop.length }} {% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{% for k in d %}{{ k }}{% endfor %}",
    "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}", "{% for c in 'abc' %}{{ c }}.{% endfor %}",
    "{% for x in nums %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in nums %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}",
    "{% for i in range(3) %}{% for j in range(2) %}{{ i }}{{ j }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}",
    "{% set x = 1 %}{% for i in [1,2] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}",
    "{% set ns = namespace(c=0, s='') %}{% for i in nums %}{% set ns.c = ns.c + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.c }} {{ ns.s }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}", "{% set x %}inner {{ n }}{% endset %}[{{ x }}]",
    "{% set x | upper %}shout{% endset %}{{ x }}", "{% set l = [1, 2] %}{{ l.append(3) }}",
    "{% set ns = namespace() %}{% set ns.items = [1] %}{{ ns.items }}", "{% set x = 1 %}{% set x.y = 2 %}",
    "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', greeting='Hi') }} {{ greet('Cy', 'Yo') }}",
    "{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, a=3) }}",
    "{% macro m(x) %}[{{ x }}]{% endmacro %}{{ m() }}",
    "{% macro outer() %}<{{ caller() }}>{% endmacro %}{% call outer() %}inside {{ n }}{% endcall %}",
    "{% macro list(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) list([1,2]) %}({{ x }}){% endcall %}",
    "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}",
    "{% filter upper %}hello {{ 'world' }}{% endfilter %}", "{% filter trim|upper %}  x  {% endfilter %}",
    "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}",
    "{% if true %}{% set inner = 5 %}{% endif %}{{ inner }}",
    "{{ raise_exception('boom') }}", "{% if n > 100 %}{{ raise_exception('no') }}{% endif %}ok",
    # tests
    "{{ z is none }}{{ n is number }}{{ n is integer }}{{ f is float }}{{ t is boolean }}{{ s is string }}{{ d is mapping }}",
    "{{ nums is iterable }}{{ s is iterable }}{{ n is iterable }}{{ undefined_var is iterable }}{{ d is sequence }}",
    "{{ undefined_var is defined }}{{ undefined_var is undefined }}{{ d.c is defined }}{{ d.zz is not defined }}",
    "{{ t is true }}{{ t is false }}{{ 1 is true }}{{ n is odd }}{{ n is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}",
    "{{ n is eq 7 }}{{ n is equalto(7) }}{{ n is ne 7 }}{{ n is lt 8 }}{{ n is ge 8 }}{{ 2 is in nums }}{{ 'x' is in 'xy' }}",
    "{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 'upper' is filter }}{{ 'odd' is test }}{{ z is sameas none }}",
    "{{ greet is callable }}{{ range is callable }}{{ t is boolean and n is not string }}",
    "{{ undefined_var is odd }}",
    # filters
    "{{ s|trim }}|{{ 'xxaxx'|trim('x') }}|{{ s|length }}|{{ nums|count }}|{{ d|length }}|{{ undefined_var|length }}",
    "{{ nums|join(',') }}|{{ words|join }}|{{ people|join(', ', attribute='name') }}",
    "{{ undefined_var|default('dflt') }}|{{ z|default('dflt') }}|{{ emptys|default('dflt', true) }}|{{ emptys|d('x', boolean=true) }}",
    "{{ nums|first }}{{ nums|last }}{{ 'abc'|first }}{{ empty|first }}|", "{{ d|items|list }}", "{{ undefined_var|items|list }}",
    "{{ 'abc'|list }}{{ d|list }}{{ nums|list }}", "{{ s|upper }}{{ s|lower }}{{ 'hELLO wORLD'|capitalize }}{{ 'hello-world (x) y'|title }}",
    "{{ 'aXbXc'|replace('X', '-') }}{{ 'aXbXc'|replace('X', '-', 1) }}", "{{ '<b>'|safe }}{{ 5|string }}{{ [1]|string }}",
    "{{ '42'|int + 1 }}{{ '4.7'|int }}{{ 'x'|int }}{{ 'x'|int(9) }}{{ 3.9|int }}{{ '0x1A'|int(0, 16) }}{{ '1.5'|float }}{{ 'x'|float }}{{ 2|float }}",
    "{{ -3|abs }}{{ -2.5|abs }}{{ 2.5|round }}{{ 3.5|round }}{{ 3.14159|round(2) }}{{ 3.14159|round(1, 'floor') }}{{ 3.11|round(1, 'ceil') }}{{ 7|round }}",
    "{{ words|unique|list }}{{ words|unique(case_sensitive=true)|list }}{{ [1, 2, 1, 3]|unique|list }}",
    "{{ words|sort }}{{ words|sort(case_sensitive=true) }}{{ nums|sort(reverse=true) }}{{ people|sort(attribute='age')|map(attribute='name')|list }}",
    "{{ nums|reverse|list }}{{ 'abc'|reverse }}", "{{ {'b': 1, 'A': 2, 'c': 0}|dictsort }}{{ {'b': 1, 'A': 2, 'c': 0}|dictsort(by='value') }}{{ {'b': 1, 'a': 2}|dictsort(reverse=true) }}",
    "{{ people|selectattr('admin')|map(attribute='name')|list }}{{ people|rejectattr('admin')|map(attribute='name')|list }}",
    "{{ people|selectattr('age', 'gt', 30)|map(attribute='name')|join(',') }}{{ people|selectattr('name', 'equalto', 'bob')|list|length }}",
    "{{ nums|select('odd')|list }}{{ nums|reject('odd')|list }}{{ [0, 1, '', 'a', none]|select|list }}",
    "{{ nums|map('string')|join('+') }}{{ words|map('upper')|list }}{{ people|map(attribute='admin', default='?')|list }}",
    "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(first=true, blank=true) }}|{{ 'x\\ny'|indent('> ') }}",
    "{{ 'hello big world'|wordcount }}{{ 'ab'|center(7) }}|{{ 'abc'|center(6) }}|", "{{ nums|sum }}{{ people|sum(attribute='age') }}{{ nums|min }}{{ nums|max }}{{ words|min }}{{ words|max }}",
    "{{ '%s is %d'|format('x', 3) }}", "{{ d|attr('c') }}", "{{ '<a href=\"x\">&</a>'|e }}", "{{ nums|batch(2)|list }}",
    "{{ d|tojson }}", "{{ tools|tojson }}", "{{ d|tojson(indent=2) }}", "{{ d|tojson(sort_keys=true) }}",
    "{{ 'é\"\\\\\\n\\u0001😀'|tojson }}", "{{ 'é😀'|tojson(ensure_ascii=true) }}", "{{ [1.0, 1e20, -0.5, 1e-7]|tojson }}",
    "{{ {'a': [], 'b': {}}|tojson(indent=4) }}", "{{ d|tojson(separators=(',', ':')) }}", "{{ undefined_var|tojson }}",
    "{{ messages|map(attribute='role')|join(' ') }}", "{{ messages|selectattr('role', 'eq', 'user')|list|length }}",
    "{{ nums|nosuchfilter }}",
    # methods
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}",
    "{{ 'a,b,,c'.split(',') }}{{ '  a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ' a b c '.rsplit(none, 1) }}",
    "{{ 'hello'.startswith('he') }}{{ 'hello'.endswith('lo') }}{{ 'hello'.startswith(('x', 'h')) }}{{ 'hello'.endswith('x') }}",
    "{{ 'hello'.upper() }}{{ 'HeLLo'.lower() }}{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}{{ 'abc'.replace('b', 'B') }}{{ 'abc'.replace('', '-') }}",
    "{{ 'héllo'.find('l') }}{{ 'hello'.find('z') }}{{ 'hello'.rfind('l') }}{{ 'hello'.count('l') }}{{ 'hello'.index('e') }}",
    "{{ '{} and {}'.format(1, 'two') }}{{ '{0}{1}{0}'.format('a', 'b') }}{{ '{name}!'.format(name='x') }}{{ '{{}}'.format() }}",
    "{{ ', '.join(['a', 'b']) }}{{ '-'.join('abc') }}", "{{ 'a\\nb\\r\\nc'.splitlines() }}",
    "{{ '123'.isdigit() }}{{ 'abc'.isalpha() }}{{ 'ABC'.isupper() }}{{ 'abc'.islower() }}{{ ' '.isspace() }}{{ ''.isdigit() }}",
    "{{ d.get('c') }}{{ d.get('zz') }}{{ d.get('zz', 'dflt') }}{{ d.keys()|list }}{{ d.values()|list|length }}{{ d.items()|list|length }}",
    "{{ nums.index(2) }}{{ nums.count(3) }}", "{{ d.pop('a') }}", "{{ 'x'.nosuchmethod() }}",
    "{{ messages[2].content.split('</think>')[-1].lstrip('\\n') }}|{{ messages[2].content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
    # found by differential fuzzing against jinja2
    "{{ '%s-%s' % (1, 'a') }}{{ '%d%%' % 5 }}{{ 'x' % {'a': 1} }}{{ 'v' % [1] }}{{ '%r' % 'q' }}", "{{ '%s %s' % (1,) }}",
    "{{ 2.0 is even }}{{ 3.0 is odd }}{{ 2.5 is divisibleby 2 }}{{ 7.5 is divisibleby 2.5 }}", "{{ undefined_var is sequence }}",
    "{{ nums|indent }}", "{{ false|select|list }}{{ 0|map('string')|list }}{{ none|selectattr('a')|list }}",
    "{{ 0 ** -1 }}", "{{ undefined_var|int }}", "{{ undefined_var|float }}", "{{ [] in d }}", "{{ [[1], [1]]|unique|list }}",
    "{{ (1, 2)|unique|list }}{{ [(1, 2), (1, 2)]|unique|list }}",
    "{% for i in [1,2] %}{% break %}{% else %}E{% endfor %}|{% for i in [1,2] %}{{ i }}{% continue %}{% else %}E{% endfor %}|{% for i in [1,2] %}{% if i == 2 %}{% continue %}{% endif %}{% else %}E{% endfor %}",
    "{% break %}", "{% for i in l %}{% macro m() %}{% break %}{% endmacro %}{% endfor %}", "{% for i in nums %}x{% else %}{% continue %}{% endfor %}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, b=2) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{% call m(1) %}x{% endcall %}", "{% macro m(a) %}{{ a }}{{ kwargs }}{% endmacro %}{{ m(1, b=2) }}",
    "{% macro m() %}[{{ caller() if caller is defined else 'nocaller' }}]{% endmacro %}{{ m() }}{% call m() %}c{% endcall %}",
    "{% macro m(a) %}{% for x in varargs %}{{ x }}{% endfor %}{% endmacro %}{{ m(1, 2, 3) }}",
    # Unicode case mapping (full mappings, final sigma, titlecase digraphs)
    "{{ 'straße ﬁne ŉ ǰ ᾳ'|upper }}|{{ 'ΣΑΣ ΟΔΟΣ. İstanbul'|lower }}|{{ 'ΣΑΣ ΟΔΟΣ ǆemal ﬁne'|title }}|{{ 'ßa ΣΑΣ'|capitalize }}",
    "{{ 'ﬁne ǅ straße ΣΑΣ'.title() }}|{{ 'İiıI ǅ ǈa ß'.swapcase() }}|{{ 'ŉ'.islower() }}{{ 'ǅ'.isupper() }}{{ 'ⓐ'.islower() }}{{ 'ΑΣ'.lower() }}",
    # formatting: str.format specs and printf-style %
    "{{ '{:>8}|{:<6}|{:^7}|{:*^9}|{:05}|{:+}|{:,}|{:.2f}|{:.3}|{:e}|{:%}|{:#x}|{:X}|{:o}|{:b}|{:c}|{:10.3f}|{:+08.2f}'.format('ab', 'cd', 'é', 'x', 42, 5, 1234567, 3.14159, 2.71828, 12345.678, 0.25, 255, 255, 8, 5, 65, -1.5, 2.5) }}",
    "{{ '{0!r} {0!s} {x.k} {y[1]}'.format('q', x={'k': 'K'}, y=[1, 2]) }}{{ '{:}'.format(true) }}",
    "{{ '%s|%r|%d|%5d|%-5d|%05d|%+d|%.2f|%10.3f|%e|%g|%x|%#x|%X|%o|%c|%5s|%.1s|%%' % ('a', 'b', 3.9, 42, 42, 42, 7, 3.14159, 2.5, 12345.678, 0.0001, 255, 255, 255, 8, 65, 'ab', 'xyz') }}",
    "{{ '%(a)s-%(b)05.1f' % {'a': 1, 'b': 2.25} }}{{ '%(a)s'|format(a=3) }}{{ 'x%s'|format([1]) }}{{ '%s' % [1, 2] }}{{ 'v' % [1] }}",
    "{{ '{:s}'.format(3) }}", "{{ '{:+}'.format('ab') }}", "{{ '{:.2}'.format(5) }}", "{{ '{:5}'.format(none) }}", "{{ '%d' % 'x' }}", "{{ '%(k)s' % {'a': 1} }}",
    "{{ 'hello world foo bar'|truncate(9) }}|{{ 'hello world foo bar'|truncate(9, true) }}|{{ 'hello world foo bar'|truncate(15) }}|{{ 'abcdefghij'|truncate(5, leeway=0) }}|{{ 'xxab'.removeprefix('xx') }}{{ 'abyy'.removesuffix('yy') }}",
    # generators (select/map/unique/... return them), dict views, range objects
    "{{ d.items() }}{{ d.keys() }}{{ d.values() }}{{ range(3) }}{{ range(1, 9, 2) }}{{ d.items() == d.items() }}{{ range(2) == [0, 1] }}",
    "{{ d.keys()[0] }}|{{ range(5)[1] }}|{{ (nums|select)[0] }}|{{ d.items()[1:] }}|{{ range(5).index(3) }}",
    "{% if []|select %}T{% endif %}{% if empty|map('string') %}M{% endif %}{% if {}.items() %}I{% endif %}{% set g = nums|map('string') %}{{ g|first }}{{ g|list }}{{ g|list }}",
    "{{ nums|reverse|list }}{{ nums|map('string')|reverse|list }}{{ d.items()|list|length }}{% set g = nums|select %}{{ 2 in g }}{{ g|list }}",
    "{{ nums|select|length }}", "{{ nums|select|last }}", "{{ d.items()|tojson }}", "{{ range(3)|tojson }}", "{{ nums|select + [1] }}",
    "{{ nums|select is sequence }}{{ d.keys() is sequence }}{{ range(2) is sequence }}{{ nums|select is iterable }}",
    "{% for a, b in d.items() %}{{ a }}{% endfor %}{% set a, b, c, e, f = d.keys() %}{{ a }}{{ f }}{% for x in nums|select %}{{ loop.length }}{% endfor %}",
    # globals
    "{{ range(5)|list }}{{ range(2, 5)|list }}{{ range(10, 0, -3)|list }}{{ range(0)|list }}",
    "{% set ns = namespace(a=1, b='x') %}{{ ns.a }}{{ ns.b }}{{ ns.c }}|", "{{ dict(a=1, b=2) }}",
    "{{ range(200000)|length }}",
    # chat-template idioms
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>' + message['content'] + eos_token }}{% elif message['role'] == 'assistant' %}{{ '<|assistant|>' + message['content'] | trim + eos_token }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}",
    "{%- for message in messages %}\n    {%- if message.role == 'tool' %}\n        {{- '<tool>' + message.content + '</tool>\\n' }}\n    {%- else %}\n        {{- message.role + ': ' + message.content + '\\n' }}\n    {%- endif %}\n{%- endfor %}",
    "{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}{% endfor %}",
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}{{ system_message }}|{{ loop_messages|length }}",
    "{% for tool in tools %}{{ tool.function.name }}: {{ tool.function.parameters.properties | tojson }}{% endfor %}",
    "{%- for m in messages if m.tool_calls is defined %}{%- for tc in m.tool_calls %}{{ tc.function.name }}({{ tc.function.arguments|tojson }}){%- endfor %}{%- endfor %}",
    "{% for m in messages %}{{ m.content is string }}{{ m.tool_calls is defined }}{% endfor %}",
    "{%- set ns = namespace(found=false) -%}{%- for m in messages -%}{%- if m.role == 'system' -%}{%- set ns.found = true -%}{%- endif -%}{%- endfor -%}{{ ns.found }}",
    "{{ messages[-1].content[:5] }}{{ messages|length > 2 }}{{ (messages|last).role }}",
]

# Realistic chat templates written for these tests (original text, modelled on the constructs
# that Llama 3.1, gpt-oss, Qwen and Mistral templates use: recursive macros, `items` keys,
# |items, tojson(indent), strftime-free dates, reject('equalto'), namespace bookkeeping).
TS_TEMPLATE = """{#- renders tools as TypeScript-ish declarations -#}
{%- macro ts_type(spec, required=[], nullable=false) -%}
    {%- if spec.type == "array" -%}
        {%- if spec['items'] -%}{{ ts_type(spec['items']) }}[]{%- else -%}any[]{%- endif -%}
    {%- elif spec.type == "object" -%}
        {%- if spec.properties -%}
{ {% for name, sub in spec.properties.items() %}{{ name }}{{ '' if name in (spec.required or []) else '?' }}: {{ ts_type(sub) }}{{ ', ' if not loop.last }}{% endfor %} }
        {%- else -%}object{%- endif -%}
    {%- elif spec.enum -%}
        {{ spec.enum | map('tojson') | join(' | ') }}
    {%- elif spec.type is string -%}
        {{ {'string': 'string', 'integer': 'number', 'number': 'number', 'boolean': 'boolean'}.get(spec.type, 'any') }}{{ ' | null' if nullable }}
    {%- elif spec.type is iterable -%}
        {{ spec.type | map('string') | join(' | ') }}
    {%- else -%}any{%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
<|start|>system<|message|>Knowledge cutoff: 2024-06
Reasoning: {{ reasoning_effort | default('medium') }}
{%- if builtin_tools is defined and builtin_tools %}

Builtin: {{ builtin_tools | reject('equalto', 'python') | join(', ') }}
{%- endif %}
<|end|>
{%- if tools %}
<|start|>developer<|message|># Tools
namespace functions {
{%- for tool in tools %}
{%- set fn = tool.function if tool.function is defined else tool %}

// {{ fn.description | default('') | trim }}
type {{ fn.name }} = (_: {{ ts_type(fn.parameters) }}) => any;
{%- endfor %}

} // namespace functions<|end|>
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}
{%- if m.thinking is defined and loop.index0 > ns.last_user %}
<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>
{%- endif %}
{%- if m.tool_calls %}
{%- for tc in m.tool_calls %}
{%- set call = tc.function if tc.function is defined else tc %}
<|start|>assistant to=functions.{{ call.name }}<|channel|>commentary json<|message|>
{%- if call.arguments is string %}{{ call.arguments }}{% else %}{{ call.arguments | tojson }}{% endif %}<|call|>
{%- endfor %}
{%- else %}
<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- endif %}
{%- elif m.role == 'tool' %}
<|start|>functions.{{ m.name | default('unknown') }} to=assistant<|message|>{{ m.content | tojson if m.content is not string else m.content }}<|end|>
{%- elif m.role in ['user', 'system'] %}
<|start|>{{ 'developer' if m.role == 'system' else 'user' }}<|message|>{{ m.content }}<|end|>
{%- else %}
{{- raise_exception('Unexpected role: ' ~ m.role) }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|start|>assistant
{%- endif %}"""

L31_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, respond with a JSON function call.\\n\\n" }}
    {%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}{{- tool_call.arguments | tojson }}{{- "}" }}
        {%- for arg_name, arg_val in tool_call.arguments | items %}{{ ' ' ~ arg_name ~ '=' ~ arg_val | tojson }}{% endfor %}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or (message.content is iterable and message.content is not string) %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""

MISTRAL_TEMPLATE = """{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

CHATML_TOOLS = """{%- macro content_text(c) -%}
{%- if c is string -%}{{ c }}{%- elif c is none -%}{%- else -%}{%- for part in c if part.type == 'text' -%}{{ part.text }}{{ '\\n' if not loop.last }}{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- for message in messages %}
{%- if loop.first and message.role != 'system' %}<|im_start|>system
You are a helpful assistant.{% if tools %}

# Tools
{% for tool in tools %}{{ tool | tojson(sort_keys=true) }}
{% endfor %}{% endif %}<|im_end|>
{% endif %}
<|im_start|>{{ message.role }}
{{ content_text(message.content) | trim }}
{%- if message.tool_calls is defined and message.tool_calls %}
{%- for tc in message.tool_calls %}
<tool_call>
{"name": {{ tc.function.name | tojson }}, "arguments": {{ tc.function.arguments | tojson if tc.function.arguments is mapping else tc.function.arguments }}}
</tool_call>
{%- endfor %}
{%- endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}"""

TOOLS_FULL = [
    {"type": "function", "function": {"name": "search", "description": "  Search the web.  ",
     "parameters": {"type": "object", "properties": {
         "query": {"type": "string", "description": "what"},
         "limit": {"type": "integer"},
         "mode": {"type": "string", "enum": ["fast", "deep"]},
         "tags": {"type": "array", "items": {"type": "string"}},
         "filter": {"type": "object", "properties": {"site": {"type": "string"}, "lang": {"type": ["string", "null"]}}, "required": ["site"]},
         "flag": {"type": "boolean"}},
         "required": ["query"]}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
]
CONV_BASIC = [{"role": "user", "content": "Hello!"}]
CONV_SYS = [{"role": "system", "content": "  Be terse.  "}, {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]
CONV_TOOLS = [{"role": "user", "content": "Find cats"},
              {"role": "assistant", "content": None, "thinking": "need search",
               "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": "cats", "limit": 3, "tags": ["a", "b"]}}}]},
              {"role": "tool", "name": "search", "content": "[\"cat1\", \"cat2\"]"},
              {"role": "assistant", "content": "Found 2 cats ✓", "thinking": "done"}]
CONV_STR_ARGS = [{"role": "user", "content": "x"},
                 {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "now", "arguments": "{}"}}]},
                 {"role": "tool", "content": {"t": "12:00"}}]
CONV_PARTS = [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}, {"type": "text", "text": "here"}]}]
CONV_BAD = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
CONV_WEIRD = [{"role": "narrator", "content": "x"}]

TEMPLATES = {"ts": TS_TEMPLATE, "l31": L31_TEMPLATE, "mistral": MISTRAL_TEMPLATE, "chatml": CHATML_TOOLS}
CONVS = {"basic": CONV_BASIC, "sys": CONV_SYS, "tools": CONV_TOOLS, "strargs": CONV_STR_ARGS,
         "parts": CONV_PARTS, "bad": CONV_BAD, "weird": CONV_WEIRD, "empty": []}
for tname, tpl in TEMPLATES.items():
    for cname, conv in CONVS.items():
        for tools in (None, TOOLS_FULL):
            for agp in (True, False):
                # "@name" strings are resolved by the test from the top-level "templates" and
                # "messages" tables (keeps the JSON small)
                ctx = {"messages": "@" + cname, "tools": "@tools" if tools else None, "documents": None,
                       "add_generation_prompt": agp, "bos_token": "<s>", "eos_token": "</s>"}
                if tpl is TS_TEMPLATE and tools:
                    ctx["builtin_tools"] = ["browser", "python"]
                    ctx["reasoning_effort"] = "high"
                if tpl is L31_TEMPLATE and conv is CONV_SYS:
                    ctx["tools_in_user_message"] = False
                    ctx["date_string"] = "01 Jan 2025"
                if tpl is CHATML_TOOLS and agp and not tools:
                    ctx["enable_thinking"] = False
                CASES.append(("@" + tname, ctx))

out = []
for tpl in CASES:
    ctx = CTX
    if isinstance(tpl, tuple):
        tpl, ctx = tpl
    case = {"template": tpl}
    if ctx is not CTX:
        case["context"] = ctx
        ctx = dict(ctx)
        ctx["messages"] = CONVS[ctx["messages"][1:]]
        if ctx["tools"]:
            ctx["tools"] = TOOLS_FULL
    if tpl.startswith("@"):
        tpl = TEMPLATES[tpl[1:]]
    try:
        case["expected"] = env.from_string(tpl).render(**copy.deepcopy(ctx))  # filters may mutate
    except Exception as e:
        case["error"] = True
        case["error_type"] = type(e).__name__
        case["error_message"] = str(e)
    out.append(case)
json.dump({"generator": "tests/data/tmpl/gen_lang_cases.py (jinja2 %s, transformers-style env)" % jinja2.__version__,
           "context": CTX, "templates": TEMPLATES, "messages": CONVS, "tools": TOOLS_FULL, "cases": out}, sys.stdout, ensure_ascii=False, indent=1)
sys.stdout.write("\n")
