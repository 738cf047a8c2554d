"""A model's summary as data (dimensions, expert quant types and sizes), and its rendering."""

from __future__ import annotations

import dataclasses

from .file import ModelFile


def model_summary(mf: ModelFile) -> dict:
    layers = []
    for il in range(mf.hp.n_layer):
        parts = {p: mf.expert_range(il, 0, p) for p in ("gate", "up", "down")}
        layers.append({"layer": il,
                       "types": {p: r.qtype.name for p, r in parts.items()},
                       "expert_bytes": sum(r.n_bytes for r in parts.values())})
    sizes = sorted({l["expert_bytes"] for l in layers})
    return {
        "path": str(mf.path),
        "architecture": mf.meta("general.architecture"),
        "name": mf.meta("general.name", ""),
        "hparams": dataclasses.asdict(mf.hp),
        "layers": layers,
        "expert_sizes": sizes,
        "n_expert_sizes": len(sizes),
        "total_expert_bytes": sum(l["expert_bytes"] for l in layers) * mf.hp.n_expert,
        "file_bytes": mf.path.stat().st_size,
    }


def render_summary(s: dict) -> str:
    hp = s["hparams"]
    mib = 2**20
    out = [
        f"{s['path']}",
        f"  architecture  {s['architecture']}  ({s['name']})",
        f"  layers {hp['n_layer']}  embd {hp['n_embd']}  heads {hp['n_head']}/{hp['n_head_kv']}x{hp['head_dim']}"
        f"  vocab {hp['n_vocab']}  ctx {hp['n_ctx_train']}",
        f"  experts {hp['n_expert']} (top-{hp['n_expert_used']})  expert FFN {hp['n_ff_exp']}",
        "  layer  gate   up     down   expert bytes",
    ]
    for l in s["layers"]:
        t = l["types"]
        out.append(f"  {l['layer']:>5}  {t['gate']:<6} {t['up']:<6} {t['down']:<6} {l['expert_bytes']:>12,}")
    out += [
        f"  distinct expert sizes  {s['n_expert_sizes']}  ({', '.join(f'{b:,}' for b in s['expert_sizes'])} B)",
        f"  total expert bytes     {s['total_expert_bytes']:,} ({s['total_expert_bytes'] / mib:.1f} MiB)",
        f"  file bytes             {s['file_bytes']:,} ({s['file_bytes'] / mib:.1f} MiB)",
    ]
    return "\n".join(out)
