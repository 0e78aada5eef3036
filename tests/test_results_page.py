"""docs/results.md and the README's headline table quote only recorded figures: every number in
a paragraph of docs/results.md, in a row of its Status table or in a row of the README's
headline table is found in a benchmark result file (benchmarks/results/*.json) that the same
paragraph or row names, to the precision the page prints it. Command lines and file names sit in
backticks and are not figures; names such as Llama-3 or all-MiniLM-L6-v2 are not either (a digit
glued to a letter or a hyphen). Each headline row has exactly one figure and links its file.
Every relative link in README.md and docs/*.md resolves. Each check has a negative control that
the same function rejects."""
import json
import math
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
RESULTS = os.path.join(ROOT, "docs", "results.md")

CITED = re.compile(r"benchmarks/results/([A-Za-z0-9_.\-]+\.json)")
# A figure: digits with optional thousands separators, decimals or an exponent, bare or with a
# unit (x, s, ms, min, GiB, MiB, GB, MB, %). Not a figure: digits glued to a letter, slash or dot
# before them (Qwen2, v5e, 0.2.5), after a letter and a hyphen (Llama-3, v5e-64), followed by a
# hyphen and a letter (2-core) or by letters that are no unit (SmolLM2-135M, 19M). The upper end
# of a range (24-31%) is a figure.
FIGURE = re.compile(
    r"(?<![\w/.])(?<![A-Za-z]-)(?<!\d,)"
    r"(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(e[-+]?\d+)?"
    r"(?!\d)(?![,.]\d)(?!-[A-Za-z])"
    r"(?=(?:x|s|ms|min|GiB|MiB|GB|MB|%)?(?![A-Za-z]))"
    r"(%|\s?GiB|\s?MiB)?")
# Units a result file may hold in another form: a percentage as a fraction, GiB / MiB as bytes.
SCALES = {"%": 0.01, "GiB": 2.0 ** 30, "MiB": 2.0 ** 20}


def table_rows(text: str, heading: str) -> list:
    """The cells of every row of the first table under `heading` (a '## ' line), header left out."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 5)
    rows = []
    for line in text[start:end if end > 0 else None].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and not set(cells[0]) <= set("-: "):
            rows.append(cells)
    return rows[1:]  # the header row


def status_rows(text: str) -> list:
    """(area, state) of every row of the table under '## Status'."""
    return [(cells[0], "|".join(cells[1:])) for cells in table_rows(text, "Status")]


def paragraphs(text: str) -> list:
    """The prose paragraphs of a page: blank-line separated, headings, tables and code left out."""
    text = re.sub(r"```.*?```", "\n\n", text, flags=re.S)
    return [p for p in re.split(r"\n\s*\n", text)
            if p.strip() and not p.lstrip().startswith(("#", "|"))]


def figures(cell: str) -> list:
    """(text, value, half of the last printed digit, unit or '') of each figure in `cell`,
    backtick spans left out."""
    plain = re.sub(r"`[^`]*`", " ", cell)
    out = []
    for m in FIGURE.finditer(plain):
        whole, frac, exp = m.group(1), m.group(2) or "", m.group(3) or ""
        unit = (m.group(4) or "").strip()
        value = float(whole.replace(",", "") + frac + exp)
        decimals = len(frac) - 1 if frac else 0
        half = 0.5 * 10.0 ** (-decimals) * (10.0 ** int(exp[1:]) if exp else 1.0)
        out.append((m.group(0), value, half, unit))
    return out


def numbers(obj) -> list:
    """Every number in a JSON value (bools left out)."""
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in numbers(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in numbers(v)]
    if isinstance(obj, (int, float)) and not isinstance(obj, bool) and math.isfinite(obj):
        return [float(obj)]
    return []


def row_problems(state: str, results_dir: str) -> list:
    """Why a row's figures are not all backed by the result files it names (empty: backed)."""
    figs = figures(state)
    names = sorted(set(CITED.findall(state)))
    if figs and not names:
        return [f"figures {[f[0] for f in figs]} but no benchmarks/results/ file named"]
    pool, problems = [], []
    for name in names:
        path = os.path.join(results_dir, name)
        if not os.path.exists(path):
            problems.append(f"{name} does not exist")
            continue
        with open(path) as f:
            pool += numbers(json.load(f))
    for text, value, half, unit in figs:
        scales = (1.0, SCALES[unit]) if unit else (1.0,)
        # Magnitudes: the text's sign ('-0.012', 'down 0.012') is not part of the figure.
        if not any(abs(abs(x) - value * k) <= half * k * (1 + 1e-9) for x in pool
                   for k in scales):
            problems.append(f"{text!r} is in none of {names}")
    return problems


def test_every_status_figure_is_in_a_result_file_the_row_names():
    with open(RESULTS) as f:
        rows = status_rows(f.read())
    assert len(rows) >= 8, rows
    results = os.path.join(ROOT, "benchmarks", "results")
    bad = {area: p for area, state in rows if (p := row_problems(state, results))}
    assert not bad, bad
    # The table quotes figures at all (a table without numbers would pass trivially).
    assert sum(len(figures(state)) for _, state in rows) >= 10


def test_every_figure_of_the_results_prose_is_in_a_result_file_the_paragraph_names():
    with open(RESULTS) as f:
        paras = paragraphs(f.read())
    results = os.path.join(ROOT, "benchmarks", "results")
    bad = {p[:60]: probs for p in paras if (probs := row_problems(p, results))}
    assert not bad, bad
    assert sum(len(figures(p)) for p in paras) >= 10


LINK = re.compile(r"\]\(([^)\s]+)\)")


def headline_problems(cells: list, results_dir: str) -> list:
    """Why a README headline row (result, figure, linked file) is not one recorded figure."""
    if len(cells) != 3:
        return [f"{len(cells)} cells, not 3 (result | figure | file)"]
    problems = []
    if len(figures(cells[1])) != 1:
        problems.append(f"{cells[1]!r} is not one figure")
    links = LINK.findall(cells[2])
    if len(links) != 1 or not CITED.fullmatch(links[0]):
        problems.append(f"{cells[2]!r} does not link one benchmarks/results/ file")
    return problems + row_problems(" | ".join(cells), results_dir)


def test_the_readme_headline_table_is_one_recorded_figure_a_row():
    with open(README) as f:
        rows = table_rows(f.read(), "Results")
    assert 5 <= len(rows) <= 8, rows
    results = os.path.join(ROOT, "benchmarks", "results")
    bad = {cells[0]: p for cells in rows if (p := headline_problems(cells, results))}
    assert not bad, bad


@pytest.fixture
def result_dir(tmp_path):
    with open(tmp_path / "x-20260101T000000Z.json", "w") as f:
        json.dump({"figures": {"ratio": 2.3412, "tok_s": 1081.4, "share": 0.614,
                               "n": 1000000}}, f)
    with open(tmp_path / "y-20260101T000000Z.json", "w") as f:
        json.dump({"figures": {"flag": True}}, f)
    return str(tmp_path)


def test_figures_match_to_the_printed_precision(result_dir):
    cite = "`benchmarks/results/x-20260101T000000Z.json`"
    assert row_problems(f"works: 2.34x, 1,081 tok/s, 61% at 1e6 users ({cite})", result_dir) == []
    # Names and commands are not figures.
    assert figures("Llama-3, Qwen2/2.5, all-MiniLM-L6-v2 on v5e-64, a 2-core CPU, "
                   "SmolLM2-135M-Instruct, a 19M model, `pytest -n 8`") == []
    # Both ends of a range are figures.
    assert [f[0] for f in figures("decode at 24-31% of the roofline, 2.10-2.27x")] == [
        "24", "31%", "2.10", "2.27"]
    # GiB as the bytes a result file holds.
    with open(os.path.join(result_dir, "z-20260101T000000Z.json"), "w") as f:
        json.dump({"figures": {"temp": 23142752680}}, f)
    zcite = "`benchmarks/results/z-20260101T000000Z.json`"
    assert row_problems(f"21.55 GiB ({zcite})", result_dir) == []
    assert row_problems(f"21.56 GiB ({zcite})", result_dir)


def test_negative_controls_a_figure_not_recorded_is_refused(result_dir):
    cite = "`benchmarks/results/x-20260101T000000Z.json`"
    # One digit further than recorded, a wrong figure, a boolean read as 1.
    assert row_problems(f"2.35x ({cite})", result_dir)
    assert row_problems(f"1,082 tok/s ({cite})", result_dir)
    assert row_problems(f"62% ({cite})", result_dir)
    assert row_problems("1 flag (`benchmarks/results/y-20260101T000000Z.json`)", result_dir)
    # The upper end of a range, and a figure written with thousands separators.
    assert row_problems(f"2.34-2.99x ({cite})", result_dir)
    assert row_problems(f"1,081-1,999 tok/s ({cite})", result_dir)
    # Figures without a named file, and a named file that does not exist.
    assert row_problems("works: 2.34x", result_dir)
    assert row_problems("2.34x (`benchmarks/results/missing.json`)", result_dir)
    # A paragraph is read like a row; headings, tables and code blocks are not paragraphs.
    text = f"# T\n\nworks: 2.34x ({cite})\n\n```\nrun 9.99x\n```\n\n| a | 7 |\n\nslow: 1.5x\n"
    assert [row_problems(p, result_dir) != [] for p in paragraphs(text)] == [False, True]


def test_negative_controls_a_headline_row_is_one_linked_recorded_figure(result_dir):
    link = "[x](benchmarks/results/x-20260101T000000Z.json)"
    assert headline_problems(["ratio", "2.34x", link], result_dir) == []
    assert headline_problems(["ratio", "2.34x and 1,081 tok/s", link], result_dir)  # two figures
    assert headline_problems(["ratio", "fast", link], result_dir)                   # none
    assert headline_problems(["ratio", "2.35x", link], result_dir)                  # not recorded
    assert headline_problems(["at 7 users", "2.34x", link], result_dir)             # unbacked
    assert headline_problems(["ratio", "2.34x", "`benchmarks/results/x-20260101T000000Z.json`"],
                             result_dir)                                             # no link
    assert headline_problems(["ratio", "2.34x", link.replace("x-2026", "w-2026")], result_dir)


def missing_citations(texts: dict, results_dir: str) -> list:
    """(document, file) for every benchmarks/results/ file a document names that does not exist."""
    return [(doc, name) for doc, text in texts.items() for name in sorted(set(CITED.findall(text)))
            if not os.path.exists(os.path.join(results_dir, name))]


def doc_texts() -> dict:
    """README.md and docs/*.md: relative path -> text."""
    docs = os.path.join(ROOT, "docs")
    texts = {}
    for path in [README] + [os.path.join(docs, n) for n in sorted(os.listdir(docs))
                            if n.endswith(".md")]:
        with open(path) as f:
            texts[os.path.relpath(path, ROOT)] = f.read()
    return texts


def test_every_result_file_the_docs_name_exists():
    texts = doc_texts()
    results = os.path.join(ROOT, "benchmarks", "results")
    assert not missing_citations(texts, results)
    assert sum(len(CITED.findall(t)) for t in texts.values()) >= 10
    # Negative control: a file that is not there is named.
    assert missing_citations({"x.md": "`benchmarks/results/gone-20260101T000000Z.json`"},
                             results) == [("x.md", "gone-20260101T000000Z.json")]


NOTEBOOK = re.compile(r"\b20\d\d-\d\d-\d\d\b|\bissue\s*#?\d+|\bold path\b|"
                      r"\bthis (evening|morning|afternoon)\b|\b\d\d:\d\d (UTC|idle)\b", re.I)


def notebook_phrases(text: str) -> list:
    """Dates, clock times, issue numbers and history phrases outside result-file names."""
    return [m.group(0) for m in NOTEBOOK.finditer(CITED.sub("", text))]


def test_docs_are_reference_not_a_lab_notebook():
    for doc, text in doc_texts().items():
        found = notebook_phrases(text)
        assert not found, (doc, found)
    # Negative controls: each kind is caught; a result file's date is not.
    for bad in ("run on 2026-12-04", "(issue 19 item 3)", "the old path", "this evening"):
        assert notebook_phrases(bad), bad
    assert notebook_phrases("`benchmarks/results/x-20261205T083540Z.json`") == []


def broken_links(texts: dict) -> list:
    """(document, target) for every relative Markdown link whose file does not exist, resolved
    from the document's folder (an #anchor ignored; web and mail links left out)."""
    out = []
    for doc, text in texts.items():
        for target in LINK.findall(re.sub(r"```.*?```", "", text, flags=re.S)):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = os.path.join(ROOT, os.path.dirname(doc), target.split("#")[0])
            if not os.path.exists(path):
                out.append((doc, target))
    return out


def test_every_relative_link_in_the_docs_resolves():
    texts = doc_texts()
    assert not broken_links(texts)
    assert sum(len(LINK.findall(t)) for t in texts.values()) >= 10
    # Negative controls: a missing file, and a link resolved from the wrong folder.
    assert broken_links({"README.md": "[x](docs/gone.md) [y](https://example.org)"}) == [
        ("README.md", "docs/gone.md")]
    assert broken_links({"docs/x.md": "[t](docs/train.md)"}) == [("docs/x.md", "docs/train.md")]
