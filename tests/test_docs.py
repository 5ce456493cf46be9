"""The README and docs/ link to each other, to the committed reports and to sections by
anchor; a page moved or a heading renamed must not leave a link to nothing, and a table
copied from a report must not outlive the report's figures."""

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
    import dataclasses
    import json

    from memprobe.model import PRESETS
    from memprobe.model_file import model_mapping
    from memprobe.result import Result

    text = (ROOT / "docs" / "reports.md").read_text()
    section = text.split("## The JSON result, field by field", 1)[1]
    documented = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            documented |= set(re.findall(r"`([a-z_]+)`", line.split("|")[1]))
    data = json.loads((ROOT / "reports" / "gemma4-e2b-seq8192-b1-h100-8.json").read_text())
    result = Result.from_json(data)
    # A model file's row carries its sizes too (a preset's leaves the key out).
    m0 = result.measurements[0]
    result.measurements[0] = dataclasses.replace(
        m0, model=f"{m0.model}-file", model_config=model_mapping(PRESETS[m0.model]))
    written = result.to_json()
    row_fields = {k for comparison in written["comparisons"] for row in comparison["rows"] for k in row}
    comparison = written["comparisons"][-1]
    assert "model_config" not in comparison["rows"][0]
    assert documented == row_fields, (sorted(documented - row_fields), sorted(row_fields - documented))
    top = section.split("| row field |", 1)[0]
    for key in written:
        assert f"`{key}`" in top, key
    for key in comparison["config"]:
        assert key in row_fields


# Doc columns and the frame column each one shows, at the two decimals the docs use.
_DOC_COLUMNS = {"peak GiB": "peak_gib", "host GiB": "host_gib", "XLA peak GiB": "xla_peak_gib",
                "temp GiB": "temp_gib", "args GiB": "argument_gib", "vs unrolled": "delta_gib"}


def _strategy_tables(page: Path):
    """Each markdown table with a strategy and a peak GiB column, with the committed report
    linked in the lines just above it (the table's stated source)."""
    lines = page.read_text().splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or "strategy" not in cells or "peak GiB" not in cells:
            continue
        if i and lines[i - 1].startswith("|"):
            continue  # not a header row
        linked = [m for back in lines[max(0, i - 10):i] for m in re.findall(r"(reports/[\w.-]+)\.md", back)]
        rows = []
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            rows.append(dict(zip(cells, (c.strip() for c in row.strip().strip("|").split("|")))))
        yield i + 1, linked[-1] if linked else None, cells, rows


def test_the_docs_strategy_tables_carry_their_reports_figures():
    # The headline tables are copied into the README and docs/findings.md by hand; a report
    # compiled again (new jax, a model fix) must not leave them quoting old figures.
    import memprobe

    checked = 0
    for page in PAGES:
        for line, source, cells, rows in _strategy_tables(page):
            where = f"{page.relative_to(ROOT)}:{line}"
            assert source, f"{where}: a strategy table with no report linked above it"
            frame = memprobe.frame(memprobe.load(ROOT / f"{source}.json"))
            assert rows, where
            for row in rows:
                strategy = row["strategy"].strip("`*")
                # A report of several configurations: the table names the one of each row.
                picked = frame[frame["strategy"] == strategy]
                for column, field in (("parameters", "param_dtype"), ("optimizer", "optimizer")):
                    if column in row:
                        picked = picked[picked[field] == row[column].strip("`")]
                assert len(picked) == 1, f"{where}: {strategy} is {len(picked)} rows of {source}.json, not one"
                [found] = picked.to_dict("records")
                for column, field in _DOC_COLUMNS.items():
                    if column in row:
                        shown = float(row[column].replace("+", ""))
                        assert f"{shown:.2f}" == f"{found[field] + 0:.2f}".replace("-0.00", "0.00"), \
                            f"{where}: {strategy} {column} {row[column]}, the report has {found[field]:.4f}"
                checked += 1
    assert checked >= 40  # README's table, findings' E2B, E4B, seq 8192 and H100 tables
