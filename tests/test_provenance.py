"""provenance.git_sha: the code a row was measured with, uncommitted edits included."""

import subprocess

from specbench import provenance


def test_a_dirty_checkouts_sha_names_its_edits(tmp_path, monkeypatch):
    """Two different uncommitted edits of one commit give two SHAs (the SHA keys cached
    baselines and resumed rows), the same edit the same one, and a clean tree the bare commit;
    an untracked file changes nothing."""
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    monkeypatch.delenv("SPECBENCH_GIT_SHA", raising=False)
    monkeypatch.setattr(provenance, "_REPO", tmp_path)
    code = tmp_path / "code.py"
    code.write_text("x = 1\n")
    git("init", "-q")
    git("add", "code.py")
    git("commit", "-q", "-m", "c")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert provenance.git_sha() == head
    (tmp_path / "notes.txt").write_text("untracked")
    assert provenance.git_sha() == head
    shas = []
    for edit in ("x = 2\n", "x = 3\n", "x = 2\n"):
        code.write_text(edit)
        shas.append(provenance.git_sha())
    assert all(s.startswith(f"{head}-dirty-") and len(s) == len(head) + 15 for s in shas), shas
    assert shas[0] != shas[1] and shas[0] == shas[2]
    code.write_text("x = 1\n")
    assert provenance.git_sha() == head
