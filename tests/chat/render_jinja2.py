#!/usr/bin/env python3
"""Renders the chat-template test inputs with Python's jinja2, configured
exactly as transformers configures it, to give the expected output of
kvgraph's C++ interpreter (tests/chat/chat_template_parity_test.cpp).

  render_jinja2.py --write   regenerate tests/fixtures/chat_templates/golden.json
  render_jinja2.py --check   regenerate in memory and compare with the committed file
                             (exit 0 equal, 1 different, 77 jinja2 missing: ctest SKIP)

Inputs:
  tests/fixtures/chat_templates/*.jinja   templates of published checkpoints
  tests/chat/conversations.json          contexts each template is rendered with
  tests/chat/snippets.json               small templates, one construct each

The environment is transformers' (utils/chat_template_utils.py,
_compile_jinja_template): ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols]), a tojson
filter calling json.dumps(ensure_ascii=False, ...) without HTML escaping, and
the globals raise_exception and strftime_now. strftime_now is pinned to
2024-07-26 12:00:00 local time so the output does not depend on the day.
"""
import datetime
import json
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TEMPLATES = os.path.join(ROOT, "tests", "fixtures", "chat_templates")
GOLDEN = os.path.join(TEMPLATES, "golden.json")
CONVERSATIONS = os.path.join(ROOT, "tests", "chat", "conversations.json")
SNIPPETS = os.path.join(ROOT, "tests", "chat", "snippets.json")
FIXED_NOW = datetime.datetime(2024, 7, 26, 12, 0, 0)

try:
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("render_jinja2.py: python3 has no jinja2 (apt-get install python3-jinja2); skipped")
    sys.exit(77)


class AssistantTracker(Extension):
    """transformers' {% generation %} ... {% endgeneration %}: renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, context):
    """{"text": output} or {"error": message, "raised": bool}; raised marks
    raise_exception (whose message the C++ side must reproduce exactly)."""
    try:
        return {"text": env.from_string(source).render(**context)}
    except jinja2.exceptions.TemplateError as e:
        raised = type(e) is jinja2.exceptions.TemplateError
        return {"error": str(e), "raised": raised}
    except Exception as e:  # TypeError, ValueError, ... raised while rendering
        return {"error": f"{type(e).__name__}: {e}", "raised": False}


def generate():
    env = make_env()
    with open(CONVERSATIONS, encoding="utf-8") as f:
        conversations = json.load(f)
    with open(SNIPPETS, encoding="utf-8") as f:
        snippets = json.load(f)
    out = {"jinja2": jinja2.__version__, "templates": {}, "snippets": []}
    for name in sorted(os.listdir(TEMPLATES)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
            source = f.read()
        out["templates"][name] = {c["name"]: render(env, source, c["context"]) for c in conversations}
    for s in snippets:
        out["snippets"].append(render(env, s["template"], s.get("context", {})))
    return out


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("--write", "--check"):
        print(__doc__)
        return 2
    fresh = generate()
    if sys.argv[1] == "--write":
        with open(GOLDEN, "w", encoding="utf-8") as f:
            json.dump(fresh, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"wrote {GOLDEN} (jinja2 {jinja2.__version__})")
        return 0
    with open(GOLDEN, encoding="utf-8") as f:
        committed = json.load(f)
    # The version that wrote the file is information, not part of the result.
    fresh.pop("jinja2")
    committed.pop("jinja2", None)
    if fresh == committed:
        print(f"golden.json matches jinja2 {jinja2.__version__}")
        return 0
    for name, cases in fresh["templates"].items():
        for case, result in cases.items():
            if committed["templates"].get(name, {}).get(case) != result:
                print(f"differs: {name} / {case}")
    for i, result in enumerate(fresh["snippets"]):
        if i >= len(committed["snippets"]) or committed["snippets"][i] != result:
            print(f"differs: snippet {i}")
    print("golden.json is stale: run tests/chat/render_jinja2.py --write")
    return 1


if __name__ == "__main__":
    sys.exit(main())
