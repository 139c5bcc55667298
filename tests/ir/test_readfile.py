"""Reading a plan or a model config never hangs, never fills memory, never crashes the parser: every
finding of the plan-file fuzzing (issue 15) gets one clear InvalidPlanError / PlanError."""
from __future__ import annotations

import json
import os
import sys
import threading

import pytest

from meshplan import ir
from meshplan.ir import readfile

MODEL = {"family": "gpt", "layers": 4, "hidden": 64, "heads": 4, "vocab": 512, "max_seq_len": 128}


def _plan_text() -> str:
    plan = ir.Plan(model=MODEL, cluster="cpu:1x4", global_batch=8, seq_len=16, mesh=ir.Mesh(dp=4),
                   micro_batch_size=2, recompute=("none",) * 4)
    return plan.to_json()


def _refused(path, match: str) -> str:
    with pytest.raises(ir.InvalidPlanError, match=match) as err:
        ir.Plan.load(path)
    return str(err.value)


def test_a_valid_plan_file_loads(tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_text(_plan_text())
    assert ir.Plan.load(path).mesh.dp == 4


def test_non_utf8_file_names_the_byte(tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_bytes(_plan_text().encode().replace(b"gpt", b"g\xffp", 1))
    msg = _refused(path, "not UTF-8 text")
    assert "0xff" in msg and "offset" in msg


def test_deep_nesting_is_refused_before_parsing(tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_text("[" * 100_000 + "]" * 100_000)  # json.loads alone raises RecursionError
    _refused(path, "nested 65 deep, more than the limit of 64")
    with pytest.raises(ir.InvalidPlanError, match="nested"):
        ir.Plan.from_json('{"a":' * 5000 + "1" + "}" * 5000)


@pytest.mark.parametrize("text, expect", [
    ("[]", 1), ('[[{"a": "[[[\\"[", "b": {}}]]', 4), ('[[{"a": "]]]"}]]', 3), ('"[[["', 0), ("[[],[[[]]],{}]", 4), ("{", 0)])
def test_json_depth_skips_strings(text, expect) -> None:
    assert readfile.json_depth(text) == expect


def test_5000_digit_integer_is_refused(tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_text(_plan_text().replace('"global_batch": 8', '"global_batch": ' + "9" * 5000))
    _refused(path, "p.json: global_batch: an integer of 5000 digits")


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_refused(literal) -> None:
    with pytest.raises(ir.InvalidPlanError, match="finite|infinity"):
        ir.Plan.from_json(_plan_text().replace('"seq_len": 16', f'"seq_len": {literal}'))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_without_writer_is_refused_at_once(tmp_path) -> None:
    path = tmp_path / "p.json"
    os.mkfifo(path)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(_try_load(path)), daemon=True)
    worker.start()
    worker.join(timeout=10)  # a blocking open would never return
    assert not worker.is_alive(), "Plan.load blocked on a FIFO"
    assert "FIFO" in result[0]


def _try_load(path) -> str:
    try:
        ir.Plan.load(path)
    except ir.InvalidPlanError as exc:
        return str(exc)
    return "loaded"


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_dev_zero_is_refused_without_reading() -> None:
    _refused("/dev/zero", "character device, not a regular file")


def test_a_directory_and_a_missing_file(tmp_path) -> None:
    _refused(tmp_path, "it is a directory")
    _refused(tmp_path / "absent.json", "cannot read plan file .*No such file")


def test_oversized_file_is_refused_before_reading(tmp_path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as f:  # sparse: no disk used
        f.truncate(readfile.MAX_JSON_BYTES + 1)
    _refused(path, f"more than the limit of {readfile.MAX_JSON_BYTES}")
    small = tmp_path / "config.json"
    small.write_text(json.dumps(MODEL) + " " * 100)
    with pytest.raises(ir.PlanError, match="more than the limit of 50"):
        readfile.read_json_file(small, max_bytes=50, what="model config")


def test_model_config_flag_reads_through_the_bounded_reader(tmp_path, capsys) -> None:
    from meshplan import cli

    cases = {"fifo": None, "latin1.json": "{\"family\": \"gpt\xe9\"}".encode("latin-1"),
             "deep.json": b"[" * 1000 + b"]" * 1000, "digits.json": b'{"layers": ' + b"1" * 5000 + b"}",
             "true.json": json.dumps({**MODEL, "layers": True}).encode()}
    for name, data in cases.items():
        path = tmp_path / name
        if data is None:
            os.mkfifo(path)
        else:
            path.write_bytes(data)
        code = cli.main(["plan", "--model-config", str(path), "--cluster", "cpu:1x4", "--global-batch", "8",
                         "--seq-len", "16"])
        err = capsys.readouterr().err
        assert code == 2, name
        assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "layers must be an integer" in err


def test_cli_refuses_a_bad_plan_with_one_line(tmp_path, capsys) -> None:
    from meshplan import cli

    path = tmp_path / "p.json"
    path.write_text(_plan_text().replace('"cpu:1x4"', '"cpu:1x8"'))
    code = cli.main(["emit", str(path), "-o", str(tmp_path / "train.py")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "mesh: pp(1) * dp(4) * cp(1) * tp(1) = 4 ranks but the cluster 'cpu:1x8' has 1 x 8 = 8 GPUs" in err
    assert not (tmp_path / "train.py").exists()


if sys.platform == "win32":  # pragma: no cover
    pytestmark = pytest.mark.skip("POSIX file types")
