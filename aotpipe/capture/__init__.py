"""Capture: trace a model into inference, forward, backward and joint graphs (per subgraph, for dynamo)."""

from aotpipe.capture.dynamo import capture_auto, capture_dynamo, subgraph_references
from aotpipe.capture.export import capture_export
from aotpipe.format.ir import (
    CapturedGraph,
    CapturedGraphs,
    GraphInput,
    GraphOutput,
    Subgraph,
    TensorMeta,
)

__all__ = [
    "capture_auto",
    "capture_dynamo",
    "capture_export",
    "subgraph_references",
    "Subgraph",
    "CapturedGraph",
    "CapturedGraphs",
    "GraphInput",
    "GraphOutput",
    "TensorMeta",
]
