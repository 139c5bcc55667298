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


# --- bounds and pins (issue 15): each refused with its own one-line message, exit 2 -------------------

TINY_PLAN = ("plan", "--model", "gpt-tiny", "--cluster", "cpu:1x4", "--global-batch", "8", "--seq-len", "64")


def one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    assert err.startswith("meshplan: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("extra, message", [
    (("--tp", "0"), "--tp must be a positive integer, got 0"),
    (("--micro-batch", "0"), "--micro-batch must be a positive integer, got 0"),
    (("--num-microbatches", "-2"), "--num-microbatches must be a positive integer, got -2"),
    (("--vp", "0"), "--vp must be a positive integer, got 0"),
    (("--pp", str(10**8)), "--pp 100000000 exceeds the limit of 10000000 (10^7)"),
    (("--time-limit", "-1"), "--time-limit must be a positive, finite number of seconds"),
    (("--time-limit", "0"), "got 0.0"),
    (("--time-limit", "nan"), "got nan"),
    (("--time-limit", "inf"), "got inf"),
    (("--top", "0"), "--top must be a positive integer, got 0"),
])
def test_plan_flags_out_of_range_name_the_flag(capsys, extra, message) -> None:
    assert message in one_line_error(*run(capsys, *TINY_PLAN, *extra)[::2])


@pytest.mark.parametrize("flag, value, message", [
    ("--global-batch", str(2**63), "--global-batch 9223372036854775808 exceeds the limit of 1099511627776 (2^40)"),
    ("--global-batch", "0", "--global-batch must be a positive integer, got 0"),
    ("--seq-len", str(2**25), "--seq-len 33554432 exceeds the limit of 16777216 (2^24)"),
])
def test_sizes_beyond_the_limits_are_refused_up_front(capsys, flag, value, message) -> None:
    argv = dict(zip(TINY_PLAN[1::2], TINY_PLAN[2::2]))
    argv[flag] = value
    code, _, err = run(capsys, "plan", *[x for kv in argv.items() for x in kv])
    assert message in one_line_error(code, err)


def test_a_cluster_beyond_the_gpu_limit_is_refused_not_factored(capsys) -> None:
    code, _, err = run(capsys, "plan", "--model", "gpt-tiny", "--cluster", "h100-sxm:99999999999999999999x8",
                       "--global-batch", "8", "--seq-len", "64")
    assert "exceeds the limit" in one_line_error(code, err)


def test_an_empty_model_name_is_an_unknown_model(capsys) -> None:
    code, _, err = run(capsys, "plan", "--model", "", "--cluster", "cpu:1x4", "--global-batch", "8",
                       "--seq-len", "64")
    assert "unknown model ''" in one_line_error(code, err)


@pytest.mark.parametrize("extra, message", [
    (("--ep", "2"), "ep=2 needs a model with experts; gpt-tiny has none"),
    (("--tp", "1", "--sp"), "sp needs tp > 1"),
    (("--vp", "3", "--pp", "1"), "vp needs pp > 1"),
    (("--tp", "3"), "tp=3 does not divide the 4 GPUs (4 % 3 = 1)"),
    (("--micro-batch", "3"), "micro_batch=3 does not divide the global batch 8"),
    (("--zero", "1", "--zero-group", "2"), "zero_group=2 with zero=1; HSDP groups shard ZeRO-2/3 state"),
])
def test_pins_no_plan_can_satisfy_get_their_own_message(capsys, extra, message) -> None:
    err = one_line_error(*run(capsys, *TINY_PLAN, *extra)[::2])
    assert message in err and "no strategy divides the work" not in err


def test_a_pinned_vp_of_3_is_planned_not_dropped(capsys) -> None:
    code, out, err = run(capsys, "plan", "--model", "gpt2-small", "--cluster", "cpu:1x4", "--global-batch", "8",
                         "--seq-len", "64", "--vp", "3", "--pp", "2", "--dp", "2", "--tp", "1", "--zero", "0",
                         "--micro-batch", "1", "--recompute", "none", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["vp"] == 3 and plan["schedule"] == "interleaved-1f1b" and len(plan["stages"]) == 6


def test_a_pinned_zero_group_reaches_the_plan(capsys) -> None:
    for group in ("2", "0"):
        code, out, err = run(capsys, "plan", "--model", "gpt-tiny", "--cluster", "cpu:1x4", "--global-batch", "8",
                             "--seq-len", "64", "--dp", "4", "--zero", "3", "--zero-group", group, "--json")
        assert code == 0, err
        assert json.loads(out).get("zero_group", 0) == int(group)


def test_files_that_cannot_be_read_or_written_exit_2_with_one_line(capsys, tmp_path) -> None:
    code, _, err = run(capsys, "emit", str(tmp_path / "missing.json"), "-o", str(tmp_path / "t.py"))
    assert "missing.json" in one_line_error(code, err)
    code, out, err = run(capsys, "estimate", "--model", "gpt-tiny", "--cluster", "cpu:1x4", "--global-batch", "8",
                         "--seq-len", "64", "--json")
    assert code == 0, err
    plan = tmp_path / "p.json"
    plan.write_text(out)
    code, _, err = run(capsys, "emit", str(plan), "-o", str(tmp_path / "no" / "such" / "dir" / "t.py"))
    assert "No such file or directory" in one_line_error(code, err)


def test_run_refuses_a_non_positive_process_count(capsys, tmp_path) -> None:
    code, _, err = run(capsys, "run", str(tmp_path / "p.json"), "--nproc", "0")
    assert "--nproc must be a positive integer, got 0" in one_line_error(code, err)
