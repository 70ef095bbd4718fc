"""Running and judging graphs: devices, execution, determinism, accuracy, evidence, tensor helpers.

Nothing is imported here: each module is imported by name, so the torch-free paths stay torch-free.
"""
