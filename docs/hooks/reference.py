"""MkDocs hook: the reference pages' generated parts, rendered from the code at every build.

A page holds a marker line, `<!-- generated: NAME -->`, where the part goes:

- `settings`: every field of `countersign.Settings` (variable, type, default, what it does, whether
  production requires it), from the model's own `Field(description=...)`;
- `cli`: the help of the `countersign` command and of each subcommand, from the argparse parser;
- `bench-latest`: the newest section of `bench/results/SUMMARY.md` (the bench's own write-up).

It also publishes the bench's chart, `bench/results/latency.png`, as `images/bench-latency.png`.

A settings field without a description raises `UndocumentedSetting`, which fails the build, so the
model stays the one place a setting is documented. An unknown marker fails it too.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from pydantic.fields import FieldInfo

from countersign.ops.cli import parser
from countersign.settings import Settings

_MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
_QUALIFIED = re.compile(r"\b(?:[A-Za-z_][\w]*\.)+([A-Za-z_]\w*)")


class UndocumentedSetting(ValueError):
    """A settings field has no description: document it in `countersign/settings.py`."""


def _type(field: FieldInfo) -> str:
    annotation: Any = field.annotation
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    return _QUALIFIED.sub(r"\1", text).replace("NoneType", "None")


def _bounds(field: FieldInfo) -> str:
    signs = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    parts = [
        f"{sign} {getattr(item, name)}"
        for item in field.metadata
        for name, sign in signs.items()
        if getattr(item, name, None) is not None
    ]
    return f" ({', '.join(parts)})" if parts else ""


def _default(field: FieldInfo) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if value is None or value in ((), [], {}):
        return "—"
    return f"`{value if not isinstance(value, bool) else str(value).lower()}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_table(model: type[Settings] = Settings) -> str:
    """The settings reference as a Markdown table; UndocumentedSetting for a field with no description."""
    missing = [name.upper() for name, field in model.model_fields.items() if not (field.description or "").strip()]
    if missing:
        raise UndocumentedSetting(
            "settings without a description (add Field(description=...) in countersign/settings.py): "
            + ", ".join(missing)
        )
    rows = ["| variable | type | default | production | what it does |", "|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        production = str(extra.get("production", ""))
        rows.append(
            f"| `{name.upper()}` | `{_type(field)}`{_bounds(field)} | {_default(field)} | {_cell(production)} "
            f"| {_cell(field.description or '')} |"
        )
    return "\n".join(rows)


def _commands(command: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [command]
    for action in command._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_commands(sub))
    return found


def cli_reference(root: argparse.ArgumentParser | None = None) -> str:
    """Every command's `--help`, in the parser's order, one section each."""
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal; a build has none
    sections = []
    for command in _commands(root or parser()):
        sections.append(f"### `{command.prog}`\n\n```text\n{command.format_help().rstrip()}\n```")
    return "\n\n".join(sections)


REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "results"


def bench_latest() -> str:
    """The last `## ` section of the bench's SUMMARY.md, its headings one level down."""
    summary = (BENCH / "SUMMARY.md").read_text(encoding="utf-8")
    section = "## " + summary.rsplit("\n## ", 1)[1]
    return re.sub(r"^(#+) ", r"#\1 ", section, flags=re.MULTILINE).rstrip()


_PARTS: dict[str, Callable[[], str]] = {"settings": settings_table, "cli": cli_reference, "bench-latest": bench_latest}


def render(markdown: str) -> str:
    """`markdown` with each marker line replaced by its generated part (ValueError for an unknown one)."""

    def part(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in _PARTS:
            raise ValueError(f"unknown generated part {name!r} (known: {', '.join(_PARTS)})")
        return _PARTS[name]()

    return _MARKER.sub(part, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return render(markdown)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, "images/bench-latency.png", abs_src_path=str(BENCH / "latency.png")))
    return files
