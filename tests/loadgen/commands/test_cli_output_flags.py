"""The run folder flags, the same on every command that writes one: ``--out DIR`` names the folder,
``--reports DIR --run-id ID`` build ``DIR/ID``, and ``--out`` with either of the others is a usage error."""

from __future__ import annotations

import json

import pytest

from loadgen.cli import build_parser
from loadgen.results.records import read_records
from tests.helpers import slobench

WRITES_A_RUN_FOLDER = ("run", "replay", "capacity")
SCENARIO = "name: flags\nworkload: {input_len: 8, output_len: 4}\nload: {arrival: poisson, rate: 40, requests: 12}\n"
CAPACITY = ("name: flags\nworkload: {input_len: 8, output_len: 4}\ntiers: {standard: {slo: {ttft_ms: 300}}}\n"
            "search: {start: 4, growth: 2}\n")


def _help(cmd: str, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "200")  # no hyphenated words broken across lines
    with pytest.raises(SystemExit):
        build_parser().parse_args([cmd, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines: compare words


def _trace(path):
    """A five-request Mooncake trace, 20 ms apart."""
    rows = [{"timestamp": 20 * i, "input_length": 16, "output_length": 4, "hash_ids": [i]} for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_run_command_documents_the_same_output_flags(capsys, monkeypatch):
    helps = {cmd: _help(cmd, capsys, monkeypatch) for cmd in WRITES_A_RUN_FOLDER}
    wording = ("--out DIR run folder to write (default: REPORTS/RUN_ID); not with --reports or --run-id",
               "--reports DIR folder for run folders (default: reports)",
               "--run-id ID run folder name under --reports (default: timestamp-name)")
    for cmd, text in helps.items():
        for line in wording:
            assert line in text, f"slobench {cmd} --help lacks {line!r}"


def test_run_out_writes_the_run_folder_there(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1, "--tokens", 4)
    scn = tmp_path / "s.yaml"
    scn.write_text(SCENARIO)
    out = tmp_path / "nested" / "my-run"
    r = slobench("run", scn, "--target", url, "--out", out, "--no-scrape", "--no-report", "--json",
                 "--lateness-bound-ms", 100)
    assert r.returncode == 0, r.stderr
    assert len(read_records(out / "requests.jsonl")) == 12
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run_id"] == "my-run" and json.loads(r.stdout)["run_id"] == "my-run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nested", "s.yaml"]  # nothing beside it


def test_replay_out_writes_the_run_folder_there(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1, "--tokens", 4)
    out = tmp_path / "replay-here"
    r = slobench("replay", _trace(tmp_path / "t.jsonl"), "--target", url, "--out", out, "--no-scrape",
                 "--no-report", "--json", "--lateness-bound-ms", 100)
    assert r.returncode == 0, r.stderr
    recs = read_records(out / "requests.jsonl")
    assert len(recs) == 5 and {x["status"] for x in recs} == {"ok"}
    assert json.loads((out / "summary.json").read_text())["run_id"] == "replay-here"


def test_reports_and_run_id_still_build_the_folder(mock_server, tmp_path):
    url = mock_server("--ttft-ms", 5, "--itl-ms", 1, "--tokens", 4)
    r = slobench("replay", _trace(tmp_path / "t.jsonl"), "--target", url, "--reports", tmp_path / "rep",
                 "--run-id", "r7", "--no-scrape", "--no-report", "--json", "--lateness-bound-ms", 100)
    assert r.returncode == 0, r.stderr
    assert len(read_records(tmp_path / "rep" / "r7" / "requests.jsonl")) == 5


@pytest.mark.parametrize("cmd", WRITES_A_RUN_FOLDER)
@pytest.mark.parametrize("extra", [("--run-id", "x"), ("--reports", "elsewhere"),
                                   ("--reports", "elsewhere", "--run-id", "x")])
def test_out_with_reports_or_run_id_is_a_usage_error(tmp_path, cmd, extra):
    if cmd == "replay":
        source = _trace(tmp_path / "t.jsonl")
    else:
        source = tmp_path / "s.yaml"
        source.write_text(CAPACITY if cmd == "capacity" else SCENARIO)
    out = tmp_path / "out"
    # A closed port: were the conflict not caught first, the run would fail to connect (exit 1), not exit 2.
    r = slobench(cmd, source, "--target", "http://127.0.0.1:9", "--out", out, *extra, "--no-report")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: --out names the run folder itself") and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    for flag in extra[::2]:
        assert flag in r.stderr
    assert not out.exists() and not (tmp_path / "elsewhere").exists()
