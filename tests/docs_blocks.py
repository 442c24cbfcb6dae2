"""The fenced commands of README.md, docs/*.md and examples/*/README.md, as tests/test_docs.py runs them
(issue 37, item 4).

Every ```` ```bash ```` and ```` ```python ```` block is either run as written or excused in the Markdown by an
HTML comment on the line just before its fence, saying why::

    <!-- docs-test: not run: needs a Kubernetes cluster (e2e/test_cluster.py does this) -->

so that a block is never skipped silently: a new block without the comment is run, and fails the tier until it
works or is excused. Blocks of other languages (``json``, ``yaml``, ``text``, unlabelled) are data, not commands.

What running "as written" allows, and nothing more:

- the ports the docs use (8080, 8081, 7070, 7071, 8090) are rewritten to the tier's ephemeral ones, and an
  ``ovserve serve`` that names no ``--rest-port`` or ``--grpc-port`` is given the default it would bind first;
- a ``pip install NAME...`` line is not run (it would change the test environment): the distributions it names
  must be installed already, so that the block's other lines meet what a user would have after it;
- the answers a block shows are checked: in bash, a comment line that starts with ``{`` or ``[`` (continued by
  comment lines indented by two spaces or more) is printed by the commands above it; in Python, the comment on a
  ``print(...)`` line that starts with ``{``, ``[``, ``True`` or ``False``. ``...`` in an answer stands for
  anything, and whitespace is not compared.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the Markdown whose commands are run: the README, then docs/ in name order
SOURCES = ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
           *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*/README.md")))
LANGUAGES = ("bash", "python")
#: the ports the docs show, which the tier rewrites to its own
DOC_PORTS = (8080, 8081, 7070, 7071, 8090)

_FENCE = re.compile(r"^```(\S*)\s*$")
_EXCUSE = re.compile(r"^<!--\s*docs-test:\s*not run:\s*(?P<why>.+?)\s*-->\s*$")
_PIP_INSTALL = re.compile(r"^\s*pip install (?P<args>[^#]+?)\s*(#.*)?$")
_PRINT_ANSWER = re.compile(r"print\(.*\)\s+#\s+(?P<answer>(?:[{\[]|True\b|False\b).*)$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language and text, and why it is not run (None: it is run)."""

    source: str
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    excuse: str | None

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}"

    def answers(self) -> list[str]:
        """What the block shows it prints, in order."""
        found: list[str] = []
        continuing = False
        for line in self.text.splitlines():
            stripped = line.strip()
            if self.language == "bash":
                if stripped.startswith(("# {", "# [")):
                    found.append(stripped[2:])
                    continuing = True
                elif continuing and stripped.startswith("#  "):
                    found[-1] += stripped[1:].strip()
                else:
                    continuing = False
            else:
                match = _PRINT_ANSWER.search(line)
                if match:
                    found.append(match["answer"])
        return found

    def pip_installs(self) -> list[str]:
        """The distributions its ``pip install`` lines name (without extras or versions)."""
        names = []
        for line in self.text.splitlines():
            match = _PIP_INSTALL.match(line) if self.language == "bash" else None
            if match:
                for raw in match["args"].split():
                    arg = raw.strip("'\"")
                    if not arg.startswith("-"):
                        names.append(re.split(r"[\[<>=!~;]", arg, maxsplit=1)[0])
        return names

    def script(self, ports: dict[int, int]) -> str:
        """The text to run: the ports rewritten, ``pip install`` lines left out (see the module doc)."""
        lines = self.text.splitlines()
        if self.language == "bash":
            lines = [f"# (installed already) {line}" if _PIP_INSTALL.match(line) else line for line in lines]
        text = _default_ports("\n".join(lines) + "\n")
        return re.sub(r"(?<!\d)({})(?!\d)".format("|".join(map(str, ports))), lambda m: str(ports[int(m[1])]), text)

    def starts_servers(self) -> bool:
        """Whether it starts servers of its own (then it gets ports of its own)."""
        return self.language == "bash" and bool(re.search(r"\bovserve (serve|run|transformer|explainer)\b", self.text))


def _default_ports(text: str) -> str:
    """Each ``ovserve serve`` command (its ``\\`` continuation lines included) given the ports it binds by
    default, ``--rest-port 8080`` and ``--grpc-port 8081``, where it does not name them, so that they are
    rewritten as the others are (a server of the block's never binds the machine's real 8080)."""

    def complete(match: re.Match[str]) -> str:
        command = match[0]
        extra = [f"{flag} {port}" for flag, port in (("--rest-port", 8080), ("--grpc-port", 8081))
                 if flag not in command]
        return command.replace("ovserve serve", " ".join(["ovserve serve", *extra]), 1)

    return re.sub(r"ovserve serve(?:[^\n]*\\\n)*[^\n]*", complete, text)


def parse(source: str, markdown: str) -> list[Block]:
    """The bash and python blocks of one Markdown file."""
    blocks: list[Block] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        start, language = i, opening[1]
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        if language in LANGUAGES:
            before = next((line for line in reversed(lines[:start]) if line.strip()), "")
            excuse = _EXCUSE.match(before)
            blocks.append(Block(source, start + 1, language, "\n".join(lines[start + 1:i]),
                                excuse["why"] if excuse else None))
        i += 1
    return blocks


def all_blocks() -> list[Block]:
    return [b for source in SOURCES for b in parse(source, (ROOT / source).read_text(encoding="utf-8"))]


def matches(answer: str, output: str, start: int = 0) -> int | None:
    """Where ``answer`` (``...``: anything; whitespace ignored) ends in ``output`` from ``start``, or None."""
    pattern = ".*?".join(re.escape(part) for part in re.sub(r"\s+", "", answer).split("..."))
    found = re.compile(pattern, re.S).search(output, start)
    return found.end() if found else None


def unanswered(answers: list[str], output: str) -> list[str]:
    """The answers ``output`` does not show, in order (whitespace removed from both)."""
    text = re.sub(r"\s+", "", output)
    position, missing = 0, []
    for answer in answers:
        end = matches(answer, text, position)
        if end is None:
            missing.append(answer)
        else:
            position = end
    return missing
