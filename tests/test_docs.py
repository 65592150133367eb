"""The documents' references hold: every results folder a document or docstring names is
committed, results/README.md indexes every folder, and the top-level documents' relative links
and in-page anchors resolve. A folder renamed or left uncommitted, or a heading reworded, fails
here rather than in a reader's hands."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
# a results folder's name: its date, then its device and topic (hydra's run directories, a date
# then an underscore and a time, are not folder names)
FOLDER_NAME = re.compile(r"(?<![\w-])(20\d\d-\d\d-\d\d-[a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
DOCS = ("README.md", "experiments/README.md", "results/README.md")


def folders() -> set:
    return {p.name for p in RESULTS.iterdir() if p.is_dir() and p.name != "local"}


def texts():
    """Every document and source file that may cite a results folder: (path, text)."""
    paths = [*ROOT.glob("*.md"), *ROOT.glob("*/README.md"), *RESULTS.glob("*/README.md")]
    for part in ("specbench", "engines", "kernels", "experiments", "tests", "conf"):
        paths += [p for p in (ROOT / part).rglob("*") if p.suffix in (".py", ".sh", ".yaml", ".md")]
    paths += list((ROOT / "notebooks").glob("*.ipynb"))
    for p in sorted(set(paths)):
        yield p.relative_to(ROOT), p.read_text(encoding="utf-8")


def test_every_results_folder_cited_is_committed():
    have = folders()
    missing = {(str(path), name) for path, text in texts() for name in FOLDER_NAME.findall(text)
               if name not in have}
    assert not missing, sorted(missing)


def test_the_results_index_lists_each_folder_once():
    index = (RESULTS / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| \[([^\]]+)\]\(([^)]+)\) \|", index, flags=re.M)
    assert all(target == f"{name}/" for name, target in rows), rows
    names = [name for name, _ in rows]
    assert len(names) == len(set(names)), names
    assert set(names) == folders(), set(names) ^ folders()


@pytest.mark.parametrize("folder", sorted(folders()))
def test_each_results_folder_has_a_titled_readme(folder):
    readme = RESULTS / folder / "README.md"
    assert readme.is_file(), readme
    assert readme.read_text(encoding="utf-8").startswith("# "), readme


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped but hyphens, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set:
    return {anchor(h) for h in re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), flags=re.M)}


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_and_anchors_resolve(doc):
    path = ROOT / doc
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, fragment = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(target)
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(target)
    assert not broken, broken


def test_anchor_follows_github():
    assert anchor("Where the fast runner's goals stand (issue 6)") == "where-the-fast-runners-goals-stand-issue-6"
    assert anchor("The write-up's open measurements") == "the-write-ups-open-measurements"
