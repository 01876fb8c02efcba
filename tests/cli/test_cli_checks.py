"""Nonsense options and unwritable outputs are refused with one line, exit 2, before any work
(no database created); JSON results are written whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stormdrop.cli.main import _write_json, main

KERNEL = ["tune", "--kernel", "matmul:M=4,N=4,K=4", "--trials", "2", "--no-progress"]


def _refused(capsys, argv: list[str]) -> str:
    code = main(argv)
    out = capsys.readouterr()
    assert code == 2, (argv, out.err[-300:])
    assert len(out.err.strip().splitlines()) == 1 and "Traceback" not in out.err
    return out.err


@pytest.mark.parametrize("option,value", [
    ("--time-budget", "0"), ("--time-budget", "nan"), ("--time-budget", "inf"), ("--time-budget", "-5"),
    ("--build-timeout", "nan"), ("--run-timeout", "0"), ("--min-repeat-ms", "inf"), ("--min-repeat-ms", "nan"),
    ("--rpc-retry", "nan"), ("--rpc-session-timeout", "-inf"), ("--rpc-join-every", "0"),
    ("--batch-size", "0"), ("--repeat", "0"), ("--trials-per-task", "0"), ("--pvalue", "nan"),
])
def test_a_nonsense_number_is_refused_before_any_work(tmp_path: Path, capsys, option, value) -> None:
    db = tmp_path / "x.db"
    err = _refused(capsys, [*KERNEL, "--db", str(db), option, value])
    assert option in err or "pvalue" in err
    assert not db.exists()


@pytest.mark.parametrize("flag", ["--json", "--output"])
def test_an_unwritable_output_is_refused_before_any_work(tmp_path: Path, capsys, flag) -> None:
    db = tmp_path / "x.db"
    for path in (tmp_path / "no" / "such" / "dir" / "r.out", tmp_path):
        err = _refused(capsys, [*KERNEL, "--db", str(db), flag, str(path)])
        assert flag in err
    assert not db.exists() and not (tmp_path / "no").exists()


def test_bench_refuses_an_unwritable_json_before_loading_the_model(tmp_path: Path, capsys) -> None:
    _refused(capsys, ["bench", "--model", "resnet18", "--json", str(tmp_path / "missing" / "r.json")])


def test_json_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("old")
    _write_json(str(path), {"a": [1, 2]})
    assert json.loads(path.read_text()) == {"a": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left
    with pytest.raises(TypeError):
        _write_json(str(path), {"a": object()})  # fails half way: the old file stays whole
    assert json.loads(path.read_text()) == {"a": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
