"""``aotpipe diff``: what changed between two artefacts, or two output trees.

- :func:`diff_paths` decides what A and B are (a model artefact: a folder holding
  manifest.json; a tree: a pipeline's output folder holding run.json) and compares them;
- :mod:`aotpipe.corpus.diff.artifacts` compares two artefacts from their records (no torch, no
  graph runs): environment and options, graph signatures, op histograms, nodes after name
  normalisation, weight and constant digests, pass logs;
- :mod:`aotpipe.corpus.diff.values` runs both artefacts' graphs on the same inputs and names the
  first aligned node whose value departs (it runs graphs: the replay's trust rules apply);
- :mod:`aotpipe.corpus.diff.trees` compares two trees model by model.
"""

from aotpipe.corpus.diff.model import Diff, Finding
from aotpipe.corpus.diff.paths import diff_paths

__all__ = ["Diff", "Finding", "diff_paths"]
