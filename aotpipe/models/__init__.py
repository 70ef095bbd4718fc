"""Where models come from: sources, the builtin zoo, torch's test databases, .pt2 archives,
example inputs, and the eager model the graphs are checked against.

Nothing is imported here: each module is imported by name, so the torch-free paths stay torch-free.
"""
