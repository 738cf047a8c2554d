"""Measurement and baselines: one measured engine run (measure), the scenario loop that the
perf suite and golden recording share (run), the plan of a perf comparison (plan), the golden
file format (golden) and its recording (record), A/B of two engines alive at once with their
decode steps interleaved (paced), whole-run A/B (abba), the machine fingerprint (machine)
and the experiment matrix of `epmci bench` (bench). Never
imports epmci.check: the check's perf suite renders verdicts over what this measures."""
