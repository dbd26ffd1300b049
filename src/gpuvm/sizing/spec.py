"""What `gpuvm size` is asked: the runbook's `sizing` section, or the same fields as flags.

    sizing:
      model: resnet50          # from gpuvm's table (gpuvm size --help lists it), or give parameters
      precision: fp16          # fp32 (TF32 from Ampere on) | fp16 | bf16 (mixed precision); tf32, amp: aliases
      optimizer: sgd-momentum  # sgd | sgd-momentum | adam | adamw
      batch_per_gpu: 1024
      gpu: a100-80gb           # from the table (h200, b200, l40s, ...), or a name as vSphere/nvidia-smi print it
      gpus: 4                  # per job
      jobs: 1                  # trained at once, all reading from the same storage
      sample_kb: 110           # one sample on disk (ImageNet's mean JPEG)
      storage_latency_ms: 1    # one read's latency at the storage
      decode_per_core: 320     # images/s one CPU core decodes (pytorch_train.py --decode-only)
      epochs: 90               # with hours: the GPU count that trains them in time
      hours: 12
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from gpuvm.runbook.strict import Strict
from gpuvm.sizing.tables import GPUS, MODELS, find_gpu


class SizingSpec(Strict):
    model: str | None = None  # a model of the table: resnet18, resnet50, resnet101, vgg16, mobilenet_v2
    parameters: int | None = Field(default=None, ge=1)  # a model not in the table
    forward_gflops: float | None = Field(default=None, gt=0)  # its forward pass per sample (2 per multiply-add)
    activation_mb_per_sample: float | None = Field(default=None, ge=0)  # saved for backward, fp32
    precision: Literal["fp32", "fp16", "bf16"] = "fp32"  # fp16, bf16: mixed precision
    optimizer: Literal["sgd", "sgd-momentum", "adam", "adamw"] = "sgd-momentum"  # sets the optimizer state's size
    batch_per_gpu: int = Field(default=64, ge=1)  # samples per GPU per step
    gpu: str = "a100-80gb"  # a GPU of the table (gpuvm size --help lists them)
    gpus: int = Field(default=1, ge=1, le=100_000)  # GPUs per job
    jobs: int = Field(default=1, ge=1, le=10_000)  # jobs reading from the storage at once
    sample_kb: float = Field(default=110, gt=0)  # one sample on disk, KB
    dataset_samples: int = Field(default=1_281_167, ge=1)  # ImageNet-1k's training set
    storage_latency_ms: float = Field(default=1.0, gt=0)  # one storage read's latency, ms
    io_kb: float | None = Field(default=None, gt=0)  # one read; default: a whole sample
    checkpoint_minutes: float = Field(default=30, gt=0)  # minutes between checkpoints
    decode_per_core: float | None = Field(default=None, gt=0)  # images/s one CPU core decodes; default: gpuvm's measurement
    utilization: float | None = Field(default=None, gt=0, le=1)  # of the GPU's peak: replaces the tables' rate
    scaling_efficiency: float | None = Field(default=None, gt=0, le=1)  # n GPUs' rate over n x one's
    epochs: float | None = Field(default=None, gt=0)  # time to train: this many epochs ...
    hours: float | None = Field(default=None, gt=0)  # ... within this many hours

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_names(cls, value: object) -> object:
        """NVIDIA's tables' names: TF32 is fp32 training on tensor cores, AMP is mixed precision (fp16)."""
        return {"tf32": "fp32", "amp": "fp16", "mixed": "fp16"}.get(value, value) if isinstance(value, str) else value

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str | None) -> str | None:
        if value is not None and value not in MODELS:
            raise ValueError(f"'{value}' is not in gpuvm's table ({', '.join(MODELS)}); "
                             "give parameters (and forward_gflops) instead")
        return value

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        if find_gpu(value) is None:
            raise ValueError(f"'{value}' is not a GPU of gpuvm's table ({', '.join(GPUS)}), "
                             "nor a name of one of them")
        return value

    @model_validator(mode="after")
    def _model_or_parameters(self) -> SizingSpec:
        if self.model is None and self.parameters is None:
            raise ValueError(f"give model ({', '.join(MODELS)}) or parameters (a count, such as 7e9)")
        if (self.epochs is None) != (self.hours is None):
            raise ValueError("give epochs and hours together (the time to train them in)")
        return self
