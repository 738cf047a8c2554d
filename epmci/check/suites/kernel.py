"""Layer 1, kernel: one expert through the engine's paged path (--selftest) vs the reference
expert forward, for (layer, expert) pairs covering every expert quant-type combination,
every expert size, the first and last layer, and experts at both ends of the tensor; on the
engine's default kernels and again on every kernel path it declares (`kernel_paths`,
`--kernels P`), so a fault on a path the default does not take is caught on the runner (a
path this CPU cannot run is a SKIP with the engine's line).

One engine run per kernel path runs all its pairs when the engine declares selftest_batch
(several --selftest in one process); otherwise one run per pair. Each pair is its own
result either way, and a run that fails fails each of its pairs with its reason.

Catches: a wrong dequantization or dot product for one quant type (e.g. a Q6_K scale), an
expert read from the wrong offset or with the wrong length (the slot's sha256 is compared
with the file's bytes, and the culprit expert is named when found).
"""

from __future__ import annotations

import time

from ...compare.arrays import compare_arrays
from ...contract.outputs import ContractError, read_selftest
from ...gguf.facts import ModelFacts
from ...reference.moe import expert_forward
from ..context import CheckContext
from ..result import FAIL, PASS, CheckResult
from .base import Task, kernel_paths, path_refused, path_suffix, run_failed

NAME = "kernel"


def auto_pairs(facts: ModelFacts) -> list[tuple[int, int]]:
    layers: list[int] = [0]
    seen_types, seen_sizes = set(), set()
    for il in range(facts.n_layer):
        new = facts.types[il] not in seen_types or facts.expert_bytes[il] not in seen_sizes
        seen_types.add(facts.types[il])
        seen_sizes.add(facts.expert_bytes[il])
        if new and il not in layers:
            layers.append(il)
    if facts.n_layer - 1 not in layers:
        layers.append(facts.n_layer - 1)
    experts = sorted({0, facts.n_expert - 1})
    return [(il, e) for il in sorted(layers) for e in experts]


class KernelSuite:
    name = NAME
    title = "kernel: one expert through the paged path (--selftest) vs the reference"
    description = __doc__
    requires = ("pager", "selftest")

    def pairs(self, ctx: CheckContext) -> list[tuple[int, int]]:
        p = ctx.cfg.kernel.pairs
        return auto_pairs(ctx.facts) if isinstance(p, str) else [tuple(x) for x in p]

    def plan(self, ctx: CheckContext) -> list[Task | CheckResult]:
        out: list[Task | CheckResult] = []
        pairs = []
        for il, e in self.pairs(ctx):
            if not (0 <= il < ctx.facts.n_layer and 0 <= e < ctx.facts.n_expert):
                out.append(CheckResult(NAME, f"L{il} E{e}", FAIL, f"kernel.pairs: ({il}, {e}) is not in the model "
                                       f"({ctx.facts.n_layer} layers x {ctx.facts.n_expert} experts)"))
            else:
                pairs.append((il, e))
        # one engine run per kernel path when the engine takes several --selftest (an engine
        # start is most of a selftest's time), else one per pair; each pair is its own result
        batched = ctx.engine.has("selftest_batch")
        for path in kernel_paths(ctx):
            for group in ([pairs] if batched and pairs else [[p] for p in pairs]):
                names = [f"L{il} E{e}{path_suffix(path)}" for il, e in group]
                out.append(Task(NAME, names[0] if len(names) == 1 else f"{len(names)} pairs{path_suffix(path)}",
                                lambda group=group, path=path: self.check(ctx, group, path), names=names,
                                cost=float(len(group))))
        return out

    def check(self, ctx: CheckContext, group: list[tuple[int, int]], path: str | None) -> list[CheckResult]:
        """One engine run of the group's selftests; a failed run fails every pair of it, with
        its reason."""
        rows = ctx.cfg.kernel.rows
        names = [f"L{il} E{e}{path_suffix(path)}" for il, e in group]
        d = ctx.dir("kernel" + (f"-{path}" if path else "") + (f"-L{group[0][0]}-E{group[0][1]}" if len(group) == 1 else ""))
        tests = [(il, e, rows, d / f"selftest-L{il}-E{e}.bin") for il, e in group]
        run = ctx.run_selftest(f"kernel {names[0] if len(names) == 1 else f'{len(names)} pairs{path_suffix(path)}'}",
                               tests, d, kernels=path)
        refused = path_refused(NAME, names, run, path, ctx)
        if refused:
            return refused
        if not run.ok:
            return run_failed(NAME, names, run)
        return [self.compare(ctx, il, e, name, path, run, out, run.seconds / len(group))
                for (il, e, _, out), name in zip(tests, names)]

    def compare(self, ctx: CheckContext, il: int, e: int, name: str, path: str | None, run, out,
                run_seconds: float) -> CheckResult:
        """Pair (il, e)'s selftest output against the file's bytes and the reference expert."""
        rows = ctx.cfg.kernel.rows
        tol = ctx.cfg.kernel.tolerance
        t0 = time.perf_counter()
        facts = ctx.facts
        where = f"L{il} E{e} ({facts.describe_layer(il)})"
        props = {"layer": il, "expert": e, "expert_types": "/".join(facts.types[il]),
                 "expert_bytes": facts.expert_bytes[il], "rows": rows, "atol": tol.atol, "rtol": tol.rtol,
                 "kernels": path or "default"}

        def result(status: str, msg: str) -> CheckResult:
            return CheckResult(NAME, name, status, msg, props, run_seconds + time.perf_counter() - t0,
                               run.stderr_tail(), f"command: {run.command_line()}")

        if run.slot_errors:
            return result(FAIL, f"{where}: engine reported a slot error: {run.slot_errors[0]}")
        try:
            st = read_selftest(out, layer=il, expert=e, n_rows=rows, n_embd=facts.n_embd)
        except ContractError as err:
            return result(FAIL, f"{where}: selftest output unusable: {err}")
        problems = []
        want = ctx.expert_sha256(il, e)
        props["slot_sha256"] = st.slot_sha256.hex()
        props["file_sha256"] = want.hex()
        if st.slot_sha256 != want:
            holds, props["slot_holds"] = self.what_the_slot_holds(ctx, il, e, st.slot_sha256)
            problems.append(f"slot bytes differ from the file's expert bytes "
                            f"(sha256 {st.slot_sha256.hex()[:12]} vs {want.hex()[:12]}): {holds}")
        ref = expert_forward(ctx.mf, il, e, st.x)
        diff = compare_arrays(st.y, ref, tol)
        props.update(diff.props())
        if not diff.ok:
            problems.append(f"expert output differs from the reference expert forward: {diff.text(tol)}")
        if problems:
            return result(FAIL, f"{where}: " + "; ".join(problems))
        return result(PASS, f"{where}: slot bytes match the file, output {diff.text(tol)}")

    @staticmethod
    def what_the_slot_holds(ctx: CheckContext, il: int, e: int, sha: bytes) -> tuple[str, str]:
        """Whose bytes a wrong slot holds: another expert's, or this expert's read at a wrong
        offset (one part or all three); the sentence and a short property."""
        found = ctx.find_expert_by_sha(sha, ctx.facts.expert_bytes[il])
        if found:
            return f"it holds the bytes of L{found[0]} E{found[1]}", f"L{found[0]} E{found[1]}"
        shifted = ctx.find_shifted_read(il, e, sha)
        if shifted:
            part, shift = shifted
            what = "every part" if part == "all" else f"its {part} part"
            off = "" if part == "all" else f" (file offset {ctx.mf.expert_range(il, e, part).offset + shift}, "\
                                          f"expected {ctx.mf.expert_range(il, e, part).offset})"
            return (f"it holds L{il} E{e}'s bytes with {what} read {shift:+d} B from where it is{off}",
                    f"L{il} E{e} {part} {shift:+d} B")
        return ("they match no expert of the file, nor this one read up to 8 KiB off (wrong length or a "
                "torn read?)", "unknown")


SUITE = KernelSuite()
