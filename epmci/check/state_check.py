"""Check a run's delta-net state dumps (SDQ_STATE_DUMP, docs/engine-contract.md) against the
reference's states after the same positions: for every delta-net layer and every
micro-batch the engine evaluated, its conv window and recurrent matrix after the
micro-batch's last row.

Used by the model suite, whose run prefills a long prompt in many micro-batches and then
decodes: a state not carried from one micro-batch to the next differs after the second
micro-batch, a conv window off by a token after the first, a state reset between prefill
and decode after the first decode step -- and the first differing (position, layer) says
which.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..compare.arrays import Tolerance, compare_arrays
from ..contract.outputs import ContractError, StateRecord, read_state_dump
from ..gguf.file import ModelFile

STATE_FILE = "state"        # SDQ_STATE_DUMP prefix inside a run's directory


def deltanet_layers(mf: ModelFile) -> list[int]:
    return [il for il in range(mf.hp.n_layer) if mf.hp.is_recurrent(il)]


def read_states(mf: ModelFile, out: Path) -> dict[int, list[StateRecord]]:
    """Every delta-net layer's records; ContractError when one is unusable or the layers do
    not report the same micro-batches."""
    s = mf.hp.ssm
    conv, ssm = (s.conv_dim, s.conv_kernel - 1), (s.time_step_rank, s.state_size, s.state_size)
    states = {il: read_state_dump(out / f"{STATE_FILE}.{il}", il, conv, ssm) for il in deltanet_layers(mf)}
    spans = {il: [(r.pos0, r.n_rows) for r in recs] for il, recs in states.items()}
    first = next(iter(spans.values()))
    for il, sp in spans.items():
        if sp != first:
            raise ContractError(out / f"{STATE_FILE}.{il}", f"layer {il}'s micro-batches {sp[:4]}... differ from "
                                                            f"layer {deltanet_layers(mf)[0]}'s {first[:4]}...")
    return states


@dataclass
class StateVerdict:
    ok: bool
    message: str
    props: dict


def compare_states(states: dict[int, list[StateRecord]], reference_state, positions: int, prompt: int,
                   tol: Tolerance) -> StateVerdict:
    """states: read_states' records; reference_state(position, layer) -> (conv, ssm);
    `positions` the run evaluated, the first `prompt` of them the prompt's."""
    recs = next(iter(states.values()))
    props = {"state_layers": len(states), "state_records": len(recs),
             "state_atol": tol.atol, "state_rtol": tol.rtol}
    last = recs[-1].position
    if last != positions - 1:
        return StateVerdict(False, f"the state dumps end after position {last}, the run evaluated {positions} "
                                   f"positions (a micro-batch not dumped?)", props)
    bad = []
    for i, r in enumerate(recs):
        for il, layer_recs in states.items():
            conv, ssm = reference_state(r.position, il)
            d = {part: compare_arrays(getattr(layer_recs[i], part), want, tol)
                 for part, want in (("conv", conv), ("ssm", ssm))}
            if not all(x.ok for x in d.values()):
                bad.append((i, layer_recs[i], d))
    props["states_differ"] = len(bad)
    n = len(recs) * len(states)
    span = f"{len(states)} delta-net layers' conv window and recurrent state after each of {len(recs)} " \
           f"micro-batches (positions {recs[0].position}..{last})"
    if not bad:
        what = "bit-identical" if tol.atol == tol.rtol == 0 else "within tolerance"
        return StateVerdict(True, f"{span} {what}", props)
    i, r, d = bad[0]
    props.update(state_first_position=r.position, state_first_layer=r.layer)
    where = (f"prompt micro-batch {i + 1}, rows {r.pos0}..{r.position}" if r.pos0 < prompt
             else f"decode step {r.pos0 - prompt + 1}")
    parts = "; ".join(f"{'conv window' if p == 'conv' else 'recurrent (ssm) state'} "
                      f"{'equal' if x.ok else 'differs: ' + x.text(tol)}" for p, x in d.items())
    return StateVerdict(False, f"delta-net state differs from the reference in {len(bad)} of {n} (micro-batch, "
                               f"layer) states; first after position {r.position} ({where}) in layer {r.layer}: "
                               f"{parts}", props)
