"""Check one layer's MoE dump against the reference: routing recomputed from the dumped
input must select the same experts; weights and output within the tolerance.

Used by the layer suite (demand paging) and the prefetch-stress suite (prefetch on,
eviction every token).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..compare.arrays import Tolerance, compare_arrays
from ..contract.outputs import ContractError, read_moe_dump
from .context import CheckContext
from .result import FAIL, PASS, CheckResult


def suspect_experts(selected: np.ndarray, bad_rows: np.ndarray) -> tuple[list[int], int]:
    """Experts every one of whose rows is bad; and how many experts the dump used."""
    used = np.unique(selected)
    bad = set(int(r) for r in bad_rows)
    suspects = []
    for e in used:
        rows = np.nonzero((selected == e).any(axis=1))[0]
        if len(rows) and all(int(r) in bad for r in rows):
            suspects.append(int(e))
    return suspects, len(used)


def check_dump(ctx: CheckContext, suite: str, name: str, dump_path: Path, layer: int,
               tol: Tolerance, expect_rows: int | None, run_seconds: float = 0.0,
               stderr_tail: str = "", details: str = "", extra_props: dict | None = None) -> CheckResult:
    t0 = time.perf_counter()
    facts = ctx.facts
    props = {"layer": layer, "expert_types": "/".join(facts.types[layer]),
             "expert_bytes": facts.expert_bytes[layer], "atol": tol.atol, "rtol": tol.rtol}
    props.update(extra_props or {})

    def result(status: str, msg: str) -> CheckResult:
        return CheckResult(suite, name, status, msg, props, run_seconds + time.perf_counter() - t0,
                           stderr_tail, details)

    where = f"L{layer} ({facts.describe_layer(layer)})"
    try:
        dump = read_moe_dump(dump_path, layer=layer, n_embd=facts.n_embd, k=facts.n_expert_used)
    except ContractError as e:
        return result(FAIL, f"{where}: MoE dump unusable: {e}")
    rec = dump.concat()
    n = len(rec.h)
    props.update(rows=n, records=len(dump.records))
    if expect_rows is not None and n != expect_rows:
        return result(FAIL, f"{where}: dump has {n} rows but the run evaluated {expect_rows} positions")
    ref = ctx.reference_moe(layer, rec.h)

    # routing: recomputed from the dumped input, must select the same experts in the same order
    sel_bad = np.nonzero((rec.selected != ref.selected).any(axis=1))[0]
    props["routing_rows_differ"] = int(len(sel_bad))
    if len(sel_bad):
        r = int(sel_bad[0])
        return result(FAIL, f"{where}: routing differs from the reference on {len(sel_bad)}/{n} rows "
                            f"(row {r}: engine selected {rec.selected[r].tolist()}, "
                            f"reference {ref.selected[r].tolist()})")
    wd = compare_arrays(rec.weights, ref.weights, tol)
    props.update(wd.props("weights_"))
    if not wd.ok:
        return result(FAIL, f"{where}: routing weights differ from the reference: {wd.text(tol)}")

    problems = []
    od = compare_arrays(rec.out, ref.out, tol)
    props.update(od.props("out_"))
    if not od.ok:
        msg = f"MoE output differs from the reference: {od.text(tol)}"
        if len(od.bad_rows):
            suspects, n_used = suspect_experts(rec.selected, od.bad_rows)
            props["suspect_experts"] = suspects
            if suspects and len(suspects) < n_used:
                msg += f"; every row routed to expert(s) {suspects[:16]} differs"
            elif suspects:
                msg += f"; all {n_used} experts used differ (a kernel or quant-type fault, not one expert)"
        problems.append(msg)
    shared = ""
    if ctx.mf.hp.n_ff_shexp:    # the dump must carry the shared expert apart from the routed ones
        if rec.shared is None:
            problems.append("the MoE dump has no shared expert output (version 1 records), the model has a "
                            "shared expert (version 2, docs/engine-contract.md)")
        else:
            sd = compare_arrays(rec.shared, ctx.reference_shared(layer, rec.h), tol)
            props.update(sd.props("shared_"))
            shared = f", shared expert {sd.text(tol)}"
            if not sd.ok:
                problems.append(f"shared expert output (resident, behind its sigmoid gate) differs from the "
                                f"reference: {sd.text(tol)}")
    if problems:
        return result(FAIL, f"{where}: " + "; ".join(problems))
    return result(PASS, f"{where}: {n} rows, routing identical, output {od.text(tol)}{shared}")
