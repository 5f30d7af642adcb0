"""The report's sections: each listed one is a `Section`, and a section added to the list shows in every view."""

import inspect
from typing import Any

import pytest

from keras_gpu_tools.logdir.writer import EventWriter
from keras_gpu_tools.reporting import drawing, registry
from keras_gpu_tools.reporting.markup import img, prose
from keras_gpu_tools.reporting.report import report
from keras_gpu_tools.reporting.section import BaseSection, Section

METHODS = ("from_callbacks", "from_logdir", "fill", "text", "html", "figures", "badges", "not_measured")
TAG = "tiny/count/data"


def test_every_listed_section_satisfies_the_protocol():
    names = [s.name for s in registry.SECTIONS]
    assert len(set(names)) == len(names) and all(names)
    for section in registry.SECTIONS:
        assert isinstance(section, Section), section
        assert isinstance(section.badge_rank, int) and isinstance(section.every_record, tuple)
        for method in METHODS:
            expected = list(inspect.signature(getattr(Section, method)).parameters)[1:]
            assert list(inspect.signature(getattr(section, method)).parameters) == expected, (section.name, method)


class Counter:
    """A source no listed section knows."""

    count = 3


class Tiny(BaseSection):
    """A section of the test's own: a count, from a `Counter` or a JSON tag, in every view."""

    name = "tiny"

    def from_callbacks(self, data, source: Any):
        if not isinstance(source, Counter):
            return None
        data.extra[self.name] = source.count
        return "Counter"

    def from_logdir(self, data, logs):
        count = logs.convert(data, TAG, int)
        if count is not None:
            data.extra[self.name] = count

    def fill(self, data, other):
        data.extra.setdefault(self.name, other.extra.get(self.name))

    def text(self, data):
        return ("Tiny", [f"count: {data.extra[self.name]}"]) if self.name in data.extra else None

    def html(self, data, pngs):
        if self.name not in data.extra:
            return []
        return ["<h3>Tiny</h3>", f"<p>{prose(f'count: `{data.extra[self.name]}`')}</p>", img(pngs, "tiny", "tiny")]

    def figures(self, data):
        if self.name not in data.extra:
            return {}
        fig, (ax,) = drawing.new_figure()
        ax.plot([0, 1], [0, data.extra[self.name]])
        return {"tiny": fig}

    def badges(self, data):
        return [(f"tiny: {data.extra[self.name]}", "info")] if self.name in data.extra else []

    def not_measured(self, data):
        return [] if self.name in data.extra else ["the tiny count (Counter)"]


@pytest.fixture
def tiny(monkeypatch):
    """The list of sections with the tiny one added: one line, as a new feature's section adds itself."""
    monkeypatch.setattr(registry, "SECTIONS", [*registry.SECTIONS, Tiny()])


def test_an_added_section_shows_in_the_text_and_the_html_from_callbacks(tiny):
    pytest.importorskip("matplotlib")
    r = report(Counter(), {"loss": [1.0, 0.5]})
    text = r.text()
    assert "From: Counter" in text
    assert text.index("Training curves") < text.index("Tiny\n----\ncount: 3")  # after the last listed section
    assert "the tiny count" not in text
    page = r.html()
    assert '<span class="kgt-badge kgt-info">tiny: 3</span>' in page
    assert "<h3>Tiny</h3><p>count: <code>3</code></p>" in page
    assert list(r.figures()) == ["training", "tiny"] and 'data-figure="tiny"' in page


def test_an_added_section_reads_a_log_dir_and_fills_what_the_callbacks_lack(tiny, tmp_path):
    w = EventWriter(str(tmp_path / "tiny"))
    w.json(TAG, 7, step=0)
    w.close()
    r = report(str(tmp_path))
    assert "Tiny\n----\ncount: 7" in r.text() and "<h3>Tiny</h3>" in r.html()
    both = report({"loss": [1.0]}, log_dir=str(tmp_path))
    assert both.data.extra["tiny"] == 7 and "count: 7" in both.text()


def test_without_the_section_nothing_of_it_shows(tmp_path):
    r = report(Counter(), {"loss": [1.0, 0.5]})
    assert "Tiny" not in r.text() and "tiny" not in r.html() and "Counter" not in r.text()
