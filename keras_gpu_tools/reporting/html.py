"""The report as an HTML page (or a notebook's HTML view), from a `ReportData` and its plots.

The page holds the title, the badges of every section, each section's HTML (its own, in
`keras_gpu_tools.reporting.sections`), what was not measured, and the notes. The plots come in as
PNG bytes (`figures.png`) and are embedded in the page.
"""

from __future__ import annotations

from keras_gpu_tools.reporting import registry, text
from keras_gpu_tools.reporting.markup import e, prose
from keras_gpu_tools.reporting.model import ReportData
from keras_gpu_tools.reporting.section import Badge

CSS = """<style>
.kgt-report{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;font-size:13px;max-width:900px;color:#222}
.kgt-report h2{margin:4px 0 2px 0;font-size:20px}
.kgt-report h3{margin:18px 0 6px 0;font-size:15px;border-bottom:1px solid #ddd;padding-bottom:2px}
.kgt-report table{border-collapse:collapse;margin:4px 0;font-size:12px}
.kgt-report th,.kgt-report td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
.kgt-report th{background:#f4f4f4}
.kgt-report figure{margin:6px 0}
.kgt-report img{max-width:100%}
.kgt-src{color:#777;margin:0}
.kgt-badge{display:inline-block;border-radius:10px;padding:2px 9px;margin:2px;font-size:12px;background:#eee}
.kgt-ok{background:#d9f2d9}.kgt-warn{background:#fff0c2}.kgt-bad{background:#f8d0d0}.kgt-info{background:#dde8f8}
</style>"""


def render(data: ReportData, pngs: dict[str, bytes], full_page: bool = False) -> str:
    """The report as HTML: a ``<div>`` for a notebook, or a whole page (`full_page`)."""
    parts = [f"<h2>{e(data.title)}</h2>"]
    if data.sources:
        parts.append(f'<p class="kgt-src">From: {e(", ".join(data.sources))}</p>')
    summary = badges(data)
    if summary:
        parts.append(
            '<p class="kgt-badges">'
            + " ".join(f'<span class="kgt-badge kgt-{cls}">{e(t)}</span>' for t, cls in summary)
            + "</p>"
        )
    for section in registry.SECTIONS:
        parts += section.html(data, pngs)
    missing = text.not_measured(data)
    if missing:
        parts.append(f'<p class="kgt-src">Not measured in this run: {prose("; ".join(missing))}.</p>')
    for n in data.notes:
        parts.append(f"<p><i>{prose(n)}</i></p>")
    body = f'<div class="kgt-report">{CSS}{"".join(p for p in parts if p)}</div>'
    if not full_page:
        return body
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{e(data.title)}</title></head>'
        f"<body>{body}</body></html>\n"
    )


def badges(data: ReportData) -> list[Badge]:
    """The summary at the top of the page: (text, kind) with kind one of ok, warn, bad, info; by the sections'
    badge rank, then in their order."""
    ranked = sorted(enumerate(registry.SECTIONS), key=lambda item: (item[1].badge_rank, item[0]))
    return [badge for _, section in ranked for badge in section.badges(data)]
