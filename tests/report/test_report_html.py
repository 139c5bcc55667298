"""The HTML report: read back without a browser (figure JSON and summary cells equal the plan's JSON),
and in headless Chromium with selenium (no console errors, every plot drawn, screenshot not blank),
skipped, saying why, when Debian's chromium/chromedriver or selenium are missing. Also the CLI's bad
input, and progress on a pseudo-terminal but not through a pipe."""
from __future__ import annotations

import html
import json
import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from plans import plan

from meshplan.report_figures import rank_memory_bytes

PLOTS = {"memory", "time", "schedule", "mesh", "alternatives"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    plans = [plan("dense"), plan("moe")]
    path = plans[0].to_html(tmp_path_factory.mktemp("r") / "one.html")
    from meshplan.report_html import to_html

    both = to_html(plans, path.with_name("both.html"))
    return plans, path, both


def _figures(text: str) -> list[tuple[str, dict]]:
    found = re.findall(r'<script type="application/json" class="figure" data-target="[^"]+" data-plot="(\w+)">(.*?)'
                       r"</script>", text, re.S)
    return [(name, json.loads(body)) for name, body in found]


def _traces(fig: dict) -> dict[str, dict]:
    return {t["meta"]: t for t in fig["data"]}


def _check_plan_figures(figs: dict[str, dict], p) -> None:
    pred = p.prediction
    assert set(figs) == PLOTS
    mem = _traces(figs["memory"])
    ranks = rank_memory_bytes(p)
    assert len(ranks) == p.mesh.pp
    for kind in ("params", "grads", "optimizer", "activations", "buffers"):
        assert mem[kind]["y"] == pytest.approx([r[kind] / 1e9 for r in ranks], rel=1e-12)
    peak = max(range(len(ranks)), key=lambda i: sum(ranks[i].values()))
    assert sum(mem[k]["y"][peak] for k in pred.memory_bytes) == pytest.approx(pred.peak_memory_bytes / 1e9, rel=1e-9)
    assert mem["limit"]["y"][0] == pytest.approx(pred.memory_limit_bytes / 1e9)
    t = _traces(figs["time"])
    assert {k: t[k]["x"][0] for k in pred.time_s} == pytest.approx({k: v * 1e3 for k, v in pred.time_s.items()})
    s = _traces(figs["schedule"])
    ops = p.num_microbatches * p.mesh.pp * p.vp
    assert len(s["F"]["x"]) == ops and len(s["B"]["x"]) == ops
    assert max(b + x for b, x in zip(s["B"]["base"], s["B"]["x"])) >= pred.time_s["compute"] * 1e3 * (1 - 1e-9)
    mesh = figs["mesh"]["data"][0]
    assert sum(len([c for c in row if c is not None]) for row in mesh["z"]) == p.world_size
    alts = _traces(figs["alternatives"])
    assert alts["chosen"]["y"] == pytest.approx([pred.step_time_s * 1e3])
    assert alts["alternatives"]["y"] == pytest.approx([a["step_time_s"] * 1e3 for a in p.solver.alternatives])


def test_figures_hold_the_plans_numbers(report):
    plans, one, both = report
    text = one.read_text()
    _check_plan_figures(dict(_figures(text)), plans[0])
    figs = _figures(both.read_text())
    assert len(figs) == 2 * len(PLOTS)
    for i, p in enumerate(plans):
        _check_plan_figures(dict(figs[i * len(PLOTS):(i + 1) * len(PLOTS)]), p)
    assert "<script src=" not in text and "Plotly.newPlot" in text and len(text) > 3_000_000  # plotly.js inside


def test_summary_cells_equal_the_plan_json(report):
    plans, one, _ = report
    data = plans[0].to_dict()
    cells = re.findall(r'<tr data-key="([^"]+)" data-value="([^"]*)">', one.read_text())
    assert len(cells) > 15
    for key, value in cells:
        expect = data
        for part in key.split("."):
            expect = expect[part]
        assert json.loads(html.unescape(value)) == expect, key


def _driver():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium not installed (pip install '.[report-check]')")
    from selenium.webdriver.chrome.service import Service

    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("no chromium/chromedriver here (apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)


def test_report_renders_in_headless_chromium(report, tmp_path):
    image = pytest.importorskip("PIL.Image", reason="pillow not installed (pip install '.[report-check]')")
    plans, _, both = report
    d = _driver()
    try:
        d.get(both.resolve().as_uri())
        drawn = d.execute_script(
            "return Array.from(document.querySelectorAll('div.plot')).map(e => ({id: e.id, plot: e.dataset.plot, "
            "svg: e.querySelectorAll('svg.main-svg').length, marks: e.querySelectorAll('.trace, .hm').length, "
            "data: (e.data || []).map(t => ({meta: t.meta, x: t.x, y: t.y}))}))")
        errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        summary = d.execute_script("return Array.from(document.querySelectorAll('#plan-0 tr[data-key]'))"
                                   ".map(r => [r.dataset.key, JSON.parse(r.dataset.value)])")
        d.set_window_size(1400, d.execute_script("return document.body.scrollHeight"))
        shot = tmp_path / "report.png"
        d.save_screenshot(str(shot))
    finally:
        d.quit()
    assert errors == []
    assert len(drawn) == 2 * len(PLOTS) and all(p["svg"] > 0 and p["marks"] > 0 for p in drawn)
    for i, p in enumerate(plans):  # the numbers the browser holds are the plan's
        mine = {e["plot"]: {t["meta"]: t for t in e["data"]} for e in drawn if e["id"].startswith(f"plan-{i}-")}
        assert mine["time"]["compute"]["x"][0] == pytest.approx(p.prediction.time_s["compute"] * 1e3)
        assert mine["alternatives"]["chosen"]["x"][0] == pytest.approx(p.prediction.peak_memory_bytes / 1e9)
    data = plans[0].to_dict()
    for key, value in summary:
        expect = data
        for part in key.split("."):
            expect = expect[part]
        assert value == expect
    pixels = image.open(shot).convert("RGB")
    assert len(pixels.getcolors(maxcolors=1 << 20) or range(1 << 20)) > 50  # drawn, not blank


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "meshplan.cli", *args], capture_output=True, text=True,
                          timeout=600, **kw)


def test_cli_report_and_bad_plan(tmp_path):
    plan("dense").save(tmp_path / "a.json")
    ok = _cli("report", str(tmp_path / "a.json"), "-o", str(tmp_path / "a.html"))
    assert ok.returncode == 0 and (tmp_path / "a.html").stat().st_size > 3_000_000
    (tmp_path / "bad.json").write_text('{"schema": "meshplan.plan/1", "mesh": {"tp": 0}}')
    bad, emit = _cli("report", str(tmp_path / "bad.json"), "-o", str(tmp_path / "b.html")), _cli(
        "emit", str(tmp_path / "bad.json"), "-o", str(tmp_path / "b.py"))
    assert bad.returncode == emit.returncode == 2 and bad.stderr == emit.stderr and bad.stderr.count("\n") == 1
    cmp = _cli("compare", str(tmp_path / "a.json"), str(tmp_path / "a.json"))
    assert cmp.returncode == 0 and "step ms" in cmp.stdout


def _plan_cmd(tmp_path):
    return [sys.executable, "-m", "meshplan.cli", "plan", "--model", "llama3-8b", "--cluster", "h100-sxm:8x8",
            "--global-batch", "256", "--seq-len", "2048", "--time-limit", "20"]


def test_progress_on_a_tty_not_through_a_pipe(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    piped = subprocess.run(_plan_cmd(tmp_path), capture_output=True, text=True, timeout=600, env=env)
    assert piped.returncode == 0 and "planning" not in piped.stdout + piped.stderr
    out = _run_in_pty(_plan_cmd(tmp_path), env)
    assert "planning" in out and "meshplan: llama3-8b" in out
    quiet = _run_in_pty([*_plan_cmd(tmp_path), "--quiet"], env)
    assert "planning" not in quiet and "meshplan: llama3-8b" in quiet


def _run_in_pty(cmd, env) -> str:
    main, child = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=child, stdout=child, stderr=child, env=env, close_fds=True)
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=600)
    os.close(main)
    return b"".join(chunks).decode(errors="replace")
