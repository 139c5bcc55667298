"""The command line: bad input gets one clear line, not a traceback."""
from __future__ import annotations

import json

import pytest

from meshplan import cli, zoo


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_zoo_list_prints_every_model_with_its_size(capsys) -> None:
    code, out, _ = run(capsys, "zoo", "list")
    assert code == 0
    for name in zoo.names():
        assert name in out
    assert "70.55 B" in out and "8.03 B" in out  # llama3-70b, llama3-8b


def test_unknown_model_lists_the_known_ones(capsys) -> None:
    code, _, err = run(capsys, "plan", "--model", "llama9", "--cluster", "h100-sxm:1x8", "--global-batch", "8",
                       "--seq-len", "128")
    assert code == 2
    assert "unknown model 'llama9'" in err and "llama3-70b" in err and "Traceback" not in err


@pytest.mark.parametrize("spec, message", [
    ("h100-sxm:8by8", "NAME:NODESxGPUS"),
    ("tpu-v9:1x8", "unknown"),
])
def test_bad_cluster_specs(capsys, spec, message) -> None:
    code, _, err = run(capsys, "plan", "--model", "gpt-tiny", "--cluster", spec, "--global-batch", "8",
                       "--seq-len", "16")
    assert code == 2 and message in err


def test_bad_model_config_file(capsys, tmp_path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"family": "gpt", "layers": 2, "hidden": 60, "heads": 7, "vocab": 10,
                                "max_seq_len": 8}))
    code, _, err = run(capsys, "plan", "--model-config", str(path), "--cluster", "cpu:1x4", "--global-batch", "8",
                       "--seq-len", "8")
    assert code == 2 and "hidden(60) must divide by heads(7)" in err


def test_malformed_plan_file_for_emit_and_run(capsys, tmp_path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"schema": "meshplan.plan/1", "mesh": {}}')
    code, _, err = run(capsys, "emit", str(path), "-o", str(tmp_path / "t.py"))
    assert code == 2 and "missing field(s)" in err
    code, _, err = run(capsys, "run", str(path), "--nproc", "2")
    assert code == 2 and "missing field(s)" in err
