"""The artefact format's leaf: its typed records, the limits files are read within, and the
in-memory graph types capture builds and the writer, passes and checks read.

Nothing here imports the rest of aotpipe (only errors, graph_keys and tensors): every
package may read the format's types, from capture at the top to passes at the bottom.
"""
