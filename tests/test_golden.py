"""Golden files: YAML + logits side file round trip, atomic rewrite, validation (a corrupt or
schema-mismatched file is one line and exit 2, from `epmci golden show` and from `epmci
check`), diff, history, and the baselines shipped in golden/."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml

from epmci.perf import golden as G
from epmci.cli import main as epmci_main
from epmci.errors import InputError

REPO = Path(__file__).resolve().parent.parent


def sample_golden(seed: int = 0, misses: int = 26) -> G.Golden:
    rng = np.random.default_rng(seed)
    counters = {"prefill": {"tokens": 5, "hits": 10, "misses": 4, "evictions": 3, "ssd_bytes": 1000,
                            "ssd_bytes_per_token": 200.0},
                "decode": {"tokens": 15, "hits": 94, "misses": misses, "evictions": 84, "ssd_bytes": 9000,
                           "ssd_bytes_per_token": 600.0, "prefetch_issued": 58, "prefetch_used": 56}}
    routes = rng.integers(0, 256, (4, 7, 8)).astype(np.uint16)     # 4 layers, 7 rows, top-8 (prompt 1 only)
    prompts = [{"prompt_tokens": 5, "first_tokens": [1, 2, 3], "logits_rows": 7, "logits_sha256": "ab" * 32,
                "text_sha256": "cd" * 32, "counters": counters, "routing_sha256": G.routing_sha256(routes)},
               {"prompt_tokens": 9, "first_tokens": [4, 5, 6], "logits_rows": 11, "logits_sha256": "ef" * 32,
                "text_sha256": "01" * 32, "counters": counters}]
    return G.Golden(
        profile="t", model={"id": "tiny-seed0-gen9", "preset": "tiny", "seed": 0, "generator_version": 9,
                            "sha256": "00" * 32, "bytes": 123},
        settings={"prompts": ["The", "請用一句話介紹你自己。"], "n_predict": 3, "batch": 8, "ctx": 64, "threads": 1,
                  "ram_budget_mb": 1024.0, "golden_rows": 3},
        scenarios={"baseline": {"args": {}, "env": {}, "prefetch": True, "arena_mb": 1.9,
                                "timing": {"metric": "decode tok/s", "samples": [10.0, 11.0, 12.0], "median": 11.0},
                                "peak_rss_mb": 175.0, "vm_swap_mb": 0.0, "prompts": prompts}},
        machine={"cpu_model": "X", "n_cpus": 2},
        recorded={"date": "2026-01-01T00:00:00+0000", "reason": "test"},
        logits={"baseline/0": rng.standard_normal((3, 16)).astype(np.float32),
                "baseline/1": rng.standard_normal((3, 16)).astype(np.float32)},
        routing={"baseline/0": routes})


def test_round_trip(tmp_path):
    g = sample_golden()
    path = G.write(g, tmp_path / "t" / "tiny-seed0-gen9.yaml")
    back = G.load(path)
    assert back.profile == g.profile and back.model == g.model and back.settings == g.settings
    assert back.scenarios == g.scenarios and back.machine == g.machine and back.recorded == g.recorded
    for k, a in g.logits.items():
        assert back.logits[k].tobytes() == a.tobytes()          # float32 rows exactly
    assert back.routes("baseline", 0).tolist() == g.routing["baseline/0"].tolist()
    assert back.routes("baseline", 1) is None                    # not recorded for that prompt
    side = path.parent / back.logits_file
    assert side.name.startswith("tiny-seed0-gen9.") and side.suffix == ".logits"
    assert hashlib.sha256(side.read_bytes()).hexdigest().startswith(side.name.split(".")[1])
    assert path.stat().st_size < 8192 and side.stat().st_size < 8192
    assert oct(path.stat().st_mode & 0o777) != oct(0o600)       # not mkstemp's private mode
    # writing the same data again gives the same bytes (deterministic), and no stray files
    first = path.read_bytes()
    G.write(G.load(path), path)
    assert path.read_bytes() == first
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, side.name])


def test_rewrite_replaces_the_side_file(tmp_path):
    path = tmp_path / "g.yaml"
    G.write(sample_golden(0), path)
    old = G.load(path).logits_file
    G.write(sample_golden(1), path)
    new = G.load(path).logits_file
    assert old != new and not (tmp_path / old).exists() and (tmp_path / new).exists()


def test_history_keeps_earlier_reasons():
    g = sample_golden()
    g.history = [{"date": f"d{i}", "reason": f"r{i}"} for i in range(G.HISTORY_KEEP)]
    h = G.new_history(g)
    assert h[0] == {"date": g.recorded["date"], "reason": "test"}
    assert len(h) == G.HISTORY_KEEP and h[1] == {"date": "d0", "reason": "r0"}
    assert G.new_history(None) == []


def _mutate(path: Path, fn) -> None:
    d = yaml.safe_load(path.read_text())
    fn(d)
    path.write_text(G.dump_yaml(d))


@pytest.mark.parametrize("case,problem", [
    ("not yaml", "not valid YAML"),
    ("schema", "schema 99"),
    ("list", "top level must be a mapping"),
    ("missing", "scenarios: missing"),
    ("type", "first_tokens: expected list"),
    ("side missing", "side file"),
    ("side tampered", "does not match its side file"),
    ("machine speed", "timing.machine_speed: expected positive cpu_ms and disk_mib_s"),
    ("read-wait share", "timing.io_wait_share: expected a number from 0 to 1"),
])
def test_bad_golden_is_an_input_error(tmp_path, case, problem):
    path = G.write(sample_golden(), tmp_path / "g.yaml")
    if case == "not yaml":
        path.write_text("schema: 1\nprofile: [unclosed\n")
    elif case == "schema":
        _mutate(path, lambda d: d.update(schema=99))
    elif case == "list":
        path.write_text("- 1\n- 2\n")
    elif case == "missing":
        _mutate(path, lambda d: d.pop("scenarios"))
    elif case == "type":
        _mutate(path, lambda d: d["scenarios"]["baseline"]["prompts"][0].update(first_tokens="x"))
    elif case == "side missing":
        (tmp_path / G.load(path).logits_file).unlink()
    elif case in ("machine speed", "read-wait share"):
        bad = {"machine_speed": {"cpu_ms": 0, "disk_mib_s": 100.0}} if case == "machine speed" else {"io_wait_share": 1.5}
        _mutate(path, lambda d: d["scenarios"]["baseline"].update(
            timing={"metric": "decode tok/s", "samples": [1.0], "median": 1.0, **bad}))
    elif case == "side tampered":
        side = tmp_path / G.load(path).logits_file
        side.write_bytes(side.read_bytes()[:-1] + b"\0")
    with pytest.raises(InputError) as e:
        G.load(path)
    assert problem in e.value.problem, e.value.problem
    if case == "side tampered":  # the YAML holds the digest, so it is named first
        assert Path(e.value.where) == path, e.value.where


@pytest.mark.parametrize("content,problem", [
    ("schema: 1\nprofile: [unclosed\n", "not valid YAML"),
    ("schema: 0\nkind: epmci-golden\n", "golden schema 0, this epmci reads schema 1"),
])
def test_golden_show_corrupt_file_exits_2_with_one_line(tmp_path, capsys, content, problem):
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    assert epmci_main(["golden", "show", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and problem in err[0], err


@pytest.mark.parametrize("content", ["profile: [broken\n", "schema: 2\nkind: epmci-golden\n"])
def test_check_with_corrupt_golden_exits_2(tmp_path, tiny_model, capsys, content):
    from epmci.gguf.identity import model_identity
    gdir = tmp_path / "golden"
    f = gdir / "t" / f"{model_identity(tiny_model)['id']}.yaml"
    f.parent.mkdir(parents=True)
    f.write_text(content)
    js = tmp_path / "r.json"
    rc = epmci_main(["check", "-q", "--no-build", "--model", str(tiny_model), "--suites", "perf", "--profile", "t",
                     "--set", f"perf.golden_dir={gdir}", "--json", str(js), "--workdir", str(tmp_path / "w")])
    assert rc == 2
    err = capsys.readouterr().err
    assert str(f) in err and "epmci: error:" in err
    import json
    rep = json.loads(js.read_text())
    assert rep["exit_code"] == 2 and str(f) in rep["tool_error"]


def test_diff_and_cli(tmp_path, capsys):
    a = G.write(sample_golden(0), tmp_path / "a" / "g.yaml")
    b = G.write(sample_golden(0, misses=30), tmp_path / "b" / "g.yaml")
    lines = G.diff(G.load(a), G.load(b))
    assert any("decode.misses 26 -> 30" in l and "[worse]" in l for l in lines), lines
    assert epmci_main(["golden", "diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "decode.misses 26 -> 30" in out
    assert epmci_main(["golden", "diff", str(a), str(a)]) == 0
    assert "(no differences)" in capsys.readouterr().out
    c = G.write(sample_golden(1), tmp_path / "c" / "g.yaml")        # other logits rows
    g = G.load(c)
    g.scenarios["baseline"]["prompts"][0]["logits_sha256"] = "99" * 32
    lines = G.diff(G.load(a), g)
    assert any("logits digest" in l and "KL(golden||current)" in l for l in lines), lines
    assert epmci_main(["golden", "show", str(a)]) == 0
    out = capsys.readouterr().out
    assert "profile t" in out and "decode 11.00 tok/s" in out


def test_pack_unpack_side_file():
    rows = {"s/0": np.arange(12, dtype=np.float32).reshape(3, 4), "s/1": np.ones((1, 4), np.float32)}
    routes = {"s/0": np.array([[[3, 1], [255, 0]]], np.uint16)}
    back, back_routes = G.unpack_side(G.pack_side(rows, routes), "x")
    assert {k: v.tolist() for k, v in back.items()} == {k: v.tolist() for k, v in rows.items()}
    assert {k: v.tolist() for k, v in back_routes.items()} == {k: v.tolist() for k, v in routes.items()}
    with pytest.raises(InputError):
        G.unpack_side(b"NOPE" + b"\0" * 20, "x")


def test_version_1_side_files_still_load():
    """Side files written before routing was recorded (float32 rows only) load, without routing."""
    rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    header = json.dumps({"entries": [{"key": "s/0", "rows": 2, "n_vocab": 4}]}).encode()
    v1 = G.LOGITS_MAGIC + struct.pack("<II", 1, len(header)) + header + zlib.compress(rows.tobytes())
    logits, routing = G.unpack_side(v1, "x")
    assert logits["s/0"].tolist() == rows.tolist() and routing == {}


def test_a_routing_digest_that_does_not_match_the_side_file_is_an_input_error(tmp_path):
    path = G.write(sample_golden(), tmp_path / "g.yaml")
    _mutate(path, lambda d: d["scenarios"]["baseline"]["prompts"][0].__setitem__("routing_sha256", "12" * 32))
    with pytest.raises(InputError, match="routing_sha256: does not match the side file"):
        G.load(path)


def test_shipped_baselines_load_and_match_the_ci_model():
    """golden/ ships the ci model's baselines for the default profile, so a fresh clone's
    `epmci check --fast` compares against something real."""
    from epmci.config import load_config
    from epmci.synth.presets import GENERATOR_VERSION
    cfg = load_config(REPO / "epmci.yaml")
    files = sorted((REPO / "golden").glob("*/*.yaml"))
    assert files, "no golden baselines shipped"
    default = REPO / "golden" / cfg.perf.profile / f"ci-seed0-gen{GENERATOR_VERSION}.yaml"
    assert default in files, f"{default} missing: re-record with `epmci golden update --profile " \
                             f"{cfg.perf.profile} --reason ...` (the model generator version changed?)"
    for f in files:
        g = G.load(f)
        assert f.parent.name == g.profile
        assert g.settings["prompts"] == cfg.perf.prompts
        for s in g.scenarios.values():
            assert s["prompts"] and all(p["counters"]["decode"]["tokens"] > 0 for p in s["prompts"])
        # the repository stays light: a few tens of KiB per small model; the production-size
        # model's 248k-token rows are ~1 MB each, so its baselines keep one row per prompt
        size = f.stat().st_size + (f.parent / g.logits_file).stat().st_size
        assert size < (4_000_000 if g.model.get("preset") == "prod35-full" else 200_000), f


def test_golden_knows_whose_baselines_it_holds(tmp_path, capsys):
    """A golden file records the engine's identity; another engine is foreign to it. Files
    from before engines declared themselves know their engine by its command."""
    g = sample_golden()
    g.engine = {"name": "epm-engine", "version": "0.1.0", "contract": 2, "command": "bundled engine (python -m engine)"}
    path = G.write(g, tmp_path / "t" / "m.yaml")
    back = G.load(path)
    assert back.engine == g.engine and back.engine_name() == "epm-engine"
    ours = {"name": "epm-engine", "command": "python3 copy.py"}
    assert back.foreign(ours) is None                       # a copy of the engine is the engine
    msg = back.foreign({"name": "llama-cpp-engine", "command": "x"})
    assert "engine 'epm-engine', this check runs 'llama-cpp-engine'" in msg
    legacy = sample_golden()
    legacy.recorded["engine"] = "bundled engine (python -m engine)"
    assert legacy.foreign({"name": "epm-engine", "command": "bundled engine (python -m engine)"}) is None
    assert "this check runs 'python3 other.py'" in legacy.foreign({"name": "epm-engine", "command": "python3 other.py"})
    other = sample_golden()
    other.engine = {**g.engine, "name": "llama-cpp-engine"}
    assert "engine: epm-engine -> llama-cpp-engine" in G.diff(back, other)
    assert "engine epm-engine 0.1.0 (contract 2)" in G.render(back)
    d = yaml.safe_load(path.read_text())
    d["engine"] = {"version": "1"}
    path.write_text(G.dump_yaml(d))
    with pytest.raises(InputError, match="engine.name: missing"):
        G.load(path)
