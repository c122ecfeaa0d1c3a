#!/usr/bin/env python3
"""Renders Jinja templates the way Hugging Face transformers renders chat
templates, as the reference for tandem's C++ renderer (common/chat).

Usage: render_reference.py JOBS.json RESULTS.json

JOBS.json is a list of {"template": str, "context": object, "now": unix
seconds (optional)}. RESULTS.json gets one entry per job: {"ok": true,
"output": str} or {"ok": false, "error": str}.

The environment matches transformers' _compile_jinja_template:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[loopcontrols]), raise_exception, strftime_now, and tojson
overridden with json.dumps(x, ensure_ascii=False, indent=indent,
separators=separators, sort_keys=sort_keys). strftime_now formats the job's
"now" in UTC so that both sides agree on the time.
"""
import datetime
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def render(job):
    now = datetime.datetime.fromtimestamp(job.get("now", 0), tz=datetime.timezone.utc)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return now.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        template = env.from_string(job["template"])
        return {"ok": True, "output": template.render(**job.get("context", {}))}
    except Exception as e:  # any template failure is an expected outcome
        return {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        jobs = json.load(f)
    results = [render(job) for job in jobs]
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
