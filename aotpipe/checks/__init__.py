"""The checks of a just-written artefact: the stage after write.

:mod:`aotpipe.checks.written` loads each graph back and runs it against the eager model and
the chain; :mod:`aotpipe.checks.meta` checks a capture of mode meta (shapes only, no values).
"""
