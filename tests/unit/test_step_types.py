"""`Step[TargetT, FactT]`: every step's verbs agree on its target and fact types, and a vSphere
step's target is the desired state of its role. What a type checker would say of the STEP lines,
checked from the annotations (the project's tests run without one)."""

from __future__ import annotations

import inspect
import typing

import pytest

from gpuvm.desired import DesiredHost, DesiredVm
from gpuvm.engine import STEPS

VSPHERE_TARGETS = {"host": DesiredHost, "vm": DesiredVm}


def _parameters(function: typing.Callable) -> tuple[list[object], object]:
    hints = typing.get_type_hints(function)
    return [hints.get(name) for name in inspect.signature(function).parameters], hints.get("return")


@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
def test_the_verbs_of_a_step_agree_on_its_target_and_fact(step):
    (_, target), fact = _parameters(step.observe)
    (plan_target, plan_fact), _ = _parameters(step.plan)
    (_, apply_target, _), _ = _parameters(step.apply)
    (wanted_target,), _ = _parameters(step.wanted)
    assert target is not None and fact is not None, f"{step.name}: observe is not annotated"
    assert (plan_target, plan_fact) == (target, fact), f"{step.name}: plan takes what observe does not give"
    assert apply_target == target, f"{step.name}: apply takes {apply_target}, observe {target}"
    assert wanted_target in (target, object), f"{step.name}: wanted takes {wanted_target}"
    if step.role in VSPHERE_TARGETS:
        assert target is VSPHERE_TARGETS[step.role], f"{step.name}: a {step.role} step's target is {target}"
