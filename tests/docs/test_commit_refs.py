"""No commit hash where a reader reads (tests/docs/commit_refs.py): README.md, docs/, qcls/, tests/ and the bench
scripts name no commit of this checkout; a figure cites bench/README.md's current-figures table instead."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.docs.commit_refs import ROOT, findings, in_git_checkout, walked

NOT_GIT = in_git_checkout()
pytestmark = pytest.mark.skipif(NOT_GIT is not None, reason=f"commits are looked up with git: {NOT_GIT}")


def test_no_commit_is_named_in_the_docs_the_package_or_the_tests() -> None:
    bad = findings(walked())
    assert not bad, ("these lines name a commit; cite bench/README.md's current-figures table (or describe what is) "
                     "instead, and leave the history to bench/RESULTS.md:\n" + "\n".join(bad))


def test_a_named_commit_is_found_and_other_hex_is_not(tmp_path: Path) -> None:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    doc = tmp_path / "doc.md"
    doc.write_text(f"measured on {head[:7]} ([run](RESULTS.md#latency-on-{head[:9]}-h100)); a fingerprint "
                   f"0123456789ab; a colour #ffffff; {head}\n", encoding="utf-8")
    found = findings([doc])
    assert [line.split(": ")[1] for line in found] == [head[:7], head[:9], head]
