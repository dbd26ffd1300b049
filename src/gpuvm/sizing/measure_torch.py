#!/usr/bin/env python3
"""What PyTorch allocates for a torchvision model's training state, measured (CPU).

Prints one JSON object per model: its parameter count, the bytes of its weights, of its gradients
after one backward pass, of its optimizer's state after one step (SGD with momentum, Adam), and
the bytes autograd saves for backward per sample (`activation_bytes_per_sample`: the tensors held
by the graph of one training step at batch 2 minus batch 1, unique storages counted once).

gpuvm's sizing tables and honesty tests read these numbers; it runs under the interpreter that has
PyTorch and torchvision (Debian's /usr/bin/python3 on the test machine):

    /usr/bin/python3 src/gpuvm/sizing/measure_torch.py resnet18 resnet50 --image-size 224
"""

from __future__ import annotations

import argparse
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


def saved_bytes(model: torch.nn.Module, batch: int, image_size: int) -> int:
    """Bytes of the unique storages autograd keeps for backward in one forward pass."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    x = torch.randn(batch, 3, image_size, image_size)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).sum()
    del loss
    storages.pop(x.storage().data_ptr(), None)  # the input batch is the data loader's, not activations
    return sum(storages.values())


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
    return {
        "model": name,
        "parameters": sum(p.numel() for p in params),
        "weights_bytes": weights,
        "gradients_bytes": gradients,
        "sgd_momentum_state_bytes": optimizer_state_bytes(model, torch.optim.SGD, momentum=0.9),
        "adam_state_bytes": optimizer_state_bytes(model, torch.optim.Adam),
        "activation_bytes_per_sample": per_sample,
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
