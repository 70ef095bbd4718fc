"""Capture: trace a model into inference, forward, backward and joint graphs."""

from aotpipe.capture.export import capture_export
from aotpipe.capture.types import CapturedGraph, CapturedGraphs, GraphInput, GraphOutput, PartitionContract, TensorMeta

__all__ = [
    "capture_export",
    "CapturedGraph",
    "CapturedGraphs",
    "GraphInput",
    "GraphOutput",
    "PartitionContract",
    "TensorMeta",
]
