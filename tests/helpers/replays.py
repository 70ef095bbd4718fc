"""What a replay of an artefact made on another machine may honestly say.

The committed fixtures (tests/data) were made on another machine. Where they do not record
the CPU they were made on (format versions 1 and 2 record no environment, early version 3
artefacts no CPU model), a replay cannot tell whether its bits must match: two CPUs of the
same instruction set (AVX512) give other float32 GEMM bits through MKL. So each graph is a
"match" (bit for bit), or "close" with exactly that reason, every output within its bound
(an element-wise one: there is at least one figure), or, for format 2, which records only
sums of sampled elements, "unverified" with that reason, its sums within float noise.
"""

from __future__ import annotations

from typing import Any

from aotpipe.runtime.determinism import unrecorded_cpu


def assert_match_or_close_for_want_of_a_recorded_cpu(results, recorded_environment) -> None:
    why = unrecorded_cpu(recorded_environment)
    assert why is not None, "the fixture records its CPU: its bits must match here or it names the difference"
    for r in results:
        allowed = ("match", "close", "unverified") if recorded_environment is None else ("match", "close")
        assert r.status in allowed, (r.kind, r.status, r.mismatches)
        if r.status == "match":
            assert r.environment == [] and r.bit_identical is not False, (r.kind, r.environment)
        elif r.status == "close":
            assert r.environment == [why] and r.bit_identical is False, (r.kind, r.environment)
            assert r.errors and all(e.bound is not None and e.max_abs_error <= e.bound for e in r.errors), \
                (r.kind, r.errors)
        else:
            assert r.environment == [why] and r.bit_identical is False and not r.ok, (r.kind, r.environment)
            assert r.mismatches and all("sampled sums are within float noise" in m for m in r.mismatches), \
                r.mismatches


def replayed(r: Any) -> bool:
    """`aotpipe replay`'s CLI result `r` says the inference graph ran and gave its recorded
    outputs: "match" on the CPU model that recorded the artefact (tests/data's fixtures were
    recorded on one); on another, "close (other CPU model: ...)", bit-identical (another model
    of the same vendor, as a rule) or every output within its bound (another vendor's: MKL's
    float32 GEMM takes another path on AMD than on Intel), which exit 0 says."""
    first = r.output.splitlines()[0] if r.output else ""
    return r.exit_code == 0 and (first.startswith("inference  match") or (
        first.startswith("inference  close (other CPU model: ")
        and ("bit-identical" in first or ("max abs error" in first and "bound" in first))))
