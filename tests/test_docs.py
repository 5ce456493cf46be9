"""The README and docs/ link to each other, to the committed reports and to sections by
anchor; a page moved or a heading renamed must not leave a link to nothing."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(page: Path) -> str:
    """The page without its fenced code blocks, where a '#' or '[x](y)' is not markdown."""
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' dropped, spaces to '-'."""
    text = _prose(page)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


def _links(page: Path):
    for target in LINK.findall(_prose(page)):
        if not re.match(r"[a-z]+:", target):
            yield target


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for target in _links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and (dest.suffix != ".md" or anchor not in _anchors(dest)):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
    assert len(PAGES) > 5  # the docs/ pages were found


def test_every_committed_report_is_linked_from_the_docs():
    linked = {(page.parent / t.partition("#")[0]).resolve() for page in PAGES for t in _links(page)}
    reports = sorted((ROOT / "reports").glob("*.md"))
    assert reports
    orphans = [r.name for r in reports if r.resolve() not in linked]
    assert not orphans, orphans


def test_the_result_field_reference_names_exactly_the_fields_written():
    # A committed result read and written again by the current code: the fields a reader of
    # `--format json` gets today, against the table in docs/reports.md.
    import json

    from memprobe.result import Result

    text = (ROOT / "docs" / "reports.md").read_text()
    section = text.split("## The JSON result, field by field", 1)[1]
    documented = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            documented |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    data = json.loads((ROOT / "reports" / "gemma4-e2b-seq8192-b1-h100-8.json").read_text())
    written = Result.from_json(data).to_json()
    [comparison, *_] = written["comparisons"]
    row_fields = {k for row in comparison["rows"] for k in row}
    assert documented == row_fields, (sorted(documented - row_fields), sorted(row_fields - documented))
    top = section.split("| row field |", 1)[0]
    for key in written:
        assert f"`{key}`" in top, key
    for key in comparison["config"]:
        assert key in row_fields
