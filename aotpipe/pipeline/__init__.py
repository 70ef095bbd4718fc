"""A pipeline run: the YAML, the runner and its executors, one model's job, results, reports,
up-to-date checks, shards and merges, and reading an output tree back.

Nothing is imported here: each module is imported by name, so the torch-free paths stay torch-free.
"""
