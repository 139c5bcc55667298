"""``meshplan estimate``: one plan, every choice given, costed without a search; bad input gets
one line with the arithmetic."""
from __future__ import annotations

import json

import pytest

from meshplan import cli

TINY = ("--model", "gpt-tiny", "--global-batch", "8", "--seq-len", "64")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["estimate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_prints_the_plan_report_and_both_flop_rates(capsys) -> None:
    code, out, err = run(capsys, *TINY, "--cluster", "cpu:1x4", "--tp", "2", "--recompute", "full")
    assert code == 0, err
    assert "tp                                 2" in out and "dp                                 2" in out
    assert "time per step" in out and "memory per GPU" in out
    line = next(x for x in out.splitlines() if x.startswith("FLOP/s per GPU"))
    assert "model" in line and "hardware" in line and "float32 peak" in line


def test_json_is_the_plan_with_its_prediction(capsys) -> None:
    code, out, _ = run(capsys, *TINY, "--cluster", "cpu:1x4", "--pp", "2", "--dp", "2", "--micro-batch", "2",
                       "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["schema"] == "meshplan.plan/1" and plan["mesh"]["pp"] == 2 and plan["num_microbatches"] == 2
    assert plan["stages"] == [[0, 2], [2, 4]] and plan["prediction"]["step_time_s"] > 0


def test_interleaved_pipeline_with_given_stages(capsys) -> None:
    code, out, err = run(capsys, "--model", "gpt3-175b", "--cluster", "a100-80gb:8x8", "--global-batch", "64",
                         "--seq-len", "2048", "--tp", "8", "--pp", "8", "--vp", "3", "--recompute", "selective",
                         "--software", "megatron-lm-2021", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["schedule"] == "interleaved-1f1b" and len(plan["stages"]) == 24
    assert plan["sequence_parallel"] is True  # on by default with tp > 1
    # Korthikanti et al. 2022 Table 5 measured 13.75 s for this run
    assert plan["prediction"]["step_time_s"] == pytest.approx(13.75, rel=0.15)


@pytest.mark.parametrize("degrees, arithmetic", [
    (("--tp", "2", "--dp", "3"), "pp(1) * dp(3) * cp(1) * tp(2) = 6 != 4 GPUs"),
    (("--tp", "3"), "tp(3) * pp(1) * cp(1) = 3 does not divide the 4 GPUs (4 % 3 = 1)"),
    (("--dp", "4", "--micro-batch", "4"), "micro_batch(4) * dp(4) = 16 does not divide it"),
    (("--pp", "2", "--dp", "2", "--stages", "1,2"), "--stages gives 2 chunks of 3 layers"),
])
def test_degrees_that_do_not_fit_show_the_arithmetic(capsys, degrees, arithmetic) -> None:
    code, _, err = run(capsys, *TINY, "--cluster", "cpu:1x4", *degrees)
    assert code == 2 and arithmetic in err and "Traceback" not in err


def test_fp8_on_a100_says_the_preset_has_no_fp8_peak(capsys) -> None:
    code, _, err = run(capsys, *TINY, "--cluster", "a100-80gb:1x8", "--dp", "8", "--dtype", "fp8")
    assert code == 2
    assert "has no float8 peak" in err and "bfloat16" in err  # names what it does list


def test_nvfp4_on_h100_says_the_preset_has_no_fp4_peak(capsys) -> None:
    code, _, err = run(capsys, *TINY, "--cluster", "h100-sxm:1x8", "--dp", "8", "--dtype", "nvfp4",
                       "--software", "megatron-core-perf-recipes")
    assert code == 2 and "has no float4 peak" in err and "float8" in err and "Traceback" not in err


def one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    assert err.startswith("meshplan: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("model, degrees, message", [
    ("gpt-tiny", ("--tp", "0"), "--tp must be a positive integer, got 0"),  # was ZeroDivisionError
    ("gpt-tiny", ("--micro-batch", "0"), "--micro-batch must be a positive integer, got 0"),  # was ZeroDivisionError
    ("gpt-tiny", ("--pp", "-1"), "--pp must be a positive integer, got -1"),
    ("gpt-tiny", ("--dp", "0"), "--dp must be a positive integer, got 0"),
    ("gpt-tiny", ("--cp", "0"), "--cp must be a positive integer, got 0"),
    ("gpt-tiny", ("--vp", "0"), "--vp must be a positive integer, got 0"),
    ("gpt-tiny", ("--ep", "0"), "--ep must be a positive integer, got 0"),
    ("gpt-tiny", ("--ep", "2"), "--ep 2 needs a model with experts; gpt-tiny has none"),
    ("moe-tiny", ("--ep", "3"), "--ep 3 does not divide the 4 experts of moe-tiny"),
    ("gpt-tiny", ("--tp", "1", "--sp"), "--sp needs --tp > 1"),
    ("gpt-tiny", ("--vp", "3"), "--vp 3 needs --pp > 1"),
    ("gpt-tiny", ("--pp", "2", "--vp", "2", "--schedule", "gpipe"), "--vp 2 needs --schedule interleaved-1f1b"),
    ("", (), "unknown model ''"),  # was TypeError
])
def test_bad_choices_get_their_own_line(capsys, model, degrees, message) -> None:
    code, _, err = run(capsys, "--model", model, "--global-batch", "8", "--seq-len", "64", "--cluster", "cpu:1x4",
                       *degrees)
    assert message in one_line_error(code, err)


@pytest.mark.parametrize("size, message", [
    (("--global-batch", str(2**63), "--seq-len", "64"), "exceeds the limit of 1099511627776 (2^40)"),
    (("--global-batch", "8", "--seq-len", "0"), "--seq-len must be a positive integer, got 0"),
])
def test_sizes_beyond_the_limits_are_refused(capsys, size, message) -> None:
    code, _, err = run(capsys, "--model", "gpt-tiny", "--cluster", "cpu:1x4", *size)
    assert message in one_line_error(code, err)


def test_software_modifiers_change_what_the_program_is_priced_with(capsys) -> None:
    """``--software preset+expandable``: the same plan without the allocator's fragmentation allowance, the name
    kept in the plan; an unknown modifier is one line naming the known ones."""
    args = ("--model", "llama3-8b", "--cluster", "h100-sxm:1x8", "--global-batch", "8", "--seq-len", "1024",
            "--dp", "8", "--json", "--software")
    code, out, err = run(capsys, *args, "megatron-core-perf-recipes")
    assert code == 0, err
    code, out2, err = run(capsys, *args, "megatron-core-perf-recipes+expandable")
    assert code == 0, err
    plain, expandable = json.loads(out), json.loads(out2)
    assert expandable["software"] == "megatron-core-perf-recipes+expandable"
    assert expandable["prediction"]["peak_memory_bytes"] < plain["prediction"]["peak_memory_bytes"]
    assert expandable["prediction"]["step_time_s"] == plain["prediction"]["step_time_s"]
    with pytest.raises(SystemExit):
        cli.main(["estimate", *args, "megatron-core-perf-recipes+turbo"])
    assert "unknown modifier 'turbo'; known: mxfp8" in capsys.readouterr().err
