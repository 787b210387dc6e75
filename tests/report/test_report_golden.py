"""The HTML pages byte for byte as the f-string pages wrote them (golden_pages.py): moving the
markup into templates changed no byte, escaping of hostile strings included."""

from __future__ import annotations

import pytest

from golden_pages import GOLDEN, PAGES, render

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("name", PAGES)
def test_page_equals_the_golden_file_byte_for_byte(name, tmp_path):
    (tmp_path / "pages").mkdir()
    (tmp_path / "work").mkdir()
    text = render(tmp_path / "pages", tmp_path / "work")[name]
    golden = (GOLDEN / name).read_text(encoding="utf-8")
    assert text == golden, f"{name} differs from tests/report/golden/{name}"
    assert "<script>" not in text  # every hostile string arrived escaped
