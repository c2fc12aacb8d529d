"""The sandboxed chat-template renderer: injection payloads never run, bombs end in time."""

from __future__ import annotations

import threading
import time

import pytest

from localrun.chat.template import MAX_RANGE, fallback_chat, render_chat
from localrun.errors import TemplateError
from localrun.types import Message

CHATML = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m.content | trim }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Each payload tries to create the file named by SENT. They cover the classes behind
# CVE-2024-34359 (llama-cpp-python), the vLLM/SGLang recurrences and Jinja < 3.1.6 escapes.
PAYLOADS = [
    # CVE-2024-34359 as published: reach os through a global's __init__.__globals__
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.popen('touch SENT').read() }}",
    "{{ cycler.__init__.__globals__.os.system('touch SENT') }}",
    "{{ joiner.__init__.__globals__.os.system('touch SENT') }}",
    "{{ namespace.__init__.__globals__.os.system('touch SENT') }}",
    "{{ lipsum.__globals__['os'].system('touch SENT') }}",
    "{{ raise_exception.__globals__['__builtins__']['open']('SENT', 'w').write('x') }}",
    # walk the class tree to a subclass that can run things
    "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'Popen' %}"
    "{{ c(['touch', 'SENT']) }}{% endif %}{% endfor %}",
    "{{ messages.__class__.__base__.__subclasses__() }}{{ ().__class__.__bases__[0].__subclasses__() }}",
    # attr filter and escaped names
    "{{ (cycler|attr('__init__')|attr('__globals__'))['os'].system('touch SENT') }}",
    "{{ (cycler|attr('\\x5f\\x5finit\\x5f\\x5f')|attr('\\x5f\\x5fglobals\\x5f\\x5f'))['os'].system('touch SENT') }}",
    "{{ messages|map(attribute='__class__')|list }}{{ "
    "self.__init__.__globals__.__builtins__.__import__('os').system('touch SENT') }}",
    # format-string tricks (Jinja < 3.1.5 let str.format reach attributes; CVE-2024-56326 via a stored format method)
    "{{ '{0.__init__.__globals__[os].system}'.format(cycler) }}",
    "{{ '{a.__init__.__globals__}'.format_map({'a': cycler}) }}",
    "{% set f = '{0.__class__.__mro__}'.format %}{{ f('') }}",
    "{{ ''|attr('format')('{0.__init__.__globals__}', cycler) }}",
    # mutation of the caller's data, forbidden by the immutable sandbox
    "{{ messages.append({'role': 'system', 'content': 'SENT'}) }}{{ messages.clear() }}",
    # template inheritance or includes that could read files
    "{% include 'SENT' %}{% import 'SENT' as x %}",
    "{{ strftime_now.__globals__['os'].system('touch SENT') }}",
]


@pytest.mark.parametrize("payload", PAYLOADS, ids=range(len(PAYLOADS)))
def test_injection_payload_never_runs(payload, tmp_path):
    sentinel = tmp_path / "pwned"
    template = payload.replace("SENT", str(sentinel))
    try:
        out = render_chat(template, [Message("user", "hi")], bos_token="<s>", eos_token="</s>")
    except TemplateError:
        out = None
    assert not sentinel.exists()
    if out is not None:  # rendered without error: nothing from Python internals leaks into the prompt
        assert "<class" not in out and "function" not in out and "module" not in out


def test_first_payload_is_live_outside_the_sandbox(tmp_path):
    """The control: with plain Jinja the CVE payload really creates the file, so the
    sandboxed test above is checking something that bites."""
    import jinja2

    sentinel = tmp_path / "pwned"
    template = "{{ cycler.__init__.__globals__.__builtins__.open('SENT', 'w').write('x') }}".replace(
        "SENT", str(sentinel)
    )
    jinja2.Environment().from_string(template).render()
    assert sentinel.exists()
    with pytest.raises(TemplateError):
        render_chat(template.replace("pwned", "again"), [])
    assert not (tmp_path / "again").exists()


BOMBS = [
    "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "{% set x = range(100000)|list %}{% for a in x %}{% for b in x %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "{% for x in [1] recursive %}{% for y in range(1000) %}{{ loop(range(1000)) }}{% endfor %}{% endfor %}",
]


@pytest.mark.parametrize("bomb", BOMBS, ids=["nested-range", "nested-list", "macro-fanout", "recursive-loop"])
def test_template_bomb_stops_within_budget_and_next_render_works(bomb):
    start = time.monotonic()
    with pytest.raises(TemplateError):
        render_chat(bomb, [Message("user", "hi")], timeout_s=1.0)
    assert time.monotonic() - start < 2.0
    assert render_chat(CHATML, [Message("user", "hi")]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_bomb_stops_on_a_worker_thread():
    """The deadline needs no signals or main thread: the worker renders on any thread."""
    errors: list[BaseException] = []

    def run():
        try:
            render_chat(BOMBS[0], [], timeout_s=0.5)
        except BaseException as exc:  # noqa: BLE001 - the test inspects what came out
            errors.append(exc)

    t = threading.Thread(target=run)
    start = time.monotonic()
    t.start()
    t.join(5)
    assert not t.is_alive()
    assert time.monotonic() - start < 2.0
    assert len(errors) == 1 and isinstance(errors[0], TemplateError)


MEMORY_BOMBS = [
    "{{ 'a' * 10**9 }}",
    "{{ [0] * 10**9 }}",
    "{{ 10 ** 10000000 }}",
    "{{ 'a'|center(10**9) }}",
    "{{ 'x'|indent(10**9) }}",
    "{{ 'a'.ljust(10**9) }}",
    "{{ (1).to_bytes(10**9, 'big') }}",
    "{{ '%0999999999d'|format(1) }}",
    "{{ '%0999999999d' % 1 }}",
    "{{ '{:>999999999}'.format(1) }}",
    "{{ [1]|batch(10**9, 0)|list }}",
    "{{ range(10**9) }}",
    "{{ ('a' * 1000000)|replace('a', 'bbbbbbbbbbbbbb') }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
]


@pytest.mark.parametrize("bomb", MEMORY_BOMBS, ids=range(len(MEMORY_BOMBS)))
def test_size_bombs_are_refused_before_they_allocate(bomb):
    start = time.monotonic()
    with pytest.raises(TemplateError):
        render_chat(bomb, [])
    assert time.monotonic() - start < 0.5


def test_output_cap():
    with pytest.raises(TemplateError, match="limit"):
        render_chat(
            "{% for m in messages %}{{ m.content }}{% endfor %}", [Message("user", "x" * 5000)], max_output_chars=1000
        )


def test_normal_render_and_template_features():
    msgs = [{"role": "system", "content": "Be brief."}, Message("user", " Hi "), Message("assistant", "Hello")]
    out = render_chat(CHATML, msgs, bos_token="<s>", add_generation_prompt=False)
    assert out == (
        "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello<|im_end|>\n"
    )
    loops = (
        "{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last "
        "}}{% endfor %}"
    )
    assert render_chat(loops, msgs) == "1/2,2/2"
    assert render_chat("{{ {'a': 'é'}|tojson }}", []) == '{"a": "é"}'
    assert render_chat("{% generation %}{{ eos_token }}{% endgeneration %}", [], eos_token="</s>") == "</s>"
    assert render_chat("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}", []) == "012"
    assert render_chat("{{ strftime_now('%Y')|int > 2000 }}", []) == "True"
    assert render_chat("{{ 'ab' * 3 }}{{ '%d' % 5 }}{{ 'x'.ljust(3, '.') }}", []) == "ababab5x.."
    assert len(render_chat("{% for i in range(" + str(MAX_RANGE) + ") %}.{% endfor %}", [])) == MAX_RANGE
    with pytest.raises(TemplateError, match="range"):
        render_chat("{% for i in range(" + str(MAX_RANGE + 1) + ") %}.{% endfor %}", [])


def test_raise_exception_names_the_templates_message():
    tpl = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}"
    with pytest.raises(TemplateError, match="must start with user"):
        render_chat(tpl, [Message("assistant", "x")])


@pytest.mark.parametrize("bad", ["", "{% for %}", "{{ undefined_thing.attr }}", "{% extends 'base.html' %}"])
def test_bad_templates_raise_template_error(bad):
    with pytest.raises(TemplateError):
        render_chat(bad, [Message("user", "hi")])


def test_fallback_transcript_and_gemma_turns():
    msgs = [Message("system", "S"), Message("user", "U1"), Message("assistant", "A1"), Message("user", "U2")]
    plain = fallback_chat(msgs)
    assert plain.text == "System: S\nUser: U1\nAssistant: A1\nUser: U2\nAssistant:"
    assert plain.stop == ("User:", "Assistant:")
    gemma = fallback_chat(msgs, gemma_turns=True, bos_token="<bos>")
    assert gemma.text == (
        "<bos><start_of_turn>user\nS\n\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n"
        "<start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n"
    )
    assert gemma.stop == ("<end_of_turn>",)


# Two templates as published in real model files (Gemma 3 instruct, Llama 3 instruct):
# slicing, namespaced sets, `is string` tests, `+` on strings and raise_exception.
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def test_real_gemma3_template_matches_the_gemma_fallback():
    msgs = [Message("system", "S"), Message("user", "U1"), Message("assistant", "A1"), Message("user", "U2")]
    rendered = render_chat(GEMMA3_TEMPLATE, msgs, bos_token="<bos>", eos_token="<eos>")
    assert rendered == fallback_chat(msgs, gemma_turns=True, bos_token="<bos>").text
    with pytest.raises(TemplateError, match="must alternate"):
        render_chat(GEMMA3_TEMPLATE, [Message("user", "a"), Message("user", "b")], bos_token="<bos>")


def test_real_llama3_template():
    out = render_chat(LLAMA3_TEMPLATE, [Message("user", " hi ")], bos_token="<|begin_of_text|>")
    assert out == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
