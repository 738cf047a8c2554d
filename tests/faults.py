"""Helpers of the fault-injection tests: a broken copy of the bundled engine is a small script
written into tmp_path that imports the engine, monkeypatches one thing and runs
engine.cli.main() -- driven with --engine-cmd, exactly as an external engine would be.
Nothing in the engine's production code knows about faults."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap

from epmci.cli import main as epmci_main

HEADER = "import sys, time\nimport numpy as np\nimport engine.cli\n"
FOOTER = "\nsys.exit(engine.cli.main())\n"
# a copy that no longer declares reference_exact: the gate compares it within a tolerance, as
# an engine that is not bit-identical to the reference
NOT_REFERENCE_EXACT = """
import engine.contract_info as _CI
_CI.FEATURES = tuple(f for f in _CI.FEATURES if f != "reference_exact")
"""


# Q6_K products 0.2 % too large, on every kernel path
Q6K_TOO_LARGE = """
import engine.kernels as K
import engine.kernels_x86 as A

def broken(good):
    return lambda ptrs, n_rows, row_bytes, qtype, *rest: (
        good(ptrs, n_rows, row_bytes, qtype, *rest) * np.float32(1.002 if qtype == K.Q6_K else 1.0))
K.matmul_kquant, A.matmul_kquant, A.matmul_kquant_512 = (broken(K.matmul_kquant), broken(A.matmul_kquant),
                                                         broken(A.matmul_kquant_512))
"""


def broken_engine(tmp_path, patch: str, name: str = "broken_engine.py", reference_exact: bool = True) -> str:
    script = tmp_path / name
    script.write_text(HEADER + ("" if reference_exact else NOT_REFERENCE_EXACT) + textwrap.dedent(patch) + FOOTER)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def run_check(tmp_path, model, engine_cmd: str | None, *args: str) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    argv = ["check", "--model", str(model), "--json", str(out), "--jobs", "2", "-q",
            "--workdir", str(tmp_path / "work")]
    if engine_cmd:
        argv += ["--engine-cmd", engine_cmd]
    rc = epmci_main(argv + list(args))
    report = json.loads(out.read_text()) if out.exists() else {}
    return rc, report


def results(report: dict, suite: str) -> list[dict]:
    for s in report["suites"]:
        if s["name"] == suite:
            return s["results"]
    return []


def statuses(report: dict, suite: str) -> dict[str, str]:
    return {r["name"]: r["status"] for r in results(report, suite)}

# layer 2's router logits nudged (a bias rising over the experts): routing moves there first,
# the logits only a little
ROUTER_NUDGED_IN_LAYER_2 = """
import engine.model as M
good = M.Model.route
def route(self, il, h):
    if il != 2:
        return good(self, il, h)
    probs = M.ops.softmax(self._mm(f"blk.{il}.ffn_gate_inp.weight", h) * np.float32(1.0) +
                          np.linspace(0, 0.5, self.hp.n_expert, dtype=np.float32))
    sel = np.argsort(-probs, axis=-1, kind="stable")[:, :self.hp.n_expert_used].astype(np.int32)
    w = np.take_along_axis(probs, sel, axis=-1)
    return sel, (w / w.sum(axis=-1, keepdims=True, dtype=np.float32)).astype(np.float32)
M.Model.route = route
"""
