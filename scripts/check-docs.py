#!/usr/bin/env python3
"""Checks that the documentation still matches the tree it describes.

  scripts/check-docs.py [--bin DIR]             links and flags of every page
  scripts/check-docs.py --runnable PAGE         the page's command blocks, as a script

The pages are README.md, docs/**/*.md and the READMEs under deploy/ and
clients/. Two checks:
  - every relative link resolves: the file or folder exists, and an anchor
    (#section) names a heading of the page it points to;
  - every --flag written after a tandem program (`tandem-decode
    --nokv_checksums`, in a command block or inline) is one that program
    accepts: its --helpfull lists it (--noX for a boolean X counts).
A program the build makes (an add_executable) that DIR (build/bin) does
not hold is an error too; other names (tandem-cuda, an image) are not
programs.

With --runnable, prints the ```sh blocks of PAGE in order, except a block
right after an HTML comment starting "<!-- not run" (which says why), for a
test to run against a local cluster (tests/e2e/docs_quickstart_test.sh).
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # a link or an image
PROGRAM_NAME = re.compile(r"^tandem-[a-z][a-z-]*[a-z]$")
FLAG = re.compile(r"^--([A-Za-z][A-Za-z0-9_-]*)")
SEPARATORS = {"|", "||", "&&", ";", "&", ">", "<", "2>", "2>&1", "$("}
# Words that may stand before a command's program.
PREFIXES = {"time", "sudo", "nice", "exec", "env", "taskset", "numactl", "gdb", "--args", "-c"}


def pages():
    found = [ROOT / "README.md"]
    for base in ("docs", "deploy", "clients"):
        found += sorted((ROOT / base).rglob("*.md")) if (ROOT / base).is_dir() else []
    return [p for p in found if p.is_file() and "node_modules" not in p.parts]


def slug(heading):
    """The anchor a Markdown renderer gives a heading, as GitHub makes it."""
    text = re.sub(r"`|\*\*|\*|_(?=\w)|(?<=\w)_", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def split(text):
    """Yields (line number, line, inside a fenced block, the block's info)."""
    fence, info = None, ""
    for n, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^\s*(```+|~~~+)(.*)$", line)
        if m and fence is None:
            fence, info = m.group(1), m.group(2).strip()
            yield n, line, None, info
            continue
        if m and fence is not None and m.group(1).startswith(fence[:3]) and not m.group(2).strip():
            fence = None
            yield n, line, None, info
            continue
        yield n, line, fence is not None, info


def anchors(page, cache={}):
    if page not in cache:
        seen, out = {}, set()
        for _, line, fenced, _ in split(page.read_text()):
            m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            s = slug(m.group(1))
            k = seen.get(s, 0)
            seen[s] = k + 1
            out.add(s if k == 0 else f"{s}-{k}")
        for m in re.finditer(r'<a\s+(?:name|id)="([^"]+)"', page.read_text()):
            out.add(m.group(1))
        cache[page] = out
    return cache[page]


def check_links(page, problems):
    for n, line, fenced, _ in split(page.read_text()):
        if fenced is not False:
            continue
        prose = re.sub(r"`[^`]*`", "", line)
        for m in LINK.finditer(prose):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{n}"
            if not dest.exists():
                problems.append(f"{where}: link to {target}: {path} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: link to {target}: {dest.name} has no heading #{anchor}")


class Flags:
    """The flags each program accepts, from its --helpfull."""

    def __init__(self, bin_dir):
        self.bin_dir = bin_dir
        self.known = {}
        # The programs the build makes, from their add_executable lines.
        self.programs = set()
        for cmake in ROOT.rglob("CMakeLists.txt"):
            if "build" in cmake.relative_to(ROOT).parts[0]:
                continue
            self.programs |= set(re.findall(r"add_executable\((tandem-[a-z-]+)", cmake.read_text()))

    def of(self, program):
        if program not in self.known:
            exe = self.bin_dir / program
            if not exe.is_file():
                self.known[program] = None
            else:
                args = [str(exe), "generate", "--helpfull"] if program == "tandem-cli" else [
                    str(exe), "--helpfull"]
                out = subprocess.run(args, capture_output=True, text=True, timeout=60,
                                     stdin=subprocess.DEVNULL)
                names = re.findall(r"^\s+--([a-z0-9_]+)", out.stdout + out.stderr, re.M)
                self.known[program] = set(names) | {"help", "helpfull", "version"}
        return self.known[program]


def commands(page):
    """(line number, text) of each command line of a block (joined over
    backslash continuations) and of each inline code span."""
    pending, start = "", 0
    for n, line, fenced, info in split(page.read_text()):
        if fenced:
            if not pending:
                start = n
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            yield start, pending + line
            pending = ""
        elif fenced is False:
            for span in re.findall(r"`([^`]+)`", line):
                yield n, span


def program_runs(text):
    """(program, its arguments) for each command of `text` that runs a
    tandem program: its first word (after environment assignments and
    words such as `time`), or the first after a `|`, `&&` or `;`."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        words = text.split()
    runs, i, start = [], 0, True
    while i < len(words):
        w = words[i]
        if w in SEPARATORS:
            start = True
        elif start and (w in PREFIXES or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)
                        or re.match(r"^-?[0-9.]+$", w)):
            pass
        elif start:
            start = False
            name = os.path.basename(w)
            if PROGRAM_NAME.match(name):
                args = []
                while i + 1 < len(words) and words[i + 1] not in SEPARATORS:
                    i += 1
                    args.append(words[i])
                runs.append((name, args))
        i += 1
    return runs


def check_flags(page, flags, problems):
    for n, text in commands(page):
        for program, args in program_runs(text):
            if program not in flags.programs:
                continue  # a folder, image or resource named tandem-...
            where = f"{page.relative_to(ROOT)}:{n}"
            known = flags.of(program)
            if known is None:
                problems.append(f"{where}: {program} is not built in {flags.bin_dir}")
                continue
            for raw in args:
                if any(c.isspace() for c in raw):
                    continue  # a quoted value, such as --router_args "--x 2"
                f = FLAG.match(raw.strip("[]()`,"))
                if not f:
                    continue
                name = f.group(1).replace("-", "_")
                if name in known or (name.startswith("no") and name[2:] in known):
                    continue
                problems.append(f"{where}: {program} has no flag --{f.group(1)}")


def runnable(page):
    skip, out = False, []
    block = None
    for _, line, fenced, info in split(page.read_text()):
        if fenced is None:
            if block is None:
                block = [] if info in ("sh", "bash", "shell") and not skip else False
                skip = False
            else:
                if block:
                    out.append("\n".join(block))
                block = None
            continue
        if fenced and block is not False and block is not None:
            block.append(line)
        elif fenced is False and line.strip():
            skip = line.strip().startswith("<!-- not run")
    return "\n\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    parser.add_argument("--runnable", metavar="PAGE")
    args = parser.parse_args()
    if args.runnable:
        sys.stdout.write(runnable(Path(args.runnable)))
        return 0
    problems = []
    flags = Flags(Path(args.bin))
    checked = pages()
    for page in checked:
        check_links(page, problems)
        check_flags(page, flags, problems)
    for p in problems:
        print(p)
    print(f"check-docs: {len(checked)} pages, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
