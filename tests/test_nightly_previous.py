"""The nightly workflow's own scripts, run here: which earlier run it compares with (the GitHub REST API, served
by a local HTTP server that answers like api.github.com), the verdict table it writes to the job summary, and
that a regression fails the job. actionlint's checks of the file are in tests/test_workflow.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
VENV_BIN = Path(sys.executable).parent


def steps() -> list[dict]:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]["bench"]["steps"]


def script(name: str) -> str:
    (found,) = [s for s in steps() if s.get("name") == name]
    return found["run"].replace("${{ matrix.platform }}", "h100").replace("${{ matrix.matrix }}", "smoke-cpu")


def bash(text: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=cwd, capture_output=True, text=True,
                          env=dict(os.environ, **env), timeout=120)


@pytest.fixture
def work(tmp_path) -> Path:
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "bin").symlink_to(VENV_BIN)
    return tmp_path


class Api:
    """A local server answering GET /repos/{repo}/actions/artifacts like the GitHub REST API."""

    def __init__(self, artifacts: list[dict], status: int = 200):
        self.artifacts, self.status, self.requests = artifacts, status, []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                api.requests.append((self.path, dict(self.headers)))
                body = json.dumps({"total_count": len(api.artifacts), "artifacts": api.artifacts}).encode()
                self.send_response(api.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def artifact(run_id: int, branch: str, created: str, expired: bool = False) -> dict:
    return {"id": run_id * 10, "name": "nightly-h100-smoke-cpu", "expired": expired, "created_at": created,
            "workflow_run": {"id": run_id, "head_branch": branch}}


def find_previous(work: Path, api: Api, wanted: str = "") -> tuple[subprocess.CompletedProcess[str], dict]:
    out = work / "out.txt"
    out.unlink(missing_ok=True)
    env = {"GITHUB_API_URL": api.url, "GITHUB_REPOSITORY": "org/suite", "GITHUB_RUN_ID": "1000",
           "GITHUB_REF_NAME": "main", "ARTIFACT": "nightly-h100-smoke-cpu", "GH_TOKEN": "t0ken", "WANTED": wanted,
           "GITHUB_OUTPUT": str(out), "PATH": os.environ["PATH"]}
    r = bash(script("Find the previous run of this matrix"), work, env)
    return r, dict(line.split("=", 1) for line in out.read_text().splitlines()) if out.exists() else {}


def test_previous_is_the_newest_other_run_with_this_matrixs_artifact(work):
    api = Api([
        artifact(990, "main", "2026-11-27T01:40:00Z"),
        artifact(1000, "main", "2026-11-30T01:40:00Z"),  # this run (a re-run attempt uploads under its id)
        artifact(997, "feature-x", "2026-11-29T12:00:00Z"),  # another branch
        artifact(995, "main", "2026-11-29T01:40:00Z", expired=True),
        artifact(993, "main", "2026-11-28T01:40:00Z"),  # its workflow may have failed elsewhere: still counts
    ])
    try:
        r, outputs = find_previous(work, api)
    finally:
        api.close()
    assert r.returncode == 0, r.stdout + r.stderr
    assert outputs == {"run_id": "993"}
    [(path, headers)] = api.requests
    url = urlparse(path)
    assert url.path == "/repos/org/suite/actions/artifacts"
    assert parse_qs(url.query) == {"name": ["nightly-h100-smoke-cpu"], "per_page": ["100"]}
    assert headers["Authorization"] == "Bearer t0ken" and headers["Accept"] == "application/vnd.github+json"


def test_none_found_or_api_down_means_nothing_to_compare(work):
    api = Api([artifact(1000, "main", "2026-11-30T01:40:00Z")])
    try:
        r, outputs = find_previous(work, api)
    finally:
        api.close()
    assert r.returncode == 0 and outputs == {"run_id": ""}
    down = Api([], status=500)
    try:
        r, outputs = find_previous(work, down)
    finally:
        down.close()
    assert r.returncode == 0 and outputs == {"run_id": ""}
    assert "::warning::could not list the nightly-h100-smoke-cpu artifacts" in r.stdout


def test_dispatch_input_wins_without_asking_the_api(work):
    api = Api([artifact(993, "main", "2026-11-28T01:40:00Z")])
    try:
        r, outputs = find_previous(work, api, wanted="424242")
    finally:
        api.close()
    assert r.returncode == 0 and outputs == {"run_id": "424242"} and api.requests == []


def test_no_gh_and_the_model_is_fetched_before_the_clock():
    names = [s.get("name") for s in steps()]
    runs = "\n".join(s.get("run", "") for s in steps())
    assert not re.search(r"(^|[\s;(|&])gh\s", runs), "the runner may not have the gh CLI"
    assert names.index("Download the model") < names.index("Build images") < names.index("Run the matrix")
    (fetch,) = [s for s in steps() if s.get("name") == "Download the model"]
    assert fetch["run"] == '.venv/bin/suite fetch "$MATRIX_FILE"' and "HF_TOKEN" in fetch["env"]
    (dl,) = [s for s in steps() if s.get("uses", "").startswith("actions/download-artifact")]
    assert dl["with"]["run-id"] == "${{ steps.prev.outputs.run_id }}"


def test_regression_writes_the_verdict_table_and_fails_the_job(work):
    """The night-over-night table (secondary: a warning), and the job failing on tonight's own verdict: the
    previous night's artifact holds no history index, so tonight's REGRESSION is a new one."""
    from suite.report import build_report
    from tests.test_report_html import build_run_dir

    build_report(build_run_dir(work / "previous" / "20261128T012300Z-smoke-cpu"))
    build_report(build_run_dir(work / "runs" / "20261129T012300Z-smoke-cpu", scale={"patched": 0.1}))
    out, summary = work / "out.txt", work / "summary.md"
    env = {"RUN_DIR": "runs/20261129T012300Z-smoke-cpu", "MIN_EFFECT": "0", "ARTIFACT": "nightly-h100-smoke-cpu",
           "GITHUB_OUTPUT": str(out), "GITHUB_STEP_SUMMARY": str(summary)}
    r = bash(script("Compare with the previous night"), work, env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert dict(line.split("=", 1) for line in out.read_text().splitlines()) == {"compared": "true",
                                                                                "compare_rc": "1"}
    r = bash(script("Summary"), work, env | {"RUN_RC": "0", "COMPARE_RC": "1"})
    assert r.returncode == 0, r.stderr
    text = summary.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| ")]
    assert rows[0] == "| arm | previous → tonight | details |"
    verdicts = {r.split(" | ")[0][2:]: r.split(" | ")[1] for r in rows[1:3]}
    assert verdicts["patched"] == "**REGRESSION**" and verdicts["baseline"] != "**REGRESSION**"
    assert "output throughput (geomean) -90.0%" in rows[2] and "[report]" not in rows[2]
    regressions = [ln for ln in rows if re.match(r"\| patched \| isl\d+-osl\d+-c\d+-n\d+ \| \w+ \|", ln)]
    arrows = [ln for ln in text.splitlines() if re.match(r"  - ▼ \S+ \S+: .* → ", ln)]  # suite compare's lines
    assert regressions and len(regressions) == len(arrows)  # one table row per significant regression
    assert "| arm | point | metric | previous | tonight | Δ | 95% interval |" in text
    r = bash(script("Index the run (history carried over from the previous night)"), work, env | {"NAME": "smoke-cpu"})
    assert r.returncode == 0, r.stderr
    r = bash(script("Fail on failed jobs or a new regression"), work, env | {"RUN_RC": "0", "COMPARE_RC": "1"})
    assert r.returncode == 1
    assert "::warning::an arm regressed against its previous night" in r.stdout
    assert "::error::patched vs baseline: REGRESSION on vLLM 0.32.0 (the previous night: no verdict)" in r.stdout
