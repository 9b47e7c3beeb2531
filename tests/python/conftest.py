"""pytest setup for the ulorl Python tests: a fixed, printed seed; the package comes from PYTHONPATH
(CTest sets it to the source and build trees) or from an installed wheel."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # oracles.py

SEED = int(os.environ.get("ULORL_TEST_SEED", "20250717"))


@pytest.fixture
def gen():
    print(f"ulorl python test seed {SEED}")
    return torch.Generator().manual_seed(SEED)


def golden_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get("ULORL_GOLDEN_DIR", os.path.join(here, "..", "golden"))


@pytest.fixture
def compiles_like_eager():
    """check(step, run): run(fn) -> tuple of tensors, called with `step` and with
    torch.compile(step, fullgraph=True) under the aot_eager and inductor backends; every tensor of
    the compiled runs equals the eager run's."""
    def check(step, run):
        eager = run(step)
        for backend in ("aot_eager", "inductor"):
            torch._dynamo.reset()
            compiled = run(torch.compile(step, fullgraph=True, backend=backend))
            for a, b in zip(eager, compiled):
                assert torch.equal(a, b), backend
    return check
