"""Trust in artefacts made elsewhere: signing and keys, verification, and the sandbox replays run in.

Nothing is imported here: each module is imported by name, so the torch-free paths stay torch-free.
"""
