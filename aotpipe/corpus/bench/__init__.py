"""`aotpipe bench`: run a compiler backend over every graph of some artefacts.

backends.py names the backends; graph.py benches one graph in a worker (correctness by the
project's rule, speed in interleaved rounds); run.py plans and runs the bench in the process
executor's workers; scores.py scores it (pass rate, geometric-mean speedup, GraphNet's S(t)
and ES(t)); baseline.py is the regression gate; locate.py bisects a failing graph to its
first faulty node and writes the prefix as a repro artefact, minimize.py cuts it down to the
few nodes that still fail, triage.py groups failures into bugs; ranks.py benches a distributed
rank's graphs; output.py prints and writes.
"""
