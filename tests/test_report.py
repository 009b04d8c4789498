"""The compile report: the page for a small compiled model holds what report.json, the manifest and
the tuning database say; a compile in progress gets a page from its database rows; bad folders
fail in one line; headless Chromium loads the page without errors."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html import escape
from pathlib import Path

import pytest
from click.testing import CliRunner

import kiln
from kiln.cli import main
from kiln.compiler.driver import compile_id_for
from kiln.report.page import write_report
from kiln.search.tunedb import TuneDB
from tests.helpers import tiny_llama

TITLE = "Kiln compile report: tiny-llama"   # the model's name, not its architecture


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """A 2-layer tiny Llama compiled for 8 s, with two rejected candidates added to its database
    (this small search rarely meets one by itself). Returns (artifact, db, report.json)."""
    root = tmp_path_factory.mktemp("report")
    out, db = root / "tiny", root / "tune.sqlite"
    kiln.compile_lm(tiny_llama(2), max_seq=32, budget="8s", db=db, out=out, progress=False, name="tiny-llama")
    report = json.loads((out / "report.json").read_text())
    decode = report["graphs"]["decode"]
    with TuneDB(db) as tdb:
        region = decode["regions"][0]["key"]
        tdb.record_candidate(decode["compile_id"], region, "feedface/inline12-bcast1", "nan",
                             detail="3 non-finite values <where the reference is finite>")
        tdb.record_candidate(decode["compile_id"], region, "c0ffee/inline4-bcast0", "crash",
                             detail="RuntimeError: boom")
    return out, db, report


@pytest.fixture(scope="module")
def page(compiled) -> tuple[Path, str]:
    path = write_report(compiled[0])
    return path, path.read_text()


def table_rows(html: str, after: str) -> list[list[str]]:
    """The cell texts of the first table after the text `after`."""
    table = html[html.index(after):]
    table = table[table.index("<table>"):table.index("</table>")]
    return [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)]


def test_page_shows_the_search_kernels_stages_and_hardware(compiled, page):
    out, _, report = compiled
    path, html = page
    assert path == out / "report.html"
    assert f"<title>{TITLE}</title>" in html
    manifest = json.loads((out / "manifest.json").read_text())
    assert escape(manifest["hardware"]["cpu"]) in html and manifest["hardware"]["gcc"] in html
    for name, graph in report["graphs"].items():
        assert f"Graph {name}" in html
        for region in graph["regions"]:
            assert f"Region {escape(region['label'])}" in html
            assert f"{escape(region['label'])}: best against candidates" in html
            for kernel in region["kernels"]:
                assert kernel["function"] in html and kernel["config"] in html
            for stage in region["stages"]:
                assert f"<td>{escape(stage['stage'])}</td>" in html
            if region["winner"].startswith("original/"):
                assert "The winner is the program as lowered: it uses no rewrite." in html
            else:   # the rewrites it needs, each a rule that fired
                fired = {name for stage in region["stages"] for name, n in stage["matches"].items() if n}
                assert set(region["rules"]) <= fired
                assert all(f"<li><code>{escape(name)}</code></li>" in html for name in region["rules"])
            # its finalists, fastest first, each with its rounds; the winner among them, tied
            # with the fastest (itself, or a program of fewer kernels the timing cannot tell from it)
            finalists = region["finalists"]
            assert [f["end_to_end_s"] for f in finalists] == sorted(f["end_to_end_s"] for f in finalists)
            won = next(f for f in finalists if f["key"] == region["winner"])
            assert won["tied"] and won["end_to_end_s"] == region["end_to_end_s"]
            assert f"<code>{escape(won['key'])}</code> <b>(winner)</b>" in html
            # ... and their rounds drawn, a strip a finalist, the winner's dots black
            section = html[html.index(f"Graph {name}"):]
            chart = section[section.index(f"{escape(region['label'])}: finalists&#x27; rounds"):]
            chart = chart[:chart.index("</svg>")]
            assert chart.count('<circle') + chart.count('<polygon') == sum(len(f["rounds"]) for f in finalists)
            assert chart.count('fill="#000000"') == len(won["rounds"])
            # a region whose run whole differs from its kernels' sum says why
            ratio = region["end_to_end_s"] / region["estimate_s"]
            if not 2 / 3 < ratio < 3 / 2:
                assert f"End to end is {ratio:.2f}x the estimate: " in html
    assert "whole graph: best against candidates" in html
    for name in report["graphs"]:                 # the search's rate, per region
        head, *rows = table_rows(html, f"Graph {name}")
        rate = head.index("candidates a minute")
        assert rows and all(float(row[rate]) > 0 for row in rows)
    assert html.count("<svg") >= 4 * len(report["graphs"])
    assert "Rules that fired in this region" in html and "Rewrites the winner uses" in html
    assert "<b>outer</b> = which output loop runs outermost" in html   # the configuration legend


def test_page_counts_rejected_candidates(compiled, page):
    _, _, report = compiled
    _, html = page
    rows = table_rows(html, "Candidates rejected")
    header, by_region = rows[0], {row[0]: row for row in rows[1:]}
    first = escape(report["graphs"]["decode"]["regions"][0]["label"])
    assert by_region[first][header.index("nan")] == "1"
    assert by_region[first][header.index("crash")] == "1"
    assert by_region["all regions"][header.index("wrong")] == "0"
    # details are escaped, never markup
    assert "3 non-finite values &lt;where the reference is finite&gt;" in html
    assert "<where the reference" not in html


def test_page_is_self_contained(page):
    _, html = page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    for fetch in ("<script", "<link", "<img", "@import", "url("):
        assert fetch not in html


def test_a_missing_database_is_said_not_failed(compiled, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(compiled[0], out)
    report = json.loads((out / "report.json").read_text())
    for graph in report["graphs"].values():
        graph["db"] = str(tmp_path / "gone.sqlite")
    (out / "report.json").write_text(json.dumps(report))
    html = write_report(out, tmp_path / "page.html").read_text()
    assert f"the tuning database {tmp_path / 'gone.sqlite'} is missing" in html
    assert not (tmp_path / "gone.sqlite").exists()        # a report never creates a database


def test_a_compile_in_progress_gets_a_page_from_its_database(tmp_path):
    out, db = tmp_path / "model", tmp_path / "tune.sqlite"
    compile_id = compile_id_for(out, False, "test", db)
    assert json.loads((tmp_path / ".model.kiln-compile.json").read_text())["db"] == str(db)
    with TuneDB(db) as tdb:
        for key, status, estimate in [("original/a", "ok", 4e-6), ("x1/a", "wrong", None),
                                      ("x2/a", "ok", 3e-6), ("x3/a", "timeout", None)]:
            tdb.record_candidate(f"{compile_id}:decode", "feed01", key, status, estimate)
        tdb.record_candidate(f"{compile_id}:prefill", "feed02", "original/a", "ok", 9e-6)
        tdb.record_candidate("another-compile:decode", "feed01", "x9/a", "crash")
    path = write_report(out)
    assert path == tmp_path / "model.report.html" and not out.exists()
    html = path.read_text()
    assert "(in progress)" in html and "Graph decode" in html and "Graph prefill" in html
    rows = table_rows(html, "Graph decode")
    assert rows[1] == ["region feed01", "4", "2", "4 µs", "3 µs", "1.33x"]
    rejected = table_rows(html, "Candidates rejected")
    header, total = rejected[0], rejected[-1]
    assert [total[header.index(s)] for s in ("ok", "wrong", "timeout", "crash")] == ["2", "1", "1", "0"]


def test_cli_report_prints_the_path_and_fails_in_one_line(compiled, tmp_path):
    runner = CliRunner()
    result = runner.invoke(main, ["report", str(compiled[0]), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(tmp_path / "r.html") and (tmp_path / "r.html").is_file()
    for folder, says in [(tmp_path / "nowhere", "does not exist and no compile is writing to it"),
                         (tmp_path, "is not a Kiln artifact (it has no manifest.json)"),
                         (tmp_path / "r.html", "is not a folder")]:
        result = runner.invoke(main, ["report", str(folder)])
        assert result.exit_code == 1 and result.output.startswith("kiln: ") and says in result.output
        assert len(result.output.strip().splitlines()) == 1


def chromium() -> str:
    """Debian's chromium, installed here if need be; the test is skipped where it cannot be."""
    found = shutil.which("chromium")
    if found:
        return found
    if not shutil.which("apt-get") or os.geteuid() != 0:
        pytest.skip("chromium is not installed and cannot be installed here (needs apt-get as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    why = ""
    for commands in ([["apt-get", "install", "-y", "chromium"]],
                     [["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]]):
        try:
            for command in commands:
                done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
                why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        except subprocess.TimeoutExpired:
            why = "apt-get took over 10 minutes"
        if shutil.which("chromium"):
            return shutil.which("chromium")
    pytest.skip(f"chromium could not be installed: {why}")


def test_headless_chromium_loads_the_page(page, tmp_path):
    path, _ = page
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
               f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,4000"]
    dom = subprocess.run([*command, "--dump-dom", path.as_uri()], capture_output=True, text=True,
                         timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f"<title>{TITLE}</title>" in dom.stdout and "Candidates rejected" in dom.stdout
    for error in ("Uncaught", "net::ERR_", "Failed to load resource"):
        assert error not in dom.stderr, dom.stderr[-2000:]
    shot = tmp_path / "report.png"
    done = subprocess.run([*command, "--hide-scrollbars", f"--screenshot={shot}", path.as_uri()],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]


def test_a_region_far_from_its_estimate_says_why():
    from kiln.report.page import _gap
    assert _gap(1e-3, 1.2e-3) == ""
    slower, faster = _gap(1e-3, 5.5e-3), _gap(3e-3, 1e-3)
    assert "5.50x the estimate" in slower and "between the kernels" in slower
    assert "0.33x the estimate" in faster and "cold cache" in faster
