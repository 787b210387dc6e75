"""The HTML pages' templates: Jinja2, shipped in report/templates/, escaping on by default.

Every value a template writes is escaped unless it is a `markupsafe.Markup`; only the inline
SVG plots are (html.py says why they are safe). The escape is the standard library's
`html.escape(quote=True)`, the one the pages were written with before they were templates, so
a page keeps its bytes (`&quot;` and `&#x27;`, where markupsafe's own escape writes `&#34;` and
`&#39;`).

Layout: when a `.html.j2` template loads, each line break is dropped together with the next
line's indentation (`JoinLines`), so a template reads as nested markup while the page stays
the compact markup it always was. A newline the page itself needs is written `{{ "\\n" }}`;
a Jinja tag or expression never spans two lines.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from jinja2.ext import Extension
from markupsafe import Markup

_LAYOUT_BREAK = re.compile(r"\n[ \t]*")


class JoinLines(Extension):
    """Drop the layout line breaks of .html.j2 templates (other files, report.css, keep theirs)."""

    def preprocess(self, source: str, name: str | None, filename: str | None = None) -> str:
        return _LAYOUT_BREAK.sub("", source) if name and name.endswith(".html.j2") else source


def escape(value: Any) -> Markup:
    """The escape of every `{{ value }}`: a Markup passes as it is, anything else is text."""
    if hasattr(value, "__html__"):
        return Markup(value)
    return Markup(html.escape(str(value), quote=True))


@lru_cache(maxsize=1)
def environment() -> Environment:
    # finalize runs before autoescape's own escape, which leaves the Markup it returns alone
    return Environment(loader=PackageLoader("trainspeed.report", "templates"), autoescape=True,
                       finalize=escape, undefined=StrictUndefined, keep_trailing_newline=True,
                       extensions=[JoinLines])


def render(name: str, **context: Any) -> str:
    """The template `name` (in report/templates/) rendered with `context`."""
    return environment().get_template(name).render(**context)
