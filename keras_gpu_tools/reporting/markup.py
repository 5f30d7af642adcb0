"""The HTML pieces the sections build their parts of the page from.

Prose written by the callbacks (verdicts, advice, findings, notes) marks code as Markdown does,
in backticks: `prose` renders it as ``<code>``. Plots come as PNG bytes and are embedded (`img`).
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Iterable, Sequence
from typing import Any

e = html.escape
_CODE_SPAN = re.compile(r"(`+)(.+?)\1(?!`)")  # a Markdown code span: `x`, or ``x`` (which may hold a `)


def prose(s: str) -> str:
    """`s` as HTML: escaped, its Markdown code spans (text in backticks) as ``<code>``."""
    out, at = [], 0
    for m in _CODE_SPAN.finditer(s):
        out += [e(s[at : m.start()]), f"<code>{e(m.group(2).strip())}</code>"]
        at = m.end()
    out.append(e(s[at:]))
    return "".join(out)


def img(pngs: dict[str, bytes], name: str, alt: str) -> str:
    """The figure `name` embedded ("" where the run has none)."""
    if name not in pngs:
        return ""
    b64 = base64.b64encode(pngs[name]).decode("ascii")
    return (
        f'<figure class="kgt-fig" data-figure="{e(name)}"><img alt="{e(alt)}" '
        f'src="data:image/png;base64,{b64}"/></figure>'
    )


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    h = "".join(f"<th>{e(str(c))}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{prose(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def bullets(items: Iterable[str]) -> str:
    return "<ul>" + "".join(f"<li>{prose(x)}</li>" for x in items) + "</ul>"
