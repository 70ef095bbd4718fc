"""Tools over written artefacts and output trees: bench, diff, ops, ls/show, .pt2 export.

Nothing is imported here: each module is imported by name, so the torch-free paths stay torch-free.
"""
