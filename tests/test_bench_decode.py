"""bench/decode.py's prompt: exactly --prompt-tokens tokens of the model's tokenizer (the
issue's 128-token prefill is measured on 128 tokens, by both engines alike), and bad
arguments refused with exit 2 before any run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import decode  # noqa: E402

from engine.gguf_model import GGUFModel  # noqa: E402


@pytest.mark.parametrize("n", [1, 5, 33, 128])
def test_the_prompt_has_exactly_the_asked_tokens(ci_model, n):
    text = decode.prompt_of(str(ci_model), n)
    assert len(GGUFModel(str(ci_model)).tokenizer.encode(text, parse_special=True)) == n
    assert " ".join(decode.PROMPT.split() * 8).startswith(text)   # the bench prompt's words, in order


@pytest.mark.parametrize("args", [["--prompt-tokens", "0"], ["--batch", "0"], ["--n-predict", "1"]])
def test_bad_arguments_are_refused_before_any_run(ci_model, args):
    r = subprocess.run([sys.executable, str(BENCH / "decode.py"), "--model", str(ci_model), "--no-llama",
                        "--no-paged", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "must be >= 1" in r.stderr and "Traceback" not in r.stderr


def test_per_round_ratios_pair_the_same_round_and_skip_a_failed_one():
    """A run that failed in round 2 drops that round's ratio; it does not shift the later
    rounds onto their neighbours (round 3's 30 / 20, not 30 / 10)."""
    head = [{"decode_tok_s": 20.0}, {"error": "exit 1: boom"}, {"decode_tok_s": 30.0}]
    base = [{"decode_tok_s": 10.0}, {"decode_tok_s": 12.0}, {"decode_tok_s": 20.0}]
    assert decode.round_ratios_of(head, base, "decode_tok_s") == [2.0, 1.5]
    assert decode.round_ratios_of(base, [{"error": "timeout"}] * 3, "decode_tok_s") == []
    with pytest.raises(ValueError):   # rounds that do not pair are a bug, not a shorter list
        decode.round_ratios_of(head, base[:2], "decode_tok_s")
