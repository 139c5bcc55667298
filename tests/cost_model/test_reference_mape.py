"""The published runs of bench/data/reference_runs.csv, predicted by bench/reference_runs.py with
their published plans and one set of constants per accelerator: the mean error stays under 10%; and
the leave-one-source-out fit that the bench prints never sees the source it predicts.

The bench prints the tables (``python bench/reference_runs.py``); this guards the figures against
regressions. The data ships in the repository (``bench/data``), so nothing here is skipped."""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "reference_runs.py"


def _bench():
    spec = importlib.util.spec_from_file_location("reference_runs_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results():
    bench = _bench()
    csv_path = bench.DATA / "reference_runs.csv"
    assert csv_path.is_file(), f"{csv_path} belongs to the repository"
    found, skipped = bench.evaluate(csv_path)
    return bench, found, skipped


def test_mape_over_all_published_runs_is_under_ten_percent(results) -> None:
    bench, found, skipped = results
    assert len(found) >= 40 and len(skipped) <= 2  # only the strong-scaling endpoints lack a layout
    assert bench.mape(found) < 0.10


def test_no_row_is_off_by_more_than_a_third(results) -> None:
    _, found, _ = results
    worst = max(found, key=lambda r: abs(r.error))
    assert abs(worst.error) < 0.33, f"{worst.run.label}: {worst.error:+.0%}"


def test_rows_group_by_publication_not_by_table(results) -> None:
    bench, found, _ = results
    pubs = {r.run.publication for r in found}
    assert len(pubs) == 3, pubs  # Narayanan's tables 1 and 2 are one paper, Korthikanti's table and abstract one
    assert bench.publication("Narayanan et al. SC'21 (arXiv:2104.04473) Table 1; x") == \
        bench.publication('"Narayanan et al. SC\'21 (arXiv:2104.04473) Table 2 (PTD-P)"')
    assert {r.run.hardware for r in found} == {"a100-80gb", "h100-sxm"}


def test_in_sample_factor_zeroes_each_accelerators_mean_log_ratio(results) -> None:
    bench, found, _ = results
    fitted = bench.in_sample(found)
    for hw in {r.run.hardware for r in found}:
        logs = [math.log1p(f.error) for f in fitted if f.result.run.hardware == hw]
        assert sum(logs) / len(logs) == pytest.approx(0, abs=1e-12)


def test_loso_factor_never_sees_the_source_it_predicts(results) -> None:
    """Scaling one publication's measurements moves its in-sample factor but not its LOSO one; the
    other publications' LOSO factors on the same accelerator move."""
    bench, found, _ = results
    held = found[0].run.publication
    moved = [dataclasses.replace(r, run=dataclasses.replace(r.run, measured_tflops=r.run.measured_tflops * 2))
             if r.run.publication == held else r for r in found]
    before, after = bench.leave_one_source_out(found), bench.leave_one_source_out(moved)
    for b, a in zip(before, after):
        if b.result.run.publication == held:
            assert a.factor == b.factor
        elif b.result.run.hardware == found[0].run.hardware:
            assert a.factor != b.factor
    ins_before, ins_after = bench.in_sample(found), bench.in_sample(moved)
    assert ins_after[0].factor > ins_before[0].factor


def test_an_accelerator_seen_in_no_other_source_takes_the_pooled_factor(results) -> None:
    bench, found, _ = results
    for fit in bench.leave_one_source_out(found):
        others = [r for r in found if r.run.publication != fit.result.run.publication]
        same_hw = any(r.run.hardware == fit.result.run.hardware for r in others)
        assert fit.basis == (fit.result.run.hardware if same_hw else "pooled")


def test_bench_prints_both_tables(results, capsys) -> None:
    bench, _, _ = results
    bench.main([])
    out = capsys.readouterr().out
    assert "leave-one-source-out" in out and "LOSO" in out
    for label in ("publication: Narayanan arXiv:2104.04473", "accelerator: h100-sxm", "all rows"):
        assert label in out
