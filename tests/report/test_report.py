"""`stormdrop report`: the history read back from records, the HTML page, and the page in a real browser."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import subprocess
import sys

import pytest
from dbutil import TARGET_KEY, args_info_json, matmul_mod
from test_model import tiny_net

from stormdrop.records import ErrorKind, MeasureResult, Phase, Record
from stormdrop.report.history import model_estimate, time_to_beat, trials_of, trials_per_phase
from stormdrop.storage.database import Database, candidate_key


def _record(wid, mod, n, secs, phase, at, error=None):
    result = MeasureResult.failure(error, "boom") if error else MeasureResult(run_secs=secs)
    trace = f"trace-{n}"  # the report never parses a trace
    return Record(wid, TARGET_KEY, candidate_key(trace), trace, args_info_json(mod), result, phase, at, "test")


def synthetic_db(path, scale=1.0):
    """Two workloads with storm, raindrop and failed records at known times and latencies."""
    with Database(path) as db:
        for size, base in ((64, 100.0), (96, 50.0)):
            mod = matmul_mod(size)
            wid = db.commit_workload(mod, name=f"matmul_{size}", op_class="matmul", flops=2 * size**3).workload_id
            plan = [(Phase.STORM, 3.0), (Phase.STORM, 2.0), (Phase.STORM, None), (Phase.RAINDROP, 1.5),
                    (Phase.RAINDROP, 1.0)]
            for i, (phase, f) in enumerate(plan):
                secs = None if f is None else (base * f * scale * 1e-6,) * 2
                err = ErrorKind.BUILD_ERROR if f is None else None
                db.commit_record(_record(wid, mod, i, secs, phase, 1000.0 + 10 * i + size, err))
    return path


def test_history_is_read_back_from_records_in_order(tmp_path):
    with Database(synthetic_db(tmp_path / "s.db")) as db:
        wl = db.workloads()[0]
        trials = trials_of(list(reversed(db.records(wl.workload_id, TARGET_KEY))))
    assert [t.index for t in trials] == [1, 2, 3, 4, 5]
    assert [t.elapsed_s for t in trials] == [0, 10, 20, 30, 40]
    assert [t.phase for t in trials] == [Phase.STORM] * 3 + [Phase.RAINDROP] * 2
    assert trials[2].latency_s is None and trials[2].error == ErrorKind.BUILD_ERROR
    assert [round(t.best_s * 1e6) for t in trials] == [300, 200, 200, 150, 100]
    assert trials_per_phase(trials) == {"reuse": 0, "storm": 3, "raindrop": 2, "failed": 1}
    # the model's estimate starts once every task has a latency, and sums weight x best
    a, b = trials[:2], trials_of([])
    assert model_estimate([(1, a), (2, b)]) == []
    est = model_estimate([(1, trials), (2, trials[3:])])
    assert est[0] == (30, pytest.approx(150e-6 + 2 * 150e-6)) and est[-1][1] == pytest.approx(300e-6)
    # time to fast: the estimate scaled to the measured model (here 2x the estimate) against a peer
    assert time_to_beat(est, 600e-6, 1000e-6) == 30  # 450 us x 2 = 900 us at 30 s, then 800 and 600 at 40 s
    assert time_to_beat(est, 600e-6, 900e-6) == 40  # 900 us is not below 900 us
    assert time_to_beat(est, 600e-6, 600e-6) is None  # never faster
    assert time_to_beat([(-5.0, 1e-3)], 1e-3, 2e-3) == 0.0  # records of an earlier run: from the start
    assert time_to_beat([], 1e-3, 2e-3) is None and time_to_beat(est, None, 2e-3) is None


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "stormdrop", *args], capture_output=True, text=True, timeout=600)


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_report_and_comparison_of_two_databases(tmp_path):
    a, b = synthetic_db(tmp_path / "a.db"), synthetic_db(tmp_path / "b.db", scale=2.0)
    before = _digest(a)
    r = _cli("report", "--db", str(a), "--compare", str(b), "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "rep" / "index.html").read_text()
    assert page.count("<img") == 2  # one plot per task
    assert "matmul_64" in page and "matmul_96" in page and "Comparison" in page
    assert page.count("<td>2.00</td>") == 2  # b is 2x slower on both tasks
    assert _digest(a) == before  # a report only reads
    r = _cli("report", "--db", str(a), "--workload", "matmul_96", "--out", str(tmp_path / "one"))
    assert r.returncode == 0, r.stderr
    one = (tmp_path / "one" / "index.html").read_text()
    assert one.count("<img") == 1 and "matmul_64" not in one


@pytest.mark.slow
@pytest.mark.parametrize("args, needle", [
    (["--db", "{tmp}/none.db"], "no database"),
    (["--db", "{a}", "--model", "resnet18"], "no model run named 'resnet18'"),
    (["--db", "{a}", "--workload", "conv9"], "no workload with id or name 'conv9'"),
    (["--db", "{a}", "--compare", "{tmp}/none.db"], "--compare: no database"),
])
def test_bad_report_input_is_one_error_line(tmp_path, args, needle):
    a = synthetic_db(tmp_path / "a.db")
    before = _digest(a)
    args = [x.format(tmp=tmp_path, a=a) for x in args]
    r = _cli("report", *args, "--out", str(tmp_path / "rep"))
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert _digest(a) == before and not (tmp_path / "rep").exists()


@pytest.fixture(scope="module")
def tuned_tiny(tmp_path_factory):
    """A tiny model tuned by the CLI with its progress display on (stderr is a pipe here)."""
    tmp = tmp_path_factory.mktemp("tiny")
    r = _cli("tune", "--model", tiny_net(str(tmp / "tiny.onnx")), "--trials", "12", "--trials-per-task", "4",
             "--db", str(tmp / "m.db"), "--json", str(tmp / "t.json"))
    assert r.returncode == 0, r.stderr
    return tmp / "m.db", json.loads((tmp / "t.json").read_text()), r.stderr


@pytest.mark.slow
def test_a_model_run_is_noted_and_its_history_is_in_the_json(tuned_tiny):
    db_path, doc, _ = tuned_tiny
    with Database(db_path) as db:
        note = db.model_notes()["tiny"]
        assert [t["name"] for t in note["tasks"]] == [t["name"] for t in doc["tasks"]]
        assert note["latency_s"]["onnxruntime"] > 0 and note["latency_s"]["tuned"] > 0 and note["latency_s"]["openvino"] > 0
        for task, t in zip(doc["tasks"], note["tasks"]):
            hist = task["history"]
            recs = db.records(t["workload_id"], doc["target"])
            assert len(hist) == len(recs) == sum(v for k, v in task["trials"].items() if k != "failed")
            assert [h["trial"] for h in hist] == list(range(1, len(hist) + 1))
            assert [h["phase"] for h in hist] == [r.phase.value for r in recs]
            assert hist[-1]["best_s"] == pytest.approx(min(r.mean for r in recs))
            assert all(a["elapsed_s"] <= b["elapsed_s"] for a, b in zip(hist, hist[1:]))
    # time to fast: known for each peer timed, a time within the tuning exactly when the model is faster
    lat = doc["latency_s"]
    assert set(doc["faster_after_s"]) == {"onnxruntime", "openvino"}
    for peer, after in doc["faster_after_s"].items():
        assert (after is not None) == (lat["tuned"] < lat[peer])
        assert after is None or 0 <= after <= doc["tuning_s"]
    assert note["faster_after_s"].keys() == doc["faster_after_s"].keys()


@pytest.mark.slow
def test_the_progress_display_is_plain_lines_off_a_terminal(tuned_tiny):
    _, doc, stderr = tuned_tiny
    lines = [ln for ln in stderr.splitlines() if "ETA" in ln]
    assert lines, stderr[-2000:]
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", stderr)  # no escape sequences, no carriage returns
    assert re.search(r"\[\d+/12 trials\] elapsed \d+:\d\d ETA \d+:\d\d \| est\. [\d.]+ ms( \(\d+/\d+ tasks\))? \| \d+ failed", lines[-1])


def _browser():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no Chromium (Debian package `chromium`; scripts/test.sh installs it)")
    return pytest.importorskip("playwright.sync_api"), exe


@pytest.mark.slow
def test_the_model_report_opens_in_chromium(tuned_tiny, tmp_path):
    db_path, doc, _ = tuned_tiny
    r = _cli("report", "--db", str(db_path), "--model", "tiny", "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    page = tmp_path / "rep" / "index.html"
    text = page.read_text()
    assert "ONNX Runtime measured at" in text and "estimated latency during tuning" in text
    assert "OpenVINO measured at" in text  # the peer beside ONNX Runtime (in the test extras)
    assert len(re.findall(r"<h3>", text)) == len(doc["tasks"])

    pw, exe = _browser()
    errors = []
    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1200, "height": 900})
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.goto(page.as_uri())
        sizes = tab.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
        shot = tab.screenshot(full_page=True)
        browser.close()
    assert errors == []
    assert len(sizes) == len(doc["tasks"]) + 1  # the model's curve and one plot per task
    assert all(ok and w > 100 and h > 100 for ok, w, h in sizes)
    from PIL import Image  # matplotlib's own dependency

    img = Image.open(io.BytesIO(shot)).convert("L")
    lo, hi = img.getextrema()
    assert hi - lo > 100 and len(img.getcolors(1 << 16) or []) > 10  # not a blank page


def test_live_display_keeps_log_lines_above_its_block():
    import logging

    from stormdrop.report.display import ModelDisplay, TaskLine, eta_s

    assert eta_s(10, 20.0, 30, 1e9) == 40.0 and eta_s(10, 20.0, float("inf"), 5.0) == 5.0
    assert eta_s(0, 0.0, float("inf"), float("inf")) is None
    out = io.StringIO()
    shown = ModelDisplay(out, live=True, min_interval_s=0)
    try:
        tasks = [TaskLine("conv", 2, "storm", 1e-3, 16, 1), TaskLine("dense", 1, "storm", float("inf"), 0, 0)]
        shown.show(16, 64, 30.0, 90.0, tasks)
        logging.getLogger("stormdrop").warning("a log line")
        shown.show(32, 64, 60.0, 60.0, tasks)
    finally:
        shown.close()
    text = out.getvalue()
    first = "[16/64 trials] elapsed 0:30 ETA 1:30 | est. 2.000 ms (1/2 tasks) | 1 failed"
    assert text.startswith(first + "\n")
    # the 3-line block is erased, the log line printed, the block drawn again below it
    assert f"\x1b[3F\x1b[Ja log line\n{first}\n" in text
    assert text.count("\x1b[3F\x1b[J") == 2 and "[32/64 trials]" in text.split("a log line")[1]
    assert logging.getLogger("stormdrop").handlers == [] or all(
        type(h).__name__ != "_AboveTheBlock" for h in logging.getLogger("stormdrop").handlers)


@pytest.mark.slow
def test_a_metaschedule_database_can_be_compared(tuned_tiny, tmp_path):
    """--compare takes a MetaSchedule JSON database directory: here the same run exported, so every
    task is matched and every ratio is 1."""
    db_path, doc, _ = tuned_tiny
    r = _cli("export", "--db", str(db_path), "--out", str(tmp_path / "ms"))
    assert r.returncode == 0, r.stderr
    r = _cli("report", "--db", str(db_path), "--model", "tiny", "--compare", str(tmp_path / "ms"),
             "--out", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "rep" / "index.html").read_text()
    table = page.split("<h2>Comparison</h2>")[1].split("</table>")[0]
    assert table.count("<td>1.00</td>") == len(doc["tasks"])
