"""Every pass's options, as frozen dataclasses: what `passes:` in the YAML can say.

No torch import: the pipeline is validated, and a warm re-run decides what is up to date,
with these alone. Each pass module takes its options class from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FreezeOptions:
    fold: bool = True  # constant folding after freezing
    cse: bool = True  # merge identical pure calls
    graphs: tuple[str, ...] = ("inference",)


@dataclass(frozen=True)
class FoldConvBnOptions:
    graphs: tuple[str, ...] = ("inference",)


@dataclass(frozen=True)
class ViewToReshapeOptions:
    graphs: tuple[str, ...] = ("inference",)


@dataclass(frozen=True)
class RemoveNoopsOptions:
    graphs: tuple[str, ...] = ("inference",)


@dataclass(frozen=True)
class ChannelsLastOptions:
    # also make a graph input a convolution reads (the image) channels-last, once, so
    # activations stay channels-last from the first convolution to the last
    activations: bool = False
    graphs: tuple[str, ...] = ("inference",)


@dataclass(frozen=True)
class ReinplaceOptions:
    graphs: tuple[str, ...] = ("inference",)


@dataclass(frozen=True)
class ToDeviceOptions:
    device: str = "cpu"
    graphs: tuple[str, ...] = ("inference",)


@dataclass(frozen=True)
class MkldnnFuseOptions:
    epilogues: bool = True  # fuse the pointwise op or residual add after a convolution
    linears: bool = True  # addmm(B, x, W^T) with constant weights as aten.linear (packed at load)
    graphs: tuple[str, ...] = ("inference",)


@dataclass(frozen=True)
class SdpaOptions:
    graphs: tuple[str, ...] = ("inference",)


@dataclass(frozen=True)
class FoldScaleOptions:
    graphs: tuple[str, ...] = ("inference",)


@dataclass(frozen=True)
class RemoveCopiesOptions:
    graphs: tuple[str, ...] = ("inference",)
