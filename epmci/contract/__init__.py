"""How epmci talks to an engine (docs/engine-contract.md): the one command-line builder
(runspec), the process runner (process), the gate's side of the pacing protocol (pace),
the output readers (outputs), the build (build), and what is specific to the bundled
engine (bundled)."""
