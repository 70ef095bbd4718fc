"""Running graphs from untrusted artefacts in a sandboxed worker process.

A graph.json names ATen ops and their arguments; many kernels trust their arguments, so a
hostile graph can crash or corrupt the process that runs it. Such graphs therefore run in
a worker that aotpipe starts under bubblewrap (``bwrap``, Debian package ``bubblewrap``):

- an empty root: only the system's libraries (/usr), the interpreter and its packages, and
  the artefact are bound, read-only; a fresh scratch folder (also ``TMPDIR`` and ``HOME``)
  is the one writable place; a new /dev and /proc, the kernel settings under /proc read-only;
  no network, its own pid, IPC, UTS and cgroup namespaces; killed when the caller dies;
- an unprivileged uid (65534) with no capabilities and no new privileges, even for a root
  caller; an environment built from nothing (no variable of the caller's);
- a seccomp filter (``pyseccomp`` over libseccomp): one process and its threads, no new
  namespaces, mounts, tracing, kernel loading, ``io_uring`` or non-Unix sockets;
- a cgroup where one can be made (memory and tasks for the whole sandbox), and resource
  limits set by the worker before it imports torch or reads a byte of the artefact: memory
  (``RLIMIT_DATA``, ``RLIMIT_AS``, from ``--max-bytes``), CPU time, file size, no core dumps;
  a wall-clock limit kept by the caller;
- results come back as JSON in the scratch folder (never a pickle), bounded in bytes and in
  values before they are parsed, and read as untrusted data.

docs/security.md says why each of these is there and what holds where one is missing.

A crash is reported as one line naming the node that was running (the worker writes the
node it is about to run into a small memory-mapped file in its scratch folder), and the
worker's canary tensors, allocated before any graph is built and checked after the run,
report a graph that wrote outside its own tensors.

- :mod:`.launch`: the caller's side (torch-free): :func:`run_task`, :class:`SandboxLimits`;
- :mod:`.worker`: the worker process (``python -m aotpipe.trust.sandbox.worker SCRATCH``);
- :mod:`.progress`, :mod:`.canary`: what the worker records for the caller;
- :mod:`.replay`: ``aotpipe replay`` as a task: in-process (trusted) or sandboxed.
"""

from aotpipe.trust.sandbox.launch import SandboxLimits, find_bwrap, run_task

__all__ = ["SandboxLimits", "find_bwrap", "run_task"]
