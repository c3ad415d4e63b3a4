"""Every command and option the documents name exists: each `pal …`,
`pal-solver …` and `pal-paper …` in a code span or a code block of README,
CONTRIBUTING and docs/ is walked down the three tools' click commands, and
each `--option` it gives must be one of that command's."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from helpers import committed, committed_files

from palpaper.cli import main as paper_main
from pipeline.cli import main as pal_main
from solver.cli import main as solver_main

TOOLS = {"pal": pal_main, "pal-solver": solver_main, "pal-paper": paper_main}
DOCS = ["README.md", "CONTRIBUTING.md"] + [
    f for f in committed_files("docs") if f.endswith(".md")
]
SPAN = re.compile(r"`([^`\n]+)`")
START = re.compile(r"(?:^|[\s$(])(pal-solver|pal-paper|pal)\s+(?=[a-z-])")


def mentions(text: str) -> list[str]:
    """The command lines of `text`: code spans and code-block lines that
    hold a call of one of the tools (from the tool's name to the end)."""
    pieces, inside = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        if inside:
            pieces.append((line.split("#")[0], True))
        else:
            pieces += [(span, False) for span in SPAN.findall(line)]
    out = []
    for piece, block in pieces:
        if block:  # a block's command line starts with the tool
            piece = piece.strip().removeprefix("$ ")
            if START.match(" " + piece):
                out.append(piece)
            continue
        for match in START.finditer(piece):
            out.append(piece[match.start(1) :])
    return out


def resolve(line: str) -> tuple[str, list[str]]:
    """The command a line calls ('pal contracts verify') and the problems:
    an unknown command or an option the command does not have."""
    words = re.split(r"[\s;|&]+", line.strip())
    command: click.Command = TOOLS[words[0]]
    path, problems = [words[0]], []
    ctx = click.Context(command)
    for raw in words[1:]:
        word = raw.strip('`".,:)(')
        group = isinstance(command, click.Group)
        if group and not word.startswith("-") and not re.fullmatch(r"[a-z/-]+", word):
            break  # prose: "pal check's …"
        if group and not word.startswith("-"):
            # 'solve/evaluate': each must be a command; the walk goes on in the first
            subs = [command.get_command(ctx, w) for w in word.split("/")]
            sub = subs[0] if all(subs) else None
            if sub is None:
                if len(path) == 1:  # 'pal check' yes; prose after a group, no
                    problems.append(f"{' '.join(path)}: no command '{word}'")
                break
            command, path = sub, [*path, word]
            ctx = click.Context(command, parent=ctx)
            continue
        if word.startswith("--") and len(word) > 2:
            name = word.split("=")[0].rstrip("…")
            known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
            if name not in known | {"--help", "--version"}:
                problems.append(f"{' '.join(path)}: no option {name}")
    return " ".join(path), problems


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_and_option_a_doc_names_exists(doc: str) -> None:
    found = [p for line in mentions(committed(doc)) for p in resolve(line)[1]]
    assert found == []


def test_the_walk_finds_commands_and_refuses_what_is_not_there() -> None:
    text = (
        "Run `pal contracts verify --all` or\n```bash\n"
        "pal-paper run missing --cells text-0.1   # a cell\n```\n"
        "and `pal-paper collect missing --cells x`, `pal nosuch`,\n"
        "```\nprose that pal-paper draws, not a command\n```\n"
        "`pal-solver solve/evaluate --pipeline main`"
    )
    lines = mentions(text)
    assert [resolve(line)[0] for line in lines] == [
        "pal contracts verify",
        "pal-paper run",
        "pal-paper collect",
        "pal",
        "pal-solver solve/evaluate",
    ]
    assert [resolve(line)[1] for line in lines] == [
        [],
        [],
        ["pal-paper collect: no option --cells"],
        ["pal: no command 'nosuch'"],
        [],
    ]
    assert len([d for d in DOCS if Path(d).suffix == ".md"]) >= 6


# Options whose value is another kind of thing where they differ: `pal
# predict` writes one file and reads one weights file, where the stages write
# folders and `pal-solver evaluate` takes a weights file or folder.
OTHER_KIND = {("--out", "pal predict"), ("--weights", "pal predict")}


def _options() -> dict[str, list[tuple[str, str]]]:
    """Every long option of the three tools → (command, metavar) per use."""
    seen: dict[str, list[tuple[str, str]]] = {}

    def walk(command: click.Command, path: list[str]) -> None:
        ctx = click.Context(command)
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), [*path, name])
            return
        for p in command.params:
            if isinstance(p, click.Option) and not p.is_flag:
                meta = p.metavar or p.make_metavar(ctx)
                for opt in (o for o in p.opts if o.startswith("--")):
                    seen.setdefault(opt, []).append((" ".join(path), meta))

    for name, tool in TOOLS.items():
        walk(tool, [name])
    return seen


def test_an_option_shared_by_commands_takes_one_kind_of_value() -> None:
    """The same long option has the same metavar wherever it appears (a
    count is never a device list: `plan --cards N`, `run --gpus ID,…`)."""
    seen = _options()
    differ = {
        opt: sorted({m for c, m in uses if (opt, c) not in OTHER_KIND})
        for opt, uses in seen.items()
    }
    assert {o: m for o, m in differ.items() if len(m) > 1} == {}
    assert {m for _, m in seen["--out"]} == {"DIR", "FILE"}
    assert {m for _, m in seen["--gpus"]} == {"ID[,ID…]"}
    assert {m for _, m in seen["--cards"]} == {"N"}
    assert len([o for o, uses in seen.items() if len(uses) > 1]) >= 10
