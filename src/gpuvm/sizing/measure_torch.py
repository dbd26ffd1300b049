#!/usr/bin/env python3
"""What PyTorch allocates for a torchvision model's training state, measured (CPU).

Prints one JSON object per model: its parameter count, the bytes of its weights, of its gradients
after one backward pass, of its optimizer's state after one step (SGD with momentum, Adam), and
the bytes autograd saves for backward per sample (`activation_bytes_per_sample`: the tensors held
by the graph of one training step at batch 2 minus batch 1, unique storages counted once). And the
same for mixed precision (`mixed_*`): activations saved under bf16 autocast (CPU autocast's half
type), and the state of a half-precision copy of the model trained through fp32 master weights
(half weights and gradients, fp32 master weights and SGD momentum), as apex O2 and ZeRO keep it.

gpuvm's sizing tables and honesty tests read these numbers; it runs under the interpreter that has
PyTorch and torchvision (Debian's /usr/bin/python3 on the test machine):

    /usr/bin/python3 src/gpuvm/sizing/measure_torch.py resnet18 resnet50 --image-size 224
"""

from __future__ import annotations

import argparse
import copy
import json
import sys

import torch
import torchvision


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def optimizer_state_bytes(model: torch.nn.Module, optimizer_class, **options) -> int:
    """The optimizer's state after one step (its buffers exist from the first step on)."""
    optimizer = optimizer_class(model.parameters(), lr=0.01, **options)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    state = [v for per_param in optimizer.state.values() for v in per_param.values()
             if torch.is_tensor(v) and v.dim() > 0]  # Adam's `step` is a 0-d counter, not state
    return tensor_bytes(state)


def saved_bytes(model: torch.nn.Module, batch: int, image_size: int, mixed: bool = False) -> int:
    """Bytes of the unique storages autograd keeps for backward in one forward pass."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    x = torch.randn(batch, 3, image_size, image_size)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
        loss = model(x).float().sum()
    del loss
    storages.pop(x.storage().data_ptr(), None)  # the input batch is the data loader's, not activations
    return sum(storages.values())


def mixed_state_bytes(model: torch.nn.Module, image_size: int) -> dict[str, int]:
    """Half weights and gradients (one real backward pass), fp32 master weights, SGD momentum on them."""
    half = copy.deepcopy(model).to(torch.bfloat16)
    params = list(half.parameters())
    try:
        half(torch.randn(2, 3, 64, 64, dtype=torch.bfloat16)).float().sum().backward()
    except RuntimeError:  # an op without a bf16 backward on CPU (ReLU6): autograd's buffers, as it makes them
        for p in params:
            p.grad = torch.zeros_like(p)
    master = [p.detach().float().requires_grad_() for p in params]
    return {"mixed_weights_bytes": tensor_bytes(params),
            "mixed_gradients_bytes": tensor_bytes(p.grad for p in params),
            "mixed_master_bytes": tensor_bytes(master),
            "mixed_sgd_momentum_state_bytes": _momentum_bytes(master)}


def _momentum_bytes(master: list[torch.Tensor]) -> int:
    optimizer = torch.optim.SGD(master, lr=0.01, momentum=0.9)
    for p in master:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return tensor_bytes(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))


def measure(name: str, image_size: int) -> dict:
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, num_classes=1000)
    model.train()
    params = list(model.parameters())
    weights = tensor_bytes(params)
    model(torch.randn(2, 3, image_size, image_size)).sum().backward()
    gradients = tensor_bytes(p.grad for p in params)
    model.zero_grad(set_to_none=True)
    per_sample = saved_bytes(model, 2, image_size) - saved_bytes(model, 1, image_size)
    mixed_per_sample = saved_bytes(model, 2, image_size, mixed=True) - saved_bytes(model, 1, image_size, mixed=True)
    return {
        "model": name,
        "parameters": sum(p.numel() for p in params),
        "weights_bytes": weights,
        "gradients_bytes": gradients,
        "sgd_momentum_state_bytes": optimizer_state_bytes(model, torch.optim.SGD, momentum=0.9),
        "adam_state_bytes": optimizer_state_bytes(model, torch.optim.Adam),
        "activation_bytes_per_sample": per_sample,
        "mixed_activation_bytes_per_sample": mixed_per_sample,
        **mixed_state_bytes(model, image_size),
        "image_size": image_size,
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--image-size", type=int, default=224)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.models:
        print(json.dumps(measure(name, args.image_size)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
