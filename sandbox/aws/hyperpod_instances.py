"""What a HyperPod instance type looks like to Kubernetes: vCPUs, memory, GPUs, Neuron devices and EFA.

HyperPod Nodes in the emulator must advertise the capacity a real node of that type has, because the
product sizes jobs and quotas from ``nvidia.com/gpu``, ``aws.amazon.com/neurondevice`` and
``vpc.amazonaws.com/efa``. The table is the HyperPod SDK's ``INSTANCE_RESOURCES`` (aws/sagemaker-hyperpod-cli
``src/sagemaker/hyperpod/training/constants.py`` @ 011ca927); types the SDK does not list (Graviton, AMD,
g4dn, g7) get vCPUs from the size suffix and memory from the family, with no accelerators unless known.
Never guess for a type outside the API's ``ClusterInstanceType`` enum: the front rejects those first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# type: (vCPU, NVIDIA GPUs, Neuron devices, memory GiB, EFA interfaces)
_TABLE: dict[str, tuple[int, int, int, int, int]] = {
    "ml.p4d.24xlarge": (96, 8, 0, 1152, 4), "ml.p4de.24xlarge": (96, 8, 0, 1152, 4),
    "ml.p5.48xlarge": (192, 8, 0, 2048, 32), "ml.p5.4xlarge": (16, 1, 0, 256, 1),
    "ml.trn1.32xlarge": (128, 0, 16, 512, 8), "ml.trn1n.32xlarge": (128, 0, 16, 512, 16),
    "ml.g5.xlarge": (4, 1, 0, 16, 0), "ml.g5.2xlarge": (8, 1, 0, 32, 0), "ml.g5.4xlarge": (16, 1, 0, 64, 0),
    "ml.g5.8xlarge": (32, 1, 0, 128, 1), "ml.g5.12xlarge": (48, 4, 0, 192, 1), "ml.g5.16xlarge": (64, 1, 0, 256, 1),
    "ml.g5.24xlarge": (96, 4, 0, 384, 1), "ml.g5.48xlarge": (192, 8, 0, 768, 1), "ml.g6.xlarge": (4, 1, 0, 16, 0),
    "ml.g6.2xlarge": (8, 1, 0, 32, 0), "ml.g6.4xlarge": (16, 1, 0, 64, 0), "ml.g6.8xlarge": (32, 1, 0, 128, 1),
    "ml.g6.16xlarge": (64, 1, 0, 256, 1), "ml.g6.12xlarge": (48, 4, 0, 192, 1), "ml.g6.24xlarge": (96, 4, 0, 384, 1),
    "ml.g6.48xlarge": (192, 8, 0, 768, 1), "ml.gr6.4xlarge": (16, 1, 0, 128, 0),
    "ml.gr6.8xlarge": (32, 1, 0, 256, 1), "ml.g6e.xlarge": (4, 1, 0, 32, 0), "ml.g6e.2xlarge": (8, 1, 0, 64, 0),
    "ml.g6e.4xlarge": (16, 1, 0, 128, 0), "ml.g6e.8xlarge": (32, 1, 0, 256, 1),
    "ml.g6e.16xlarge": (64, 1, 0, 512, 1), "ml.g6e.12xlarge": (48, 4, 0, 384, 1),
    "ml.g6e.24xlarge": (96, 4, 0, 768, 2), "ml.g6e.48xlarge": (192, 8, 0, 1536, 4),
    "ml.g7e.2xlarge": (8, 1, 0, 64, 0), "ml.g7e.4xlarge": (16, 1, 0, 128, 0), "ml.g7e.8xlarge": (32, 1, 0, 256, 1),
    "ml.g7e.12xlarge": (48, 2, 0, 512, 1), "ml.g7e.24xlarge": (96, 4, 0, 1024, 2),
    "ml.g7e.48xlarge": (192, 8, 0, 2048, 4), "ml.p5e.48xlarge": (192, 8, 0, 2048, 32),
    "ml.p5en.48xlarge": (192, 8, 0, 2048, 16), "ml.trn2.3xlarge": (12, 0, 1, 128, 1),
    "ml.trn2.48xlarge": (192, 0, 16, 2048, 16), "ml.p6e-gb200.36xlarge": (144, 4, 0, 960, 0),
    "ml.p6-b200.48xlarge": (192, 8, 0, 2048, 8), "ml.p6-b300.48xlarge": (192, 8, 0, 4096, 16),
    "ml.c5.large": (2, 0, 0, 4, 0), "ml.c5.xlarge": (4, 0, 0, 8, 0), "ml.c5.2xlarge": (8, 0, 0, 16, 0),
    "ml.c5.4xlarge": (16, 0, 0, 32, 0), "ml.c5.9xlarge": (36, 0, 0, 72, 0), "ml.c5.12xlarge": (48, 0, 0, 96, 0),
    "ml.c5.18xlarge": (72, 0, 0, 144, 0), "ml.c5.24xlarge": (96, 0, 0, 192, 0), "ml.c5n.large": (2, 0, 0, 5, 0),
    "ml.c5n.2xlarge": (8, 0, 0, 21, 0), "ml.c5n.4xlarge": (16, 0, 0, 42, 0), "ml.c5n.9xlarge": (36, 0, 0, 96, 1),
    "ml.c5n.18xlarge": (72, 0, 0, 192, 1), "ml.m5.large": (2, 0, 0, 8, 0), "ml.m5.xlarge": (4, 0, 0, 16, 0),
    "ml.m5.2xlarge": (8, 0, 0, 32, 0), "ml.m5.4xlarge": (16, 0, 0, 64, 0), "ml.m5.8xlarge": (32, 0, 0, 128, 0),
    "ml.m5.12xlarge": (48, 0, 0, 192, 0), "ml.m5.16xlarge": (64, 0, 0, 256, 0), "ml.m5.24xlarge": (96, 0, 0, 384, 0),
    "ml.t3.medium": (2, 0, 0, 4, 0), "ml.t3.large": (2, 0, 0, 8, 0), "ml.t3.xlarge": (4, 0, 0, 16, 0),
    "ml.t3.2xlarge": (8, 0, 0, 32, 0), "ml.c6i.large": (2, 0, 0, 4, 0), "ml.c6i.xlarge": (4, 0, 0, 8, 0),
    "ml.c6i.2xlarge": (8, 0, 0, 16, 0), "ml.c6i.4xlarge": (16, 0, 0, 32, 0), "ml.c6i.8xlarge": (32, 0, 0, 64, 0),
    "ml.c6i.12xlarge": (48, 0, 0, 96, 0), "ml.c6i.16xlarge": (64, 0, 0, 128, 0),
    "ml.c6i.24xlarge": (96, 0, 0, 192, 0), "ml.c6i.32xlarge": (128, 0, 0, 256, 1), "ml.m6i.large": (2, 0, 0, 8, 0),
    "ml.m6i.xlarge": (4, 0, 0, 16, 0), "ml.m6i.2xlarge": (8, 0, 0, 32, 0), "ml.m6i.4xlarge": (16, 0, 0, 64, 0),
    "ml.m6i.8xlarge": (32, 0, 0, 128, 0), "ml.m6i.12xlarge": (48, 0, 0, 192, 0),
    "ml.m6i.16xlarge": (64, 0, 0, 256, 0), "ml.m6i.24xlarge": (96, 0, 0, 384, 0),
    "ml.m6i.32xlarge": (128, 0, 0, 512, 1), "ml.r6i.large": (2, 0, 0, 16, 0), "ml.r6i.xlarge": (4, 0, 0, 32, 0),
    "ml.r6i.2xlarge": (8, 0, 0, 64, 0), "ml.r6i.4xlarge": (16, 0, 0, 128, 0), "ml.r6i.8xlarge": (32, 0, 0, 256, 0),
    "ml.r6i.12xlarge": (48, 0, 0, 384, 0), "ml.r6i.16xlarge": (64, 0, 0, 512, 0),
    "ml.r6i.24xlarge": (96, 0, 0, 768, 0), "ml.r6i.32xlarge": (128, 0, 0, 1024, 1), "ml.m7i.large": (2, 0, 0, 8, 0),
    "ml.m7i.xlarge": (4, 0, 0, 16, 0), "ml.m7i.2xlarge": (8, 0, 0, 32, 0), "ml.m7i.4xlarge": (16, 0, 0, 64, 0),
    "ml.m7i.8xlarge": (32, 0, 0, 128, 0), "ml.m7i.12xlarge": (48, 0, 0, 192, 0),
    "ml.m7i.16xlarge": (64, 0, 0, 256, 0), "ml.m7i.24xlarge": (96, 0, 0, 384, 0),
    "ml.m7i.48xlarge": (192, 0, 0, 768, 1), "ml.r7i.large": (2, 0, 0, 16, 0), "ml.r7i.xlarge": (4, 0, 0, 32, 0),
    "ml.r7i.2xlarge": (8, 0, 0, 64, 0), "ml.r7i.4xlarge": (16, 0, 0, 128, 0), "ml.r7i.8xlarge": (32, 0, 0, 256, 0),
    "ml.r7i.12xlarge": (48, 0, 0, 384, 0), "ml.r7i.16xlarge": (64, 0, 0, 512, 0),
    "ml.r7i.24xlarge": (96, 0, 0, 768, 0), "ml.r7i.48xlarge": (192, 0, 0, 1536, 1),
    "ml.i3en.large": (2, 0, 0, 16, 0), "ml.i3en.xlarge": (4, 0, 0, 32, 0), "ml.i3en.2xlarge": (8, 0, 0, 64, 0),
    "ml.i3en.3xlarge": (12, 0, 0, 96, 0), "ml.i3en.6xlarge": (24, 0, 0, 192, 0),
    "ml.i3en.12xlarge": (48, 0, 0, 384, 1), "ml.i3en.24xlarge": (96, 0, 0, 768, 1),

}

# Types outside the SDK table: accelerators per size where the family has them.
_G4DN_GPUS = {"12xlarge": 4}
_GIB_PER_VCPU = {"c": 2, "m": 4, "r": 8, "t": 4, "i": 8, "g": 4}


@dataclass(frozen=True)
class InstanceResources:
    vcpu: int
    gpu: int
    neuron: int
    memory_gib: int
    efa: int
    arch: str  # Kubernetes kubernetes.io/arch


def _size_vcpus(size: str) -> int:
    if size == "medium":
        return 1
    if size == "large":
        return 2
    if size == "xlarge":
        return 4
    match = re.fullmatch(r"(\d+)xlarge", size)
    return 4 * int(match.group(1)) if match else 4


def _arch(family: str) -> str:
    # Graviton families end in "g" after the generation digit (c6g, m7g, c8g); gr6 is an x86 GPU type.
    return "arm64" if re.fullmatch(r"[cmr]\dg", family) else "amd64"


def instance_resources(instance_type: str) -> InstanceResources:
    family, _, size = instance_type.removeprefix("ml.").partition(".")
    known = _TABLE.get(instance_type)
    if known is not None:
        vcpu, gpu, neuron, memory, efa = known
        return InstanceResources(vcpu, gpu, neuron, memory, efa, _arch(family))
    vcpu = _size_vcpus(size)
    gpu = 0
    if family == "g4dn":
        gpu = _G4DN_GPUS.get(size, 1)
    elif family == "g7":
        gpu = {"12xlarge": 2, "24xlarge": 4, "48xlarge": 8}.get(size, 1)
    memory = vcpu * _GIB_PER_VCPU.get(family[0], 4)
    efa = 1 if vcpu >= 64 else 0
    return InstanceResources(vcpu, gpu, 0, memory, efa, _arch(family))
