"""Pure numerics the verdicts rest on: arrays, logits, counters, timing statistics.
No I/O, no configuration, no engine: every comparison exists once, here."""
