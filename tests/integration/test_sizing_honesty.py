"""Is `gpuvm size` honest? Its memory figures against what real PyTorch (Debian's python3-torch,
CPU) allocates for torchvision models, parameter counts taken from the models themselves."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from gpuvm.sizing.estimate import GIB, model_memory
from gpuvm.sizing.tables import MODELS

pytestmark = pytest.mark.integration

PYTHON = "/usr/bin/python3"  # the distribution's Python: python3-torch, python3-torchvision
MEASURE = os.path.join(os.path.dirname(__file__), "..", "..", "src", "gpuvm", "sizing", "measure_torch.py")


@pytest.fixture(scope="module")
def allocated() -> dict[str, dict]:
    if os.system(f"{PYTHON} -c 'import torch, torchvision' 2>/dev/null") != 0:
        pytest.fail(f"{PYTHON} cannot import torch and torchvision: apt-get install python3-torch python3-torchvision")
    done = subprocess.run([PYTHON, MEASURE, "resnet18", "mobilenet_v2"], capture_output=True, text=True,
                          timeout=120, check=True)
    return {m["model"]: m for m in map(json.loads, done.stdout.splitlines())}


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
@pytest.mark.parametrize(("optimizer", "state_key"), [("sgd-momentum", "sgd_momentum_state_bytes"),
                                                      ("adam", "adam_state_bytes")])
def test_weights_gradients_and_optimizer_state_are_what_pytorch_allocates(allocated, name, optimizer, state_key):
    measured = allocated[name]
    memory = model_memory(measured["parameters"], "fp32", optimizer, activation_bytes=0)
    assert memory.weights * GIB == measured["weights_bytes"]
    assert memory.gradients * GIB == measured["gradients_bytes"]
    assert memory.optimizer_state * GIB == measured[state_key]


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_the_table_holds_the_models_own_counts_and_activations(allocated, name):
    measured, table = allocated[name], MODELS[name]
    assert table.parameters == measured["parameters"]
    assert table.activation_bytes_per_sample == pytest.approx(measured["activation_bytes_per_sample"], rel=0.05)
