"""Running graphs from untrusted artefacts in a sandboxed worker process.

A graph.json names ATen ops and their arguments; many kernels trust their arguments, so a
hostile graph can crash or corrupt the process that runs it. Such graphs therefore run in
a worker that aotpipe starts under bubblewrap (``bwrap``, Debian package ``bubblewrap``):

- the whole filesystem read-only, but for a fresh scratch folder (also ``TMPDIR`` and
  ``HOME``); a new /dev and /proc; no network (its own network namespace, loopback only);
  its own pid, IPC and UTS namespaces; every capability dropped, no new privileges; killed
  when the caller dies;
- resource limits set by the worker before it imports torch or reads a byte of the
  artefact: memory (``RLIMIT_DATA`` and ``RLIMIT_AS``, from the byte limit ``--max-bytes``),
  CPU time (``RLIMIT_CPU``), file size (``RLIMIT_FSIZE``), no core dumps; and a wall-clock
  limit kept by the caller;
- results come back as JSON in the scratch folder (never a pickle), parsed as untrusted data.

Why bubblewrap alone (no Landlock, no seccomp): it is a packaged, maintained tool with no
Python dependency, works as root and (with user namespaces) as any user, and its mount and
network namespaces already give the read-only filesystem and the missing network; Landlock
would repeat the filesystem rule through a young binding, and a seccomp filter needs
libseccomp's bindings (not on PyPI) for a layer the namespaces already give.

A crash is reported as one line naming the node that was running (the worker writes the
node it is about to run into a small memory-mapped file in its scratch folder), and the
worker's canary tensors, allocated before any graph is built and checked after the run,
report a graph that wrote outside its own tensors.

- :mod:`.launch`: the caller's side (torch-free): :func:`run_task`, :class:`SandboxLimits`;
- :mod:`.worker`: the worker process (``python -m aotpipe.sandbox.worker SCRATCH``);
- :mod:`.progress`, :mod:`.canary`: what the worker records for the caller;
- :mod:`.replay`: ``aotpipe replay`` as a task: in-process (trusted) or sandboxed.
"""

from aotpipe.sandbox.launch import SandboxLimits, find_bwrap, run_task

__all__ = ["SandboxLimits", "find_bwrap", "run_task"]
