"""A model's summary as data (dimensions, layer kinds, expert quant types and sizes, the
shared expert), and its rendering."""

from __future__ import annotations

import dataclasses

from .file import EXPERT_PARTS, ModelFile


def model_summary(mf: ModelFile) -> dict:
    hp = mf.hp
    layers = []
    for il in range(hp.n_layer):
        parts = {p: mf.expert_range(il, 0, p) for p in EXPERT_PARTS}
        layer = {"layer": il, "kind": hp.layer_kind(il),
                 "types": {p: r.qtype.name for p, r in parts.items()},
                 "expert_bytes": sum(r.n_bytes for r in parts.values())}
        if hp.n_ff_shexp:
            shared = [mf.tensor(f"blk.{il}.ffn_{p}_shexp.weight") for p in EXPERT_PARTS]
            layer["shared_expert"] = {"types": {p: t.qtype.name for p, t in zip(EXPERT_PARTS, shared)},
                                      "bytes": sum(t.n_bytes for t in shared)}
        layers.append(layer)
    sizes = sorted({l["expert_bytes"] for l in layers})
    return {
        "path": str(mf.path),
        "architecture": mf.meta("general.architecture"),
        "name": mf.meta("general.name", ""),
        "hparams": dataclasses.asdict(hp),
        "layers": layers,
        "layer_kinds": {k: sum(l["kind"] == k for l in layers) for k in sorted({l["kind"] for l in layers})},
        "expert_sizes": sizes,
        "n_expert_sizes": len(sizes),
        "total_expert_bytes": sum(l["expert_bytes"] for l in layers) * hp.n_expert,
        "file_bytes": mf.path.stat().st_size,
    }


def render_summary(s: dict) -> str:
    hp = s["hparams"]
    mib = 2**20
    shared = any("shared_expert" in l for l in s["layers"])
    out = [
        f"{s['path']}",
        f"  architecture  {s['architecture']}  ({s['name']})",
        f"  layers {hp['n_layer']}  embd {hp['n_embd']}  heads {hp['n_head']}/{hp['n_head_kv']}x{hp['head_dim']}"
        f"  vocab {hp['n_vocab']}  ctx {hp['n_ctx_train']}",
        f"  experts {hp['n_expert']} (top-{hp['n_expert_used']})  expert FFN {hp['n_ff_exp']}"
        + (f"  + shared expert FFN {hp['n_ff_shexp']} (not paged)" if shared else ""),
    ]
    if hp["ssm"]:
        ssm = hp["ssm"]
        out.append(f"  layer kinds  {', '.join(f'{n} {k}' for k, n in s['layer_kinds'].items())}"
                   f"  (delta net: {ssm['group_count']} q/k + {ssm['time_step_rank']} v heads x"
                   f" {ssm['state_size']}, conv {ssm['conv_kernel']};"
                   f" rope {hp['rope_dim']} of {hp['head_dim']} dims, sections {hp['rope_sections']})")
    out.append("  layer  kind       gate   up     down   expert bytes" + ("   shared (gate/up/down)" if shared else ""))
    for l in s["layers"]:
        t = l["types"]
        row = f"  {l['layer']:>5}  {l['kind']:<10} {t['gate']:<6} {t['up']:<6} {t['down']:<6} {l['expert_bytes']:>12,}"
        if "shared_expert" in l:
            sh = l["shared_expert"]
            row += f"   {'/'.join(sh['types'].values())} {sh['bytes']:,} B"
        out.append(row)
    out += [
        f"  distinct expert sizes  {s['n_expert_sizes']}  ({', '.join(f'{b:,}' for b in s['expert_sizes'])} B)",
        f"  total expert bytes     {s['total_expert_bytes']:,} ({s['total_expert_bytes'] / mib:.1f} MiB)",
        f"  file bytes             {s['file_bytes']:,} ({s['file_bytes'] / mib:.1f} MiB)",
    ]
    return "\n".join(out)
