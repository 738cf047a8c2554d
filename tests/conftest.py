"""Shared fixtures: the synthetic models, made once per machine into the model cache
(the cache's file lock makes parallel xdist workers wait rather than race)."""

from __future__ import annotations

import pytest

from epmci.synth.store import make_model


@pytest.fixture(scope="session")
def tiny_model():
    return make_model("tiny")


@pytest.fixture(scope="session")
def ci_model():
    return make_model("ci")
